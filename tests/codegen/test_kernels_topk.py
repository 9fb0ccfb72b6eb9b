"""Native TopK (compiler/codegen/kernels/topk.py) against the reference interpreter, on the LLVM printer
and in numba's CUDA simulator: largest and smallest, every axis, ties (the lower index first), NaN
(last, in index order), infinities, integer types; refusals for a K known only at run time or too
large. ONNX's own TopK cases run in the conformance suite."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.topk import MAX_K, TopK
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import indexing as ix
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(13)


def _graph(dt: DType, shape=(4, 9, 3)):
    g = Graph(f"topk_{dt}")
    x = g.add_input("x", TensorType(dt, shape))
    outs = []
    for axis, k, largest in ((-1, 2, 1), (1, 4, 1), (1, 9, 0), (0, 1, 0), (1, 3, 0)):
        kc = g.add_constant(np.array([k], np.int64), f"k{len(outs)}")
        node = g.add_node(ix.TopK(axis=axis, largest=largest), [x, kc])
        outs += list(node.outputs)
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], TopK), n.describe()
    return g


def _x(dt: DType, shape=(4, 9, 3)):
    if dt.is_float:
        x = RNG.integers(-3, 4, shape).astype(dt.np)  # many ties
        x.flat[[1, 7, 8, 30, 31, 50]] = [np.nan, np.inf, -np.inf, np.nan, np.nan, -0.0]
        return x
    return RNG.integers(-5, 6, shape).astype(dt.np)


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16, DType.i32, DType.u8, DType.i64])
def test_on_the_llvm_printer(dt):
    g = _graph(dt)
    ins = {"x": _x(dt)}
    got, want = run_kernels(g, ins), interpret(g, ins)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g = _graph(DType.f32)
    ins = {"x": _x(DType.f32)}
    got, want = run_cuda_forms(g, ins, threads=8), interpret(g, ins)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_refusals():
    g = Graph("r")
    x = g.add_input("x", TensorType(DType.f32, (2, 300)))
    k = g.add_input("k", TensorType(DType.i64, (1,)))
    fed = g.add_node(ix.TopK(), [x, k])
    big = g.add_node(ix.TopK(), [x, g.add_constant(np.array([MAX_K + 1], np.int64), "kb")])
    g.set_outputs(list(fed.outputs) + list(big.outputs), ["a", "b", "c", "d"])
    assert lowering_for(KernelGroup.of_node(fed))[0] is None
    low, why = lowering_for(KernelGroup.of_node(big))
    assert low is None and f"more than {MAX_K}" in why
