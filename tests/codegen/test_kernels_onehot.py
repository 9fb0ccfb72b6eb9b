"""OneHot and EyeLike on the loop form (compiler/codegen/kernels/onehot.py) against the reference
interpreter, on the LLVM printer and in numba's CUDA simulator."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.onehot import EyeLike, OneHot
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import indexing as ix
from compiler.ir.ops import tensor as tn
from compiler.ir.types import DType, TensorType


def _graph():
    g = Graph("oh")
    feeds = {}
    for it in (DType.i64, DType.i32, DType.f32):
        idx = g.add_input(f"i{it}", TensorType(it, (2, 3)))
        feeds[f"i{it}"] = np.array([[0, -1, 4], [7, -5, 2]]).astype(it.np)  # 7, -5: out of range, hot nowhere
        for vt in (DType.f32, DType.i8, DType.bool):
            vals = g.add_constant(np.array([0, 1]).astype(vt.np))
            for axis in (-1, 0, 1):
                g.add(ix.OneHot(axis=axis), idx, g.add_constant(np.array(5)), vals)
    x = g.add_input("x", TensorType(DType.f32, (3, 5)))
    feeds["x"] = np.zeros((3, 5), np.float32)
    for k in (0, 2, -1, 7):
        for dt in (None, DType.i32, DType.bool):
            g.add(tn.EyeLike(k=k, dtype=dt), x)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds


def test_on_the_llvm_printer():
    g, feeds = _graph()
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], (OneHot, EyeLike)), n.describe()
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds = _graph()
    want, got = interpret(g, feeds), run_cuda_forms(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())
