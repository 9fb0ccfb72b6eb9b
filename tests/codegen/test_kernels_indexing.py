"""Loop-form kernels that read through run-time indices (compiler/codegen/kernels/indexing.py):
GatherElements on every storage type and NegativeLogLikelihoodLoss with every option, against the
reference interpreter, on the LLVM printer and in numba's CUDA simulator; an index out of range is
reported (the run raises an error naming the node), never read."""
from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.indexing import GatherElements, NegativeLogLikelihoodLoss
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.codegen.loops.cuda import KernelReport
from compiler.errors import InputError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import indexing as ix
from compiler.ir.ops import norm as nm
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(9)
TYPES = [DType.f32, DType.f16, DType.f64, DType.i8, DType.i64, DType.u16, DType.bool]
GATHERS = [((3, 4), (2, 4), 0), ((3, 4), (3, 2), 1), ((2, 5, 3), (2, 4, 3), 1), ((2, 5, 3), (1, 5, 6), -1), ((7,), (9,), 0)]


def _data(shape, dt: DType) -> np.ndarray:
    if dt is DType.bool:
        return RNG.random(shape) < 0.5
    return RNG.integers(-50, 50, shape).astype(dt.np)


def _gather_graph(dtypes, index_type=DType.i64):
    g = Graph("ge")
    feeds, labels = {}, []
    for dt in dtypes:
        for dshape, ishape, axis in GATHERS:
            k = len(labels)
            d = g.add_input(f"d{k}", TensorType(dt, dshape))
            i = g.add_input(f"i{k}", TensorType(index_type, ishape))
            dim = dshape[axis]
            feeds[f"d{k}"], feeds[f"i{k}"] = _data(dshape, dt), RNG.integers(-dim, dim, ishape).astype(index_type.np)
            g.add(ix.GatherElements(axis=axis), d, i)
            labels.append(f"GatherElements[{dt}] {dshape} by {ishape} axis {axis}")
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds, labels


@pytest.mark.parametrize("index_type", [DType.i64, DType.i32])
def test_gather_elements_on_every_type(index_type):
    g, feeds, labels = _gather_graph(TYPES, index_type)
    for n, label in zip(g.nodes, labels):
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], GatherElements), label
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for name, label in zip(g.output_names, labels):
        np.testing.assert_array_equal(got[name], want[name], err_msg=label)


def _nll_graph(dt: DType = DType.f32):
    g = Graph("nll")
    x = g.add_input("x", TensorType(dt, (3, 5, 2)))
    t = g.add_input("t", TensorType(DType.i64, (3, 2)))
    w = g.add_input("w", TensorType(dt, (5,)))
    x2 = g.add_input("x2", TensorType(dt, (4, 3)))
    t2 = g.add_input("t2", TensorType(DType.i32, (4,)))
    for red in ("none", "sum", "mean"):
        for ignore in (None, 1, -7):
            g.add(nm.NegativeLogLikelihoodLoss(reduction=red, ignore_index=ignore), x, t, w)
            g.add(nm.NegativeLogLikelihoodLoss(reduction=red, ignore_index=ignore), x2, t2)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    feeds = {"x": RNG.standard_normal((3, 5, 2)).astype(dt.np), "t": np.array([[0, 1], [4, 1], [2, 3]]),
             "w": RNG.random(5).astype(dt.np), "x2": RNG.standard_normal((4, 3)).astype(dt.np),
             "t2": np.array([2, 1, 0, 1], np.int32)}
    return g, feeds


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16])
def test_nll_loss_with_every_option(dt):
    g, feeds = _nll_graph(dt)
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], NegativeLogLikelihoodLoss), n.describe()
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    tol = {DType.f16: 1e-3, DType.f32: 1e-6, DType.f64: 1e-12}[dt]
    for name in g.output_names:
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=name)


def _model(node, inputs):
    vi = [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs]
    m = helper.make_model(helper.make_graph([node], "m", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                            None)]),
                          opset_imports=[helper.make_opsetid("", 22)])
    m.ir_version = 10
    return m


def test_an_index_out_of_range_is_reported():
    ge = compiler.compile(_model(helper.make_node("GatherElements", ["d", "i"], ["y"], axis=1, name="ge"),
                                 [("d", TensorProto.FLOAT, (2, 3)), ("i", TensorProto.INT64, (2, 2))]),
                          fallback=False)
    d = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ge.run({"d": d, "i": np.array([[0, -1], [2, 1]])})["y"], [[0, 2], [5, 4]])
    with pytest.raises(InputError, match=r"'ge'.*index 3 is out of range"):
        ge.run({"d": d, "i": np.array([[0, 3], [2, 1]])})
    nll = compiler.compile(_model(helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], name="nll",
                                                   ignore_index=-1),
                                  [("x", TensorProto.FLOAT, (2, 3)), ("t", TensorProto.INT64, (2,))]),
                           fallback=False)
    x = np.ones((2, 3), np.float32)
    assert nll.run({"x": x, "t": np.array([-1, 2])})["y"] == -1.0  # -1 is ignored, not counted from the end
    with pytest.raises(InputError, match=r"'nll'.*index -2 is out of range"):
        nll.run({"x": x, "t": np.array([-2, 2])})


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_both_on_the_cuda_printer():
    for g, feeds in (_gather_graph([DType.f32, DType.i8])[:2], _nll_graph()):
        want, got = interpret(g, feeds), run_cuda_forms(g, feeds)
        for n, name in zip(g.nodes, g.output_names):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=n.describe())
    g, feeds, _ = _gather_graph([DType.f32])
    feeds["i0"] = np.full_like(feeds["i0"], 5)
    with pytest.raises(KernelReport, match="index 5 is out of range"):
        run_cuda_forms(g, feeds)


def _scatter_graph():
    g = Graph("sc")
    feeds = {}
    d = g.add_input("d", TensorType(DType.f32, (4, 3, 2)))
    feeds["d"] = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    di = g.add_input("di", TensorType(DType.i32, (4, 3, 2)))
    feeds["di"] = RNG.integers(-5, 5, (4, 3, 2)).astype(np.int32)
    ie = g.add_input("ie", TensorType(DType.i64, (2, 3, 2)))
    feeds["ie"] = np.array([[[0, 3], [1, -1], [0, 0]], [[3, 3], [2, -4], [1, 1]]])  # duplicates: in order
    for data, dt in ((d, DType.f32), (di, DType.i32)):
        ue = g.add_input(f"ue{dt}", TensorType(dt, (2, 3, 2)))
        feeds[f"ue{dt}"] = RNG.integers(-3, 4, (2, 3, 2)).astype(dt.np)
        for red in ("none", "add", "mul", "max", "min"):
            g.add(ix.ScatterElements(axis=0, reduction=red), data, ie, ue)
        nd = g.add_input(f"nd{dt}", TensorType(DType.i64, (3, 2)))
        feeds[f"nd{dt}"] = np.array([[0, 1], [3, -1], [0, 1]])
        un = g.add_input(f"un{dt}", TensorType(dt, (3, 2)))
        feeds[f"un{dt}"] = RNG.integers(-3, 4, (3, 2)).astype(dt.np)
        for red in ("none", "add", "max"):
            g.add(ix.ScatterND(reduction=red), data, nd, un)
        g.add(ix.GatherND(), data, nd)
        g.add(ix.GatherND(batch_dims=1), data, g.add_constant(np.array([[1], [0], [2], [-1]])))
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds


def test_scatter_and_gather_nd():
    from compiler.codegen.kernels.indexing import GatherND, Scatter

    g, feeds = _scatter_graph()
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], (GatherND, Scatter)), n.describe()
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=n.describe())


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_scatter_and_gather_nd_on_the_cuda_printer():
    g, feeds = _scatter_graph()
    want, got = interpret(g, feeds), run_cuda_forms(g, feeds, threads=2)
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=n.describe())
