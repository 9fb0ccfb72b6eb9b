"""Softmax, LogSoftmax, LayerNormalization, RMSNormalization and LRN on the loop form, for every float type the form
holds (float16 computed in float32), and the row programs that ``row_reduce.py`` runs after an
elementwise chain.

**Rows.** Softmax along the last axis and LayerNormalization work on rows of ``D`` contiguous
elements (Softmax: the last axis; LayerNorm: ``prod(shape[axis:])``): the rows are split among the
threads, and each row is a few vector loops in order. Where the row's elements come from is a
``Row``: ``first(i)`` in the first pass (a load of x, or an elementwise chain computed and stored
on the way: ``row_reduce.py``), ``again(i)`` in the later passes.

* **Softmax**: ``m = max x`` (NaN-propagating), ``shift = m`` when finite else 0 (a row holding
  +inf gives NaN, a row of -inf NaN, as the reference), ``e = exp(x - shift)`` summed (``row_sum``:
  blocks summed in the compute type, their sums in float64);
  Softmax ``y = e / sum`` (``e`` kept in y between the passes when y holds the compute type, else
  computed again), LogSoftmax ``y = (x - shift) - log(sum)``.
* **LayerNormalization** (statistics in the ``stash_type`` precision: float32, or float64):
  ``mean = sum x / D``, ``var = sum (x - mean)^2 / D`` (two passes, like the reference's two-pass
  variance), ``inv = 1 / sqrt(var + epsilon)``, then
  ``y = round_X((x - mean) * inv) * scale + bias`` in X's compute type (sums: ``row_sum``). Scale and B must not vary
  over the leading (row) axes; ones that broadcast within the normalized axes must be constants
  (expanded at compile time). Mean and InvStdDev are written when they are used.
* **RMSNormalization**: ``ms = sum x^2 / D`` (``row_sum``), ``y = round_X(x / sqrt(ms + epsilon)) *
  scale`` in the compute type of scale's type (the result's), dividing as the reference does.

Softmax along another axis views x as ``[outer, A, inner]`` and reduces each column of A elements
(loop order outer (threads), a, inner: every read contiguous; the running max and sum of a column
live in a scratch row of ``inner`` elements per outer index; the sum is added in order along the
axis, in the compute type, as NumPy adds along a non-contiguous axis).

**LRN** sums the squares of the ``size`` channels around each channel (out-of-range channels
contribute 0) into the output plane, then ``y = x / (bias + alpha/size * sum) ** beta`` (``beta``
0.5, 0.75 and 1 by square roots, others as ``exp(beta log b)``); planes split among the threads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...ir.ops import conv as cv
from ...ir.ops import norm as nm
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import Const, Expr, cast, compute_type, op, select
from ..loops.form import Buffer
from .base import FormLowering, KernelGroup, dtype_reason, par_grain

FLOATS = (DType.f32, DType.f64, DType.f16, DType.bf16)
#: work per element of a softmax row (three passes and an exp), per LayerNorm element (three passes),
#: per RMSNorm element (two passes)
SOFTMAX_COST, LAYERNORM_COST, RMSNORM_COST = 4, 3, 2
#: elements per block of a row sum (``row_sum``)
SUM_BLOCK = 128
#: the most scratch bytes a softmax along an inner axis uses for its running max and sum
SOFTMAX_SCRATCH = 8 << 20


def float_reason(group: KernelGroup, values=None) -> str | None:
    """Why a one-node group's values are not static tensors of a float type the form holds, or empty."""
    n = group.node
    why = dtype_reason(values if values is not None else [n.inputs[0], n.outputs[0]], allowed=FLOATS)
    if why:
        return why
    if n.inputs[0].type.numel == 0:
        return "empty tensors are left to the interpreter"
    return None


@dataclass
class Row:
    """The elements of the row being worked on: ``first(i)`` in the row's first pass (it may store
    values on the way), ``again(i)`` in the passes after it."""

    first: Callable[[Expr], Expr]
    again: Callable[[Expr], Expr]

    @staticmethod
    def of(x: Buffer, r: Expr, dt: DType) -> "Row":
        """Row ``r`` of the ``[rows, D]`` buffer ``x``, read in type ``dt``."""
        read = lambda i: cast(x[r, i], dt)  # noqa: E731
        return Row(read, read)


def _finite_or_zero(m: Expr) -> Expr:
    return select(op("lt", op("abs", m), math.inf), m, 0.0)


def row_sum(kf: KernelForm, D: int, value: Callable[[Expr], Expr], dt: DType, mean: bool = False) -> Expr:
    """sum over i < D of ``value(i)`` (of type ``dt``), or with ``mean`` that sum / D: in blocks of
    ``SUM_BLOCK`` elements summed in ``dt`` (vector accumulators), the blocks' sums added (and divided)
    in float64 and rounded to ``dt`` once, so the error does not grow with the row's length (NumPy's
    pairwise summation is as accurate) and the vector loops stay ``dt``'s."""
    total, wide = _row_total(kf, D, value, dt)
    return cast(op("div", total, float(D)) if mean else total, dt) if wide else \
        (op("div", total, float(D)) if mean else total)


def row_mean(kf: KernelForm, D: int, value: Callable[[Expr], Expr], dt: DType) -> Expr:
    """The mean of ``value(i)`` over i < D, rounded to ``dt`` once: the elements are summed less the
    first (``value(0)``) and it is added back in float64, so a row whose mean is large against its
    spread (x = 100 + noise) keeps the digits the float32 block sums would lose."""
    if dt is DType.f64:
        return row_sum(kf, D, value, dt, mean=True)
    x0 = kf.let(value(Const(0, DType.i64)), "x0")
    total, wide = _row_total(kf, D, lambda i: value(i) - x0, dt)
    return cast(cast(x0, DType.f64) + op("div", total if wide else cast(total, DType.f64), float(D)), dt)


def _row_total(kf: KernelForm, D: int, value: Callable[[Expr], Expr], dt: DType) -> tuple[Expr, bool]:
    """(the sum of ``value(i)``, whether it is float64 rather than ``dt``): see ``row_sum``."""
    if dt is DType.f64 or D <= SUM_BLOCK:
        s = kf.acc(Const(0.0, dt), "sum")
        with kf.loop(D, "vector") as i:
            kf.update(s, "add", value(i))
        return s, False
    total = kf.acc(Const(0.0, DType.f64), "total")
    nb, tail = divmod(D, SUM_BLOCK)
    with kf.loop(nb, name="blk") as blk:
        s = kf.acc(Const(0.0, dt), "sum")
        with kf.loop(SUM_BLOCK, "vector") as j:
            kf.update(s, "add", value(blk * SUM_BLOCK + j))
        kf.update(total, "add", cast(s, DType.f64))
    if tail:
        s = kf.acc(Const(0.0, dt), "sum")
        with kf.loop(tail, "vector") as j:
            kf.update(s, "add", value(j + nb * SUM_BLOCK))
        kf.update(total, "add", cast(s, DType.f64))
    return total, True


def softmax_row(kf: KernelForm, D: int, row: Row, y: Buffer, r: Expr, log: bool) -> None:
    """(Log)Softmax of ``row`` into row ``r`` of the ``[rows, D]`` buffer ``y`` (see the module
    docstring; y is "inout" for Softmax of a compute type, which keeps e there); ``row`` may read
    ``y`` itself."""
    dt = compute_type(y.dtype)
    m = kf.acc(Const(-math.inf, dt), "max")
    with kf.loop(D, "vector") as i:
        kf.update(m, "max", row.first(i))
    shift = kf.let(_finite_or_zero(m), "shift")
    keep = not log and y.dtype is dt  # e kept in y between the passes (exact in the compute type)

    def exp(i):
        e = kf.let(op("exp", row.again(i) - shift), "e")
        if keep:
            kf.store(y, (r, i), e)
        return e
    total = kf.let(row_sum(kf, D, exp, dt), "total")
    if log:
        ls = kf.let(op("log", total), "logsum")
        with kf.loop(D, "vector") as i:
            kf.store(y, (r, i), (row.again(i) - shift) - ls)
        return
    with kf.loop(D, "vector") as i:
        e = y[r, i] if keep else op("exp", row.again(i) - shift)
        kf.store(y, (r, i), op("div", e, total))


def softmax_inner(kf: KernelForm, shape, axis: int, x: Buffer, y: Buffer, log: bool) -> None:
    """Softmax along an axis with ``inner`` > 1 elements after it (see the module docstring)."""
    O, A, I = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    dt = compute_type(y.dtype)
    mx = kf.buffer("max", dt, (O, I), "scratch")
    sm = kf.buffer("sum", dt, (O, I), "scratch")  # summed in order along a: NumPy's own order there
    with kf.loop(O, "parallel", grain=par_grain(SOFTMAX_COST * A * I)) as o:
        with kf.loop(I, "vector") as i:
            kf.store(mx, (o, i), -math.inf)
            kf.store(sm, (o, i), 0.0)
        with kf.loop(A) as a, kf.loop(I, "vector") as i:
            kf.store(mx, (o, i), op("max", mx[o, i], cast(x[o, a, i], dt)))
        with kf.loop(I, "vector") as i:
            kf.store(mx, (o, i), _finite_or_zero(mx[o, i]))
        with kf.loop(A) as a, kf.loop(I, "vector") as i:
            e = kf.let(op("exp", cast(x[o, a, i], dt) - mx[o, i]), "e")
            if y.dtype is dt and not log:
                kf.store(y, (o, a, i), e)
            kf.store(sm, (o, i), sm[o, i] + e)
        with kf.loop(A) as a, kf.loop(I, "vector") as i:
            total = sm[o, i]
            shifted = cast(x[o, a, i], dt) - mx[o, i]
            if log:
                v = shifted - op("log", total)
            else:
                v = op("div", y[o, a, i] if y.dtype is dt else op("exp", shifted), total)
            kf.store(y, (o, a, i), v)


class Softmax(FormLowering):
    """Softmax and LogSoftmax along any one axis, every float type (see the module docstring)."""

    ops = (nm.Softmax, nm.LogSoftmax)

    def check(self, group: KernelGroup) -> str | None:
        why = float_reason(group)
        if why:
            return why
        n = group.node
        shape = [int(d) for d in n.inputs[0].shape]
        a = n.op.axis % len(shape)
        inner = math.prod(shape[a + 1:])
        if inner > 1 and 16 * math.prod(shape[:a]) * inner > SOFTMAX_SCRATCH:
            return f"a softmax along axis {a} of {shape} needs more than {SOFTMAX_SCRATCH >> 20} MiB of scratch"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        shape = [int(d) for d in x.shape]
        a = n.op.axis % len(shape)
        log = isinstance(n.op, nm.LogSoftmax)
        kf = KernelForm(name)
        O, A, I = math.prod(shape[:a]), shape[a], math.prod(shape[a + 1:])
        role = "out" if log or y.type.dtype is not compute_type(y.type.dtype) else "inout"  # e kept in y
        if I > 1:
            xb = kf.buffer("x", x.type.dtype, (O, A, I), value=x)
            yb = kf.buffer("y", y.type.dtype, (O, A, I), role, value=y)
            softmax_inner(kf, shape, a, xb, yb, log)
            return kf.finish()
        xb = kf.buffer("x", x.type.dtype, (O, A), value=x)
        yb = kf.buffer("y", y.type.dtype, (O, A), role, value=y)
        with kf.loop(O, "parallel", grain=par_grain(SOFTMAX_COST * A), name="r") as r:
            softmax_row(kf, A, Row.of(xb, r, compute_type(y.type.dtype)), yb, r, log)
        return kf.finish()


# ---------------------------------------------------------------------------------------------
# LayerNormalization
# ---------------------------------------------------------------------------------------------

def _trailing(v, x, a: int):
    """How ``v`` (Scale or B) maps onto the normalized block x.shape[a:]: ("ptr", None) when it is that
    block exactly (leading 1s aside), ("weight", array) for a constant expanded to it, or a reason."""
    xs = [int(d) for d in x.shape]
    vs = [int(d) for d in v.shape]
    lead = len(xs) - len(vs)  # v right-aligned to x
    if any(d != 1 for i, d in enumerate(vs) if lead + i < a):
        return "Scale or B varies over the leading (not normalized) axes"
    tail = vs[max(0, a - lead):]
    block = xs[a:]
    if [1] * (len(block) - len(tail)) + tail == block:
        return ("ptr", None)
    data = v.const if v.const is not None else v.known
    if data is None:
        return "Scale or B broadcasts within the normalized axes and is not a constant"
    arr = np.asarray(data).reshape(tail)
    return ("weight", np.ascontiguousarray(np.broadcast_to(arr, block)).reshape(-1))


def stash_type(op) -> DType:
    """The type a LayerNormalization's statistics are computed in: float64 for a float64 stash_type,
    else float32 (the reference's ``_work``)."""
    return DType.f64 if DType.from_onnx(op.stash_type) is DType.f64 else DType.f32


class ScaleBias:
    """A LayerNormalization's Scale and B as ``[D]`` buffers of ``kf``: their own, or constants
    expanded to the normalized block (made once per form)."""

    def __init__(self, node, a: int):
        x = node.inputs[0]
        self.values = (list(node.inputs[1:]) + [None])[:2]
        self.params = [None if v is None else _trailing(v, x, a) for v in self.values]
        self.D = math.prod(int(d) for d in x.shape[a:])

    def reason(self) -> str | None:
        return next((p for p in self.params if isinstance(p, str)), None)

    def buffers(self, kf: KernelForm) -> list[Buffer | None]:
        out = []
        for name, v, p in zip(("scale", "bias"), self.values, self.params):
            if p is None:
                out.append(None)
            else:
                data = v if p[0] == "ptr" else p[1]
                out.append(kf.buffer(name, v.type.dtype, (self.D,), value=data))
        return out


def layernorm_row(kf: KernelForm, D: int, row: Row, y: Buffer, r: Expr, scale: Buffer | Expr | None,
                  bias: Buffer | Expr | None, epsilon: float, stash: DType,
                  round_first: bool = True) -> tuple[Expr, Expr]:
    """Normalize ``row`` (elements read in ``stash``) into row ``r`` of the ``[rows, D]`` buffer
    ``y``, times ``scale``, plus ``bias`` (``[D]`` buffers, one value for the whole row, or None);
    returns (mean, 1 / std). ``round_first``: a float16 result is rounded to float16 before the
    scale (LayerNormalization), else only at the end (InstanceNormalization)."""
    mean = kf.let(row_mean(kf, D, row.first, stash), "mean")
    var = row_sum(kf, D, lambda i: (lambda d: d * d)(row.again(i) - mean), stash, mean=True)
    inv = kf.let(op("div", Const(1.0, stash), op("sqrt", var + float(epsilon))), "inv")
    out = compute_type(y.dtype)
    with kf.loop(D, "vector") as i:
        v = (row.again(i) - mean) * inv
        if y.dtype is DType.f16 and round_first:
            v = op("to_f16", v)  # the normalized value is rounded to X's type first
        v = cast(v, out)
        if scale is not None:
            v = v * cast(scale[i] if isinstance(scale, Buffer) else scale, out)
        if bias is not None:
            v = v + cast(bias[i] if isinstance(bias, Buffer) else bias, out)
        kf.store(y, (r, i), v)
    return mean, inv


def _rows_reason(group: KernelGroup, values) -> str | None:
    """Why a normalization over trailing axes has no row kernel: its ``values``' types, or a Scale or
    B that varies over the rows."""
    n = group.node
    return float_reason(group, values) or ScaleBias(n, n.op.axis % n.inputs[0].type.rank).reason()


def _trailing_rows(kf: KernelForm, n):
    """A normalization over axes [axis, rank) as rows: (axis, R rows, D elements each, x and y as
    ``[R, D]`` buffers of ``kf``, the Scale and B buffers)."""
    x, y = n.inputs[0], n.outputs[0]
    shape = [int(d) for d in x.shape]
    a = n.op.axis % len(shape)
    R, D = math.prod(shape[:a]), math.prod(shape[a:])
    xb = kf.buffer("x", x.type.dtype, (R, D), value=x)
    yb = kf.buffer("y", y.type.dtype, (R, D), "out", value=y)
    return a, R, D, xb, yb, ScaleBias(n, a).buffers(kf)


class LayerNorm(FormLowering):
    """LayerNormalization, every float type, statistics in float32 or (stash_type float64) float64."""

    ops = (nm.LayerNormalization,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        return _rows_reason(group, list(n.inputs) + [n.outputs[0]] + [v for v in n.outputs[1:] if v.uses])

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        kf = KernelForm(name)
        a, R, D, xb, yb, (scale, bias) = _trailing_rows(kf, n)
        stash = stash_type(n.op)
        stats = [kf.buffer(what, v.type.dtype, (R,), "out", value=v) if v.uses else None
                 for what, v in zip(("mean", "inv_std"), n.outputs[1:3])]
        with kf.loop(R, "parallel", grain=par_grain(LAYERNORM_COST * D), name="r") as r:
            got = layernorm_row(kf, D, Row.of(xb, r, stash), yb, r, scale, bias, n.op.epsilon, stash)
            for buf, v in zip(stats, got):
                if buf is not None:
                    kf.store(buf, r, cast(v, compute_type(buf.dtype)))
        return kf.finish()


_ROUND = {DType.f16: "to_f16", DType.bf16: "to_bf16"}


class RMSNorm(FormLowering):
    """RMSNormalization, every float type (X and scale may differ), statistics in float32 or
    (stash_type float64) float64: per row ``ms = sum x^2 / D`` (``row_sum``), then
    ``y = round_X(x / sqrt(ms + epsilon)) * scale`` in the compute type of the result (scale's type),
    as the reference divides."""

    ops = (nm.RMSNormalization,)

    def check(self, group: KernelGroup) -> str | None:
        return _rows_reason(group, list(group.node.inputs) + [group.node.outputs[0]])

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        kf = KernelForm(name)
        a, R, D, xb, yb, (scale, _) = _trailing_rows(kf, n)
        stash, xdt, out = stash_type(n.op), xb.dtype, compute_type(yb.dtype)
        with kf.loop(R, "parallel", grain=par_grain(RMSNORM_COST * D), name="r") as r:
            row = Row.of(xb, r, stash)
            ms = row_sum(kf, D, lambda i: (lambda v: v * v)(row.first(i)), stash, mean=True)
            std = kf.let(op("sqrt", ms + float(n.op.epsilon)), "std")
            with kf.loop(D, "vector") as i:
                v = op("div", row.again(i), std)
                if xdt in _ROUND:
                    v = op(_ROUND[xdt], v)  # the normalized value is rounded to X's type first
                elif xdt is DType.f32 and stash is DType.f64:
                    v = cast(v, DType.f32)
                kf.store(yb, (r, i), cast(v, out) * cast(scale[i], out))
        return kf.finish()


def _channel_norm_buffers(kf: KernelForm, n, rows: int, D: int):
    """x and y as ``[rows, D]``, and the per-channel scale and bias, of an Instance/GroupNormalization."""
    x, scale, bias = n.inputs
    y = n.outputs[0]
    C = int(x.shape[1])
    return (kf.buffer("x", x.type.dtype, (rows, D), value=x), kf.buffer("y", y.type.dtype, (rows, D), "out", value=y),
            kf.buffer("scale", scale.type.dtype, (C,), value=scale), kf.buffer("B", bias.type.dtype, (C,), value=bias))


class InstanceNorm(FormLowering):
    """InstanceNormalization, every float type: each (image, channel) plane a row of LayerNorm's
    program (statistics in float32, float64 for float64), times the channel's scale plus its bias."""

    ops = (nm.InstanceNormalization,)

    def check(self, group: KernelGroup) -> str | None:
        return float_reason(group, list(group.node.inputs) + [group.node.outputs[0]])

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x = n.inputs[0]
        shape = [int(d) for d in x.shape]
        C = shape[1]
        R, D = shape[0] * C, math.prod(shape[2:])
        stash = DType.f64 if x.type.dtype is DType.f64 else DType.f32
        kf = KernelForm(name)
        xb, yb, sb, bb = _channel_norm_buffers(kf, n, R, D)
        with kf.loop(R, "parallel", grain=par_grain(LAYERNORM_COST * D), name="r") as r:
            c = kf.let(op("rem", r, Const(C, r.dtype)), "c")
            layernorm_row(kf, D, Row.of(xb, r, stash), yb, r, sb[c], bb[c], n.op.epsilon, stash, round_first=False)
        return kf.finish()


class GroupNorm(FormLowering):
    """GroupNormalization, every float type: each (image, group) a row of ``C / G`` channel planes,
    its statistics in ``stash_type`` precision (float32 or float64) over the whole row, the normalized
    value rounded to X's type, then each channel's scale and bias (the op's definition)."""

    ops = (nm.GroupNormalization,)

    def check(self, group: KernelGroup) -> str | None:
        return float_reason(group, list(group.node.inputs) + [group.node.outputs[0]])

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        y = n.outputs[0]
        shape = [int(d) for d in n.inputs[0].shape]
        C, G = shape[1], int(n.op.num_groups)
        Cg, HW = C // G, math.prod(shape[2:])
        R, D = shape[0] * G, Cg * HW
        stash = DType.f64 if nm._stash_dtype(n.op, n.op.stash_type) is DType.f64 else DType.f32
        out = compute_type(y.type.dtype)
        kf = KernelForm(name)
        xb, yb, sb, bb = _channel_norm_buffers(kf, n, R, D)
        kf.note(f"GroupNorm: {R} rows of {Cg} channel(s) x {HW}")
        with kf.loop(R, "parallel", grain=par_grain(LAYERNORM_COST * D), name="r") as r:
            row = Row.of(xb, r, stash)
            mean = kf.let(row_mean(kf, D, row.first, stash), "mean")
            var = row_sum(kf, D, lambda i: (lambda d: d * d)(row.again(i) - mean), stash, mean=True)
            inv = kf.let(op("div", Const(1.0, stash), op("sqrt", var + float(n.op.epsilon))), "inv")
            g = kf.let(op("rem", r, Const(G, r.dtype)), "g")
            with kf.loop(Cg, name="cl") as cl:
                c = kf.let(g * Cg + cl, "c")
                sc = kf.let(cast(sb[c], out), "sc")
                bi = kf.let(cast(bb[c], out), "bi")
                with kf.loop(HW, "vector") as j:
                    i = cl * HW + j
                    v = (row.again(i) - mean) * inv
                    if y.type.dtype is DType.f16:
                        v = op("to_f16", v)  # the normalized value is rounded to X's type first
                    elif y.type.dtype is DType.bf16:
                        v = op("to_bf16", v)
                    kf.store(yb, (r, i), cast(v, out) * sc + bi)
        return kf.finish()


# ---------------------------------------------------------------------------------------------
# LRN
# ---------------------------------------------------------------------------------------------

def _pow(d: Expr, beta: float) -> Expr:
    if beta == 1.0:
        return d
    if beta == 0.5:
        return op("sqrt", d)
    if beta == 0.75:
        r = op("sqrt", d)
        return r * op("sqrt", r)
    return op("exp", op("log", d) * beta)


class Lrn(FormLowering):
    """LRN across channels, every float type."""

    ops = (cv.LRN,)

    def check(self, group: KernelGroup) -> str | None:
        why = float_reason(group)
        if why:
            return why
        if group.node.inputs[0].type.rank < 3:
            return "LRN of a tensor without spatial axes"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        node = group.node
        o = node.op
        x, y = node.inputs[0], node.outputs[0]
        shape = [int(d) for d in x.shape]
        N, C, S = shape[0], shape[1], math.prod(shape[2:])
        dt = compute_type(y.type.dtype)
        before = (o.size - 1) // 2
        narrow = np.float64 if dt is DType.f64 else np.float32  # constants rounded as the reference's
        alpha, bias = float(narrow(o.alpha / o.size)), float(narrow(o.bias))
        beta = float(narrow(o.beta))
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, (N, C, S), value=x)
        # the squares accumulate in y's plane (in the compute type; a scratch plane for float16)
        yb = kf.buffer("y", y.type.dtype, (N, C, S), "inout" if y.type.dtype is dt else "out", value=y)
        acc = yb if y.type.dtype is dt else kf.buffer("sq", dt, (N, C, S), "scratch")
        with kf.loop(N * C, "parallel", grain=par_grain(S * (o.size + 2)), name="p") as p:
            n = kf.let(op("div", p, C), "n")
            c = kf.let(op("rem", p, C), "c")
            with kf.loop(S, "vector") as s:
                kf.store(acc, (n, c, s), Const(0.0, dt))
            with kf.loop(o.size, name="j") as j:  # channel c + j - before, in the reference's order
                cc = kf.let(c + j - before, "cc")
                inside = kf.let(op("and", op("ge", cc, 0), op("lt", cc, C)), "inside")
                src = kf.let(op("min", op("max", cc, 0), C - 1), "src")
                with kf.loop(S, "vector") as s:
                    v = cast(xb[n, src, s], dt)
                    kf.store(acc, (n, c, s), acc[n, c, s] + select(inside, v * v, Const(0.0, dt)))
            with kf.loop(S, "vector") as s:
                d = op("add", Const(bias, dt), op("mul", Const(alpha, dt), acc[n, c, s]))
                kf.store(yb, (n, c, s), op("div", cast(xb[n, c, s], dt), _pow(d, beta)))
        return kf.finish()


__all__ = ["LayerNorm", "Lrn", "Row", "ScaleBias", "Softmax", "layernorm_row", "row_mean", "row_sum", "softmax_row", "stash_type"]
