"""Resampling ops (Resize, Upsample, GridSample, AffineGrid, RoiAlign) and NonMaxSuppression: numbers (by
hand or against ONNX Runtime), shape inference, older-opset import (converters), and refusals."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import resample as R
from compiler.ir.types import DType, TensorType
from tests.ops.test_indexing import F32, I64, _kiln, _onnx, _run, _t, _types

RNG = np.random.default_rng(0)


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    m = type(model)()
    m.CopyFrom(model)
    m.ir_version = 8
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ---------------------------------------------------------------------------------------------
# Resize and the older forms
# ---------------------------------------------------------------------------------------------

def test_resize_nearest_upsample_nchw():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(F32)
    (t,), (y,) = _run(R.Resize(mode="nearest"), x, None, np.array([1, 1, 2, 3], F32), const=(2,))
    assert t.shape == (2, 3, 8, 15)
    assert R.Resize.pattern is Pattern.OPAQUE
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(3, axis=3))


@pytest.mark.parametrize("attrs", [
    dict(mode="linear"),
    dict(mode="linear", coordinate_transformation_mode="align_corners"),
    dict(mode="linear", coordinate_transformation_mode="asymmetric"),
    dict(mode="cubic"),
    dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1),
    dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    dict(mode="nearest", nearest_mode="round_prefer_ceil"),
])
def test_resize_sizes_against_onnxruntime(attrs):
    x = RNG.standard_normal((1, 2, 5, 7)).astype(F32)
    sizes = np.array([1, 2, 9, 4], I64)
    model, feeds = _onnx("Resize", {"x": x}, {"sizes": sizes}, attrs, 19, order=["x", "", "", "sizes"])
    _, (y,) = _kiln(model, feeds)
    np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_resize_antialias_and_axes():
    x = RNG.standard_normal((1, 1, 12, 12)).astype(F32)
    model, feeds = _onnx("Resize", {"x": x}, {"scales": np.array([0.5, 0.25], F32)},
                         dict(mode="linear", antialias=1, axes=[2, 3]), 19, order=["x", "", "scales"])
    _, (y,) = _kiln(model, feeds)
    assert y.shape == (1, 1, 6, 3)
    np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_resize_tf_crop_and_resize_extrapolation():
    x = np.arange(16, dtype=F32).reshape(1, 1, 4, 4)
    roi = np.array([0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7], F32)
    op = R.Resize(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=10.0)
    _, (y,) = _run(op, x, roi, None, np.array([1, 1, 3, 3], I64))
    model, feeds = _onnx("Resize", {"x": x}, {"roi": roi, "sizes": np.array([1, 1, 3, 3], I64)},
                         dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                              extrapolation_value=10.0), 19, order=["x", "roi", "", "sizes"])
    np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-5)
    assert (y == 10).any()


def test_resize_shape_inference():
    (t,) = _types(R.Resize(), _t("N", 3, 8, 8), None, np.array([1, 1, 2, 2], F32))
    assert t.shape == ("N", 3, 16, 16)
    (t,) = _types(R.Resize(), _t("N", 3, 8, 8), None, None, _t(4, dtype=DType.i64))
    assert t.shape == (None, None, None, None)
    (t,) = _types(R.Resize(axes=(2, 3)), _t("N", 3, 8, 8), None, None, _t(2, dtype=DType.i64))
    assert t.shape == ("N", 3, None, None)
    (t,) = _types(R.Resize(axes=(-1, -2), keep_aspect_ratio_policy="not_larger"), _t(1, 3, 4, 8), None,
                  None, np.array([4, 4], I64))
    assert t.shape == (1, 3, 2, 4)
    # opset 11-12 style: empty roi and scales, sizes given
    (t,) = _types(R.Resize(), _t(1, 3, 4, 8), np.zeros(0, F32), np.zeros(0, F32), np.array([1, 3, 5, 5], I64))
    assert t.shape == (1, 3, 5, 5)


def test_resize_refusals():
    with pytest.raises(OpError, match="mode must be"):
        R.Resize(mode="bilinear")
    with pytest.raises(OpError, match="coordinate_transformation_mode"):
        R.Resize(coordinate_transformation_mode="half")
    with pytest.raises(OpError, match="nearest_mode"):
        R.Resize(nearest_mode="nearest")
    with pytest.raises(OpError, match="not both"):
        _types(R.Resize(), _t(1, 4), None, np.array([1, 2], F32), np.array([1, 8], I64))
    with pytest.raises(OpError, match="needs scales or sizes"):
        _types(R.Resize(), _t(1, 4))
    with pytest.raises(OpError, match="expected 2"):
        _types(R.Resize(), _t(1, 4), None, np.array([2], F32))
    with pytest.raises(OpError, match="element type"):
        _types(R.Resize(mode="linear"), _t(1, 4, dtype=DType.bool), None, np.array([1, 2], F32))


@pytest.mark.parametrize("opset,mode", [(7, "nearest"), (7, "linear"), (9, "nearest"), (9, "linear")])
def test_upsample_imports_as_resize(opset, mode):
    x = RNG.standard_normal((1, 2, 3, 4)).astype(F32)
    scales = np.array([1, 1, 2, 1.5], F32)
    if opset == 7:
        model, feeds = _onnx("Upsample", {"x": x}, {}, dict(mode=mode, scales=scales.tolist()), opset)
    else:
        model, feeds = _onnx("Upsample", {"x": x}, {"scales": scales}, dict(mode=mode), opset)
    g, (y,) = _kiln(model, feeds)
    assert g.op_counts() == {"Resize": 1}
    np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_resize10_mixed_up_and_down_nearest():
    x = RNG.standard_normal((1, 1, 5, 4)).astype(F32)
    model, feeds = _onnx("Resize", {"x": x}, {"scales": np.array([1, 1, 0.6, 1.75], F32)},
                         dict(mode="nearest"), 10)
    g, (y,) = _kiln(model, feeds)
    assert g.op_counts() == {"Resize": 2}  # ceil along the shrunk axis, floor along the grown one
    np.testing.assert_array_equal(y, _ort(model, feeds)[0])


def test_resize11_tf_half_pixel_for_nn():
    x = RNG.standard_normal((1, 2, 5, 3)).astype(F32)
    model, feeds = _onnx("Resize", {"x": x}, {"roi": np.zeros(0, F32), "scales": np.zeros(0, F32),
                                              "sizes": np.array([1, 2, 7, 4], I64)},
                         dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn",
                              nearest_mode="ceil"), 11)
    _, (y,) = _kiln(model, feeds)
    np.testing.assert_array_equal(y, _ort(model, feeds)[0])


# ---------------------------------------------------------------------------------------------
# GridSample, AffineGrid, RoiAlign, NonMaxSuppression
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_gridsample_against_onnxruntime(mode, padding):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(F32)
    grid = RNG.uniform(-1.3, 1.3, (2, 3, 6, 2)).astype(F32)
    for ac in (0, 1):
        model, feeds = _onnx("GridSample", {"x": x, "grid": grid}, {},
                             dict(mode=mode, padding_mode=padding, align_corners=ac), 22)
        _, (y,) = _kiln(model, feeds)
        np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_gridsample_opset16_modes_and_3d():
    x = RNG.standard_normal((1, 2, 4, 5)).astype(F32)
    grid = RNG.uniform(-1, 1, (1, 3, 3, 2)).astype(F32)
    model, feeds = _onnx("GridSample", {"x": x, "grid": grid}, {}, dict(mode="bicubic"), 16)
    _, (y,) = _kiln(model, feeds)
    np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)
    (t,) = _types(R.GridSample(), _t("N", 2, 3, 4, 5), _t("N", 6, 7, 8, 3))
    assert t.shape == ("N", 2, 6, 7, 8)
    with pytest.raises(OpError, match="last dimension must be 3"):
        _types(R.GridSample(), _t(1, 2, 3, 4, 5), _t(1, 6, 7, 8, 2))
    with pytest.raises(OpError, match="padding_mode"):
        R.GridSample(padding_mode="wrap")


def test_affine_grid_identity_samples_the_input():
    x = RNG.standard_normal((1, 2, 4, 6)).astype(F32)
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], F32)
    (t,), (grid,) = _run(R.AffineGrid(), theta, np.array([1, 2, 4, 6], I64), const=(1,))
    assert t.shape == (1, 4, 6, 2)
    _, (y,) = _run(R.GridSample(), x, grid)
    np.testing.assert_allclose(y, x, atol=1e-6)
    (t,) = _types(R.AffineGrid(), _t("N", 3, 4), _t(5, dtype=DType.i64))
    assert t.shape == ("N", None, None, None, 3)


def test_roialign_against_onnxruntime():
    x = RNG.standard_normal((2, 3, 8, 9)).astype(F32)
    rois = np.array([[0.5, 1, 6, 7.5], [2, 2, 3, 3.5], [-1, 0, 10, 9]], F32)
    bi = np.array([0, 1, 1], I64)
    for ctm in ("half_pixel", "output_half_pixel"):
        for ratio in (0, 2):
            attrs = dict(output_height=3, output_width=2, sampling_ratio=ratio, spatial_scale=0.8,
                         coordinate_transformation_mode=ctm)
            model, feeds = _onnx("RoiAlign", {"x": x, "rois": rois, "bi": bi}, {}, attrs, 16)
            _, (y,) = _kiln(model, feeds)
            assert y.shape == (3, 3, 3, 2)
            np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_roialign_opset10_is_output_half_pixel():
    x = RNG.standard_normal((1, 1, 6, 6)).astype(F32)
    rois, bi = np.array([[1, 1, 4, 5]], F32), np.array([0], I64)
    model, feeds = _onnx("RoiAlign", {"x": x}, {"rois": rois, "bi": bi}, dict(output_height=2, output_width=2), 10)
    g, (y,) = _kiln(model, feeds)
    (node,) = g.nodes
    assert node.op.coordinate_transformation_mode == "output_half_pixel"
    np.testing.assert_allclose(y, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_nonmaxsuppression():
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11], [0, 10.1, 1, 11.1],
                       [0, 100, 1, 101]]], F32)
    scores = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], F32)
    (t,), (y,) = _run(R.NonMaxSuppression(), boxes, scores, np.array([3], I64), np.array([0.5], F32),
                      np.array([0.0], F32))
    assert t.shape == (None, 3)
    assert y.tolist() == [[0, 0, 3], [0, 0, 0], [0, 0, 5]]
    _, (y,) = _run(R.NonMaxSuppression(), boxes, scores, np.array([3], I64), np.array([0.5], F32),
                   np.array([0.4], F32))
    assert y.tolist() == [[0, 0, 3], [0, 0, 0]]
    _, (y,) = _run(R.NonMaxSuppression(), boxes, scores)  # no max_output_boxes_per_class: nothing
    assert y.shape == (0, 3)
    with pytest.raises(OpError, match="boxes must be"):
        _types(R.NonMaxSuppression(), _t(1, 6, 5), _t(1, 1, 6))
    (t,) = _types(R.NonMaxSuppression(), _t(1, 5, 4), _t(1, 2, 5))  # a data-dependent count
    assert t == TensorType(DType.i64, (None, 3))
