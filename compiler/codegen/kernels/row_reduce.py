"""Row reductions with their elementwise producers: a chain of elementwise ops and the reduction
that reads its result, as one loop-form kernel (``kiln.Kernel`` of kind ``reduction``, ``fuse.py``).

The reductions are those that work on contiguous rows of their input ``x``: LayerNormalization
(the rows are the normalized axes), Softmax and LogSoftmax along the last axis, GlobalAveragePool
and GlobalMaxPool (a row is one channel's plane) and ReduceSum/Mean/Max/Min over trailing axes. The
rows are split among the threads. In a row's first pass the chain is computed element by element
(``Row.first``) and fed to the reduction; where a later pass needs ``x`` again (LayerNorm, Softmax)
the first pass also stores it, into the output row (same shape) or into ``x``'s own buffer when
``x`` is needed outside the kernel, and the later passes read it back (``Row.again``). So ``x``
never makes a trip through memory of its own, and the chain is computed once per element.

The chain's other operands must be laid out like ``x`` along a row or be constant along it (a
residual, a position embedding, a scalar, a per-channel scale): each is a ``[leading axes..., D]``
buffer with stride 1 or 0 along the row; one broadcast over some of the row's axes only is refused
with the reason. The row programs are ``norm.softmax_row`` and ``norm.layernorm_row``.
"""
from __future__ import annotations

import math

from ...ir.graph import Node
from ...ir.ops import norm as nm
from ...ir.ops import pool as P
from ...ir.ops import reduce as rd
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.broadcast import broadcast_strides
from ..loops.expr import Const, cast, op
from .base import FormLowering, KernelGroup, dtype_reason, par_grain
from .elementwise import Elementwise, chain_lets, inline_const, inlined
from .norm import Row, ScaleBias, layernorm_row, row_sum, softmax_row, stash_type
from .reduction import reduce_axes

_REDUCE_KIND = {rd.ReduceSum: "sum", rd.ReduceMean: "mean", rd.ReduceMax: "max", rd.ReduceMin: "min",
                P.GlobalAveragePool: "mean", P.GlobalMaxPool: "max"}
#: work per element of a row: the chain and up to three passes
ROW_COST = 4


def row_axis(node: Node) -> int | str:
    """The first axis of the rows ``node`` reduces (its input's rows are the axes from it on), or why
    ``node`` is not a row reduction this lowering takes."""
    op_, x = node.op, node.inputs[0]
    rank = len(x.shape)
    if type(op_) is nm.LayerNormalization:
        if any(v.uses for v in node.outputs[1:]):
            return "its mean or inverse standard deviation is used"
        return op_.axis % rank
    if type(op_) in (nm.Softmax, nm.LogSoftmax):
        return rank - 1 if op_.axis % rank == rank - 1 else f"{op_.name} is not along the last axis"
    if type(op_) in (P.GlobalAveragePool, P.GlobalMaxPool):
        return 2
    if type(op_) in _REDUCE_KIND:
        axes = reduce_axes(node)
        if isinstance(axes, str) or not axes:
            return axes or "a reduction over no axes"
        if tuple(axes) != tuple(range(rank - len(axes), rank)):
            return f"{op_.name} over axes {list(axes)}, not the trailing axes"
        return rank - len(axes)
    return f"{op_.name} is not a row reduction"


ROW_OPS = (nm.LayerNormalization, nm.Softmax, nm.LogSoftmax, *_REDUCE_KIND)


def _operands(chain) -> list:
    """The chain's operands from outside it that are read through a buffer, in first-use order."""
    produced = {id(o) for n in chain for o in n.outputs}
    out = []
    for n in chain:
        for v in n.inputs:
            if v is not None and id(v) not in produced and not inlined(v) and all(v is not u for u in out):
                out.append(v)
    return out


class RowReduce(FormLowering):
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
        if any(tuple(int(d) for d in n.outputs[0].shape) != shape for n in chain):
            return "the chain's results do not all have the reduction's input shape"
        if type(red.op) is nm.LayerNormalization:
            why = ScaleBias(red, a).reason()
            if why:
                return why
        if type(red.op) is P.GlobalAveragePool and math.prod(shape[2:]) >= 1 << 24:
            return "averages over 2^24 or more elements (the count is not exact in float32)"
        for v in _operands(chain):
            if len(v.shape) > len(shape):
                return f"{v} does not broadcast to the reduction's input"
            cols = broadcast_strides(v.shape, shape)[a:]
            if any(cols) and tuple(cols) != broadcast_strides(shape, shape)[a:]:
                return f"{v} is broadcast over some of the row's axes only"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        red, chain = group.nodes[-1], list(group.nodes[:-1])
        x, y = red.inputs[0], red.outputs[0]
        shape = [int(d) for d in x.shape]
        a = row_axis(red)
        lead, R, D = shape[:a], math.prod(shape[:a]), math.prod(shape[a:])
        dt = x.type.dtype
        kf = KernelForm(name)
        kf.note("the elementwise chain computed row by row into the reduction (no intermediate tensor)")
        operands = {}
        for v in _operands(chain):
            st = broadcast_strides(v.shape, shape)
            operands[id(v)] = kf.buffer(f"in{len(operands)}", v.type.dtype, (*lead, D), value=v,
                                        strides=(*st[:a], 1 if any(st[a:]) else 0))
        rows = type(red.op) in (nm.LayerNormalization, nm.Softmax, nm.LogSoftmax)
        # later passes read x back: from its own buffer when it is needed outside, else from y's row
        own = any(o is x for o in group.outputs)
        extra = {id(v): kf.buffer(f"out{k}", v.type.dtype, (R, D), "inout" if v is x and rows else "out", value=v)
                 for k, v in enumerate(o for o in group.outputs if o is not y)}
        yb = kf.buffer("y", y.type.dtype, (R, D) if rows else (R,), "inout" if rows else "out", value=y)
        back = extra[id(x)] if own else yb
        with kf.loop(R, "parallel", grain=par_grain(ROW_COST * D), name="r") as r:
            at = [kf.let(op("rem", op("div", r, math.prod(lead[k + 1:])), d), "lead") if d > 1 else Const(0, DType.i64)
                  for k, d in enumerate(lead)]

            def first(i):
                env = {id(v): inline_const(v) for n in chain for v in n.inputs if v is not None and inlined(v)}
                env.update({key: buf[(*at, i)] for key, buf in operands.items()})
                chain_lets(kf, chain, env)
                for key, buf in extra.items():
                    kf.store(buf, (r, i), env[key])
                if rows and back is yb:
                    kf.store(yb, (r, i), env[id(x)])
                return env[id(x)]

            again = lambda i: back[r, i]  # noqa: E731
            if type(red.op) is nm.LayerNormalization:
                scale, bias = ScaleBias(red, a).buffers(kf)
                stash = stash_type(red.op)
                row = Row(lambda i: cast(first(i), stash), lambda i: cast(again(i), stash))
                layernorm_row(kf, D, row, yb, r, scale, bias, red.op.epsilon, stash)
            elif rows:
                softmax_row(kf, D, Row(first, again), yb, r, type(red.op) is nm.LogSoftmax)
            else:
                kind = _REDUCE_KIND[type(red.op)]
                if kind in ("sum", "mean"):
                    kf.store(yb, r, cast(row_sum(kf, D, first, dt, mean=kind == "mean"), dt))
                else:
                    m = kf.acc(Const(-math.inf if kind == "max" else math.inf, dt), kind)
                    with kf.loop(D, "vector") as i:
                        kf.update(m, kind, first(i))
                    kf.store(yb, r, m)
        return kf.finish()


__all__ = ["ROW_OPS", "RowReduce", "row_axis"]
