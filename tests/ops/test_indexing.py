"""Indexing / gather-scatter / selection ops: numbers (by hand or against ONNX Runtime), shape inference
with known, unknown and data-dependent sizes, older-opset import (converters), and refusals.
The resampling ops are tested in test_resample.py (which uses the helpers here)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from compiler.ir.interpreter import InterpreterError
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import indexing as X
from compiler.ir.types import DType, TensorType
from tests.ops.util import infer_types, kiln_run, run_op

RNG = np.random.default_rng(0)
I64 = np.int64
F32 = np.float32


def _run(op, *arrays, const=(), num_outputs=None):
    """Run one op; arrays at positions in ``const`` become constants (known to inference), the rest inputs."""
    outs, res = run_op(op, *arrays, const={i: arrays[i] for i in const if arrays[i] is not None},
                       num_outputs=num_outputs)
    return [v.type for v in outs], res


#: inferred result types; operands are TensorTypes (graph inputs), arrays (constants) or None
_types = infer_types


def _t(*shape, dtype=DType.f32):
    return TensorType(dtype, shape)


def _onnx(op_type, feeds, consts, attrs, opset, n_out=1, order=None):
    """A one-node ONNX model; ``feeds``/``consts`` map input names to arrays; ``order`` lists the node's
    inputs ("" for a missing one). Returns (model, feeds)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in feeds.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    names = order if order is not None else list(feeds) + list(consts)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


_kiln = kiln_run


# ---------------------------------------------------------------------------------------------
# Gather family
# ---------------------------------------------------------------------------------------------

def test_gather_negative_indices_and_axis():
    data = np.arange(12, dtype=F32).reshape(3, 4)
    idx = np.array([[0, -1], [2, 1]], I64)
    (t,), (y,) = _run(X.Gather(axis=1), data, idx)
    assert t.shape == (3, 2, 2)
    np.testing.assert_array_equal(y, data[:, [[0, 3], [2, 1]]])
    assert X.Gather.pattern is Pattern.INJECTIVE and X.GatherElements.pattern is Pattern.INJECTIVE


def test_gather_refusals():
    with pytest.raises(OpError, match="indices"):
        _types(X.Gather(), _t(3, 4), _t(2))  # float indices
    with pytest.raises(OpError, match="axis 2 is out of range"):
        _types(X.Gather(axis=2), _t(3, 4), _t(2, dtype=DType.i64))
    with pytest.raises(InterpreterError, match="out of range"):
        _run(X.Gather(), np.zeros((3,), F32), np.array([3], I64))


def test_gather_elements_and_nd():
    data = np.array([[1, 2], [3, 4]], F32)
    _, (y,) = _run(X.GatherElements(axis=1), data, np.array([[0, 0], [-1, 0]], I64))
    np.testing.assert_array_equal(y, [[1, 1], [4, 3]])
    d = np.arange(24, dtype=F32).reshape(2, 3, 4)
    (t,), (y,) = _run(X.GatherND(batch_dims=1), d, np.array([[[1, -1]], [[2, 0]]], I64))
    assert t.shape == (2, 1)
    np.testing.assert_array_equal(y, [[d[0, 1, 3]], [d[1, 2, 0]]])
    (t,), (y,) = _run(X.GatherND(), d, np.array([[1], [0]], I64))
    assert t.shape == (2, 3, 4)
    np.testing.assert_array_equal(y, d[[1, 0]])
    with pytest.raises(OpError, match="must be static"):
        _types(X.GatherND(), _t(2, 3), _t(5, "K", dtype=DType.i64))
    with pytest.raises(OpError, match="exceed"):
        _types(X.GatherND(batch_dims=1), _t(2, 3), _t(2, 2, dtype=DType.i64))


# ---------------------------------------------------------------------------------------------
# Scatter family
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction,expected", [
    ("none", [[1, 10, 3], [4, 5, 6]]),
    ("add", [[1, 2 + 10 + 20, 3], [4, 5, 6]]),
    ("mul", [[1, 2 * 10 * 20, 3], [4, 5, 6]]),
    ("max", [[1, 20, 3], [4, 5, 6]]),
    ("min", [[1, 2, 3], [4, 5, 6]]),
])
def test_scatter_elements_reductions(reduction, expected):
    data = np.array([[1, 2, 3], [4, 5, 6]], F32)
    if reduction == "none":
        idx, upd = np.array([[-2]], I64), np.array([[10]], F32)
    else:
        idx, upd = np.array([[1, -2]], I64), np.array([[10, 20]], F32)
    _, (y,) = _run(X.ScatterElements(axis=1, reduction=reduction), data, idx, upd)
    np.testing.assert_array_equal(y, expected)


def test_scatter_nd_and_refusals():
    data = np.zeros((3, 2), F32)
    _, (y,) = _run(X.ScatterND(reduction="add"), data, np.array([[1], [1], [-1]], I64),
                   np.array([[1, 2], [3, 4], [5, 6]], F32))
    np.testing.assert_array_equal(y, [[0, 0], [4, 6], [5, 6]])
    with pytest.raises(OpError, match="reduction must be one of"):
        X.ScatterElements(reduction="sum")
    with pytest.raises(OpError, match="one rank"):
        _types(X.ScatterElements(), _t(3, 3), _t(3, dtype=DType.i64), _t(3))
    with pytest.raises(OpError, match="updates must have shape"):
        _types(X.ScatterND(), _t(3, 2), _t(4, 1, dtype=DType.i64), _t(4, 3))


def test_tensor_scatter_linear_circular():
    past = np.zeros((2, 4, 3), F32)
    upd = np.ones((2, 2, 3), F32) * np.array([1, 2], F32)[:, None, None]
    w = np.array([1, 3], I64)
    _, (y,) = _run(X.TensorScatter(mode="circular"), past, upd, w)
    assert y[0, 1:3].tolist() == [[1] * 3] * 2 and y[0, [0, 3]].sum() == 0
    assert y[1, 3].tolist() == [2] * 3 and y[1, 0].tolist() == [2] * 3
    with pytest.raises(InterpreterError, match="past the cache end"):
        _run(X.TensorScatter(), past, upd, w)
    with pytest.raises(OpError, match="axis cannot be 0"):
        _types(X.TensorScatter(axis=0), _t(2, 4), _t(2, 4))


# ---------------------------------------------------------------------------------------------
# OneHot, Compress, NonZero, ReverseSequence
# ---------------------------------------------------------------------------------------------

def test_onehot_negative_out_of_range_and_shapes():
    (t,), (y,) = _run(X.OneHot(axis=0), np.array([0, -1, 7], I64), np.array(3, I64),
                      np.array([5, 9], F32), const=(1, 2))
    assert t.shape == (3, 3)
    np.testing.assert_array_equal(y, [[9, 5, 5], [5, 5, 5], [5, 9, 5]])
    (t,) = _types(X.OneHot(), _t(2, 3, dtype=DType.i64), _t(dtype=DType.i64), np.array([0, 1], F32))
    assert t.shape == (2, 3, None)
    with pytest.raises(OpError, match="axis 3 is out of range"):
        _types(X.OneHot(axis=3), _t(2, dtype=DType.i64), np.array(3, I64), np.array([0, 1], F32))


def test_data_dependent_shapes():
    x = np.array([[0, 1, 0], [2, 0, 3]], F32)
    (t,), (y,) = _run(X.NonZero(), x)
    assert t.shape == (2, None)
    np.testing.assert_array_equal(y, np.array(np.nonzero(x)))
    (t,) = _types(X.NonZero(), x)  # a known input gives the exact count
    assert t.shape == (2, 3)
    (t,), (y,) = _run(X.Compress(axis=1), x, np.array([True, False, True]))
    assert t.shape == (2, None)
    np.testing.assert_array_equal(y, x[:, [0, 2]])
    (t,) = _types(X.Compress(), _t(2, 3), np.array([False, True]))
    assert t.shape == (1,)
    types, (y, first, inv, cnt) = _run(X.Unique(sorted=0), np.array([2, 1, 1, 3, 4, 3], F32))
    assert [t.shape for t in types] == [(None,), (None,), (6,), (None,)]
    assert y.tolist() == [2, 1, 3, 4] and first.tolist() == [0, 1, 3, 4]
    assert inv.tolist() == [0, 1, 1, 2, 3, 2] and cnt.tolist() == [1, 2, 2, 1]


def test_unique_axis_sorted():
    x = np.array([[[1, 1], [0, 1], [2, 1], [0, 1]], [[1, 1], [0, 1], [2, 1], [0, 1]]], F32)
    types, (y, first, inv, cnt) = _run(X.Unique(axis=1), x)
    assert types[0].shape == (2, None, 2) and types[2].shape == (4,)
    np.testing.assert_array_equal(y, [[[0, 1], [1, 1], [2, 1]]] * 2)
    assert first.tolist() == [1, 0, 2] and inv.tolist() == [1, 0, 2, 0] and cnt.tolist() == [2, 1, 1]


def test_reverse_sequence():
    x = np.arange(16, dtype=F32).reshape(4, 4)
    _, (y,) = _run(X.ReverseSequence(batch_axis=0, time_axis=1), x, np.array([1, 2, 3, 4], I64))
    np.testing.assert_array_equal(y, [[0, 1, 2, 3], [5, 4, 6, 7], [10, 9, 8, 11], [15, 14, 13, 12]])
    with pytest.raises(OpError, match="batch_axis and time_axis"):
        X.ReverseSequence(batch_axis=0, time_axis=0)


# ---------------------------------------------------------------------------------------------
# TopK
# ---------------------------------------------------------------------------------------------

def test_topk_ties_keep_index_order():
    x = np.array([[3, 1, 3, 2, 3, 1]], F32)
    (tv, ti), (v, i) = _run(X.TopK(), x, np.array([4], I64), const=(1,))
    assert tv.shape == (1, 4) and ti.dtype is DType.i64
    assert v.tolist() == [[3, 3, 3, 2]] and i.tolist() == [[0, 2, 4, 3]]
    _, (v, i) = _run(X.TopK(largest=0), x, np.array([3], I64))
    assert v.tolist() == [[1, 1, 2]] and i.tolist() == [[1, 5, 3]]
    _, (v, i) = _run(X.TopK(axis=0), np.array([[7], [250], [7]], np.uint8), np.array([2], I64))
    assert v.ravel().tolist() == [250, 7] and i.ravel().tolist() == [1, 0]
    (tv, _) = _types(X.TopK(), _t(2, 9), _t(1, dtype=DType.i64))
    assert tv.shape == (2, None)
    with pytest.raises(OpError, match="K=10 is out of range"):
        _types(X.TopK(), _t(2, 9), np.array([10], I64))


def test_topk_opset1_attribute_k():
    x = RNG.standard_normal((3, 5)).astype(F32)
    model, feeds = _onnx("TopK", {"x": x}, {}, {"k": 2, "axis": 1}, 9, n_out=2)
    _, (v, i) = _kiln(model, feeds)
    np.testing.assert_array_equal(i, np.argsort(-x, axis=1, kind="stable")[:, :2])


# ---------------------------------------------------------------------------------------------
# Older-opset imports
# ---------------------------------------------------------------------------------------------

def test_scatter_opset9_is_scatter_elements():
    data = np.zeros((3, 3), F32)
    model, feeds = _onnx("Scatter", {"data": data}, {"i": np.array([[1, 0, 2]], I64),
                                                    "u": np.array([[1, 2, 3]], F32)}, dict(axis=0), 9)
    g, (y,) = _kiln(model, feeds)
    assert g.op_counts() == {"ScatterElements": 1}
    np.testing.assert_array_equal(y, [[0, 2, 0], [1, 0, 0], [0, 0, 3]])


def test_onehot_opset9_negative_indices_are_off():
    idx = np.array([0, -1, 2], I64)
    model, feeds = _onnx("OneHot", {"i": idx}, {"d": np.array([3], F32), "v": np.array([0, 1], F32)}, {}, 9)
    _, (y,) = _kiln(model, feeds)
    np.testing.assert_array_equal(y, [[1, 0, 0], [0, 0, 0], [0, 0, 1]])
    model, feeds = _onnx("OneHot", {"i": idx}, {"d": np.array([3], F32), "v": np.array([0, 1], F32)}, {}, 11)
    _, (y,) = _kiln(model, feeds)
    np.testing.assert_array_equal(y, [[1, 0, 0], [0, 0, 1], [0, 0, 1]])
