"""Shape / data-movement ops: numbers (against ONNX Runtime or by hand), shape inference with the
shape-determining operands known, unknown and symbolic, older-opset import, and refusals."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import shape as S
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model

RNG = np.random.default_rng(0)
I64 = np.int64


def _run(op, *arrays, const=None, num_outputs=None):
    """Run one op: arrays become graph inputs, except positions in ``const`` (constants)."""
    g = Graph()
    const = const or {}
    ins, feeds = [], {}
    for i, a in enumerate(arrays):
        if i in const:
            ins.append(g.add_constant(const[i]))
        elif a is None:
            ins.append(None)
        else:
            ins.append(g.add_input(f"x{i}", TensorType.of(a)))
            feeds[f"x{i}"] = a
    node = g.add_node(op, ins, num_outputs=num_outputs)
    g.set_outputs(list(node.outputs), [f"y{i}" for i in range(len(node.outputs))])
    res = interpret(g, feeds)
    return node.outputs, [res[f"y{i}"] for i in range(len(node.outputs))]


def _types(op, *operands):
    """Inferred result types; operands are TensorTypes (graph inputs) or arrays (constants)."""
    g = Graph()
    ins = [None if o is None else g.add_input(f"x{i}", o) if isinstance(o, TensorType) else g.add_constant(o)
           for i, o in enumerate(operands)]
    return [v.type for v in g.add_node(op, ins).outputs]


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
    first = g.add(S.Slice(), sh, g.add_constant(np.array([0], I64)), g.add_constant(np.array([1], I64)))
    target = g.add(S.Concat(axis=0), first, g.add_constant(np.array([-1], I64)))
    y = g.add(S.Reshape(), x, target)
    assert y.type.shape == ("N", 12)
    z = g.add(S.ConstantOfShape(), g.add(S.Shape(end=2), x))
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
# Concat, Split
# ---------------------------------------------------------------------------------------------

def test_concat():
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    b = RNG.standard_normal((2, 5)).astype(np.float32)
    (v,), (y,) = _run(S.Concat(axis=-1), a, b)
    assert v.shape == (2, 8)
    np.testing.assert_array_equal(y, np.concatenate([a, b], 1))
    assert _shape(S.Concat(axis=1), _t("N", 3), _t(None, 4)) == ("N", 7)
    assert _shape(S.Concat(axis=0), _t("N", 3), _t(0, 3)) == ("N", 3)
    assert _shape(S.Concat(axis=0), _t("N", 3), _t(2, 3)) == (None, 3)
    with pytest.raises(OpError, match="one rank"):
        _types(S.Concat(axis=0), _t(2, 3), _t(3))
    with pytest.raises(OpError, match="dimension 1 differs"):
        _types(S.Concat(axis=0), _t(2, 3), _t(2, 4))
    with pytest.raises(OpError, match="one element type"):
        _types(S.Concat(axis=0), _t(2), _t(2, dtype=DType.i64))
    with pytest.raises(OpError, match="out of range"):
        _types(S.Concat(axis=2), _t(2, 3), _t(2, 3))
    with pytest.raises(OpError, match="axis is required"):
        S.Concat()


@pytest.mark.parametrize("opset,attrs,split,outs", [
    (11, {"axis": 1, "split": [1, 4, 1]}, None, 3),
    (11, {"axis": 1}, None, 3),
    (13, {"axis": 1}, [2, 0, 4], 3),
    (13, {"axis": -1}, None, 2),
    (18, {"axis": 1, "num_outputs": 4}, None, 4),  # uneven: parts of ceil(6 / 4) = 2, the last 0
    (18, {"axis": 1}, [3, 3], 2),
])
def test_split_opsets(opset, attrs, split, outs):
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    inits = [] if split is None else [_init("s", np.array(split, I64))]
    names = [f"y{i}" for i in range(outs)]
    m = _model("Split", [("x", x)], attrs, opset, inits, outputs=names)
    g, ys = _vs_ort(m, {"x": x})
    assert all(v.type.is_static for v in g.outputs)


def test_split_shapes_and_refusals():
    assert [t.shape for t in _types(S.Split(axis=0, num_outputs=3), _t(7, "N"))] == [(3, "N"), (3, "N"), (1, "N")]
    assert [t.shape for t in _types(S.Split(axis=1, num_outputs=2), _t(7, "N"))] == [(7, None), (7, None)]
    assert [t.shape for t in _types(S.Split(axis=0), _t("N", 2), np.array([1, 2], I64))] == [(1, 2), (2, 2)]
    assert [t.shape for t in _types(S.Split(axis=0), _t(3, 2), _t(3, dtype=DType.i64))] == [(None, 2)] * 3
    outs, ys = _run(S.Split(axis=0, num_outputs=3), np.arange(7, dtype=np.float32), num_outputs=2)
    assert len(outs) == 2 and [y.tolist() for y in ys] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(OpError, match="sum to 4"):
        _types(S.Split(axis=0), _t(5), np.array([2, 2], I64))
    with pytest.raises(OpError, match="needs the split operand or num_outputs"):
        _types(S.Split(axis=0), _t(5))
    with pytest.raises(OpError, match="num_outputs must be at least 1"):
        S.Split(num_outputs=0)
    with pytest.raises(OpError, match="cannot split length 5 into 4"):
        _types(S.Split(num_outputs=4), _t(5))


# ---------------------------------------------------------------------------------------------
# Slice
# ---------------------------------------------------------------------------------------------

SLICES = [
    ([1, 0], [3, 10], None, None),
    ([-3, 1], [-1, 1000], [0, 1], [1, 2]),
    ([10], [-100], [1], [-1]),
    ([-1, 100], [-1000, -2], [0, -1], [-2, -3]),
    ([2 ** 62], [-(2 ** 62)], [2], [-1]),
    ([0], [2 ** 63 - 1], [-1], [3]),
    ([4], [2], [0], [1]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice_vs_ort(starts, ends, axes, steps):
    x = RNG.standard_normal((5, 6, 7)).astype(np.float32)
    inits = [_init("st", np.array(starts, I64)), _init("en", np.array(ends, I64))]
    if axes is not None:
        inits.append(_init("ax", np.array(axes, I64)))
    if steps is not None:
        inits.append(_init("sp", np.array(steps, I64)))
    g, _ = _vs_ort(_model("Slice", [("x", x)], {}, 13, inits), {"x": x})
    assert g.outputs[0].type.is_static


def test_slice_older_opset_attributes():
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    m = _model("Slice", [("x", x)], {"starts": [1, -4], "ends": [4, 1000], "axes": [0, 1]}, 9)
    _vs_ort(m, {"x": x})
    m = _model("Slice", [("x", x)], {"starts": [1], "ends": [-1]}, 7)
    _vs_ort(m, {"x": x})


def test_slice_shapes():
    i64 = lambda *v: np.array(v, I64)  # noqa: E731
    big = 2 ** 63 - 1
    assert _shape(S.Slice(), _t("N", 6), i64(0, 1), i64(big, 4)) == ("N", 3)
    assert _shape(S.Slice(), _t("N", 6), i64(1, 1), i64(big, 4)) == (None, 3)
    assert _shape(S.Slice(), _t("N", 6), i64(-1), i64(-big - 1), i64(0), i64(-1)) == ("N", 6)
    # starts unknown: the sliced axes become unknown, the rank stays
    assert _shape(S.Slice(), _t(4, 6, 8), _t(1, dtype=DType.i64), i64(5), i64(1)) == (4, None, 8)
    assert _shape(S.Slice(), _t(4, 6, 8), _t(2, dtype=DType.i64), i64(5, 5)) == (None, None, 8)
    with pytest.raises(OpError, match="may not contain 0"):
        _types(S.Slice(), _t(4), i64(0), i64(2), i64(0), i64(0))
    with pytest.raises(OpError, match="one length"):
        _types(S.Slice(), _t(4, 4), i64(0, 1), i64(2))
    with pytest.raises(OpError, match="repeat an axis"):
        _types(S.Slice(), _t(4, 4), i64(0, 1), i64(2, 2), i64(1, -1))


# ---------------------------------------------------------------------------------------------
# Pad, CenterCropPad
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 2, 3, 0], [0, 5, 2, 7], [-1, 2, 1, -2]])
def test_pad_vs_ort(mode, pads):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    if mode == "reflect" and pads != [1, 2, 3, 0]:
        # ORT refuses reflect pads beyond length - 1 and 1-long axes; Kiln keeps reflecting (as numpy)
        widths = [(max(pads[0], 0), max(pads[2], 0)), (max(pads[1], 0), max(pads[3], 0))]
        cropped = x[max(-pads[0], 0): 4 - max(-pads[2], 0), max(-pads[1], 0): 3 - max(-pads[3], 0)]
        _, (y,) = _run(S.Pad(mode=mode), x, None, const={1: np.array(pads, I64)})
        np.testing.assert_array_equal(y, np.pad(cropped, widths, mode="reflect"))
        return
    inits = [_init("p", np.array(pads, I64))]
    if mode == "constant":
        inits.append(_init("v", np.array(1.5, np.float32)))
    _vs_ort(_model("Pad", [("x", x)], {"mode": mode}, 18, inits), {"x": x})


def test_pad_axes_and_older_opsets():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    inits = [_init("p", np.array([1, 2, 0, 3], I64)), _init("v", np.array(0.5, np.float32)),
             _init("a", np.array([-1, 0], I64))]
    m = _model("Pad", [("x", x)], {}, 18, inits)
    _vs_ort(m, {"x": x})
    for mode in ("constant", "reflect", "edge"):
        m = _model("Pad", [("x", x)], {"mode": mode, "pads": [0, 1, 2, 0, 2, 1], "value": 2.0}, 10)
        _vs_ort(m, {"x": x})


def test_pad_shapes_and_refusals():
    assert _shape(S.Pad(), _t("N", 3), np.array([0, 1, 0, 1], I64)) == ("N", 5)
    assert _shape(S.Pad(), _t("N", 3), np.array([1, 1, 0, 1], I64)) == (None, 5)
    assert _shape(S.Pad(), _t("N", 3), _t(4, dtype=DType.i64)) == (None, None)
    assert _shape(S.Pad(), _t("N", 3), _t(2, dtype=DType.i64), None, np.array([1], I64)) == ("N", None)
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    (v,), (y,) = _run(S.Pad(), ints, None, const={1: np.array([1, 0, 0, 1], I64)})
    assert v.type == TensorType(DType.i32, (3, 4)) and y[0].tolist() == [0, 0, 0, 0]
    with pytest.raises(OpError, match="mode must be one of"):
        S.Pad(mode="symmetric")
    with pytest.raises(OpError, match="2 values for each"):
        _types(S.Pad(), _t(2, 3), np.array([1, 1], I64))
    with pytest.raises(OpError, match="constant_value has element type"):
        _types(S.Pad(), _t(2, 3), np.array([1, 1, 1, 1], I64), np.array(1, np.int64))
    with pytest.raises(OpError, match="crop more"):
        _types(S.Pad(), _t(2, 3), np.array([-2, 0, -1, 0], I64))
    with pytest.raises(OpError, match="non-empty"):
        _types(S.Pad(mode="reflect"), _t(0, 3), np.array([1, 0, 0, 0], I64))


def test_center_crop_pad():
    x = RNG.standard_normal((5, 4, 3)).astype(np.float32)
    (v,), (y,) = _run(S.CenterCropPad(), x, None, const={1: np.array([2, 7, 3], I64)})
    assert v.shape == (2, 7, 3)
    want = np.zeros((2, 7, 3), np.float32)
    want[:, 1:5] = x[1:3]
    np.testing.assert_array_equal(y, want)
    assert _shape(S.CenterCropPad(axes=(-2, -1)), _t("N", 9, 9), np.array([4, 4], I64)) == ("N", 4, 4)
    assert _shape(S.CenterCropPad(axes=(1,)), _t("N", 9, 9), _t(1, dtype=DType.i64)) == ("N", None, 9)
    with pytest.raises(OpError, match="one entry for each"):
        _types(S.CenterCropPad(axes=(1,)), _t(2, 9, 9), np.array([4, 4], I64))


# ---------------------------------------------------------------------------------------------
# Expand, Tile
# ---------------------------------------------------------------------------------------------

def test_expand_and_tile():
    x = RNG.standard_normal((3, 1)).astype(np.float32)
    _vs_ort(_model("Expand", [("x", x)], {}, 13, [_init("s", np.array([2, 1, 4], I64))]), {"x": x})
    _vs_ort(_model("Tile", [("x", x)], {}, 13, [_init("r", np.array([2, 3], I64))]), {"x": x})
    assert _shape(S.Expand(), _t("N", 1), np.array([1, 5], I64)) == ("N", 5)
    assert _shape(S.Expand(), _t(3, 1), _t(3, dtype=DType.i64)) == (None, 3, None)
    assert _shape(S.Tile(), _t("N", 2), np.array([1, 3], I64)) == ("N", 6)
    assert _shape(S.Tile(), _t("N", 2), _t(2, dtype=DType.i64)) == (None, None)
    with pytest.raises(OpError, match="cannot expand"):
        _types(S.Expand(), _t(3, 2), np.array([4], I64))
    with pytest.raises(OpError, match="one entry for each"):
        _types(S.Tile(), _t(3, 2), np.array([4], I64))
    with pytest.raises(OpError, match="non-negative"):
        _types(S.Tile(), _t(3, 2), np.array([1, -1], I64))


def test_expand_from_shape_keeps_symbols():
    g = Graph()
    x = g.add_input("x", _t("N", 1, 4))
    y = g.add(S.Expand(), g.add_constant(np.ones((3, 1), np.float32)), g.add(S.Shape(), x))
    assert y.type.shape == ("N", 3, 4)


# ---------------------------------------------------------------------------------------------
# Shape, Size, generators
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


def test_constant_of_shape():
    (v,), (y,) = _run(S.ConstantOfShape(), None, const={0: np.array([2, 3], I64)})
    assert v.type == _t(2, 3) and not y.any()
    (v,), (y,) = _run(S.ConstantOfShape(value=np.array([7], np.int32)), None, const={0: np.array([], I64)})
    assert v.type == TensorType(DType.i32, ()) and y == 7
    assert _shape(S.ConstantOfShape(), _t(3, dtype=DType.i64)) == (None, None, None)
    with pytest.raises(OpError, match="exactly one element"):
        S.ConstantOfShape(value=np.array([1, 2], np.float32))
    with pytest.raises(OpError, match="negative"):
        _types(S.ConstantOfShape(), np.array([2, -1], I64))


@pytest.mark.parametrize("start,limit,delta,dt", [
    (1, 5, 2, np.float32), (10, 4, -2, np.int64), (10, 6, -3, np.int32), (0.5, 2.0, 0.3, np.float64),
    (3, 3, 1, np.int64), (5, 0, 1, np.int16),
])
def test_range(start, limit, delta, dt):
    feeds = {n: np.array(v, dt) for n, v in zip(("s", "l", "d"), (start, limit, delta))}
    m = _model("Range", list(feeds.items()), {}, 11)
    g, _ = _vs_ort(m, feeds, rtol=1e-12)  # ORT accumulates; Kiln computes start + i * delta
    assert g.outputs[0].type.shape == (None,)  # inputs unknown: the length is not known
    g2 = Graph()
    r = g2.add(S.Range(), *[g2.add_constant(a) for a in feeds.values()])
    assert r.type.shape == (len(np.arange(start, limit, delta)),) and r.known is not None


def test_range_refusals():
    with pytest.raises(OpError, match="one element type"):
        _types(S.Range(), np.array(0, np.int64), np.array(3, np.int32), np.array(1, np.int64))
    with pytest.raises(OpError, match="scalar"):
        _types(S.Range(), _t(2, dtype=DType.i64), _t(dtype=DType.i64), _t(dtype=DType.i64))
    with pytest.raises(OpError, match="not supported"):
        _types(S.Range(), *[_t(dtype=DType.u8)] * 3)


def test_eyelike_and_trilu():
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    for k in (-1, 0, 2):
        _vs_ort(_model("EyeLike", [("x", x)], {"k": k, "dtype": TensorProto.INT32}, 9), {"x": x})
    batch = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    for upper in (0, 1):
        for k in (-2, 0, 3):
            _vs_ort(_model("Trilu", [("x", batch)], {"upper": upper}, 14, [_init("k", np.array(k, I64))]),
                    {"x": batch})
    with pytest.raises(OpError, match="2-D"):
        _types(S.EyeLike(), _t(2, 2, 2))
    with pytest.raises(OpError, match="rank 2 or more"):
        _types(S.Trilu(), _t(4))
    with pytest.raises(OpError, match="upper"):
        S.Trilu(upper=2)


def test_identity_and_patterns():
    x = np.array(["a", "b"], dtype=object)
    (v,), (y,) = _run(S.Identity(), x)
    assert v.dtype is DType.string and y.tolist() == ["a", "b"]
    assert S.Reshape.pattern is Pattern.INJECTIVE and S.Transpose.pattern is Pattern.INJECTIVE
    assert S.Range.pattern is Pattern.OPAQUE and S.Expand.pattern is Pattern.BROADCAST
    assert {c.name for c in S.OPS} >= {"Reshape", "Split", "Slice", "Pad", "Shape", "CenterCropPad"}


def test_pad_crop_past_one_end():
    x = RNG.standard_normal((1, 3)).astype(np.float32)
    m = _model("Pad", [("x", x)], {}, 18, [_init("p", np.array([-2, 2, 3, 2], I64))])
    _, (y,) = _vs_ort(m, {"x": x})
    assert y.shape == (2, 7) and not y.any()
