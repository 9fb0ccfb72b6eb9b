"""Option B: Kiln's own sgemm, emitted as LLVM IR with llvmlite.

``emit_gemm(module, cfg, prefix)`` adds to an ``llvmlite.ir.Module`` a complete, thread-parallel,
BLIS-style single-precision GEMM:

* a register-blocked ``MR x NR`` microkernel on ``<W x float>`` vectors (``llvm.fmuladd``, which is
  one FMA instruction where the target has FMA), k loop unrolled; the M remainder of a block runs
  through smaller kernels (one per set bit of it: 8, 4, 2, 1 rows), the N remainder through masked
  loads/stores, so no edge tile is computed through a scratch buffer; a remainder whose last vector
  would hold at most ``col_tail`` columns (a 7x7 feature map's 49 = 2 x 24 + 1 pixels with AVX2, 32
  + 16 + 1 with AVX-512) as its whole vectors, then those columns through a kernel with C's rows as
  the vector lanes (``microkernel.py``);
* packing of A into ``MR``-row panels and of B into ``NR``-column panels (zero-padded), cache blocking
  ``NC`` / ``KC`` / ``MC`` (see ``config.py``), transposed operands handled by the packing (a
  transposed B is packed with ``W x W`` in-register transposes);
* optional *pre-packed* operands (constant weights packed once, at load time), and reading a
  row-major B in place when M is tiny (GEMV-like shapes: nothing to amortize packing over), and a
  row-major A's rows when there are fewer than MR (a batch-1 GEMV: then, with B pre-packed, the
  whole depth K in one block); at most ``stream_max_m`` rows against a B that is not pre-packed
  stream B's rows whole instead, or (B transposed) take dot products with its columns (``stream.py``);
* parallelism: the C matrix is cut into a grid of rectangular tasks (``tasks_per_thread`` tasks
  per thread up to twice that; the grid of least estimated time per thread: the padded area of the
  largest thread's range of tasks, plus the operand traffic its tasks stream and pack), which the calling thread and up to ``nthreads - 1``
  threads of a persistent pool take: thread k the tasks of its own contiguous range first (the k-th
  T-th of the grid, from a counter in its own cache line), then those left in the others' ranges.
  The same tasks (the same weight panels) go to the same threads call after call, so each finds them
  in its own cache, and still a thread the OS descheduled does not hold the others up, and the
  caller never waits for a thread that has not started. The pool (POSIX threads, started on first use, one per emitted prefix) sleeps on a
  condition variable between calls after a short ``sched_yield`` poll (``pool_spin``). A caller
  that finds the pool busy with another caller's GEMM computes its own alone: concurrent calls
  are safe and never oversubscribe. The per-call context is heap-allocated and reference-counted.

The C ABI of the emitted functions (``prefix`` = ``kiln_sgemm`` by default; row-major, like CBLAS)::

    int32 kiln_sgemm(int32 ta, int32 tb, int64 M, int64 N, int64 K, float alpha,
                     const float *A, int64 lda, const float *B, int64 ldb, float beta,
                     float *C, int64 ldc, int32 nthreads)
        C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C ; ta/tb: 0 = as is, 1 = transposed,
        2 = pre-packed (lda/ldb ignored). beta == 0 never reads C; K == 0 or alpha == 0 only
        scales C (A and B are not read). nthreads <= 1: the calling thread only. Returns 0, or 1
        when the calling thread could not allocate its packing buffers (C is then unchanged).
    int32 kiln_sgemm_ep(... the same ..., int32 nthreads, void (*ep)(void *epctx, int64 i0, int64 i1,
                        int64 j0, int64 j1), void *epctx)
        the same, then ep(epctx, i0, i1, j0, j1) on every block C[i0:i1, j0:j1] once it is final
        (after its last K block, while it is in cache: at most MC rows by NR columns, from whichever
        thread computed it; the blocks cover C exactly once). ep == NULL: no epilogue. Generated
        kernels fuse bias, activations and residual adds into the GEMM this way (docs/fusion.md).
    int32 kiln_sgemm_cb(... the same ..., void *epctx, void (*pb)(void *pbctx, int64 p0, int64 kc,
                        int64 j0, int64 nc, float *dst), void *pbctx)
        the same, B made by the caller: with tb = 0, pb writes the packed panels of the block
        B[p0:p0+kc, j0:j0+nc] to dst (ceil(nc/NR) panels of kc x NR; padding columns finite), for
        each block a task multiplies, into that thread's buffer (B and ldb are not read). A conv
        packs its im2col windows this way, block by block while they are in cache, instead of
        making the whole matrix first. pb == NULL: as kiln_sgemm_ep.
    int32 kiln_sgemm_taps(... the same as kiln_sgemm_cb ..., void *pbctx, const int64 *boff, int64 bgroup)
        the same, B's rows in groups of bgroup (boff == NULL: as kiln_sgemm_cb): row k of B is
        B + boff[k / bgroup] + (k % bgroup) * ldb (tb = 0, no pb). A convolution's taps read in
        place (``kernels/conv_taps.py``): group t holds the channels of tap t, ``boff[t]`` the tap's
        offset in the padded input planes (``ldb`` apart). The depth blocks are then the groups
        (bgroup at most 512).
    int64 kiln_sgemm_packed_a_size(int64 M, int64 K)        floats needed by a packed A
    void  kiln_sgemm_pack_a(int32 ta, int64 M, int64 K, const float *A, int64 lda, float *Ap)
    int64 kiln_sgemm_packed_b_size(int64 K, int64 N)
    void  kiln_sgemm_pack_b(int32 tb, int64 K, int64 N, const float *B, int64 ldb, float *Bp)

Packed layouts (also produced by ``packing.pack_a_numpy`` / ``pack_b_numpy`` in Python): A as
``ceil(M/MR)`` panels of ``K x MR`` (element (i, p) of panel i//MR at ``p*MR + i%MR``), B as
``ceil(N/NR)`` panels of ``K x NR``; padding is zero. Packed buffers need no alignment (64 bytes
is best).
"""
from __future__ import annotations

from llvmlite import ir

from .config import GemmConfig
from .irbuild import F32, FP, I1, I8P, I32, I64, VOID, VectorOps, _declare, _Fn, _new_fn, c64, cf
from .microkernel import MicrokernelEmitter
from .packing import PackEmitter
from .pool import PoolEmitter
from .stream import STREAM_ROW, StreamEmitter


# ----------------------------------------------------------------------------------------------
# the generator

# the task grid's cost estimate, per unit of K: streaming one element of A or B to a task costs
# about READ_COST elements of C (K/(2 W) FMA instructions each), packing it PACK_COST more (measured)
READ_COST, PACK_COST = 2, 6
#: i64 slots between two threads' task counters in a call's context (one 64-byte line each)
CLAIM_STRIDE = 8


class _GemmEmitter(VectorOps, PackEmitter, MicrokernelEmitter, PoolEmitter, StreamEmitter):
    def __init__(self, mod: ir.Module, cfg: GemmConfig, prefix: str):
        cfg.validate()
        self.mod, self.cfg, self.p = mod, cfg, prefix
        self.W, self.MR, self.NV, self.NR = cfg.W, cfg.MR, cfg.NV, cfg.NR
        self.vec = ir.VectorType(F32, cfg.W)
        self.vecp = self.vec.as_pointer()
        self.fmuladd = _declare(mod, f"llvm.fmuladd.v{cfg.W}f32", self.vec, [self.vec] * 3)
        self.prefetch = _declare(mod, "llvm.prefetch.p0", VOID, [I8P, I32, I32, I32])
        # context of one call (shared by the threads)
        self.ctx_fields = [
            ("M", I64), ("N", I64), ("K", I64), ("alpha", F32), ("beta", F32),
            ("A", FP), ("ars", I64), ("acs", I64), ("apacked", I1), ("adirect", I1),
            ("B", FP), ("brs", I64), ("bcs", I64), ("bpacked", I1), ("bdirect", I1), ("bstream", I1), ("bdot", I1),
            ("C", FP), ("ldc", I64),
            ("tm", I64), ("tn", I64), ("tiles_n", I64), ("ntasks", I64), ("kstep", I64),
            ("abuf", I64), ("bbuf", I64), ("nranges", I64), ("done", I64), ("refs", I64),
            ("helpers", I64), ("max_helpers", I64), ("ep", I8P), ("epctx", I8P), ("pb", I8P), ("pbctx", I8P),
            ("boff", I8P), ("bgroup", I64),
            # the next task of each thread's range, one per cache line (``claim_ptr``)
            ("claims", ir.ArrayType(I64, CLAIM_STRIDE * cfg.max_threads)),
        ]
        self.ctx_index = {n: i for i, (n, _) in enumerate(self.ctx_fields)}
        self.ep_type = ir.FunctionType(VOID, [I8P, I64, I64, I64, I64])  # ep(epctx, i0, i1, j0, j1)
        self.pb_type = ir.FunctionType(VOID, [I8P, I64, I64, I64, I64, FP])  # pb(pbctx, p0, kc, j0, nc, dst)
        self.ctx_ty = ir.LiteralStructType([t for _, t in self.ctx_fields])

    # -- small helpers
    def field_ptr(self, b, ctx, name):
        return b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, self.ctx_index[name])], inbounds=True)

    def claim_ptr(self, b, ctx, k):
        """The next task of range ``k`` (an i64 value) of the call's context."""
        return b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, self.ctx_index["claims"]),
                           b.mul(k, c64(CLAIM_STRIDE))], inbounds=True)

    def edge_rows(self) -> list[int]:
        """Row counts of the kernels that cover an M remainder (< MR): powers of two below MR."""
        out, s = [], 1
        while s < self.MR:
            out.append(s)
            s *= 2
        return out[::-1]

    # -- one task: C[i0:i1, j0:j1] -------------------------------------------------------------
    def emit_task(self, name, ukr, ukr_direct, ukr_ar, ukr_direct_ar, tails, pack_a, pack_b, srows, sdot):
        cfg, MR, NR = self.cfg, self.MR, self.NR
        fn = _new_fn(self.mod, name, VOID, [(self.ctx_ty.as_pointer(), "ctx"), (FP, "abuf"),
                                           (FP, "bbuf"), (I64, "i0"), (I64, "i1"), (I64, "j0"),
                                           (I64, "j1")])
        f = _Fn(fn)
        b = f.b
        ctx, abuf, bbuf, i0, i1, j0, j1 = fn.args
        g = {n: b.load(self.field_ptr(b, ctx, n)) for n, _ in self.ctx_fields
             if n not in ("nranges", "claims", "done", "refs", "helpers", "max_helpers")}
        K = g["K"]
        has_ep = b.icmp_unsigned("!=", g["ep"], ir.Constant(I8P, None))
        ep = b.bitcast(g["ep"], self.ep_type.as_pointer())
        with f.if_(g["bstream"], "stream"):  # a few rows against a B read in place: ``stream.py``
            self.emit_stream_task(f, g, bbuf, i0, i1, j0, j1, srows, has_ep, ep)
            b.ret_void()
            b.position_at_end(f.block("unreachable"))
        with f.if_(g["bdot"], "dot"):  # ... against a transposed B in place: dot products
            self.emit_dot_task(f, g, i0, i1, j0, j1, sdot, has_ep, ep)
            b.ret_void()
            b.position_at_end(f.block("unreachable"))
        with f.loop(j0, j1, cfg.NC, "jc") as jc:
            nc = f.min(c64(cfg.NC), b.sub(j1, jc))
            with f.loop(0, K, g["kstep"], "pc") as pc:
                kc = f.min(g["kstep"], b.sub(K, pc))
                beta = b.select(b.icmp_signed("==", pc, c64(0)), g["beta"], cf(1.0))
                nfull = b.mul(b.sdiv(nc, c64(NR)), c64(NR))
                # B: pre-packed, packed here, or (direct) read in place except the tail panel;
                # row pc of B (a plain B: B + pc * brs; taps: the group's offset, then its row)
                bpre_base = f.at(g["B"], b.add(b.mul(b.sdiv(jc, c64(NR)), b.mul(K, c64(NR))),
                                               b.mul(pc, c64(NR))))
                taps = b.icmp_unsigned("!=", g["boff"], ir.Constant(I8P, None))
                toff = b.bitcast(g["boff"], ir.IntType(64).as_pointer())
                grow = b.sdiv(pc, g["bgroup"])
                slot = b.select(taps, b.gep(toff, [grow]), self.field_ptr(b, ctx, "bgroup"))  # (no null load)
                rowoff = b.select(taps, b.add(b.load(slot), b.mul(b.srem(pc, g["bgroup"]), g["brs"])),
                                  b.mul(pc, g["brs"]))
                brow = f.at(g["B"], rowoff)
                with f.if_(b.not_(b.or_(g["bpacked"], g["bdirect"])), "packb"):
                    with f.if_else(b.icmp_unsigned("!=", g["pb"], ir.Constant(I8P, None)), "pb") as (cb, own):
                        with cb:  # the caller's packer makes the block (e.g. a conv's im2col)
                            b.call(b.bitcast(g["pb"], self.pb_type.as_pointer()), [g["pbctx"], pc, kc, jc, nc, bbuf])
                        with own:
                            b.call(pack_b, [brow, g["brs"], g["bcs"], c64(0), kc, jc, nc, bbuf])
                with f.if_(b.and_(g["bdirect"], b.icmp_signed("<", nfull, nc)), "packtail"):
                    b.call(pack_b, [brow, g["brs"], g["bcs"], c64(0), kc, b.add(jc, nfull),
                                    b.sub(nc, nfull), bbuf])
                bbase = b.select(g["bpacked"], bpre_base, bbuf)
                bpstride = b.select(g["bpacked"], b.mul(K, c64(NR)), b.mul(kc, c64(NR)))
                with f.loop(i0, i1, cfg.MC, "ic") as ic:
                    mc = f.min(c64(cfg.MC), b.sub(i1, ic))
                    apre_base = f.at(g["A"], b.add(b.mul(b.sdiv(ic, c64(MR)), b.mul(K, c64(MR))),
                                                   b.mul(pc, c64(MR))))
                    with f.if_(b.not_(b.or_(g["apacked"], g["adirect"])), "packa"):
                        b.call(pack_a, [g["A"], g["ars"], g["acs"], ic, mc, pc, kc, abuf])
                    abase = b.select(g["apacked"], apre_base, abuf)
                    apstride = b.select(g["apacked"], b.mul(K, c64(MR)), b.mul(kc, c64(MR)))
                    with f.loop(0, nc, NR, "jr") as jr:
                        nr = f.min(c64(NR), b.sub(nc, jr))
                        bptr = f.at(bbase, b.mul(b.sdiv(jr, c64(NR)), bpstride))
                        direct = b.and_(g["bdirect"], b.icmp_signed("==", nr, c64(NR)))
                        # in direct mode the packed tail panel is panel 0 of bbuf
                        bptr = b.select(g["bdirect"], bbuf, bptr)
                        bsrc = f.at(brow, b.add(jc, jr))
                        cbase = f.at(g["C"], b.add(jc, jr))
                        mfull = b.mul(b.sdiv(mc, c64(MR)), c64(MR))

                        nvneed = f.ceildiv(nr, self.W)  # vectors the panel needs (< NV: narrow)

                        def tile(rows, ir_, roff):
                            row = b.add(b.add(ic, ir_), roff)
                            aptr = f.at(abase, b.add(b.mul(b.sdiv(ir_, c64(MR)), apstride), roff))
                            cptr = f.at(cbase, b.mul(row, g["ldc"]))
                            if rows == MR:
                                return kernels(rows, aptr, cptr, ukr, ukr_direct, [])
                            # fewer rows than a panel: A read in place where it is not packed
                            with f.if_else(g["adirect"], "adir") as (then, otherwise):
                                with then:
                                    arow = f.at(g["A"], b.add(b.mul(row, g["ars"]), pc))
                                    kernels(rows, arow, cptr, ukr_ar, ukr_direct_ar, [g["ars"]])
                                with otherwise:
                                    kernels(rows, aptr, cptr, ukr, ukr_direct, [])

                        def kernels(rows, aptr, cptr, ukr, ukr_direct, extra):
                            with f.if_else(direct, "dir") as (then, otherwise):
                                with then:  # (direct panels are always full)
                                    b.call(ukr_direct[rows], [kc, aptr, bsrc, g["brs"], cptr,
                                                              g["ldc"], g["alpha"], beta, nr] + extra)
                                with otherwise:
                                    args = [kc, aptr, bptr, cptr, g["ldc"], g["alpha"], beta, nr]
                                    end = f.block("nv.end")
                                    # narrow N remainders (full row tiles): q whole vectors and a
                                    # column tail of c (the panel's last c columns), else fewer
                                    # vectors; the first case that holds runs
                                    cases = [(f"nv{q}tail{c}", b.icmp_signed("==", nr, c64(q * self.W + c)),
                                              q * self.W, kern)
                                             for q in range(self.NV) for c, kern in
                                             (tails.items() if rows == MR else ())]
                                    cases += [(f"nv{nv}", b.icmp_signed("==", nvneed, c64(nv)), 0, ukr[rows, nv])
                                              for nv in range(1, self.NV)]
                                    for label, cond, whole, kern in cases:
                                        blk, nxt = f.block(label), f.block(f"{label}.not")
                                        b.cbranch(cond, blk, nxt)
                                        b.position_at_end(blk)
                                        if whole:  # the whole vectors (no mask), then the tail after them
                                            b.call(ukr[rows, whole // self.W], args[:-1] + [c64(whole)] + extra)
                                        b.call(kern, [kc, aptr, f.at(bptr, c64(whole)), f.at(cptr, c64(whole)),
                                                      *args[4:]] + extra)  # (tails: full panels, no extra)
                                        b.branch(end)
                                        b.position_at_end(nxt)
                                    b.call(ukr[rows, self.NV], args + extra)
                                    b.branch(end)
                                    b.position_at_end(end)

                        with f.loop(0, mfull, MR, "ir") as ir_:
                            tile(MR, ir_, c64(0))
                        # the M remainder (< MR rows): one smaller kernel per set bit of it
                        rem = b.sub(mc, mfull)
                        for rows in self.edge_rows():
                            has = b.icmp_signed("!=", b.and_(rem, c64(rows)), c64(0))
                            with f.if_(has, f"m{rows}"):
                                tile(rows, mfull, b.and_(rem, c64(~(2 * rows - 1))))
                        # the panel C[ic:ic+mc, jc+jr:+nr] is final after the last K block: epilogue
                        last = b.icmp_signed(">=", b.add(pc, kc), K)
                        with f.if_(b.and_(has_ep, last), "ep"):
                            j = b.add(jc, jr)
                            b.call(ep, [g["epctx"], ic, b.add(ic, mc), j, b.add(j, nr)])
        b.ret_void()
        return fn

    # -- C = beta * C (K == 0 or alpha == 0) ---------------------------------------------------
    def emit_scale(self, name):
        fn = _new_fn(self.mod, name, VOID, [(I64, "M"), (I64, "N"), (F32, "beta"), (FP, "C"),
                                           (I64, "ldc")])
        f = _Fn(fn)
        b = f.b
        M, N, beta, C, ldc = fn.args
        beta0 = b.fcmp_ordered("==", beta, cf(0.0))
        with f.loop(0, M, 1, "i") as i:
            row = f.at(C, b.mul(i, ldc))
            with f.loop(0, N, 1, "j") as j:
                p = f.at(row, j)
                with f.if_else(beta0, "z") as (t, o):
                    with t:
                        b.store(cf(0.0), p, align=4)
                    with o:
                        b.store(b.fmul(beta, b.load(p, align=4)), p, align=4)
        b.ret_void()
        return fn

    # -- public entry points -------------------------------------------------------------------
    ARGS = [(I32, "ta"), (I32, "tb"), (I64, "M"), (I64, "N"), (I64, "K"), (F32, "alpha"), (FP, "A"),
            (I64, "lda"), (FP, "B"), (I64, "ldb"), (F32, "beta"), (FP, "C"), (I64, "ldc"), (I32, "nthreads")]

    def emit_main(self, alloc, run, release, worker, scale):
        """``{p}_taps`` (an epilogue, a B packer, B's rows in groups at a table of offsets), and
        ``{p}_cb``, ``{p}_ep`` and ``{p}``, which call it without the groups / also without the
        packer / without any of them."""
        cfg, MR, NR = self.cfg, self.MR, self.NR
        fn = _new_fn(self.mod, f"{self.p}_taps", I32, self.ARGS + [(I8P, "ep"), (I8P, "epctx"), (I8P, "pb"),
                                                                 (I8P, "pbctx"), (I8P, "boff"), (I64, "bgroup")],
                     internal=False)
        null = ir.Constant(I8P, None)
        for name, extra in ((f"{self.p}_cb", 4), (f"{self.p}_ep", 2), (self.p, 0)):
            wrap = _new_fn(self.mod, name, I32, self.ARGS + [(I8P, f"x{i}") for i in range(extra)], internal=False)
            wb = _Fn(wrap).b
            wb.ret(wb.call(fn, list(wrap.args) + [null] * (5 - extra) + [c64(1)]))
        f = _Fn(fn)
        b = f.b
        ta, tb, M, N, K, alpha, Ap, lda, Bp, ldb, beta, C, ldc, nth, ep, epctx, pbf, pbctx, boff, bgroup = fn.args
        has_pb = b.icmp_unsigned("!=", pbf, ir.Constant(I8P, None))
        empty = b.or_(b.icmp_signed("<=", M, c64(0)), b.icmp_signed("<=", N, c64(0)))
        with f.if_(empty, "empty"):
            b.ret(ir.Constant(I32, 0))
            b.position_at_end(f.block("unreachable"))
        scale_only = b.or_(b.icmp_signed("<=", K, c64(0)), b.fcmp_ordered("==", alpha, cf(0.0)))
        with f.if_(scale_only, "scale"):
            b.call(scale, [M, N, beta, C, ldc])
            with f.if_(b.icmp_unsigned("!=", ep, ir.Constant(I8P, None)), "scale.ep"):
                b.call(b.bitcast(ep, self.ep_type.as_pointer()), [epctx, c64(0), M, c64(0), N])
            b.ret(ir.Constant(I32, 0))
            b.position_at_end(f.block("unreachable"))
        one = c64(1)
        ta_t = b.icmp_signed("==", ta, ir.Constant(I32, 1))
        tb_t = b.icmp_signed("==", tb, ir.Constant(I32, 1))
        ars, acs = b.select(ta_t, one, lda), b.select(ta_t, lda, one)
        brs, bcs = b.select(tb_t, one, ldb), b.select(tb_t, ldb, one)
        apacked = b.icmp_signed("==", ta, ir.Constant(I32, 2))
        bpacked = b.icmp_signed("==", tb, ir.Constant(I32, 2))
        # A read in place when it has fewer rows than a panel and k stride 1: packing its rows
        # into a panel of MR would cost as much as multiplying them (a batch-1 GEMV)
        adirect = b.and_(b.icmp_signed("==", ta, ir.Constant(I32, 0)), b.icmp_signed("<", M, c64(MR)))
        # B read in place (no packing) for small M, unless its rows are far apart (then the
        # NR-wide column stripes touch a new page per k and packing may win: per ISA, measured)
        bdirect = b.and_(b.and_(b.icmp_signed("==", tb, ir.Constant(I32, 0)), b.not_(has_pb)),
                         b.and_(b.or_(b.icmp_signed("<=", M, c64(cfg.direct_b_max_m)),
                                      b.and_(b.icmp_signed("<=", M, c64(cfg.direct_b_narrow_max_m)),
                                             b.icmp_signed(">=", K, b.mul(M, c64(4))))),
                                b.or_(b.icmp_signed("<=", M, c64(4)),
                                      b.icmp_signed("<=", ldb, c64(cfg.direct_b_max_ldb)))))
        # a few rows against a row-major B in place: B's rows streamed whole (``stream.py``)
        # (and a transposed B, whose columns are rows of memory: dot products)
        few = b.and_(b.and_(b.icmp_signed("==", ta, ir.Constant(I32, 0)), b.icmp_signed("<=", M, c64(cfg.stream_max_m))),
                     b.and_(b.not_(has_pb), b.icmp_unsigned("==", boff, null)))
        bstream = b.and_(few, b.icmp_signed("==", tb, ir.Constant(I32, 0)))
        bdot = b.and_(few, tb_t)
        # threads
        T = b.sext(nth, I64)
        T = f.min(f.max(T, one), c64(cfg.max_threads))
        flops = b.fmul(b.fmul(b.sitofp(M, ir.DoubleType()), b.sitofp(N, ir.DoubleType())),
                       b.fmul(b.sitofp(K, ir.DoubleType()), ir.Constant(ir.DoubleType(), 2.0)))
        small = b.fcmp_ordered("<", flops, ir.Constant(ir.DoubleType(), cfg.par_min_flops))
        # (streams and dots are bound by reading B: a large B is shared out whatever the flops)
        big_b = b.icmp_signed(">=", b.mul(K, N), c64(cfg.stream_par_min_floats))
        small = b.and_(small, b.not_(b.and_(few, big_b)))
        T = b.select(small, one, T)
        # task grid gm x gn (T * tasks_per_thread tasks up to twice that) of least estimated time
        # per thread: the most area any thread's range of tasks covers (its tiles, padding included:
        # the cost of an unbalanced grid), plus its share of the operand traffic (every task streams
        # its A rows and B columns, gn*M + gm*N, and packs those not pre-packed). The columns of a
        # row of tasks take ceil(want / gm) to ceil(2 want / gm) tasks: a product whose panels do
        # not split evenly into want tasks often does into a few more (ResNet-50's 3x3/2 conv, M 128
        # x N 784 on 2 threads: 4 column tasks of 7, 7, 7 and 4 panels, 14 against 11 per thread;
        # 7 of 4 panels, 12 against 13)
        want = b.select(b.icmp_signed("==", T, one), one, b.mul(T, c64(cfg.tasks_per_thread)))
        best = f.alloca(I64, 4, name="best")  # cost, tm, tn, tasks
        worst = f.alloca(I64, 1, name="worst")
        for j, v in enumerate([c64(2 ** 62), M, N, one]):
            b.store(v, b.gep(best, [c64(j)]))
        with f.loop(1, b.add(want, one), 1, "gm") as gm:
            with f.loop(f.ceildiv(want, gm), b.add(f.ceildiv(b.mul(want, c64(2)), gm), one), 1, "gn") as gn:
                tm = f.roundup(f.ceildiv(M, gm), MR)
                tn = f.roundup(f.ceildiv(N, gn), NR)
                real_gm, real_gn = f.ceildiv(M, tm), f.ceildiv(N, tn)
                tasks = b.mul(real_gm, real_gn)
                a_rows, b_cols = b.mul(real_gn, M), b.mul(real_gm, N)  # what the tasks stream, all told
                packed = b.add(b.select(apacked, c64(0), a_rows), b.select(bpacked, c64(0), b_cols))
                traffic = b.add(b.mul(b.add(a_rows, b_cols), c64(READ_COST)), b.mul(packed, c64(PACK_COST)))
                b.store(c64(0), worst)
                ranges = f.min(T, tasks)
                with f.loop(0, ranges, 1, "range") as rk:  # thread k's tasks: [k*tasks/T, (k+1)*tasks/T)
                    lo = b.sdiv(b.mul(rk, tasks), ranges)
                    hi = b.sdiv(b.mul(b.add(rk, one), tasks), ranges)
                    area = b.sub(self._area_before(f, hi, M, N, tm, tn, real_gm, real_gn),
                                 self._area_before(f, lo, M, N, tm, tn, real_gm, real_gn))
                    b.store(f.max(area, b.load(worst)), worst)
                cost = b.add(b.load(worst), b.sdiv(traffic, T))
                old, old_tasks = b.load(b.gep(best, [c64(0)])), b.load(b.gep(best, [c64(3)]))
                # equal cost: the grid of more tasks (a thread the OS deschedules holds up less)
                better = b.or_(b.icmp_signed("<", cost, old),
                               b.and_(b.icmp_signed("==", cost, old), b.icmp_signed(">", tasks, old_tasks)))
                with f.if_(better, "better"):
                    for j, v in enumerate([cost, tm, tn, tasks]):
                        b.store(v, b.gep(best, [c64(j)]))
        tm = b.load(b.gep(best, [c64(1)]))
        tn = b.load(b.gep(best, [c64(2)]))
        tiles_n = f.ceildiv(N, tn)
        ntasks = b.mul(f.ceildiv(M, tm), tiles_n)
        T = f.min(T, ntasks)
        # K blocks of balanced depth (576 = 2 x 288 rather than 256 + 256 + 64: each block
        # re-reads and re-writes C, so a thin last block costs nearly a full one)
        kcb = f.ceildiv(K, f.ceildiv(K, c64(cfg.KC)))
        kcb = b.select(b.and_(adirect, bpacked), K, kcb)
        kcb = b.select(b.icmp_unsigned("!=", boff, null), bgroup, kcb)  # (taps: a block per group)
        # packing buffers (floats): none for a pre-packed operand, one panel for a direct B
        abuf = b.select(b.or_(apacked, adirect), one, b.mul(f.min(c64(cfg.MC), f.roundup(tm, MR)), kcb))
        bbuf = b.mul(f.min(c64(cfg.NC), f.roundup(tn, NR)), kcb)
        bbuf = b.select(bpacked, one, b.select(bdirect, b.mul(c64(NR), kcb), bbuf))
        bbuf = b.select(bstream, c64(STREAM_ROW * max(1, cfg.stream_max_m)), b.select(bdot, one, bbuf))
        vals = dict(M=M, N=N, K=K, alpha=alpha, beta=beta, A=Ap, ars=ars, acs=acs, apacked=apacked, adirect=adirect,
                    B=Bp, brs=brs, bcs=bcs, bpacked=bpacked, bdirect=bdirect, bstream=bstream, bdot=bdot, C=C, ldc=ldc, tm=tm,
                    tn=tn, tiles_n=tiles_n, ntasks=ntasks, abuf=abuf, bbuf=bbuf, kstep=kcb, ep=ep, epctx=epctx,
                    pb=pbf, pbctx=pbctx, boff=boff, bgroup=bgroup, nranges=T, done=c64(0))
        free = _declare(self.mod, "free", VOID, [I8P])
        size = b.ptrtoint(b.gep(ir.Constant(self.ctx_ty.as_pointer(), None), [ir.Constant(I32, 1)]), I64)
        memalign = _declare(self.mod, "posix_memalign", I32, [I8P.as_pointer(), I64, I64])
        rawp = f.alloca(I8P, name="rawctx")
        with f.if_(b.icmp_signed("!=", b.call(memalign, [rawp, c64(64), size]), ir.Constant(I32, 0)), "noctx"):
            b.ret(ir.Constant(I32, 1))
            b.position_at_end(f.block("unreachable"))
        ctx = b.bitcast(b.load(rawp), self.ctx_ty.as_pointer())
        vals.update(refs=c64(1), helpers=c64(0), max_helpers=c64(0))
        for n, _ in self.ctx_fields:
            if n != "claims":
                b.store(vals[n], self.field_ptr(b, ctx, n))
        # thread k's range of tasks: [k * ntasks / T, (k + 1) * ntasks / T) (pool.py, emit_run)
        with f.loop(0, T, 1, "range") as k:
            b.store(b.sdiv(b.mul(k, ntasks), T), self.claim_ptr(b, ctx, k))
        slots = f.alloca(I8P, 2, name="slots")

        def own_buffers():  # the calling thread's packing buffers (none: C is unchanged, return 1)
            with f.if_(b.not_(b.call(alloc, [ctx, slots])), "nomem"):
                b.call(free, [b.bitcast(ctx, I8P)])
                b.ret(ir.Constant(I32, 1))
                b.position_at_end(f.block("unreachable"))

        if self.cfg.external_pool:
            self._run_on_shared_pool(f, ctx, slots, T, ntasks, alloc, run, free, own_buffers)
        else:
            own_buffers()
            self._run_on_own_pool(f, ctx, slots, T, run, free, worker)
        yield_ = _declare(self.mod, "sched_yield", I32, [])
        # every task is taken; wait for those other threads still compute (never for a thread
        # that has not started: it finds no task and just releases the context)
        wait, waited = f.block("wait"), f.block("waited")
        b.branch(wait)
        b.position_at_end(wait)
        d = b.load_atomic(self.field_ptr(b, ctx, "done"), "seq_cst", 8)
        fin = b.icmp_signed(">=", d, ntasks)
        spin = f.block("spin")
        b.cbranch(fin, waited, spin)
        b.position_at_end(spin)
        b.call(yield_, [])
        b.branch(wait)
        b.position_at_end(waited)
        if not self.cfg.external_pool:
            with f.if_(b.load(self._posted), "unpost"):  # late pool threads now find no job
                b.call(self.f_lock, [self._mutex(b)])
                b.store(ir.Constant(I8P, None), self.g_job)
                b.call(self.f_unlock, [self._mutex(b)])
        b.call(release, [ctx])
        b.ret(ir.Constant(I32, 0))
        return self.mod.globals[self.p]

    def _area_before(self, f, t, M, N, tm, tn, gm, gn):
        """The padded area (tiles of C, ``MR x NR`` each) of the first ``t`` tasks of a ``gm x gn``
        grid of ``tm x tn`` tasks, row-major (the last row and column of tasks may be short)."""
        b, one = f.b, c64(1)
        i, j = b.sdiv(t, gn), b.srem(t, gn)
        r_last = f.roundup(b.sub(M, b.mul(b.sub(gm, one), tm)), self.MR)
        c_last = f.roundup(b.sub(N, b.mul(b.sub(gn, one), tn)), self.NR)
        cols = b.add(b.mul(b.sub(gn, one), tn), c_last)  # one row of tasks
        rows = b.select(b.icmp_signed("<", i, gm), b.mul(i, tm), b.add(b.mul(b.sub(gm, one), tm), r_last))
        row_i = b.select(b.icmp_signed("<", i, b.sub(gm, one)), tm, r_last)  # (j = 0 when i = gm)
        return b.add(b.mul(rows, cols), b.mul(row_i, b.mul(j, tn)))

    def _run_on_shared_pool(self, f, ctx, slots, T, ntasks, alloc, run, free, own_buffers):
        """Each of T chunks of ``kiln_parallel_for`` (one per thread) runs the task loop with packing
        buffers of its own; a chunk that cannot allocate leaves its tasks to the others, and should
        tasks be left at the end the caller takes them with buffers of its own (when even those
        cannot be had, it returns 1 with C partly computed)."""
        b = f.b
        pf = _declare(self.mod, "kiln_parallel_for", VOID, [I8P, I8P, I64, I32])
        name = f"{self.p}.pooltask"
        task = self.mod.globals.get(name)
        if task is None:
            task = _new_fn(self.mod, name, VOID, [(I8P, "ctx"), (I64, "begin"), (I64, "end")])
            tf = _Fn(task)
            tctx = tf.b.bitcast(task.args[0], self.ctx_ty.as_pointer())
            tslots = tf.alloca(I8P, 2, name="slots")
            with tf.if_(tf.b.call(alloc, [tctx, tslots]), "ok"):
                a = tf.b.bitcast(tf.b.load(tf.b.gep(tslots, [c64(0)])), FP)
                bb = tf.b.bitcast(tf.b.load(tf.b.gep(tslots, [c64(1)])), FP)
                tf.b.call(run, [tctx, a, bb, task.args[1]])  # chunk k: thread k (parallel.c), range k
                tf.b.call(free, [tf.b.bitcast(a, I8P)])
                tf.b.call(free, [tf.b.bitcast(bb, I8P)])
            tf.b.ret_void()
        b.call(pf, [b.bitcast(task, I8P), b.bitcast(ctx, I8P), T, b.trunc(T, I32)])  # T = 1: inline
        # every chunk has returned: a run drains every range, so tasks are left only when no chunk
        # could allocate its buffers
        left = b.icmp_signed("<", b.load_atomic(self.field_ptr(b, ctx, "done"), "seq_cst", 8), ntasks)
        with f.if_(left, "leftover"):
            own_buffers()
            abuf = b.bitcast(b.load(b.gep(slots, [c64(0)])), FP)
            bbuf = b.bitcast(b.load(b.gep(slots, [c64(1)])), FP)
            b.call(run, [ctx, abuf, bbuf, c64(0)])
            b.call(free, [b.bitcast(abuf, I8P)])
            b.call(free, [b.bitcast(bbuf, I8P)])

    def _run_on_own_pool(self, f, ctx, slots, T, run, free, worker):
        b = f.b
        one = c64(1)
        wfn_ty = ir.FunctionType(I8P, [I8P])
        create = _declare(self.mod, "pthread_create", I32,
                          [I64.as_pointer(), I8P, wfn_ty.as_pointer(), I8P])
        detach = _declare(self.mod, "pthread_detach", I32, [I64])
        tid = f.alloca(I64, name="tid")
        posted = self._posted = f.alloca(I1, name="posted")
        b.store(ir.Constant(I1, 0), posted)
        # post the job to the pool (unless single-threaded, or the pool is busy with another
        # caller's job: then this thread computes every task itself)
        with f.if_(b.icmp_signed(">", T, one), "post"):
            b.call(self.f_lock, [self._mutex(b)])
            idle = b.icmp_unsigned("==", b.load(self.g_job), ir.Constant(I8P, None))
            with f.if_(idle, "idle"):
                helpers = b.sub(T, one)
                grow_h, grow_b, grow_e = f.block("grow.head"), f.block("grow.body"), f.block("grow.end")
                b.branch(grow_h)
                b.position_at_end(grow_h)
                b.cbranch(b.icmp_signed("<", b.load(self.g_nworkers), helpers), grow_b, grow_e)
                b.position_at_end(grow_b)
                rc = b.call(create, [tid, ir.Constant(I8P, None), worker, ir.Constant(I8P, None)])
                created, failed = f.block("created"), f.block("create_failed")
                b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), created, failed)
                b.position_at_end(created)
                b.call(detach, [b.load(tid)])
                b.store(b.add(b.load(self.g_nworkers), one), self.g_nworkers)
                b.branch(grow_h)
                b.position_at_end(failed)
                b.branch(grow_e)
                b.position_at_end(grow_e)
                b.store(helpers, self.field_ptr(b, ctx, "max_helpers"))
                b.store(b.bitcast(ctx, I8P), self.g_job)
                b.store(b.add(b.load(self.g_gen), one), self.g_gen)
                b.store(ir.Constant(I1, 1), posted)
                b.call(self.f_bcast, [self._cond(b)])
            b.call(self.f_unlock, [self._mutex(b)])
        abuf = b.bitcast(b.load(b.gep(slots, [c64(0)])), FP)
        bbuf = b.bitcast(b.load(b.gep(slots, [c64(1)])), FP)
        b.call(run, [ctx, abuf, bbuf, c64(0)])
        b.call(free, [b.bitcast(abuf, I8P)])
        b.call(free, [b.bitcast(bbuf, I8P)])

    def emit(self):
        p = self.p
        ukr, ukr_direct = {}, {}
        for rows in [self.MR] + self.edge_rows():
            for nv in range(1, self.NV + 1):
                ukr[rows, nv] = self.emit_microkernel(f"{p}.ukr{rows}x{nv}", rows, self.NR, nv)
            ukr_direct[rows] = self.emit_microkernel(f"{p}.ukr{rows}_direct", rows, None)
        ukr_ar, ukr_direct_ar = {}, {}  # the same with A's rows read in place (fewer than MR rows)
        for rows in self.edge_rows():
            for nv in range(1, self.NV + 1):
                ukr_ar[rows, nv] = self.emit_microkernel(f"{p}.ukr{rows}x{nv}_ar", rows, self.NR, nv, a_rows=True)
            ukr_direct_ar[rows] = self.emit_microkernel(f"{p}.ukr{rows}_direct_ar", rows, None, a_rows=True)
        tails = {c: self.emit_col_tail(f"{p}.tail{c}", c) for c in range(1, self.cfg.col_tail + 1)}
        pack_a = self.emit_pack_a(f"{p}.pack_a")
        pack_b = self.emit_pack_b(f"{p}.pack_b")
        srows = {rows: self.emit_stream_rows(f"{p}.srows{rows}", rows) for rows in range(1, self.cfg.stream_max_m + 1)}
        sdot = {(rows, cols): self.emit_dot_rows(f"{p}.sdot{rows}x{cols}", rows, cols)
                for rows in range(1, self.cfg.stream_max_m + 1) for cols in sorted({1, self.dot_cols(rows)})}
        task = self.emit_task(f"{p}.task", ukr, ukr_direct, ukr_ar, ukr_direct_ar, tails, pack_a, pack_b, srows, sdot)
        alloc = self.emit_alloc(f"{p}.alloc")
        run = self.emit_run(f"{p}.run", task)
        release = self.emit_release(f"{p}.release")
        self.emit_pool_globals()
        worker = self.emit_worker(f"{p}.worker", alloc, run, release)
        scale = self.emit_scale(f"{p}.scale")
        main = self.emit_main(alloc, run, release, worker, scale)
        self.emit_pack_api(pack_a, pack_b)
        return main


def sgemm_type() -> ir.FunctionType:
    """The LLVM type of the entry ``emit_gemm`` defines (``int32 kiln_sgemm(ta, tb, M, N, K, ...)``)."""
    return ir.FunctionType(I32, [t for t, _ in _GemmEmitter.ARGS])


def emit_gemm(module: ir.Module, cfg: GemmConfig, prefix: str = "kiln_sgemm") -> ir.Function:
    """Add Kiln's sgemm (entry ``prefix`` and ``prefix_pack_*``) to ``module``; returns the entry."""
    return _GemmEmitter(module, cfg, prefix).emit()
