"""kiln compile / run / inspect: artifacts from the command line, their summary, and clear errors."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from compiler.tools.cli import main
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.ir.printer import save_text

TEXT = """graph @small(%x: f32[2,8]) -> (y: f32[2,8]) {
  %w = const f32[8] dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]>
  %0 = Mul(%x, %w) : f32[2,8]
  %1 = Tanh(%0) : f32[2,8]
  return y=%1
}"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "small.kir"
    save_text(parse(TEXT), str(path))
    return str(path)


def test_compile_run_inspect(model, tmp_path, capsys):
    out = str(tmp_path / "small.kiln")
    assert main(["compile", model, "-o", out]) == 0
    text = capsys.readouterr().out
    assert f"-> {out}" in text and "1 kernel(s)" in text and "0 fallback" in text  # Mul+Tanh fused
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", out, "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o.npz")]) == 0
    got = np.load(tmp_path / "o.npz")["y"]
    np.testing.assert_allclose(got, interpret(parse(TEXT), {"x": x})["y"], rtol=1e-6, atol=1e-6)
    capsys.readouterr()
    assert main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert "input    x: f32[2, 8]" in text and "fallback none" in text and "Tanh" in text
    assert main(["inspect", out, "--json", "--kernels"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [k["ops"] for k in info["kernels"]] == [["Mul", "Tanh"]]
    assert info["memory"]["arena_bytes"] >= 64 and info["fallback"] == []
    assert main(["inspect", out, "--kernels"]) == 0
    assert "k0_Mul_Tanh" in capsys.readouterr().out


def test_run_a_model_compiles_it_and_interpret_agrees(model, capsys):
    assert main(["run", model]) == 0
    native = capsys.readouterr().out
    assert main(["run", model, "--interpret"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == native.splitlines()[0]


def test_compile_json_summary(model, tmp_path, capsys):
    assert main(["compile", model, "-o", str(tmp_path / "a.kiln"), "--json", "-O", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["kernels"] == 2 and s["artifact_bytes"] > 0  # -O1: no fusion and s["compile_seconds"]["total"] > 0


def test_errors_are_clear(model, tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.kiln")]) == 1
    assert "no artifact at" in capsys.readouterr().err
    assert main(["compile", model, "-o", str(tmp_path / "no" / "dir.kiln")]) == 1
    assert "does not exist" in capsys.readouterr().err
    out = str(tmp_path / "s.kiln")
    assert main(["compile", model, "-o", out]) == 0
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((3, 8), np.float32))
    assert main(["run", out, "--input", f"x={bad}"]) == 1
    assert "input 'x' has shape [3, 8], the model takes f32[2, 8]" in capsys.readouterr().err
    assert main(["compile", model, "-o", str(tmp_path / "t.kiln"), "--target", "no-such-cpu"]) == 1
    assert "not in KNOWN_CPUS" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "t.kiln")


def test_strict_compile_names_the_op(tmp_path, capsys):
    path = tmp_path / "nz.kir"
    save_text(parse("""graph @g(%x: f32[4]) -> (nz: i64[1,?]) {
  %0 = NonZero(%x) : i64[1,?]
  return nz=%0
}"""), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "nz.kiln"), "--strict"]) == 1
    assert "NonZero node: no native code: no native lowering for NonZero" in capsys.readouterr().err
    assert not (tmp_path / "nz.kiln").exists()
    assert main(["compile", str(path), "-o", str(tmp_path / "nz.kiln")]) == 0
    assert "1 node(s) run in the reference interpreter" in capsys.readouterr().err


BLOCK = """graph @block(%x: f32[1,8,12,30]) -> (y: f32[1,4,12,30]) {
  %w1 = const f32[8,8,3,3]
  %b1 = const f32[8]
  %w2 = const f32[4,16,1,1]
  %0 = Conv(%x, %w1, %b1) {pads=[1, 1, 1, 1]} : f32[1,8,12,30]
  %1 = Relu(%0) : f32[1,8,12,30]
  %2 = Sigmoid(%x) : f32[1,8,12,30]
  %3 = Concat(%1, %2) {axis=1} : f32[1,16,12,30]
  %4 = Conv(%3, %w2) : f32[1,4,12,30]
  return y=%4
}"""


def test_inspect_says_how_each_kernel_was_made(tmp_path, capsys):
    """--kernels lists, under each kernel, how it was generated, and the concats done in place."""
    rng = np.random.default_rng(0)
    w = {"w1": rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "b1": rng.standard_normal(8).astype(np.float32),
         "w2": rng.standard_normal((4, 16, 1, 1)).astype(np.float32)}
    src = tmp_path / "block.kir"
    save_text(parse(BLOCK, w), str(src))
    out = str(tmp_path / "block.kiln")
    assert main(["compile", str(src), "-o", out]) == 0
    capsys.readouterr()
    assert main(["inspect", out, "--kernels"]) == 0
    text = capsys.readouterr().out
    assert "im2col packed block by block for the GEMM" in text and "bias and chain inside the GEMM" in text
    assert "1x1: GEMM on the input" in text
    assert "Concat node" in text and "concat in place: its 2 pieces" in text
    assert main(["inspect", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert len(info["concats_in_place"]) == 1
    assert any("inside the GEMM" in n for k in info["kernels"] for n in k["notes"])
