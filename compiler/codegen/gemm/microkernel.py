"""The GEMM's microkernels, emitted as LLVM IR: the register-blocked ``MR x NR`` kernel (and its
narrower variants for M and N remainders) and the column-tail kernel for N remainders of a few
columns. A mixin of the GEMM emitter (``kernel.py``), which provides ``mod``, ``cfg``, ``W``, ``MR``,
``NV``, ``NR``, ``vec``, ``vecp``, ``fmuladd``, ``prefetch`` and the helpers of ``irbuild.VectorOps``."""
from __future__ import annotations

from llvmlite import ir

from .irbuild import F32, FP, I8P, I32, I64, VOID, _declare, _Fn, _new_fn, c64, cf


def _kloop(f: _Fn, kc, name, start, a_start, b_start, accs_in, step, steps, a_kstride: int, b_kstride):
    """for (k = start; k + step <= kc; k += step): ``accs = steps(ap, bp, accs, step)`` with the
    panel pointers bumped by ``step`` k (A by ``a_kstride`` floats per k, B by ``b_kstride``, an
    i64 value); returns the exit phis (k, ap, bp, accs)."""
    b = f.b
    pre = b.block
    head, body, end = f.block(name + ".head"), f.block(name + ".body"), f.block(name + ".end")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I64, "k")
    ap = b.phi(FP, "ap")
    bp = b.phi(FP, "bp")
    accs = [b.phi(v.type, f"acc{i}") for i, v in enumerate(accs_in)]
    for phi, v in zip([k, ap, bp] + accs, [start, a_start, b_start] + list(accs_in)):
        phi.add_incoming(v, pre)
    b.cbranch(b.icmp_signed("<=", b.add(k, c64(step)), kc), body, end)
    b.position_at_end(body)
    new = steps(ap, bp, accs, step)
    nk = b.add(k, c64(step))
    nap = f.at(ap, step * a_kstride)
    nbp = b.gep(bp, [b.mul(c64(step), b_kstride)], inbounds=True)
    for phi, v in zip([k, ap, bp] + accs, [nk, nap, nbp] + new):
        phi.add_incoming(v, b.block)
    b.branch(head)
    b.position_at_end(end)
    return k, ap, bp, accs



class MicrokernelEmitter:
    # -- microkernel -------------------------------------------------------------------------
    def emit_microkernel(self, name: str, rows: int, b_kstride: int | None, nv: int | None = None,
                         a_rows: bool = False):
        """ukr(kc, a, b, [bks,] c, ldc, alpha, beta, nr[, ars]): C[rows, nr] = alpha*Ap@Bp (+ beta*C).

        a: ``rows`` rows of a packed A panel (k stride MR) or, with ``a_rows``, A read in place:
        row r at ``a + r * ars``, k stride 1 (a product of fewer than MR rows, whose packing would
        cost as much as its arithmetic: a batch-1 GEMV's one row); b: a packed B panel (k stride NR) or,
        when ``b_kstride`` is None, a row-major B read in place with k stride ``bks``. nr <= NR
        (columns past nr are computed from B's zero padding and not stored: masked stores).
        beta == 0 does not read C. With ``nv`` < NV only the first nv vectors of the panel are
        computed (narrow N remainders: nr <= nv * W).
        """
        W, MR, NR, U = self.W, self.MR, self.NR, self.cfg.unroll
        NV = nv or self.NV  # vectors computed (the panel's k stride stays NR)
        # independent accumulator chains: with few rows, split the k loop into phases. Counted with
        # the full panel width, not ``nv``: the columns of an N remainder are then summed in the same
        # order as the other columns of their rows (a model whose output channels are computed
        # alike gets equal bits for them whatever their position)
        phases = 1
        while rows * self.NV * phases < 8 and phases < U:
            phases *= 2
        args = [(I64, "kc"), (FP, "a"), (FP, "b")]
        if b_kstride is None:
            args.append((I64, "bks"))
        args += [(FP, "c"), (I64, "ldc"), (F32, "alpha"), (F32, "beta"), (I64, "nr")]
        if a_rows:
            args.append((I64, "ars"))
        fn = _new_fn(self.mod, name, VOID, args)
        fn.attributes.add("noinline")
        f = _Fn(fn)
        b = f.b
        A = dict(zip([n for _, n in args], fn.args))
        kc, a0, b0, c, ldc, nr = A["kc"], A["a"], A["b"], A["c"], A["ldc"], A["nr"]
        bks = c64(b_kstride) if b_kstride is not None else A["bks"]
        balign = 4  # packed buffers may come from the caller unaligned (vmovups costs nothing)
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
        for r in range(rows):  # prefetch the C tile (written at the end; past nr columns only a hint)
            row = f.at(c, b.mul(c64(r), ldc))
            for off in list(range(0, NR, 16)) + ([NR - 1] if NR % 16 else []):
                b.call(self.prefetch, [b.bitcast(b.gep(row, [c64(off)]), I8P), i32(1), i32(3), i32(1)])
        zero = ir.Constant(self.vec, [0.0] * W)
        nacc = rows * NV
        # a packed B panel: prefetch_b k steps ahead; B read in place (its K rows are K streams, more
        # than the hardware prefetchers follow): each k step's row prefetch_direct_b floats on
        ahead_k, ahead_cols, locality = ((self.cfg.prefetch_b, 0, 3) if b_kstride is not None else
                                         (0, self.cfg.prefetch_direct_b, self.cfg.prefetch_direct_locality))

        def steps(ap, bp, accs, n):
            accs = list(accs)
            for u in range(n):
                ph = (u % phases) * nacc
                bv = [self.vload(f, bp, b.add(b.mul(c64(u), bks), c64(v * W)), balign)
                      for v in range(NV)]
                if ahead_k or ahead_cols:  # software prefetch of B: one per line of the panel's row
                    for off in range(0, NR, 16):  # (past B's end only a hint: a plain GEP, not inbounds)
                        pf = b.gep(bp, [b.add(b.mul(c64(u + ahead_k), bks), c64(off + ahead_cols))])
                        b.call(self.prefetch, [b.bitcast(pf, I8P), i32(0), i32(locality), i32(1)])
                for r in range(rows):
                    at = b.add(b.mul(c64(r), A["ars"]), c64(u)) if a_rows else u * MR + r
                    av = self.splat(b, b.load(f.at(ap, at), align=4))
                    for v in range(NV):
                        k = ph + r * NV + v
                        accs[k] = b.call(self.fmuladd, [av, bv[v], accs[k]])
            return accs

        accs = [zero] * (nacc * phases)
        aks = 1 if a_rows else MR
        k, ap, bp, accs = _kloop(f, kc, "kmain", c64(0), a0, b0, accs, U, steps, aks, bks)
        if U > 1:
            k, ap, bp, accs = _kloop(f, kc, "krem", k, ap, bp, accs, 1, steps, aks, bks)
        for ph in range(1, phases):
            accs[:nacc] = [b.fadd(x, y) for x, y in zip(accs[:nacc], accs[ph * nacc:(ph + 1) * nacc])]
        accs = accs[:nacc]

        # epilogue: C = alpha*acc (+ beta*C); full panels with plain stores, the N edge masked
        alpha_v = self.splat(b, A["alpha"])
        beta_v = self.splat(b, A["beta"])
        vals = [b.fmul(acc, alpha_v) for acc in accs]
        full = b.icmp_signed("==", nr, c64(NV * W))
        beta0 = b.fcmp_ordered("==", A["beta"], cf(0.0))
        masks = [self.lane_mask(b, b.sub(nr, c64(v * W))) for v in range(NV)]
        mload, mstore = self.masked_ops()

        def store_all(masked, with_beta):
            for r in range(rows):
                row = f.at(c, b.mul(c64(r), ldc))
                for v in range(NV):
                    ptr = b.bitcast(f.at(row, v * W), self.vecp)
                    val = vals[r * NV + v]
                    if with_beta:
                        old = (b.call(mload, [ptr, i32(4), masks[v], zero]) if masked
                               else b.load(ptr, align=4))
                        val = b.call(self.fmuladd, [old, beta_v, val])
                    if masked:
                        b.call(mstore, [val, ptr, i32(4), masks[v]])
                    else:
                        b.store(val, ptr, align=4)

        with f.if_else(full, "full") as (then, otherwise):
            for arm, masked in ((then, False), (otherwise, True)):
                with arm:
                    with f.if_else(beta0, "b0") as (t2, o2):
                        with t2:
                            store_all(masked, False)
                        with o2:
                            store_all(masked, True)
        b.ret_void()
        return fn

    def emit_col_tail(self, name: str, cols: int):
        """ukr(kc, a, b, c, ldc, alpha, beta, nr): C[MR, cols] = alpha*Ap@Bp (+ beta*C), for an N
        remainder of ``cols`` (< W) columns of a packed B panel.

        The full-width kernel would compute a whole vector of B's zero padding per row and issue a
        broadcast of A per row and k (load-bound: MR + 1 loads for MR useful FMAs of one lane each).
        Here C's rows are the vector lanes instead: per k one load of the packed A panel's MR values
        and one broadcast of B per column (cols + 1 loads), k split over independent accumulator
        chains (FMA latency). 1 column of 4 rows: about 2.5 times faster than the masked kernel.
        """
        MR, NR = self.MR, self.NR
        vt = ir.VectorType(F32, MR)
        fma = _declare(self.mod, f"llvm.fmuladd.v{MR}f32", vt, [vt] * 3)
        phases = 1
        while cols * phases < 8:
            phases *= 2
        args = [(I64, "kc"), (FP, "a"), (FP, "b"), (FP, "c"), (I64, "ldc"), (F32, "alpha"), (F32, "beta"),
                (I64, "nr")]
        fn = _new_fn(self.mod, name, VOID, args)
        fn.attributes.add("noinline")
        f = _Fn(fn)
        b = f.b
        kc, a0, b0, c, ldc, alpha, beta, _ = fn.args

        def steps(ap, bp, accs, n):
            accs = list(accs)
            for u in range(n):
                av = b.load(b.bitcast(f.at(ap, u * MR), vt.as_pointer()), align=4)
                for j in range(cols):
                    x = (u % phases) * cols + j
                    accs[x] = b.call(fma, [av, self.splat(b, b.load(f.at(bp, u * NR + j), align=4), vt), accs[x]])
            return accs

        accs = [ir.Constant(vt, [0.0] * MR)] * (cols * phases)
        k, ap, bp, accs = _kloop(f, kc, "kmain", c64(0), a0, b0, accs, phases, steps, MR, c64(NR))
        k, ap, bp, accs = _kloop(f, kc, "krem", k, ap, bp, accs, 1, steps, MR, c64(NR))
        for ph in range(1, phases):
            accs[:cols] = [b.fadd(x, y) for x, y in zip(accs[:cols], accs[ph * cols:(ph + 1) * cols])]
        vals = [[b.fmul(b.extract_element(accs[j], ir.Constant(I32, r)), alpha) for j in range(cols)]
                for r in range(MR)]
        with f.if_else(b.fcmp_ordered("==", beta, cf(0.0)), "b0") as (then, otherwise):
            for arm, with_beta in ((then, False), (otherwise, True)):
                with arm:
                    for r in range(MR):
                        row = f.at(c, b.mul(c64(r), ldc))
                        for j in range(cols):
                            v = vals[r][j]
                            if with_beta:
                                v = b.fadd(v, b.fmul(beta, b.load(f.at(row, j), align=4)))
                            b.store(v, f.at(row, j), align=4)
        b.ret_void()
        return fn
