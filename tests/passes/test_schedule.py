"""schedule-memory: structure (the order it picks, still topological), numbers (the interpreter
agrees), the peak it reports, and refusals (control flow; an order already best stays)."""
from __future__ import annotations

import numpy as np

from compiler.passes.pipeline import pipeline
from compiler.passes.options import CompileOptions
from compiler.passes.schedule import ScheduleForMemory, peak_bytes

from .util import ir, run_pass

V = np.ones((256, 1), np.float32)

# two branches that each expand to 256 KiB and reduce to 1 KiB: the given order holds both
# expansions at once; finishing one branch first holds one
BRANCHES = """
graph @t(%x: f32[256,256]) -> (y: f32[256,1]) {
  %v = const f32[256,1]
  %0 = Exp(%x) : f32[256,256]
  %1 = Tanh(%x) : f32[256,256]
  %2 = Sigmoid(%x) : f32[256,256]
  %3 = MatMul(%0, %v) : f32[256,1]
  %4 = MatMul(%1, %v) : f32[256,1]
  %5 = MatMul(%2, %v) : f32[256,1]
  %6 = Add(%3, %4) : f32[256,1]
  %7 = Add(%6, %5) : f32[256,1]
  return y=%7
}"""


def _topological(g):
    seen = {id(v) for v in g.inputs} | {id(c) for c in g.constants}
    for n in g.nodes:
        assert all(v is None or id(v) in seen for v in n.inputs), n.describe()
        seen |= {id(v) for v in n.outputs}


def test_finishes_a_branch_before_starting_the_next():
    g = ir(BRANCHES, {"v": V})
    before = peak_bytes(g)
    assert before == 3 * 256 * 1024 + 1024
    p = ScheduleForMemory()
    assert run_pass(p, g)  # the interpreter agrees before and after
    _topological(g)
    assert [n.op.name for n in g.nodes] == ["Exp", "MatMul", "Tanh", "MatMul", "Add", "Sigmoid", "MatMul", "Add"]
    assert peak_bytes(g) == p.report["after"] < before
    assert peak_bytes(g) <= 256 * 1024 + 3 * 1024
    assert p.report["before"] == before


def test_running_twice_changes_nothing():
    g = ir(BRANCHES, {"v": V})
    assert run_pass(ScheduleForMemory(), g)
    order = [id(n) for n in g.nodes]
    assert not run_pass(ScheduleForMemory(), g)
    assert [id(n) for n in g.nodes] == order


def test_keeps_a_chain_and_views_share_their_input():
    g = ir("""
    graph @t(%x: f32[64,64]) -> (y: f32[4096]) {
      %s = const i64[1] dense<[4096]>
      %0 = Exp(%x) : f32[64,64]
      %1 = Reshape(%0, %s) : f32[4096]
      %2 = Neg(%1) : f32[4096]
      return y=%2
    }""")
    assert peak_bytes(g) == 2 * 64 * 64 * 4  # the Reshape allocates nothing
    assert not run_pass(ScheduleForMemory(), g)


def test_refuses_control_flow():
    g = ir("""
    graph @main(%c: bool[], %x: f32[2,2]) -> (y: f32[2,2], z: f32[2,2]) {
      %w = const f32[2] dense<[1.0, 2.0]>
      %1 = Exp(%x) : f32[2,2]
      %0 = If(%c, %x, %w) {else_branch=graph @else(%x: f32[2,2], %w: f32[2]) -> (y: f32[2,2]) {
        %0 = Neg(%x) : f32[2,2]
        return y=%0
      }, then_branch=graph @then(%x: f32[2,2], %w: f32[2]) -> (y: f32[2,2]) {
        %0 = Mul(%x, %w) : f32[2,2]
        return y=%0
      }} : f32[2,2]
      return y=%0, z=%1
    }""")
    p = ScheduleForMemory()
    order = [id(n) for n in g.nodes]
    assert not p.run(g)
    assert p.report == {"refused": 1}
    assert [id(n) for n in g.nodes] == order


def test_in_the_O2_recipe_last():
    names = [p.name for p in pipeline(CompileOptions(opt_level=2))]
    assert names[-1] == "schedule-memory"
    assert "schedule-memory" not in [p.name for p in pipeline(CompileOptions(opt_level=1))]
