"""3x3 stride-1 convolutions by Winograd's minimal filtering F(4x4, 3x3) (Lavin & Gray, 2016).

Each 4x4 block of output pixels (a *tile*) of a channel is computed from the 6x6 input window
around it: with the constant matrices ``BT`` (6x6), ``G`` (6x3) and ``AT`` (4x6) below,

    U[k, c] = G  w[k, c]  G^T            (6x6, the weights: at compile time)
    V[c, t] = BT d[c, t]  BT^T           (6x6, tile t's window of channel c: the input transform)
    M[k, t] = sum_c U[k, c] * V[c, t]    (elementwise in the 6x6: 36 GEMMs ``M_e = U_e @ V_e``)
    Y[k, t] = AT M[k, t] AT^T            (4x4 outputs: the output transform)

36 multiplies per 16 outputs and input channel instead of 144: the GEMMs do a quarter of the
im2col GEMM's arithmetic; the transforms add memory passes (V and M, each 36 floats per tile and
channel). Where that pays is measured (``TIERS``): maps of many tiles and enough channels (ResNet's
56x56, 28x28 and 14x14 stages: 0.50-0.66 ms against 1.2-1.4 for the im2col GEMM on 2 threads). On
few tiles (a 7x7 map has 4) the GEMMs' register tiles are mostly padding and the weights, 4x the
3x3 ones, are streamed for little work: the im2col GEMM stays.

The images' tiles are the columns of one set of GEMMs; a batch whose V and M would pass
``BLOCK_BUDGET`` is done by blocks of images (each block's code emitted on its own: a parallel task
sees only its index range). For each block:

1. **input transform** (channels split among the threads): each channel is copied into a zero-padded
   plane of the thread's own (``6 + 4 * (tiles - 1)`` rows and columns, plus a margin), then for each
   row of tiles and each run of ``LANES`` tiles, the 36 values of ``V`` for those tiles are computed
   as vectors of ``LANES`` lanes, one tile per lane: the window's rows are loaded as two wide vectors
   and split by column (shuffles), ``BT`` is applied down the rows and across the columns with its
   zero coefficients skipped, and each of the 36 results is one vector store into ``V[e, c, t]``.
2. **36 GEMMs** ``M_e[K, T] = U_e[K, C] @ V_e[C, T]`` (``U`` packed for sgemm at compile time), run as
   parallel tasks, one thread each (``gemm_loop``).
3. **output transform** (output channels split among the threads): ``AT`` on the 36 vectors of a run
   of tiles, the bias added, each output row's 4 vectors interleaved into one run of ``4 * LANES``
   pixels of Y (the last run of a row stored up to the map's width only); then the fused elementwise
   chain on the channel's plane (the tile epilogue).

Rounding: the transforms' constants are not powers of two, so outputs carry an error of a few 1e-6
of the output's largest magnitude in float32, about 1e-5 in rare draws (the im2col GEMM: about
2e-7); ``tests/codegen/test_kernels_winograd.py`` holds it to 2e-5 against the float64 convolution. Each
output is computed by one thread in one order: the same bits on any thread count.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..llvm.elementwise import _For
from .base import F32, I32, I64, PTR, KernelBuilder, c64
from .im2col import _gep, _helper_fn, pad_plane_rt
from .linalg import call_sgemm, gemm_loop
from .small_conv import splat

#: F(4x4, 3x3) with the interpolation points 0, +-1, +-2 and infinity
BT = np.array([[4, 0, -5, 0, 1, 0],
               [0, -4, -4, 1, 1, 0],
               [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0],
               [0, 2, -1, -2, 1, 0],
               [0, 4, 0, -5, 0, 1]], np.float64)
G = np.array([[1 / 4, 0, 0],
              [-1 / 6, -1 / 6, -1 / 6],
              [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6],
              [1 / 24, -1 / 12, 1 / 6],
              [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 1, 1, 0],
               [0, 1, -1, 2, -2, 0],
               [0, 1, 1, 4, 4, 0],
               [0, 1, -1, 8, -8, 1]], np.float64)
#: output tile side, input window side
TILE, WINDOW = 4, 6
#: tiles per transform vector (AVX2's width; on AVX-512, 16 measured slower: ResNet's 3x3 128 on
#: 28x28, 0.51 -> 0.55 ms, 256 on 14x14 0.66 -> 0.71-0.84: a row of 7 or 4 tiles pads to 16 lanes)
LANES = 8

#: (tiles at least, channels in and out at least): a conv takes Winograd when it reaches one of these
#: tiers. Measured against the im2col GEMM (benchmarks/conv_kernels.py, 2 threads, AMD EPYC Zen 4):
#: 16 tiles (a 14x14 map) pay from 64 channels (64: 0.091 vs 0.113 ms; 256: 0.65 vs 1.39) but not at
#: 32 in or out (128->32: 0.142 vs 0.123; 32->128: 0.145 vs 0.092); 49 tiles (28x28) from 32 (0.077
#: vs 0.107; 16 channels: 0.040 vs 0.028); 196 tiles (56x56) from 16 (0.081 vs 0.101). 4 tiles (7x7)
#: never: 512 channels 2.8 vs 1.4 ms, the weights streamed 4x over for little work.
TIERS = ((16, 64), (36, 32), (100, 16))

#: the most bytes of the transformed input and output (V and M) at once: a batch whose tiles would
#: need more is done by blocks of images
BLOCK_BUDGET = 32 << 20


#: the most blocks of images (each block's code is emitted on its own)
MAX_BLOCKS = 16


def winograd_applies(n: int, groups: int, const_weight: bool, kh: int, kw: int, sh: int, sw: int, dh: int,
                     dw: int, c: int, m: int, oh: int, ow: int) -> bool:
    """Whether a conv of ``n`` images runs as Winograd F(4x4, 3x3): one group, constant 3x3 weights,
    stride and dilation 1, enough tiles and channels (``TIERS``) and the images' V and M within
    ``BLOCK_BUDGET`` in at most ``MAX_BLOCKS`` blocks."""
    tiles = -(-oh // TILE) * -(-ow // TILE)
    if not (groups == 1 and const_weight and (kh, kw, sh, sw, dh, dw) == (3, 3, 1, 1, 1, 1)
            and any(tiles >= t and min(c, m) >= ch for t, ch in TIERS)):
        return False
    nb = _images_per_block(c, m, tiles, n)
    return nb >= 1 and -(-n // nb) <= MAX_BLOCKS


def _images_per_block(c: int, m: int, tiles: int, n: int) -> int:
    """Images whose V and M fit ``BLOCK_BUDGET`` together (at most ``n``; 0: not even one)."""
    per_image = WINDOW * WINDOW * (c + m) * 4
    return min(n, (BLOCK_BUDGET // per_image - LANES) // tiles)


def transform_weight(w: np.ndarray) -> np.ndarray:
    """``U[e, k, c] = (G w[k, c] G^T)[e // 6, e % 6]`` for ``w`` [K, C, 3, 3] (computed in float64)."""
    u = np.einsum("ai,kcij,bj->abkc", G, np.asarray(w, np.float64), G)
    return u.reshape(WINDOW * WINDOW, *w.shape[:2]).astype(np.float32)


class _Geometry:
    """Sizes of one image's transforms: ``th x tw`` tiles in ``runs`` runs of ``LANES`` per row,
    the padded plane ``hp x wq``."""

    def __init__(self, oh: int, ow: int):
        self.th, self.tw = -(-oh // TILE), -(-ow // TILE)
        self.tiles = self.th * self.tw
        self.runs = -(-self.tw // LANES)
        self.hp = TILE * self.th + 2
        # the last run loads 4 * LANES columns from 4 past its first tile's column
        self.wq = TILE * self.runs * LANES + TILE


def emit_winograd(k: KernelBuilder, x, w: np.ndarray, bias, y, n: int, c: int, h: int, wd: int, m: int,
                  oh: int, ow: int, pt: int, pl: int, te=None) -> None:
    """Y = conv3x3(x, w) (+ bias), stride 1, by F(4x4, 3x3) (module docstring); ``te``: a
    ``TileEpilogue`` run on each output channel's plane once written. The images' tiles are the
    columns of one set of GEMMs (image i's from ``i * tiles``)."""
    geo = _Geometry(oh, ow)
    nb = _images_per_block(c, m, geo.tiles, n)
    blocks = -(-n // nb)
    cols = nb * geo.tiles
    ld = cols + LANES
    u = transform_weight(w)
    packed = [k.services.pack_a(u[e]) for e in range(WINDOW * WINDOW)]
    ustride = packed[0].size
    up = k.weight(np.concatenate(packed))
    bp = k.ptr(bias) if bias is not None else k.weight(np.zeros(m, np.float32))
    ntask = min(c, 64)
    chunk = -(-c // ntask)
    ntask = -(-c // chunk)
    planes = k.scratch(ntask * geo.hp * geo.wq * 4)
    vbuf = k.scratch(WINDOW * WINDOW * c * ld * 4)
    mbuf = k.scratch(WINDOW * WINDOW * m * ld * 4)
    k.note(f"Winograd F(4x4,3x3): 36 GEMMs of {m}x{cols}x{c} between input and output transforms"
           + (f", by blocks of {nb} images" if blocks > 1 else ""))
    fin, fout = _input_transform(k), _output_transform(k)
    sizes = [c64(v) for v in (geo.th, geo.tw, geo.runs, ld)]
    # (the blocks unrolled: a parallel task sees no value of the kernel's function, so each block's
    # tasks have its images as constants; at most MAX_BLOCKS of them)
    for blk in range(blocks):
        first, count = c64(blk * nb), c64(min(nb, n - blk * nb))
        # 1. input transform: channel runs split among the threads (a padded plane each)
        with k.parallel_for(ntask) as (lo, hi):
            b = k.b
            with _For(b, b.sub(hi, lo), "wint") as i:
                t = b.add(lo, i)
                c0 = b.mul(t, c64(chunk))
                c1 = k.f.min(b.add(c0, c64(chunk)), c64(c))
                plane = k.at(k.again(planes), b.mul(t, c64(geo.hp * geo.wq)))
                with k.loop(count, "wini") as j:
                    img = b.add(first, j)
                    b.call(fin, [k.at(k.ptr(x), b.mul(img, c64(c * h * wd))), plane,
                                 k.at(k.again(vbuf), b.mul(j, c64(geo.tiles))), c0, c1]
                           + [c64(v) for v in (h, wd, pt, pl, geo.hp, geo.wq)] + sizes + [c64(c * ld)])

        # 2. the 36 GEMMs M_e = U_e @ V_e, as parallel tasks
        def one(e):
            b = k.b
            call_sgemm(k, 2, 0, m, cols, c, 1.0, k.at(k.again(up), b.mul(e, c64(ustride))), c,
                       k.at(k.again(vbuf), b.mul(e, c64(c * ld))), ld, 0.0,
                       k.at(k.again(mbuf), b.mul(e, c64(m * ld))), ld)
        gemm_loop(k, WINDOW * WINDOW, True, one, "wgemm")
        # 3. output transform and the chain: output channels split among the threads
        with k.parallel_for(m) as (lo, hi):
            b = k.b
            with _For(b, b.sub(hi, lo), "wout") as i:
                ch = b.add(lo, i)
                with k.loop(count, "woi") as j:
                    img = b.add(first, j)
                    b.call(fout, [k.at(k.again(mbuf), b.mul(j, c64(geo.tiles))),
                                  k.at(k.ptr(y), b.mul(img, c64(m * oh * ow))), k.again(bp), ch]
                           + [c64(v) for v in (oh, ow)] + sizes + [c64(m * ld)])
                    if te is not None:
                        ep = te.call_args([img], c64(0))
                        b.call(ep[0], [ep[1], ch, b.add(ch, c64(1)), c64(0), c64(oh * ow)])


def _lin(b: ir.IRBuilder, coeffs, vals):
    """``sum(c * v)`` over the nonzero coefficients (+-1 as adds and subtracts)."""
    acc = None
    for cf, v in zip(coeffs, vals):
        cf = float(cf)
        if cf == 0.0:
            continue
        if acc is None:
            acc = v if cf == 1.0 else b.fneg(v) if cf == -1.0 else b.fmul(_splat_const(v.type, cf), v)
        elif cf == 1.0:
            acc = b.fadd(acc, v)
        elif cf == -1.0:
            acc = b.fsub(acc, v)
        else:
            acc = b.fadd(acc, b.fmul(_splat_const(v.type, cf), v))
    return acc


def _splat_const(vt: ir.VectorType, v: float) -> ir.Constant:
    return ir.Constant(vt, [v] * vt.count)


def _mask(idx) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, len(idx)), list(idx))


def _input_transform(k: KernelBuilder) -> ir.Function:
    """``kiln_wino_in(x, plane, v, c0, c1, h, wd, pt, pl, hp, wq, th, tw, runs, ld, estride)``: for
    the channels [c0, c1) of the image ``x``, the padded plane, then ``V[e, c, t]`` (at
    ``v + e * estride + c * ld + t``)."""
    wide = ir.VectorType(F32, TILE * LANES)

    def body(b, a):
        with _For(b, b.sub(a["c1"], a["c0"]), "wic") as i:
            ch = b.add(a["c0"], i)
            pad_plane_rt(b, _gep(b, a["x"], b.mul(ch, b.mul(a["h"], a["wd"]))), a["plane"], a["h"], a["wd"],
                         a["hp"], a["wq"], a["pt"], a["pl"], 1)
            vc = _gep(b, a["v"], b.mul(ch, a["ld"]))
            with _For(b, a["th"], "wity") as ty:
                rows = _gep(b, a["plane"], b.mul(b.mul(ty, c64(TILE)), a["wq"]))
                vrow = _gep(b, vc, b.mul(ty, a["tw"]))
                with _For(b, a["runs"], "witr") as r:
                    col = b.mul(r, c64(TILE * LANES))
                    d = []
                    for wi in range(WINDOW):
                        src = _gep(b, rows, b.add(b.mul(c64(wi), a["wq"]), col))
                        lo = b.load(src, typ=wide, align=4)
                        hi = b.load(_gep(b, src, c64(TILE)), typ=wide, align=4)
                        d.append([b.shuffle_vector(lo if j < TILE else hi, lo if j < TILE else hi,
                                                   _mask([j % TILE + TILE * q for q in range(LANES)]))
                                  for j in range(WINDOW)])
                    down = [[_lin(b, BT[p], [d[i2][j] for i2 in range(WINDOW)]) for j in range(WINDOW)]
                            for p in range(WINDOW)]
                    dst = _gep(b, vrow, b.mul(r, c64(LANES)))
                    for p in range(WINDOW):
                        for q in range(WINDOW):
                            val = _lin(b, BT[q], down[p])
                            ptr = _gep(b, dst, b.mul(c64(p * WINDOW + q), a["estride"]))
                            b.store(val, ptr, align=4)
    return _helper_fn(k, "kiln_wino_in", [("x", PTR), ("plane", PTR), ("v", PTR)] + [
        (nm, I64) for nm in ("c0", "c1", "h", "wd", "pt", "pl", "hp", "wq", "th", "tw", "runs", "ld", "estride")],
        body)


def _output_transform(k: KernelBuilder) -> ir.Function:
    """``kiln_wino_out(mb, y, bias, ch, oh, ow, th, tw, runs, ld, estride)``: output channel ``ch``'s
    plane of Y from ``M[e, ch, t]`` (at ``mb + e * estride + ch * ld + t``) plus its bias."""
    vt = ir.VectorType(F32, LANES)
    wide = ir.VectorType(F32, TILE * LANES)

    def body(b, a):
        tile = b.alloca(wide, name="wotile")  # (in the entry block: the body starts there)
        bias = b.load(_gep(b, a["bias"], a["ch"]), typ=F32)
        bv = splat(b, bias, LANES)
        mc = _gep(b, a["mb"], b.mul(a["ch"], a["ld"]))
        yc = _gep(b, a["y"], b.mul(a["ch"], b.mul(a["oh"], a["ow"])))
        with _For(b, a["th"], "woty") as ty:
            mrow = _gep(b, mc, b.mul(ty, a["tw"]))
            with _For(b, a["runs"], "wotr") as r:
                src = _gep(b, mrow, b.mul(r, c64(LANES)))
                mv = [[b.load(_gep(b, src, b.mul(c64(p * WINDOW + q), a["estride"])), typ=vt, align=4)
                       for q in range(WINDOW)] for p in range(WINDOW)]
                down = [[_lin(b, AT[i], [mv[p][q] for p in range(WINDOW)]) for q in range(WINDOW)]
                        for i in range(TILE)]
                col0 = b.mul(r, c64(TILE * LANES))
                left = b.sub(a["ow"], col0)  # pixels of the row from this run on
                for i in range(TILE):
                    outs = [b.fadd(_lin(b, AT[j], down[i]), bv) for j in range(TILE)]
                    lo = b.shuffle_vector(outs[0], outs[1], _mask(range(2 * LANES)))
                    hi = b.shuffle_vector(outs[2], outs[3], _mask(range(2 * LANES)))
                    row = b.shuffle_vector(lo, hi, _mask([(j // 2) * 2 * LANES + (j % 2) * LANES + q
                                                          for q in range(LANES) for j in range(TILE)]))
                    oy = b.add(b.mul(ty, c64(TILE)), c64(i))
                    with b.if_then(b.icmp_signed("<", oy, a["oh"])):
                        dst = _gep(b, yc, b.add(b.mul(oy, a["ow"]), col0))
                        full = b.icmp_signed(">=", left, c64(TILE * LANES))
                        with b.if_else(full) as (whole, part):
                            with whole:
                                b.store(row, dst, align=4)
                            with part:
                                b.store(row, tile, align=4)
                                with _For(b, left, "wotail") as q:
                                    b.store(b.load(_gep(b, tile, q), typ=F32), _gep(b, dst, q))
    return _helper_fn(k, "kiln_wino_out", [("mb", PTR), ("y", PTR), ("bias", PTR)] + [
        (nm, I64) for nm in ("ch", "oh", "ow", "th", "tw", "runs", "ld", "estride")], body)


__all__ = ["AT", "BT", "BLOCK_BUDGET", "G", "LANES", "TIERS", "emit_winograd", "transform_weight", "winograd_applies"]
