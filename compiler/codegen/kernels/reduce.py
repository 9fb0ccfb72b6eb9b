"""The float32 vector helpers that the pooling, normalization and fused row-reduction lowerings
share (Reduce* itself is a loop-form kernel: ``reduction.py``).

**Row reductions** (``reduce_row``) are written with explicit ``<8 x float>`` vectors: LLVM does not
vectorize a float reduction whose adds may not be reassociated (llvmlite emits no fast-math flags),
so the kernel keeps four vector accumulators itself (32 elements per step), folds them, and adds the
tail one element at a time. Sums are accumulated in blocks of 512 elements whose partial sums are
added in float64, so the error does not grow with the row's length (NumPy's pairwise summation is as
accurate). Max and min propagate NaN like ``np.maximum``/``np.minimum``.
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


__all__ = ["PAR_MIN_WORK", "V", "VEC", "hreduce", "map_row", "nested", "offset", "par_loop", "par_min", "reduce_row",
           "splat", "vload", "vstore"]
