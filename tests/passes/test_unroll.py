"""unroll-loops: Loops and Scans of a known, small iteration count become their bodies."""
from __future__ import annotations

import numpy as np

import compiler
from compiler.ir.interpreter import interpret
from compiler.passes.simplify.unroll import UnrollLoops

from .util import ir, run_pass

LOOP = """
graph @t(%x: f32[2]) -> (acc: f32[2], steps: f32[3,2]) {
  %n = const i64[] dense<3>
  %w = const f32[2] dense<[1.0, 2.0]>
  %0, %1 = Loop(%n, _, %x, %w) {body=graph @body(%i: i64[], %cond: bool[], %acc: f32[2], %w: f32[2]) -> (cond: bool[], acc: f32[2], step: f32[2]) {
    %k = Cast(%i) {to=f32} : f32[]
    %0 = Mul(%w, %k) : f32[2]
    %1 = Add(%acc, %0) : f32[2]
    return cond=%cond, acc=%1, step=%0
  }, num_captures=1} : f32[2], f32[3,2]
  return acc=%0, steps=%1
}"""

SCAN = """
graph @t(%s0: f32[2], %xs: f32[2,4]) -> (s: f32[2], ys: f32[4,2]) {
  %0, %1 = Scan(%s0, %xs) {body=graph @body(%s: f32[2], %x: f32[2]) -> (s: f32[2], y: f32[2]) {
    %0 = Add(%s, %x) : f32[2]
    %1 = Mul(%0, %x) : f32[2]
    return s=%0, y=%1
  }, num_scan_inputs=1, scan_input_axes=[1], scan_input_directions=[1], scan_output_directions=[1]} : f32[2], f32[4,2]
  return s=%0, ys=%1
}"""


def test_a_loop_of_known_count_becomes_its_body_three_times():
    g = ir(LOOP)
    assert run_pass(UnrollLoops(), g)
    assert not any(n.op.name == "Loop" for n in g.nodes)
    assert sum(n.op.name == "Add" for n in g.nodes) == 3
    assert g.outputs[1].type.shape == (3, 2)  # the stacked steps: known once unrolled


def test_a_scan_becomes_its_body_per_slice_backwards_and_prepended():
    """scan_input_axes=1 with direction 1 reads the columns last first; output direction 1 prepends."""
    g = ir(SCAN)
    assert run_pass(UnrollLoops(), g)
    assert not any(n.op.name == "Scan" for n in g.nodes)
    names = [n.op.name for n in g.nodes]
    assert names.count("Gather") == 4 and names.count("Concat") == 1


def test_refusals():
    unroll = UnrollLoops(max_nodes=8)
    g = ir(LOOP.replace("%n = const i64[] dense<3>", "%n = const i64[] dense<5>").replace("f32[3,2]", "f32[5,2]"))
    loop = next(n for n in g.nodes if n.op.name == "Loop")
    assert unroll.refusal(loop) == "5 iterations of 3 nodes are over 8 once unrolled"
    g = ir(LOOP.replace("return cond=%cond,", "%c = Less(%k, %k) : bool[]\n    return cond=%c,"))
    loop = next(n for n in g.nodes if n.op.name == "Loop")
    assert unroll.refusal(loop) == "its body computes the condition (it may stop early)"
    g = ir(LOOP.replace("%n = const i64[] dense<3>\n", "").replace("@t(%x: f32[2])", "@t(%x: f32[2], %n: i64[])")
           .replace("f32[3,2]", "f32[?,2]"))
    loop = next(n for n in g.nodes if n.op.name == "Loop")
    assert unroll.refusal(loop) == "its iteration count is not known at compile time"
    assert not unroll.run(g)
    g = ir(SCAN.replace("%xs: f32[2,4]", "%xs: f32[2,T]").replace("f32[4,2]", "f32[T,2]"))
    scan = next(n for n in g.nodes if n.op.name == "Scan")
    assert unroll.refusal(scan) == "its iteration count is not known at compile time"


def test_unrolled_loops_run_natively_and_agree_with_the_interpreter():
    for text in (LOOP, SCAN):
        g = ir(text)
        feeds = {v.name: np.random.default_rng(0).standard_normal(v.type.shape).astype(np.float32)
                 for v in g.inputs}
        want = interpret(ir(text), feeds)
        exe = compiler.compile(g)
        assert exe.fallback == []
        got = exe.run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6)
