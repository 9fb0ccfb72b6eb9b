"""Pooling ops: MaxPool (ceil_mode, dilations, storage_order, Indices, int8/uint8), AveragePool
(count_include_pad, ceil_mode, dilations), LpPool, the Global pools, MaxUnpool and MaxRoiPool. Numbers
against ONNX Runtime (or by hand), older-opset import, symbolic shapes, speed, and refusals."""
from __future__ import annotations

import time

import numpy as np
import pytest

from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import pool as P
from compiler.ir.types import DType, TensorType
from tests.ops.test_conv import f32, infer, rand, run_op, vs_ort

RNG_INT = np.random.default_rng(1)

WINDOW_CASES = {
    "2d_default": ((2, 3, 8, 7), {"kernel_shape": [2, 2]}),
    "2d_pads_strides": ((1, 2, 9, 10), {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "strides": [2, 3]}),
    "2d_ceil": ((1, 2, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "2d_ceil_pads": ((1, 1, 7, 7), {"kernel_shape": [3, 2], "strides": [3, 3], "pads": [1, 1, 1, 1],
                                    "ceil_mode": 1}),
    "2d_dilations": ((1, 2, 10, 9), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 1, 0, 1]}),
    "2d_dilations_ceil": ((1, 1, 11, 10), {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [3, 2],
                                           "ceil_mode": 1}),
    "2d_same_upper": ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_UPPER"}),
    "2d_same_lower": ((1, 2, 7, 8), {"kernel_shape": [2, 4], "strides": [2, 1], "auto_pad": "SAME_LOWER"}),
    "2d_valid": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    "1d": ((2, 3, 17), {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
    # ceil_mode with a window larger than the input (EfficientNet's head pool): one output per axis
    "2d_ceil_window_past_input": ((1, 2, 2, 2), {"kernel_shape": [3, 3], "strides": [3, 3], "ceil_mode": 1}),
    "3d": ((1, 2, 6, 5, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 1, 0]}),
}


@pytest.mark.parametrize("name", WINDOW_CASES)
def test_maxpool_matches_onnxruntime(name):
    shape, attrs = WINDOW_CASES[name]
    y, idx = vs_ort("MaxPool", [("x", rand(*shape))], ["y", "i"], attrs=attrs)
    assert idx.dtype == np.int64


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_maxpool_int8_uint8_never_picks_padding(dtype):
    info = np.iinfo(dtype)
    x = RNG_INT.integers(info.min, info.max, size=(2, 3, 6, 5), endpoint=True).astype(dtype)
    x[0, 0, :2, :2] = info.min  # a window holding only the smallest value next to the padding
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    vs_ort("MaxPool", [("x", x)], attrs=attrs, rtol=0, atol=0)
    y, idx = run_op(P.MaxPool(kernel_shape=(3, 3), pads=(1, 1, 1, 1), strides=(2, 2)), x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(x.reshape(-1)[idx], y)  # every index points at a real input element


def test_maxpool_indices_storage_order_by_hand():
    x = np.arange(1, 26, dtype=np.float32).reshape(1, 1, 5, 5)
    y, idx = run_op(P.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), x)
    np.testing.assert_array_equal(y, [[[[7, 9], [17, 19]]]])
    np.testing.assert_array_equal(idx, [[[[6, 8], [16, 18]]]])
    _, idx_col = run_op(P.MaxPool(kernel_shape=(2, 2), strides=(2, 2), storage_order=1), x)
    np.testing.assert_array_equal(idx_col, [[[[6, 16], [8, 18]]]])
    # batch and channel planes count in the flat index
    xb = np.stack([x[0, 0], x[0, 0] + 100])[None]
    _, idx_b = run_op(P.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), xb)
    np.testing.assert_array_equal(idx_b[0, 1], idx[0, 0] + 25)


def test_maxpool_ceil_mode_drops_a_window_starting_in_the_end_pad():
    """ceil_mode rounds the output size up, but a last window that would start past the input (and
    the begin pad) is dropped."""
    (t, _) = infer(P.MaxPool(kernel_shape=(1, 1), strides=(2, 2), ceil_mode=1), f32(1, 1, 2, 2))
    assert t.shape == (1, 1, 1, 1)
    (t, _) = infer(P.MaxPool(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), f32(1, 1, 4, 4))
    assert t.shape == (1, 1, 2, 2)


@pytest.mark.parametrize("name", WINDOW_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool_matches_onnxruntime(name, count_include_pad):
    shape, attrs = WINDOW_CASES[name]
    vs_ort("AveragePool", [("x", rand(*shape))], attrs={**attrs, "count_include_pad": count_include_pad})


def test_averagepool_last_window_on_pad_by_hand():
    """count_include_pad counts the explicit pads, never the extension ceil_mode adds."""
    x = np.array([[[[0.8580, 0.0786], [0.2692, 0.1537]]]], np.float32)
    op = P.AveragePool(kernel_shape=(3, 3), strides=(3, 3), pads=(1, 1, 1, 1), ceil_mode=1, count_include_pad=1)
    (y,) = run_op(op, x)
    np.testing.assert_allclose(y, [[[[x.sum() / 9]]]], rtol=1e-6)
    (y,) = run_op(op.replace(count_include_pad=0), x)
    np.testing.assert_allclose(y, [[[[x.mean()]]]], rtol=1e-6)


def test_averagepool_float16_and_float64():
    x = rand(1, 2, 6, 6)
    op = P.AveragePool(kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    (ref,) = run_op(op, x)
    (y16,) = run_op(op, x.astype(np.float16))
    (y64,) = run_op(op, x.astype(np.float64))
    assert y16.dtype == np.float16 and y64.dtype == np.float64
    np.testing.assert_allclose(y16, ref, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(y64, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("name", ["2d_default", "2d_pads_strides", "2d_dilations", "2d_same_upper", "1d", "3d"])
def test_lppool_matches_onnxruntime(name, p):
    shape, attrs = WINDOW_CASES[name]
    vs_ort("LpPool", [("x", rand(*shape))], attrs={**attrs, "p": p}, opset=18)


@pytest.mark.parametrize("opset", [7, 8, 10, 11])
def test_pools_older_opsets_import(opset):
    x = rand(1, 2, 7, 7)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0]}
    if opset >= 10:
        attrs["ceil_mode"] = 1
    outs = ["y", "i"] if opset >= 8 else ["y"]
    vs_ort("MaxPool", [("x", x)], outs, attrs=attrs, opset=opset)
    vs_ort("AveragePool", [("x", x)], attrs={**attrs, "count_include_pad": 1}, opset=opset)
    vs_ort("LpPool", [("x", x)], attrs={k: v for k, v in attrs.items() if k != "ceil_mode"}, opset=opset)
    vs_ort("GlobalLpPool", [("x", x)], attrs={"p": 3}, opset=opset)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_global_pools_match_onnxruntime(op_type, shape):
    vs_ort(op_type, [("x", rand(*shape))], opset=18)  # ONNX Runtime has no GlobalLpPool-22


def test_global_pools_shapes_pattern_cost():
    for cls in (P.GlobalAveragePool, P.GlobalMaxPool, P.GlobalLpPool):
        assert cls.pattern is Pattern.REDUCE
        (t,) = infer(cls(), f32("N", 8, "H", 7))
        assert t == f32("N", 8, 1, 1)
    assert P.MaxPool.pattern is Pattern.OPAQUE and P.AveragePool.pattern is Pattern.OPAQUE
    op = P.MaxPool(kernel_shape=(3, 3), strides=(2, 2))
    x = f32(1, 4, 9, 9)
    (y, i) = infer(op, x)
    assert op.cost([x], [y, i]).flops >= 9 * y.numel


def test_pool_symbolic_shapes():
    (t, i) = infer(P.MaxPool(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), f32("N", 64, 112, 112))
    assert t == f32("N", 64, 56, 56) and i == TensorType(DType.i64, ("N", 64, 56, 56))
    (t,) = infer(P.AveragePool(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), f32("N", 4, "H", "W"))
    assert t == f32("N", 4, "H", "W")
    (t,) = infer(P.AveragePool(kernel_shape=(2, 2), strides=(2, 2)), f32("N", 4, "H", 8))
    assert t == f32("N", 4, None, 4)


def test_pools_are_vectorized():
    x = rand(1, 64, 112, 112)
    ops = [P.MaxPool(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
           P.AveragePool(kernel_shape=(3, 3), pads=(1, 1, 1, 1), count_include_pad=1)]
    for op in ops:
        op.compute(x)
    t0 = time.perf_counter()
    for op in ops:
        op.compute(x)
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize("make, types, message", [
    (lambda: P.MaxPool(kernel_shape=(2, 2)), (f32(1, 3, 8),), "X must have rank 4"),
    (lambda: P.MaxPool(kernel_shape=(2, 2), strides=(1,)), (f32(1, 3, 8, 8),), "strides has 1 entries"),
    (lambda: P.MaxPool(kernel_shape=(5, 5)), (f32(1, 3, 4, 8),), "smaller than the kernel"),
    # ceil_mode makes an output only where the window starts inside: 4 - 9 < -stride here
    (lambda: P.MaxPool(kernel_shape=(9, 2), strides=(2, 2), ceil_mode=1), (f32(1, 3, 4, 8),), "smaller than the kernel"),
    (lambda: P.AveragePool(kernel_shape=(2, 2)), (TensorType(DType.i8, (1, 3, 8, 8)),), "element type i8"),
    (lambda: P.MaxPool(kernel_shape=(2, 2)), (TensorType(DType.i32, (1, 3, 8, 8)),), "element type i32"),
    (lambda: P.GlobalAveragePool(), (f32(3, 8),), "rank >= 3"),
    (lambda: P.MaxRoiPool(pooled_shape=(2, 2)), (f32(1, 3, 8, 8), f32(2, 4)), r"rois must have shape"),
    (lambda: P.MaxUnpool(kernel_shape=(2, 2)), (f32(1, 3, 4, 4), TensorType(DType.i64, (1, 3, 4, 3))),
     "I must have X's shape"),
])
def test_pool_refuses_bad_inputs(make, types, message):
    with pytest.raises(OpError, match=message):
        infer(make(), *types)


@pytest.mark.parametrize("cls, attrs, message", [
    (P.MaxPool, {}, "kernel_shape is required"),
    (P.MaxPool, {"kernel_shape": (2, 2), "storage_order": 2}, "storage_order must be 0"),
    (P.MaxPool, {"kernel_shape": (2, 2), "ceil_mode": 2}, "ceil_mode must be 0 or 1"),
    (P.MaxPool, {"kernel_shape": (2, 2), "auto_pad": "same"}, "auto_pad must be one of"),
    (P.AveragePool, {"kernel_shape": (2, 2), "count_include_pad": 3}, "count_include_pad must be 0 or 1"),
    (P.LpPool, {"kernel_shape": (2,), "p": 0}, "p must be a positive int"),
    # a window wholly in the padding (ONNX Runtime refuses it as well): a pad as big as the window's
    # extent, at an axis' end, a huge one (the fuzzer's MaxPool.pads = 2^40), and a dilated window
    (P.MaxPool, {"kernel_shape": (4, 1), "pads": (2, 1 << 40, 2, 0)}, r"extent along their axis .* \[4, 1\]"),
    (P.AveragePool, {"kernel_shape": (3, 3), "pads": (1, 1, 1, 3)}, "wholly in the padding"),
    (P.LpPool, {"kernel_shape": (2,), "pads": (2, 0)}, "wholly in the padding"),
    (P.MaxPool, {"kernel_shape": (3,), "dilations": (2,), "pads": (5, 0)}, r"extent .* \[5\]"),
    (P.MaxUnpool, {}, "kernel_shape is required"),
    (P.MaxRoiPool, {"pooled_shape": (2,)}, "pooled_shape must be two positive ints"),
])
def test_pool_refuses_bad_attributes(cls, attrs, message):
    with pytest.raises(OpError, match=message):
        cls(**attrs)


def test_a_dilated_window_may_pad_past_its_kernel_size():
    """The bound is the window's extent, not kernel_shape: a 3-tap window dilated by 3 spans 7
    positions, so pads of 4 leave a tap of the first and last window inside the input."""
    op = P.MaxPool(kernel_shape=(3,), dilations=(3,), pads=(4, 4))
    x = np.arange(5, dtype=np.float32).reshape(1, 1, 5)
    want = [max(x[0, 0, i] for i in (o - 4, o - 1, o + 2) if 0 <= i < 5) for o in range(7)]
    np.testing.assert_array_equal(run_op(op, x)[0].reshape(-1), want)


# ---------------------------------------------------------------------------------------------
# MaxUnpool, MaxRoiPool
# ---------------------------------------------------------------------------------------------

def test_maxunpool_inverts_maxpool_and_matches_onnxruntime():
    x = np.abs(rand(2, 3, 6, 8)) + 0.1  # positive, so re-pooling the zero-filled unpool gives the maxima back
    y, idx = run_op(P.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), x)
    out = vs_ort("MaxUnpool", [("p", y), ("i", idx)], attrs={"kernel_shape": [2, 2], "strides": [2, 2]})[0]
    assert out.shape == x.shape
    np.testing.assert_array_equal(out, np.where(out != 0, x, 0))
    (pooled, _) = run_op(P.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), out)
    np.testing.assert_array_equal(pooled, y)


def test_maxunpool_output_shape():
    """As ONNX's reference reads it: indices address the default unpooled shape, output_shape extends it."""
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    idx = np.array([[[[5, 7], [13, 15]]]], np.int64)
    (y,) = run_op(P.MaxUnpool(kernel_shape=(2, 2), strides=(2, 2)), x, idx, np.array([1, 1, 5, 5]))
    want = np.zeros((1, 1, 5, 5), np.float32)
    want[0, 0, 1, 1], want[0, 0, 1, 3], want[0, 0, 3, 1], want[0, 0, 3, 3] = 5, 6, 7, 8
    np.testing.assert_array_equal(y, want)
    (t,) = infer(P.MaxUnpool(kernel_shape=(2, 2), strides=(2, 2)), f32(1, 1, 2, 2), TensorType(DType.i64, (1, 1, 2, 2)),
                 TensorType(DType.i64, (4,)))
    assert t == f32(1, 1, None, None)
    with pytest.raises(OpError, match="index out of range"):
        P.MaxUnpool(kernel_shape=(2, 2), strides=(2, 2)).compute(x, idx + 20)
    # smaller than the unpooled 4x4 would cut values off: refused (ONNX Runtime and the reference do)
    with pytest.raises(OpError, match=r"output_shape \[1, 1, 3, 5\] is smaller than the unpooled shape \[1, 1, 4, 4\]"):
        P.MaxUnpool(kernel_shape=(2, 2), strides=(2, 2)).compute(x, idx, np.array([1, 1, 3, 5]))


def test_maxroipool_matches_onnxruntime():
    x = rand(2, 3, 12, 10)
    rois = np.array([[0, 1, 2, 7, 9], [1, 0, 0, 9, 11], [1, 3.4, 2.6, 5.2, 4.1], [0, 8, 8, 30, 30],
                     [1, 5, 5, 5, 5]], np.float32)
    vs_ort("MaxRoiPool", [("x", x), ("rois", rois)], attrs={"pooled_shape": [3, 2], "spatial_scale": 0.9},
           opset=16)
