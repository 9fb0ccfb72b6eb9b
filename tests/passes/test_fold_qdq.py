"""fold-qdq (compiler/passes/fold_qdq.py): a QDQ model's DequantizeLinear -> Conv/MatMul/Gemm
[-> Relu/Clip] -> QuantizeLinear become QLinearConv/QLinearMatMul, or ConvInteger/MatMulInteger and a
float rescale. Structure (the ops after), numbers (the reference interpreter before and after: the
QLinear result within one step of y's quantization, the rescaled one within float rounding) and
refusals (why a product stays float, why a QLinear op was not used)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import conv as cv
from compiler.ir.ops import elementwise as ew
from compiler.ir.ops import linalg as la
from compiler.ir.ops import quant as qn
from compiler.ir.types import DType, TensorType
from compiler.ir.verify import verify
from compiler.passes.fold_qdq import FoldQDQ
from compiler.passes.manager import PassManager, Verify
from compiler.passes.pipeline import all_pass_names

RNG = np.random.default_rng(11)
SX, ZX = np.float32(0.05), np.uint8(120)   # x in about [-6, 6.75]


def _qdq_input(g: Graph, shape):
    """x (float) -> QuantizeLinear -> DequantizeLinear, as a QDQ model's input of a product."""
    x = g.add_input("x", TensorType(DType.f32, shape))
    sx, zx = g.add_constant(SX), g.add_constant(np.array(ZX))
    return g.add(qn.DequantizeLinear(), g.add(qn.QuantizeLinear(), x, sx, zx), sx, zx)


def _weights(g: Graph, shape, axis: int, per_channel: bool):
    """DequantizeLinear(int8 constant, per tensor or per channel along ``axis``) and its scale."""
    wq = RNG.integers(-127, 128, shape).astype(np.int8)
    sw = (RNG.random(shape[axis]) * 0.01 + 0.002).astype(np.float32) if per_channel else np.float32(0.004)
    zw = np.zeros(np.shape(sw), np.int8)
    return g.add(qn.DequantizeLinear(axis=axis), g.add_constant(wq), g.add_constant(sw), g.add_constant(zw)), sw


def _requantize(g: Graph, y, sy=0.08, zy=0, act=None):
    if act == "relu":
        y = g.add(ew.Relu(), y)
    elif act == "relu6":
        y = g.add(ew.Clip(), y, g.add_constant(np.float32(0)), g.add_constant(np.float32(6)))
    s, z = g.add_constant(np.float32(sy)), g.add_constant(np.array(zy, np.uint8))
    return g.add(qn.DequantizeLinear(), g.add(qn.QuantizeLinear(), y, s, z), s, z)


#: y's quantization step per activation: Relu6's range [0, 6] exactly (so the Clip is redundant)
STEP = {None: 0.08, "relu": 0.08, "relu6": float(np.float32(6 / 255))}


def _conv_graph(per_channel=True, act="relu", zy=0, int_bias=True, group=1, sy=0.08):
    g = Graph("qdq_conv")
    x = _qdq_input(g, (2, 4, 6, 6))
    w, sw = _weights(g, (6, 4 // group, 3, 3), 0, per_channel)
    bq = RNG.integers(-2000, 2000, 6).astype(np.int32)
    if int_bias:
        bscale = (SX * np.broadcast_to(sw, (6,))).astype(np.float32)
        b = g.add(qn.DequantizeLinear(axis=0), g.add_constant(bq), g.add_constant(bscale),
                  g.add_constant(np.zeros(6, np.int32)))
    else:
        b = g.add_constant((bq * 1e-4).astype(np.float32))
    y = g.add(cv.Conv(pads=(1, 1, 1, 1), group=group), x, w, b, name="conv")
    g.set_outputs([_requantize(g, y, sy=sy, zy=zy, act=act)], ["y"])
    return g


def _feeds(shape, seed=0, n=4):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal(shape) * 2).astype(np.float32)} for _ in range(n)]


def _fold(g: Graph, qlinear: bool = True) -> tuple[FoldQDQ, bool]:
    p = FoldQDQ(qlinear)
    changed = PassManager([p], [Verify()]).run(g).records[0].changed
    verify(g)
    return p, changed


def _ops(g: Graph) -> list[str]:
    return [n.op.name for n in g.nodes]


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_conv_then_quantize_becomes_qlinearconv(per_channel, act):
    g = _conv_graph(per_channel, act, sy=STEP[act])
    feeds = _feeds((2, 4, 6, 6))
    want = [interpret(g, f)["y"] for f in feeds]
    p, changed = _fold(g)
    assert changed and p.folded == {"conv": "QLinearConv"} and p.refusals == {}
    assert _ops(g) == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    qc = g.nodes[1]
    assert qc.inputs[0].dtype is DType.u8 and qc.inputs[3].dtype is DType.i8 and qc.inputs[8].dtype is DType.i32
    for f, w in zip(feeds, want):  # within one step of y's quantization, and mostly the same
        got = interpret(g, f)["y"]
        assert np.abs(got - w).max() <= STEP[act] * 1.0001
        assert np.mean(got == w) > 0.95


def test_matmul_then_quantize_becomes_qlinearmatmul():
    g = Graph("qdq_mm")
    x = _qdq_input(g, (2, 5, 16))
    w, _ = _weights(g, (16, 8), 1, True)
    y = g.add(la.MatMul(), x, w, name="mm")
    g.set_outputs([_requantize(g, y, sy=0.05, zy=128)], ["y"])
    feeds = _feeds((2, 5, 16), seed=1)
    want = [interpret(g, f)["y"] for f in feeds]
    p, _ = _fold(g)
    assert p.folded == {"mm": "QLinearMatMul"}
    assert _ops(g) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"]
    for f, w in zip(feeds, want):
        assert np.abs(interpret(g, f)["y"] - w).max() <= 0.05 * 1.0001


def test_gemm_with_a_float_result_becomes_an_integer_product_and_a_rescale():
    """No QuantizeLinear after it (a model's last layer): MatMulInteger, then Cast * (sx * sw) + bias;
    transB's weights transposed, the per-channel scale along N."""
    g = Graph("qdq_gemm")
    x = _qdq_input(g, (3, 16))
    w, _ = _weights(g, (8, 16), 0, True)  # [N, K] with transB
    b = g.add_constant((RNG.standard_normal(8) * 0.1).astype(np.float32))
    y = g.add(la.Gemm(transB=1), x, w, b, name="fc")
    g.set_outputs([y], ["y"])
    feeds = _feeds((3, 16), seed=2)
    want = [interpret(g, f)["y"] for f in feeds]
    p, _ = _fold(g)
    assert p.folded == {"fc": "MatMulInteger"}
    assert _ops(g) == ["QuantizeLinear", "MatMulInteger", "Cast", "Mul", "Add"]
    mmi = g.nodes[1]
    assert list(mmi.inputs[1].shape) == [16, 8] and mmi.inputs[1].dtype is DType.i8
    assert p.rescaled == {"fc": "its result is not read by one QuantizeLinear alone"}
    for f, w in zip(feeds, want):  # the integer sums are exact: only float rounding differs
        np.testing.assert_allclose(interpret(g, f)["y"], w, rtol=1e-5, atol=1e-5)


def test_a_relu_the_quantization_does_not_clip_keeps_the_rescale():
    """y's zero point 10 keeps values below 0 in its range, so the Relu matters: the conv becomes
    ConvInteger + rescale, and the Relu and QuantizeLinear stay."""
    g = _conv_graph(act="relu", zy=10)
    feeds = _feeds((2, 4, 6, 6), seed=3)
    want = [interpret(g, f)["y"] for f in feeds]
    p, _ = _fold(g)
    assert p.folded == {"conv": "ConvInteger"}
    assert "Relu is not made redundant" in p.rescaled["conv"]
    assert _ops(g) == ["QuantizeLinear", "ConvInteger", "Cast", "Mul", "Add", "Relu", "QuantizeLinear",
                       "DequantizeLinear"]
    for f, w in zip(feeds, want):
        assert np.abs(interpret(g, f)["y"] - w).max() <= 0.08 * 1.0001


def test_a_clip_inside_the_range_keeps_the_rescale():
    g = _conv_graph(act="relu6", sy=0.08)  # y's range reaches 20.4: the Clip at 6 matters
    p, _ = _fold(g)
    assert p.rescaled == {"conv": "Clip is not made redundant by the quantization after it (its bounds map "
                                  "inside [0, 255])"}


def test_a_float_bias_keeps_the_rescale():
    g = _conv_graph(act=None, int_bias=False)
    p, _ = _fold(g)
    assert p.folded == {"conv": "ConvInteger"}
    assert "not int32 at the scale" in p.rescaled["conv"]


def test_refusals_say_why():
    g = _conv_graph(group=2)
    p, changed = _fold(g)
    assert not changed and p.folded == {}
    assert p.refusals == {"conv": "a grouped convolution (no fast int8 kernel for it: it stays float)"}

    g = Graph("weights_per_row")  # per-channel scales along K, not the output channels
    x = _qdq_input(g, (2, 16))
    w, _ = _weights(g, (16, 8), 0, True)
    g.set_outputs([g.add(la.MatMul(), x, w, name="mm")], ["y"])
    p, _ = _fold(g)
    assert p.refusals["mm"].startswith("weight parameters of shape [16] along axis 0")

    g = Graph("dynamic_weights")
    x = _qdq_input(g, (2, 16))
    wi = g.add_input("w", TensorType(DType.i8, (16, 8)))
    w = g.add(qn.DequantizeLinear(), wi, g.add_constant(np.float32(0.01)))
    g.set_outputs([g.add(la.MatMul(), x, w, name="mm")], ["y"])
    p, _ = _fold(g)
    assert p.refusals == {"mm": "the weights are not constant"}


def test_float_products_are_left_alone_silently():
    g = Graph("float")
    x = g.add_input("x", TensorType(DType.f32, (2, 4)))
    g.set_outputs([g.add(la.MatMul(), x, g.add_constant(np.ones((4, 3), np.float32)))], ["y"])
    p, changed = _fold(g)
    assert not changed and p.refusals == {} and p.folded == {}


def test_by_default_a_requantized_product_keeps_the_rescale():
    """The pipeline's FoldQDQ() makes no QLinear ops (their per-element finish is slower today): the
    integer product, its rescale, the Relu and the QuantizeLinear."""
    g = _conv_graph(act="relu")
    feeds = _feeds((2, 4, 6, 6), seed=4)
    want = [interpret(g, f)["y"] for f in feeds]
    p, _ = _fold(g, qlinear=False)
    assert p.folded == {"conv": "ConvInteger"} and p.rescaled == {"conv": FoldQDQ.NO_QLINEAR}
    assert _ops(g) == ["QuantizeLinear", "ConvInteger", "Cast", "Mul", "Add", "Relu", "QuantizeLinear",
                       "DequantizeLinear"]
    for f, w in zip(feeds, want):
        assert np.abs(interpret(g, f)["y"] - w).max() <= 0.08 * 1.0001


def test_in_the_pipeline_before_constant_folding():
    names = all_pass_names()
    assert names.index("fold-qdq") < names.index("fold-constants")
