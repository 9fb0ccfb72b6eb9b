"""Compile-time limits (issue 21): a model needing more memory than the limit (default: this
machine's memory) is refused with the size and the node responsible, before any native code runs."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import compiler
from compiler.errors import KilnError, LimitError
from compiler.passes.options import CompileOptions, OptionError

from ..onnx_build import float_model


def _model(nodes, inputs, inits=()):
    return float_model(nodes, inputs, inits, "big")


@pytest.mark.parametrize("model, words", [
    (_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2 ** 31, 40])]), "input 'x'"),
    (_model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad0")], [("x", [1, 4])],
            [("p", np.array([0, 0, 0, 2 ** 33], np.int64))]), "Pad node 'pad0'"),
    (_model([helper.make_node("Expand", ["c", "s"], ["y"], name="ex")], [],
            [("c", np.ones(1, np.float32)), ("s", np.array([8, 2 ** 30], np.int64))]), "Expand node 'ex'"),
])
def test_huge_values_are_refused_at_compile_time(model, words):
    with pytest.raises(LimitError) as e:
        compiler.compile(model)
    msg = str(e.value)
    assert words in msg and "GiB" in msg and "memory limit" in msg


def test_the_limit_is_an_option():
    m = _model([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
               [("x", [64, 256])], [("w", np.ones((256, 256), np.float32))])
    with pytest.raises(LimitError, match=r"arena .* \+ weights .*largest buffer"):
        compiler.compile(m, memory_limit=100_000)
    x = np.ones((64, 256), np.float32)
    assert compiler.compile(m, memory_limit=10 << 20).run({"x": x})["y"].shape == (64, 256)
    assert issubclass(LimitError, KilnError)
    with pytest.raises(OptionError):
        CompileOptions.make(memory_limit_bytes=0)


def test_kiln_compile_memory_limit(tmp_path, capsys):
    from compiler.tools.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [64, 64])]), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "a.kiln"), "--memory-limit", "4KiB"]) != 0
    err = capsys.readouterr().err
    assert "kiln: error:" in err and "memory limit is 4096 bytes" in err and not (tmp_path / "a.kiln").exists()
    assert main(["compile", str(path), "-o", str(tmp_path / "a.kiln"), "--memory-limit", "1MiB"]) == 0
    with pytest.raises(SystemExit):
        main(["compile", str(path), "-o", str(tmp_path / "b.kiln"), "--memory-limit", "lots"])
