"""A stride-1 convolution whose GEMM reads its taps in place: no col matrix, no packing of B.

For one image and group, the input is zero-padded into planes ``wq = ow + (kw - 1) * dw`` wide
(``packed_cols.pad_planes``); output pixels are numbered over that width, ``q = r * wq + c`` (the
columns ``c >= ow`` of each row are computed and dropped). Tap ``(ki, kj)`` of output pixel ``q``
then reads channel ``ci``'s padded plane at ``q + ki * dh * wq + kj * dw``: for each tap, the B
of the GEMM is the planes themselves, read at a constant offset, its rows (the channels) a plane
apart. ``kiln_sgemm_taps`` (docs/gemm.md) multiplies the weights, reordered to ``[M, taps x
channels]`` and pre-packed, by that B in one call: its depth blocks are the taps, each block's B
rows found through a table of the taps' offsets, and the GEMM reads them in place (small M) or
packs them with its own row-major packer. Its epilogue copies each finished block of C (``M x oh *
wq``, scratch) into Y, the dropped columns left out and the bias added.

The im2col path writes and packs ``kh * kw`` times the input for a GEMM that uses each packed
value only M times: for the few output channels of a DenseNet layer (32) that costs as much as the
product itself. Here the reads of B are ``kh * kw`` times the padded input's, all in cache.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..llvm.elementwise import _For
from .base import F32, I32, I64, PTR, VOID, KernelBuilder, c64
from .linalg import const_table
from .packed_cols import pad_planes

#: the most input channels (the GEMM's depth block: one tap's channels)
TAPS_MAX_CHANNELS = 512
#: the fewest input channels (each tap's block of depth re-reads and re-writes its tile of C: 2
#: threads, Zen 4, 48 -> 30 and 32 -> 20 channels on 12x12 measured 1.0-1.3x slower than im2col)
TAPS_MIN_CHANNELS = 64


def taps_applies(n_images: int, groups: int, kh: int, kw: int, sh: int, sw: int, weights, mg: int, cg: int,
                 direct_max_m: int) -> bool:
    """One image and group, stride 1, a window of several taps, constant weights, between
    ``TAPS_MIN_CHANNELS`` and ``TAPS_MAX_CHANNELS`` input channels, and few enough output channels
    that the GEMM reads B in place (the configuration's ``direct_b_max_m``)."""
    return (n_images * groups == 1 and sh == sw == 1 and kh * kw > 1 and weights is not None
            and TAPS_MIN_CHANNELS <= cg <= TAPS_MAX_CHANNELS and mg <= direct_max_m)


def emit_conv_taps(k: KernelBuilder, x, w: np.ndarray, bias, y, c: int, h: int, wd: int, m: int, kh: int, kw: int,
                   oh: int, ow: int, dh: int, dw: int, pt: int, pl: int) -> None:
    """``y = conv(x, w) + bias`` (``w`` as ``[m, c, kh, kw]``), as the module docstring says."""
    cfg = k.services.gemm_cfg
    hp, wq = oh + (kh - 1) * dh, ow + (kw - 1) * dw
    chan, n, depth = hp * wq, oh * wq, kh * kw * c
    # the last tap of the last panel's last column reads this far past the last plane
    margin = cfg.NR + (kw - 1) * dw
    xpad = k.scratch((c * chan + margin) * 4)
    pad_planes(k, x, xpad, c, h, wd, hp, wq, pt, pl, 1, margin)
    wt = np.ascontiguousarray(np.asarray(w, np.float32).transpose(0, 2, 3, 1).reshape(m, depth))
    a = k.weight(k.services.pack_a(wt))
    table = const_table(k, "taps", [ki * dh * wq + kj * dw for ki in range(kh) for kj in range(kw)])
    ct = k.scratch(m * n * 4)
    bp = k.ptr(bias) if bias is not None else k.weight(np.zeros(m, np.float32))
    b = k.b
    ctx = b.alloca(PTR, 3, name="taps.ctx")  # the epilogue's C, Y and bias
    for i, v in enumerate((k.again(ct), k.ptr(y), bp)):
        b.store(v, b.gep(ctx, [c64(i)], inbounds=True, source_etype=PTR))
    ep = _compact(k, n, wq, oh * ow, ow)
    boff = b.gep(table[0], [c64(0), c64(0)], inbounds=True, source_etype=table[1])
    args = [ir.Constant(I32, 2), ir.Constant(I32, 0), c64(m), c64(n), c64(depth), ir.Constant(F32, 1.0), a,
            c64(depth), k.again(xpad), c64(chan), ir.Constant(F32, 0.0), k.again(ct), c64(n), k.nthreads,
            ep, ctx, ir.Constant(PTR, None), ir.Constant(PTR, None), boff, c64(c)]
    b.call(k.services.sgemm_taps(), args)


def _compact(k: KernelBuilder, n: int, wq: int, p: int, ow: int) -> ir.Function:
    """The GEMM's epilogue ``ep(ctx, i0, i1, j0, j1)``: rows ``[i0, i1)`` of the finished block of C
    (``n = oh * wq`` columns) into Y (``p = oh * ow`` columns), each output row's first ``ow``
    columns, plus the bias."""
    fn = ir.Function(k.module, ir.FunctionType(VOID, [PTR, I64, I64, I64, I64]), f"{k.name}.taps_ep")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    ctx, i0, i1, j0, j1 = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def field(i):
        return b.load(b.gep(ctx, [c64(i)], inbounds=True, source_etype=PTR), typ=PTR)

    def at(base, idx):
        return b.gep(base, [idx], inbounds=True, source_etype=F32)

    def smin(u, v):
        return b.select(b.icmp_signed("<", u, v), u, v)

    def smax(u, v):
        return b.select(b.icmp_signed(">", u, v), u, v)

    cp, yp, bp = field(0), field(1), field(2)
    r0 = b.sdiv(j0, c64(wq))
    rows = b.sub(b.sdiv(b.add(j1, c64(wq - 1)), c64(wq)), r0)  # output rows the block's columns touch
    with _For(b, b.sub(i1, i0), "ch") as ii:
        i = b.add(i0, ii)
        crow, yrow = at(cp, b.mul(i, c64(n))), at(yp, b.mul(i, c64(p)))
        bias = b.load(at(bp, i), typ=F32)
        with _For(b, rows, "row") as rr:
            r = b.add(r0, rr)
            q0 = b.mul(r, c64(wq))
            lo, hi = smax(j0, q0), smin(j1, b.add(q0, c64(ow)))
            src, dst = at(crow, lo), at(yrow, b.add(b.mul(r, c64(ow)), b.sub(lo, q0)))
            with _For(b, smax(b.sub(hi, lo), c64(0)), "col") as t:
                v = b.fadd(b.load(at(src, t), typ=F32), bias)
                b.store(v, at(dst, t))
    b.ret_void()
    return fn


__all__ = ["TAPS_MAX_CHANNELS", "TAPS_MIN_CHANNELS", "emit_conv_taps", "taps_applies"]
