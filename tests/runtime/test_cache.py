"""The compile cache: a second compile of the same model bytes and options loads the artifact; any
change of model, options or Kiln's sources misses; broken entries are compiled again; the least
recently used go; `kiln run MODEL` uses it unless --no-cache."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from compiler import cache as artifacts
from compiler.driver import FallbackWarning
from compiler.ir.parser import parse
from compiler.runtime.executable import Executable
from compiler.tools.cli import main

from ..onnx_build import float_model

W = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)


def write_model(path, scale=1.0):
    m = float_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                    [("x", [2, 16])], [("w", W * scale)])
    path.write_bytes(m.SerializeToString())
    return str(path)


def entries(root):
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def test_the_second_compile_loads_the_first_artifact(tmp_path):
    root, model = str(tmp_path / "cache"), write_model(tmp_path / "m.onnx")
    first = compiler.compile(model, cache=root)
    assert len(entries(root)) == 1 and first.path.startswith(root)
    timings: dict = {}
    second = compiler.compile(model, cache=root, timings=timings)
    assert isinstance(second, Executable) and second.path == first.path and "cached" in timings
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_array_equal(second(x), first(x))
    out = compiler.compile(model, cache=root, output=tmp_path / "copy.kiln")  # a copy where asked
    assert out.path == str(tmp_path / "copy.kiln")
    np.testing.assert_array_equal(out(x), first(x))


def test_other_options_or_bytes_miss(tmp_path):
    root, model = str(tmp_path / "cache"), write_model(tmp_path / "m.onnx")
    compiler.compile(model, cache=root)
    compiler.compile(model, 1, cache=root)
    compiler.compile(model, cache=root, disabled_passes=["fuse"])
    assert len(entries(root)) == 3
    write_model(tmp_path / "m.onnx", scale=2.0)  # the same path, other weights
    changed = compiler.compile(model, cache=root)
    assert len(entries(root)) == 4
    x = np.ones((2, 16), np.float32)
    np.testing.assert_allclose(changed(x), np.maximum(x @ (W * 2.0), 0), rtol=1e-5)


def test_what_has_no_bytes_is_not_cached(tmp_path):
    root = str(tmp_path / "cache")
    compiler.compile(parse("graph @g(%x: f32[4]) -> (y: f32[4]) {\n  %0 = Relu(%x) : f32[4]\n  return y=%0\n}"),
                     cache=root)
    assert entries(root) == []


def test_a_broken_entry_is_compiled_again(tmp_path):
    root, model = str(tmp_path / "cache"), write_model(tmp_path / "m.onnx")
    first = compiler.compile(model, cache=root)
    with open(os.path.join(first.path, "weights.bin"), "r+b") as f:
        f.write(b"\xff\xff\xff\xff")
    again = compiler.compile(model, cache=root)
    x = np.ones((2, 16), np.float32)
    np.testing.assert_allclose(again(x), np.maximum(x @ W, 0), rtol=1e-5)


def test_the_least_recently_used_go(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "KEEP", 2)
    root, model = str(tmp_path / "cache"), write_model(tmp_path / "m.onnx")
    for level in (0, 1, 2):
        compiler.compile(model, level, cache=root)
    assert len(entries(root)) == 2


def test_a_hit_warns_of_interpreted_nodes_again(tmp_path):
    g = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "nz",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    model = tmp_path / "nz.onnx"
    model.write_bytes(m.SerializeToString())
    root = str(tmp_path / "cache")
    with pytest.warns(FallbackWarning, match="NonZero"):
        compiler.compile(str(model), cache=root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiler.compile(str(model), cache=root)
    assert any(issubclass(w.category, FallbackWarning) and "NonZero" in str(w.message) for w in caught)


def test_kiln_run_uses_the_cache_unless_told_not_to(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    model = write_model(tmp_path / "m.onnx")
    root = artifacts.cache_root()
    assert root == str(tmp_path / "xdg" / "kiln" / "artifacts")
    assert main(["run", model, "--no-cache"]) == 0
    assert entries(root) == []
    assert main(["run", model]) == 0 and main(["run", model]) == 0
    assert len(entries(root)) == 1
    out = capsys.readouterr().out
    assert out.count("y: float32[2, 8]") == 3


def test_every_cache_lives_in_one_folder(tmp_path, monkeypatch):
    """$KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln holds every cache Kiln keeps
    (``compiler.paths``): artifacts, compiled code, the GEMM's objects, the roofline."""
    from compiler import profiling
    from compiler.codegen.gemm import build
    from compiler.codegen.llvm import objects

    def where():
        return (artifacts.cache_root(), objects.cache_dir(), build.cache_dir(), profiling._cache_dir(None))

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    k = str(tmp_path / "kiln")
    assert where() == (os.path.join(k, "artifacts"), os.path.join(k, "objects"), os.path.join(k, "gemm"), k)
    monkeypatch.delenv("KILN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    x = str(tmp_path / "xdg" / "kiln")
    assert where() == (os.path.join(x, "artifacts"), os.path.join(x, "objects"), os.path.join(x, "gemm"), x)


def test_a_cache_hit_of_kiln_run_imports_neither_onnx_nor_the_compiler(tmp_path):
    """The start of a second ``kiln run MODEL`` is the load: the key reads the model's bytes, so no
    ONNX import (a second with ml_dtypes), no pass or code generator is imported, and the outputs are
    the same random-input outputs as the first run's."""
    import subprocess
    import sys

    model = write_model(tmp_path / "m.onnx")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("KILN_CACHE_DIR", None)
    code = ("import sys; from compiler.tools.cli import main; main(['run', sys.argv[1]]); "
            "print(sorted(m for m in ('onnx', 'ml_dtypes', 'compiler.driver', 'compiler.passes', "
            "'compiler.codegen.program') if m in sys.modules))")
    runs = [subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, env=env,
                           timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    first, second = (r.stdout.splitlines() for r in runs)
    assert "compiler.driver" in first[-1] and "onnx" in first[-1]  # the miss compiled
    assert second[-1] == "[]", second[-1]
    assert first[:-1] == second[:-1] and "y: float32[2, 8]" in second[0]


def test_importing_the_compiler_leaves_ml_dtypes_for_when_a_narrow_type_is_used():
    import subprocess
    import sys

    code = ("import sys, compiler.driver, compiler.runtime.executable; print('ml_dtypes' in sys.modules); "
            "from compiler.ir.types import DType; print(DType.bf16.itemsize, DType.bf16.np, DType.f32.np)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.split("\n")[:2] == ["False", "2 bfloat16 float32"], r.stdout + r.stderr
