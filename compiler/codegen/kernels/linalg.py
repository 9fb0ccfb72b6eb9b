"""Gemm and MatMul (float32) as calls of Kiln's sgemm (docs/gemm.md).

A constant operand is packed at compile time (``pack_b`` / ``pack_a``) and passed pre-packed
(``tb``/``ta`` = 2). Gemm's C is written into the result first (``Y = beta * C``, broadcast) and the
product accumulated onto it (sgemm's ``beta = 1``). MatMul folds A's batch dimensions into M when B
has none (a linear layer: one sgemm); otherwise it loops over the output's batches, each operand's
batch taken from a compile-time table (NumPy broadcasting of the batch dimensions).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from llvmlite import ir

from ...ir.ops import linalg as la
from .base import I32, I64, PTR, KernelBuilder, KernelGroup, Lowering, c64, cf32, dtype_reason, unravel
from .tile_epilogue import plan_tile_epilogue


def _i32(v: int) -> ir.Constant:
    return ir.Constant(I32, int(v))


def call_sgemm(k: KernelBuilder, ta: int, tb: int, m, n, kk, alpha: float,
               a: ir.Value, lda, b: ir.Value, ldb, beta: float, c: ir.Value, ldc,
               nthreads: ir.Value | None = None, epilogue: tuple[ir.Value, ir.Value] | None = None,
               pack_b: tuple[ir.Value, ir.Value] | None = None) -> None:
    """One ``kiln_sgemm`` call; sizes and leading dimensions are ints or i64 values. ``epilogue``:
    (function, context) run on each final block of C (``kiln_sgemm_ep``, see ``tile_epilogue``);
    ``pack_b``: (function, context) packing each block of B (``kiln_sgemm_cb``; ``tb`` 0, ``b``
    not read)."""
    def i64(v, ld=False):
        return v if isinstance(v, ir.Value) else c64(max(int(v), 1) if ld else int(v))

    args = [_i32(ta), _i32(tb), i64(m), i64(n), i64(kk), cf32(alpha), a, i64(lda, True), b,
            i64(ldb, True), cf32(beta), c, i64(ldc, True), k.nthreads if nthreads is None else nthreads]
    null = ir.Constant(PTR, None)
    if pack_b is not None:
        k.b.call(k.services.sgemm_cb(), args + [k.b.bitcast(v, PTR) for v in (epilogue or (null, null)) + pack_b])
    elif epilogue is None:
        k.b.call(k.services.sgemm(), args)
    else:
        k.b.call(k.services.sgemm_ep(), args + [k.b.bitcast(v, PTR) for v in epilogue])


def const_table(k: KernelBuilder, name: str, values: Sequence[int]) -> tuple[ir.GlobalVariable, ir.ArrayType]:
    """An internal constant i64 array in the module (name made unique per kernel)."""
    ty = ir.ArrayType(I64, len(values))
    g = ir.GlobalVariable(k.module, ty, name=f"{k.name}.{name}")
    g.initializer = ir.Constant(ty, [int(v) for v in values])
    g.linkage = "internal"
    g.global_constant = True
    return g, ty


def table_load(k: KernelBuilder, table, index: ir.Value) -> ir.Value:
    g, ty = table
    addr = k.b.gep(g, [c64(0), index], inbounds=True, source_etype=ty)
    return k.b.load(addr, typ=I64)


def _sizes_reason(*dims: int) -> str | None:
    if any(int(d) == 0 for d in dims):
        return "empty matrices (a zero dimension) are not lowered"
    return None


class Gemm(Lowering):
    """``Y = alpha * op(A) @ op(B) + beta * C`` (float32, static shapes, C broadcast one way)."""

    ops = (la.Gemm,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason(list(n.inputs) + list(n.outputs))
        if why:
            return why
        a, b = n.inputs[0], n.inputs[1]
        if len(a.shape) != 2 or len(b.shape) != 2:
            return "A and B must be 2-D"
        y = n.outputs[0]
        c = n.inputs[2] if len(n.inputs) > 2 else None
        if c is not None and len(c.shape) > 2:
            return "C must have rank <= 2"
        kk = a.shape[0] if n.op.transA else a.shape[1]
        return _sizes_reason(*y.shape, kk)

    def emit(self, k: KernelBuilder, group: KernelGroup, epilogue=None) -> bool:
        """Emit the Gemm; with ``epilogue`` (as for ``Conv.emit``) also the chain, inside the GEMM
        (returns True) unless an operand refuses (False: the caller emits it after)."""
        node = group.node
        op = node.op
        a, b = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        y = node.outputs[0]
        m, n = (int(d) for d in y.shape)
        kk = int(a.shape[0] if op.transA else a.shape[1])
        # C (beta 1) and the chain inside the GEMM, on each finished block of Y
        bias = c if c is not None and float(op.beta) == 1.0 else None
        te, fused = _tile_epilogue(k, y, epilogue, bias, 0, None)
        yp = k.ptr(y)
        beta = 0.0
        if c is not None and (te is None or bias is None):
            init_broadcast(k, yp, m, n, k.ptr(c), [int(d) for d in c.shape], float(op.beta))
            beta = 1.0
        if b.const is not None:
            bm = b.const.T if op.transB else b.const
            bp, tb, ldb = k.weight(k.services.pack_b(bm)), 2, n
        else:
            bp, tb, ldb = k.ptr(b), int(op.transB), int(b.shape[1])
        if a.const is not None and b.const is None:
            am = a.const.T if op.transA else a.const
            ap, ta, lda = k.weight(k.services.pack_a(am)), 2, kk
        else:
            ap, ta, lda = k.ptr(a), int(op.transA), int(a.shape[1])
        call_sgemm(k, ta, tb, m, n, kk, float(op.alpha), ap, lda, bp, ldb, beta, yp, n,
                   epilogue=te.call_args([], c64(0)) if te is not None else None)
        return fused


def _tile_epilogue(k: KernelBuilder, y, epilogue, bias, row_axis: int, rows_from: int | None):
    """``plan_tile_epilogue`` for a GEMM writing ``y`` (``bias``: a Gemm's C, read broadcast), noted."""
    te, fused = plan_tile_epilogue(k, y, epilogue, bias, row_axis, rows_from, broadcast_bias=True)
    if te is not None:
        k.note(("C and chain" if bias is not None else "chain") + " inside the GEMM" if fused else
               "C inside the GEMM")
    return te, fused


def init_broadcast(k: KernelBuilder, yp: ir.Value, m: int, n: int, cp: ir.Value, cshape: list[int],
                   scale: float) -> None:
    """``Y[i, j] = scale * C[...]`` for C of rank <= 2 broadcast (NumPy rules) to (m, n)."""
    full = [1] * (2 - len(cshape)) + cshape
    rs = full[1] if full[0] != 1 else 0
    cs = 1 if full[1] != 1 else 0
    b = k.b
    with k.loop(m, "gi") as i:
        crow = b.mul(i, c64(rs)) if rs else c64(0)
        yrow = b.mul(i, c64(n))
        if cs == 0:  # one value per row: hoisted out of the column loop
            v = k.load(cp, crow)
            if scale != 1.0:
                v = b.fmul(v, cf32(scale))
        with k.loop(n, "gj") as j:
            if cs:
                v = k.load(cp, b.add(crow, j))
                if scale != 1.0:
                    v = b.fmul(v, cf32(scale))
            k.store(v, yp, b.add(yrow, j))


class MatMul(Lowering):
    """NumPy matmul (float32, static shapes): 1-D operands promoted, batch dimensions broadcast."""

    ops = (la.MatMul,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason(list(n.inputs) + list(n.outputs))
        if why:
            return why
        a, b = n.inputs
        if len(a.shape) == 0 or len(b.shape) == 0:
            return "operands must have rank >= 1"
        sa, sb = _promoted(a.shape, b.shape)
        return _sizes_reason(*n.outputs[0].shape, sa[-1], sa[-2], sb[-1])

    def emit(self, k: KernelBuilder, group: KernelGroup, epilogue=None) -> bool:
        """Emit the MatMul; with ``epilogue`` (as for ``Conv.emit``) also the chain, inside the GEMM
        (returns True) when the result is not a promoted 1-D one and the operands allow."""
        node = group.node
        a, b = node.inputs
        y = node.outputs[0]
        sa, sb = _promoted(a.shape, b.shape)
        m, kk, n = sa[-2], sa[-1], sb[-1]
        ba, bb = sa[:-2], sb[:-2]
        batch = tuple(np.broadcast_shapes(tuple(ba), tuple(bb)))
        nb = math.prod(batch)
        te, fused = None, False
        if epilogue is not None and len(y.shape) == len(batch) + 2:
            # a linear layer: C's rows are all of A's leading axes; else one GEMM per batch index
            folded = math.prod(bb) == 1
            te, fused = _tile_epilogue(k, y, epilogue, None, len(y.shape) - 2, 0 if folded else None)
        yp = k.ptr(y)
        bconst = b.const is not None
        aconst = a.const is not None and not bconst
        if math.prod(bb) == 1:
            # B is one matrix (batch = A's batch): A's batches are rows of one product (a linear layer)
            mm = math.prod(sa[:-1])
            if bconst:
                bp, tb = k.weight(k.services.pack_b(b.const.reshape(kk, n))), 2
            else:
                bp, tb = k.ptr(b), 0
            if aconst:
                ap, ta = k.weight(k.services.pack_a(a.const.reshape(mm, kk))), 2
            else:
                ap, ta = k.ptr(a), 0
            call_sgemm(k, ta, tb, mm, n, kk, 1.0, ap, kk, bp, n, 0.0, yp, n,
                       epilogue=te.call_args([], c64(0)) if te is not None else None)
            return fused
        # a loop over the output's batches; each operand's batch index from a table
        aidx = np.broadcast_to(np.arange(math.prod(ba)).reshape(ba), batch).ravel() if ba \
            else np.zeros(nb, np.int64)
        bidx = np.broadcast_to(np.arange(math.prod(bb)).reshape(bb), batch).ravel()
        if bconst:
            mats = b.const.reshape(-1, kk, n)
            packed = [k.services.pack_b(w) for w in mats]
            bstride = packed[0].size
            bp, tb = k.weight(np.concatenate(packed)), 2
        else:
            bp, tb, bstride = k.ptr(b), 0, kk * n
        if aconst:
            mats = a.const.reshape(-1, m, kk)
            packed = [k.services.pack_a(w) for w in mats]
            astride = packed[0].size
            ap, ta = k.weight(np.concatenate(packed)), 2
        else:
            ap, ta, astride = k.ptr(a), 0, m * kk
        ident_a = np.array_equal(aidx, np.arange(nb))
        ident_b = np.array_equal(bidx, np.arange(nb))
        ta_tab = None if ident_a else const_table(k, "aidx", aidx)
        tb_tab = None if ident_b else const_table(k, "bidx", bidx)

        def one(t):  # the GEMM of batch index t
            bld = k.b
            ia = t if ident_a else table_load(k, ta_tab, t)
            ib = t if ident_b else table_load(k, tb_tab, t)
            pa = k.at(k.again(ap), bld.mul(ia, c64(astride)))
            pb = k.at(k.again(bp), bld.mul(ib, c64(bstride)))
            pc = k.at(k.ptr(y), bld.mul(t, c64(m * n)))
            ep = None
            if te is not None:  # the batch index per axis of the output
                ep = te.call_args(unravel(bld, t, batch), c64(0))
            call_sgemm(k, ta, tb, m, n, kk, 1.0, pa, kk, pb, n, 0.0, pc, n, epilogue=ep)

        gemm_loop(k, nb, nb > 1 and 2 * m * n * kk < TASK_MAX_FLOPS, one, "batch")
        return fused


#: GEMMs of fewer flops than this, in a loop (a batched MatMul, a grouped conv), may run as tasks
TASK_MAX_FLOPS = 4e6


def gemm_loop(k: KernelBuilder, count: int, small: bool, body, name: str) -> None:
    """``body(i)`` for i in range(count), which emits one GEMM each. Small GEMMs (``small``: under
    ``TASK_MAX_FLOPS`` each, e.g. attention's per-head products) split badly among threads: when
    there are enough of them for the thread count (a multiple of it, or 4 per thread: decided at
    run time) each is a task of the pool, run whole by one thread (inside the task ``k.nthreads``
    is 1). Otherwise they run in sequence, each split among the threads. Measured (2 threads):
    BERT's 4 heads of 128x128x64, 0.066 ms in sequence, 0.056 as tasks; ShuffleNet's 3 groups of
    20x784x80, 0.063 ms in sequence, 0.075 as tasks (one thread runs two of the three)."""
    if not small:
        with k.loop(count, name) as i:
            body(i)
        return
    b = k.b
    t = k.f.max(b.sext(k.nthreads, I64), c64(1))
    fits = b.or_(b.icmp_unsigned("==", b.urem(c64(count), t), c64(0)),
                 b.icmp_unsigned(">=", c64(count), b.mul(t, c64(4))))
    with b.if_else(fits) as (tasks, sequence):
        with tasks:
            with k.parallel_for(count) as (lo, hi), k.loop(k.b.sub(hi, lo), name) as i:
                body(k.b.add(lo, i))
        with sequence:
            with k.loop(count, name) as i:
                body(i)


def _promoted(sa, sb) -> tuple[list[int], list[int]]:
    sa = [1] + [int(d) for d in sa] if len(sa) == 1 else [int(d) for d in sa]
    sb = [int(d) for d in sb] + [1] if len(sb) == 1 else [int(d) for d in sb]
    return sa, sb


__all__ = ["Gemm", "MatMul", "call_sgemm", "const_table", "gemm_loop", "init_broadcast", "table_load"]
