"""Convolution ops: Conv (1-3D, groups, depthwise, dilations, strides, pads, auto_pad), ConvTranspose,
DeformConv, Col2Im, CausalConvWithState and LRN. Numbers against ONNX Runtime or a naive loop reference,
shape inference with symbolic dims, older-opset import, cost, speed, and refusals."""
from __future__ import annotations

import itertools
import time

import numpy as np
import onnxruntime as ort
import pytest

from compiler.errors import ModelError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import conv as C
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops import util
from tests.ops.util import assert_close, declare_output_types, infer_types, kiln_run, one_node, ort_run

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def vs_ort(op_type, inputs, outputs=("y",), attrs=None, opset=22, rtol=1e-4, atol=1e-5):
    """Kiln (import + interpreter) against ONNX Runtime on a one-node model; returns Kiln's outputs."""
    model = one_node(op_type, inputs, list(outputs), attrs, opset)
    feeds = {n: a for n, a in inputs if n}
    g, outs = kiln_run(model, feeds)
    declare_output_types(model, g)
    assert_close(outs, ort_run(model, feeds), rtol, atol)
    return outs


def run_op(op, *arrays, num_outputs=None):
    """Apply ``op`` in a graph to arrays (None for a missing optional input); returns the outputs."""
    return util.run_op(op, *arrays, num_outputs=num_outputs)[1]


#: result types of an op on graph inputs of the given types
infer = infer_types


def f32(*shape):
    return TensorType(DType.f32, shape)


# ---------------------------------------------------------------------------------------------
# Conv
# ---------------------------------------------------------------------------------------------

CONV_CASES = {
    "2d_basic": ((2, 3, 9, 8), (4, 3, 3, 3), {}),
    "2d_pads_strides": ((1, 3, 10, 11), (5, 3, 3, 3), {"pads": [1, 2, 0, 1], "strides": [2, 3]}),
    "2d_dilations": ((1, 2, 12, 12), (3, 2, 3, 2), {"dilations": [2, 3], "pads": [1, 1, 1, 1]}),
    "2d_group": ((2, 6, 7, 7), (4, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "2d_depthwise": ((2, 4, 8, 8), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "2d_depthwise_mult": ((1, 3, 9, 9), (6, 1, 5, 5), {"group": 3, "pads": [2, 2, 2, 2]}),
    "2d_1x1": ((2, 8, 5, 6), (16, 8, 1, 1), {}),
    "2d_1x1_stride": ((1, 8, 7, 7), (4, 8, 1, 1), {"strides": [2, 2]}),
    "2d_1x1_pad": ((1, 4, 5, 5), (3, 4, 1, 1), {"pads": [1, 0, 0, 1]}),
    "2d_same_upper": ((1, 2, 7, 8), (3, 2, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "2d_same_lower": ((1, 2, 7, 8), (3, 2, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "2d_valid": ((1, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "VALID", "strides": [2, 1]}),
    "2d_kernel_shape": ((1, 2, 6, 6), (2, 2, 3, 3), {"kernel_shape": [3, 3]}),
    "1d": ((2, 3, 20), (4, 3, 5), {"pads": [2, 1], "strides": [2], "dilations": [2]}),
    "3d": ((1, 2, 6, 7, 5), (3, 2, 3, 3, 2), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 1]}),
    "3d_group": ((1, 4, 5, 5, 5), (4, 2, 2, 2, 2), {"group": 2}),
}


@pytest.mark.parametrize("name", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_matches_onnxruntime(name, bias):
    xs, ws, attrs = CONV_CASES[name]
    inputs = [("x", rand(*xs)), ("w", rand(*ws))]
    if bias:
        inputs.append(("b", rand(ws[0])))
    vs_ort("Conv", inputs, attrs=attrs)


def test_conv_float64_and_float16():
    x, w = rand(1, 3, 6, 6, dtype=np.float64), rand(2, 3, 3, 3, dtype=np.float64)
    (y64,) = run_op(C.Conv(pads=(1, 1, 1, 1)), x, w)  # ONNX Runtime has no float64 Conv: against float32
    (ref,) = vs_ort("Conv", [("x", x.astype(np.float32)), ("w", w.astype(np.float32))], attrs={"pads": [1, 1, 1, 1]})
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, ref, rtol=1e-5, atol=1e-5)
    (y16,) = run_op(C.Conv(pads=(1, 1, 1, 1)), x.astype(np.float16), w.astype(np.float16))
    (y32,) = run_op(C.Conv(pads=(1, 1, 1, 1)), x.astype(np.float16).astype(np.float32),
                    w.astype(np.float16).astype(np.float32))
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float32), y32, rtol=2e-3, atol=2e-3)


def test_conv_chunked_im2col_matches_whole(monkeypatch):
    x, w, b = rand(2, 5, 17, 13), rand(6, 5, 3, 3), rand(6)
    op = C.Conv(pads=(1, 1, 1, 1), strides=(2, 1))
    (whole,) = op.compute(x, w, b)
    monkeypatch.setattr(C, "_IM2COL_CHUNK", 200)  # a few output rows per chunk
    (chunked,) = op.compute(x, w, b)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)


def test_conv_shape_inference_keeps_symbolic_batch():
    (t,) = infer(C.Conv(strides=(2, 2), pads=(1, 1, 1, 1)), f32("N", 3, 32, 31), f32(8, 3, 3, 3))
    assert t == f32("N", 8, 16, 16)
    # a symbolic spatial size survives where the window cannot change it, else it becomes unknown
    (t,) = infer(C.Conv(pads=(1, 1, 1, 1)), f32("N", 3, "H", "W"), f32(8, 3, 3, 3))
    assert t == f32("N", 8, "H", "W")
    (t,) = infer(C.Conv(auto_pad="SAME_UPPER"), f32(1, 3, "H", 5), f32(8, 3, 4, 4))
    assert t == f32(1, 8, "H", 5)
    (t,) = infer(C.Conv(strides=(2, 2)), f32("N", 3, "H", 8), f32(8, 3, 3, 3))
    assert t == f32("N", 8, None, 3)


def test_conv_imports_symbolic_batch_and_runs_any_batch():
    model = one_node("Conv", [("x", rand(1, 3, 8, 8)), ("w", rand(4, 3, 3, 3))], ["y"],
                     {"pads": [1, 1, 1, 1]}, opset=11, shapes={"x": ["batch", 3, 8, 8]})
    g = import_model(model)
    assert g.outputs[0].type == f32("batch", 4, 8, 8)
    for n in (1, 3):
        assert interpret(g, {"x": rand(n, 3, 8, 8), "w": rand(4, 3, 3, 3)})["y"].shape == (n, 4, 8, 8)


@pytest.mark.parametrize("opset", [7, 11, 18])
def test_conv_older_opsets_import(opset):
    vs_ort("Conv", [("x", rand(1, 2, 7, 7)), ("w", rand(3, 2, 3, 3))],
           attrs={"auto_pad": "SAME_LOWER", "strides": [2, 2]}, opset=opset)


def test_conv_pattern_and_cost():
    assert C.Conv.pattern is Pattern.OUT_ELEMWISE_FUSABLE and C.ConvTranspose.pattern is Pattern.OUT_ELEMWISE_FUSABLE
    x, w = f32(2, 16, 10, 10), f32(32, 8, 3, 3)
    op = C.Conv(pads=(1, 1, 1, 1), group=2)
    (y,) = infer(op, x, w)
    assert op.cost([x, w], [y]).flops == 2 * (2 * 32 * 10 * 10) * (8 * 3 * 3)
    ct = C.ConvTranspose(strides=(2, 2))
    xt, wt = f32(1, 4, 5, 5), f32(4, 3, 3, 3)
    (yt,) = infer(ct, xt, wt)
    assert ct.cost([xt, wt], [yt]).flops == 2 * (4 * 5 * 5) * (3 * 3 * 3)


def test_conv_resnet_sized_layers_are_fast():
    """im2col + BLAS: a ResNet-50 stem and a 3x3/256 layer together in well under a second."""
    stem = (C.Conv(strides=(2, 2), pads=(3, 3, 3, 3)), rand(1, 3, 224, 224), rand(64, 3, 7, 7), rand(64))
    mid = (C.Conv(pads=(1, 1, 1, 1)), rand(1, 256, 56, 56), rand(256, 256, 3, 3), rand(256))
    for op, *args in (stem, mid):
        op.compute(*args)  # warm up (BLAS threads, page faults)
    t0 = time.perf_counter()
    for op, *args in (stem, mid):
        op.compute(*args)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("make, types, message", [
    (lambda: C.Conv(), (f32(1, 4, 8, 8), f32(2, 3, 3, 3)), "X has 4 channels"),
    (lambda: C.Conv(group=2), (f32(1, 4, 8, 8), f32(3, 2, 3, 3)), "do not divide into group=2"),
    (lambda: C.Conv(), (f32(4, 8), f32(2, 4)), "rank >= 3"),
    (lambda: C.Conv(), (f32(1, 3, 8, 8), f32(2, 3, 3)), "must have X's rank"),
    (lambda: C.Conv(pads=(1, 1)), (f32(1, 3, 8, 8), f32(2, 3, 3, 3)), "pads has 2 entries"),
    (lambda: C.Conv(strides=(1, 1, 1)), (f32(1, 3, 8, 8), f32(2, 3, 3, 3)), "strides has 3 entries"),
    (lambda: C.Conv(kernel_shape=(2, 2)), (f32(1, 3, 8, 8), f32(2, 3, 3, 3)), "does not match"),
    (lambda: C.Conv(), (f32(1, 3, 2, 2), f32(2, 3, 3, 3)), "smaller than the kernel"),
    (lambda: C.Conv(), (TensorType(DType.i32, (1, 3, 8, 8)), TensorType(DType.i32, (2, 3, 3, 3))),
     "not supported"),
    (lambda: C.Conv(), (f32(1, 3, 8, 8), f32(2, 3, 3, 3), f32(3)), "B must be a vector"),
    (lambda: C.Conv(), (f32(1, 3, 8, 8), TensorType(DType.f64, (2, 3, 3, 3))), "share one element type"),
])
def test_conv_refuses_bad_inputs(make, types, message):
    with pytest.raises(OpError, match=message):
        infer(make(), *types)


@pytest.mark.parametrize("attrs, message", [
    ({"auto_pad": "SAME"}, "auto_pad must be one of"),
    ({"strides": (0, 1)}, "strides must be positive"),
    ({"dilations": (1, -1)}, "dilations must be positive"),
    ({"pads": (1, 1, 1)}, "begin and an end"),
    ({"pads": (-1, 0, 0, 0)}, "must not be negative"),
    ({"group": 0}, "group must be positive"),
    ({"kernel_shape": (3, 0)}, "kernel_shape must be positive"),
])
def test_conv_refuses_bad_attributes(attrs, message):
    with pytest.raises(OpError, match=message):
        C.Conv(**attrs)


def test_conv_import_error_names_the_node():
    model = one_node("Conv", [("x", rand(1, 4, 8, 8)), ("w", rand(2, 3, 3, 3))], ["y"])
    with pytest.raises(ModelError, match=r"Conv .*X has 4 channels"):
        import_model(model)


# ---------------------------------------------------------------------------------------------
# ConvTranspose
# ---------------------------------------------------------------------------------------------

def naive_conv_transpose(x, w, strides, dilations, pads_begin, out, group):
    """Straight from the definition: input (n, c, i) scatters w[c, j] into output (n, g*mg + j, i*s + k*d - pb)."""
    n, c = x.shape[:2]
    mg, ks = w.shape[1], w.shape[2:]
    y = np.zeros((n, mg * group) + tuple(out))
    cg = c // group
    for b, ci, *pos in itertools.product(range(n), range(c), *[range(s) for s in x.shape[2:]]):
        g = ci // cg
        for j in range(mg):
            for kk in itertools.product(*[range(k) for k in ks]):
                o = [p * s + k * d - pb for p, s, k, d, pb in zip(pos, strides, kk, dilations, pads_begin)]
                if all(0 <= oi < od for oi, od in zip(o, out)):
                    y[(b, g * mg + j) + tuple(o)] += x[(b, ci) + tuple(pos)] * w[(ci, j) + kk]
    return y


CT_CASES = {
    "basic": ((1, 2, 3, 3), (2, 3, 3, 3), {}),
    "strides_pads": ((2, 2, 4, 3), (2, 2, 3, 3), {"strides": [2, 3], "pads": [1, 0, 1, 2]}),
    "output_padding": ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_padding": [1, 1]}),
    "dilations": ((1, 1, 3, 4), (1, 1, 2, 2), {"dilations": [2, 2]}),
    "group": ((1, 4, 3, 3), (4, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
    "output_shape": ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    "output_shape_odd": ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [2, 2], "output_shape": [6, 5]}),
    "same_upper": ((1, 1, 3, 4), (1, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 2, 3, 4), (2, 1, 4, 3), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    "1d": ((2, 3, 5), (3, 2, 4), {"strides": [2], "pads": [1, 2]}),
    "3d": ((1, 2, 3, 2, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]}),
}


@pytest.mark.parametrize("name", CT_CASES)
def test_conv_transpose_matches_onnxruntime(name):
    xs, ws, attrs = CT_CASES[name]
    mg = ws[1] * attrs.get("group", 1)
    vs_ort("ConvTranspose", [("x", rand(*xs)), ("w", rand(*ws)), ("b", rand(mg))], attrs=attrs)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_auto_pad_follows_the_spec(auto_pad):
    """Output = input * stride; the odd pad goes at the end for SAME_UPPER, the beginning for SAME_LOWER
    (checked against the definition; test_conv_transpose_matches_onnxruntime checks ONNX Runtime)."""
    x, w = rand(1, 1, 3, 4), rand(1, 2, 3, 3)
    op = C.ConvTranspose(auto_pad=auto_pad, strides=(2, 2))
    (y,) = run_op(op, x, w)
    assert y.shape == (1, 2, 6, 8)
    total = 2 * (3 - 1) + 3 - 6  # = 1 on the first axis, 2 * 3 + 3 - 8 = 1 on the second
    pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
    ref = naive_conv_transpose(x, w, (2, 2), (1, 1), (pb, pb), (6, 8), 1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_conv_transpose_output_shape_with_output_padding():
    x, w = rand(1, 1, 3, 3), rand(1, 2, 3, 3)
    op = C.ConvTranspose(strides=(3, 2), output_shape=(10, 8), output_padding=(1, 1), kernel_shape=(3, 3))
    (y,) = run_op(op, x, w)
    # total padding = s*(in-1) + output_padding + k - out: (6+1+3-10, 4+1+3-8) = (0, 0)
    np.testing.assert_allclose(y, naive_conv_transpose(x, w, (3, 2), (1, 1), (0, 0), (10, 8), 1), rtol=1e-5,
                               atol=1e-5)


def test_conv_transpose_shape_inference():
    (t,) = infer(C.ConvTranspose(strides=(2, 2), pads=(1, 1, 1, 1), output_padding=(1, 1)),
                 f32("N", 8, 7, 7), f32(8, 4, 3, 3))
    assert t == f32("N", 4, 14, 14)
    (t,) = infer(C.ConvTranspose(group=2), f32(1, 8, "H", 5), f32(8, 3, 3, 3))
    assert t == f32(1, 6, None, 7)


def test_conv_transpose_refusals():
    with pytest.raises(OpError, match="output_padding .* must be smaller"):
        infer(C.ConvTranspose(output_padding=(1, 1)), f32(1, 2, 3, 3), f32(2, 2, 3, 3))
    with pytest.raises(OpError, match="X has 3 channels but W"):
        infer(C.ConvTranspose(), f32(1, 3, 3, 3), f32(2, 2, 3, 3))
    with pytest.raises(OpError, match="output_shape .* must give the 2 spatial sizes"):
        infer(C.ConvTranspose(output_shape=(5,)), f32(1, 2, 3, 3), f32(2, 2, 3, 3))
    with pytest.raises(OpError, match="do not divide into group=3"):
        infer(C.ConvTranspose(group=3), f32(1, 4, 3, 3), f32(4, 2, 3, 3))


@pytest.mark.parametrize("opset", [7, 10])
def test_conv_transpose_older_opsets_import(opset):
    vs_ort("ConvTranspose", [("x", rand(1, 2, 4, 4)), ("w", rand(2, 3, 3, 3))],
           attrs={"strides": [2, 2], "pads": [1, 1, 0, 0]}, opset=opset)


# ---------------------------------------------------------------------------------------------
# DeformConv
# ---------------------------------------------------------------------------------------------

def test_deform_conv_with_zero_offsets_is_conv():
    x, w, b = rand(2, 4, 7, 6), rand(6, 2, 3, 3), rand(6)
    attrs = dict(group=2, pads=(1, 0, 1, 1), strides=(2, 1), dilations=(1, 2))
    (ref,) = run_op(C.Conv(**attrs), x, w, b)
    offset = np.zeros((2, 2 * 9 * 2) + ref.shape[2:], np.float32)
    (y,) = run_op(C.DeformConv(offset_group=2, **attrs), x, w, offset, b)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    mask = np.full((2, 2 * 9) + ref.shape[2:], 0.5, np.float32)
    (ym,) = run_op(C.DeformConv(offset_group=2, **attrs), x, w, offset, b, mask)
    np.testing.assert_allclose(ym, 0.5 * (ref - b[None, :, None, None]) + b[None, :, None, None], rtol=1e-5,
                               atol=1e-5)


def test_deform_conv_bilinear_sampling_by_hand():
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 2, 2), np.float32)
    offset = np.zeros((1, 8, 2, 2), np.float32)
    offset[0, 0, 0, 0] = 0.5   # tap (0, 0), h, at output (0, 0): samples x at (0.5, 0) = 1.5
    offset[0, 5, 0, 1] = -0.1  # tap (1, 0), w, at output (0, 1): samples x at (1, 0.9) = 3.9
    offset[0, 7, 1, 1] = 1.0   # tap (1, 1), w, at output (1, 1): samples x at (2, 3): outside, 0
    (y,) = run_op(C.DeformConv(kernel_shape=(2, 2)), x, w, offset)
    np.testing.assert_allclose(y, [[[[9.5, 11.9], [20.0, 16.0]]]], rtol=1e-6)


def test_deform_conv_refusals():
    with pytest.raises(OpError, match="offset must have offset_group"):
        infer(C.DeformConv(), f32(1, 2, 5, 5), f32(2, 2, 3, 3), f32(1, 9, 3, 3))
    with pytest.raises(OpError, match="offset_group"):
        infer(C.DeformConv(offset_group=3), f32(1, 2, 5, 5), f32(2, 2, 3, 3), f32(1, 54, 3, 3))


# ---------------------------------------------------------------------------------------------
# Col2Im
# ---------------------------------------------------------------------------------------------

def test_col2im_matches_onnxruntime():
    x = rand(2, 3 * 2 * 3, 5 * 2)
    attrs = {"strides": [2, 2], "pads": [1, 0, 0, 1], "dilations": [1, 2]}
    # image (9, 7), block (2, 3): blocks per axis ((9+1-2)//2+1, (7+1-5)//2+1) = (5, 2)
    vs_ort("Col2Im", [("x", x), ("image", np.array([9, 7], np.int64)), ("block", np.array([2, 3], np.int64))],
           attrs=attrs, opset=18)


def test_col2im_inverts_non_overlapping_im2col():
    img = rand(1, 2, 4, 6)
    cols = img.reshape(1, 2, 2, 2, 3, 2).transpose(0, 1, 3, 5, 2, 4).reshape(1, 2 * 2 * 2, 2 * 3)
    g = Graph()
    x = g.add_input("x", TensorType.of(cols))
    y = g.add(C.Col2Im(strides=(2, 2)), x, g.add_constant(np.array([4, 6])), g.add_constant(np.array([2, 2])))
    assert y.type == f32(1, 2, 4, 6)
    g.set_outputs([y], ["y"])
    np.testing.assert_array_equal(interpret(g, {"x": cols})["y"], img)


def test_col2im_unknown_image_shape_gives_unknown_dims_and_refusals():
    (t,) = infer(C.Col2Im(), f32(1, 8, 9), TensorType(DType.i64, (2,)), TensorType(DType.i64, (2,)))
    assert t == f32(1, None, None, None)
    with pytest.raises(OpError, match="one length"):
        infer(C.Col2Im(), f32(1, 8, 9), TensorType(DType.i64, (2,)), TensorType(DType.i64, (3,)))
    g = Graph()
    x = g.add_input("x", f32(1, 8, 9))
    with pytest.raises(OpError, match="input has 9 blocks"):
        g.add(C.Col2Im(), x, g.add_constant(np.array([5, 5])), g.add_constant(np.array([2, 2])))


# ---------------------------------------------------------------------------------------------
# CausalConvWithState
# ---------------------------------------------------------------------------------------------

def test_causal_conv_is_padded_depthwise_conv():
    x, w, b = rand(2, 3, 10), rand(3, 1, 4), rand(3)
    y, state = run_op(C.CausalConvWithState(), x, w, b)
    padded = np.concatenate([np.zeros((2, 3, 3), np.float32), x], axis=2)
    (ref,) = C.Conv(group=3).compute(padded, w, b)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[:, :, -3:])


def test_causal_conv_state_carries_across_steps():
    x, w, b = rand(1, 4, 9), rand(4, 1, 3), rand(4)
    op = C.CausalConvWithState(activation="silu")
    full, _ = run_op(op, x, w, b)
    first, state = run_op(op, x[:, :, :5], w, b)
    steps = [first]
    for t in range(5, 9):  # token by token decode
        y, state = run_op(op, x[:, :, t:t + 1], w, b, state)
        steps.append(y)
    np.testing.assert_allclose(np.concatenate(steps, axis=2), full, rtol=1e-5, atol=1e-6)


def test_causal_conv_short_input_state_and_types():
    x, w = rand(1, 2, 2), rand(2, 1, 5)
    _, state = run_op(C.CausalConvWithState(), x, w)
    assert state.shape == (1, 2, 4)
    np.testing.assert_array_equal(state[:, :, :2], 0)
    np.testing.assert_array_equal(state[:, :, 2:], x)
    types = infer(C.CausalConvWithState(), f32("B", 2, "L"), f32(2, 1, 5))
    assert types == [f32("B", 2, "L"), f32("B", 2, 4)]
    with pytest.raises(OpError, match="activation must be"):
        C.CausalConvWithState(activation="relu")
    with pytest.raises(OpError, match=r"weight must have shape \(channels, 1, k\)"):
        infer(C.CausalConvWithState(), f32(1, 2, 8), f32(2, 2, 3))
    with pytest.raises(OpError, match="past_state must have shape"):
        infer(C.CausalConvWithState(), f32(1, 2, 8), f32(2, 1, 3), None, f32(1, 2, 3))


# ---------------------------------------------------------------------------------------------
# LRN
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_matches_onnxruntime(size):
    vs_ort("LRN", [("x", rand(2, 7, 4, 3))], attrs={"size": size, "alpha": 0.02, "beta": 0.6, "bias": 1.5},
           opset=13)


def test_lrn_even_size_by_hand():
    """An even window takes one more channel after c than before (ONNX Runtime only takes odd sizes)."""
    x = rand(1, 5, 2, 2)
    (y,) = run_op(C.LRN(size=4, alpha=0.4, beta=0.5, bias=2.0), x)
    sq = np.stack([(x[:, max(0, c - 1):c + 3] ** 2).sum(axis=1) for c in range(5)], axis=1)
    np.testing.assert_allclose(y, x / (2.0 + 0.1 * sq) ** 0.5, rtol=1e-5)


def test_lrn_refusals():
    with pytest.raises(OpError, match="size .* must be a positive int"):
        C.LRN()
    with pytest.raises(OpError, match="rank >= 3"):
        infer(C.LRN(size=3), f32(2, 7))


def test_conv_and_pool_export_round_trip_through_onnxruntime():
    from frontends.onnx import export_model
    from compiler.ir.ops import pool as P

    g = Graph()
    x = g.add_input("x", f32("N", 3, 16, 16))
    h = g.add(C.Conv(pads=(1, 1, 1, 1), strides=(2, 2)), x, g.add_constant(rand(8, 3, 3, 3)), g.add_constant(rand(8)))
    h = g.add_node(P.MaxPool(kernel_shape=(3, 3), pads=(1, 1, 1, 1), ceil_mode=1, strides=(2, 2)), [h],
                   num_outputs=1).outputs[0]
    h = g.add(P.AveragePool(kernel_shape=(2, 2), dilations=(2, 2), count_include_pad=1, pads=(1, 1, 1, 1)), h)
    h = g.add(C.ConvTranspose(strides=(2, 2), output_padding=(1, 1), group=2), h, g.add_constant(rand(8, 2, 3, 3)))
    y = g.add(P.GlobalAveragePool(), g.add(C.LRN(size=3), h))
    g.set_outputs([y], ["y"])
    model = export_model(g)
    feeds = {"x": rand(2, 3, 16, 16)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(interpret(g, feeds)["y"], ref, rtol=1e-4, atol=1e-5)
