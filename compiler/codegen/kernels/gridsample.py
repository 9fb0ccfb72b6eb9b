"""GridSample on the loop form: any number of spatial axes, every mode (linear, nearest, cubic) and
padding mode (zeros, border, reflection), align_corners, every numeric storage type of X.

Per output point (image, position: the parallel loop and the loops under it) the grid's coordinates
are read once and turned into taps per axis exactly as the reference does, in float64: unnormalized
(align_corners or not), reflected or clamped by the padding mode, then floor and fraction (linear:
two taps, weights 1 - t and t; nearest: one, rounded half to even; cubic: four, Keys' kernel with
a = -0.75, the padding applied to each tap's index). A tap outside the input weighs 0 and reads a
clamped element. Then for each channel the weighted sum of the tap combinations, in float32
(float64 for float64 and wide integers), rounded to X's type as the reference.
"""
from __future__ import annotations

import itertools
import math

from ...ir.ops import resample as rs
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, STORAGE_TYPES, Const, cast, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain
from .resize import _to_type

F64 = DType.f64


def _f(v: float) -> Const:
    return Const(float(v), F64)


def _reflect(kf: KernelForm, x, lo: float, hi: float):
    span = hi - lo
    if span <= 0:
        return _f(lo)
    d = kf.let(op("abs", op("sub", x, _f(lo))), name="d")
    flips = kf.let(op("floor", op("div", d, _f(span))), name="flips")
    extra = op("sub", d, op("mul", flips, _f(span)))
    even = op("eq", op("rem", flips, _f(2.0)), _f(0.0))
    return kf.let(select(even, op("add", _f(lo), extra), op("sub", _f(hi), extra)), name="refl")


def _cubic(d, a: float = -0.75):
    """Keys' kernel at distance d (an f64 expression)."""
    d = op("abs", d)
    near = op("add", op("mul", op("mul", op("sub", op("mul", _f(a + 2), d), _f(a + 3)), d), d), _f(1.0))
    far = op("sub", op("mul", op("add", op("mul", op("sub", op("mul", _f(a), d), _f(5 * a)), d), _f(8 * a)), d),
             _f(4 * a))
    return select(op("le", d, _f(1.0)), near, select(op("lt", d, _f(2.0)), far, _f(0.0)))


class GridSample(FormLowering):
    ops = (rs.GridSample,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, grid = n.inputs
        why = dtype_reason([x, n.outputs[0]], allowed=tuple(STORAGE_TYPES - {DType.bool})) or \
            dtype_reason([grid], allowed=(DType.f32, DType.f64, DType.f16, DType.bf16))
        if why:
            return why
        if x.type.numel == 0 or n.outputs[0].type.numel == 0:
            return "empty tensors are left to the interpreter"
        return self.form_reason(group)

    def _pad(self, kf, o, c, size: int):
        if o.padding_mode == "border":
            return op("min", op("max", c, _f(0.0)), _f(size - 1))
        if o.padding_mode == "reflection":
            c = _reflect(kf, c, 0.0, size - 1.0) if o.align_corners else _reflect(kf, c, -0.5, size - 0.5)
            return op("min", op("max", c, _f(0.0)), _f(size - 1))
        return c

    def _taps(self, kf, o, g, size: int):
        """[(index (i64, clamped), weight (f64, 0 outside))] along one axis for the coordinate g."""
        c = op("div", op("mul", op("add", g, _f(1.0)), _f(size - 1)), _f(2.0)) if o.align_corners else \
            op("div", op("sub", op("mul", op("add", g, _f(1.0)), _f(size)), _f(1.0)), _f(2.0))
        c = kf.let(c, name="c")
        if o.mode == "cubic":
            c0 = kf.let(op("floor", c), name="c0")
            t = kf.let(op("sub", c, c0), name="t")
            taps = [(kf.let(self._pad(kf, o, op("add", c0, _f(k)), size), name="i"), _cubic(op("sub", t, _f(k))))
                    for k in (-1, 0, 1, 2)]
        else:
            c = kf.let(self._pad(kf, o, c, size), name="cp")
            if o.mode == "nearest":
                taps = [(op("round", c), _f(1.0))]
            else:
                c0 = kf.let(op("floor", c), name="c0")
                t = kf.let(op("sub", c, c0), name="t")
                taps = [(c0, op("sub", _f(1.0), t)), (op("add", c0, _f(1.0)), t)]
        out = []
        for i, w in taps:
            i = kf.let(i, name="fi")
            inside = op("and", op("ge", i, _f(0.0)), op("le", i, _f(size - 1)))  # false for NaN
            safe = select(inside, i, _f(0.0))
            out.append((kf.let(op("min", op("max", cast(safe, INDEX), Const(0, INDEX)), Const(size - 1, INDEX)),
                               name="ix"),
                        kf.let(select(inside, w, _f(0.0)), name="w")))
        return out

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        o = n.op
        x, grid = n.inputs
        y = n.outputs[0]
        xs = [int(d) for d in x.shape]
        N, C, spatial = xs[0], xs[1], xs[2:]
        r = len(spatial)
        outs = [int(d) for d in grid.shape[1:-1]]
        cdt = F64 if (x.type.dtype is F64 or (x.type.dtype.is_int and x.type.dtype.np.itemsize >= 4)) else DType.f32
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, xs, value=x)
        gb = kf.buffer("grid", grid.type.dtype, [N] + outs + [r], value=grid)
        yb = kf.buffer("y", y.type.dtype, [N, C] + outs, "out", value=y)
        kf.note(f"GridSample {o.mode}, padding {o.padding_mode}, {r} spatial axes")
        P = math.prod(outs)
        with kf.loop(N, "parallel", grain=par_grain(P * C * 4)) as img:
            pos = []

            def body():
                taps = []
                for d in range(r):  # grid[..., 0] is the last axis
                    g = cast(gb[tuple([img] + pos + [Const(r - 1 - d, INDEX)])], F64)
                    taps.append(self._taps(kf, o, kf.let(g, name="g"), spatial[d]))
                combos = []
                for combo in itertools.product(*taps):
                    w = combo[0][1]
                    for _, wk in combo[1:]:
                        w = op("mul", w, wk)
                    combos.append(([i for i, _ in combo], kf.let(cast(w, cdt), name="wc")))
                with kf.loop(C, name="ch") as ch:
                    acc = None
                    for idx, w in combos:
                        term = op("mul", cast(xb[tuple([img, ch] + idx)], cdt), w)
                        acc = term if acc is None else op("add", acc, term)
                    v = cast(acc, compute_type(y.type.dtype)) if o.mode == "nearest" and not y.type.dtype.is_int \
                        else _to_type(acc, y.type.dtype)
                    kf.store(yb, tuple([img, ch] + pos), v)

            def nest(axis: int):
                if axis == len(outs):
                    return body()
                with kf.loop(outs[axis], name="p") as p:
                    pos.append(p)
                    nest(axis + 1)
                    pos.pop()

            nest(0)
        return kf.finish()


LOWERINGS = (GridSample(),)

__all__ = ["GridSample", "LOWERINGS"]
