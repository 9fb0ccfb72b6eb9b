"""LpPool on the loop form: ``(sum over each window of |x|^p) ^ (1/p)`` (padding adds zeros), any
number of spatial axes, strides, dilations, pads and ceil_mode, float types (sums in float32, float64
for float64). A thread's share is whole planes; each output element sums its window's taps in the
reference's order (a tap in the padding is dropped by a ``select``, its read clamped)."""
from __future__ import annotations

import itertools
import math

from ...ir.ops import pool as P
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, Const, cast, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain
from .pool import window_axes

#: the most taps of one window written out in the kernel (the taps are unrolled)
MAX_TAPS = 64


class LpPool(FormLowering):
    ops = (P.LpPool,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason([n.inputs[0], n.outputs[0]], allowed=(DType.f32, DType.f64, DType.f16, DType.bf16))
        if why:
            return why
        if n.inputs[0].type.numel == 0 or n.outputs[0].type.numel == 0:
            return "empty tensors are left to the interpreter"
        if math.prod(n.op.kernel_shape) > MAX_TAPS:
            return f"windows of more than {MAX_TAPS} taps are left to the interpreter"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        xs = [int(d) for d in x.shape]
        spatial, outs = xs[2:], [int(d) for d in y.shape[2:]]
        axes = window_axes(n)
        pb, strides, dilations, ks = [a.pb for a in axes], [a.s for a in axes], [a.d for a in axes], [a.k for a in axes]
        p = int(n.op.p)
        ct = DType.f64 if x.type.dtype is DType.f64 else DType.f32
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, xs, value=x)
        yb = kf.buffer("y", y.type.dtype, [xs[0], xs[1]] + outs, "out", value=y)
        kf.note(f"LpPool p={p}, {'x'.join(map(str, ks))} window, each output's taps in order")
        planes = xs[0] * xs[1]
        with kf.loop(planes, "parallel", grain=par_grain(math.prod(outs) * math.prod(ks))) as pl:
            img = kf.let(op("div", pl, Const(xs[1], INDEX)), name="img")
            ch = kf.let(op("rem", pl, Const(xs[1], INDEX)), name="ch")
            pos = []

            def body():
                acc = None
                for kk in itertools.product(*[range(k) for k in ks]):
                    ok, idx = None, []
                    for a, k in enumerate(kk):
                        i = op("add", op("mul", pos[a], Const(strides[a], INDEX)),
                               Const(k * dilations[a] - pb[a], INDEX))
                        inside = op("and", op("ge", i, Const(0, INDEX)), op("lt", i, Const(spatial[a], INDEX)))
                        ok = inside if ok is None else op("and", ok, inside)
                        idx.append(op("min", op("max", i, Const(0, INDEX)), Const(spatial[a] - 1, INDEX)))
                    a_ = op("abs", cast(xb[tuple([img, ch] + idx)], ct))
                    term = a_ if p == 1 else op("mul", a_, a_) if p == 2 else op("pow", a_, Const(float(p), ct))
                    term = select(ok, term, Const(0.0, ct))
                    acc = term if acc is None else op("add", acc, term)
                v = acc if p == 1 else op("sqrt", acc) if p == 2 else op("pow", acc, Const(1.0 / p, ct))
                kf.store(yb, tuple([img, ch] + pos), cast(v, compute_type(y.type.dtype)))

            def nest(axis: int):
                if axis == len(outs):
                    return body()
                kind = "vector" if axis == len(outs) - 1 else "serial"
                with kf.loop(outs[axis], kind, name="o") as o:
                    pos.append(o)
                    nest(axis + 1)
                    pos.pop()

            nest(0)
        return kf.finish()


LOWERINGS = (LpPool(),)

__all__ = ["LOWERINGS", "LpPool"]
