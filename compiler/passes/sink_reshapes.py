"""Sink Reshapes below elementwise ops, so that fusion sees the chain after a GEMM unbroken.

A Reshape of a dense row-major buffer is free (a view), but it stands between a producer and the
elementwise ops after it. Transformer layers are full of them: ``canonicalize`` turns
``MatMul(x[1,S,D], W) + b`` into ``Reshape(Gemm(Reshape(x), W, b))``, and the GELU or residual Add
that follows reads the Reshape. Moving each Reshape below the elementwise op lets the epilogue rule
of ``fuse`` take the whole chain into the GEMM (the Reshape is index arithmetic: none at all)::

    %r = Reshape(%g)   : f32[1,128,256]          %a = Add(%g, %q)  : f32[128,256]
    %a = Add(%r, %res) : f32[1,128,256]   ->     %r = Reshape(%a)  : f32[1,128,256]

where ``%q`` is ``%res`` seen in the Reshape's input shape (a view, or a smaller constant).

An elementwise op sinks a Reshape when some operand is a Reshape from shape S to the op's result
shape of a value computed by a node the op could fuse with (a GEMM/conv, or another elementwise
op), every such Reshape comes from the same S, no other operand already comes straight from such a
node (which keeps the rule from sinking Reshapes back and forth), and each other operand maps into
S: it has the full result shape (it is reshaped to S too), or it broadcasts only along trailing
dimensions that S and the result share (a bias per column, a scalar). Otherwise the rule says why
not. The rule runs at -O2, just before ``fuse``, on the ops that pass fuses: those the backend
computes in a fused loop (``FusionCapabilities.fusable``, handed to the pass like to ``fuse``).
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from .fuse import NO_FUSION, FusionCapabilities, is_anchor
from .manager import Pass
from .rewrite import Rule, apply_rules
from .simplify.canonicalize import reshape_to


def _common_suffix(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def _joins(v: Value, fusable) -> bool:
    """Whether ``v`` is computed by a node an elementwise op can fuse with (a GEMM/conv or a loop)."""
    p = v.producer
    return p is not None and (is_anchor(p) or fusable(p))


def _reshaped(v: Value | None, out: tuple) -> Value | None:
    """The input of ``v`` when ``v`` is a Reshape (to ``out``), else None."""
    if v is None or v.producer is None or v.producer.op.name != "Reshape" or tuple(v.shape) != out:
        return None
    return v.producer.inputs[0]


def _source_shape(node: Node, fusable) -> tuple | None:
    """S: the input shape of the first operand that is a Reshape, to the op's result shape, of a
    value computed by a node the op could fuse with."""
    out = tuple(node.outputs[0].shape)
    for v in node.inputs:
        x = _reshaped(v, out)
        if x is not None and _joins(x, fusable):
            return tuple(x.shape)
    return None


def _mapping(v: Value, src: tuple, out: tuple) -> str | tuple | None:
    """How operand ``v`` is seen in shape ``src``: "reshape" (full size), a shape to view it as (a
    trailing broadcast), or None (it does not map)."""
    shape = tuple(v.shape)
    if shape == out:
        return "reshape"
    padded = (1,) * (len(out) - len(shape)) + shape
    if len(padded) != len(out):
        return None
    k = _common_suffix(src, out)
    lead, tail = padded[:len(out) - k], padded[len(out) - k:]
    if any(d != 1 for d in lead):
        return None
    while tail and tail[0] == 1:
        tail = tail[1:]
    return tuple(tail)


def _viewed(graph: Graph, v: Value, shape: tuple, before: Node) -> Value:
    """``v`` seen as ``shape`` (same elements): itself, the input of the Reshape computing it, a
    constant reshaped now, or a new Reshape (a view)."""
    if tuple(v.shape) == shape:
        return v
    p = v.producer
    if p is not None and p.op.name == "Reshape" and tuple(p.inputs[0].shape) == shape:
        return p.inputs[0]
    if v.const is not None:
        return graph.add_constant(np.asarray(v.const).reshape(shape), name=v.name)
    return reshape_to(graph, v, shape, before)


class SinkReshape(Rule):
    """The rule, for the elementwise ops ``capabilities.fusable`` accepts."""

    name = "sink-reshape"
    roots = ()  # every fusable elementwise op: see SinkReshapes.run

    def __init__(self, capabilities: FusionCapabilities = NO_FUSION):
        self.fusable = capabilities.fusable

    def check(self, node):
        if not self.fusable(node):
            return f"{node.op.name} is not a fusable elementwise op"
        src = _source_shape(node, self.fusable)
        if src is None:
            return "no operand is a Reshape of a result the op could fuse with"
        out = tuple(node.outputs[0].shape)
        for v in node.inputs:
            if v is None:
                continue
            x = _reshaped(v, out)
            if x is None and tuple(v.shape) == out and _joins(v, self.fusable):
                return f"it already reads {v.producer.op.name}'s result directly, without a Reshape"
            if x is not None and tuple(x.shape) != src:
                return f"its operands are Reshapes from different shapes {list(src)} and {list(x.shape)}"
            if _mapping(v, src, out) is None:
                return (f"operand {v.name or '?'} of shape {list(v.shape)} broadcasts along dimensions the Reshape "
                        f"from {list(src)} changes")
        return None

    def rewrite(self, graph: Graph, node: Node):
        out = tuple(node.outputs[0].shape)
        src = _source_shape(node, self.fusable)
        args: list[Value | None] = []
        for v in node.inputs:
            m = None if v is None else _mapping(v, src, out)  # "reshape": v has the result's shape
            args.append(None if v is None else _viewed(graph, v, src if m == "reshape" else m, node))
        moved = graph.add_node(node.op, args, name=node.name, before=node)
        node.outputs[0].replace_all_uses_with(reshape_to(graph, moved.outputs[0], out, node))


class SinkReshapes(Pass):
    """Apply ``SinkReshape`` to a fixed point (see the module docstring)."""

    name = "sink-reshapes"

    def __init__(self, max_rounds: int = 50, capabilities: FusionCapabilities = NO_FUSION):
        self.max_rounds = max_rounds
        self.capabilities = capabilities
        self.fired = 0

    def run(self, graph: Graph) -> bool:
        rule = SinkReshape(self.capabilities)
        rule.roots = tuple(sorted({n.op.name for n in graph.nodes if rule.fusable(n)}))
        self.fired = apply_rules(graph, [rule], self.max_rounds).get(rule.name, 0)
        if self.fired:
            graph.remove_unused_constants()
        return bool(self.fired)
