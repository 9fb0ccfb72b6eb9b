"""Reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin over constant axes) in float32, and the
vector helpers the pooling and normalization lowerings share.

**Row reductions** (``reduce_row``) are written with explicit ``<8 x float>`` vectors: LLVM does not
vectorize a float reduction whose adds may not be reassociated (llvmlite emits no fast-math flags),
so the kernel keeps four vector accumulators itself (32 elements per step), folds them, and adds the
tail one element at a time. Sums are accumulated in blocks of 512 elements whose partial sums are
added in float64, so the error does not grow with the row's length (NumPy's pairwise summation is as
accurate). Max and min propagate NaN like ``np.maximum``/``np.minimum``.

**Reduce*:** the input's dimensions are merged into runs of kept (K) and reduced (R) axes (size-1 axes
dropped): the last run decides the innermost loop. ``[..., R]``: each contiguous row is reduced with
``reduce_row``; ``[..., K]``: the kept run is an elementwise accumulate ``y[i] = y[i] op x[r, i]``
(contiguous, vectorized by LLVM), the order NumPy also uses along a non-contiguous axis.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable

from llvmlite import ir

from ...ir.ops import reduce as rd
from ..llvm.elementwise import fmax, fmin
from .base import F32, F64, I32, KernelBuilder, KernelGroup, Lowering, c64, cf32, dtype_reason

V = 8  # float32 lanes per vector (256-bit: what LLVM uses on AVX2 and, by preference, AVX-512 targets)
VEC = ir.VectorType(F32, V)
VEC64 = ir.VectorType(F64, V)
UNROLL = 4  # vector accumulators of a row reduction
BLOCK = 16  # unrolled steps per float64 partial sum (16 * 32 = 512 elements)

Chunk = Callable[[ir.Value, int], ir.Value]


def ftype(w: int) -> ir.Type:
    return F32 if w == 1 else ir.VectorType(F32, w)


def vload(k: KernelBuilder, ptr: ir.Value, idx, w: int = 1) -> ir.Value:
    """``w`` consecutive floats from element ``idx`` (a scalar for w == 1)."""
    return k.b.load(k.at(ptr, idx), typ=ftype(w), align=4)


def vstore(k: KernelBuilder, val: ir.Value, ptr: ir.Value, idx) -> None:
    k.b.store(val, k.at(ptr, idx), align=4)


def splat(b: ir.IRBuilder, s: ir.Value, w: int) -> ir.Value:
    if w == 1:
        return s
    vt = ir.VectorType(s.type, w)
    u = b.insert_element(ir.Constant(vt, ir.Undefined), s, ir.Constant(I32, 0))
    return b.shuffle_vector(u, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, w), [0] * w))


def fadd(b, x, y):
    return b.fadd(x, y)


#: kind -> (identity, combine)
KINDS: dict[str, tuple[float, Callable]] = {"sum": (0.0, fadd), "max": (-math.inf, fmax), "min": (math.inf, fmin)}


def hreduce(b: ir.IRBuilder, v: ir.Value, comb) -> ir.Value:
    """The lanes of vector ``v`` combined (a tree: halves, quarters, ...)."""
    n = v.type.count
    while n > 1:
        h = n // 2
        lo = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(I32, h), list(range(h))))
        hi = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                              ir.Constant(ir.VectorType(I32, h), list(range(h, n))))
        v, n = comb(b, lo, hi), h
    return b.extract_element(v, ir.Constant(I32, 0))


def reduce_row(k: KernelBuilder, n: int, chunk: Chunk, kind: str) -> ir.Value:
    """The reduction (``kind``: sum, max, min) of ``chunk(i, w)`` over i = 0, w, 2w, ... < n: chunk
    returns the ``w`` values (a float for w == 1, else ``<w x float>``) of elements i .. i+w-1."""
    b = k.b
    ident, comb = KINDS[kind]
    step = UNROLL * V
    accs = [k.f.alloca(VEC, name=f"acc{u}") for u in range(UNROLL)]
    nfull = n // step

    def steps(start: ir.Value, iters: int):
        for a in accs:
            b.store(ir.Constant(VEC, [ident] * V), a)
        with k.loop(iters, "r") as j:
            base = b.add(start, b.mul(j, c64(step)))
            for u, a in enumerate(accs):
                b.store(comb(b, b.load(a, typ=VEC), chunk(b.add(base, c64(u * V)), V)), a)
        vs = [b.load(a, typ=VEC) for a in accs]
        return comb(b, comb(b, vs[0], vs[1]), comb(b, vs[2], vs[3]))

    pos = nfull * step
    if kind == "sum":
        outer = k.f.alloca(VEC64, name="sum64")
        b.store(ir.Constant(VEC64, [0.0] * V), outer)

        def add64(v):
            b.store(b.fadd(b.load(outer, typ=VEC64), b.fpext(v, VEC64)), outer)

        nblk, rem = divmod(nfull, BLOCK)
        if nblk:
            with k.loop(nblk, "blk") as q:
                add64(steps(b.mul(q, c64(BLOCK * step)), BLOCK))
        if rem:
            add64(steps(c64(nblk * BLOCK * step), rem))
        while pos + V <= n:
            add64(chunk(c64(pos), V))
            pos += V
        total = hreduce(b, b.load(outer, typ=VEC64), fadd)
        while pos < n:
            total = b.fadd(total, b.fpext(chunk(c64(pos), 1), F64))
            pos += 1
        return b.fptrunc(total, F32)
    acc = None
    if nfull:
        acc = steps(c64(0), nfull)
    while pos + V <= n:
        v = chunk(c64(pos), V)
        acc = v if acc is None else comb(b, acc, v)
        pos += V
    out = cf32(ident) if acc is None else hreduce(b, acc, comb)
    while pos < n:
        out = comb(b, out, chunk(c64(pos), 1))
        pos += 1
    return out


#: elements of work a parallel task gets at least (a thread hand-off costs some 10-50 us; below this
#: many elements a kernel runs on the calling thread)
PAR_MIN_WORK = 1 << 16


def par_min(work_per_iter: int, min_work: int = PAR_MIN_WORK) -> int:
    """Iterations per parallel task at least, for iterations of ``work_per_iter`` elements each."""
    return max(1, -(-min_work // max(int(work_per_iter), 1)))


@contextmanager
def par_loop(k: KernelBuilder, count: int, work_per_iter: int, name: str = "p", min_work: int = PAR_MIN_WORK,
             split: bool = True):
    """``for i < count`` with the iterations split among the kernel's threads (``k.parallel_for``) when
    there are at least 2 * ``min_work`` elements of work (never with ``split=False``); yields i. As
    with ``parallel_for``, the body must take its pointers (``k.ptr``/``k.weight``/``k.scratch``)
    inside the block."""
    per = par_min(work_per_iter, min_work) if split else max(int(count), 1)
    with k.parallel_for(count, per) as (lo, hi):
        with k.loop(k.b.sub(hi, lo), name) as j:
            yield k.b.add(lo, j)


def map_row(k: KernelBuilder, n, body: Callable[[ir.Value], None], name: str = "i",
            interleave: int | None = None) -> None:
    """``for i < n: body(i)`` (scalar code that LLVM vectorizes)."""
    with k.loop(n, name, interleave=interleave) as i:
        body(i)


def offset(b: ir.IRBuilder, idx: list[ir.Value], strides: list[int]) -> ir.Value:
    """sum idx[j] * strides[j] as i64 (0 for none)."""
    off = c64(0)
    for i, s in zip(idx, strides):
        if s:
            off = b.add(off, b.mul(i, c64(s)))
    return off


def nested(k: KernelBuilder, dims: list[int], body: Callable[[list[ir.Value]], None], name: str = "d") -> None:
    """Loops over ``dims`` (outermost first), calling body(indices) innermost."""
    def rec(j, idx):
        if j == len(dims):
            body(idx)
            return
        with k.loop(dims[j], f"{name}{j}") as i:
            rec(j + 1, idx + [i])
    rec(0, [])


# ---------------------------------------------------------------------------------------------
# Reduce*
# ---------------------------------------------------------------------------------------------

def reduce_axes(node) -> tuple[int, ...] | str:
    """The node's reduced axes, or why they are not known."""
    op, x = node.op, node.inputs[0]
    axes = node.inputs[1] if len(node.inputs) > 1 else None
    listed: list[int] = []
    if axes is not None:
        data = axes.const if axes.const is not None else axes.known
        if data is None:
            return "the axes are computed at run time"
        listed = [int(a) for a in data.ravel()] if hasattr(data, "ravel") else [int(a) for a in data]
    return op.resolve_axes(x.type.rank, listed)


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


def emit_reduction(k: KernelBuilder, x, y, shape, axes, kind: str, mean: bool) -> None:
    """y (the kept axes, row-major) = reduction of x (``shape``) over ``axes``; x and y are the group's
    values. When the outermost run is kept, its indices (independent blocks of outputs) are split among
    the threads; every output is reduced in the same order either way."""
    runs = merge_runs(shape, axes) or [(1, False)]
    if len(runs) > 1 and not runs[0][1]:
        n0 = runs[0][0]
        xs0, ys0 = math.prod(d for d, _ in runs[1:]), math.prod(d for d, red in runs[1:] if not red)
        with par_loop(k, n0, xs0, "r0") as i0:
            b = k.b
            _reduce_block(k, k.ptr(x), k.ptr(y), runs, kind, mean, b.mul(i0, c64(xs0)), b.mul(i0, c64(ys0)),
                          skip=1)
        return
    _reduce_block(k, k.ptr(x), k.ptr(y), runs, kind, mean, c64(0), c64(0))


def _reduce_block(k: KernelBuilder, xp, yp, runs, kind: str, mean: bool, x0, y0, skip: int = 0) -> None:
    """The reduction over ``runs[skip:]`` of the block of x at element x0 into y at element y0."""
    b = k.b
    ident, comb = KINDS[kind]
    nred = math.prod(d for d, red in runs if red)
    only_last_reduced = runs[-1][1] and sum(red for _, red in runs) == 1
    runs = runs[skip:]
    xp, yp = k.at(xp, x0), k.at(yp, y0)
    nout = math.prod(d for d, red in runs if not red)
    xstr, ystr = [], []
    s = 1
    for d, red in reversed(runs):
        xstr.append(s)
        s *= d
    xstr.reverse()
    s = 1
    for d, red in reversed(runs):
        ystr.append(0 if red else s)
        s *= 1 if red else d
    ystr.reverse()
    if not only_last_reduced:
        map_row(k, nout, lambda i: vstore(k, cf32(ident), yp, i), "init")
    last, last_red = runs[-1]

    def body(idx):
        xo, yo = offset(b, idx, xstr[:-1]), offset(b, idx, ystr[:-1])
        if last_red:
            v = reduce_row(k, last, lambda i, w: vload(k, xp, b.add(xo, i), w), kind)
            if not only_last_reduced:
                v = comb(b, vload(k, yp, yo), v)
            vstore(k, v, yp, yo)
        else:
            def acc(i):
                yi = b.add(yo, i)
                vstore(k, comb(b, vload(k, yp, yi), vload(k, xp, b.add(xo, i))), yp, yi)
            map_row(k, last, acc, "k")

    nested(k, [d for d, _ in runs[:-1]], body)
    if mean:
        map_row(k, nout, lambda i: vstore(k, b.fdiv(vload(k, yp, i), cf32(float(nred))), yp, i), "mean")


class Reduce(Lowering):
    """ReduceSum, ReduceMean, ReduceMax, ReduceMin of float32 over constant axes (any keepdims)."""

    ops = (rd.ReduceSum, rd.ReduceMean, rd.ReduceMax, rd.ReduceMin)
    KIND = {rd.ReduceSum: "sum", rd.ReduceMean: "sum", rd.ReduceMax: "max", rd.ReduceMin: "min"}

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason([n.inputs[0]])
        if why:
            return why
        axes = reduce_axes(n)
        if isinstance(axes, str):
            return axes
        why = dtype_reason([n.outputs[0]])
        if why:
            return why
        if not axes:
            return "a reduction over no axes is left to the interpreter"
        if n.inputs[0].type.numel == 0:
            return "empty tensors are left to the interpreter"
        if nred := math.prod(n.inputs[0].shape[a] for a in axes):
            if isinstance(n.op, rd.ReduceMean) and nred >= 1 << 24:
                return "ReduceMean over 2^24 or more elements (the count is not exact in float32)"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        emit_reduction(k, x, y, [int(d) for d in x.shape], set(reduce_axes(n)),
                       self.KIND[type(n.op)], isinstance(n.op, rd.ReduceMean))


__all__ = ["PAR_MIN_WORK", "Reduce", "V", "VEC", "emit_reduction", "hreduce", "map_row", "nested", "offset",
           "par_loop", "par_min", "reduce_row",
           "splat", "vload", "vstore"]
