"""Packing of the GEMM's operands: A into ``MR``-row panels, B into ``NR``-column panels (zero
padding), in the emitted code (``PackEmitter``, a mixin of the GEMM emitter in ``kernel.py``, which
provides ``mod``, ``cfg``, ``p``, ``W``, ``MR``, ``NV``, ``NR``, ``vec``, ``vecp`` and the vector
helpers of ``irbuild.VectorOps``) and in NumPy (``pack_a_numpy``, ``pack_b_numpy``: constant
weights packed at compile time). The layouts are ``kernel.py``'s "Packed layouts".
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from .config import GemmConfig
from .irbuild import FP, I32, I64, VOID, _Fn, _new_fn, c64, cf


class PackEmitter:
    def emit_pack_a(self, name):
        """pack_a(A, ars, acs, i0, mc, p0, kc, dst): MR-row panels of A[i0:i0+mc, p0:p0+kc]."""
        MR = self.MR
        fn = _new_fn(self.mod, name, VOID, [(FP, "A"), (I64, "ars"), (I64, "acs"), (I64, "i0"),
                                           (I64, "mc"), (I64, "p0"), (I64, "kc"), (FP, "dst")])
        f = _Fn(fn)
        b = f.b
        Ap, ars, acs, i0, mc, p0, kc, dst = fn.args
        with f.loop(0, mc, MR, "ii") as ii:
            rows = f.min(c64(MR), b.sub(mc, ii))
            d = f.at(dst, b.mul(b.sdiv(ii, c64(MR)), b.mul(kc, c64(MR))))
            # row pointers (clamped to the last valid row; padding rows get zeros by select)
            rowp = []
            for r in range(MR):
                rr = f.min(c64(r), b.sub(rows, c64(1)))
                rowp.append(f.at(Ap, b.mul(b.add(b.add(i0, ii), rr), ars)))
            # rows along k: the first kv k-steps W at a time, transposed in registers (_pack_a_rows)
            vectors = MR <= self.W
            kv = (b.select(b.icmp_signed("==", acs, c64(1)), b.mul(b.sdiv(kc, c64(self.W)), c64(self.W)), c64(0))
                  if vectors else c64(0))
            with f.if_else(b.icmp_signed("==", rows, c64(MR)), "afull") as (then, otherwise):
                with then:
                    if vectors:
                        self._pack_a_rows(f, rowp, p0, kv, d)
                    with f.loop(kv, kc, 1, "p") as p:
                        col = b.mul(b.add(p0, p), acs)
                        for r in range(MR):
                            b.store(b.load(f.at(rowp[r], col), align=4),
                                    f.at(d, b.add(b.mul(p, c64(MR)), c64(r))), align=4)
                with otherwise:
                    if vectors:  # the rows past the last zeros (a batch-1 product's one row)
                        self._pack_a_rows(f, rowp, p0, kv, d, rows)
                    with f.loop(kv, kc, 1, "p") as p:
                        col = b.mul(b.add(p0, p), acs)
                        for r in range(MR):
                            v = b.load(f.at(rowp[r], col), align=4)
                            v = b.select(b.icmp_signed("<", c64(r), rows), v, cf(0.0))
                            b.store(v, f.at(d, b.add(b.mul(p, c64(MR)), c64(r))), align=4)
        b.ret_void()
        return fn

    def emit_pack_b(self, name):
        """pack_b(B, brs, bcs, p0, kc, j0, nc, dst): NR-column panels of B[p0:p0+kc, j0:j0+nc]."""
        W, NV, NR = self.W, self.NV, self.NR
        fn = _new_fn(self.mod, name, VOID, [(FP, "B"), (I64, "brs"), (I64, "bcs"), (I64, "p0"),
                                           (I64, "kc"), (I64, "j0"), (I64, "nc"), (FP, "dst")])
        f = _Fn(fn)
        b = f.b
        Bp, brs, bcs, p0, kc, j0, nc, dst = fn.args
        nfull = b.mul(b.sdiv(nc, c64(NR)), c64(NR))
        rowmajor = b.icmp_signed("==", bcs, c64(1))
        with f.if_(rowmajor, "rows"):
            # row-major B, full panels: walk B row by row (sequential reads; one NR-wide piece
            # to each panel) rather than panel by panel (strided reads that re-fetch lines)
            panel = b.mul(kc, c64(NR))
            with f.loop(0, kc, 1, "p") as p:
                row = f.at(Bp, b.add(b.mul(b.add(p0, p), brs), j0))
                drow = f.at(dst, b.mul(p, c64(NR)))
                with f.loop(0, nfull, NR, "jj") as jj:
                    dp = f.at(drow, b.mul(b.sdiv(jj, c64(NR)), panel))
                    for v in range(NV):
                        self.vstore(f, self.vload(f, row, b.add(jj, c64(v * W))), dp, v * W)
        with f.loop(b.select(rowmajor, nfull, c64(0)), nc, NR, "jj") as jj:
            cols = f.min(c64(NR), b.sub(nc, jj))
            d = f.at(dst, b.mul(b.sdiv(jj, c64(NR)), b.mul(kc, c64(NR))))
            j = b.add(j0, jj)
            tr_ok = b.and_(b.icmp_signed("==", cols, c64(NR)), b.icmp_signed("==", brs, c64(1)))
            with f.if_else(tr_ok, "btr") as (t2, o2):
                with t2:  # transposed B (k contiguous): W x W register transposes
                    self._pack_b_transposed(f, Bp, bcs, p0, kc, j, d)
                with o2:  # edge panel / general strides: scalar, zero padding
                    colp = []
                    for cc in range(NR):
                        ci = f.min(c64(cc), b.sub(cols, c64(1)))
                        colp.append(f.at(Bp, b.mul(b.add(j, ci), bcs)))
                    with f.loop(0, kc, 1, "p") as p:
                        roff = b.mul(b.add(p0, p), brs)
                        drow = f.at(d, b.mul(p, c64(NR)))
                        for cc in range(NR):
                            v = b.load(f.at(colp[cc], roff), align=4)
                            v = b.select(b.icmp_signed("<", c64(cc), cols), v, cf(0.0))
                            b.store(v, f.at(drow, cc), align=4)
        b.ret_void()
        return fn

    def _pack_a_rows(self, f, rowp, p0, kv, d, rows=None):
        """An MR-row panel's first ``kv`` k-steps (a multiple of W; A's rows contiguous along k):
        W k-steps of each row loaded as one vector, the MR vectors (and W - MR of zeros) transposed
        with shuffles, and each k-step's MR values stored with a masked store (BERT's 128x1024
        activations: 1.6 -> about 0.3 cycles a value). ``rows`` (an i64 value): a partial panel,
        its rows from ``rows`` on zeros (their pointers are clamped to a valid row)."""
        W, MR = self.W, self.MR
        b = f.b
        _, mstore = self.masked_ops()
        mask = ir.Constant(ir.VectorType(ir.IntType(1), W), [1] * MR + [0] * (W - MR))
        zero = ir.Constant(self.vec, [0.0] * W)
        with f.loop(0, kv, W, "pv") as p:
            k0 = b.add(p0, p)
            vecs = [self.vload(f, rowp[r], k0) for r in range(MR)]
            if rows is not None:
                vecs = [v if r == 0 else b.select(b.icmp_signed("<", c64(r), rows), v, zero) for r, v in enumerate(vecs)]
            cols = self._transpose(b, vecs + [zero] * (W - MR))
            for q in range(W):
                ptr = b.bitcast(f.at(d, b.mul(b.add(p, c64(q)), c64(MR))), self.vecp)
                b.call(mstore, [cols[q], ptr, ir.Constant(I32, 4), mask])

    def _transpose(self, b, rows):
        """Transpose a W x W block held as W vectors (rows[i][j] -> out[j][i]) with shuffles.

        Recursive block transpose: [[P, Q], [R, S]] -> [[P', R'], [Q', S']]. At block size h
        (W/2, W/4, ..., 1) rows i and i+h (i in an even h-block) swap their off-diagonal h-blocks,
        for all column blocks at once: two two-input shuffles per pair of vectors.
        """
        W = self.W
        cur = list(rows)
        mask_ty = ir.VectorType(I32, W)
        h = W // 2
        while h >= 1:
            lo = ir.Constant(mask_ty, [j if (j // h) % 2 == 0 else W + j - h for j in range(W)])
            hi = ir.Constant(mask_ty, [j + h if (j // h) % 2 == 0 else W + j for j in range(W)])
            nxt = list(cur)
            for i in range(W):
                if (i // h) % 2 == 0:
                    nxt[i] = b.shuffle_vector(cur[i], cur[i + h], lo)
                    nxt[i + h] = b.shuffle_vector(cur[i], cur[i + h], hi)
            cur = nxt
            h //= 2
        return cur

    def _pack_b_transposed(self, f, Bp, bcs, p0, kc, j, d):
        """Full NR panel of a transposed B (element (p, col) at B[col*bcs + p]) into d."""
        W, NV, NR = self.W, self.NV, self.NR
        b = f.b
        colrow = [f.at(Bp, b.mul(b.add(j, c64(cc)), bcs)) for cc in range(NR)]
        kmain = b.mul(b.sdiv(kc, c64(W)), c64(W))
        with f.loop(0, kmain, W, "pt") as p:
            off = b.add(p0, p)
            for v in range(NV):
                rows = [self.vload(f, colrow[v * W + i], off) for i in range(W)]  # rows: columns of B
                cols = self._transpose(b, rows)  # cols[q] = B[p+q, j+v*W : j+v*W+W]
                for q in range(W):
                    self.vstore(f, cols[q], d, b.add(b.mul(b.add(p, c64(q)), c64(NR)), c64(v * W)))
        with f.loop(kmain, kc, 1, "pr") as p:
            off = b.add(p0, p)
            drow = f.at(d, b.mul(p, c64(NR)))
            for cc in range(NR):
                b.store(b.load(f.at(colrow[cc], off), align=4), f.at(drow, cc), align=4)

    def emit_pack_api(self, pack_a, pack_b):
        MR, NR, p = self.MR, self.NR, self.p
        for which, R in (("a", MR), ("b", NR)):
            fn = _new_fn(self.mod, f"{p}_packed_{which}_size", I64,
                         [(I64, "M" if which == "a" else "K"), (I64, "K" if which == "a" else "N")],
                         internal=False)
            f = _Fn(fn)
            rows, depth = (fn.args[0], fn.args[1]) if which == "a" else (fn.args[1], fn.args[0])
            f.b.ret(f.b.mul(f.roundup(rows, R), depth))
        # pack_a(ta, M, K, A, lda, Ap) and pack_b(tb, K, N, B, ldb, Bp): the whole operand, from
        # its rows (t = 0) or columns (t = 1) as the first argument says
        for which, pack, dims in (("a", pack_a, ("M", "K")), ("b", pack_b, ("K", "N"))):
            X = which.upper()
            fn = _new_fn(self.mod, f"{p}_pack_{which}", VOID, [(I32, f"t{which}"), (I64, dims[0]), (I64, dims[1]),
                                                               (FP, X), (I64, f"ld{which}"), (FP, f"{X}p")],
                         internal=False)
            f = _Fn(fn)
            tr, rows, cols, src, ld, dst = fn.args
            t = f.b.icmp_signed("==", tr, ir.Constant(I32, 1))
            f.b.call(pack, [src, f.b.select(t, c64(1), ld), f.b.select(t, ld, c64(1)), c64(0), rows,
                            c64(0), cols, dst])
            f.b.ret_void()


# ----------------------------------------------------------------------------------------------
# packed layouts in NumPy (for packing constant weights at compile time)


def pack_a_numpy(a: np.ndarray, cfg: GemmConfig) -> np.ndarray:
    """A (M, K) -> the packed-A buffer (1-D float32) that ``ta = 2`` expects."""
    m, k = a.shape
    mp = -(-m // cfg.MR) * cfg.MR
    pad = np.zeros((mp, k), np.float32)
    pad[:m] = a
    return np.ascontiguousarray(pad.reshape(mp // cfg.MR, cfg.MR, k).transpose(0, 2, 1)).ravel()


def pack_b_numpy(b: np.ndarray, cfg: GemmConfig) -> np.ndarray:
    """B (K, N) -> the packed-B buffer (1-D float32) that ``tb = 2`` expects."""
    k, n = b.shape
    npd = -(-n // cfg.NR) * cfg.NR
    pad = np.zeros((k, npd), np.float32)
    pad[:, :n] = b
    return np.ascontiguousarray(pad.reshape(k, npd // cfg.NR, cfg.NR).transpose(1, 0, 2)).ravel()
