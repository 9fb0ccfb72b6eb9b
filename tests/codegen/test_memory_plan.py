"""The arena plan: a checker that trusts no planner, run over random lifetimes and every suite
model's plan (arena within 5% of the lower bound), in-place reuse (where it applies, where it must
not, and that it never changes results), and the figures the manifest reports."""
from __future__ import annotations

import os

import numpy as np
import pytest

import compiler
from compiler.codegen.fusion import CPU_FUSION
from compiler.codegen.kernels.base import ALIGN
from compiler.codegen.llvm.target import host_target
from compiler.codegen.plan import Buffer, check_plan, live_bytes, lower_bound, plan_arena, plan_svg
from compiler.codegen.program import build_program
from compiler.driver import write_artifact
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.models import light_models, load_graph
from compiler.passes.manager import PassManager
from compiler.passes.options import CompileOptions
from compiler.passes.pipeline import pipeline
from compiler.tools import zoo


# -- the checker -----------------------------------------------------------------------------------

def test_check_plan_finds_overlap_misalignment_and_overflow():
    a, b = Buffer("a", 100, 0, 2, offset=0), Buffer("b", 100, 2, 3, offset=64)
    with pytest.raises(ValueError, match="overlaps"):
        check_plan([a, b], 256)
    b.offset = 128
    check_plan([a, b], 256)
    b.start = 3  # no longer live together: sharing is fine
    b.offset = 0
    check_plan([a, b], 256)
    with pytest.raises(ValueError, match="outside the arena"):
        check_plan([Buffer("c", 100, 0, 0, offset=200)], 256)
    with pytest.raises(ValueError, match="misaligned"):
        check_plan([Buffer("c", 10, 0, 0, offset=8)], 256)
    with pytest.raises(ValueError):
        check_plan([Buffer("c", 10, 0, 0)], 256)  # never placed


@pytest.mark.parametrize("seed", range(30))
def test_plans_of_random_lifetimes_are_valid_and_near_the_bound(seed):
    rng = np.random.default_rng(seed)
    bufs = []
    for i in range(int(rng.integers(1, 120))):
        s = int(rng.integers(0, 60))
        bufs.append(Buffer(f"b{i}", int(rng.integers(1, 1 << 20)), s, s + int(rng.integers(0, 8))))
    arena = plan_arena(bufs, ALIGN)
    check_plan(bufs, arena, ALIGN)
    assert arena >= lower_bound(bufs, ALIGN)
    assert arena <= 1.5 * lower_bound(bufs, ALIGN)
    naive = plan_arena(bufs, ALIGN, reuse=False)
    check_plan(bufs, naive, ALIGN)
    assert naive == sum(-(-max(b.size, 1) // ALIGN) * ALIGN for b in bufs)


def test_live_bytes_and_lower_bound():
    bufs = [Buffer("a", 64, 0, 1), Buffer("b", 128, 1, 2), Buffer("c", 1, 3, 3)]
    assert live_bytes(bufs) == [64, 192, 128, 64]
    assert lower_bound(bufs) == 192
    assert lower_bound([]) == 0


# -- every suite model -----------------------------------------------------------------------------

def _program(spec, **kw):
    g = load_graph(zoo.model_of(spec))
    PassManager(pipeline(CompileOptions(), CPU_FUSION)).run(g)
    return build_program(g, host_target(), **kw)


SUITE = [f"light:{m}" for m in light_models()] + ["zoo:mlp", "zoo:efficientnet_block?resolution=32"]
SLOW_SUITE = ["zoo:bert?layers=2,seq=32", "zoo:mobilenetv2?resolution=96"]


def _check_model(spec):
    prog = _program(spec)
    check_plan(prog.buffers, prog.arena_bytes, ALIGN)
    mem = prog.memory_summary()
    assert mem["lower_bound_bytes"] <= mem["arena_bytes"] <= 1.05 * mem["lower_bound_bytes"], (spec, mem)
    assert mem["naive_bytes"] >= mem["arena_bytes"]
    # every arena place is in a planned buffer (at its offset, or a concat piece's slice of it), and
    # in-place outputs share their input's
    assert all(any(b.offset <= p.where < b.offset + max(b.size, 1) for b in prog.buffers)
               for p in prog.places.values() if p.kind == "arena")
    for st in prog.steps:
        for k, j in st.in_place.items():
            g = st.group
            assert prog.places[id(g.outer_of(g.outputs[k]))] == prog.places[id(g.outer_of(g.inputs[j]))]


@pytest.mark.parametrize("spec", SUITE)
def test_suite_model_plans_are_valid_and_within_5_percent(spec):
    if spec.startswith("zoo:"):
        pytest.importorskip("torch")
    _check_model(spec)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SLOW_SUITE)
def test_suite_model_plans_zoo(spec):
    pytest.importorskip("torch")
    _check_model(spec)


# -- in-place reuse ----------------------------------------------------------------------------------

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 16)).astype(np.float32)

CHAIN = """graph @chain(%x: f32[8,16]) -> (y: f32[8,16], z: f32[8,16], v: f32[128]) {
  %w = const f32[16,16]
  %shape = const i64[1] dense<[128]>
  %0 = MatMul(%x, %w) : f32[8,16]
  %1 = Relu(%0) : f32[8,16]
  %2 = Sigmoid(%1) : f32[8,16]
  %3 = Add(%1, %2) : f32[8,16]
  %4 = Tanh(%3) : f32[8,16]
  %5 = Mul(%4, %x) : f32[8,16]
  %6 = Neg(%5) : f32[8,16]
  %7 = Exp(%6) : f32[8,16]
  %8 = Reshape(%7, %shape) : f32[128]
  %9 = Abs(%7) : f32[8,16]
  %10 = Sub(%9, %4) : f32[8,16]
  return y=%10, z=%6, v=%8
}"""


def chain_graph():
    return parse(CHAIN, weights={"w": W})


def test_in_place_applies_only_where_the_input_dies():
    prog = build_program(chain_graph(), host_target())
    placed = {st.group.node.op.name: st.in_place for st in prog.steps}
    # Relu over the MatMul result (dies there): in place
    assert placed["Relu"] == {0: 0}
    # Sigmoid reads %1, which Add reads later: not in place; both of Add's inputs die there
    assert placed["Sigmoid"] == {}
    assert placed["Add"] == {0: 0}
    # Tanh's result is read later (by Sub): Tanh may take %3 (dies there)
    assert placed["Tanh"] == {0: 0}
    # Mul reads the graph input %x and %4 (read later by Sub): nothing to overwrite
    assert placed["Mul"] == {}
    # Neg's result is the graph output z: Neg may overwrite %5; Exp must not overwrite z
    assert placed["Neg"] == {0: 0}
    assert placed["Exp"] == {}
    # Abs reads %7, which the view %9 (a graph output) keeps alive: not in place
    assert placed["Abs"] == {}
    assert placed["Sub"] == {0: 0}
    check_plan(prog.buffers, prog.arena_bytes, ALIGN)
    assert prog.memory_summary()["in_place"] == 5


def _run(prog, tmp_path, name, feeds):
    dest = str(tmp_path / f"{name}.kiln")
    write_artifact(prog, dest, host_target(), model_name=name)
    exe = compiler.load(dest)
    return exe.run(feeds), exe


def test_in_place_never_changes_results(tmp_path):
    feeds = {"x": RNG.standard_normal((8, 16)).astype(np.float32)}
    on, exe = _run(build_program(chain_graph(), host_target()), tmp_path, "on", feeds)
    off, _ = _run(build_program(chain_graph(), host_target(), in_place=False), tmp_path, "off", feeds)
    apart, _ = _run(build_program(chain_graph(), host_target(), reuse_memory=False), tmp_path, "apart", feeds)
    for k in on:
        np.testing.assert_array_equal(on[k], off[k])
        np.testing.assert_array_equal(on[k], apart[k])
    # outputs are copies: another run does not change them, and they are not the arena's memory
    kept = {k: v.copy() for k, v in on.items()}
    exe.run({"x": RNG.standard_normal((8, 16)).astype(np.float32)})
    for k in on:
        np.testing.assert_array_equal(on[k], kept[k])
        assert all(not np.shares_memory(on[k], m.host) for m in exe._arenas)


@pytest.mark.slow
def test_in_place_never_changes_a_suite_models_results(tmp_path):
    g = load_graph("light:squeezenet")
    # unfused, so that the Relus are kernels of their own and run in place
    PassManager([p for p in pipeline(CompileOptions(), CPU_FUSION) if p.name != "fuse"]).run(g)
    x = np.random.default_rng(0).standard_normal([int(d) for d in g.inputs[0].shape]).astype(np.float32)
    feeds = {g.inputs[0].name: x}
    prog = build_program(g, host_target())
    assert prog.memory_summary()["in_place"] >= 10  # (the Relus making concat pieces write into the concat instead)
    on, _ = _run(prog, tmp_path, "on", feeds)
    off, _ = _run(build_program(g, host_target(), in_place=False), tmp_path, "off", feeds)
    for k in on:
        np.testing.assert_array_equal(on[k], off[k])


# -- the figures ------------------------------------------------------------------------------------

def test_figures_are_those_of_the_plan():
    prog = build_program(chain_graph(), host_target())
    mem = prog.memory_summary()
    assert mem["arena_bytes"] == prog.arena_bytes
    assert mem["lower_bound_bytes"] == lower_bound(prog.buffers, ALIGN)
    assert mem["arena_over_lower_bound"] == round(prog.arena_bytes / mem["lower_bound_bytes"], 4)
    apart = build_program(chain_graph(), host_target(), reuse_memory=False)
    assert apart.arena_bytes == apart.naive_bytes == mem["naive_bytes"]
    assert apart.memory_summary()["in_place"] == 0


def test_plan_svg_draws_every_buffer(tmp_path):
    prog = build_program(chain_graph(), host_target())
    svg = plan_svg(prog.buffers, prog.arena_bytes, prog.memory_summary(), title="chain")
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert svg.count("<title>") == len(prog.buffers)
    assert "lower bound" in svg and "scratch" in svg
    import xml.dom.minidom

    xml.dom.minidom.parseString(svg)  # well-formed


# -- concats in place -------------------------------------------------------------------------------

DENSE = """graph @dense(%x: f32[1,8,6,6]) -> (y: f32[1,24,6,6], s: f32[1,20,6,6], t: f32[2,8,6,6]) {
  %w1 = const f32[4,8,3,3]
  %w2 = const f32[8,12,1,1]
  %w3 = const f32[8,20,1,1]
  %0 = Conv(%x, %w1) {pads=[1, 1, 1, 1]} : f32[1,4,6,6]
  %1 = Relu(%0) : f32[1,4,6,6]
  %2 = Concat(%x, %1) {axis=1} : f32[1,12,6,6]
  %3 = Relu(%x) : f32[1,8,6,6]
  %4 = Conv(%2, %w2) : f32[1,8,6,6]
  %5 = Concat(%2, %4) {axis=1} : f32[1,20,6,6]
  %6 = Sigmoid(%1) : f32[1,4,6,6]
  %7 = Concat(%4, %3) {axis=0} : f32[2,8,6,6]
  %8 = Conv(%5, %w3) : f32[1,8,6,6]
  %9 = Concat(%8, %6, %1, %3) {axis=1} : f32[1,24,6,6]
  %10 = MaxPool(%9) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]} : f32[1,24,6,6]
  return y=%10, s=%5, t=%7
}"""


def dense_graph():
    rng = np.random.default_rng(5)
    w = {k: rng.standard_normal(s).astype(np.float32) for k, s in
         (("w1", (4, 8, 3, 3)), ("w2", (8, 12, 1, 1)), ("w3", (8, 20, 1, 1)))}
    return parse(DENSE, w)


def test_concats_in_place_where_the_pieces_are_slices(tmp_path):
    """%2 has the graph input %x as a piece, %5 and %7 are graph outputs: they copy.
    %9's pieces (conv, sigmoid and relu results that only native kernels read) are computed into
    their slices of its buffer, and the concat is no kernel at all. Results as with every value in
    memory of its own, and as the interpreter's."""
    prog = build_program(dense_graph(), host_target())
    concats = [st for st in prog.steps if st.node.op.name == "Concat"]
    assert [st.alias for st in concats] == [False, False, False, True]
    check_plan(prog.buffers, prog.arena_bytes, ALIGN)
    # the pieces' places are consecutive slices of %9's buffer
    nine = concats[3].node
    base = prog.places[id(nine.outputs[0])].where
    off = 0
    for v in nine.inputs:
        assert prog.places[id(v)] == type(prog.places[id(v)])("arena", base + off)
        off += v.type.nbytes
    feeds = {"x": RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    got, _ = _run(prog, tmp_path, "on", feeds)
    apart, _ = _run(build_program(dense_graph(), host_target(), reuse_memory=False), tmp_path, "apart", feeds)
    want = interpret(dense_graph(), feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[k], apart[k])
