"""fold-quantize-scale (compiler/passes/quantize_scale.py): a QuantizeLinear's division goes into
the constants of the linear ops before it. Structure (the constants divided, the scale 1, nothing
else touched), numbers (the reference interpreter before and after: the same bytes but for values
on a rounding boundary, one step apart there) and refusals (why a QuantizeLinear keeps its
division)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.interpreter import interpret
from compiler.passes.manager import PassManager, Verify
from compiler.passes.pipeline import all_pass_names
from compiler.passes.quantize_scale import FoldQuantizeScale

from .util import ir

RESCALE = """graph @g(%acc: i32[64,3], %r: u8[64,3]) -> (y: u8[64,3]{outs}) {{
  %c = const f32[3] dense<[0.031, 0.0047, 0.22]>
  %b = const f32[3] dense<[0.5, -1.25, 3.0]>
  %sr = const f32[] dense<0.07>
  %zr = const u8[] dense<9>
  %lo = const f32[] dense<0.0>
  %hi = const f32[] dense<6.0>
  %sy = const f32[] dense<{sy}>
  %zy = const u8[] dense<5>
  %0 = Cast(%acc) {{to=f32}} : f32[64,3]
  %1 = Mul(%0, %c) : f32[64,3]
  %2 = Add(%1, %b) : f32[64,3]
  %3 = DequantizeLinear(%r, %sr, %zr) : f32[64,3]
  %4 = Add(%2, %3) : f32[64,3]
  %5 = {act} : f32[64,3]
  %6 = QuantizeLinear(%5, %sy, %zy) : u8[64,3] @"q"
  return y=%6{ret}
}}"""


def _rescale(act="Clip(%4, %lo, %hi)", sy="0.0235", outs="", ret=""):
    return ir(RESCALE.format(act=act, sy=sy, outs=outs, ret=ret))


def _feeds(seed=0):
    rng = np.random.default_rng(seed)
    return {"acc": rng.integers(-3000, 3000, (64, 3)).astype(np.int32),
            "r": rng.integers(0, 256, (64, 3)).astype(np.uint8)}


def _run(g):
    p = FoldQuantizeScale()
    PassManager([p], [Verify()]).run(g)
    return p


def _consts(g, op):
    return [[None if v is None else v.const for v in n.inputs] for n in g.nodes if n.op.name == op]


def test_the_division_goes_into_the_rescale_the_residual_and_the_clamp():
    g = _rescale()
    feeds = _feeds()
    want = interpret(g, feeds)["y"]
    p = _run(g)
    assert p.folded == ["q"] and p.kept == {}
    assert [n.op.name for n in g.nodes] == ["Cast", "Mul", "Add", "DequantizeLinear", "Add", "Clip", "QuantizeLinear"]
    sy = np.float64(np.float32(0.0235))
    (mul,), (add1, _) = _consts(g, "Mul"), _consts(g, "Add")
    np.testing.assert_array_equal(mul[1], (np.array([0.031, 0.0047, 0.22], np.float32) / sy).astype(np.float32))
    np.testing.assert_array_equal(add1[1], (np.array([0.5, -1.25, 3.0], np.float32) / sy).astype(np.float32))
    (dq,), (clip,), (q,) = _consts(g, "DequantizeLinear"), _consts(g, "Clip"), _consts(g, "QuantizeLinear")
    assert dq[1] == np.float32(np.float64(np.float32(0.07)) / sy) and dq[2] == 9
    assert clip[1] == 0 and clip[2] == np.float32(6.0 / sy)
    assert q[1] == 1.0 and q[2] == 5
    got = interpret(g, feeds)["y"]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_numbers_differ_only_on_rounding_boundaries():
    """On 100,000 random sums: at most a few in 10,000 one step apart (where ``y / s`` is within
    float32 rounding of a half), none further."""
    g = ir(RESCALE.format(act="Relu(%4)", sy="0.0235", outs="", ret="").replace("64,3", "100000,3"))
    rng = np.random.default_rng(1)
    feeds = {"acc": rng.integers(-3000, 3000, (100000, 3)).astype(np.int32),
             "r": rng.integers(0, 256, (100000, 3)).astype(np.uint8)}
    want = interpret(g, feeds)["y"].astype(int)
    assert _run(g).folded
    got = interpret(g, feeds)["y"].astype(int)
    assert np.abs(got - want).max() <= 1
    assert (got != want).mean() < 1e-3
    assert 0 < np.mean((want > 0) & (want < 255))  # (not all saturated)


def test_a_depthwise_convolution_takes_it_in_its_weights_and_bias():
    g = ir("""graph @g(%x: u8[1,4,6,6]) -> (y: u8[1,4,6,6]) {
  %sx = const f32[] dense<0.05>
  %zx = const u8[] dense<3>
  %w = const f32[4,1,3,3]
  %b = const f32[4]
  %sy = const f32[] dense<0.013>
  %zy = const u8[] dense<0>
  %0 = DequantizeLinear(%x, %sx, %zx) : f32[1,4,6,6]
  %1 = Conv(%0, %w, %b) {group=4, pads=[1, 1, 1, 1]} : f32[1,4,6,6]
  %2 = QuantizeLinear(%1, %sy, %zy) : u8[1,4,6,6]
  return y=%2
}""", {"w": np.random.default_rng(3).normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32),
       "b": np.array([0.5, -0.2, 0.0, 1.5], np.float32)})
    w, b = (g.nodes[1].inputs[i].const.copy() for i in (1, 2))
    feeds = {"x": np.random.default_rng(2).integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)}
    want = interpret(g, feeds)["y"].astype(int)
    assert _run(g).folded
    conv = next(n for n in g.nodes if n.op.name == "Conv")
    s = np.float64(np.float32(0.013))
    np.testing.assert_array_equal(conv.inputs[1].const, (w.astype(np.float64) / s).astype(np.float32))
    np.testing.assert_array_equal(conv.inputs[2].const, (b.astype(np.float64) / s).astype(np.float32))
    assert next(n for n in g.nodes if n.op.name == "DequantizeLinear").inputs[1].const == np.float32(0.05)
    assert np.abs(interpret(g, feeds)["y"].astype(int) - want).max() <= 1


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_numbers_on_empty_single_and_batched_tensors(rows):
    """The rescale chain on 0, 1 and 5 rows (one step at most, the same shapes), and a depthwise
    convolution on two images and on none."""
    g = ir(RESCALE.format(act="Relu(%4)", sy="0.0235", outs="", ret="").replace("64,3", f"{rows},3"))
    feeds = {k: v[:rows] for k, v in _feeds().items()}
    want = interpret(g, feeds)["y"].astype(int)
    assert _run(g).folded == ["q"]
    got = interpret(g, feeds)["y"].astype(int)
    assert got.shape == want.shape == (rows, 3) and (rows == 0 or np.abs(got - want).max() <= 1)
    n = 2 if rows else 0
    conv = ir(f"""graph @g(%x: u8[{n},3,5,5]) -> (y: u8[{n},3,5,5]) {{
  %sx = const f32[] dense<0.05>
  %zx = const u8[] dense<3>
  %w = const f32[3,1,3,3]
  %sy = const f32[] dense<0.013>
  %zy = const u8[] dense<0>
  %0 = DequantizeLinear(%x, %sx, %zx) : f32[{n},3,5,5]
  %1 = Conv(%0, %w) {{group=3, pads=[1, 1, 1, 1]}} : f32[{n},3,5,5]
  %2 = QuantizeLinear(%1, %sy, %zy) : u8[{n},3,5,5] @"q"
  return y=%2
}}""", {"w": np.random.default_rng(4).normal(0, 0.3, (3, 1, 3, 3)).astype(np.float32)})
    x = {"x": np.random.default_rng(5).integers(0, 256, (n, 3, 5, 5)).astype(np.uint8)}
    want = interpret(conv, x)["y"].astype(int)
    assert _run(conv).folded == ["q"]
    got = interpret(conv, x)["y"].astype(int)
    assert got.shape == want.shape and (n == 0 or np.abs(got - want).max() <= 1)


@pytest.mark.parametrize("act,sy,outs,ret,why", [
    ("Relu(%4)", "0.0235", ", z: f32[64,3]", ", z=%4", "Add's result is read by other ops too"),
    ("Sigmoid(%4)", "0.0235", "", "", "its input is computed by Sigmoid, not a linear op of constants the "
                                      "division can go into"),
    ("Relu(%4)", "1.0", "", "", "its scale is 1 already"),
    ("Relu(%4)", "-0.5", "", "", "its scale is not positive and finite"),
])
def test_refusals_say_why(act, sy, outs, ret, why):
    g = _rescale(act, sy, outs, ret)
    before = [[v.const if v is not None and v.const is not None else v for v in n.inputs] for n in g.nodes]
    p = _run(g)
    assert p.folded == [] and p.kept == {"q": why}
    after = [[v.const if v is not None and v.const is not None else v for v in n.inputs] for n in g.nodes]
    assert len(before) == len(after)
    for xs, ys in zip(before, after):
        for x, y in zip(xs, ys):
            assert (x is y) if not isinstance(x, np.ndarray) else np.array_equal(x, y)


def test_more_refusals():
    g = ir("""graph @g(%x: f32[8], %m: f32[8], %c: f32[3,8]) -> (y: u8[8], z: u8[8], w: u8[3,8]) {
  %s = const f32[] dense<0.1>
  %sc = const f32[3] dense<[0.1, 0.2, 0.3]>
  %z = const u8[] dense<0>
  %zc = const u8[3] dense<[0, 0, 0]>
  %0 = QuantizeLinear(%x, %s, %z) : u8[8] @"input"
  %1 = Mul(%x, %m) : f32[8]
  %2 = QuantizeLinear(%1, %s, %z) : u8[8] @"product"
  %3 = QuantizeLinear(%c, %sc, %zc) {axis=0} : u8[3,8] @"per-channel"
  return y=%0, z=%2, w=%3
}""")
    p = _run(g)
    assert p.folded == [] and p.kept == {"input": "its input is a graph input",
                                         "product": "a Mul without a constant float32 operand",
                                         "per-channel": "its scale is not one constant float32"}


def test_in_the_pipeline():
    names = all_pass_names()
    assert names.index("drop-saturated-clamps") < names.index("fold-quantize-scale") < names.index("fuse")
