"""OneHot and EyeLike on the loop form: each result element compares its own position with an index
(OneHot: the index read at run time, normalized; EyeLike: the diagonal ``k``), for every storage type.
OneHot's depth decides the result's shape, so it is known when compiling (bound from an input when
the model feeds it)."""
from __future__ import annotations

import math

from ...ir.ops import indexing as ix
from ...ir.ops import tensor as tn
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, STORAGE_TYPES, Const, cast, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain

#: elements of work a parallel task gets at least
PAR_MIN_WORK = 1 << 15


class OneHot(FormLowering):
    """``y[.., j, ..] = values[1] if index == j (negative indices count from depth) else values[0]``;
    an index outside ``[-depth, depth)`` is hot nowhere, as the reference gives."""

    ops = (ix.OneHot,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        idx, _, values = n.inputs
        return dtype_reason([idx, values, n.outputs[0]], allowed=tuple(STORAGE_TYPES - {DType.f16})) or \
            self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        idx, _, values = n.inputs
        y = n.outputs[0]
        ishape = [int(d) for d in idx.shape]
        a = n.op.axis % (len(ishape) + 1)
        depth = int(y.shape[a])
        outer, inner = math.prod(ishape[:a]), math.prod(ishape[a:])
        kf = KernelForm(name)
        ib = kf.buffer("indices", idx.type.dtype, (outer, inner), value=idx)
        vb = kf.buffer("values", values.type.dtype, (2,), value=values)
        yb = kf.buffer("y", y.type.dtype, (outer, depth, inner), "out", value=y)
        kf.note(f"OneHot of depth {depth} at axis {a}")
        with kf.loop(outer, "parallel", grain=par_grain(depth * inner, PAR_MIN_WORK)) as o, \
                kf.loop(depth) as j, kf.loop(inner, "vector") as i:
            raw = ib[o, i]
            raw = raw if raw.dtype is INDEX else cast(raw, INDEX)
            v = op("add", raw, op("mul", cast(op("lt", raw, Const(0, INDEX)), INDEX), Const(depth, INDEX)))
            kf.store(yb, (o, j, i), select(op("eq", v, j), vb[Const(1, INDEX)], vb[Const(0, INDEX)]))
        return kf.finish()


class EyeLike(FormLowering):
    """Ones on diagonal ``k`` of a 2-D result, zeros elsewhere."""

    ops = (tn.EyeLike,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        return dtype_reason([n.outputs[0]], allowed=tuple(STORAGE_TYPES)) or self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        y = n.outputs[0]
        rows, cols = (int(d) for d in y.shape)
        ct = compute_type(y.type.dtype)
        kf = KernelForm(name)
        yb = kf.buffer("y", y.type.dtype, (rows, cols), "out", value=y)
        one, zero = (Const(True, ct), Const(False, ct)) if ct is DType.bool else (Const(1, ct), Const(0, ct))
        with kf.loop(rows, "parallel", grain=par_grain(cols, PAR_MIN_WORK)) as i, kf.loop(cols, "vector") as j:
            kf.store(yb, (i, j), select(op("eq", op("sub", j, i), Const(n.op.k, INDEX)), one, zero))
        return kf.finish()


LOWERINGS = (OneHot(), EyeLike())

__all__ = ["EyeLike", "LOWERINGS", "OneHot"]
