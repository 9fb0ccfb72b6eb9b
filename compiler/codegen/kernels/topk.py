"""TopK on the loop form, every numeric storage type: the k largest (or smallest) elements along the
axis and their indices, in the reference's order (by value, equal values by index, NaN last).

Per row of the axis (``reduction.along_axis``), the j-th result is the first element, in that order,
after the (j-1)-th: two passes over the row, each a plain reduction. The first finds the best value
among the elements ordered after the previous result (the maximum, or the minimum for the
smallest; a NaN counts only when no number is left); the second the lowest index holding it among
them. k passes of two: for the small k of detection heads and routing (top-1 to top-8 over a few
thousand) that is a few reads of the row; k is limited to ``MAX_K``.
"""
from __future__ import annotations

from ...ir.ops import indexing as ix
from ...ir.types import DType
from ..loops import Kernel
from ..loops.expr import INDEX, STORAGE_TYPES, Const, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason
from .reduction import along_axis

#: the most results per row computed natively (each costs two passes over the row)
MAX_K = 64


class TopK(FormLowering):
    ops = (ix.TopK,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, k = n.inputs
        why = dtype_reason([x, n.outputs[0], n.outputs[1]], allowed=tuple(STORAGE_TYPES - {DType.bool}))
        if why:
            return why
        if k.known is None:
            return "K is only known at run time"
        kk = int(k.known.ravel()[0])
        if kk > MAX_K:
            return f"K = {kk}: more than {MAX_K} results per row are left to the interpreter"
        if x.type.numel == 0 or kk == 0:
            return "empty tensors are left to the interpreter"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x = n.inputs[0]
        kk = int(n.inputs[1].known.ravel()[0])
        kf, xb, rows = along_axis(group, name)
        outer, count, inner = xb.shape
        vb = kf.buffer("values", x.type.dtype, (outer, kk, inner), "inout", value=n.outputs[0])
        ib = kf.buffer("indices", DType.i64, (outer, kk, inner), "inout", value=n.outputs[1])
        ct = compute_type(x.type.dtype)
        floats = ct.is_float
        largest = bool(n.op.largest)
        better = "gt" if largest else "lt"
        extreme = "max" if largest else "min"
        worst = Const(float("-inf") if largest else float("inf"), ct) if floats else \
            Const(int(np_info(ct, not largest)), ct)
        kf.note(f"TopK {kk} of {count} ({'largest' if largest else 'smallest'}), two passes per result")
        with rows as (o, i):
            for j in range(kk):
                if j:
                    pv = kf.let(vb[o, Const(j - 1, INDEX), i], name="pv")
                    pi = kf.let(ib[o, Const(j - 1, INDEX), i], name="pi")
                    pnan = kf.let(op("isnan", pv), name="pnan") if floats else None

                def after(v, c):
                    """Whether element (v, c) comes after the previous result in the order."""
                    if not j:
                        return Const(True, DType.bool)
                    tie = op("and", op("eq", v, pv), op("lt", pi, c))
                    num = op("or", op(better, pv, v), tie)
                    if not floats:
                        return num
                    vnan = op("isnan", v)
                    # previous a number: v after it if v is NaN, or a number after it; previous NaN:
                    # only NaNs of higher index come after
                    return select(pnan, op("and", vnan, op("lt", pi, c)), op("or", vnan, num))

                best = kf.acc(worst, name="best")
                found = kf.acc(Const(False, DType.bool), name="found")  # a number is left
                with kf.loop(count, name="c") as c:
                    v = kf.let(xb[o, c, i], name="v")
                    ok = kf.let(after(v, c), name="ok")
                    num_ok = op("and", ok, op("not", op("isnan", v))) if floats else ok
                    kf.update(best, extreme, select(num_ok, v, worst))
                    kf.update(found, "or", num_ok)
                first = kf.acc(Const(count, INDEX), name="first")
                with kf.loop(count, name="c") as c:
                    v = kf.let(xb[o, c, i], name="v")
                    hit = op("eq", v, best)
                    if floats:
                        hit = select(found, op("and", op("not", op("isnan", v)), hit), op("isnan", v))
                    kf.update(first, "min", select(op("and", after(v, c), hit), c, Const(count, INDEX)))
                at = kf.let(op("max", op("min", first, Const(count - 1, INDEX)), Const(0, INDEX)), name="at")
                kf.store(vb, (o, Const(j, INDEX), i), xb[o, at, i])
                kf.store(ib, (o, Const(j, INDEX), i), at)
        return kf.finish()


def np_info(dt: DType, largest: bool) -> int:
    import numpy as np

    info = np.iinfo(dt.np)
    return info.max if largest else info.min


LOWERINGS = (TopK(),)

__all__ = ["LOWERINGS", "TopK"]
