"""A product of a few rows of A against a B read in place (a batch-1 GEMV whose B is an activation,
not a packed weight): a row-major B by streaming its rows, a transposed one by dot products.

The register-tile path reads such a B in place too (``bdirect``), as ``NR``-column stripes: each k
step of a stripe is a few cache lines ``ldb`` floats after the last, so the hardware prefetchers
see short runs at a large stride, and with ``ldb`` a multiple of 1024 every row of a stripe falls
in the same cache sets (a 1 x 1024 x 1280 product ran at 5.7 GFLOP/s, against 22 for the same B
pre-packed). Here a task's columns are instead taken ``STREAM_COLS`` at a time: each pass over
them reads ``STREAM_DEPTH`` whole rows of B, contiguously, and adds their products into the rows'
sums, kept in a buffer that stays in L1 (the task's packing buffer: at most 4 x 1024 floats); the
sums are then scaled into C (``alpha``, ``beta``) and the epilogue runs on each ``NR``-column
panel. Every column is summed in k order, the same way whatever its position. That 1 x 1024 x 1280
product: 446 -> 84 us on one Zen 4 core (docs/gemm.md has the rest); from 5 rows on, loading and
storing every row's sums each pass costs more than the stripes lose (``GemmConfig.stream_max_m``).

A transposed B (column n of B is row n of memory: attention's scores against the keys at decode
time) was packed into panels, a whole extra pass over B for one row of A. Here each column of C
is the dot product of A's row with a row of memory: ``dot_cols`` columns at once (a vector of
sums per row and column, W k a step, the last ``K % W`` under a mask), each vector summed by
halves (1 x 1024 x 1280: 303 -> 88 us).

A mixin of the GEMM emitter (``kernel.py``), which provides ``mod``, ``cfg``, ``W``, ``NR``, ``vec``,
``vecp``, ``fmuladd`` and the helpers of ``irbuild.VectorOps``.
"""
from __future__ import annotations

from llvmlite import ir

from .irbuild import F32, FP, I32, I64, VOID, _Fn, _new_fn, c64, cf

#: columns of a task streamed at once (their sums: ``STREAM_COLS`` floats a row, in L1)
STREAM_COLS = 1024
#: floats between two rows' sums in the buffer: not a multiple of 4 KB apart, or a row's loads would
#: wait on the stores of the row before (same address bits below 4 KB: "4K aliasing")
STREAM_ROW = STREAM_COLS + 32
#: rows of B a pass over the columns adds
STREAM_DEPTH = 2


class StreamEmitter:
    def emit_stream_rows(self, name: str, rows: int):
        """srows(K, a, ars, bm, brs, n, acc, accs): acc[r, 0:n] += sum_k a[r*ars + k] * bm[k*brs + 0:n]
        for r < ``rows`` (the sums' rows ``accs`` floats apart, padded to whole vectors)."""
        W = self.W
        fn = _new_fn(self.mod, name, VOID, [(I64, "K"), (FP, "a"), (I64, "ars"), (FP, "bm"), (I64, "brs"),
                                           (I64, "n"), (FP, "acc"), (I64, "accs")])
        fn.attributes.add("noinline")
        f = _Fn(fn)
        b = f.b
        K, a, ars, bm, brs, n, acc, accs = fn.args
        mload, _ = self.masked_ops()
        zero = ir.Constant(self.vec, [0.0] * W)
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
        whole, tail = self.tail_mask(f, n)
        accrow = [f.at(acc, b.mul(c64(r), accs)) for r in range(rows)]

        def rows_of_b(k, depth):
            """Add B's rows k .. k + depth - 1 times A's columns into the sums."""
            arow = [[self.splat(b, b.load(f.at(a, b.add(b.mul(c64(r), ars), b.add(k, c64(d)))), align=4))
                     for d in range(depth)] for r in range(rows)]
            brow = [f.at(bm, b.mul(b.add(k, c64(d)), brs)) for d in range(depth)]

            def add(j, bvals):
                for r in range(rows):
                    c = self.vload(f, accrow[r], j)
                    for d in range(depth):
                        c = b.call(self.fmuladd, [arow[r][d], bvals[d], c])
                    self.vstore(f, c, accrow[r], j)

            with f.loop(0, whole, W, "sv") as j:
                add(j, [self.vload(f, brow[d], j) for d in range(depth)])
            with f.if_(b.icmp_signed("<", whole, n), "stail"):
                add(whole, [b.call(mload, [b.bitcast(f.at(brow[d], whole), self.vecp), i32(4), tail, zero])
                            for d in range(depth)])

        D = STREAM_DEPTH
        deep = b.mul(b.sdiv(K, c64(D)), c64(D))
        with f.loop(0, deep, D, "sk") as k:
            rows_of_b(k, D)
        with f.loop(deep, K, 1, "sk1") as k:
            rows_of_b(k, 1)
        b.ret_void()
        return fn

    def emit_stream_task(self, f, g, buf, i0, i1, j0, j1, srows, has_ep, ep):
        """In a task (``emit_task``'s builder ``f``, its context fields ``g``): C[i0:i1, j0:j1] by
        streaming, ``i1 - i0`` rows at most ``cfg.stream_max_m`` (``srows[rows]``), the sums in
        ``buf``."""
        b, W, NR = f.b, self.W, self.NR
        mload, mstore = self.masked_ops()
        zero = ir.Constant(self.vec, [0.0] * W)
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
        mr = b.sub(i1, i0)
        a = f.at(g["A"], b.mul(i0, g["ars"]))
        with f.loop(j0, j1, STREAM_COLS, "sc") as jc:
            n = f.min(c64(STREAM_COLS), b.sub(j1, jc))
            padded = f.roundup(n, W)
            with f.loop(0, b.mul(mr, c64(STREAM_ROW)), STREAM_ROW, "sz") as r0:
                with f.loop(0, padded, W, "szv") as j:
                    self.vstore(f, zero, buf, b.add(r0, j))
            for rows in range(1, self.cfg.stream_max_m + 1):
                with f.if_(b.icmp_signed("==", mr, c64(rows)), f"s{rows}"):
                    b.call(srows[rows], [g["K"], a, g["ars"], f.at(g["B"], jc), g["brs"], n, buf,
                                         c64(STREAM_ROW)])
            # C = alpha * sums (+ beta * C; beta == 0 does not read C)
            whole, tail = self.tail_mask(f, n)
            alpha_v, beta_v = self.splat(b, g["alpha"]), self.splat(b, g["beta"])
            beta0 = b.fcmp_ordered("==", g["beta"], cf(0.0))
            with f.loop(0, mr, 1, "sr") as r:
                crow = f.at(g["C"], b.add(b.mul(b.add(i0, r), g["ldc"]), jc))
                srow = f.at(buf, b.mul(r, c64(STREAM_ROW)))

                def out(j, masked):
                    val = b.fmul(self.vload(f, srow, j), alpha_v)
                    ptr = b.bitcast(f.at(crow, j), self.vecp)
                    load = (lambda: b.call(mload, [ptr, i32(4), tail, zero])) if masked else \
                        (lambda: b.load(ptr, align=4))
                    store = (lambda v: b.call(mstore, [v, ptr, i32(4), tail])) if masked else \
                        (lambda v: b.store(v, ptr, align=4))
                    with f.if_else(beta0, "sb0") as (then, otherwise):
                        with then:
                            store(val)
                        with otherwise:
                            store(b.call(self.fmuladd, [load(), beta_v, val]))

                with f.loop(0, whole, W, "sov") as j:
                    out(j, False)
                with f.if_(b.icmp_signed("<", whole, n), "sotail"):
                    out(whole, True)
            with f.if_(has_ep, "sep"):  # panels of at most NR columns, as the tiles give them
                with f.loop(0, n, NR, "sepj") as jr:
                    j = b.add(jc, jr)
                    b.call(ep, [g["epctx"], i0, i1, j, b.add(j, f.min(c64(NR), b.sub(n, jr)))])

    # -- a transposed B (each column of B a row of memory): dot products --------------------------
    def dot_cols(self, rows: int) -> int:
        """Columns of C a dot kernel of ``rows`` rows computes at once: ``rows x cols``
        accumulators, at most 16 of 32 vector registers (AVX-512), 8 of 16."""
        budget = 16 if self.W == 16 else 8
        return max(1, min(4, budget // rows))

    def emit_dot_rows(self, name: str, rows: int, cols: int):
        """sdot(K, a, ars, bt, bcs, c, ldc, alpha, beta): C[r, j] = alpha * sum_k a[r*ars + k] *
        bt[j*bcs + k] (+ beta * C[r, j]; beta == 0 does not read C) for r < ``rows``, j < ``cols``,
        C[r, j] at ``c + r * ldc + j``: W k at a time into a vector per (r, j), the last K % W under
        a mask, each vector then summed by halves."""
        W = self.W
        fn = _new_fn(self.mod, name, VOID, [(I64, "K"), (FP, "a"), (I64, "ars"), (FP, "bt"), (I64, "bcs"),
                                           (FP, "c"), (I64, "ldc"), (F32, "alpha"), (F32, "beta")])
        fn.attributes.add("noinline")
        f = _Fn(fn)
        b = f.b
        K, a, ars, bt, bcs, c, ldc, alpha, beta = fn.args
        mload, _ = self.masked_ops()
        zero = ir.Constant(self.vec, [0.0] * W)
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
        accs = [[f.alloca(self.vec, name=f"acc{r}_{j}") for j in range(cols)] for r in range(rows)]
        for row in accs:
            for acc in row:
                b.store(zero, acc)
        arow = [f.at(a, b.mul(c64(r), ars)) for r in range(rows)]
        bcol = [f.at(bt, b.mul(c64(j), bcs)) for j in range(cols)]

        def step(load):
            av = [load(arow[r]) for r in range(rows)]
            bv = [load(bcol[j]) for j in range(cols)]
            for r in range(rows):
                for j in range(cols):
                    b.store(b.call(self.fmuladd, [av[r], bv[j], b.load(accs[r][j])]), accs[r][j])

        whole, tail = self.tail_mask(f, K)
        with f.loop(0, whole, W, "dk") as k:
            step(lambda p: self.vload(f, p, k))
        with f.if_(b.icmp_signed("<", whole, K), "dtail"):
            step(lambda p: b.call(mload, [b.bitcast(f.at(p, whole), self.vecp), i32(4), tail, zero]))
        beta0 = b.fcmp_ordered("==", beta, cf(0.0))
        for r in range(rows):
            for j in range(cols):
                v, n = b.load(accs[r][j]), W
                while n > 1:  # by halves
                    n //= 2
                    lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
                    hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
                    v = b.fadd(lo, hi)
                val = b.fmul(b.extract_element(v, i32(0)), alpha)
                ptr = f.at(c, b.add(b.mul(c64(r), ldc), c64(j)))
                with f.if_else(beta0, f"db{r}_{j}") as (then, otherwise):
                    with then:
                        b.store(val, ptr, align=4)
                    with otherwise:
                        b.store(b.fadd(val, b.fmul(beta, b.load(ptr, align=4))), ptr, align=4)
        b.ret_void()
        return fn

    def emit_dot_task(self, f, g, i0, i1, j0, j1, sdot, has_ep, ep):
        """In a task: C[i0:i1, j0:j1] by dot products (``sdot[rows, cols]``), B transposed in place,
        ``i1 - i0`` rows at most ``cfg.stream_max_m``; the epilogue on each NR-column panel."""
        b, NR = f.b, self.NR
        mr = b.sub(i1, i0)
        a = f.at(g["A"], b.mul(i0, g["ars"]))
        c = f.at(g["C"], b.mul(i0, g["ldc"]))

        def call(rows, cols, j):
            b.call(sdot[rows, cols], [g["K"], a, g["ars"], f.at(g["B"], b.mul(j, g["bcs"])), g["bcs"],
                                      f.at(c, j), g["ldc"], g["alpha"], g["beta"]])

        for rows in range(1, self.cfg.stream_max_m + 1):
            with f.if_(b.icmp_signed("==", mr, c64(rows)), f"d{rows}"):
                cols = self.dot_cols(rows)
                grouped = b.add(j0, b.mul(b.sdiv(b.sub(j1, j0), c64(cols)), c64(cols)))
                with f.loop(j0, grouped, cols, "dj") as j:
                    call(rows, cols, j)
                if cols > 1:
                    with f.loop(grouped, j1, 1, "dj1") as j:
                        call(rows, 1, j)
        with f.if_(has_ep, "dep"):
            with f.loop(j0, j1, NR, "depj") as j:
                b.call(ep, [g["epctx"], i0, i1, j, f.min(b.add(j, c64(NR)), j1)])


__all__ = ["STREAM_COLS", "STREAM_DEPTH", "STREAM_ROW", "StreamEmitter"]
