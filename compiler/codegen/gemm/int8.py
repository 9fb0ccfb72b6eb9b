"""The int8 GEMM: uint8 x int8 products summed in int32 with AVX-512 VNNI (``vpdpbusd``), for a
constant B (weights) packed at compile time.

``vpdpbusd acc, a, b`` adds, in each 32-bit lane, the four products of a's unsigned bytes with b's
signed bytes: exact (no 16-bit intermediate, so no saturation: the pair-summing ``vpmaddubsw`` of
AVX2 saturates at 32767 and needs 7-bit weights; VNNI does not). Any operand types are brought to
that form and the difference paid back exactly:

* a signed A is read with its sign bit flipped (``a' = a + 128``, an ``xor`` per 4 bytes),
* an unsigned B is packed less 128 (``b' = b - 128``),
* so that ``sum (a - za)(b - zb) = sum a'b' - za' colsum(b') - zb' rowsum(a') + K za' zb'`` with
  ``za' = za + 128 [signed A]`` and ``zb' = zb - 128 [unsigned B]``. ``colsum(b')`` is packed with B;
  ``rowsum(a')`` is summed in the kernel (one more ``vpdpbusd`` per row and 4 k, against a vector of
  ones) only where some ``zb'`` is not 0 (symmetric int8 weights: never).

The packed B (``pack_b``): panels of ``NR = 16 * NV`` columns; in a panel, for each group of 4 k,
``NR`` words of 4 bytes (the column's 4 k). The register tile is ``MR`` rows x ``NV`` vectors; each 4 k
loads ``NV`` vectors of B, broadcasts 4 bytes of each row of A, and issues ``MR * NV`` ``vpdpbusd``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

LANES = 16  # i32 lanes of a 512-bit register
I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
VEC = ir.VectorType(I32, LANES)


@dataclass(frozen=True)
class Int8Tiling:
    """The register tile: ``MR`` rows of A by ``NV`` vectors (``NR = 16 * NV`` columns) of B."""

    MR: int
    NV: int

    @property
    def NR(self) -> int:
        return LANES * self.NV

    @staticmethod
    def for_shape(m: int, n: int) -> "Int8Tiling":
        """``NV`` vectors enough for N (at most 4), then as many rows as 24 accumulators allow (at
        most 8, at most M): 32 zmm registers hold the accumulators, the B vectors and a broadcast."""
        nv = max(1, min(4, math.ceil(n / LANES)))
        return Int8Tiling(MR=max(1, min(m, 24 // nv, 8)), NV=nv)


@dataclass(frozen=True)
class PackedB:
    """B packed for ``vpdpbusd``, with what the zero-point correction needs."""

    words: np.ndarray    # int32 [panels, ceil(K / 4), NR]: 4 signed bytes of b' per word (k in order)
    colsum: np.ndarray   # int32 [panels * NR]: sum over k of b' (0 past N)
    zb: np.ndarray       # int32 [panels * NR]: zb' per column (0 past N)
    K: int
    N: int

    @property
    def needs_rowsum(self) -> bool:
        return bool(np.any(self.zb != 0))


def pack_b(b: np.ndarray, zero_point: np.ndarray | int, tiling: Int8Tiling) -> PackedB:
    """Pack a constant ``[K, N]`` int8/uint8 B (its zero point per tensor or per column) for
    ``tiling``."""
    K, N = b.shape
    shift = 128 if b.dtype == np.uint8 else 0
    bp = b.astype(np.int32) - shift  # in [-128, 127]
    NR = tiling.NR
    panels, K4 = max(1, math.ceil(N / NR)), math.ceil(K / 4)
    full = np.zeros((K4 * 4, panels * NR), np.int8)
    full[:K, :N] = bp.astype(np.int8)
    # [K4, 4, panels, NR] -> [panels, K4, NR, 4]: each word's 4 bytes are one column's 4 k
    words = full.reshape(K4, 4, panels, NR).transpose(2, 0, 3, 1).copy().view(np.int32).reshape(panels, K4, NR)
    colsum = np.zeros(panels * NR, np.int32)
    colsum[:N] = bp.sum(axis=0, dtype=np.int64).astype(np.int32)
    zb = np.zeros(panels * NR, np.int32)
    zb[:N] = np.broadcast_to(np.asarray(zero_point, np.int32).reshape(-1), (N,)) - shift
    return PackedB(words, colsum, zb, K, N)


class Int8Emitter:
    """Emits the tile loop of one task inside a kernel: the caller gives the builder, the pointers
    and the tile's place; ``tile`` returns the ``MR`` rows of corrected int32 sums as vectors."""

    def __init__(self, module: ir.Module, tiling: Int8Tiling):
        self.t = tiling
        name = "llvm.x86.avx512.vpdpbusd.512"
        fn = module.globals.get(name)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(VEC, [VEC, VEC, VEC]), name)
        self.dpbusd = fn

    def splat(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        v = b.insert_element(ir.Constant(VEC, ir.Undefined), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(VEC, ir.Undefined), ir.Constant(VEC, [0] * LANES))

    def tile(self, f, rows: list[ir.Value], k: int, a_signed: bool, words: ir.Value, rowsum: bool):
        """The sums of ``rows`` (byte pointers to rows of A) against the panel at ``words`` (pointer
        to its first word). Returns (accumulators [row][vector], rowsums [row] or None). ``f`` is the
        function helper (``f.b`` the builder, ``f.loop``)."""
        b = f.b
        t = self.t
        k4 = k // 4
        zero = ir.Constant(VEC, [0] * LANES)
        ones = ir.Constant(VEC, [0x01010101] * LANES)
        flip = ir.Constant(I32, 0x80808080 - (1 << 32))
        n_acc = len(rows) * t.NV

        def step(wp, accs, words_of_row):
            bv = [b.load(b.bitcast(b.gep(wp, [ir.Constant(I64, v * LANES)], inbounds=True, source_etype=I32),
                                   VEC.as_pointer()), typ=VEC, align=4) for v in range(t.NV)]
            out = list(accs)
            for r, w in enumerate(words_of_row):
                sp = self.splat(b, w)
                for v in range(t.NV):
                    out[r * t.NV + v] = b.call(self.dpbusd, [out[r * t.NV + v], sp, bv[v]])
                if rowsum:
                    out[n_acc + r] = b.call(self.dpbusd, [out[n_acc + r], sp, ones])
            return out

        init = [zero] * (n_acc + (len(rows) if rowsum else 0))
        # the main loop over whole words of 4 k: phis for the accumulators
        pre = b.block
        head, body, end = (f.fn.append_basic_block(x) for x in ("i8.head", "i8.body", "i8.end"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, "k4")
        accs = [b.phi(VEC, f"acc{j}") for j in range(len(init))]
        i.add_incoming(ir.Constant(I64, 0), pre)
        for phi, v in zip(accs, init):
            phi.add_incoming(v, pre)
        b.cbranch(b.icmp_signed("<", i, ir.Constant(I64, k4)), body, end)
        b.position_at_end(body)
        wp = b.gep(words, [b.mul(i, ir.Constant(I64, t.NR))], inbounds=True, source_etype=I32)
        ws = []
        for row in rows:
            w = b.load(b.bitcast(b.gep(row, [b.mul(i, ir.Constant(I64, 4))], inbounds=True, source_etype=I8),
                                 I32.as_pointer()), typ=I32, align=1)
            ws.append(b.xor(w, flip) if a_signed else w)
        new = step(wp, accs, ws)
        i2 = b.add(i, ir.Constant(I64, 1))
        i.add_incoming(i2, b.block)
        for phi, v in zip(accs, new):
            phi.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(end)
        accs = list(accs)
        if k % 4:  # the last word: its bytes one by one (reading past A's row could leave the buffer)
            wp = b.gep(words, [ir.Constant(I64, k4 * t.NR)], inbounds=True, source_etype=I32)
            ws = []
            for row in rows:
                w = ir.Constant(I32, 0)
                for j in range(k % 4):
                    byte = b.load(b.gep(row, [ir.Constant(I64, 4 * k4 + j)], inbounds=True, source_etype=I8), typ=I8)
                    v = b.zext(byte, I32)
                    if a_signed:
                        v = b.xor(v, ir.Constant(I32, 0x80))
                    w = b.or_(w, b.shl(v, ir.Constant(I32, 8 * j)) if j else v)
                ws.append(w)
            accs = step(wp, accs, ws)
        grid = [[accs[r * t.NV + v] for v in range(t.NV)] for r in range(len(rows))]
        return grid, (accs[n_acc:] if rowsum else None)


__all__ = ["Int8Emitter", "Int8Tiling", "LANES", "PackedB", "pack_b"]
