"""unroll-loops: a Loop or Scan whose iteration count is known and small becomes its body, once per
iteration, in the enclosing graph.

Control flow runs in the reference interpreter; its body's ops, spliced in, get native code like any
others (a Range expanded as ONNX defines it, a LinearAttention's recurrence over a few steps, a
short fixed-count Loop). Per iteration the body's nodes are added with its inputs bound to the
outer values (Loop: the iteration number and ``true`` as constants, the carried values, the captured
values; Scan: the states, each scan input's slice, a ``Gather`` of a constant index, the captured
values); the carried values/states thread from one copy to the next, and each scan output is
stacked with ``Unsqueeze`` + ``Concat`` (a Scan's ``scan_output_directions`` of 1 prepends, its
input directions of 1 read the slices backwards). Types are inferred again afterwards.

Refused (``refusal`` says why): an iteration count not known at compile time; a Loop whose body can
stop early (its condition output is not the condition it takes, passed through) or that starts with
a condition not known to be true; no iteration at all (the stacked outputs' shapes come from the
body's types); a body holding control flow of its own; more than ``max_nodes`` nodes once unrolled
(body nodes x iterations), so a long recurrence stays one interpreted loop instead of a huge graph.
"""
from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...ir.ops import control as ctl
from ...ir.ops import indexing as ix
from ...ir.ops import shape as sh
from ...ir.ops import tensor as tn
from ..manager import Pass
from .infer_shapes import reinfer

#: body nodes x iterations at most
MAX_UNROLLED_NODES = 4000


class UnrollLoops(Pass):
    name = "unroll-loops"

    def __init__(self, max_nodes: int = MAX_UNROLLED_NODES):
        self.max_nodes = max_nodes

    def refusal(self, node: Node) -> str | None:
        """Why ``node`` (a Loop or Scan) is not unrolled; None when it is."""
        op = node.op
        if any(isinstance(n.op, ctl._ControlFlow) for n in op.body.nodes):
            return "its body holds control flow of its own"
        count = _count(node)
        if count is None:
            return "its iteration count is not known at compile time"
        if count == 0:
            return "it runs no iteration"
        if isinstance(op, ctl.Loop):
            m, cond = node.inputs[0], node.inputs[1]
            if m is None:
                return "it has no trip count (it runs until its condition is false)"
            if cond is not None and (cond.known is None or not bool(np.asarray(cond.known).reshape(-1)[0])):
                return "its first condition is not known to be true"
            if op.body.outputs[0] is not op.body.inputs[1]:
                return "its body computes the condition (it may stop early)"
        if count * max(len(op.body.nodes), 1) > self.max_nodes:
            return f"{count} iterations of {len(op.body.nodes)} nodes are over {self.max_nodes} once unrolled"
        return None

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if isinstance(node.op, (ctl.Loop, ctl.Scan)) and self.refusal(node) is None:
                results = (_unroll_loop if isinstance(node.op, ctl.Loop) else _unroll_scan)(graph, node)
                for old, new in zip(node.outputs, results):
                    if old is not None:
                        old.replace_all_uses_with(new)
                graph.remove(node)
                changed = True
        if changed:
            reinfer(graph)
        return changed


def _count(node: Node) -> int | None:
    """The iteration count, where known."""
    op = node.op
    if isinstance(op, ctl.Loop):
        m = node.inputs[0]
        return None if m is None or m.known is None else max(int(np.asarray(m.known).reshape(-1)[0]), 0)
    scans = node.inputs[op.num_states():op.num_states() + op.num_scan_inputs]
    x = scans[0]
    axis = op._axes(op.scan_input_axes, op.num_scan_inputs)[0] % x.type.rank
    d = x.type.shape[axis]
    return d if isinstance(d, int) else None


def _splice(graph: Graph, body: Graph, args: list[Value], before: Node, consts: dict) -> list[Value]:
    """``body``'s nodes added before ``before`` with its inputs bound to ``args``; its outputs."""
    env = {id(b): a for b, a in zip(body.inputs, args)}

    def of(v: Value | None) -> Value | None:
        if v is None:
            return None
        if id(v) not in env:  # a body constant: one outer constant for every copy
            if id(v) not in consts:
                consts[id(v)] = graph.add_constant(v.const, name=v.name)
            return consts[id(v)]
        return env[id(v)]

    for n in body.nodes:
        copy = graph.add_node(n.op, [of(v) for v in n.inputs], num_outputs=len(n.outputs), before=before)
        for v, c in zip(n.outputs, copy.outputs):
            if v is not None:
                env[id(v)] = c
    return [of(v) for v in body.outputs]


def _stack(graph: Graph, pieces: list[Value], axis: int, before: Node) -> Value:
    """``pieces`` stacked along a new ``axis``."""
    ax = graph.add_constant(np.array([axis], np.int64))
    grown = [graph.add_node(sh.Unsqueeze(), [p, ax], before=before).output for p in pieces]
    return grown[0] if len(grown) == 1 else graph.add_node(tn.Concat(axis=axis), grown, before=before).output


def _unroll_loop(graph: Graph, node: Node) -> list[Value]:
    op = node.op
    carried = list(node.inputs[2:len(node.inputs) - op.num_captures])
    captured = list(node.inputs[len(node.inputs) - op.num_captures:])
    consts: dict = {}
    true = graph.add_constant(np.array(True))
    scans: list[list[Value]] = [[] for _ in range(len(op.body.outputs) - 1 - len(carried))]
    for i in range(_count(node)):
        it = graph.add_constant(np.array(i, np.int64))
        outs = _splice(graph, op.body, [it, true, *carried, *captured], node, consts)
        carried = outs[1:1 + len(carried)]
        for k, v in enumerate(outs[1 + len(carried):]):
            scans[k].append(v)
    return carried + [_stack(graph, s, 0, node) for s in scans]


def _unroll_scan(graph: Graph, node: Node) -> list[Value]:
    op = node.op
    n, m = op.num_states(), op.num_scan_inputs
    states = list(node.inputs[:n])
    xs, captured = node.inputs[n:n + m], list(node.inputs[n + m:])
    in_axes = [a % x.type.rank for a, x in zip(op._axes(op.scan_input_axes, m), xs)]
    in_back = op._axes(op.scan_input_directions, m)
    k = len(op.body.outputs) - n
    consts: dict = {}
    count = _count(node)
    scans: list[list[Value]] = [[] for _ in range(k)]
    for t in range(count):
        slices = [graph.add_node(ix.Gather(axis=a), [x, graph.add_constant(np.array(count - 1 - t if back else t,
                                                                                       np.int64))],
                                 before=node).output
                  for x, a, back in zip(xs, in_axes, in_back)]
        outs = _splice(graph, op.body, [*states, *slices, *captured], node, consts)
        states = outs[:n]
        for j, v in enumerate(outs[n:]):
            scans[j].append(v)
    out_axes, out_back = op._axes(op.scan_output_axes, k), op._axes(op.scan_output_directions, k)
    stacked = []
    for s, a, back, v in zip(scans, out_axes, out_back, op.body.outputs[n:]):
        rank = v.type.rank + 1
        stacked.append(_stack(graph, s[::-1] if back else s, a % rank, node))
    return states + stacked


__all__ = ["MAX_UNROLLED_NODES", "UnrollLoops"]
