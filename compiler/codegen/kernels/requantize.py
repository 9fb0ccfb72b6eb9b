"""An integer product and the elementwise chain after it as one kernel (the fuse pass's ``requantize``
blocks): ConvInteger/MatMulInteger's int32 sums go through the chain (an int8 layer's rescale to
float: Cast, the scales' Mul, the bias Add, the activation, and often the next layer's
QuantizeLinear) as each is finished, so the int32 sums and the float values are never written out.

The chain is composed into the product's *finishing expression* (``FinishChain.expr``), the scalar
expression the integer lowerings already write each sum through (``qconv.py``, ``qmatmul.py``): on
the int8 tiles as on the portable loop, so both paths give the same bits. Its operands are read at
the element's place: the lowering hands the expression one index per group of the result's axes (a
convolution: image, channel, pixel; a product: row, column), and each operand must be constant or
laid out densely along each group (a per-channel scale, a per-column bias, a residual the size of
the result); one broadcast over part of a group (e.g. along the image rows but not the columns) is
refused (``reason``), and the chain then stays a kernel of its own.
"""
from __future__ import annotations

import math
from typing import Sequence

from ...ir.graph import Node, Value
from ...ir.ops import quant as qn
from ..loops import KernelForm
from ..loops.expr import INDEX, Const, Expr, op
from ..loops.scalar import scalar
from .base import KernelBuilder, KernelGroup, Lowering
from .elementwise import Elementwise, inline_const, inlined
from .qconv import ConvInteger
from .qmatmul import MatMulInteger
from .tile_epilogue import _broadcast_strides


class FinishChain:
    """The elementwise ``nodes`` reading ``source`` (an integer product's result, whose axes are
    grouped as ``groups``: the sizes of the axes each index the lowering supplies spans, in order),
    as an expression of the product's finished sum."""

    def __init__(self, nodes: Sequence[Node], source: Value, groups: Sequence[Sequence[int]]):
        self.nodes, self.source = list(nodes), source
        self.final = self.nodes[-1].outputs[0]
        self.groups = [tuple(int(d) for d in g) for g in groups]
        made = {id(source)} | {id(o) for n in self.nodes for o in n.outputs}
        self.operands: list[Value] = []
        for n in self.nodes:
            for v in n.inputs:
                if v is not None and id(v) not in made and all(v is not u for u in self.operands):
                    self.operands.append(v)

    def _factors(self, v: Value) -> list[int] | None:
        """Per group, the elements of ``v`` one step of the group's index moves (0: broadcast along
        it); None when ``v`` is broadcast along part of a group only."""
        shape = tuple(int(d) for d in self.source.shape)
        strides = _broadcast_strides(v.shape, shape)
        out, at = [], 0
        for g in self.groups:
            st, at = strides[at:at + len(g)], at + len(g)
            dense = [math.prod(g[i + 1:]) for i in range(len(g))]
            moving = [i for i, d in enumerate(g) if d > 1]
            if all(st[i] == 0 for i in moving):
                out.append(0)
                continue
            f = st[moving[-1]] // dense[moving[-1]]
            if f == 0 or any(st[i] != f * dense[i] for i in moving):
                return None
            out.append(f)
        return out

    def reason(self) -> str | None:
        """Why the chain cannot be an expression of the finished sum (None: it can)."""
        for v in self.operands:
            if not inlined(v) and self._factors(v) is None:
                return (f"operand {v.name} of shape {list(v.shape)} is broadcast along part of the result's "
                        f"{' x '.join(str(math.prod(g)) for g in self.groups)} layout")
        return None

    def expr(self, kf: KernelForm, s: Expr, index: Sequence[Expr], bind=lambda v: v) -> Expr:
        """The chain's result for the finished sum ``s`` at the element of the index of each group
        (``index``); operands are buffers of ``kf`` bound to ``bind(value)``."""
        env = {id(self.source): s}
        for j, v in enumerate(self.operands):
            if inlined(v):
                env[id(v)] = inline_const(v)
                continue
            off = None
            for f, i in zip(self._factors(v), index):
                if f:
                    term = i if f == 1 else op("mul", i, Const(f, INDEX))
                    off = term if off is None else op("add", off, term)
            buf = kf.buffer(f"chain{j}", v.type.dtype, (int(v.type.numel),), value=bind(v))
            env[id(v)] = buf[(off if off is not None else Const(0, INDEX),)]
        for n in self.nodes:
            env[id(n.outputs[0])] = scalar(n.op, [None if v is None else env[id(v)] for v in n.inputs],
                                           n.outputs[0].type.dtype)
        return env[id(self.final)]


#: the integer products that take a chain, their lowerings
_ANCHORS = (ConvInteger(), MatMulInteger())


class Requantize(Lowering):
    """ConvInteger/MatMulInteger and the elementwise chain reading its sums (see the module
    docstring); the product's lowering computes the chain in its finishing expression."""

    def __init__(self):
        self.chain = Elementwise()
        self.ops = tuple(o for a in _ANCHORS for o in a.ops) + tuple(self.chain.ops) + \
            (qn.QuantizeLinear, qn.DequantizeLinear)

    @staticmethod
    def _anchor(group: KernelGroup):
        return next((a for a in _ANCHORS if isinstance(group.nodes[0].op, a.ops)), None)

    def check(self, group: KernelGroup) -> str | None:
        low = self._anchor(group)
        if low is None or len(group.nodes) < 2:
            return "a requantize group is an integer product (ConvInteger, MatMulInteger) and the chain after it"
        head, tail = group.nodes[0], group.nodes[1:]
        why = low.check(KernelGroup.of([head])) or low.chain_reason(head) or self.chain.check(KernelGroup.of(tail))
        if why:
            return why
        if list(group.outputs) != [tail[-1].outputs[0]]:
            return "a value before the chain's last is needed outside the kernel"
        src = head.outputs[0]
        if any(tuple(n.outputs[0].shape) != tuple(src.shape) for n in tail):
            return "the chain changes the shape of the product's result"
        return FinishChain(tail, src, low.finish_groups(head)).reason()

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        low = self._anchor(group)
        head = group.nodes[0]
        chain = FinishChain(group.nodes[1:], head.outputs[0], low.finish_groups(head))
        k.note(f"{' + '.join(n.op.name for n in chain.nodes)} computed on each finished sum")
        low.emit(k, KernelGroup((head,), tuple(v for v in head.inputs if v is not None), (chain.final,),
                                group.outer), chain=chain)


__all__ = ["FinishChain", "Requantize"]
