"""drop-saturated-clamps (compiler/passes/saturated_clamps.py): a Relu/Clip read only by
QuantizeLinears that already clip it goes. Structure (the clamp gone, the QuantizeLinear reading its
input), numbers (the reference interpreter gives the same bytes before and after, values past both
bounds and NaN included) and refusals (why a clamp stays)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.interpreter import interpret
from compiler.passes.manager import PassManager, Verify
from compiler.passes.pipeline import all_pass_names
from compiler.passes.saturated_clamps import DropSaturatedClamps

from .util import ir


def _graph(act: str, scale: float, zero: int = 0, qtype: str = "u8", extra: str = ""):
    """y = QuantizeLinear(act(x)), ``extra`` another output line."""
    return ir(f"""
    graph @g(%x: f32[64]) -> (y: {qtype}[64]{", z: f32[64]" if extra else ""}) {{
      %lo = const f32[] dense<0.0>
      %hi = const f32[] dense<6.0>
      %s = const f32[] dense<{scale}>
      %z = const {qtype}[] dense<{zero}>
      %0 = {act} : f32[64] @"act"
      %1 = QuantizeLinear(%0, %s, %z) : {qtype}[64]
      return y=%1{extra}
    }}""")


def _x():
    x = np.linspace(-9, 9, 64).astype(np.float32)
    x[[3, 17]] = np.nan
    x[5], x[60] = -np.inf, np.inf
    return {"x": x}


def _run(g):
    p = DropSaturatedClamps()
    PassManager([p], [Verify()]).run(g)
    return p


@pytest.mark.parametrize("act,scale,zero,qtype", [
    ("Relu(%x)", 0.02, 0, "u8"),                 # q(0) = 0, the lowest uint8
    ("Clip(%x, %lo, %hi)", 6 / 255, 0, "u8"),    # ReLU6 before its calibrated range [0, 6]
    ("Clip(%x, %lo, %hi)", 0.02, 0, "u8"),       # q(6) = 300 saturates at 255
    ("Relu(%x)", 0.05, -128, "i8"),              # int8 with its zero point at the bottom
])
def test_a_saturated_clamp_goes(act, scale, zero, qtype):
    g = _graph(act, scale, zero, qtype)
    want = interpret(g, _x())["y"]
    p = _run(g)
    assert [n.op.name for n in g.nodes] == ["QuantizeLinear"] and g.nodes[0].inputs[0].name == "x"
    assert p.dropped == ["act"]
    np.testing.assert_array_equal(interpret(g, _x())["y"], want)


@pytest.mark.parametrize("act,scale,zero,extra,why", [
    ("Relu(%x)", 0.02, 3, "", "Relu is not made redundant by the quantization after it (its bounds map inside "
                              "[0, 255])"),
    ("Clip(%x, %lo, %hi)", 0.1, 0, "", "Clip is not made redundant by the quantization after it (its bounds map "
                                       "inside [0, 255])"),
    ("Relu(%x)", 0.02, 0, ", z=%0", "read by other ops than QuantizeLinears by one constant scale to int8/uint8"),
])
def test_refusals_say_why(act, scale, zero, extra, why):
    g = _graph(act, scale, zero, extra=extra)
    want = interpret(g, _x())
    p = _run(g)
    assert "Relu" in [n.op.name for n in g.nodes] or "Clip" in [n.op.name for n in g.nodes]
    assert p.kept == {"act": why} and p.dropped == []
    got = interpret(g, _x())
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_in_the_pipeline():
    names = all_pass_names()
    assert names.index("quantize") < names.index("drop-saturated-clamps") < names.index("fuse")
