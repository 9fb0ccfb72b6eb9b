"""Epilogue kernels: a GEMM or convolution and the elementwise ops after it (bias, folded
BatchNorm, activation, residual add), as one kernel.

The fusion pass makes these groups (``kiln.Kernel`` of kind ``epilogue``). The anchor's lowering
writes its result straight into the buffer of the group's final output (``KernelBuilder.share``).
The anchors (Conv, Gemm, MatMul) take the chain: ``emit(k, group, epilogue)`` runs it inside their
GEMM, on each block of the result as soon as it is final (``tile_epilogue.py``); when they cannot
(an operand the block form does not address, a depthwise conv of several images, the transposed
conv path), the chain runs over the output buffer in place afterwards (threads split its outer
loop). Either way the intermediate never gets memory of its own and no second kernel is
dispatched. When the anchor's result is itself needed outside the group, it keeps its own buffer
and the chain reads it.

A group of kind ``prologue`` also holds the elementwise chain computing a 1x1 conv's input, before
the conv (``prologue.py``): the conv's ``emit(k, group, epilogue, prologue)`` computes it as its
GEMM packs B, so the input never has a buffer; the chain after the conv (if any) runs as above.
"""
from __future__ import annotations

from ...ir.ops import elementwise as ew
from .base import KernelBuilder, KernelGroup, Lowering
from .elementwise import Elementwise


class Epilogue(Lowering):
    def __init__(self, anchors: tuple[Lowering, ...]):
        self.anchors = anchors
        self.chain = Elementwise()
        self.ops = tuple(op for a in anchors for op in a.ops) + self.chain.ops

    def _parts(self, group: KernelGroup):
        """(the anchor's lowering, the prologue nodes, the anchor's group, the chain after it, the
        anchor's result)."""
        at = next((i for i, n in enumerate(group.nodes) if any(type(n.op) in a.ops for a in self.anchors)), 0)
        pro, anchor, rest = list(group.nodes[:at]), group.nodes[at], group.nodes[at + 1:]
        low = next((a for a in self.anchors if type(anchor.op) in a.ops), None)
        a_out = anchor.outputs[0]
        head = KernelGroup((anchor,), tuple(v for v in anchor.inputs if v is not None), (a_out,), group.outer)
        tail = KernelGroup.of(rest, outputs=[v for v in group.outputs if v is not a_out]) if rest else None
        return low, pro, head, tail, a_out

    def check(self, group: KernelGroup) -> str | None:
        if len(group.nodes) < 2:
            return "an epilogue group has a GEMM or convolution and at least one elementwise op"
        anchors = tuple(a for lw in self.anchors for a in lw.ops)
        if sum(isinstance(n.op, anchors) for n in group.nodes) != 1:
            return "one GEMM or convolution per epilogue group"
        low, pro, head, tail, a_out = self._parts(group)
        if low is None:
            return f"{head.node.op.name} takes no epilogue"
        why = low.check(head) or (self.chain.check(tail) if tail is not None else None)
        if why:
            return why
        if pro:
            if not hasattr(low, "prologue_reason"):
                return f"{head.node.op.name} takes no prologue"
            if any(o in group.outputs for n in pro for o in n.outputs):
                return "a value of the chain is needed outside the kernel"
            why = self.chain.check(KernelGroup.of(pro)) or low.prologue_reason(head.node, pro)
            if why:
                return why
        if tail is not None and any(tuple(v.shape) != tuple(a_out.shape) for v in tail.outputs):
            return "the epilogue changes the shape of the result"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        low, pro, head, tail, a_out = self._parts(group)
        with_pro = {"prologue": pro} if pro else {}  # (only a Conv takes one: see check)
        if tail is None:  # a prologue only
            low.emit(k, head, **with_pro)
            return
        final = group.nodes[-1].outputs[0]
        own = any(v is a_out for v in group.outputs)  # needed outside: it keeps its own buffer
        saved = k.in_place
        try:
            k.in_place = {}
            over = None
            if not own and any(v is final for v in tail.outputs):
                k.share(a_out, final)
                k.in_place = {list(tail.outputs).index(final): list(tail.inputs).index(a_out)}
                over = final
            # the chain inside the anchor's GEMM when it can (True), else a pass after it
            if not low.emit(k, head, epilogue=(tail.nodes, tail.outputs, over), **with_pro):
                self.chain.emit(k, tail)
                k.note("chain: a second pass over the output, in place")
        finally:
            k.in_place = saved


__all__ = ["Epilogue"]
del ew
