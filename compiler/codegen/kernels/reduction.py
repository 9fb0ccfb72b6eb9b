"""Reduce* (Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare) over constant axes, and
ArgMax/ArgMin, on every element type the loop form holds, as one loop-form kernel each.

The input's axes are merged into runs of kept (K) and reduced (R) axes (size-1 axes dropped); the
result's elements are the kept runs in order. Two loop orders, each op's pieces from
``loops.scalar.REDUCTIONS`` (identity, combiner, the map before and the finish after):

* **rows** (any layout): a loop per kept run (the first split among the threads), an accumulator,
  a loop per reduced run: ``y[k] = post(reduce_r pre(x[k, r]))``. When the last run is reduced the
  innermost loop reads contiguous elements, and LLVM vectorizes the (reassociable) accumulation.
* **columns** (the last run kept, the accumulator of the result's own type): the result's row is
  the accumulator, ``y[.., k] = y[.., k] op pre(x[.., r, k])`` with the kept run innermost: every
  read contiguous, the order NumPy uses along a non-contiguous axis.

Float sums accumulate in f64 in rows (their error does not grow with the row's length). A reduction
over no axes is the op's elementwise part (ReduceSumSquare squares); over an empty set it is the
identity finished (Mean: NaN, LogSum: -inf), as the reference gives.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

from ...ir.ops import norm as nm
from ...ir.ops import reduce as rd
from ...ir.types import DType
from ..loops import KernelForm, Kernel
from ..loops.expr import STORAGE_TYPES, Const, cast, compute_type, op, select
from ..loops.scalar import REDUCTIONS, Reduction, reduction
from .base import FormLowering, KernelGroup, dtype_reason, par_grain



def reduce_axes(node) -> tuple[int, ...] | str:
    """The node's reduced axes, or why they are not known."""
    x = node.inputs[0]
    axes = node.inputs[1] if len(node.inputs) > 1 else None
    listed: list[int] = []
    if axes is not None and tuple(axes.shape) != (0,):  # an empty list, even fed as an input, is known
        data = axes.const if axes.const is not None else axes.known
        if data is None:
            return "the axes are computed at run time"
        listed = [int(a) for a in data.ravel()] if hasattr(data, "ravel") else [int(a) for a in data]
    return node.op.resolve_axes(x.type.rank, listed)


def merge_runs(shape, axes) -> list[tuple[int, bool]]:
    """(size, reduced) runs of adjacent axes alike, size-1 axes dropped."""
    runs: list[tuple[int, bool]] = []
    for i, d in enumerate(shape):
        if d == 1:
            continue
        red = i in axes
        if runs and runs[-1][1] == red:
            runs[-1] = (runs[-1][0] * d, red)
        else:
            runs.append((int(d), red))
    return runs


class Reduce(FormLowering):
    """Every Reduce* op of ``loops.scalar.REDUCTIONS`` on every storage type it takes (see the module
    docstring)."""

    ops = tuple(REDUCTIONS)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        why = dtype_reason([x], allowed=tuple(STORAGE_TYPES))
        if why:
            return why
        axes = reduce_axes(n)
        if isinstance(axes, str):
            return axes
        return dtype_reason([y], allowed=tuple(STORAGE_TYPES)) or self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        dt = x.type.dtype
        r = reduction(n.op, dt)
        runs = merge_runs([int(d) for d in x.shape], set(reduce_axes(n))) or [(1, False)]
        count = math.prod(d for d, red in runs if red)
        kf = KernelForm(name)
        xb = kf.buffer("x", dt, [d for d, _ in runs], value=x)
        kept = [d for d, red in runs if not red] or [1]
        ct = compute_type(dt)
        columns = (not runs[-1][1] and count > 1 and not r.shifted and y.type.dtype is ct
                   and not (r.real and ct.is_int))
        yb = kf.buffer("y", y.type.dtype, kept, "inout" if columns else "out", value=y)  # columns: y accumulates
        layout = " ".join(f"{d}{'R' if red else 'K'}" for d, red in runs)
        kf.note(f"Reduce by {'columns' if columns else 'rows'} over {layout}")
        if columns:
            _columns(kf, r, runs, xb, yb, ct, count)
        else:
            _rows(kf, r, runs, xb, yb, r.acc_type(dt), count)
        return kf.finish()


def _out(v, out: DType):
    """``v`` converted to the compute type of the result's type ``out`` (rounded for f16)."""
    want = compute_type(out)
    v = v if v.dtype is want else cast(v, want)
    return op("to_f16", v) if out is DType.f16 else v


def _as(v, dt: DType):
    return v if v.dtype is dt else cast(v, dt)


class _Runs:
    """Loops over the runs of the input, binding each run's index (``idx``) for the body."""

    def __init__(self, kf: KernelForm, runs):
        self.kf, self.runs, self.idx = kf, runs, {}
        self.kept = [j for j, (_, red) in enumerate(runs) if not red]
        self.reduced = [j for j, (_, red) in enumerate(runs) if red]

    def over(self, js, body, parallel: bool = False, kind: str = "serial") -> None:
        """``body()`` inside loops over runs ``js`` (outermost first); with ``parallel`` the first is
        split among the threads (tasks of ``base.PAR_MIN_WORK`` input elements at least)."""
        if not js:
            return body()
        j, size = js[0], self.runs[js[0]][0]
        if parallel:
            work = math.prod(d for d, _ in self.runs) // max(size, 1)
            cm = self.kf.loop(size, "parallel", grain=par_grain(work))
        else:
            cm = self.kf.loop(size, kind if len(js) == 1 else "serial")
        with cm as i:
            self.idx[j] = i
            self.over(js[1:], body)

    def x(self, xb, dt: DType):
        """The input's element at the bound indices, as ``dt``."""
        return _as(xb[tuple(self.idx[j] for j in range(len(self.runs)))], dt)

    def y(self):
        """The result's index at the bound indices."""
        return tuple(self.idx[j] for j in self.kept) or (Const(0, DType.i64),)


def _rows(kf: KernelForm, r: Reduction, runs, xb, yb, acc_t: DType, count: int) -> None:
    loops = _Runs(kf, runs)
    work_t = DType.f64 if acc_t is DType.f64 and xb.dtype.is_int else compute_type(xb.dtype)

    def reduce_all():
        shift = None
        if r.shifted:  # LogSumExp: the maximum first
            m = kf.acc(Const(-math.inf, work_t), name="m")
            loops.over(loops.reduced, lambda: kf.update(m, "max", loops.x(xb, work_t)))
            finite = op("not", op("or", op("isnan", m), op("isinf", m)))
            shift = kf.let(select(finite, m, Const(0.0, work_t)), name="shift")
        acc = kf.acc(Const(r.identity(acc_t), acc_t))

        def step():
            v = loops.x(xb, work_t)
            kf.update(acc, r.combiner, _as(r.map(v if shift is None else op("sub", v, shift)), acc_t))
        loops.over(loops.reduced, step)
        v = r.finish(acc, count)
        kf.store(yb, loops.y(), _out(v if shift is None else op("add", v, _as(shift, v.dtype)), yb.dtype))

    loops.over(loops.kept, reduce_all, parallel=True)


def _columns(kf: KernelForm, r: Reduction, runs, xb, yb, acc_t: DType, count: int) -> None:
    loops = _Runs(kf, runs)
    outer, last = loops.kept[:-1], loops.kept[-1:]

    def row(fn):
        loops.over(last, fn, kind="vector")

    def body():
        row(lambda: kf.store(yb, loops.y(), Const(r.identity(acc_t), acc_t)))
        loops.over(loops.reduced, lambda: row(
            lambda: kf.store(yb, loops.y(), r.combine(yb[loops.y()], r.map(loops.x(xb, acc_t))))))
        if r.post is not None:  # Mean, L2, LogSum
            row(lambda: kf.store(yb, loops.y(), _out(r.finish(yb[loops.y()], count), yb.dtype)))

    loops.over(outer, body, parallel=True)


def extreme_index(kf: KernelForm, xb, o, i, extreme: str, last: bool = False):
    """The first (or last) index along axis 1 of ``xb`` ([outer, count, inner]) at (o, i) holding
    its ``extreme`` ("max"/"min"; NaN counts as both, as NumPy's argmax/argmin): an i64 accumulator."""
    count = xb.shape[1]
    ct = compute_type(xb.dtype)
    m = kf.acc(Const(-math.inf if extreme == "max" else math.inf, ct) if ct.is_float else _as(xb[o, 0, i], ct),
               name="m")
    with kf.loop(count) as r:
        kf.update(m, extreme, _as(xb[o, r, i], ct))
    none = Const(-1 if last else count, DType.i64)
    best = kf.acc(none, name="at")
    with kf.loop(count) as r:
        v = _as(xb[o, r, i], ct)
        hit = op("eq", v, m)
        if ct.is_float:
            hit = op("or", hit, op("and", op("isnan", v), op("isnan", m)))
        kf.update(best, "max" if last else "min", select(hit, r, none))
    return best


@contextmanager
def _outer_inner(kf: KernelForm, outer: int, count: int, inner: int):
    with kf.loop(outer, "parallel", grain=par_grain(count * inner)) as o, kf.loop(inner) as i:
        yield o, i


def along_axis(group: KernelGroup, name: str):
    """(a KernelForm, the input as a buffer ``[outer, count, inner]`` around the op's ``axis``, the
    loops over (outer, inner) as a context yielding their indices) for a one-axis op."""
    n = group.node
    x = n.inputs[0]
    shape = [int(d) for d in x.shape]
    ax = n.op.axis % len(shape)
    outer, count, inner = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])
    kf = KernelForm(name)
    xb = kf.buffer("x", x.type.dtype, (outer, count, inner), value=x)
    return kf, xb, _outer_inner(kf, outer, count, inner)


class Hardmax(FormLowering):
    """Hardmax: 1 at the first maximum along the axis, 0 elsewhere (``extreme_index``, then a pass
    writing the row)."""

    ops = (nm.Hardmax,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        return dtype_reason([n.inputs[0], n.outputs[0]], allowed=(DType.f32, DType.f64, DType.f16, DType.bf16)) or \
            self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        y = group.node.outputs[0]
        kf, xb, rows = along_axis(group, name)
        outer, count, inner = xb.shape
        yb = kf.buffer("y", y.type.dtype, (outer, count, inner), "out", value=y)
        ct = compute_type(y.type.dtype)
        with rows as (o, i):
            at = extreme_index(kf, xb, o, i, "max") if count else Const(0, DType.i64)
            with kf.loop(count) as r:
                kf.store(yb, (o, r, i), select(op("eq", r, at), Const(1.0, ct), Const(0.0, ct)))
        return kf.finish()


class LpNormalization(FormLowering):
    """``y = x / ||x||_p`` along the axis (p = 1 or 2; 0 where the norm is 0): the norm accumulated in
    the compute type as the reference sums, then a pass dividing the row."""

    ops = (nm.LpNormalization,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        return dtype_reason([n.inputs[0], n.outputs[0]], allowed=(DType.f32, DType.f64, DType.f16, DType.bf16)) or \
            self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        y = n.outputs[0]
        kf, xb, rows = along_axis(group, name)
        outer, count, inner = xb.shape
        yb = kf.buffer("y", y.type.dtype, (outer, count, inner), "out", value=y)
        ct = compute_type(y.type.dtype)
        zero = Const(0.0, ct)
        kf.note(f"LpNormalization p={n.op.p} over {count} of [{outer}, {count}, {inner}]")
        with rows as (o, i):
            acc = kf.acc(zero, name="norm")
            with kf.loop(count) as r:
                v = _as(xb[o, r, i], ct)
                kf.update(acc, "add", op("abs", v) if n.op.p == 1 else op("mul", v, v))
            norm = kf.let(acc if n.op.p == 1 else op("sqrt", acc), name="norm")
            with kf.loop(count) as r:
                q = select(op("eq", norm, zero), zero, op("div", _as(xb[o, r, i], ct), norm))
                kf.store(yb, (o, r, i), op("to_f16", q) if y.type.dtype is DType.f16 else q)
        return kf.finish()


class ArgReduce(FormLowering):
    """ArgMax and ArgMin on every numeric storage type, in two passes over each row of the axis:
    the extreme value (NaN-propagating, as NumPy's argmax counts NaN the largest), then the first
    (or with ``select_last_index`` the last) index holding it, both plain min/max reductions."""

    ops = (rd.ArgMax, rd.ArgMin)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        return dtype_reason([n.inputs[0], n.outputs[0]], allowed=tuple(STORAGE_TYPES - {DType.bool})) or \
            self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        kf, xb, rows = along_axis(group, name)
        outer, count, inner = xb.shape
        yb = kf.buffer("y", DType.i64, (outer, inner), "out", value=n.outputs[0])
        extreme = "max" if isinstance(n.op, rd.ArgMax) else "min"
        last = bool(n.op.select_last_index)
        kf.note(f"{n.op.name} over {count} of [{outer}, {count}, {inner}], the {'last' if last else 'first'} index")
        with rows as (o, i):
            kf.store(yb, (o, i), extreme_index(kf, xb, o, i, extreme, last))
        return kf.finish()


__all__ = ["ArgReduce", "Hardmax", "LpNormalization", "Reduce", "extreme_index", "merge_runs", "reduce_axes"]
