"""Reduce* as loop-form kernels (compiler/codegen/kernels/reduction.py): every op of
``loops.scalar.REDUCTIONS`` on every element type it takes, over layouts that take both loop orders
(rows, columns), all axes, no axes, interleaved axes, size-1 axes and an empty set, against the
reference interpreter; on the LLVM printer (compiled) and the numba.cuda printer (in the simulator)."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.reduction import ArgReduce, Reduce
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.codegen.loops.cuda import print_cuda
from compiler.codegen.loops.expr import STORAGE_TYPES
from compiler.codegen.loops.scalar import REDUCTIONS
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import reduce as rd
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(5)

#: (shape, axes (None: all), keepdims, noop_with_empty_axes)
LAYOUTS = [
    ((3, 5, 7), [1], 1, 0),       # columns: the kept run innermost
    ((3, 5, 7), [2], 0, 0),       # rows
    ((6, 9), [0], 1, 0),          # columns without an outer kept run
    ((2, 3, 4), None, 0, 0),      # everything into one element
    ((2, 3, 4, 5), [0, 2], 0, 0),  # kept and reduced runs interleaved
    ((2, 0, 3), [1], 1, 0),       # an empty set: the identity, finished
    ((3, 4), [], 1, 1),           # no axes: the op's elementwise part
    ((1, 17, 1), [0, 2], 0, 0),   # size-1 axes only reduced
    ((40, 70), [1], 1, 0),        # longer rows (vectorized)
]
OPS = list(REDUCTIONS)
#: ops whose integer results the reference computes through float64 (exact only for small sums)
POSITIVE = (rd.ReduceLogSum, rd.ReduceLogSumExp, rd.ReduceL2)
#: ops whose empty-set result (NaN, -inf) has no integer value: undefined, not compared
NO_INT_EMPTY = (rd.ReduceMean, rd.ReduceLogSum, rd.ReduceLogSumExp)


def _types(op_cls) -> list[DType]:
    return sorted(op_cls.dtypes & STORAGE_TYPES, key=str)


def _data(shape, dt: DType, op_cls) -> np.ndarray:
    if dt is DType.bool:
        return RNG.random(shape) < 0.5
    if dt.is_float:
        x = RNG.standard_normal(shape)
        if op_cls is rd.ReduceProd:
            x = 1 + 0.1 * x
        if op_cls is rd.ReduceLogSum:
            x = np.abs(x) + 0.1
        return x.astype(dt.np)
    lo = 1 if op_cls in POSITIVE else 0 if not dt.is_signed else -9
    return RNG.integers(lo, 9, shape, endpoint=True).astype(dt.np)


def _graph(op_cls, dtypes):
    g = Graph(op_cls.__name__)
    feeds, labels, types = {}, [], []
    for dt in dtypes:
        for shape, axes, keep, noop in LAYOUTS:
            if 0 in shape and not dt.is_float and op_cls in NO_INT_EMPTY:
                continue
            name = f"x{len(labels)}"
            x = g.add_input(name, TensorType(dt, shape))
            feeds[name] = _data(shape, dt, op_cls)
            a = None if axes is None else g.add_constant(np.array(axes, np.int64))
            g.add(op_cls(keepdims=keep, noop_with_empty_axes=noop), x, a)
            labels.append(f"{op_cls.__name__}[{dt}]{list(shape)} axes={axes} keepdims={keep}")
            types.append(dt)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds, labels, types


def _compare(got, want, dt: DType, label: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, label
    if not dt.is_float:
        np.testing.assert_array_equal(got, want, err_msg=label)
        return
    rtol = {DType.f16: 2e-3, DType.bf16: 2e-2, DType.f32: 2e-6, DType.f64: 1e-13}[dt]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol, equal_nan=True,
                               err_msg=label)


@pytest.mark.parametrize("op_cls", OPS, ids=lambda c: c.__name__)
def test_every_reduction_and_type_on_the_llvm_printer(op_cls):
    dtypes = _types(op_cls)
    g, feeds, labels, types = _graph(op_cls, dtypes)
    for n, label in zip(g.nodes, labels):
        low, why = lowering_for(KernelGroup.of_node(n))
        assert why is None and (isinstance(low, Reduce) or n.outputs[0].type.numel == 0), (label, why)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = interpret(g, feeds)
        got = run_kernels(g, feeds)
    for name, label, dt in zip(g.output_names, labels, types):
        _compare(np.asarray(got[name]), want[name], dt, label)


def test_the_loop_order_follows_the_layout():
    g = Graph("order")
    x = g.add_input("x", TensorType(DType.f32, (3, 5, 7)))
    h = g.add_input("h", TensorType(DType.f16, (3, 5, 7)))
    ax1 = g.add_constant(np.array([1], np.int64))
    nodes = [g.add_node(rd.ReduceSum(), [x, ax1]), g.add_node(rd.ReduceSum(), [x, g.add_constant(np.array([2]))]),
             g.add_node(rd.ReduceSum(), [h, ax1]), g.add_node(rd.ReduceLogSumExp(), [x, ax1])]
    notes = [Reduce().form(KernelGroup.of_node(n), "k").notes for n in nodes]
    assert notes == [["Reduce by columns over 3K 5R 7K"], ["Reduce by rows over 15K 7R"],
                     ["Reduce by rows over 3K 5R 7K"],   # f16 accumulates in f32, not in its own buffer
                     ["Reduce by rows over 3K 5R 7K"]]   # LogSumExp takes two passes


def test_nan_propagates_through_max_and_min():
    g = Graph("nan")
    x = g.add_input("x", TensorType(DType.f32, (4, 50)))
    outs = [g.add(o(), x, g.add_constant(np.array([a], np.int64))) for o in (rd.ReduceMax, rd.ReduceMin)
            for a in (0, 1)]
    g.set_outputs(outs)
    v = RNG.standard_normal((4, 50)).astype(np.float32)
    v[2, 33] = np.nan
    got, want = run_kernels(g, {"x": v}), interpret(g, {"x": v})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


ARG_TYPES = [DType.f32, DType.f16, DType.f64, DType.i8, DType.i64, DType.u8, DType.u32]


@pytest.mark.parametrize("op_cls", [rd.ArgMax, rd.ArgMin], ids=lambda c: c.__name__)
def test_argmax_and_argmin_on_every_type_with_ties_and_nan(op_cls):
    """Ties (small integers) pick the first index, or the last with select_last_index; NaN is the
    extreme for both (NumPy's rule), the first or last NaN."""
    g = Graph("arg")
    feeds, labels = {}, []
    for dt in ARG_TYPES:
        for shape, axis in (((3, 5, 7), 1), ((3, 5, 7), -1), ((4, 6), 0), ((9,), 0), ((2, 1, 3), 1)):
            for keep in (0, 1):
                for last in (0, 1):
                    name = f"x{len(labels)}"
                    x = g.add_input(name, TensorType(dt, shape))
                    data = RNG.integers(0 if not dt.is_signed else -3, 3, shape, endpoint=True).astype(dt.np)
                    if dt.is_float and data.size > 4:
                        data.reshape(-1)[[1, 3]] = np.nan
                    feeds[name] = data
                    g.add(op_cls(axis=axis, keepdims=keep, select_last_index=last), x)
                    labels.append(f"{op_cls.__name__}[{dt}]{list(shape)} axis={axis} keepdims={keep} last={last}")
    g.set_outputs([n.outputs[0] for n in g.nodes])
    for n, label in zip(g.nodes, labels):
        assert lowering_for(KernelGroup.of_node(n))[1] is None, label
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for name, label in zip(g.output_names, labels):
        np.testing.assert_array_equal(got[name], want[name], err_msg=label)


def test_axes_computed_at_run_time_are_refused():
    g = Graph("r")
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    axes = g.add_input("axes", TensorType(DType.i64, (1,)))
    n = g.add_node(rd.ReduceSum(), [x, axes])
    g.set_outputs([n.outputs[0]])
    assert Reduce().check(KernelGroup.of_node(n)) == "the axes are computed at run time"


def _run_cuda(g: Graph, feeds: dict) -> dict:
    out = {}
    for n in g.nodes:
        low = ArgReduce() if isinstance(n.op, rd.ArgReduce) else Reduce()
        kernel = low.form(KernelGroup.of_node(n), "k")
        y = n.outputs[0]
        res = np.zeros(int(y.type.numel), y.type.dtype.np)
        arrays = [res if b.value is y else np.ascontiguousarray(feeds[b.value.name]).reshape(-1)
                  for b in kernel.buffers]
        print_cuda(kernel).launch(arrays, threads=4)
        out[y] = res.reshape([int(d) for d in y.shape])
    return out


#: one type per class on the simulator (it runs each thread in Python: slow)
CUDA_CASES = [(o, t) for o in OPS for t in (DType.f32, DType.i32, DType.bool) if t in o.dtypes]


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator "
                    "(tests/conftest.py turns it on unless NUMBA_ENABLE_CUDASIM is set otherwise)")
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: f"{c[0].__name__}[{c[1]}]")
def test_every_reduction_on_the_cuda_printer(case):
    op_cls, dt = case
    g, feeds, labels, _ = _graph(op_cls, [dt])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = interpret(g, feeds)
        got = _run_cuda(g, {k: v for k, v in feeds.items()})
    for n, name, label in zip(g.nodes, g.output_names, labels):
        _compare(got[n.outputs[0]], want[name], dt, label)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
@pytest.mark.parametrize("op_cls", [rd.ArgMax, rd.ArgMin], ids=lambda c: c.__name__)
def test_argmax_and_argmin_on_the_cuda_printer(op_cls):
    g = Graph("arg")
    x = g.add_input("x", TensorType(DType.f32, (3, 5, 4)))
    for axis, last in ((1, 0), (1, 1), (2, 0), (0, 1)):
        g.add(op_cls(axis=axis, select_last_index=last), x)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    v = RNG.integers(-2, 2, (3, 5, 4), endpoint=True).astype(np.float32)
    v[1, 2, 3] = np.nan
    want, got = interpret(g, {"x": v}), _run_cuda(g, {"x": v})
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[n.outputs[0]], want[name], err_msg=n.describe())


def test_hardmax_on_every_float_type():
    from compiler.codegen.kernels.reduction import Hardmax
    from compiler.ir.ops import norm as nm

    g = Graph("hm")
    feeds = {}
    for dt in (DType.f32, DType.f64, DType.f16):
        x = g.add_input(f"x{dt}", TensorType(dt, (3, 4, 5)))
        v = RNG.integers(-2, 2, (3, 4, 5), endpoint=True).astype(dt.np)  # ties: the first maximum
        v[1, 2, 3] = np.nan
        feeds[f"x{dt}"] = v
        for axis in (0, 1, -1):
            g.add(nm.Hardmax(axis=axis), x)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], Hardmax)
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_lp_normalization():
    from compiler.codegen.kernels.reduction import LpNormalization
    from compiler.ir.ops import norm as nm

    g = Graph("lp")
    feeds = {}
    for dt in (DType.f32, DType.f64, DType.f16):
        x = g.add_input(f"x{dt}", TensorType(dt, (3, 4, 5)))
        v = RNG.standard_normal((3, 4, 5)).astype(dt.np)
        v[1, :, 2] = 0  # a zero norm along axis 1: zeros
        feeds[f"x{dt}"] = v
        for p in (1, 2):
            for axis in (0, 1, -1):
                g.add(nm.LpNormalization(axis=axis, p=p), x)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], LpNormalization)
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        tol = 2e-3 if want[name].dtype == np.float16 else 1e-6
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=n.describe())
    cuda = run_cuda_forms(g, feeds) if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else {}
    for name, v in cuda.items():
        np.testing.assert_allclose(v, want[name], rtol=2e-3, atol=2e-3, err_msg=name)
