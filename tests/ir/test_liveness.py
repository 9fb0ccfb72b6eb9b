"""ir/liveness.py: the live ranges that memory-aware scheduling and the program builder share."""
from __future__ import annotations

from compiler.codegen.llvm.target import host_target
from compiler.codegen.program import build_program
from compiler.ir.liveness import LiveRanges, live_ranges, peak
from compiler.ir.parser import parse
from compiler.passes.schedule import peak_bytes

CHAIN = """
graph @t(%x: f32[64,64]) -> (y: f32[64,64], z: f32[64,64]) {
  %0 = Exp(%x) : f32[64,64]
  %1 = Neg(%0) : f32[64,64]
  %2 = Tanh(%x) : f32[64,64]
  %3 = Add(%1, %0) : f32[64,64]
  %4 = Sigmoid(%2) : f32[64,64]
  return y=%3, z=%2
}"""


def test_ranges_from_the_writer_to_the_last_reader_and_outputs_to_the_end():
    g = parse(CHAIN)
    ranges = live_ranges(g.nodes, id, g.outputs)
    v = [n.outputs[0] for n in g.nodes]
    assert ranges.span(id(v[0])) == (0, 3)   # Exp: read by Neg and by Add
    assert ranges.span(id(v[1])) == (1, 3)
    assert ranges.span(id(v[2])) == (2, 5)   # a graph output: to the end
    assert ranges.span(id(v[3])) == (3, 5)
    assert ranges.span(id(v[4])) == (4, 4)   # nothing reads it: it dies where it is made
    assert id(g.inputs[0]) not in ranges.start and ranges.end[id(g.inputs[0])] == 2


def test_a_shared_root_spans_every_value_on_it():
    g = parse(CHAIN)
    v = [n.outputs[0] for n in g.nodes]
    # %1 written over %0's buffer (as an in-place kernel or a view would)
    root = {id(v[1]): id(v[0])}
    ranges = live_ranges(g.nodes, lambda x: root.get(id(x), id(x)), g.outputs)
    assert ranges.span(id(v[0])) == (0, 3) and id(v[1]) not in ranges.start


def test_peak_is_the_largest_sum_over_a_step():
    r = LiveRanges(start={"a": 0, "b": 1, "c": 2}, end={"a": 1, "b": 2, "c": 2})
    size = {"a": 10, "b": 20, "c": 40}.get
    assert peak(r, size) == 60       # step 2 holds b and c
    assert peak(LiveRanges(), size) == 0


def test_the_scheduler_and_the_program_builder_agree():
    """The peak that schedule-memory minimizes is the lower bound of the arena the program builder
    plans (no fusion, no in-place: one buffer per result)."""
    g = parse(CHAIN)
    prog = build_program(g, host_target(), in_place=False)
    assert prog.memory_summary()["lower_bound_bytes"] == peak_bytes(g) == 4 * 64 * 64 * 4  # step 3: %0, %1, %2, %3
