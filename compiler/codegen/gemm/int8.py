"""The int8 GEMM: uint8 x int8 products summed exactly in int32, for a constant B (weights) packed at
compile time, with the host's best integer dot-product instruction (``Int8Isa``):

* **AVX-512 VNNI** (``vnni``): ``vpdpbusd acc, a, b`` adds, in each 32-bit lane, the four products of
  a's unsigned bytes with b's signed bytes: exact, no 16-bit intermediate.
* **AVX-512 BW** or **AVX2** without VNNI (``madd512``, ``madd256``): ``vpmaddwd`` of 16-bit values
  (B packed as int16 pairs at compile time, A's two bytes widened per step), each 32-bit lane the sum
  of two exact products. The AVX2 idiom ``vpmaddubsw`` multiplies bytes directly but sums each pair
  into a *saturating* int16: 2 x 255 x 127 = 64770 does not fit, so it needs 7-bit weights (one bit
  of weight precision lost: ONNX Runtime's "reduce_range"). Widening to int16 first costs the same
  number of multiply instructions per 4 k (two ``vpmaddwd`` instead of ``vpmaddubsw`` + ``vpmaddwd``
  against ones) and twice B's bytes, and keeps all 8 bits of the weights and the sums exact: the
  same bits as the VNNI path and the portable loop.

Any operand types are brought to that form and the difference paid back exactly:

* a signed A is read with its sign bit flipped (``a' = a + 128``, an ``xor`` per 4 bytes),
* an unsigned B is packed less 128 (``b' = b - 128``),
* so that ``sum (a - za)(b - zb) = sum a'b' - za' colsum(b') - zb' rowsum(a') + K za' zb'`` with
  ``za' = za + 128 [signed A]`` and ``zb' = zb - 128 [unsigned B]``. ``colsum(b')`` is packed with B;
  ``rowsum(a')`` is summed in the kernel (one more dot product per row and word, against a vector of
  ones) only where some ``zb'`` is not 0 (symmetric int8 weights: never).

The packed B (``pack_b``): panels of ``NR = lanes * NV`` columns; in a panel, for each word of ``KPW``
k (4 bytes for VNNI, 2 int16 for ``vpmaddwd``), ``NR`` words (the column's ``KPW`` k). The register
tile is ``MR`` rows x ``NV`` vectors; each word of k loads ``NV`` vectors of B, broadcasts one word
of each row of A, and issues ``MR * NV`` dot products.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


@dataclass(frozen=True)
class Int8Isa:
    """An integer dot-product instruction set: its name, 32-bit lanes per vector, k per 32-bit word
    of packed B, its registers and the LLVM intrinsic."""

    name: str
    lanes: int
    kpw: int
    registers: int
    intrinsic: str
    describe: str

    @property
    def vec(self) -> ir.VectorType:
        return ir.VectorType(I32, self.lanes)


#: chunks per thread of the parallel loops of the int8 kernels (the tiles, a convolution's packing of
#: its input, the int8 depthwise layers; ``kiln_parallel_for_chunks``), where other loops take 4: the
#: finer chunks let a thread that runs faster take more of them. Measured on an AMD EPYC (Zen 4, VNNI),
#: 2 threads, 8 against 4 for every loop of every kernel (``ab.py``, interleaved): int8 ResNet-50
#: 0.970-0.982x, int8 MobileNetV2 0.969x, while float MobileNetV2 1.024-1.037x and ShuffleNet 1.022x
#: (their depthwise layers): so only the int8 kernels take them
INT8_CHUNKS_PER_THREAD = 8

VNNI = Int8Isa("vnni", 16, 4, 32, "llvm.x86.avx512.vpdpbusd.512", "VNNI int8 tiles (vpdpbusd, 512-bit)")
MADD512 = Int8Isa("madd512", 16, 2, 32, "llvm.x86.avx512.pmaddw.d.512", "int8 tiles (vpmaddwd, 512-bit)")
MADD256 = Int8Isa("madd256", 8, 2, 16, "llvm.x86.avx2.pmadd.wd", "int8 tiles (vpmaddwd, 256-bit)")


def isa_for(target) -> Int8Isa | None:
    """The best instruction set of ``target`` (a ``Target``) for the tiles; None: none (the portable
    loop runs)."""
    if target.has("avx512vnni") and target.has("avx512bw"):
        return VNNI
    if target.has("avx512bw"):
        return MADD512
    if target.has("avx2"):
        return MADD256
    return None


@dataclass(frozen=True)
class Int8Tiling:
    """The register tile: ``MR`` rows of A by ``NV`` vectors (``NR = lanes * NV`` columns) of B."""

    MR: int
    NV: int
    isa: Int8Isa = VNNI

    @property
    def NR(self) -> int:
        return self.isa.lanes * self.NV

    @property
    def KPW(self) -> int:
        return self.isa.kpw

    @staticmethod
    def for_shape(m: int, n: int, isa: Int8Isa = VNNI, narrow_last: bool = False) -> "Int8Tiling":
        """The tile for an ``m`` x ``n`` product that computes the fewest padded sums: the rows round
        up to whole tiles of ``MR``, the columns to whole panels of ``NR`` (``narrow_last``: the
        caller computes its last panel with as few vectors as its columns need, so they round up to
        whole vectors), each sum weighted by the tile's loads per dot product (``TILE_LOAD_COST``).
        Candidates: up to 4 vectors by up to 8 rows, their accumulators at most three quarters of the
        registers (the rest hold the B vectors and a broadcast). That cost was measured with VNNI; the
        ``vpmaddwd`` tiles (each broadcast word also widened) keep the rule they were tuned with: as
        many vectors as N needs (at most 4; 2 with 16 registers), then as many rows as fit (at most
        8; 6)."""
        wide = isa.registers >= 32
        acc, lanes = isa.registers * 3 // 4, isa.lanes
        m, n = max(1, m), max(1, n)
        if isa.name != VNNI.name:
            nv = min(4 if wide else 2, -(-n // lanes))
            return Int8Tiling(MR=min(m, acc // nv, 8 if wide else 6), NV=nv, isa=isa)

        def cost(t: "Int8Tiling"):
            rows = -(-m // t.MR) * t.MR
            cols = -(-n // lanes) * lanes if narrow_last else -(-n // t.NR) * t.NR
            # ties: the bigger tile (fewer loads and tile loops)
            return rows * cols * (1 + TILE_LOAD_COST * (t.MR + t.NV) / (t.MR * t.NV)), -t.MR * t.NV
        fits = [Int8Tiling(MR=mr, NV=nv, isa=isa) for nv in range(1, min(4, -(-n // lanes)) + 1)
                for mr in range(1, min(m, 8) + 1) if mr * nv <= acc]
        return min(fits, key=cost)


#: the cost of a tile's loads (B vectors and broadcast words, ``MR + NV`` per word of k) against its
#: ``MR * NV`` dot products, in ``Int8Tiling.for_shape``: fitted to single int8 convolutions of
#: int8 ResNet-50 on an AMD EPYC (Zen 4, VNNI), one thread, where the fewest padded sums won (the 7x7
#: layers, 49 pixels as rows: 5 x 4 tiles (50 rows) against 6 x 4 (54) 0.94x, 7 x 3 (49 rows, 528
#: of 512 columns) 0.95x, 8 x 3 1.05x; the 3x3 layers on 28x28, 128 channels as rows: 8 x 3 against
#: 6 x 4 0.97x; 1024 -> 256 on 14x14: all four within 1%)
TILE_LOAD_COST = 0.3


@dataclass(frozen=True)
class PackedB:
    """B packed for the tiles, with what the zero-point correction needs."""

    words: np.ndarray    # int32 [panels, ceil(K / KPW), NR]: KPW signed values of b' per word (k in order)
    colsum: np.ndarray   # int32 [panels * NR]: sum over k of b' (0 past N)
    zb: np.ndarray       # int32 [panels * NR]: zb' per column (0 past N)
    K: int
    N: int

    @property
    def needs_rowsum(self) -> bool:
        return bool(np.any(self.zb != 0))


def pack_b(b: np.ndarray, zero_point: np.ndarray | int, tiling: Int8Tiling) -> PackedB:
    """Pack a constant ``[K, N]`` int8/uint8 B (its zero point per tensor or per column) for
    ``tiling``: signed bytes (VNNI) or signed 16-bit values (``vpmaddwd``)."""
    K, N = b.shape
    shift = 128 if b.dtype == np.uint8 else 0
    bp = b.astype(np.int32) - shift  # in [-128, 127]
    NR, kpw = tiling.NR, tiling.KPW
    panels, KW = max(1, math.ceil(N / NR)), math.ceil(K / kpw)
    element = np.int8 if kpw == 4 else np.int16
    full = np.zeros((KW * kpw, panels * NR), element)
    full[:K, :N] = bp.astype(element)
    # [KW, kpw, panels, NR] -> [panels, KW, NR, kpw]: each word holds one column's kpw k
    words = full.reshape(KW, kpw, panels, NR).transpose(2, 0, 3, 1).copy().view(np.int32).reshape(panels, KW, NR)
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
        isa = tiling.isa
        self.vec = vec = isa.vec
        halves = ir.VectorType(I16, 2 * isa.lanes)
        args = [vec, vec, vec] if isa is VNNI else [halves, halves]
        fn = module.globals.get(isa.intrinsic)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(vec, args), isa.intrinsic)
        self.fn, self.halves = fn, halves

    def dot(self, b: ir.IRBuilder, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
        """``acc`` plus, in each lane, the dot product of a word of A with a word of B."""
        if self.t.isa is VNNI:
            return b.call(self.fn, [acc, a, w])
        return b.add(acc, b.call(self.fn, [b.bitcast(a, self.halves), b.bitcast(w, self.halves)]))

    def splat(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        lanes = self.t.isa.lanes
        v = b.insert_element(ir.Constant(self.vec, ir.Undefined), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(self.vec, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes),
                                                                                    [0] * lanes))

    def _a_vectors(self, b: ir.IRBuilder, w: ir.Value, subs: int) -> list[ir.Value]:
        """A 32-bit word of A (4 bytes of k) as the dot products read it: broadcast (VNNI), or
        broadcast and each half's two bytes widened to 16 bits (``vpmaddwd``: ``subs`` halves)."""
        sp = self.splat(b, w)
        if self.t.KPW == 4:
            return [sp]
        n = 4 * self.t.isa.lanes
        bytes_ = ir.VectorType(I8, n)
        v = b.bitcast(sp, bytes_)
        zero = ir.Constant(bytes_, [0] * n)
        out = []
        for half in range(subs):  # bytes (2 half, 2 half + 1) of each lane's word, each followed by a 0
            mask = [4 * (j // 4) + 2 * half + (j % 4) // 2 if j % 2 == 0 else n for j in range(n)]
            out.append(b.bitcast(b.shuffle_vector(v, zero, ir.Constant(ir.VectorType(I32, n), mask)), self.vec))
        return out

    def tile(self, f, rows: list[ir.Value], k: int, a_signed: bool, words: ir.Value, rowsum: bool,
             colsum: bool = False, word_stride: int | None = None, swap: bool = False, start=None):
        """The sums of ``rows`` (byte pointers to rows of A) against the panel at ``words`` (pointer
        to its first word; the words of one k ``word_stride`` words apart, ``NR`` by default: a
        packed panel). Returns (accumulators [row][vector], rowsums [row] or None, and with
        ``colsum`` the sums of each column of the panel [vector], else None). ``f`` is the function
        helper (``f.b`` the builder, ``f.loop``).

        The loop steps over 4 k: one 32-bit word of each row of A, and ``4 / KPW`` words of B per
        column (one for VNNI; two for ``vpmaddwd``, k 0-1 and k 2-3).

        With ``swap`` (VNNI only) the dot products read B's bytes as the unsigned operand and A's
        (broadcast) as the signed one: for a product whose unsigned values (activations) are B's.
        ``rowsum`` is not available then (A is constant: its row sums are known when compiling).

        ``start``: the (accumulators, rowsums, colsums) of an earlier ``tile`` to go on from (another
        slice of k: a convolution's next tap), so that the sums stay in registers from one loop to the
        next; default: zeros."""
        b = f.b
        t = self.t
        lanes, kpw = t.isa.lanes, t.KPW
        ws_ = word_stride or t.NR
        assert not swap or (kpw == 4 and not rowsum), "swapped operands: VNNI, no row sums"
        per = 4 // kpw  # words of B per 4 k
        vec = self.vec
        k4 = k // 4
        zero = ir.Constant(vec, [0] * lanes)
        ones = ir.Constant(vec, [0x01010101 if kpw == 4 else 0x00010001] * lanes)
        n_acc = len(rows) * t.NV

        def step(wp, accs, words_of_row, subs):
            bv = [[b.load(b.bitcast(b.gep(wp, [ir.Constant(I64, (s * ws_) + v * lanes)], inbounds=True,
                                          source_etype=I32), vec.as_pointer()), typ=vec, align=4)
                   for v in range(t.NV)] for s in range(subs)]
            out = list(accs)
            if colsum:  # each column's b' summed: a dot product with ones for A
                base = n_acc + (len(rows) if rowsum else 0)
                for s in range(subs):
                    for v in range(t.NV):
                        out[base + v] = self.dot(b, out[base + v], *((bv[s][v], ones) if swap else (ones, bv[s][v])))
            for r, w in enumerate(words_of_row):
                for s, sp in enumerate(self._a_vectors(b, w, subs)):
                    for v in range(t.NV):
                        out[r * t.NV + v] = self.dot(b, out[r * t.NV + v], *((bv[s][v], sp) if swap else (sp, bv[s][v])))
                    if rowsum:
                        out[n_acc + r] = self.dot(b, out[n_acc + r], sp, ones)
            return out

        n_init = n_acc + (len(rows) if rowsum else 0) + (t.NV if colsum else 0)
        init = [zero] * n_init
        if start is not None:
            grid0, rowsums0, colsums0 = start
            init = [v for row in grid0 for v in row] + list(rowsums0 or []) + list(colsums0 or [])
            assert len(init) == n_init, "start: sums of another tile shape"
        # the main loop over whole words of 4 k: phis for the accumulators
        pre = b.block
        head, body, end = (f.fn.append_basic_block(x) for x in ("i8.head", "i8.body", "i8.end"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, "k4")
        accs = [b.phi(vec, f"acc{j}") for j in range(len(init))]
        i.add_incoming(ir.Constant(I64, 0), pre)
        for phi, v in zip(accs, init):
            phi.add_incoming(v, pre)
        b.cbranch(b.icmp_signed("<", i, ir.Constant(I64, k4)), body, end)
        b.position_at_end(body)
        wp = b.gep(words, [b.mul(i, ir.Constant(I64, per * ws_))], inbounds=True, source_etype=I32)
        flip = ir.Constant(I32, 0x80808080 - (1 << 32))
        ws = []
        for row in rows:
            at = b.gep(row, [b.mul(i, ir.Constant(I64, 4))], inbounds=True, source_etype=I8)
            w = b.load(b.bitcast(at, I32.as_pointer()), typ=I32, align=1)
            ws.append(b.xor(w, flip) if a_signed else w)
        new = step(wp, accs, ws, per)
        i2 = b.add(i, ir.Constant(I64, 1))
        i.add_incoming(i2, b.block)
        for phi, v in zip(accs, new):
            phi.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(end)
        accs = list(accs)
        if k % 4:  # the last word: its bytes one by one (reading past A's row could leave the buffer)
            wp = b.gep(words, [ir.Constant(I64, k4 * per * ws_)], inbounds=True, source_etype=I32)
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
            accs = step(wp, accs, ws, -(-(k % 4) // kpw))  # only the words of B that exist
        grid = [[accs[r * t.NV + v] for v in range(t.NV)] for r in range(len(rows))]
        after = n_acc + (len(rows) if rowsum else 0)
        return grid, (accs[n_acc:after] if rowsum else None), (accs[after:] if colsum else None)


__all__ = ["INT8_CHUNKS_PER_THREAD", "Int8Emitter", "Int8Isa", "Int8Tiling", "MADD256", "MADD512", "PackedB", "VNNI",
           "isa_for", "pack_b"]
