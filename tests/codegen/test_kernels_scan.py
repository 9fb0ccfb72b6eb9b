"""CumSum/CumProd and Trilu on the loop form (compiler/codegen/kernels/scan.py): every numeric type,
every axis, exclusive and reversed, both triangles and offsets, against the reference interpreter on
the LLVM printer and in numba's CUDA simulator; parameters fed as inputs are bound when compiling."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.scan import Cumulative, Trilu
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import reduce as rd
from compiler.ir.ops import tensor as tn
from compiler.ir.types import DType, TensorType
from compiler.passes.simplify.infer_shapes import shape_determining_inputs

RNG = np.random.default_rng(4)
TYPES = [DType.f32, DType.f64, DType.f16, DType.i32, DType.i8, DType.u64]


def _data(shape, dt: DType) -> np.ndarray:
    if dt.is_float:
        return (RNG.standard_normal(shape) * 0.5 + 1).astype(dt.np)
    return RNG.integers(0 if not dt.is_signed else -3, 4, shape).astype(dt.np)


def _graph(dtypes):
    g = Graph("scan")
    feeds, labels = {}, []
    for dt in dtypes:
        x = g.add_input(f"x{dt}", TensorType(dt, (3, 4, 5)))
        feeds[f"x{dt}"] = _data((3, 4, 5), dt)
        for cls in (rd.CumSum, rd.CumProd):
            for axis in (0, 1, -1):
                for excl in (0, 1):
                    for rev in (0, 1):
                        g.add(cls(exclusive=excl, reverse=rev), x, g.add_constant(np.array(axis)))
                        labels.append(f"{cls.__name__}[{dt}] axis={axis} exclusive={excl} reverse={rev}")
        for upper in (0, 1):
            for k in (None, 0, 2, -1, 9):
                kv = None if k is None else g.add_constant(np.array(k, np.int64))
                g.add(tn.Trilu(upper=upper), x, kv)
                labels.append(f"Trilu[{dt}] upper={upper} k={k}")
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds, labels


def _check(got, want, label):
    if want.dtype.kind == "f":
        tol = 2e-3 if want.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=label)
    else:
        np.testing.assert_array_equal(got, want, err_msg=label)


def test_every_type_on_the_llvm_printer():
    g, feeds, labels = _graph(TYPES)
    for n, label in zip(g.nodes, labels):
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], (Cumulative, Trilu)), label
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for name, label in zip(g.output_names, labels):
        _check(got[name], want[name], label)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds, labels = _graph([DType.f32, DType.i32])
    want, got = interpret(g, feeds), run_cuda_forms(g, feeds, threads=2)
    for name, label in zip(g.output_names, labels):
        _check(got[name], want[name], label)


def test_parameters_fed_as_inputs_are_bound_and_data_is_not():
    g = Graph("p")
    x = g.add_input("x", TensorType(DType.f32, (3, 4)))
    axis = g.add_input("axis", TensorType(DType.i64, ()))
    k = g.add_input("k", TensorType(DType.i64, ()))
    g.set_outputs([g.add(rd.CumSum(), x, axis), g.add(tn.Trilu(), x, k)])
    feeds = {"x": np.ones((3, 4), np.float32), "axis": np.array(1), "k": np.array(1)}
    assert sorted(shape_determining_inputs(g, feeds)) == ["axis", "k"]
    assert Cumulative().check(KernelGroup.of_node(g.nodes[0])) == "the axis is computed at run time"
    assert Trilu().check(KernelGroup.of_node(g.nodes[1])) == "k is computed at run time"
