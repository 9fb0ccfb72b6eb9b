"""CumSum and CumProd (running sums and products along one axis, inclusive or exclusive, forward or
reversed) and Trilu (a triangle of the last two axes), on the loop form, for every numeric type.

A running reduction views its input as ``[outer, A, inner]`` and walks the axis in order. The result
is its own accumulator: ``y[t] = y[t - 1] op x[t]`` over whole rows of ``inner`` (every read
contiguous, the rows of one outer index in sequence, the outer indices split among the threads).
float16 keeps its running value in float32 (as the reference does) in an accumulator per point.
The axis and Trilu's ``k`` are parameters: they must be known when compiling.
"""
from __future__ import annotations

import math

import numpy as np

from ...ir.ops import reduce as rd
from ...ir.ops import tensor as tn
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, STORAGE_TYPES, Const, cast, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain

#: elements of work a parallel task gets at least
PAR_MIN_WORK = 1 << 15
_NUMERIC = tuple(STORAGE_TYPES - {DType.bool})


def known_int(v) -> int | None:
    """The value of a one-element integer operand known at compile time, else None."""
    data = None if v is None else v.const if v.const is not None else v.known
    return None if data is None else int(np.asarray(data).reshape(-1)[0])


class Cumulative(FormLowering):
    """CumSum and CumProd (see the module docstring)."""

    ops = (rd.CumSum, rd.CumProd)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason([n.inputs[0], n.outputs[0]], allowed=_NUMERIC)
        if why:
            return why
        if known_int(n.inputs[1]) is None:
            return "the axis is computed at run time"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        shape = [int(d) for d in x.shape]
        a = known_int(n.inputs[1]) % len(shape)
        outer, count, inner = math.prod(shape[:a]), shape[a], math.prod(shape[a + 1:])
        prim = "add" if isinstance(n.op, rd.CumSum) else "mul"
        ct = compute_type(x.type.dtype)
        ident = Const(n.op.identity, ct)
        excl, rev = bool(n.op.exclusive), bool(n.op.reverse)
        own = ct is x.type.dtype  # the result can hold the running value itself
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, (outer, count, inner), value=x)
        yb = kf.buffer("y", y.type.dtype, (outer, count, inner), "inout" if own else "out", value=y)
        kf.note(f"{n.op.name} along {count} of [{outer}, {count}, {inner}]"
                f"{', exclusive' if excl else ''}{', reversed' if rev else ''}")
        last = Const(count - 1, INDEX)
        grain = par_grain(count * inner, PAR_MIN_WORK)

        def at(t):  # the position of step t
            return op("sub", last, t) if rev else t

        with kf.loop(outer, "parallel", grain=grain) as o:
            if own:
                with kf.loop(count) as t, kf.loop(inner, "vector") as i:
                    cur = at(t)
                    prev = op("max", op("sub", cur, 1), Const(0, INDEX)) if not rev else \
                        op("min", op("add", cur, 1), last)
                    first = op("eq", t, Const(0, INDEX))
                    if excl:
                        v = select(first, ident, op(prim, yb[o, prev, i], xb[o, prev, i]))
                    else:
                        v = select(first, xb[o, cur, i], op(prim, yb[o, prev, i], xb[o, cur, i]))
                    kf.store(yb, (o, cur, i), v)
            else:
                with kf.loop(inner) as i:
                    acc = kf.acc(ident)
                    with kf.loop(count) as t:
                        cur = at(t)
                        v = cast(xb[o, cur, i], ct) if xb.dtype is not ct else xb[o, cur, i]
                        if excl:
                            kf.store(yb, (o, cur, i), _rounded(acc, y.type.dtype))
                            kf.update(acc, prim, v)
                        else:
                            kf.update(acc, prim, v)
                            kf.store(yb, (o, cur, i), _rounded(acc, y.type.dtype))
        return kf.finish()


class Trilu(FormLowering):
    """Trilu: the last two axes' upper (``j - i >= k``) or lower (``j - i <= k``) triangle kept, the
    rest zero; one pass over the elements, the leading axes split among the threads."""

    ops = (tn.Trilu,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason([n.inputs[0], n.outputs[0]], allowed=tuple(STORAGE_TYPES))
        if why:
            return why
        if len(n.inputs) > 1 and n.inputs[1] is not None and known_int(n.inputs[1]) is None:
            return "k is computed at run time"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        shape = [int(d) for d in x.shape]
        batch, rows, cols = math.prod(shape[:-2]), shape[-2], shape[-1]
        k = known_int(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] is not None else 0
        ct = compute_type(x.type.dtype)
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, (batch, rows, cols), value=x)
        yb = kf.buffer("y", y.type.dtype, (batch, rows, cols), "out", value=y)
        kf.note(f"Trilu {'upper' if n.op.upper else 'lower'} k={k}")
        zero = Const(False if ct is DType.bool else 0, ct)
        with kf.loop(batch, "parallel", grain=par_grain(rows * cols, PAR_MIN_WORK)) as b, \
                kf.loop(rows) as i, kf.loop(cols, "vector") as j:
            diff = op("sub", j, i)
            keep = op("ge" if n.op.upper else "le", diff, Const(k, INDEX))
            kf.store(yb, (b, i, j), select(keep, xb[b, i, j], zero))
        return kf.finish()


def _rounded(v, out: DType):
    return op("to_f16", v) if out is DType.f16 else v


LOWERINGS = (Cumulative(), Trilu())

__all__ = ["Cumulative", "LOWERINGS", "Trilu", "known_int"]
