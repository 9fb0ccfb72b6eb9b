"""split-devices: structure (stages, devices printed and parsed back, Transfers), numbers (the
interpreter agrees), the min-cut refinement, memory limits, and refusals; cut_stages."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import LimitError
from compiler.ir.interpreter import interpret
from compiler.ir.ops.device import Transfer
from compiler.ir.ops.base import OpError
from compiler.ir.parser import parse
from compiler.ir.printer import external_weights, print_graph
from compiler.ir.verify import verify
from compiler.passes.options import OptionError
from compiler.passes.split_devices import DeviceSpec, SplitDevices, cut_stages
from compiler.tools.cli import random_inputs

from .util import ir, run_pass, same_ir

rng = np.random.default_rng(0)
W = {n: (rng.standard_normal((256, 256)) * 0.06).astype(np.float32) for n in ("w0", "w1", "w2", "w3")}

CHAIN = """
graph @t(%x: f32[64,256]) -> (y: f32[64,256]) {
  %w0 = const f32[256,256]
  %w1 = const f32[256,256]
  %w2 = const f32[256,256]
  %w3 = const f32[256,256]
  %0 = MatMul(%x, %w0) : f32[64,256]
  %1 = MatMul(%0, %w1) : f32[64,256]
  %2 = MatMul(%1, %w2) : f32[64,256]
  %3 = MatMul(%2, %w3) : f32[64,256]
  return y=%3
}"""


def devices(n=2, memory=1 << 30, gflops=100.0, gbps=10.0, **kw):
    return [DeviceSpec(f"cpu:{i}", memory, gflops, gbps, (i,), **kw) for i in range(n)]


def test_a_chain_splits_in_the_middle_with_one_transfer():
    g = ir(CHAIN, W)
    p = SplitDevices(devices())
    assert run_pass(p, g)
    same_ir(g, """
graph @t(%x: f32[64,256]) -> (y: f32[64,256]) {
  %w0 = const f32[256,256]
  %w1 = const f32[256,256]
  %w2 = const f32[256,256]
  %w3 = const f32[256,256]
  %0 = MatMul(%x, %w0) : f32[64,256] on "cpu:0"
  %1 = MatMul(%0, %w1) : f32[64,256] on "cpu:0"
  %2 = kiln.Transfer(%1) {source="cpu:0", target="cpu:1"} : f32[64,256] on "cpu:1"
  %3 = MatMul(%2, %w2) : f32[64,256] on "cpu:1"
  %4 = MatMul(%3, %w3) : f32[64,256] on "cpu:1"
  return y=%4
}""")
    assert [s.device for s in p.stages] == ["cpu:0", "cpu:1"]
    assert p.cut_bytes == [64 * 256 * 4]
    assert p.stages[0].weight_bytes == p.stages[1].weight_bytes == 2 * 256 * 256 * 4
    assert p.bottleneck_seconds < p.single_device_seconds
    assert "2 stage(s) on 2 device(s)" in p.explain()
    # the text format keeps the devices and the Transfer: parse it back, print it again
    again = parse(print_graph(g), external_weights(g))
    assert print_graph(again) == print_graph(g)
    assert [n.device for n in again.nodes] == ["cpu:0", "cpu:0", "cpu:1", "cpu:1", "cpu:1"]


def test_running_it_again_changes_nothing():
    g = ir(CHAIN, W)
    assert run_pass(SplitDevices(devices()), g)
    text = print_graph(g)
    p = SplitDevices(devices())
    p.run(g)
    assert print_graph(g).count("kiln.Transfer") == 1
    assert [s.device for s in p.stages] == ["cpu:0", "cpu:1"]
    assert text.replace("%2 = kiln.Transfer", "") != ""  # placement stable: same devices per MatMul
    assert [n.device for n in g.nodes if n.op.name == "MatMul"] == ["cpu:0", "cpu:0", "cpu:1", "cpu:1"]


def test_a_faster_device_takes_more_of_the_work():
    g = ir(CHAIN, W)
    fast = DeviceSpec("cpu:0", 1 << 30, 300.0, 30.0)
    slow = DeviceSpec("cpu:1", 1 << 30, 100.0, 10.0)
    p = SplitDevices([fast, slow])
    assert run_pass(p, g)
    assert [n.device for n in g.nodes if n.op.name == "MatMul"] == ["cpu:0", "cpu:0", "cpu:0", "cpu:1"]


def test_a_value_read_on_two_later_devices_gets_a_transfer_to_each():
    text = """
graph @t(%x: f32[64,256]) -> (y: f32[64,256]) {
  %w0 = const f32[256,256]
  %w1 = const f32[256,256]
  %w2 = const f32[256,256]
  %0 = MatMul(%x, %w0) : f32[64,256]
  %1 = MatMul(%0, %w1) : f32[64,256]
  %2 = MatMul(%1, %w2) : f32[64,256]
  %3 = Add(%2, %0) : f32[64,256]
  %4 = Add(%3, %0) : f32[64,256]
  return y=%4
}"""
    g = ir(text, W)
    p = SplitDevices(devices(3), slack=0.0)
    assert run_pass(p, g)
    transfers = [n for n in g.nodes if isinstance(n.op, Transfer)]
    sources = [(t.inputs[0].producer.name, t.op.source, t.op.target) for t in transfers]
    assert len({(s, d) for _, s, d in sources}) == len(sources)  # one Transfer per value and reading device
    first = g.nodes[0].outputs[0]
    assert {t.op.target for t in transfers if t.inputs[0] is first} == {n.device for n in first.users} - {"cpu:0"}
    for n in g.nodes:  # every read is of a value on the reader's own device (or a graph input / constant)
        for v in n.inputs:
            if v is not None and v.producer is not None:
                assert v.producer.device == n.device or isinstance(n.op, Transfer)


def test_the_cut_moves_to_a_small_value_within_the_slack():
    # the balanced cut (after three products) sends a 64 KiB value; two cheap nodes later the
    # value is 256 bytes: over a slow link (0.5 GB/s: 131 us for 64 KiB) the min-cut takes that one
    # when the slack lets it; over a fast one, the balance wins
    weights = dict(W, r=np.ones((256, 1), np.float32), e=np.ones((1, 256), np.float32) * 0.01)
    text = """
graph @t(%x: f32[64,256]) -> (y: f32[64,256]) {
  %w0 = const f32[256,256]
  %w1 = const f32[256,256]
  %w2 = const f32[256,256]
  %w3 = const f32[256,256]
  %r = const f32[256,1]
  %e = const f32[1,256]
  %0 = MatMul(%x, %w0) : f32[64,256]
  %1 = MatMul(%0, %w1) : f32[64,256]
  %2 = MatMul(%1, %w2) : f32[64,256]
  %3 = Tanh(%2) : f32[64,256]
  %4 = MatMul(%3, %r) : f32[64,1]
  %5 = MatMul(%4, %e) : f32[64,256]
  %6 = MatMul(%5, %w3) : f32[64,256]
  %7 = MatMul(%6, %w0) : f32[64,256]
  return y=%7
}"""
    strict = SplitDevices(devices(link_gbps=0.5), slack=0.0)
    g = ir(text, weights)
    assert run_pass(strict, g)
    assert strict.cut_bytes == [64 * 256 * 4]
    refined = SplitDevices(devices(link_gbps=0.5), slack=0.1)
    g = ir(text, weights)
    assert run_pass(refined, g)
    assert refined.cut_bytes == [64 * 4]
    assert [n.op.name for n in refined.stages[0].nodes] == ["MatMul", "MatMul", "MatMul", "Tanh", "MatMul"]
    assert refined.bottleneck_seconds < strict.bottleneck_seconds
    fast = SplitDevices(devices(link_gbps=1000.0), slack=0.1)
    g = ir(text, weights)
    assert run_pass(fast, g)
    assert fast.cut_bytes == [64 * 256 * 4]  # a cheaper cut that unbalances the stages is not taken


def test_constants_larger_than_one_device_force_a_split():
    g = ir(CHAIN, W)
    limit = 3 * 256 * 256 * 4  # three of the four weights, and little room for values
    p = SplitDevices(devices(memory=limit, gflops=1e6, gbps=1e6))  # speed alone would keep it whole
    assert run_pass(p, g)
    assert len(p.stages) == 2
    assert all(s.memory_bytes <= limit for s in p.stages)


def test_a_model_that_fits_one_device_when_splitting_buys_nothing_stays_whole():
    g = ir(CHAIN, W)
    # copies so slow that any cut costs more than it saves
    p = SplitDevices(devices(link_gbps=1e-6))
    run_pass(p, g)
    assert len(p.stages) == 1 and not any(isinstance(n.op, Transfer) for n in g.nodes)


def test_a_node_larger_than_every_device_is_named():
    g = ir(CHAIN, W)
    with pytest.raises(LimitError, match=r"MatMul.*needs 320\.0 KiB.*more than any device holds"):
        SplitDevices(devices(memory=200_000)).run(g)


def test_a_model_larger_than_all_devices_together_is_refused():
    g = ir(CHAIN, W)
    with pytest.raises(LimitError, match="does not fit the devices' memory"):
        SplitDevices(devices(memory=450_000)).run(g)


def test_control_flow_stays_on_the_first_device():
    text = """
graph @t(%c: bool[], %x: f32[4]) -> (y: f32[4]) {
  %0 = If(%c, %x) {else_branch=graph @e(%x: f32[4]) -> (r: f32[4]) {
    %0 = Neg(%x) : f32[4]
    return r=%0
  }, then_branch=graph @th(%x: f32[4]) -> (r: f32[4]) {
    %0 = Abs(%x) : f32[4]
    return r=%0
  }} : f32[4]
  %1 = Exp(%0) : f32[4]
  return y=%1
}"""
    g = ir(text)
    p = SplitDevices(devices())
    assert run_pass(p, g)
    assert {n.device for n in g.nodes} == {"cpu:0"}
    assert "holds a subgraph" in p.refusals[0] and "If" in p.refusals[0]


def test_options_are_checked():
    with pytest.raises(OptionError, match="at least two devices"):
        SplitDevices(devices(1))
    with pytest.raises(OptionError, match="named twice"):
        SplitDevices([DeviceSpec("cpu:0", 1, 1.0, 1.0)] * 2)
    with pytest.raises(OptionError, match="expected a name like"):
        DeviceSpec("gpu0", 1, 1.0, 1.0)
    with pytest.raises(OpError, match="same device"):
        Transfer(source="cpu:0", target="cpu:0")
    with pytest.raises(OpError, match="attribute target"):
        Transfer(source="cpu:0", target="tpu:0")


def test_cut_stages_gives_graphs_that_chain_to_the_model():
    g = ir(CHAIN, W)
    feeds = random_inputs(g, {}, 0)
    want = interpret(g, feeds)["y"]
    SplitDevices(devices(3)).run(g)
    stages = cut_stages(g)
    assert [s.device for s in stages] == ["cpu:0", "cpu:1", "cpu:2"]
    env = dict(feeds)
    for s in stages:
        verify(s.graph)
        assert not any(isinstance(n.op, Transfer) for n in s.graph.nodes)
        assert all(n.device == s.device for n in s.graph.nodes)
        assert set(s.wires_in) <= set(env)
        env.update(interpret(s.graph, {v.name: env[v.name] for v in s.graph.inputs}))
    np.testing.assert_array_equal(env["y"], want)
    assert stages[0].wires_out == stages[1].wires_in


def test_cut_stages_wants_an_annotated_graph():
    with pytest.raises(OptionError, match="has no device"):
        cut_stages(ir(CHAIN, W))


@pytest.mark.parametrize("rows", [8, 1, 0])
def test_a_split_agrees_with_the_interpreter_for_any_number_of_rows(rows):
    # batch > 1, a size-1 and a size-0 row axis: the pass and the cut stages compute the model
    g = ir(CHAIN.replace("64,", f"{rows},"), W)
    feeds = random_inputs(g, {}, 0)
    want = interpret(g, feeds)["y"]
    assert run_pass(SplitDevices(devices()), g)  # the interpreter agrees before and after
    env = dict(feeds)
    for s in cut_stages(g):
        env.update(interpret(s.graph, {v.name: env[v.name] for v in s.graph.inputs}))
    assert env["y"].shape == (rows, 256)
    np.testing.assert_array_equal(env["y"], want)
