"""Native GridSample (compiler/codegen/kernels/gridsample.py) against the reference interpreter, on the
LLVM printer and in numba's CUDA simulator: every mode and padding mode, align_corners, 2 and 3
spatial axes, coordinates far outside, integer inputs. ONNX's own 18 GridSample cases run in
the conformance suite."""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.gridsample import GridSample
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import resample as rs
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(31)


def _graph(dt: DType, spatial=(5, 6), out=(3, 4), modes=("linear", "nearest", "cubic")):
    g = Graph("gs")
    x = g.add_input("x", TensorType(dt, (2, 3) + spatial))
    grid = g.add_input("grid", TensorType(DType.f32, (2,) + out + (len(spatial),)))
    outs = [g.add(rs.GridSample(mode=m, padding_mode=p, align_corners=a), x, grid)
            for m, p, a in itertools.product(modes, ("zeros", "border", "reflection"), (0, 1))]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], GridSample), n.describe()
    xv = RNG.standard_normal((2, 3) + spatial) * 50
    if dt.is_int:
        xv = np.clip(xv + 100, 0, 255)
    gv = (RNG.standard_normal((2,) + out + (len(spatial),)) * 1.3).astype(np.float32)
    gv.flat[[0, 5]] = [-4.2, 7.5]  # far outside
    return g, {"x": xv.astype(dt.np), "grid": gv}


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.u8])
def test_on_the_llvm_printer(dt):
    g, feeds = _graph(dt)
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    for name in want:
        if dt.is_int:
            assert np.abs(got[name].astype(int) - want[name].astype(int)).max() <= 1, name
        else:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-4, err_msg=name)


def test_three_spatial_axes():
    g, feeds = _graph(DType.f32, spatial=(3, 4, 5), out=(2, 2, 3), modes=("linear", "nearest"))
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-4, err_msg=name)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds = _graph(DType.f32, out=(2, 3), modes=("linear", "cubic"))
    got, want = run_cuda_forms(g, feeds, threads=4), interpret(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-4, err_msg=name)
