"""Models with symbolic input dimensions (compiler/specialize.py): one compile, native code per size
compiled at its first run and kept; sizes checked (one name, one size; maxima); saved and loaded
back; the CLI's --max-dim, inspect and run. The real architectures run this way in
tests/frontends/test_archs.py, against ONNX Runtime and PyTorch."""
from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import pytest
from onnx import helper

import compiler
from compiler.driver import FallbackWarning
from compiler.errors import InputError, KilnError
from compiler.ir.interpreter import interpret
from compiler.models import load_graph
from compiler.runtime.artifact import ArtifactError
from compiler.runtime.executable import Executable
from compiler.specialize import RECORD, SOURCE, Specializing
from compiler.tools.cli import main
from tests.onnx_build import float_model

RNG = np.random.default_rng(3)
W1 = RNG.standard_normal((8, 16)).astype(np.float32)
W2 = RNG.standard_normal((16, 4)).astype(np.float32)


def _model():
    """y = relu(x @ W1) @ W2 + z, x: [N, 8], z: [N, 4] (N shared), with a Reshape of a computed shape."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]), helper.make_node("Shape", ["z"], ["s"]),
             helper.make_node("Reshape", ["o", "s"], ["o2"]), helper.make_node("Add", ["o2", "z"], ["y"])]
    return float_model(nodes, [("x", ["N", 8]), ("z", ["N", 4])], [("w1", W1), ("w2", W2)])


def _feeds(n):
    return {"x": RNG.standard_normal((n, 8)).astype(np.float32), "z": RNG.standard_normal((n, 4)).astype(np.float32)}


def _want(feeds):
    return interpret(load_graph(_model()), feeds)["y"]


def test_each_size_runs_native_code_compiled_once():
    exe = compiler.compile(_model())
    assert isinstance(exe, Specializing) and exe.dims == {"N": [("x", 0), ("z", 0)]}
    assert exe.fallback  # the generic compile: the nodes of symbolic shape are interpreted
    for n in (1, 5, 1, 32, 5):
        feeds = _feeds(n)
        np.testing.assert_allclose(exe.run(feeds)["y"], _want(feeds), rtol=1e-5, atol=1e-5)
    sizes = [s for s, _ in exe.specializations]
    assert sizes == [{"N": 1}, {"N": 32}, {"N": 5}]  # least recently used first
    assert all(e.fallback == [] and e.kernels for _, e in exe.specializations)
    x = _feeds(2)
    np.testing.assert_allclose(exe(x["x"], x["z"]), _want(x), rtol=1e-5, atol=1e-5)  # positional too


def test_the_cache_keeps_the_most_recent_sizes():
    exe = compiler.compile(_model(), specialize_cache=2)
    for n in (1, 2, 3, 2):
        exe.run(_feeds(n))
    assert [s["N"] for s, _ in exe.specializations] == [3, 2]


def test_sizes_are_checked_before_anything_is_compiled():
    exe = compiler.compile(_model(), max_dims={"N": 16})
    with pytest.raises(InputError, match=r"N = 17 is past its maximum 16.*--max-dim N="):
        exe.run(_feeds(17))
    bad = _feeds(3)
    bad["z"] = bad["z"][:2]
    with pytest.raises(InputError, match=r"N is 3 in input 'x' \(axis 0\) but 2 in input 'z'"):
        exe.run(bad)
    with pytest.raises(InputError, match=r"input 'x': expected rank 2"):
        exe.run({"x": np.zeros((3, 8, 1), np.float32), "z": np.zeros((3, 4), np.float32)})
    with pytest.raises(InputError, match="missing input 'z'"):
        exe.run({"x": np.zeros((3, 8), np.float32)})
    with pytest.raises(InputError, match=r"input 'x' has element type float64, the model takes f32\[N,8\]"):
        exe.run({"x": np.zeros((3, 8), np.float64), "z": np.zeros((3, 4), np.float32)})
    assert exe.specializations == []


def test_options_that_do_not_apply_are_refused():
    with pytest.raises(KilnError, match="'M', which is not a symbolic input dimension.*: N"):
        compiler.compile(_model(), max_dims={"M": 4})
    with pytest.raises(KilnError, match="a maximum is a positive integer"):
        compiler.compile(_model(), max_dims={"N": 0})
    with pytest.raises(KilnError, match="max_dims applies to a model compiled with specialize=True"):
        compiler.compile(_model(), specialize=False, max_dims={"N": 4})


def test_fixed_shapes_and_specialize_false_give_one_executable():
    exe = compiler.compile(_model(), input_shapes={"x": (3, 8), "z": (3, 4)})
    assert isinstance(exe, Executable) and exe.fallback == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        generic = compiler.compile(_model(), specialize=False)
    assert isinstance(generic, Executable) and generic.fallback and caught
    feeds = _feeds(4)
    np.testing.assert_allclose(generic.run(feeds)["y"], _want(feeds), rtol=1e-5, atol=1e-5)


def test_saved_and_loaded_back(tmp_path):
    out = str(tmp_path / "m.kiln")
    exe = compiler.compile(_model(), output=out, max_dims={"N": 64})
    exe.run(_feeds(2))
    assert {SOURCE, RECORD} <= set(os.listdir(out))
    for path in (out, exe.save(str(tmp_path / "copy.kiln"))):
        back = compiler.load(path)
        assert isinstance(back, Specializing) and back.max_dims == {"N": 64} and back.specializations == []
        feeds = _feeds(7)
        np.testing.assert_allclose(back.run(feeds)["y"], _want(feeds), rtol=1e-5, atol=1e-5)
        with pytest.raises(InputError, match="past its maximum 64"):
            back.run(_feeds(65))
    bad = str(tmp_path / "bad.kiln")
    shutil.copytree(out, bad)
    with open(os.path.join(bad, SOURCE), "a") as f:
        f.write("\n")
    with pytest.raises(ArtifactError):
        compiler.load(bad)


def test_the_cli(tmp_path, capsys):
    import onnx

    model = str(tmp_path / "m.onnx")
    onnx.save(_model(), model)
    out = str(tmp_path / "m.kiln")
    assert main(["compile", model, "-o", out, "--max-dim", "N=8"]) == 0
    assert "symbolic N (at most 8): native code is compiled per size" in capsys.readouterr().out
    assert main(["inspect", out]) == 0
    assert "symbolic N (at most 8)" in capsys.readouterr().out
    assert main(["inspect", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["specialize"]["max_dims"] == {"N": 8}
    assert main(["run", out]) == 0
    assert "y: float32[1, 4]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compile", model, "-o", out, "--max-dim", "N=0"])
