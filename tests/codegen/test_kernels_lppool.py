"""Native LpPool (compiler/codegen/kernels/lppool.py) against the reference interpreter, on the LLVM
printer and in numba's CUDA simulator: p 1, 2 and 3, pads, strides, dilations, ceil_mode, one to three
spatial axes, float types. ONNX's own 8 LpPool cases run in the conformance suite."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.lppool import LpPool
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import pool as P
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(41)


def _graph(dt: DType):
    g = Graph("lp")
    x2 = g.add_input("x2", TensorType(dt, (2, 3, 7, 6)))
    x1 = g.add_input("x1", TensorType(dt, (1, 2, 9)))
    x3 = g.add_input("x3", TensorType(dt, (1, 2, 4, 5, 3)))
    outs = [g.add(P.LpPool(kernel_shape=(3, 2), p=2), x2),
            g.add(P.LpPool(kernel_shape=(3, 3), p=1, pads=(1, 1, 1, 1), strides=(2, 2)), x2),
            g.add(P.LpPool(kernel_shape=(2, 2), p=3, dilations=(2, 1), ceil_mode=1, strides=(2, 2)), x2),
            g.add(P.LpPool(kernel_shape=(3,), p=2, pads=(1, 0)), x1),
            g.add(P.LpPool(kernel_shape=(2, 2, 2), p=2), x3)]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], LpPool), n.describe()
    feeds = {"x2": RNG.standard_normal((2, 3, 7, 6)).astype(dt.np), "x1": RNG.standard_normal((1, 2, 9)).astype(dt.np),
             "x3": RNG.standard_normal((1, 2, 4, 5, 3)).astype(dt.np)}
    return g, feeds


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16])
def test_on_the_llvm_printer(dt):
    g, feeds = _graph(dt)
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    tol = {DType.f16: 2e-3, DType.f32: 1e-5, DType.f64: 1e-12}[dt]
    for name in want:
        np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=name)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds = _graph(DType.f32)
    got, want = run_cuda_forms(g, feeds, threads=4), interpret(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
