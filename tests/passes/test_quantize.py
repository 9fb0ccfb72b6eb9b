"""The quantize pass (compiler/passes/quantize.py): structure (what a quantized product becomes),
numbers (the interpreter before and after: the int8 result close to float, the integer part exact)
and refusals (why a product stays in float), plus the scale and zero point arithmetic."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.interpreter import interpret
from compiler.ir.verify import verify
from compiler.passes.manager import PassManager, Verify
from compiler.passes.options import CompileOptions, OptionError
from compiler.passes.quantize import Quantize, QuantizeOptions, activation_params, weight_scales

from .util import ir

RNG = np.random.default_rng(5)
W1 = (RNG.standard_normal((8, 16)) * 0.3).astype(np.float32)   # Gemm transB: [N, K]
B1 = (RNG.standard_normal(8) * 0.1).astype(np.float32)
W2 = (RNG.standard_normal((8, 3)) * 0.3).astype(np.float32)    # MatMul: [K, N]
WC = RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)   # Conv: [M, C, kh, kw]


def _mlp():
    return ir("""
    graph @mlp(%x: f32[4,16]) -> (y: f32[4,3]) {
      %w1 = const f32[8,16]
      %b1 = const f32[8]
      %w2 = const f32[8,3]
      %0 = Gemm(%x, %w1, %b1) {transB=1} : f32[4,8]
      %1 = Relu(%0) : f32[4,8]
      %2 = MatMul(%1, %w2) : f32[4,3]
      return y=%2
    }""", {"w1": W1, "b1": B1, "w2": W2})


def _feeds(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(n)]


def _minmax(samples):
    """A Calibrate callback: the reference interpreter's extremes of each value over ``samples``."""
    def calibrate(graph, values):
        names = [f"v{i}" for i in range(len(values))]
        from compiler.ir.clone import clone

        copy, where = clone(graph)
        copy.set_outputs([where(v) for v in values], names)
        outs = [interpret(copy, s) for s in samples]
        return {id(v): (min(float(o[n].min()) for o in outs), max(float(o[n].max()) for o in outs))
                for v, n in zip(values, names)}
    return calibrate


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _run(graph, p):
    PassManager([p], [Verify()]).run(graph)
    verify(graph)


def test_static_structure_and_numbers():
    g = _mlp()
    samples = _feeds()
    want = [interpret(g, s)["y"] for s in samples]
    p = Quantize(QuantizeOptions(), _minmax(samples))
    _run(g, p)
    assert len(p.quantized) == 2 and p.refusals == {}
    ops = [n.op.name for n in g.nodes]
    assert ops == ["QuantizeLinear", "MatMulInteger", "Cast", "Mul", "Add", "Relu",
                   "QuantizeLinear", "MatMulInteger", "Cast", "Mul"]
    mmi = [n for n in g.nodes if n.op.name == "MatMulInteger"]
    assert [n.inputs[1].dtype.name for n in mmi] == ["i8", "i8"]
    assert [n.inputs[0].dtype.name for n in mmi] == ["u8", "u8"]
    assert all(np.abs(n.inputs[1].const).max() <= 127 for n in mmi)  # symmetric weights: never -128
    for s, w in zip(samples, want):
        assert _cosine(interpret(g, s)["y"], w) > 0.999


def test_dynamic_structure_and_numbers():
    g = _mlp()
    samples = _feeds(3, seed=1)
    want = [interpret(g, s)["y"] for s in samples]
    _run(g, Quantize(QuantizeOptions(mode="int8-dynamic", per_channel=True)))
    assert [n.op.name for n in g.nodes][:5] == ["DynamicQuantizeLinear", "Mul", "MatMulInteger", "Cast", "Mul"]
    assert g.output_names == ["y"]
    for s, w in zip(samples, want):
        assert _cosine(interpret(g, s)["y"], w) > 0.999


def test_the_integer_part_is_exact():
    """x on the grid of its scale and W on the grid of its own: quantizing loses nothing, so the
    int8 product is the float product exactly (the int32 sums are exact; the scales are powers of 2)."""
    w = np.zeros((4, 3), np.float32)
    w.flat[:] = (np.arange(12) - 6) * 0.5
    w[0, 0] = -63.5  # max|W| = 127 * 0.5: the weight scale is 0.5
    g = ir("""
    graph @one(%x: f32[2,4]) -> (y: f32[2,3]) {
      %w = const f32[4,3]
      %0 = MatMul(%x, %w) : f32[2,3]
      return y=%0
    }""", {"w": w})
    x = np.array([[0, 1, 2, 3], [-4, 5, -6, 7]], np.float32) * np.float32(0.25)
    want = interpret(g, {"x": x})["y"]
    # the range [-32, 31.75] is 255 steps of 0.25 (zero point 128)
    _run(g, Quantize(QuantizeOptions(), lambda graph, vs: {id(v): (-32.0, 31.75) for v in vs}))
    q = next(n for n in g.nodes if n.op.name == "QuantizeLinear")
    assert float(q.inputs[1].const) == 0.25 and int(q.inputs[2].const) == 128
    np.testing.assert_array_equal(interpret(g, {"x": x})["y"], want)


def test_refusals_say_why():
    g = ir("""
    graph @r(%x: f32[1,4,5,5], %a: f32[2,8], %b: f32[8,4]) -> (y: f32[1,2,3,3], z: f32[2,4], u: f32[2,4]) {
      %wc = const f32[2,2,3,3]
      %w = const f32[8,4]
      %0 = Conv(%x, %wc) {group=2} : f32[1,2,3,3] @"grouped"
      %1 = MatMul(%a, %b) : f32[2,4] @"dynamic_weights"
      %2 = MatMul(%a, %w) : f32[2,4] @"kept"
      return y=%0, z=%1, u=%2
    }""", {"wc": RNG.standard_normal((2, 2, 3, 3)).astype(np.float32),
          "w": RNG.standard_normal((8, 4)).astype(np.float32)})
    p = Quantize(QuantizeOptions(mode="int8-dynamic", exclude=("kept",)))
    changed = PassManager([p]).run(g).records[0].changed
    assert not changed
    assert p.refusals == {"grouped": "a grouped convolution (no fast int8 kernel for it yet: it stays float; "
                                     "static int8 reads a depthwise one's input as uint8)",
                          "dynamic_weights": "the weights are not constant", "kept": "excluded by the options"}
    p2 = Quantize(QuantizeOptions(mode="int8-dynamic", exclude=("MatMul",)))
    PassManager([p2]).run(g)
    assert p2.refusals["kept"] == "excluded by the options"


@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_becomes_conv_integer(per_channel):
    g = ir("""
    graph @c(%x: f32[1,3,7,7]) -> (y: f32[1,2,4,4]) {
      %w = const f32[2,3,3,3]
      %b = const f32[2]
      %0 = Conv(%x, %w, %b) {pads=[1, 1, 1, 1], strides=[2, 2]} : f32[1,2,4,4]
      %1 = Relu(%0) : f32[1,2,4,4]
      return y=%1
    }""", {"w": WC, "b": np.array([0.5, -0.25], np.float32)})
    samples = _feeds_conv()
    want = [interpret(g, s)["y"] for s in samples]
    _run(g, Quantize(QuantizeOptions(per_channel=per_channel), _minmax(samples)))
    assert [n.op.name for n in g.nodes] == ["QuantizeLinear", "ConvInteger", "Cast", "Mul", "Add", "Relu"]
    conv = g.nodes[1]
    assert conv.op.pads == (1, 1, 1, 1) and conv.op.strides == (2, 2) and conv.inputs[1].dtype.name == "i8"
    assert g.nodes[3].inputs[1].const.shape == ((2, 1, 1) if per_channel else ())
    assert g.nodes[4].inputs[1].const.shape == (2, 1, 1)
    for s, w in zip(samples, want):
        assert _cosine(interpret(g, s)["y"], w) > 0.999


def _feeds_conv(n=4):
    rng = np.random.default_rng(7)
    return [{"x": rng.standard_normal((1, 3, 7, 7)).astype(np.float32)} for _ in range(n)]


def test_scales_and_zero_points():
    s, z = activation_params(-1.0, 3.0, symmetric=False)
    assert s == np.float32(4.0 / 255) and z == 64 and z.dtype == np.uint8
    s, z = activation_params(0.5, 2.0, symmetric=False)  # the range is extended to 0
    assert s == np.float32(2.0 / 255) and z == 0
    s, z = activation_params(-2.0, 1.0, symmetric=True)
    assert s == np.float32(2.0 / 127) and z == 0 and z.dtype == np.int8
    assert activation_params(0.0, 0.0, symmetric=False) == (np.float32(1.0), 0)
    w = np.array([[1.0, -0.5, 0.0], [-2.54, 0.25, 0.0]], np.float32)
    np.testing.assert_array_equal(weight_scales(w, True), np.float32([2.54 / 127, 0.5 / 127, 1.0]))
    assert weight_scales(w, False) == np.float32(2.54 / 127)
    with pytest.raises(ValueError, match="not finite"):
        activation_params(-np.inf, 1.0, symmetric=False)


def test_options_are_checked():
    with pytest.raises(OptionError, match="quantize mode must be one of int8, int8-dynamic"):
        QuantizeOptions(mode="int4")
    with pytest.raises(OptionError, match="calibrator must be one of minmax, percentile, entropy"):
        QuantizeOptions(calibrator="kl")
    with pytest.raises(OptionError, match="percentile must be in"):
        QuantizeOptions(calibrator="percentile", percentile=30)
    with pytest.raises(OptionError, match="needs calibration data"):
        Quantize(QuantizeOptions())
    assert CompileOptions(quantize="int8-dynamic").quantize == QuantizeOptions(mode="int8-dynamic")
    with pytest.raises(OptionError, match="mode name or QuantizeOptions"):
        CompileOptions(quantize=8)


def test_products_one_after_another():
    """The second product reads the first's result, which the first's rewrite replaces."""
    g = ir("""
    graph @two(%x: f32[4,16]) -> (y: f32[4,3]) {
      %w1 = const f32[16,8]
      %w2 = const f32[8,3]
      %0 = MatMul(%x, %w1) : f32[4,8]
      %1 = MatMul(%0, %w2) : f32[4,3]
      return y=%1
    }""", {"w1": W1.T.copy(), "w2": W2})
    samples = _feeds()
    want = [interpret(g, s)["y"] for s in samples]
    _run(g, Quantize(QuantizeOptions(), _minmax(samples)))  # the verifier runs after it
    assert [n.op.name for n in g.nodes].count("MatMulInteger") == 2
    for s, w in zip(samples, want):
        assert _cosine(interpret(g, s)["y"], w) > 0.999


@pytest.mark.parametrize("shared", [True, False])
def test_a_residual_reads_the_quantized_value(shared):
    """A value quantized for a product and also added to a later result (a residual connection) is
    read by the Add dequantized from the same uint8 tensor (``int8_residuals``, the default): the
    QuantizeLinear moves right after the value; off, the Add reads the float value. Both stay close
    to float."""
    rng = np.random.default_rng(11)
    w1, w2 = (rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32), (rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32)
    g = ir("""
    graph @res(%x: f32[1,4,5,5]) -> (y: f32[1,4,5,5]) {
      %w1 = const f32[4,4,1,1]
      %w2 = const f32[4,4,1,1]
      %0 = Conv(%x, %w1) : f32[1,4,5,5]
      %1 = Relu(%0) : f32[1,4,5,5]
      %2 = Conv(%1, %w2) : f32[1,4,5,5]
      %3 = Add(%2, %1) : f32[1,4,5,5]
      return y=%3
    }""", {"w1": w1, "w2": w2})
    samples = [{"x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)} for _ in range(4)]
    want = [interpret(g, s)["y"] for s in samples]
    p = Quantize(QuantizeOptions(int8_residuals=shared), _minmax(samples))
    _run(g, p)
    add = next(n for n in g.nodes if n.op.name == "Add" and n.inputs[1].producer is not None
               and n.inputs[1].producer.op.name in ("Relu", "DequantizeLinear"))
    src = add.inputs[1].producer
    if shared:
        assert src.op.name == "DequantizeLinear" and src.inputs[0].producer.op.name == "QuantizeLinear"
        q = src.inputs[0].producer
        assert q.inputs[0].producer.op.name == "Relu" and q.output.users[0].op.name in ("ConvInteger", "DequantizeLinear")
        assert len(p.shared) == 1
    else:
        assert src.op.name == "Relu" and p.shared == []
    for s, w in zip(samples, want):
        assert _cosine(interpret(g, s)["y"], w) > 0.999


W1X1 = RNG.standard_normal((2, 2, 2, 1, 1)).astype(np.float32)


def _stem():
    """A ResNet stem: Conv -> Relu -> MaxPool, the pool read by two convolutions."""
    return ir("""
    graph @stem(%x: f32[1,3,9,9]) -> (y: f32[1,2,5,5], z: f32[1,2,5,5]) {
      %wc = const f32[2,3,3,3]
      %w2 = const f32[2,2,1,1]
      %w3 = const f32[2,2,1,1]
      %0 = Conv(%x, %wc) {pads=[1, 1, 1, 1]} : f32[1,2,9,9]
      %1 = Relu(%0) : f32[1,2,9,9]
      %2 = MaxPool(%1) {kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]} : f32[1,2,5,5] @"pool"
      %3 = Conv(%2, %w2) {pads=[0, 0, 0, 0], strides=[1, 1]} : f32[1,2,5,5]
      %4 = Conv(%2, %w3) : f32[1,2,5,5]
      return y=%3, z=%4
    }""", {"wc": WC, "w2": W1X1[0], "w3": W1X1[1]})


def test_max_pooling_runs_on_the_quantized_values():
    """Structure: QuantizeLinear(MaxPool(y)) becomes MaxPool(QuantizeLinear(y)), the pool on uint8,
    one for both convolutions reading it (they share its quantization); numbers: exactly the results of quantizing after the pool
    (the same pass with the move turned off); refusal: a pool with a float reader stays float."""
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 3, 9, 9)).astype(np.float32)} for i in range(4)]
    g = _stem()
    p = Quantize(QuantizeOptions(), _minmax(samples))
    _run(g, p)
    pools = [n for n in g.nodes if n.op.name == "MaxPool"]
    assert pools and all(n.inputs[0].dtype.name == "u8" and n.inputs[0].producer.op.name == "QuantizeLinear"
                         for n in pools), [n.describe() for n in pools]
    assert p.pooled_in_int8 == ["pool"] and len(pools) == 1  # one quantization for both readers
    # one QuantizeLinear per quantized value (the input; the pool's input), however many products read it
    assert [n.op.name for n in g.nodes].count("QuantizeLinear") == 2
    kept = _stem()
    off = Quantize(QuantizeOptions(), _minmax(samples))
    off._pool_in_int8 = lambda graph: None
    _run(kept, off)
    assert next(n for n in kept.nodes if n.op.name == "MaxPool").inputs[0].dtype.name == "f32"
    for s in samples:
        got, want = interpret(g, s), interpret(kept, s)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    g = _stem()
    g.set_outputs(list(g.outputs) + [next(n for n in g.nodes if n.op.name == "MaxPool").outputs[0]],
                  ["y", "z", "pooled"])
    p = Quantize(QuantizeOptions(), _minmax(samples))
    _run(g, p)
    assert p.pooled_in_int8 == []
    assert next(n for n in g.nodes if n.op.name == "MaxPool").inputs[0].dtype.name == "f32"


WDW = (RNG.standard_normal((4, 1, 3, 3)) * 0.5).astype(np.float32)
W_EXPAND = (RNG.standard_normal((4, 2, 1, 1)) * 0.5).astype(np.float32)
W_PROJECT = (RNG.standard_normal((2, 4, 1, 1)) * 0.5).astype(np.float32)


def _inverted_residual(tail="Conv"):
    """A MobileNetV2 block: 1x1 expand, ReLU6, depthwise 3x3, ReLU6, then ``tail``: the 1x1 project
    ("Conv") or a float reader of the depthwise result (a "Sigmoid")."""
    last = ("%5 = Conv(%4, %w3) : f32[1,2,6,6]" if tail == "Conv" else "%5 = Sigmoid(%4) : f32[1,4,6,6]")
    return ir(f"""
    graph @block(%x: f32[1,2,6,6]) -> (y: f32[1,{2 if tail == "Conv" else 4},6,6]) {{
      %w1 = const f32[4,2,1,1]
      %wd = const f32[4,1,3,3]
      %w3 = const f32[2,4,1,1]
      %lo = const f32[] dense<0.0>
      %hi = const f32[] dense<6.0>
      %0 = Conv(%x, %w1) : f32[1,4,6,6]
      %1 = Clip(%0, %lo, %hi) : f32[1,4,6,6]
      %3 = Conv(%1, %wd) {{group=4, kernel_shape=[3, 3], pads=[1, 1, 1, 1]}} : f32[1,4,6,6] @"dw"
      %4 = Clip(%3, %lo, %hi) : f32[1,4,6,6]
      {last}
      return y=%5
    }}""", {"w1": W_EXPAND, "wd": WDW, "w3": W_PROJECT})


@pytest.mark.parametrize("depthwise", [True, False])
def test_a_depthwise_conv_reads_its_input_as_uint8(depthwise):
    """Structure: the depthwise conv (no int8 kernel: it stays float) reads DequantizeLinear(
    QuantizeLinear(x)) (``int8_depthwise``, the default), so the expand layer's chain ends in a
    QuantizeLinear; it counts as a quantized layer (the report's). Off: it reads the float value.
    Numbers: both close to float. Refusals: a depthwise conv whose result has a float reader is left
    alone, and so is an excluded one."""
    rng = np.random.default_rng(12)
    samples = [{"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)} for _ in range(4)]
    g = _inverted_residual()
    want = [interpret(g, s)["y"] for s in samples]
    p = Quantize(QuantizeOptions(int8_depthwise=depthwise), _minmax(samples))
    _run(g, p)
    dw = next(n for n in g.nodes if n.name == "dw" and n.op.name == "Conv")
    src = dw.inputs[0].producer
    if depthwise:
        assert src.op.name == "DequantizeLinear" and src.inputs[0].producer.op.name == "QuantizeLinear"
        assert src.inputs[0].producer.inputs[0].producer.op.name == "Clip"
        assert "dw" in p.quantized and p.results["dw"] is dw.outputs[0]
        assert p.uint8_inputs == ["dw"] and "dw" not in p.refusals  # its arithmetic is float, its input uint8
    else:
        assert src.op.name == "Clip" and "dw" not in p.quantized and p.uint8_inputs == []
        assert p.refusals["dw"].startswith("a grouped convolution")
    for s, w in zip(samples, want):
        assert _cosine(interpret(g, s)["y"], w) > 0.999

    g = _inverted_residual(tail="Sigmoid")
    p = Quantize(QuantizeOptions(), _minmax(samples))
    _run(g, p)
    assert next(n for n in g.nodes if n.name == "dw" and n.op.name == "Conv").inputs[0].producer.op.name == "Clip"
    g = _inverted_residual()
    p = Quantize(QuantizeOptions(exclude=("dw",)), _minmax(samples))
    _run(g, p)
    assert next(n for n in g.nodes if n.name == "dw" and n.op.name == "Conv").inputs[0].producer.op.name == "Clip"
    assert "dw" not in p.quantized and p.refusals["dw"] == "excluded by the options"
