"""Shape ops (reshapes, transposes, shape queries): numbers (against ONNX Runtime or by hand), shape
inference with the shape-determining operands known, unknown and symbolic, older-opset import, and refusals.
The tensor construction/combination ops are tested in test_tensor.py (which uses the helpers here)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import shape as S
from compiler.ir.ops import tensor as T
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import infer_types, run_op

RNG = np.random.default_rng(0)
I64 = np.int64


#: run one op: arrays become graph inputs, except positions in ``const`` (constants)
_run = run_op
#: inferred result types; operands are TensorTypes (graph inputs) or arrays (constants)
_types = infer_types


def _shape(op, *operands):
    return _types(op, *operands)[0].shape


def _t(*shape, dtype=DType.f32):
    return TensorType(dtype, shape)


def _model(op_type, inputs, attrs, opset, initializers=(), outputs=("y",)):
    """A one-node ONNX model; ``inputs`` is a list of (name, array) fed at run time."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs]
    names = [n for n, _ in inputs] + [t.name for t in initializers]
    node = helper.make_node(op_type, names, list(outputs), **attrs)
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs if o]
    g = helper.make_graph([node], "t", vis, outs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _init(name, arr):
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape, arr.ravel().tolist())


def _vs_ort(model, feeds, rtol=0.0):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    g = import_model(model)
    got = interpret(g, feeds)
    names = [o.name for o in model.graph.output]
    for n, r in zip(names, ref):
        assert got[n].dtype == r.dtype and got[n].shape == r.shape, (n, got[n].dtype, got[n].shape, r.dtype, r.shape)
        np.testing.assert_allclose(got[n], r, rtol=rtol)
    return g, [got[n] for n in names]


# ---------------------------------------------------------------------------------------------
# Reshape, Flatten, Squeeze, Unsqueeze
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [[0, -1], [-1, 12], [4, 0, 2], [2, -1, 2], [24], [-1], [1, 2, 3, 4, 1]])
def test_reshape_numbers(shape):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    m = _model("Reshape", [("x", x)], {}, 14, [_init("s", np.array(shape, I64))])
    g, _ = _vs_ort(m, {"x": x})
    assert g.outputs[0].type.is_static  # a known shape gives a static result


def test_reshape_allowzero():
    x = np.zeros((0, 3), np.float32)
    (v,), (y,) = _run(S.Reshape(allowzero=1), x, np.array([3, 0], I64), const={1: np.array([3, 0], I64)})
    assert v.shape == (3, 0) and y.shape == (3, 0)


def test_reshape_symbolic_dims():
    s = np.array
    assert _shape(S.Reshape(), _t("N", 3, 4), s([0, -1], I64)) == ("N", 12)
    assert _shape(S.Reshape(), _t("N", 3, 4), s([-1, 12], I64)) == ("N", 12)
    assert _shape(S.Reshape(), _t("N", 3, 4), s([-1], I64)) == (None,)
    assert _shape(S.Reshape(), _t("N", 3, 4), s([-1, 4], I64)) == (None, 4)  # 3N: not one symbol
    assert _shape(S.Reshape(), _t("N", "S", 8), s([0, 0, 2, -1], I64)) == ("N", "S", 2, 4)
    assert _shape(S.Reshape(), _t(None, 6), s([0, 2, -1], I64)) == (None, 2, 3)
    # the shape operand unknown: only the rank is known
    assert _shape(S.Reshape(), _t(2, 3, 4), _t(3, dtype=DType.i64)) == (None, None, None)


def test_reshape_through_shape_concat_keeps_symbols():
    """x.reshape(x.shape[0], -1) as exporters write it: Shape -> Slice -> Concat -> Reshape."""
    g = Graph()
    x = g.add_input("x", _t("N", 3, 4))
    sh = g.add(S.Shape(), x)
    assert sh.type.shape == (3,) and sh.known is None
    first = g.add(T.Slice(), sh, g.add_constant(np.array([0], I64)), g.add_constant(np.array([1], I64)))
    target = g.add(T.Concat(axis=0), first, g.add_constant(np.array([-1], I64)))
    y = g.add(S.Reshape(), x, target)
    assert y.type.shape == ("N", 12)
    z = g.add(T.ConstantOfShape(), g.add(S.Shape(end=2), x))
    assert z.type == _t("N", 3)
    g.set_outputs([y, z], ["y", "z"])
    res = interpret(g, {"x": np.ones((5, 3, 4), np.float32)})
    assert res["y"].shape == (5, 12) and res["z"].shape == (5, 3)


def test_reshape_refusals():
    x = _t(2, 3, 4)
    with pytest.raises(OpError, match="more than one -1"):
        _types(S.Reshape(), x, np.array([-1, -1], I64))
    with pytest.raises(OpError, match="cannot reshape"):
        _types(S.Reshape(), x, np.array([5, 5], I64))
    with pytest.raises(OpError, match="cannot reshape"):
        _types(S.Reshape(), x, np.array([5, -1], I64))
    with pytest.raises(OpError, match="both 0 and -1"):
        _types(S.Reshape(allowzero=1), x, np.array([0, -1], I64))
    with pytest.raises(OpError, match="does not have"):
        _types(S.Reshape(), _t(24), np.array([1, 0], I64))
    with pytest.raises(OpError, match="must be static"):
        _types(S.Reshape(), x, _t("K", dtype=DType.i64))
    with pytest.raises(OpError, match="element type f32"):
        _types(S.Reshape(), x, np.array([24.0], np.float32))
    with pytest.raises(OpError, match="allowzero"):
        S.Reshape(allowzero=2)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    _vs_ort(_model("Flatten", [("x", x)], {"axis": axis}, 13), {"x": x})


def test_flatten_symbolic_and_refusal():
    assert _shape(S.Flatten(), _t("N", 3, 4)) == ("N", 12)
    assert _shape(S.Flatten(axis=2), _t("N", 3, 4)) == (None, 4)
    assert _shape(S.Flatten(axis=0), _t("N", 1)) == (1, "N")
    with pytest.raises(OpError, match="out of range"):
        _types(S.Flatten(axis=4), _t(2, 3, 4))


def test_squeeze_unsqueeze_numbers_and_shapes():
    x = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)
    (v,), (y,) = _run(S.Squeeze(), x)
    assert v.shape == (3, 2) and y.shape == (3, 2)
    (v,), (y,) = _run(S.Squeeze(), x, None, const={1: np.array([-2], I64)})
    assert v.shape == (1, 3, 2) and y.shape == (1, 3, 2)
    (v,), (y,) = _run(S.Unsqueeze(), x, None, const={1: np.array([0, -1, 3], I64)})
    assert v.shape == (1, 1, 3, 1, 1, 2, 1) and y.shape == v.shape
    np.testing.assert_array_equal(y.ravel(), x.ravel())
    assert _shape(S.Squeeze(), _t("N", 1, 4), np.array([1], I64)) == ("N", 4)
    assert _shape(S.Unsqueeze(), _t("N", 4), np.array([1], I64)) == ("N", 1, 4)
    # axes not known: rank from the axes' length
    assert _shape(S.Unsqueeze(), _t(3, 4), _t(2, dtype=DType.i64)) == (None,) * 4
    assert _shape(S.Squeeze(), _t(1, 3, 1), _t(2, dtype=DType.i64)) == (None,)


def test_squeeze_unsqueeze_refusals():
    with pytest.raises(OpError, match="its size is 3"):
        _types(S.Squeeze(), _t(1, 3), np.array([1], I64))
    with pytest.raises(OpError, match="every dimension must be static"):
        _types(S.Squeeze(), _t("N", 1, 3))
    with pytest.raises(OpError, match="out of range"):
        _types(S.Unsqueeze(), _t(3), np.array([3], I64))
    with pytest.raises(OpError, match="repeat an axis"):
        _types(S.Unsqueeze(), _t(3), np.array([0, -3], I64))


@pytest.mark.parametrize("opset", [7, 11, 13])
def test_squeeze_unsqueeze_older_opsets(opset):
    x = RNG.standard_normal((1, 3, 1)).astype(np.float32)
    if opset < 13:
        sq = _model("Squeeze", [("x", x)], {"axes": [0, 2]}, opset)
        un = _model("Unsqueeze", [("x", x)], {"axes": [1, 4]}, opset)
    else:
        sq = _model("Squeeze", [("x", x)], {}, opset, [_init("a", np.array([0, 2], I64))])
        un = _model("Unsqueeze", [("x", x)], {}, opset, [_init("a", np.array([1, 4], I64))])
    assert _vs_ort(sq, {"x": x})[1][0].shape == (3,)
    assert _vs_ort(un, {"x": x})[1][0].shape == (1, 1, 3, 1, 1)


# ---------------------------------------------------------------------------------------------
# Transpose, DepthToSpace, SpaceToDepth
# ---------------------------------------------------------------------------------------------

def test_transpose():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    _vs_ort(_model("Transpose", [("x", x)], {"perm": [1, 2, 0]}, 13), {"x": x})
    _vs_ort(_model("Transpose", [("x", x)], {}, 13), {"x": x})
    assert _shape(S.Transpose(perm=(2, 0, 1)), _t("N", 3, None)) == (None, "N", 3)
    with pytest.raises(OpError, match="not a permutation"):
        S.Transpose(perm=(0, 0, 1))
    with pytest.raises(OpError, match="rank 2"):
        _types(S.Transpose(perm=(0, 2, 1)), _t(2, 3))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space_round_trip(mode):
    x = RNG.standard_normal((2, 8, 3, 5)).astype(np.float32)
    m = _model("DepthToSpace", [("x", x)], {"blocksize": 2, "mode": mode}, 13)
    _, (y,) = _vs_ort(m, {"x": x})
    assert y.shape == (2, 2, 6, 10)
    (v,), (back,) = _run(S.SpaceToDepth(blocksize=2, mode=mode), y)
    assert v.shape == x.shape
    np.testing.assert_array_equal(back, x)


def test_space_to_depth_vs_ort_and_refusals():
    x = RNG.standard_normal((1, 3, 4, 6)).astype(np.float32)
    _vs_ort(_model("SpaceToDepth", [("x", x)], {"blocksize": 2}, 13), {"x": x})
    assert _shape(S.SpaceToDepth(blocksize=2), _t("N", 3, 4, "W")) == ("N", 12, 2, None)
    assert _shape(S.DepthToSpace(blocksize=2), _t("N", 8, "H", 4)) == ("N", 2, None, 8)
    with pytest.raises(OpError, match="blocksize"):
        S.DepthToSpace()
    with pytest.raises(OpError, match="mode"):
        S.SpaceToDepth(blocksize=2, mode="XYZ")
    with pytest.raises(OpError, match="multiple of blocksize"):
        _types(S.SpaceToDepth(blocksize=4), _t(1, 3, 4, 6))
    with pytest.raises(OpError, match="not a multiple"):
        _types(S.DepthToSpace(blocksize=2), _t(1, 6, 4, 6))
    with pytest.raises(OpError, match="4-D"):
        _types(S.DepthToSpace(blocksize=2), _t(4, 4, 6))


# ---------------------------------------------------------------------------------------------
# Shape, Size
# ---------------------------------------------------------------------------------------------

def test_shape_and_size_known_from_static_shapes():
    g = Graph()
    x = g.add_input("x", _t(2, 3, 4))
    y = g.add_input("y", _t("N", 3, 4))
    assert g.add(S.Shape(), x).known.tolist() == [2, 3, 4]
    assert g.add(S.Shape(start=-2), y).known.tolist() == [3, 4]
    assert g.add(S.Shape(start=1, end=-1), x).known.tolist() == [3]
    assert g.add(S.Shape(start=5), x).type.shape == (0,)
    assert g.add(S.Shape(start=2, end=1), x).type.shape == (0,)
    assert g.add(S.Shape(), y).known is None
    assert g.add(S.Size(), x).known.tolist() == 24
    assert g.add(S.Size(), y).known is None
    s = g.add(S.Shape(start=-10, end=10), y)
    g.set_outputs([s], ["s"])
    assert interpret(g, {"x": np.zeros((2, 3, 4), np.float32),
                         "y": np.zeros((7, 3, 4), np.float32)})["s"].tolist() == [7, 3, 4]


def test_identity_and_patterns():
    x = np.array(["a", "b"], dtype=object)
    (v,), (y,) = _run(S.Identity(), x)
    assert v.dtype is DType.string and y.tolist() == ["a", "b"]
    assert S.Reshape.pattern is Pattern.INJECTIVE and S.Transpose.pattern is Pattern.INJECTIVE
    assert {c.name for c in S.OPS} >= {"Reshape", "Shape"}
