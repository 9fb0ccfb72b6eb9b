"""Empty tensors (a zero dimension, e.g. a batch of 0) through native code (issue 21): a Conv on a
zero batch compiled and then raised ZeroDivisionError in the interpreter. A group whose results are
all empty needs no code (``kernels/empty.py``); checked against ONNX Runtime, with no fallback."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import compiler
from compiler.codegen.kernels import EMPTY, KernelGroup, lowering_for
from compiler.ir.interpreter import interpret
from frontends.onnx import import_model

from ..onnx_build import float_model

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(5)


def _model(nodes, inputs, inits=()):
    return float_model(nodes, inputs, inits, "empty")


W = ("w", RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))
CASES = {
    "conv": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1])], [W]),
    "conv_relu_add": ([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "c"], ["y"])], [W]),
    "pool_softmax": ([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]),
                      helper.make_node("Softmax", ["p"], ["y"])], []),
    "gap_flatten": ([helper.make_node("GlobalAveragePool", ["x"], ["p"]),
                     helper.make_node("Flatten", ["p"], ["y"])], []),
    "transpose_concat": ([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                          helper.make_node("Concat", ["t", "t"], ["y"], axis=3)], []),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("opt_level", [0, 2])
def test_zero_batch_runs_natively(name, opt_level):
    nodes, inits = CASES[name]
    m = _model(nodes, [("x", [0, 3, 8, 8])], inits)
    x = np.zeros((0, 3, 8, 8), np.float32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    got = compiler.compile(m, opt_level=opt_level, fallback=False).run({"x": x})["y"]
    assert got.shape == want.shape and got.dtype == want.dtype


def test_interpreter_conv_on_empty_tensors():
    """The reference semantics: an empty batch gives an empty result, no input channels a zero one."""
    for xs, ws in (((0, 3, 5, 5), (4, 3, 3, 3)), ((2, 0, 5, 5), (4, 0, 3, 3))):
        m = _model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", list(xs))],
                   [("w", np.ones(ws, np.float32))])
        x = np.zeros(xs, np.float32)
        got = interpret(import_model(m), {"x": x})["y"]
        assert got.shape == (xs[0], 4, 3, 3) and not got.any()


def test_empty_lowering_only_for_empty_results():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", [0, 3])])
    g = import_model(m)
    assert lowering_for(KernelGroup.of(list(g.nodes)))[0] is EMPTY
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])])
    g = import_model(m)
    assert EMPTY.check(KernelGroup.of(list(g.nodes))) == "a result is not an empty static tensor"
