"""Reduce* ops, ArgMax/ArgMin, CumSum/CumProd: numbers (against ONNX Runtime or by hand), shape
inference with axes known and unknown at compile time, older-opset import, and refusals."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import reduce as R
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import run_op

REDUCES = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]

RNG = np.random.default_rng(0)


def _run(op, *arrays, const=None):
    """Run one op: arrays become graph inputs; ``const`` maps input positions to constants."""
    (y,), (out,) = run_op(op, *arrays, const=const)
    return y, out


def _model(op_type, inputs, attrs, opset, initializers=(), out_dtype=None):
    """A one-node ONNX model: ``inputs`` is a list of (name, array) fed at run time."""
    out_dtype = inputs[0][1].dtype if out_dtype is None else np.dtype(out_dtype)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs]
    names = [n for n, _ in inputs] + [t.name for t in initializers]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(out_dtype), None)
    g = helper.make_graph([node], "t", vis, [out], initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _vs_ort(model, feeds, rtol=1e-5, atol=1e-6):
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = interpret(import_model(model), feeds)["y"]
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.dtype, ref.shape)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    return got


# ---------------------------------------------------------------------------------------------
# Reduce*: numbers against ONNX Runtime, the current form (axes as an input) and older ones
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", REDUCES)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([-1, 0], 0), (None, 1), (None, 0), ([0, 2], 1)])
def test_reduce_matches_onnxruntime(op_type, axes, keepdims):
    x = RNG.uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)
    inits = [] if axes is None else [numpy_helper.from_array(np.array(axes, np.int64), "axes")]
    _vs_ort(_model(op_type, [("x", x)], {"keepdims": keepdims}, 18, inits), {"x": x})


@pytest.mark.parametrize("op_type,opset", [("ReduceSum", 11), ("ReduceSum", 12), ("ReduceMean", 13),
                                           ("ReduceMax", 12), ("ReduceL2", 11), ("ReduceLogSumExp", 13),
                                           ("ReduceProd", 17)])
def test_reduce_old_opset_axes_attribute(op_type, opset):
    x = RNG.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    got = _vs_ort(_model(op_type, [("x", x)], {"axes": [0, -1], "keepdims": 0}, opset), {"x": x})
    assert got.shape == (3,)
    # no axes attribute: all axes
    got = _vs_ort(_model(op_type, [("x", x)], {}, opset), {"x": x})
    assert got.shape == (1, 1, 1)


def test_reduce_sum_old_opset_becomes_axes_input():
    x = np.ones((2, 3), np.float32)
    g = import_model(_model("ReduceSum", [("x", x)], {"axes": [1]}, 11))
    (node,) = g.nodes
    assert isinstance(node.op, R.ReduceSum) and node.inputs[1].const.tolist() == [1]
    assert node.outputs[0].type == TensorType(DType.f32, (2, 1))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_reduce_sum_max_other_types(dtype):
    # (a generator of its own: the shared one's draws depend on which tests ran before in the worker;
    # below 30, the product of a row of six fits int32: an overflowing one had ONNX Runtime saturate
    # where Kiln wraps, as NumPy does, and failed the test on one draw in CI)
    x = np.random.default_rng(82).integers(0, 30, (4, 6)).astype(dtype)
    for op_type in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
        axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
        _vs_ort(_model(op_type, [("x", x)], {"keepdims": 0}, 18, [axes]), {"x": x}, rtol=0, atol=0)


def test_reduce_unsigned_and_int_mean():
    x = np.array([[1, 2, 4], [2**40, 1, 0]], np.uint64)
    ax = np.array([1], np.int64)
    assert _run(R.ReduceSum(keepdims=0), x, ax, const={1: ax})[1].tolist() == [7, 2**40 + 1]
    assert _run(R.ReduceMin(keepdims=0), x, ax, const={1: ax})[1].tolist() == [1, 0]
    mean = _run(R.ReduceMean(keepdims=0), np.array([[1, 2], [-3, -4]], np.int32), ax, const={1: ax})[1]
    assert mean.dtype == np.int32 and mean.tolist() == [1, -3]  # the mean truncated toward zero


def test_reduce_f16_accumulates_in_f32():
    x = np.full((4096,), 0.1, np.float16)
    _, y = _run(R.ReduceSum(keepdims=0), x)
    assert y.dtype == np.float16 and abs(float(y) - 409.6) < 0.5


def test_reduce_max_min_bool():
    x = np.array([[True, False], [False, False]])
    ax = np.array([1], np.int64)
    assert _run(R.ReduceMax(keepdims=0), x, ax, const={1: ax})[1].tolist() == [True, False]
    assert _run(R.ReduceMin(keepdims=0), x, ax, const={1: ax})[1].tolist() == [False, False]


# ---------------------------------------------------------------------------------------------
# Empty reductions and no-op reductions
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,dtype,expected", [
    (R.ReduceSum, np.float32, 0.0), (R.ReduceProd, np.float32, 1.0), (R.ReduceMax, np.float32, -np.inf),
    (R.ReduceMin, np.float32, np.inf), (R.ReduceL1, np.float32, 0.0), (R.ReduceL2, np.float32, 0.0),
    (R.ReduceLogSum, np.float32, -np.inf), (R.ReduceLogSumExp, np.float32, -np.inf),
    (R.ReduceSumSquare, np.float32, 0.0), (R.ReduceMax, np.int32, np.iinfo(np.int32).min),
    (R.ReduceMin, np.int64, np.iinfo(np.int64).max), (R.ReduceMax, np.bool_, False),
    (R.ReduceMin, np.bool_, True)])
def test_empty_reduction_is_the_identity(op, dtype, expected):
    x = np.zeros((2, 0, 3), dtype)
    ax = np.array([1], np.int64)
    y, out = _run(op(), x, ax, const={1: ax})
    assert y.type == TensorType(DType.from_numpy(dtype), (2, 1, 3))
    assert out.shape == (2, 1, 3) and np.all(out == expected)


def test_noop_with_empty_axes_keeps_the_elementwise_part():
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    empty = np.zeros((0,), np.int64)
    assert np.array_equal(_run(R.ReduceSum(noop_with_empty_axes=1), x, empty, const={1: empty})[1], x)
    assert np.array_equal(_run(R.ReduceSum(noop_with_empty_axes=1), x)[1], x)
    assert np.array_equal(_run(R.ReduceSumSquare(noop_with_empty_axes=1), x)[1], x * x)
    assert np.array_equal(_run(R.ReduceL1(noop_with_empty_axes=1), x)[1], np.abs(x))
    # without noop, empty axes reduce everything
    y, out = _run(R.ReduceSum(keepdims=0), x, empty, const={1: empty})
    assert y.type.shape == () and out == 0.0


def test_reduce_scalar_input():
    x = np.array(3.0, np.float32)
    y, out = _run(R.ReduceSumSquare(), x)
    assert y.type.shape == () and out == 9.0


# ---------------------------------------------------------------------------------------------
# Shape inference when axes are only known at run time
# ---------------------------------------------------------------------------------------------

def _graph_with_axes_input(op, axes_len):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("N", 1, 4, 5)))
    a = g.add_input("axes", TensorType(DType.i64, (axes_len,)))
    y = g.add(op, x, a)
    g.set_outputs([y], ["y"])
    return g, y


def test_runtime_axes_keepdims_keeps_rank():
    g, y = _graph_with_axes_input(R.ReduceMean(), 2)
    assert y.type.shape == (None, 1, None, None)
    x = RNG.standard_normal((2, 1, 4, 5)).astype(np.float32)
    out = interpret(g, {"x": x, "axes": np.array([0, 3], np.int64)})["y"]
    np.testing.assert_allclose(out, x.mean(axis=(0, 3), keepdims=True), rtol=1e-6)


def test_runtime_axes_no_keepdims_rank_from_axes_length():
    g, y = _graph_with_axes_input(R.ReduceMax(keepdims=0), 2)
    assert y.type.rank == 2 and y.type.shape == (None, None)
    x = RNG.standard_normal((3, 1, 4, 5)).astype(np.float32)
    out = interpret(g, {"x": x, "axes": np.array([2, 0], np.int64)})["y"]
    np.testing.assert_array_equal(out, x.max(axis=(0, 2)))


def test_runtime_axes_of_unknown_length_without_keepdims_is_refused():
    with pytest.raises(OpError, match="number of axes.*must be static"):
        _graph_with_axes_input(R.ReduceSum(keepdims=0), "K")
    g, y = _graph_with_axes_input(R.ReduceSum(keepdims=1), "K")  # fine with keepdims
    assert y.type.rank == 4


def test_runtime_axes_of_length_zero():
    _, y = _graph_with_axes_input(R.ReduceSum(keepdims=0, noop_with_empty_axes=1), 0)
    assert y.type.shape == ("N", 1, 4, 5)
    _, y = _graph_with_axes_input(R.ReduceSum(keepdims=0), 0)
    assert y.type.shape == ()


def test_symbolic_dims_are_kept():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("B", "T", 8)))
    ax = g.add_constant(np.array([-1], np.int64))
    assert g.add(R.ReduceSum(), x, ax).type.shape == ("B", "T", 1)
    assert g.add(R.ReduceSum(keepdims=0), x, ax).type.shape == ("B", "T")


def test_reduce_pattern_and_cost():
    assert R.ReduceSum.pattern is Pattern.REDUCE and R.ArgMax.pattern is Pattern.REDUCE
    assert R.CumSum.pattern is Pattern.OPAQUE
    c = R.ReduceSum().cost([TensorType(DType.f32, (8, 16)), None], [TensorType(DType.f32, (1, 1))])
    assert c.flops == 128


# ---------------------------------------------------------------------------------------------
# Reduce refusals
# ---------------------------------------------------------------------------------------------

def _reduce_graph(op, shape=(2, 3), dtype=DType.f32, axes=None, axes_dtype=np.int64):
    g = Graph()
    x = g.add_input("x", TensorType(dtype, shape))
    a = None if axes is None else g.add_constant(np.array(axes, axes_dtype))
    return g.add(op, x, a)


def test_reduce_refusals():
    with pytest.raises(OpError, match="keepdims must be 0 or 1"):
        R.ReduceSum(keepdims=2)
    with pytest.raises(OpError, match="noop_with_empty_axes must be 0 or 1"):
        R.ReduceMax(noop_with_empty_axes=3)
    with pytest.raises(OpError, match="axes value 2 is out of range for rank 2"):
        _reduce_graph(R.ReduceSum(), axes=[2])
    with pytest.raises(OpError, match="name an axis twice"):
        _reduce_graph(R.ReduceMean(), axes=[1, -1])
    with pytest.raises(OpError, match="axes has element type f32"):
        _reduce_graph(R.ReduceSum(), axes=[1], axes_dtype=np.float32)
    with pytest.raises(OpError, match="axes must be a 1-D tensor"):
        _reduce_graph(R.ReduceSum(), axes=[[1]])
    with pytest.raises(OpError, match="element type string is not|has element type string"):
        _reduce_graph(R.ReduceSum(), dtype=DType.string)
    with pytest.raises(OpError, match="has element type bool"):
        _reduce_graph(R.ReduceSum(), dtype=DType.bool)
    with pytest.raises(OpError, match="takes 1 to 2 inputs"):
        g = Graph()
        x = g.add_input("x", TensorType(DType.f32, (2,)))
        g.add(R.ReduceSum(), x, x, x)


# ---------------------------------------------------------------------------------------------
# ArgMax / ArgMin
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1, "select_last_index": 1},
                                   {"axis": 0, "keepdims": 0, "select_last_index": 1}])
def test_argmax_argmin_match_onnxruntime(op_type, attrs):
    x = RNG.integers(0, 3, (4, 5, 3)).astype(np.float32)  # many ties
    _vs_ort(_model(op_type, [("x", x)], attrs, 13, out_dtype=np.int64), {"x": x}, rtol=0, atol=0)


def test_argmax_old_opset_and_int_input():
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int32)
    _vs_ort(_model("ArgMax", [("x", x)], {"axis": 1}, 9, out_dtype=np.int64), {"x": x}, rtol=0, atol=0)
    _vs_ort(_model("ArgMin", [("x", x)], {"axis": 0, "keepdims": 0}, 11, out_dtype=np.int64), {"x": x},
            rtol=0, atol=0)


def test_argmax_by_hand():
    x = np.array([[1, 5, 5], [7, 0, 7]], np.float32)
    assert _run(R.ArgMax(axis=1), x)[1].tolist() == [[1], [0]]
    assert _run(R.ArgMax(axis=1, select_last_index=1, keepdims=0), x)[1].tolist() == [2, 2]
    y, out = _run(R.ArgMin(axis=0, keepdims=0), x)
    assert y.type == TensorType(DType.i64, (3,)) and out.tolist() == [0, 1, 0]


def test_argmax_refusals():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 0)))
    with pytest.raises(OpError, match="axis 2 is out of range for rank 2"):
        g.add(R.ArgMax(axis=2), x)
    with pytest.raises(OpError, match="is empty"):
        g.add(R.ArgMin(axis=1), x)
    with pytest.raises(OpError, match="rank >= 1"):
        g.add(R.ArgMax(), g.add_input("s", TensorType(DType.f32, ())))
    with pytest.raises(OpError, match="select_last_index must be 0 or 1"):
        R.ArgMax(select_last_index=2)
    with pytest.raises(OpError, match="has element type bool"):
        g.add(R.ArgMax(), g.add_input("b", TensorType(DType.bool, (3,))))


# ---------------------------------------------------------------------------------------------
# CumSum / CumProd
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exclusive,reverse,sums,prods", [
    (0, 0, [1, 3, 6, 10], [1, 2, 6, 24]),
    (1, 0, [0, 1, 3, 6], [1, 1, 2, 6]),
    (0, 1, [10, 9, 7, 4], [24, 24, 12, 4]),
    (1, 1, [9, 7, 4, 0], [24, 12, 4, 1])])
def test_cumulative_by_hand(exclusive, reverse, sums, prods):
    x = np.array([1, 2, 3, 4], np.int32)
    axis = np.array(0, np.int32)
    out = _run(R.CumSum(exclusive=exclusive, reverse=reverse), x, axis)[1]
    assert out.dtype == np.int32 and out.tolist() == sums
    assert _run(R.CumProd(exclusive=exclusive, reverse=reverse), x, axis)[1].tolist() == prods


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1}, {"reverse": 1}, {"exclusive": 1, "reverse": 1}])
def test_cumsum_matches_onnxruntime(attrs):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    axis = numpy_helper.from_array(np.array(-2, np.int64), "axis")
    _vs_ort(_model("CumSum", [("x", x)], attrs, 14, [axis]), {"x": x})


def test_cumsum_axis_at_run_time():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f64, (2, 3)))
    a = g.add_input("a", TensorType(DType.i64, ()))
    y = g.add(R.CumSum(), x, a)
    g.set_outputs([y], ["y"])
    xv = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(interpret(g, {"x": xv, "a": np.array(1)})["y"], np.cumsum(xv, axis=1))


def test_cumulative_refusals():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    with pytest.raises(OpError, match="axis 2 is out of range"):
        g.add(R.CumSum(), x, g.add_constant(np.array(2, np.int64)))
    with pytest.raises(OpError, match="axis has element type f32"):
        g.add(R.CumSum(), x, g.add_constant(np.array(0.0, np.float32)))
    with pytest.raises(OpError, match="axis must be a scalar"):
        g.add(R.CumProd(), x, g.add_constant(np.array([0, 1], np.int64)))
    with pytest.raises(OpError, match="exclusive must be 0 or 1"):
        R.CumSum(exclusive=5)
    with pytest.raises(OpError, match="takes 2 inputs"):
        g.add(R.CumSum(), x)
