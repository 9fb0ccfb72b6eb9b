"""Row reductions with their elementwise producers: a chain of elementwise ops and the reduction
that reads its result, as one kernel (``kiln.Kernel`` of kind ``reduction``, ``fuse.py``).

The reductions are those that work on contiguous rows of their input ``x``: LayerNormalization
(the rows are the normalized axes), Softmax and LogSoftmax along the last axis, GlobalAveragePool
and GlobalMaxPool (a row is one channel's plane) and ReduceSum/Mean/Max/Min over trailing axes. The
kernel splits the rows among the threads; for each row it computes the chain into a row buffer on
the stack (or straight into ``x``'s own buffer when ``x`` is needed outside too), then runs the
reduction's row code on it (``norm.layernorm_row``, ``norm.softmax_row``, ``reduce.reduce_row``).
So ``x`` never reaches memory, and the chain is computed once per element: there is no recompute.

The chain's other operands must be laid out like ``x`` along a row or be constant along it (a
residual, a position embedding, a scalar, a per-channel scale); one broadcast over some of the
row's axes only is refused with the reason. The chain's code is the elementwise code generator's
(``emit_elementwise``) on one row, called with each operand's pointer for that row.
"""
from __future__ import annotations

import math
from typing import Sequence

from llvmlite import ir

from ...ir.graph import Node, Value
from ...ir.ops import norm as nm
from ...ir.ops import pool as P
from ...ir.ops import reduce as rd
from ..llvm.elementwise import _is_inlined
from .base import F32, KernelBuilder, KernelGroup, Lowering, c64, cf32, dtype_reason, unravel
from .elementwise import Elementwise
from .norm import ScaleBias, _trailing, layernorm_row, softmax_row
from .reduce import par_loop, reduce_row, vload, vstore
from .reduction import reduce_axes
from .tile_epilogue import RowChain, _broadcast_strides, dense_strides

#: the longest row (floats) computed into a stack buffer
MAX_ROW = 1 << 14
_REDUCE_KIND = {rd.ReduceSum: "sum", rd.ReduceMean: "sum", rd.ReduceMax: "max", rd.ReduceMin: "min"}


def row_axis(node: Node) -> int | str:
    """The first axis of the rows ``node`` reduces (its input's rows are the axes from it on), or why
    ``node`` is not a row reduction this lowering takes."""
    op, x = node.op, node.inputs[0]
    rank = len(x.shape)
    if type(op) is nm.LayerNormalization:
        if op.stash_type != 1:
            return "LayerNormalization with stash_type other than 1"
        if any(v.uses for v in node.outputs[1:]):
            return "its mean or inverse standard deviation is used"
        return op.axis % rank
    if type(op) in (nm.Softmax, nm.LogSoftmax):
        return rank - 1 if op.axis % rank == rank - 1 else f"{op.name} is not along the last axis"
    if type(op) in (P.GlobalAveragePool, P.GlobalMaxPool):
        return 2
    if type(op) in _REDUCE_KIND:
        axes = reduce_axes(node)
        if isinstance(axes, str) or not axes:
            return axes or "a reduction over no axes"
        if tuple(axes) != tuple(range(rank - len(axes), rank)):
            return f"{op.name} over axes {list(axes)}, not the trailing axes"
        return rank - len(axes)
    return f"{op.name} is not a row reduction"


ROW_OPS = (nm.LayerNormalization, nm.Softmax, nm.LogSoftmax, P.GlobalAveragePool, P.GlobalMaxPool,
           *_REDUCE_KIND)


class RowReduce(Lowering):
    ops = ROW_OPS + Elementwise.ops

    def check(self, group: KernelGroup) -> str | None:
        red, chain = group.nodes[-1], list(group.nodes[:-1])
        if type(red.op) not in ROW_OPS or not chain or any(type(n.op) not in Elementwise.ops for n in chain):
            return "a reduction group is an elementwise chain and the row reduction that reads it"
        a = row_axis(red)
        if isinstance(a, str):
            return a
        x = red.inputs[0]
        if x.producer is not chain[-1]:
            return "the reduction does not read the chain's last result"
        params = list(red.inputs[1:3]) if type(red.op) is nm.LayerNormalization else []  # not a Reduce's axes
        why = dtype_reason([v for n in chain for v in n.inputs] + [x, red.outputs[0]] + params) or \
            Elementwise().check(KernelGroup.of(chain))
        if why:
            return why
        shape = tuple(int(d) for d in x.shape)
        if math.prod(shape) == 0:
            return "empty tensors are left to the interpreter"
        if math.prod(shape[a:]) > MAX_ROW:
            return f"rows of more than {MAX_ROW} floats"
        if any(tuple(int(d) for d in n.outputs[0].shape) != shape for n in chain):
            return "the chain's results do not all have the reduction's input shape"
        if type(red.op) is nm.LayerNormalization:
            for v in red.inputs[1:]:
                t = _trailing(v, x, a) if v is not None else None
                if isinstance(t, str):
                    return t
        if type(red.op) is P.GlobalAveragePool and math.prod(shape[2:]) >= 1 << 24:
            return "averages over 2^24 or more elements (the count is not exact in float32)"
        return _Rows.reason(chain, shape, a)

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        red, chain = group.nodes[-1], list(group.nodes[:-1])
        x, y = red.inputs[0], red.outputs[0]
        shape = [int(d) for d in x.shape]
        a = row_axis(red)
        R, D = math.prod(shape[:a]), math.prod(shape[a:])
        own = any(v is x for v in group.outputs)  # x needed outside: its own buffer is the row buffer
        rows = _Rows(k, chain, [v for v in group.outputs if v is not y], x, shape, a)
        op = red.op
        params = ScaleBias(red, a) if type(op) is nm.LayerNormalization else None
        k.note("the elementwise chain computed row by row into the reduction (no intermediate tensor)")
        with par_loop(k, R, 4 * D, "row") as r:
            b = k.b
            xp = k.at(k.ptr(x), b.mul(r, c64(D))) if own else k.f.alloca(ir.ArrayType(F32, D), name="xrow")
            rows.emit(r, xp)
            if params is not None:
                layernorm_row(k, xp, k.at(k.ptr(y), b.mul(r, c64(D))), D, *params.pointers(k), op.epsilon)
            elif type(op) in (nm.Softmax, nm.LogSoftmax):
                softmax_row(k, xp, k.at(k.ptr(y), b.mul(r, c64(D))), D, type(op) is nm.LogSoftmax)
            else:
                kind = "max" if type(op) in (P.GlobalMaxPool, rd.ReduceMax) else \
                    "sum" if type(op) is P.GlobalAveragePool else _REDUCE_KIND[type(op)]
                v = reduce_row(k, D, lambda i, w: vload(k, xp, i, w), kind)
                if type(op) in (P.GlobalAveragePool, rd.ReduceMean):
                    v = b.fdiv(v, cf32(float(D)))
                vstore(k, v, k.ptr(y), r)


class _Rows:
    """The chain of one row: ``emit(r, dst)`` computes row ``r`` of ``x`` into ``dst`` (and writes the
    other values needed outside, ``extra``, to their buffers)."""

    def __init__(self, k: KernelBuilder, chain: Sequence[Node], extra: Sequence[Value], x: Value,
                 shape: list[int], a: int):
        self.k, self.shape, self.a = k, shape, a
        row = RowChain(lambda st: any(st[a:]))
        row.add_chain(chain, tuple(shape))
        self.outs = [x] + [v for v in extra if v is not x]
        self.fn, self.kern, self.operands = row.emit(k, f"{k.name}.row", self.outs)

    @staticmethod
    def reason(chain: Sequence[Node], shape: tuple, a: int) -> str | None:
        produced = {id(o) for n in chain for o in n.outputs}
        tail = dense_strides(shape)[a:]
        for n in chain:
            for v in n.inputs:
                if v is None or id(v) in produced or _is_inlined(v, True):
                    continue
                if len(v.shape) > len(shape):
                    return f"{v} does not broadcast to the reduction's input"
                cols = _broadcast_strides(v.shape, shape)[a:]
                if any(cols) and tuple(cols) != tail:
                    return f"{v} is broadcast over some of the row's axes only"
        return None

    def emit(self, r: ir.Value, dst: ir.Value) -> None:
        k, b, a, shape = self.k, self.k.b, self.a, self.shape
        lead = unravel(b, r, shape[:a])
        D = math.prod(shape[a:])
        ptrs = []
        for v, st in self.operands:
            off = c64(0)
            for i, idx in enumerate(lead):
                if st[i]:
                    off = b.add(off, b.mul(idx, c64(st[i])))
            ptrs.append(k.at(k.ptr(v), off))
        for o in self.kern.pointer_outputs:
            v = self.outs[o]
            ptrs.append(dst if v is self.outs[0] else k.at(k.ptr(v), b.mul(r, c64(D))))
        b.call(self.fn, ptrs + [c64(D)])


__all__ = ["ROW_OPS", "RowReduce", "row_axis"]
