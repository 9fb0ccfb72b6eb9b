"""Resize on the loop form: every mode (nearest, linear, cubic), coordinate transformation and
nearest mode, antialiasing, exclude_outside and tf_crop_and_resize's extrapolation, every storage
type the form holds.

With static shapes and constant scales (or sizes) and roi, where each output position samples the
input is known when compiling: the op's own ``_coords`` and ``_taps`` (the reference's code, so the
taps and weights are the reference's numbers) give, per resized axis, a table of input indices and
one of weights (``[out, taps]``; taps whose weight is 0 everywhere dropped, an axis the reference
leaves as it is has none). The kernel reads the tables: each output element is
``sum over the taps of each axis of prod(weights) * x[indices]`` in float32 (float64 for float64
and wide integers), rounded to the element type (integers to nearest even, saturated), or, for
nearest, a plain gather. Unlike the reference, which resamples one axis at a time, the sum is taken
over all axes at once: the same terms, added in another order (float rounding only).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...ir.ops import resample as rs
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, STORAGE_TYPES, Const, cast, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain

#: the most tap combinations one output element may sum (2 per axis for linear, 4 for cubic; more
#: with antialiasing when shrinking)
MAX_TERMS = 256


def resize_tables(node):
    """(output shape, per axis: None (not resampled) or (indices [out, T], weights [out, T] or None
    for nearest, inside [out] or None)); ``ValueError`` with the reason where not known."""
    x, roi, scales, sizes = (list(node.inputs) + [None] * 4)[:4]
    o = node.op
    shape = [int(d) for d in x.shape]
    axes = o._axes(len(shape))

    def known(v):
        if v is None or rs._is_empty(v):
            return None
        if v.known is None:
            raise ValueError(f"{v} is not known when compiling")
        return np.asarray(v.known)

    sc, sz = known(scales), known(sizes)
    if (sc is None) == (sz is None):
        raise ValueError("needs exactly one of scales and sizes, known when compiling")
    out, eff = o._plan(shape, axes, [float(v) for v in sc.ravel()] if sc is not None else None,
                       [int(v) for v in sz.ravel()] if sz is not None else None)
    starts, ends = [0.0] * len(shape), [1.0] * len(shape)
    crop = o.coordinate_transformation_mode == "tf_crop_and_resize"
    if crop:
        rv = known(roi)
        if rv is None or rv.size != 2 * len(axes):
            raise ValueError("tf_crop_and_resize needs a roi known when compiling")
        rv = rv.astype(np.float64).ravel()
        for i, a in enumerate(axes):
            starts[a], ends[a] = float(rv[i]), float(rv[len(axes) + i])
    tables: list = [None] * len(shape)
    for a in axes:
        in_len, out_len = shape[a], int(out[a])
        scale, length = eff[a]
        xo = o._coords(out_len, in_len, scale, length, starts[a], ends[a])
        inside = ((xo >= 0) & (xo <= in_len - 1)) if crop else None
        if inside is not None and inside.all():
            inside = None
        identity = out_len == in_len and (np.array_equal(xo, np.arange(in_len, dtype=np.float64)) or (
            scale == 1.0 and o.coordinate_transformation_mode == "tf_half_pixel_for_nn")) and \
            not (o.antialias and scale < 1)
        if identity:
            tables[a] = None if inside is None else (np.arange(out_len)[:, None], None, inside)
            continue
        idx, w = o._taps(xo, in_len, scale)
        if w is not None:
            keep = w.any(axis=0)  # taps of weight 0 everywhere are skipped, as the reference does
            idx, w = idx[:, keep], w[:, keep]
        tables[a] = (np.ascontiguousarray(idx, np.int64), w, inside)
    return [int(d) for d in out], tables


class Resize(FormLowering):
    """Resize (see the module docstring)."""

    ops = (rs.Resize,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        types = tuple(STORAGE_TYPES) if n.op.mode == "nearest" else tuple(STORAGE_TYPES - {DType.bool})
        why = dtype_reason([x, y], allowed=types)
        if why:
            return why
        if x.type.numel == 0 or y.type.numel == 0:
            return "empty tensors are left to the interpreter"
        try:
            _, tables = resize_tables(n)
        except ValueError as e:
            return str(e)
        terms = math.prod(t[0].shape[1] for t in tables if t is not None)
        if terms > MAX_TERMS:
            return f"{terms} taps per output element (more than {MAX_TERMS})"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        out, tables = resize_tables(n)
        shape = [int(d) for d in x.shape]
        nearest = n.op.mode == "nearest"
        cdt = DType.f64 if (x.type.dtype is DType.f64 or (x.type.dtype.is_int and x.type.dtype.np.itemsize >= 4)) \
            else DType.f32
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, shape, value=x)
        yb = kf.buffer("y", y.type.dtype, out, "out", value=y)
        bufs = {}
        for a, t in enumerate(tables):
            if t is None:
                continue
            idx, w, inside = t
            bufs[a] = (kf.buffer(f"idx{a}", DType.i64, idx.shape, value=idx),
                       kf.buffer(f"w{a}", cdt, w.shape, value=np.ascontiguousarray(w, cdt.np)) if w is not None
                       else None,
                       kf.buffer(f"in{a}", DType.u8, inside.shape, value=inside.astype(np.uint8))
                       if inside is not None else None)
        kf.note(f"{n.op.mode} resize, taps and weights tabulated per axis: "
                f"{', '.join(f'axis {a}: {t[0].shape[1]}' for a, t in enumerate(tables) if t is not None)}")
        inner = math.prod(out[1:])
        with kf.loop(out[0], "parallel", grain=par_grain(inner * (1 if nearest else 4))) as i0:
            index = [i0]

            def body():
                resampled = [a for a in bufs]
                taps = [range(bufs[a][0].shape[1]) for a in resampled]
                at = {a: [kf.let(op("min", op("max", bufs[a][0][index[a], Const(t, INDEX)], Const(0, INDEX)),
                                    Const(shape[a] - 1, INDEX)), name="ix") for t in taps[k]]
                      for k, a in enumerate(resampled)}
                acc = None
                for combo in itertools.product(*taps):
                    pos = list(index)
                    for a, t in zip(resampled, combo):
                        pos[a] = at[a][t]
                    v = xb[tuple(pos)]
                    if nearest:
                        acc = v
                        break
                    term = cast(v, cdt)
                    for a, t in zip(resampled, combo):
                        term = op("mul", term, bufs[a][1][index[a], Const(t, INDEX)])
                    acc = term if acc is None else op("add", acc, term)
                if not nearest:
                    acc = _to_type(acc, y.type.dtype)
                ok = None
                for a in resampled:
                    if bufs[a][2] is not None:
                        test = op("ne", bufs[a][2][index[a]], Const(0, DType.u8))
                        ok = test if ok is None else op("and", ok, test)
                if ok is not None:
                    acc = select(ok, acc, _const(n.op.extrapolation_value, compute_type(y.type.dtype)))
                kf.store(yb, tuple(index), acc)

            def nest(axis: int):
                if axis == len(out):
                    return body()
                with kf.loop(out[axis], "vector" if axis == len(out) - 1 else "serial") as i:
                    index.append(i)
                    nest(axis + 1)
                    index.pop()

            nest(1)
        return kf.finish()


def _to_type(v, dt: DType):
    """An interpolated value in the result's type: integers rounded to nearest even and saturated."""
    if not dt.is_int:
        return cast(v, compute_type(dt))
    info = np.iinfo(dt.np)
    v = op("round", v)
    v = op("min", op("max", v, Const(float(info.min), v.dtype)), Const(float(info.max), v.dtype))
    return cast(v, dt)


def _const(value: float, dt: DType) -> Const:
    if dt.is_float:
        return Const(float(value), dt)
    return Const(bool(value) if dt is DType.bool else int(value), dt)


LOWERINGS = (Resize(),)

__all__ = ["LOWERINGS", "Resize", "resize_tables"]
