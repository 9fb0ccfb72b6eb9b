"""The kiln command line: help, run (random and given inputs, saving outputs), dump, and errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from compiler.tools.cli import main


def _model(tmp_path, op="Relu"):
    node = helper.make_node(op, ["x"], ["y"], name="n0")
    g = helper.make_graph([node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    path = tmp_path / "tiny.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return str(path)


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "compiler.tools.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "run" in out.stdout and "dump" in out.stdout and "light:" in out.stdout


def test_run_with_random_and_given_inputs(tmp_path, capsys):
    path = _model(tmp_path)
    assert main(["run", path]) == 0
    captured = capsys.readouterr()
    assert "y: float32[1, 3]" in captured.out and "set to 1" in captured.err
    x = np.array([[-1, 2, -3], [4, 5, -6]], np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", path, "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o.npz")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(x, 0))


def test_run_input_shape(tmp_path, capsys):
    assert main(["run", _model(tmp_path), "--input-shape", "x=4x3"]) == 0
    assert "y: float32[4, 3]" in capsys.readouterr().out


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 4), np.float32), "has shape [2, 4], expected f32[N,3]"),
    (np.zeros((2, 3), np.int32), "has dtype int32, expected f32"),
])
def test_run_rejects_wrong_inputs(tmp_path, capsys, bad, message):
    np.save(tmp_path / "bad.npy", bad)
    assert main(["run", _model(tmp_path), "--input", f"x={tmp_path / 'bad.npy'}"]) == 1
    assert message in capsys.readouterr().err


def test_run_unknown_input_and_corrupt_model(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((1, 3), np.float32))
    assert main(["run", _model(tmp_path), "--input", f"z={tmp_path / 'x.npy'}"]) == 1
    assert "unknown input(s) ['z']" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xff\xff\xff garbage")
    assert main(["run", str(bad)]) == 1
    assert "is not a valid ONNX model (truncated or corrupt file?)" in capsys.readouterr().err
    assert main(["run", "light:nonexistent"]) == 1
    assert "no light model" in capsys.readouterr().err


def test_run_light_model(capsys):
    assert main(["run", "light:squeezenet"]) == 0
    out = capsys.readouterr().out
    assert "top-5" in out and "softmaxout_1: float32[1, 1000, 1, 1]" in out


def test_dump_text(tmp_path, capsys):
    assert main(["dump", _model(tmp_path), "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graph @tiny(%x: f32[N,3]) -> (y: f32[N,3]) {") and "Relu(%x)" in out
