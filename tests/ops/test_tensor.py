"""Tensor construction and combination ops (Concat, Split, Slice, Pad, CenterCropPad, Expand, Tile,
ConstantOfShape, Range, EyeLike, Trilu): numbers (against ONNX Runtime or by hand), shape inference with the
shape-determining operands known, unknown and symbolic, older-opset import, and refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from compiler.ir.graph import Graph
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import shape as S
from compiler.ir.ops import tensor as T
from compiler.ir.types import DType, TensorType
from tests.ops.test_shape import I64, _init, _model, _run, _shape, _t, _types, _vs_ort

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------
# Concat, Split
# ---------------------------------------------------------------------------------------------

def test_concat():
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    b = RNG.standard_normal((2, 5)).astype(np.float32)
    (v,), (y,) = _run(T.Concat(axis=-1), a, b)
    assert v.shape == (2, 8)
    np.testing.assert_array_equal(y, np.concatenate([a, b], 1))
    assert _shape(T.Concat(axis=1), _t("N", 3), _t(None, 4)) == ("N", 7)
    assert _shape(T.Concat(axis=0), _t("N", 3), _t(0, 3)) == ("N", 3)
    assert _shape(T.Concat(axis=0), _t("N", 3), _t(2, 3)) == (None, 3)
    with pytest.raises(OpError, match="one rank"):
        _types(T.Concat(axis=0), _t(2, 3), _t(3))
    with pytest.raises(OpError, match="dimension 1 differs"):
        _types(T.Concat(axis=0), _t(2, 3), _t(2, 4))
    with pytest.raises(OpError, match="one element type"):
        _types(T.Concat(axis=0), _t(2), _t(2, dtype=DType.i64))
    with pytest.raises(OpError, match="out of range"):
        _types(T.Concat(axis=2), _t(2, 3), _t(2, 3))
    with pytest.raises(OpError, match="axis is required"):
        T.Concat()


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
    assert [t.shape for t in _types(T.Split(axis=0, num_outputs=3), _t(7, "N"))] == [(3, "N"), (3, "N"), (1, "N")]
    assert [t.shape for t in _types(T.Split(axis=1, num_outputs=2), _t(7, "N"))] == [(7, None), (7, None)]
    assert [t.shape for t in _types(T.Split(axis=0), _t("N", 2), np.array([1, 2], I64))] == [(1, 2), (2, 2)]
    assert [t.shape for t in _types(T.Split(axis=0), _t(3, 2), _t(3, dtype=DType.i64))] == [(None, 2)] * 3
    outs, ys = _run(T.Split(axis=0, num_outputs=3), np.arange(7, dtype=np.float32), num_outputs=2)
    assert len(outs) == 2 and [y.tolist() for y in ys] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(OpError, match="sum to 4"):
        _types(T.Split(axis=0), _t(5), np.array([2, 2], I64))
    with pytest.raises(OpError, match="needs the split operand or num_outputs"):
        _types(T.Split(axis=0), _t(5))
    with pytest.raises(OpError, match="num_outputs must be at least 1"):
        T.Split(num_outputs=0)
    with pytest.raises(OpError, match="cannot split length 5 into 4"):
        _types(T.Split(num_outputs=4), _t(5))


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
    assert _shape(T.Slice(), _t("N", 6), i64(0, 1), i64(big, 4)) == ("N", 3)
    assert _shape(T.Slice(), _t("N", 6), i64(1, 1), i64(big, 4)) == (None, 3)
    assert _shape(T.Slice(), _t("N", 6), i64(-1), i64(-big - 1), i64(0), i64(-1)) == ("N", 6)
    # starts unknown: the sliced axes become unknown, the rank stays
    assert _shape(T.Slice(), _t(4, 6, 8), _t(1, dtype=DType.i64), i64(5), i64(1)) == (4, None, 8)
    assert _shape(T.Slice(), _t(4, 6, 8), _t(2, dtype=DType.i64), i64(5, 5)) == (None, None, 8)
    with pytest.raises(OpError, match="may not contain 0"):
        _types(T.Slice(), _t(4), i64(0), i64(2), i64(0), i64(0))
    with pytest.raises(OpError, match="one length"):
        _types(T.Slice(), _t(4, 4), i64(0, 1), i64(2))
    with pytest.raises(OpError, match="repeat an axis"):
        _types(T.Slice(), _t(4, 4), i64(0, 1), i64(2, 2), i64(1, -1))


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
        _, (y,) = _run(T.Pad(mode=mode), x, None, const={1: np.array(pads, I64)})
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
    assert _shape(T.Pad(), _t("N", 3), np.array([0, 1, 0, 1], I64)) == ("N", 5)
    assert _shape(T.Pad(), _t("N", 3), np.array([1, 1, 0, 1], I64)) == (None, 5)
    assert _shape(T.Pad(), _t("N", 3), _t(4, dtype=DType.i64)) == (None, None)
    assert _shape(T.Pad(), _t("N", 3), _t(2, dtype=DType.i64), None, np.array([1], I64)) == ("N", None)
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    (v,), (y,) = _run(T.Pad(), ints, None, const={1: np.array([1, 0, 0, 1], I64)})
    assert v.type == TensorType(DType.i32, (3, 4)) and y[0].tolist() == [0, 0, 0, 0]
    with pytest.raises(OpError, match="mode must be one of"):
        T.Pad(mode="symmetric")
    with pytest.raises(OpError, match="2 values for each"):
        _types(T.Pad(), _t(2, 3), np.array([1, 1], I64))
    with pytest.raises(OpError, match="constant_value has element type"):
        _types(T.Pad(), _t(2, 3), np.array([1, 1, 1, 1], I64), np.array(1, np.int64))
    with pytest.raises(OpError, match="crop more"):
        _types(T.Pad(), _t(2, 3), np.array([-2, 0, -1, 0], I64))
    with pytest.raises(OpError, match="non-empty"):
        _types(T.Pad(mode="reflect"), _t(0, 3), np.array([1, 0, 0, 0], I64))


def test_center_crop_pad():
    x = RNG.standard_normal((5, 4, 3)).astype(np.float32)
    (v,), (y,) = _run(T.CenterCropPad(), x, None, const={1: np.array([2, 7, 3], I64)})
    assert v.shape == (2, 7, 3)
    want = np.zeros((2, 7, 3), np.float32)
    want[:, 1:5] = x[1:3]
    np.testing.assert_array_equal(y, want)
    assert _shape(T.CenterCropPad(axes=(-2, -1)), _t("N", 9, 9), np.array([4, 4], I64)) == ("N", 4, 4)
    assert _shape(T.CenterCropPad(axes=(1,)), _t("N", 9, 9), _t(1, dtype=DType.i64)) == ("N", None, 9)
    with pytest.raises(OpError, match="one entry for each"):
        _types(T.CenterCropPad(axes=(1,)), _t(2, 9, 9), np.array([4, 4], I64))


def test_pad_crop_past_one_end():
    x = RNG.standard_normal((1, 3)).astype(np.float32)
    m = _model("Pad", [("x", x)], {}, 18, [_init("p", np.array([-2, 2, 3, 2], I64))])
    _, (y,) = _vs_ort(m, {"x": x})
    assert y.shape == (2, 7) and not y.any()


# ---------------------------------------------------------------------------------------------
# Expand, Tile
# ---------------------------------------------------------------------------------------------

def test_expand_and_tile():
    x = RNG.standard_normal((3, 1)).astype(np.float32)
    _vs_ort(_model("Expand", [("x", x)], {}, 13, [_init("s", np.array([2, 1, 4], I64))]), {"x": x})
    _vs_ort(_model("Tile", [("x", x)], {}, 13, [_init("r", np.array([2, 3], I64))]), {"x": x})
    assert _shape(T.Expand(), _t("N", 1), np.array([1, 5], I64)) == ("N", 5)
    assert _shape(T.Expand(), _t(3, 1), _t(3, dtype=DType.i64)) == (None, 3, None)
    assert _shape(T.Tile(), _t("N", 2), np.array([1, 3], I64)) == ("N", 6)
    assert _shape(T.Tile(), _t("N", 2), _t(2, dtype=DType.i64)) == (None, None)
    with pytest.raises(OpError, match="cannot expand"):
        _types(T.Expand(), _t(3, 2), np.array([4], I64))
    with pytest.raises(OpError, match="one entry for each"):
        _types(T.Tile(), _t(3, 2), np.array([4], I64))
    with pytest.raises(OpError, match="non-negative"):
        _types(T.Tile(), _t(3, 2), np.array([1, -1], I64))


def test_expand_from_shape_keeps_symbols():
    g = Graph()
    x = g.add_input("x", _t("N", 1, 4))
    y = g.add(T.Expand(), g.add_constant(np.ones((3, 1), np.float32)), g.add(S.Shape(), x))
    assert y.type.shape == ("N", 3, 4)


# ---------------------------------------------------------------------------------------------
# Generators, Trilu
# ---------------------------------------------------------------------------------------------

def test_constant_of_shape():
    (v,), (y,) = _run(T.ConstantOfShape(), None, const={0: np.array([2, 3], I64)})
    assert v.type == _t(2, 3) and not y.any()
    (v,), (y,) = _run(T.ConstantOfShape(value=np.array([7], np.int32)), None, const={0: np.array([], I64)})
    assert v.type == TensorType(DType.i32, ()) and y == 7
    assert _shape(T.ConstantOfShape(), _t(3, dtype=DType.i64)) == (None, None, None)
    with pytest.raises(OpError, match="exactly one element"):
        T.ConstantOfShape(value=np.array([1, 2], np.float32))
    with pytest.raises(OpError, match="negative"):
        _types(T.ConstantOfShape(), np.array([2, -1], I64))


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
    r = g2.add(T.Range(), *[g2.add_constant(a) for a in feeds.values()])
    assert r.type.shape == (len(np.arange(start, limit, delta)),) and r.known is not None


def test_range_refusals():
    with pytest.raises(OpError, match="one element type"):
        _types(T.Range(), np.array(0, np.int64), np.array(3, np.int32), np.array(1, np.int64))
    with pytest.raises(OpError, match="scalar"):
        _types(T.Range(), _t(2, dtype=DType.i64), _t(dtype=DType.i64), _t(dtype=DType.i64))
    with pytest.raises(OpError, match="not supported"):
        _types(T.Range(), *[_t(dtype=DType.u8)] * 3)


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
        _types(T.EyeLike(), _t(2, 2, 2))
    with pytest.raises(OpError, match="rank 2 or more"):
        _types(T.Trilu(), _t(4))
    with pytest.raises(OpError, match="upper"):
        T.Trilu(upper=2)


def test_patterns_and_table():
    assert T.Range.pattern is Pattern.OPAQUE and T.Expand.pattern is Pattern.BROADCAST
    assert {c.name for c in T.OPS} >= {"Split", "Slice", "Pad", "CenterCropPad"}
