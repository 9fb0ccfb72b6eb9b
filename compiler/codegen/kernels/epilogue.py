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
        anchor, rest = group.nodes[0], group.nodes[1:]
        low = next((a for a in self.anchors if type(anchor.op) in a.ops), None)
        a_out = anchor.outputs[0]
        head = KernelGroup((anchor,), tuple(v for v in anchor.inputs if v is not None), (a_out,), group.outer)
        tail = KernelGroup.of(rest, outputs=[v for v in group.outputs if v is not a_out])
        return low, head, tail, a_out

    def check(self, group: KernelGroup) -> str | None:
        if len(group.nodes) < 2:
            return "an epilogue group has a GEMM or convolution and at least one elementwise op"
        if any(isinstance(n.op, tuple(a for lw in self.anchors for a in lw.ops)) for n in group.nodes[1:]):
            return "one GEMM or convolution per epilogue group"
        low, head, tail, a_out = self._parts(group)
        if low is None:
            return f"{group.nodes[0].op.name} takes no epilogue"
        why = low.check(head) or self.chain.check(tail)
        if why:
            return why
        if any(tuple(v.shape) != tuple(a_out.shape) for v in tail.outputs):
            return "the epilogue changes the shape of the result"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        low, head, tail, a_out = self._parts(group)
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
            if not low.emit(k, head, epilogue=(tail.nodes, tail.outputs, over)):
                self.chain.emit(k, tail)
                k.note("chain: a second pass over the output, in place")
        finally:
            k.in_place = saved


__all__ = ["Epilogue"]
del ew
