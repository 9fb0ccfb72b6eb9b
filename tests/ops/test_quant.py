"""Quantization ops (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
QLinearMatMul, ConvInteger, QLinearConv), BitCast, and the cast family of elementwise.py (Cast,
CastLike, cast_array, BitShift): numbers against ONNX Runtime or by hand, older-opset import, refusals."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.errors import ModelError
from compiler.ir.ops import OpError
from compiler.ir.ops import elementwise as E
from compiler.ir.ops import quant as Q
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import declare_output_types, infer_types, kiln_run, ort_run, run_op

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def _model(op_type, inputs, outputs, attrs, opset, initializers=()):
    """One-node model; ``inputs``: (name, array) fed at run time, "" for a missing optional input;
    ``initializers``: (name, array) constants (any type numpy_helper takes, float 8 included)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs if n]
    inits = [numpy_helper.from_array(a, n) for n, a in initializers]
    names = [n for n, _ in inputs]
    names += [n for n, _ in initializers]
    node = helper.make_node(op_type, names, outputs, **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    g = helper.make_graph([node], "t", vis, outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _ordered(op_type, args, outputs, attrs, opset):
    """One-node model whose inputs keep the given order: ``args`` are (name, array, is_constant)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a, const in args if n and not const]
    inits = [numpy_helper.from_array(a, n) for n, a, const in args if n and const]
    node = helper.make_node(op_type, [n for n, _, _ in args], outputs, **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    g = helper.make_graph([node], "t", vis, outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), \
        {n: a for n, a, const in args if n and not const}


def _vs_ort(model, feeds, atol=0.0, rtol=0.0):
    """Kiln's import of ``model`` run by the interpreter, against ONNX Runtime."""
    g, outs = kiln_run(model, feeds)
    declare_output_types(model, g)
    for o, r, v in zip(outs, ort_run(model, feeds), g.outputs):
        if r.dtype != o.dtype and r.dtype.itemsize == o.dtype.itemsize:  # ORT hands float 8 as raw bits
            r = r.view(o.dtype)
        assert o.dtype == v.dtype.np and o.shape == r.shape, (o.dtype, o.shape, r.dtype, r.shape)
        np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)
    return outs


def _float_outputs(model):
    """Append a Cast to float to every output (ORT hands most float 8 types not to NumPy)."""
    g = model.graph
    for vi in g.output:
        g.node.append(helper.make_node("Cast", [vi.name], [vi.name + "_f"], to=TensorProto.FLOAT))
        vi.name += "_f"
    return model


def _run(op, *arrays):
    return run_op(op, *arrays)[1]


_infer = infer_types


def T(shape, dtype=DType.f32):
    return TensorType(dtype, tuple(shape))


def _f32(*shape, scale=10.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor_matches_onnxruntime(zp_dtype):
    x = _f32(3, 4, scale=200)
    x[0, :3] = [2.5, 3.5, -2.5]  # ties round to even
    zp = np.array(3, zp_dtype)
    _vs_ort(_model("QuantizeLinear", [("x", x)], ["y"], {}, 21,
                   [("s", np.array(0.5, np.float32)), ("zp", zp)]), {"x": x})


def test_quantize_per_axis_and_dequantize_per_axis_match_onnxruntime():
    x = _f32(2, 3, 4)
    s = np.array([0.1, 0.2, 0.5], np.float32)
    zp = np.array([-3, 0, 7], np.int8)
    (q,) = _vs_ort(_model("QuantizeLinear", [("x", x)], ["y"], {"axis": 1}, 13, [("s", s), ("zp", zp)]), {"x": x})
    _vs_ort(_model("DequantizeLinear", [("q", q)], ["y"], {"axis": -2}, 13, [("s", s), ("zp", zp)]), {"q": q})


@pytest.mark.parametrize("out", [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16])
def test_quantize_blocked_matches_onnxruntime(out):
    x = _f32(4, 6, scale=3)
    s = RNG.uniform(0.1, 1, (4, 3)).astype(np.float32)  # blocks of 2 along axis 1
    _vs_ort(_model("QuantizeLinear", [("x", x)], ["y"], {"axis": 1, "block_size": 2, "output_dtype": out}, 21,
                   [("s", s)]), {"x": x})


@pytest.mark.parametrize("out", [TensorProto.INT4, TensorProto.UINT4])
def test_quantize_dequantize_4bit_blocked_matches_onnxruntime(out):
    """ORT hands no 4-bit arrays to NumPy: compare the round trip QuantizeLinear -> DequantizeLinear."""
    x = _f32(4, 8, scale=3)
    s = RNG.uniform(0.1, 1, (2, 8)).astype(np.float32)  # blocks of 3 along axis 0 (the last one ragged)
    attrs = {"axis": 0, "block_size": 3}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"], output_dtype=out, **attrs),
             helper.make_node("DequantizeLinear", ["q", "s"], ["y"], **attrs)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(s, "s")])
    _vs_ort(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), {"x": x})


def test_quantize_blocked_ragged_last_block_by_hand():
    x = np.arange(10, dtype=np.float32).reshape(1, 10)
    s = np.array([[1.0, 2.0, 4.0]], np.float32)  # blocks of 4: [0..3] [4..7] [8, 9]
    (y,) = _run(Q.QuantizeLinear(axis=1, block_size=4, output_dtype=DType.i8), x, s)
    assert y.tolist() == [[0, 1, 2, 3, 2, 2, 3, 4, 2, 2]]  # 5/2 = 2.5 -> 2, 7/2 = 3.5 -> 4, 9/4 -> 2
    (z,) = _run(Q.DequantizeLinear(axis=1, block_size=4), y, s)
    np.testing.assert_array_equal(z, [[0, 1, 2, 3, 4, 4, 6, 8, 8, 8]])


def test_dequantize_blocked_matches_onnxruntime():
    q = RNG.integers(0, 255, (2, 4, 3), dtype=np.uint8)
    s = RNG.uniform(0.1, 1, (2, 2, 3)).astype(np.float32)
    zp = RNG.integers(0, 255, (2, 2, 3), dtype=np.uint8)
    _vs_ort(_model("DequantizeLinear", [("q", q)], ["y"], {"axis": 1, "block_size": 2}, 21,
                   [("s", s), ("zp", zp)]), {"q": q}, rtol=1e-6)


@pytest.mark.parametrize("f8", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8_matches_onnxruntime(f8, saturate):
    x = np.array([0, 1, -1, 3.3, 1e5, -1e5, np.inf, -np.inf, 200, 0.001], np.float32)
    zp = np.zeros((), f8)
    _vs_ort(_float_outputs(_model("QuantizeLinear", [("x", x)], ["y"], {"saturate": saturate}, 21,
                                  [("s", np.array(2, np.float32)), ("zp", zp)])), {"x": x})


def test_dequantize_float8_and_int32_match_onnxruntime():
    q8 = np.array([0, 0.5, 1, 448, -104], ml_dtypes.float8_e4m3fn)
    _vs_ort(_model("DequantizeLinear", [], ["y"], {}, 21, [("q", q8), ("s", np.array(2, np.float16))]), {})
    q32 = RNG.integers(-(1 << 20), 1 << 20, (3, 5)).astype(np.int32)
    _vs_ort(_model("DequantizeLinear", [("q", q32)], ["y"], {}, 13, [("s", np.array(0.003, np.float32))]),
            {"q": q32}, rtol=1e-6)


def test_quantize_int4_uint2_by_hand():
    x = np.array([-20, -8.5, -1, 0, 1, 7.5, 20], np.float32)
    (y,) = _run(Q.QuantizeLinear(output_dtype=DType.i4), x, np.array(1, np.float32))
    assert y.dtype == DType.i4.np and y.astype(int).tolist() == [-8, -8, -1, 0, 1, 7, 7]
    (y,) = _run(Q.QuantizeLinear(), x, np.array(1, np.float32), np.array(1, DType.u2.np))
    assert y.dtype == DType.u2.np and y.astype(int).tolist() == [0, 0, 0, 1, 2, 3, 3]


def test_quantize_precision_attribute_divides_in_float16():
    x, s2 = np.array([1001.2], np.float32), np.array(2.0, np.float32)
    (y32,) = _run(Q.QuantizeLinear(output_dtype=DType.i16), x, s2)  # 500.6 -> 501
    (y16,) = _run(Q.QuantizeLinear(output_dtype=DType.i16, precision=DType.f16), x, s2)  # 1001 / 2 = 500.5 -> 500
    assert y32.tolist() == [501] and y16.tolist() == [500]
    (h,) = _run(Q.QuantizeLinear(output_dtype=DType.i16), x, np.array(2.0, np.float16))  # the scale's type
    assert h.tolist() == [500]


def test_quantize_older_opset_import_and_output_dtype_zero():
    x = _f32(5)
    m = _model("QuantizeLinear", [("x", x)], ["y"], {}, 10, [("s", np.array(0.1, np.float32)),
                                                         ("zp", np.array(5, np.uint8))])
    _vs_ort(m, {"x": x})
    m = _model("QuantizeLinear", [("x", x)], ["y"], {"output_dtype": 0}, 21, [("s", np.array(0.1, np.float32))])
    assert import_model(m).outputs[0].dtype is DType.u8
    m = _model("DequantizeLinear", [("q", np.arange(4, dtype=np.uint8))], ["y"], {"output_dtype": 0}, 23,
               [("s", np.array(0.1, np.float16))])
    assert import_model(m).outputs[0].dtype is DType.f16


def test_quantize_refusals():
    with pytest.raises(OpError, match="output_dtype"):
        Q.QuantizeLinear(output_dtype=DType.f32)
    with pytest.raises(OpError, match="block_size"):
        Q.QuantizeLinear(block_size=-1)
    with pytest.raises(OpError, match="saturate"):
        Q.QuantizeLinear(saturate=2)
    with pytest.raises(OpError, match="differs from the zero point"):
        _infer(Q.QuantizeLinear(output_dtype=DType.i8), T([4]), T([]), T([], DType.u8))
    with pytest.raises(OpError, match="x has element type i8"):
        _infer(Q.QuantizeLinear(), T([4], DType.i8), T([]))
    with pytest.raises(OpError, match="needs block_size"):
        _infer(Q.QuantizeLinear(), T([4, 6]), T([4, 3]))
    with pytest.raises(OpError, match="ceil"):
        _infer(Q.QuantizeLinear(axis=1, block_size=2), T([4, 6]), T([4, 2]))
    with pytest.raises(OpError, match="must match the input"):
        _infer(Q.QuantizeLinear(axis=1, block_size=2), T([4, 6]), T([3, 3]))
    with pytest.raises(OpError, match="length of input dimension"):
        _infer(Q.QuantizeLinear(axis=0), T([4, 6]), T([6]))
    with pytest.raises(OpError, match="axis 2 is out of range"):
        _infer(Q.QuantizeLinear(axis=2), T([4, 6]), T([6]))
    with pytest.raises(OpError, match="same shape"):
        _infer(Q.QuantizeLinear(axis=0), T([4, 6]), T([4]), T([], DType.u8))


def test_dequantize_refusals():
    with pytest.raises(OpError, match="output_dtype"):
        Q.DequantizeLinear(output_dtype=DType.i8)
    with pytest.raises(OpError, match="zero point"):
        _infer(Q.DequantizeLinear(), T([4], DType.u8), T([]), T([], DType.i8))
    with pytest.raises(OpError, match="needs output_dtype"):
        _infer(Q.DequantizeLinear(), T([4], DType.u8), T([], DType.f8e8m0))
    assert _infer(Q.DequantizeLinear(output_dtype=DType.bf16), T([4], DType.u8), T([], DType.f8e8m0)) == \
        [T([4], DType.bf16)]
    with pytest.raises(OpError, match="x has element type f32"):
        _infer(Q.DequantizeLinear(), T([4]), T([]))


def test_quantize_symbolic_shapes_infer():
    (t,) = _infer(Q.QuantizeLinear(axis=1), T(["N", 3, None]), T([3]), T([3], DType.i8))
    assert t == T(["N", 3, None], DType.i8)
    (t,) = _infer(Q.DequantizeLinear(axis=0, block_size=8), T(["N", 16], DType.i4), T([None, 16]))
    assert t == T(["N", 16])


def test_quantize_import_error_is_a_model_error():
    m = _model("QuantizeLinear", [("x", _f32(4, 6))], ["y"], {"axis": 1}, 21, [("s", np.ones(5, np.float32))])
    with pytest.raises(ModelError, match="per-axis scale"):
        import_model(m)


# ---------------------------------------------------------------------------------------------
# DynamicQuantizeLinear
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("x", [
    np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32),
    np.array([1, 2.1, 1.3, 2.5, 3.34, 4.0, 1.5, 2.6, 3.9, 4.0, 3.0, 2.345], np.float32).reshape(3, 4),
    np.array([-1.0, -2.1, -1.3, -2.5, -3.34, -4.0], np.float32),
    np.zeros((2, 2), np.float32),
])
def test_dynamic_quantize_matches_onnxruntime(x):
    _vs_ort(_model("DynamicQuantizeLinear", [("x", x)], ["y", "s", "zp"], {}, 11), {"x": x}, rtol=1e-6)


def test_dynamic_quantize_refuses_non_f32():
    with pytest.raises(OpError, match="supported: f32"):
        _infer(Q.DynamicQuantizeLinear(), T([3], DType.f16))


# ---------------------------------------------------------------------------------------------
# MatMulInteger / QLinearMatMul
# ---------------------------------------------------------------------------------------------

def _u8(*shape):
    return RNG.integers(0, 256, shape).astype(np.uint8)


def _i8(*shape):
    return RNG.integers(-128, 128, shape).astype(np.int8)


def _i8_ort(*shape):
    """int8 weights for comparisons with ONNX Runtime: within [-64, 64), since on AVX2 CPUs without
    VNNI (Zen 3) ORT's uint8 x int8 kernels add pairs of products in saturating 16 bits
    (vpmaddubsw), which is wrong for larger magnitudes; Kiln's reference is exact (the by-hand tests
    cover the full range)."""
    return RNG.integers(-64, 64, shape).astype(np.int8)


@pytest.mark.parametrize("shapes", [((4, 5), (5, 3)), ((2, 4, 5), (5, 3)), ((5,), (5, 3)), ((2, 1, 4, 5), (3, 5, 2))])
def test_matmulinteger_matches_onnxruntime(shapes):
    a, b = _u8(*shapes[0]), _i8_ort(*shapes[1])
    _vs_ort(_model("MatMulInteger", [("a", a), ("b", b)], ["y"], {}, 10,
                   [("za", np.array(7, np.uint8)), ("zb", np.array(-3, np.int8))]), {"a": a, "b": b})


def test_matmulinteger_zero_points_per_column_and_absent_match_onnxruntime():
    a, b = _u8(4, 5), _u8(5, 3)
    _vs_ort(_model("MatMulInteger", [("a", a), ("b", b)], ["y"], {}, 10,
                   [("za", np.array([9], np.uint8)), ("zb", _u8(3))]), {"a": a, "b": b})
    _vs_ort(_model("MatMulInteger", [("a", a), ("b", b)], ["y"], {}, 10), {"a": a, "b": b})


def test_matmulinteger_per_row_zero_point_by_hand():  # ORT takes only a per-tensor a_zero_point
    a, b, za = _u8(4, 5), _i8(5, 3), _u8(4)
    (y,) = _run(Q.MatMulInteger(), a, b, za)
    np.testing.assert_array_equal(y, (a.astype(np.int64) - za[:, None]) @ b.astype(np.int64))


def test_matmulinteger_accumulator_wraps_like_int32():
    k = 40000
    a, b = np.full((1, k), 255, np.uint8), np.full((k, 1), 255, np.uint8)
    (y,) = _run(Q.MatMulInteger(), a, b)
    want = (255 * 255 * k + (1 << 31)) % (1 << 32) - (1 << 31)
    assert y.dtype == np.int32 and int(y[0, 0]) == want


@pytest.mark.parametrize("qt", [np.uint8, np.int8])
@pytest.mark.parametrize("st", [np.float32, np.float16])
def test_qlinearmatmul_matches_onnxruntime(qt, st):
    mk = _u8 if qt is np.uint8 else _i8
    a, b = mk(2, 4, 6), mk(6, 3)
    args = [("a", a, False), ("sa", np.array(0.02, st), True), ("za", mk(), True), ("b", b, False),
            ("sb", np.array(0.015, st), True), ("zb", mk(), True), ("sy", np.array(0.1, st), True),
            ("zy", mk(), True)]
    m, feeds = _ordered("QLinearMatMul", args, ["y"], {}, 21)
    (y,) = _vs_ort(m, feeds, atol=1)  # rounding ties of f32 (ORT) vs f64 (Kiln) may differ by one
    assert y.dtype == qt


def test_qlinearmatmul_onnx_case_by_hand():
    a = np.array([[208, 236, 0, 238], [3, 214, 255, 29]], np.uint8)
    b = np.array([[152, 51, 244], [60, 26, 255], [0, 127, 246], [127, 254, 247]], np.uint8)
    f = np.float32
    (y,) = _run(Q.QLinearMatMul(), a, np.array([0.0066], f), np.array([113], np.uint8), b,
                np.array([0.00705], f), np.array([114], np.uint8), np.array([0.0107], f), np.array([118], np.uint8))
    assert y.tolist() == [[168, 115, 255], [1, 66, 151]]


def test_qlinearmatmul_per_column_b_scale():
    a, b = _u8(3, 4), _u8(4, 2)
    sb, zb = np.array([0.01, 0.03], np.float32), np.array([100, 130], np.uint8)
    (y,) = _run(Q.QLinearMatMul(), a, np.array(0.02, np.float32), np.array(120, np.uint8), b, sb, zb,
                np.array(0.05, np.float32), np.array(128, np.uint8))
    real = ((a.astype(np.float64) - 120) * 0.02) @ ((b.astype(np.float64) - zb) * sb.astype(np.float64))
    want = np.clip(np.rint(real / np.float64(np.float32(0.05))) + 128, 0, 255)
    np.testing.assert_array_equal(y, want)


def test_qlinearmatmul_per_row_a_scale_with_a_1d_b():
    """A 1-D b is a column: the result has one value per row, each scaled by its own row's scale
    (the reference once broadcast the [M] result against the [M, 1] scales into [M, M])."""
    a, b = _u8(3, 4), _u8(4)
    sa = np.array([0.01, 0.02, 0.04], np.float32)
    (y,) = _run(Q.QLinearMatMul(), a, sa, np.array([1, 2, 3], np.uint8), b, np.array(0.03, np.float32),
                np.array(7, np.uint8), np.array(0.5, np.float32), np.array(10, np.uint8))
    real = ((a.astype(np.float64) - [[1], [2], [3]]) @ (b.astype(np.float64) - 7)) * (sa.astype(np.float64)
                                                                                  * np.float64(np.float32(0.03)))
    assert y.shape == (3,)
    np.testing.assert_array_equal(y, np.clip(np.rint(real / 0.5) + 10, 0, 255))


def test_matmul_quant_refusals():
    with pytest.raises(OpError, match="inner dimensions"):
        _infer(Q.MatMulInteger(), T([2, 3], DType.u8), T([4, 5], DType.u8))
    with pytest.raises(OpError, match="A has element type f32"):
        _infer(Q.MatMulInteger(), T([2, 3]), T([3, 5], DType.u8))
    with pytest.raises(OpError, match="per-row"):
        _infer(Q.MatMulInteger(), T([2, 3], DType.u8), T([3, 5], DType.u8), T([3], DType.u8))
    with pytest.raises(OpError, match="operand's type"):
        _infer(Q.MatMulInteger(), T([2, 3], DType.u8), T([3, 5], DType.u8), T([], DType.i8))
    u8 = DType.u8
    with pytest.raises(OpError, match="share one type"):
        _infer(Q.QLinearMatMul(), T([2, 3], u8), T([]), T([], u8), T([3, 4], u8), T([], DType.f16), T([], u8),
               T([]), T([], u8))
    with pytest.raises(OpError, match="per-column"):
        _infer(Q.QLinearMatMul(), T([2, 3], u8), T([]), T([], u8), T([3, 4], u8), T([3]), T([3], u8),
               T([]), T([], u8))
    assert Q.MatMulInteger().cost([T([2, 3], u8), T([3, 5], u8)], [T([2, 5], DType.i32)]).flops == 60


# ---------------------------------------------------------------------------------------------
# ConvInteger / QLinearConv
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [0, 1, 1, 0]},
                                   {"group": 2}, {"dilations": [2, 1]}])
def test_convinteger_matches_onnxruntime(attrs):
    x, w = _u8(1, 4, 7, 6), _u8(6, 4 // attrs.get("group", 1), 3, 3)
    _vs_ort(_model("ConvInteger", [("x", x), ("w", w)], ["y"], attrs, 10,
                   [("zx", np.array(120, np.uint8)), ("zw", np.array(3, np.uint8))]), {"x": x, "w": w})


def test_convinteger_onnx_case_with_per_channel_zero_point():
    x = np.arange(2, 11, dtype=np.uint8).reshape(1, 1, 3, 3)
    w = np.ones((2, 1, 2, 2), np.uint8)
    (y,) = _run(Q.ConvInteger(pads=(1, 1, 1, 1)), x, w, np.array(1, np.uint8), np.array([0, 1], np.uint8))
    assert y.dtype == np.int32
    assert y[0, 0].tolist() == [[1, 3, 5, 3], [5, 12, 16, 9], [11, 24, 28, 15], [7, 15, 17, 9]]
    assert not y[0, 1].any()


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("qt", [np.uint8, np.int8])
def test_qlinearconv_matches_onnxruntime(per_channel, qt):
    mk = _u8 if qt is np.uint8 else _i8
    x, w = mk(1, 3, 6, 6), _i8_ort(4, 3, 3, 3)
    ws = RNG.uniform(0.001, 0.01, 4).astype(np.float32) if per_channel else np.array(0.004, np.float32)
    wz = np.zeros(4 if per_channel else (), np.int8)
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    args = [("x", x, False), ("sx", np.array(0.05, np.float32), True), ("zx", mk(), True), ("w", w, True),
            ("sw", ws, True), ("zw", wz, True), ("sy", np.array(0.08, np.float32), True), ("zy", mk(), True),
            ("b", bias, True)]
    m, feeds = _ordered("QLinearConv", args, ["y"], {"pads": [1, 1, 1, 1]}, 10)
    _vs_ort(m, feeds, atol=1)


def test_conv_quant_refusals():
    u8 = DType.u8
    with pytest.raises(OpError, match="x has element type f32"):
        _infer(Q.ConvInteger(), T([1, 1, 3, 3]), T([1, 1, 2, 2], u8))
    with pytest.raises(OpError, match="x_zero_point must be a scalar"):
        _infer(Q.ConvInteger(), T([1, 2, 3, 3], u8), T([1, 2, 2, 2], u8), T([2], u8))
    with pytest.raises(OpError, match="per output channel"):
        _infer(Q.ConvInteger(), T([1, 2, 3, 3], u8), T([4, 2, 2, 2], u8), T([], u8), T([3], u8))
    with pytest.raises(OpError, match="channels"):
        _infer(Q.ConvInteger(), T([1, 2, 3, 3], u8), T([4, 3, 2, 2], u8))
    with pytest.raises(OpError, match="x_scale must be a scalar"):
        _infer(Q.QLinearConv(), T([1, 2, 3, 3], u8), T([2]), T([], u8), T([4, 2, 2, 2], u8), T([]), T([], u8),
               T([]), T([], u8))
    with pytest.raises(OpError, match="group"):
        Q.ConvInteger(group=0)
    (t,) = _infer(Q.QLinearConv(strides=(2, 2)), T(["N", 2, 8, 8], u8), T([]), T([], u8),
                  T([4, 2, 3, 3], DType.i8), T([4]), T([4], DType.i8), T([]), T([], DType.i8), T([4], DType.i32))
    assert t == T(["N", 4, 3, 3], DType.i8)


# ---------------------------------------------------------------------------------------------
# BitCast
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("src, to", [(np.float32, DType.i32), (np.int64, DType.f64), (np.uint16, DType.f16),
                                     (np.int8, DType.u8), (np.float16, DType.bf16), (np.complex64, DType.u64)])
def test_bitcast_reinterprets_bits(src, to):
    x = (RNG.standard_normal((2, 3)) * 100).astype(src)
    (y,) = _run(Q.BitCast(to=to), x)
    assert y.dtype == to.np and y.shape == x.shape
    assert y.tobytes() == x.tobytes()


def test_bitcast_sub_byte_bool_and_scalar():
    (y,) = _run(Q.BitCast(to=DType.u4), np.array([-1, -8, 7, 0], DType.i4.np))
    assert y.dtype == DType.u4.np and y.astype(int).tolist() == [15, 8, 7, 0]
    (y,) = _run(Q.BitCast(to=DType.f4e2m1), np.array([1, 9, 7], DType.u4.np))
    assert y.astype(np.float32).tolist() == [0.5, -0.5, 6.0]
    (y,) = _run(Q.BitCast(to=DType.u8), np.array([True, False]))
    assert y.tolist() == [1, 0]
    (y,) = _run(Q.BitCast(to=DType.i32), np.array(1.0, np.float32))
    assert y.shape == () and int(y) == 0x3F800000


def test_bitcast_refusals():
    with pytest.raises(OpError, match="differ in width"):
        _infer(Q.BitCast(to=DType.i64), T([2]))
    with pytest.raises(OpError, match="differ in width"):
        _infer(Q.BitCast(to=DType.u8), T([2], DType.u4))
    with pytest.raises(OpError, match="string"):
        Q.BitCast(to=DType.string)
    with pytest.raises(OpError, match="input has element type string"):
        _infer(Q.BitCast(to=DType.u8), T([2], DType.string))


# ---------------------------------------------------------------------------------------------
# Cast / CastLike / BitShift (elementwise.py)
# ---------------------------------------------------------------------------------------------

_F8 = [DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz]


@pytest.mark.parametrize("to", _F8)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
def test_cast_to_float8_matches_onnxruntime(to, saturate, src):
    with np.errstate(over="ignore"):  # 1e6 is inf in f16
        x = np.array([0, -0.0, 0.47892547, 1e6, -1e6, 1e-7, np.nan, np.inf, -np.inf, 300, 241, 57000, 3.3],
                     np.float32).astype(src)
    _vs_ort(_float_outputs(_model("Cast", [("x", x)], ["y"], {"to": to.onnx, "saturate": saturate}, 21)),
            {"x": x})


def test_cast_e5m2_overflow_without_saturate_is_inf():
    # 61440 is the tie between E5M2's max 57344 and 65536: it rounds (to even) past the max, and the
    # spec makes that +Inf without saturation (ONNX Runtime 1.32 gives NaN), the max with it
    x = np.array([61440, -61440, 61439], np.float32)
    assert E.cast_array(x, DType.f8e5m2, False).astype(np.float32).tolist() == [np.inf, -np.inf, 57344]
    assert E.cast_array(x, DType.f8e5m2, True).astype(np.float32).tolist() == [57344, -57344, 57344]


@pytest.mark.parametrize("to", [DType.f8e4m3fn, DType.f8e5m2])
def test_cast_integers_to_float8_saturate(to):
    x = np.array([0, 1, 3, 100, 1000, -70000, 2 ** 40], np.int64)
    (y,) = _run(E.Cast(to=to), x)
    limit = float(ml_dtypes.finfo(to.np).max)
    assert y.astype(np.float64)[4:].tolist() == [min(1000, limit) if to is DType.f8e4m3fn else 1024,
                                                  -limit, limit]


def test_cast_to_e8m0_round_modes_by_hand():
    x = np.array([0.0, 0.124, 0.25, 1.1, 1.5, 1.4, 3.0, np.inf, np.nan, 1e39 * 0 + 3e38], np.float32)
    up = E.cast_array(x, DType.f8e8m0, True, "up").astype(np.float64)
    down = E.cast_array(x, DType.f8e8m0, True, "down").astype(np.float64)
    near = E.cast_array(x, DType.f8e8m0, True, "nearest").astype(np.float64)
    tiny, big = 2.0 ** -127, 2.0 ** 127
    np.testing.assert_array_equal(up[:7], [tiny, 0.125, 0.25, 2, 2, 2, 4])
    np.testing.assert_array_equal(down[:7], [tiny, 0.0625, 0.25, 1, 1, 1, 2])
    np.testing.assert_array_equal(near[:7], [tiny, 0.125, 0.25, 1, 2, 1, 4])
    assert up[7] == big and np.isnan(up[8]) and up[9] == big
    raw = E.cast_array(x, DType.f8e8m0, False, "nearest").astype(np.float64)
    assert np.isnan(raw[0]) and np.isnan(raw[7]) and np.isnan(raw[9]) and raw[3] == 1


def test_cast_strings_both_ways():
    x = np.array([0.5, 1.0, -0.0, 1e6, 1e-7, 123456789, np.nan, np.inf, -np.inf], np.float32)
    (s,) = _run(E.Cast(to=DType.string), x)
    assert s.tolist() == ["0.5", "1", "-0", "1000000", "1e-07", "123456790", "NaN", "INF", "-INF"]
    (back,) = _run(E.Cast(to=DType.f32), s)
    np.testing.assert_array_equal(back, x)
    words = np.array(["1e3", " 2.5 ", "+INF", "-inf", "nan", "300"], dtype=object)
    (f,) = _run(E.Cast(to=DType.f64), words)
    np.testing.assert_array_equal(f, [1000, 2.5, np.inf, -np.inf, np.nan, 300])
    (i,) = _run(E.Cast(to=DType.i8), np.array(["7", "-3", "100.7", "300"], dtype=object))
    assert i.tolist() == [7, -3, 100, 44]  # 300 keeps its low 8 bits
    (b,) = _run(E.Cast(to=DType.bool), np.array(["0", "1", "true", "False", "2.5"], dtype=object))
    assert b.tolist() == [False, True, True, False, True]
    (f8,) = _run(E.Cast(to=DType.f8e4m3fn), np.array(["1000", "0.3"], dtype=object))
    assert f8.astype(np.float32).tolist() == [448, 0.3125]
    (t,) = _run(E.Cast(to=DType.string), np.array([True, False]))
    assert t.tolist() == ["1", "0"]


def test_cast_integer_wraps_and_sub_byte():
    (y,) = _run(E.Cast(to=DType.i8), np.array([200, -129, 127], np.int16))
    assert y.tolist() == [-56, 127, 127]
    (y,) = _run(E.Cast(to=DType.i4), np.array([7, 8, -9, 15], np.int32))
    assert y.astype(int).tolist() == [7, -8, 7, -1]
    (y,) = _run(E.Cast(to=DType.u2), np.array([3, 4, 5], np.uint8))
    assert y.astype(int).tolist() == [3, 0, 1]
    (y,) = _run(E.Cast(to=DType.f32), np.array([-8, 7], DType.i4.np))
    assert y.tolist() == [-8, 7]
    (y,) = _run(E.Cast(to=DType.bool), np.array([0.0, -0.0, np.nan, 0.1], np.float32))
    assert y.tolist() == [False, False, True, True]


def test_castlike_and_cast_import():
    x = _f32(3, 4)
    like = np.zeros((1,), np.float16)
    _vs_ort(_model("CastLike", [("x", x), ("t", like)], ["y"], {}, 21), {"x": x, "t": like})
    _vs_ort(_model("Cast", [("x", x)], ["y"], {"to": TensorProto.INT32}, 9), {"x": x})


def test_cast_refusals():
    with pytest.raises(OpError, match="round_mode"):
        E.Cast(to=DType.f8e8m0, round_mode="even")
    with pytest.raises(OpError, match="saturate"):
        E.CastLike(saturate=3)
    with pytest.raises(OpError, match="complex"):
        _infer(E.Cast(to=DType.f32), T([2], DType.c64))
    with pytest.raises(OpError, match="complex"):
        _infer(E.CastLike(), T([2]), T([1], DType.c128))
    with pytest.raises(OpError, match="attribute to"):
        E.Cast(to=27)  # float6e2m3: not a Kiln type


@pytest.mark.parametrize("dt", [np.uint8, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_unsigned_matches_onnxruntime(dt, direction):
    x = RNG.integers(0, np.iinfo(dt).max, 12, dtype=dt)
    y = RNG.integers(0, np.iinfo(dt).bits, 12, dtype=dt)
    _vs_ort(_model("BitShift", [("x", x), ("y", y)], ["z"], {"direction": direction}, 11), {"x": x, "y": y})


def test_bitshift_signed_by_hand():
    x = np.array([-128, -5, 5, 64, 1, -1], np.int8)
    s = np.array([1, 1, 1, 1, 8, -1], np.int8)
    (left,) = _run(E.BitShift(direction="LEFT"), x, s)
    (right,) = _run(E.BitShift(direction="RIGHT"), x, s)
    assert left.tolist() == [0, -10, 10, -128, 0, 0]
    assert right.tolist() == [-64, -3, 2, 32, 0, -1]
    (r,) = _run(E.BitShift(direction="RIGHT"), np.array([-(1 << 40), 1 << 40], np.int64), np.array([70], np.int64))
    assert r.tolist() == [-1, 0]
    (r,) = _run(E.BitShift(direction="LEFT"), np.array([3], np.uint16), np.array([16], np.uint16))
    assert r.tolist() == [0]


def test_bitshift_refusals():
    with pytest.raises(OpError, match="direction"):
        E.BitShift(direction="UP")
    with pytest.raises(OpError, match="not supported"):
        _infer(E.BitShift(), T([2]), T([2]))
    with pytest.raises(OpError, match="share one element type"):
        _infer(E.BitShift(), T([2], DType.i8), T([2], DType.u8))
