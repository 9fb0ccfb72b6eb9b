"""Convolutions with a small output map (at most ``SMALL_PIXELS`` output pixels: ResNet-50's, Inception's
and MobileNetV2's 7x7 stages, ResNet-18's 2x2 and 4x4 ones at 64x64 input; one group, constant
weights) as a direct kernel: vectors of output channels, each output pixel summed over its
in-bounds taps only.

On such maps most taps of a padded 3x3 window fall outside the input: on a 2x2 map each pixel reads
4 of its 9 taps, on a 4x4 map 100 of the 144. The GEMM paths multiply those taps' zeros all the
same (the col matrix has them), and on 4 pixels the GEMM's register tile is mostly padding; this
kernel does only the products that count. On 7x7 and 8x8 maps (49 pixels fill 2 of a GEMM's
32-column panels to 77%) the same form, the output channels in the vector lanes, wins too: it is
how ONNX Runtime's NCHWc convolutions compute. Its form, for each block of ``VB`` output channels
(``nv`` vectors of W lanes) and each group of output pixels (as many as its accumulators fit the
vector registers)::

    acc[j] = bias                                  # one vector per pixel j of the group and vector
    for c in range(C):                             # a loop
        for each tap t, each pixel j reading inside the input at tap t (unrolled, known here):
            acc[j] += Wp[block, c, t, :] * x[c, offset(j, t)]     # a vector times a broadcast
    Y[block channels, j] = acc[j]                  # lane l to Y's row of channel block + l

``Wp`` is the weight re-packed at compile time as ``[channel block][C][taps][VB]`` (a padded last
block has zero weights), so the kernel streams it once per pixel group. The blocks are the parallel
tasks; a fused elementwise chain runs on each block's rows of Y once they are written (the tile
epilogue). Each output is summed by one thread in one order: the same bits on any thread count.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from llvmlite import ir

from .base import F32, I64, KernelBuilder, c64
from ..llvm.elementwise import no_unroll_metadata
from .im2col import _span

#: output maps of at most this many pixels take the direct kernel (an 8x8 map). Measured against the
#: GEMM paths (benchmarks/conv_kernels.py, 2 threads, AMD EPYC Zen 4): ResNet-50's 3x3 512 on 7x7
#: 1.71 -> 0.85 ms (ONNX Runtime 0.99), its 1x1 512->2048 0.63 -> 0.47, DenseNet's 3x3 128->32 on 7x7
#: 0.033 -> 0.015; whole models ResNet-50 -8%, Inception-v1 -7%, MobileNetV2 -8%, DenseNet-121 -1%.
#: On 14x14 maps it still won on most shapes (1x1 1024->256 0.61 -> 0.46 ms), but the unrolled
#: pixel groups doubled the compile time of Inception and SqueezeNet: the GEMM keeps those.
SMALL_PIXELS = 64

#: multiply-adds per parallel task at least
MIN_TASK_MACS = 1 << 16


def small_conv_applies(n: int, groups: int, pixels: int, weight) -> bool:
    """Whether a conv takes the direct tiny-map kernel: one group, a constant ``weight`` (None: an
    input), all of it finite, and an output map of at most ``SMALL_PIXELS`` pixels. (The kernel
    skips the taps over the padding, which add ``w * 0``: 0 for a finite weight, NaN for a NaN or
    infinite one, as the reference has it.)"""
    return (groups == 1 and weight is not None and pixels <= SMALL_PIXELS and n >= 1
            and bool(np.isfinite(weight).all()))


def _accumulators(lanes: int) -> int:
    """Vector accumulators that leave room for a weight vector and a broadcast: 24 of AVX-512's 32
    registers, 12 of AVX2's (or SSE's) 16."""
    return 24 if lanes >= 16 else 12


def inside_taps(r, q, h, wd, kh, kw, sh, sw, dh, dw, pt, pl) -> list[tuple[int, int]]:
    """(tap, offset in the input plane) of each tap of output pixel (r, q) that reads inside the input."""
    out = []
    for ki in range(kh):
        ih = r * sh - pt + ki * dh
        for kj in range(kw):
            iw = q * sw - pl + kj * dw
            if 0 <= ih < h and 0 <= iw < wd:
                out.append((ki * kw + kj, ih * wd + iw))
    return out


def tap_pairs(h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl) -> list[list[tuple[int, int]]]:
    """``inside_taps`` of each output pixel, in row-major order."""
    return [inside_taps(r, q, h, wd, kh, kw, sh, sw, dh, dw, pt, pl) for r in range(oh) for q in range(ow)]


def pack_weight(w: np.ndarray, vb: int) -> np.ndarray:
    """``w`` [M, C, KH, KW] as ``[ceil(M / vb)][C][KH*KW][vb]`` (zeros past M)."""
    m, c = w.shape[:2]
    taps = int(np.prod(w.shape[2:]))
    nblk = -(-m // vb)
    wp = np.zeros((nblk * vb, c, taps), np.float32)
    wp[:m] = np.asarray(w, np.float32).reshape(m, c, taps)
    return np.ascontiguousarray(wp.reshape(nblk, vb, c, taps).transpose(0, 2, 3, 1))


def emit_small_conv(k: KernelBuilder, x, w: np.ndarray, bias, y, n: int, c: int, h: int, wd: int,
                    m: int, kh: int, kw: int, oh: int, ow: int, sh: int, sw: int, dh: int, dw: int,
                    pt: int, pl: int, te=None) -> None:
    """Y = conv(x, w) (+ bias) for ``n`` images by the direct tiny-map kernel (module docstring);
    ``te``: a ``TileEpilogue`` run on each block's rows of Y once written."""
    lanes = k.services.gemm_cfg.W
    p = oh * ow
    pairs = tap_pairs(h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
    maxacc = _accumulators(lanes)
    nv = 2 if m > lanes and 2 * p <= maxacc else 1  # two vectors of channels when the pixels are few
    vb = nv * lanes
    ng = -(-p // max(1, maxacc // nv))  # pixel groups of balanced sizes, each within the accumulators
    groups = [list(range(i * p // ng, (i + 1) * p // ng)) for i in range(ng)]
    taps = kh * kw
    nblk = -(-m // vb)
    wp = pack_weight(w, vb)
    macs = vb * c * sum(len(q) for q in pairs)  # per block and image (0: every tap over the padding)
    k.note(f"tiny map: direct, {vb} channels x in-bounds taps only "
           f"({sum(len(q) for q in pairs)} of {p * taps} pixel-taps)")
    vt = ir.VectorType(F32, lanes)
    fma = k.module.globals.get(f"llvm.fmuladd.v{lanes}f32") or ir.Function(
        k.module, ir.FunctionType(vt, [vt] * 3), f"llvm.fmuladd.v{lanes}f32")
    ntask = n * nblk * len(groups)
    with k.parallel_for(ntask, min_per_task=max(1, -(-MIN_TASK_MACS * len(groups) // max(macs, 1)))) as (lo, hi):
        b = k.b
        xp, yp, wq = k.ptr(x), k.ptr(y), k.weight(wp)
        bp = k.ptr(bias) if bias is not None else None
        with _span(b, lo, hi, "scb") as task:  # (image, channel block, pixel group)
            img, rest = b.udiv(task, c64(nblk * len(groups))), b.urem(task, c64(nblk * len(groups)))
            blk, gsel = b.udiv(rest, c64(len(groups))), b.urem(rest, c64(len(groups)))
            oc0 = b.mul(blk, c64(vb))
            xi = k.at(xp, b.mul(img, c64(c * h * wd)))
            yi = k.at(yp, b.mul(img, c64(m * p)))
            wb = k.at(wq, b.mul(blk, c64(c * taps * vb)))
            init = [_bias_vector(k, bp, oc0, v, lanes, m, vb) for v in range(nv)]
            for gi, grp in enumerate(groups):
                with b.if_then(b.icmp_unsigned("==", gsel, c64(gi))) if len(groups) > 1 else _nothing():
                    _group(k, fma, xi, yi, wb, oc0, init, grp, pairs, c, h * wd, taps, nv, vb, lanes, p, m)
                    if te is not None:
                        ep = te.call_args([img], c64(0))
                        oc1 = k.f.min(b.add(oc0, c64(vb)), c64(m))
                        b.call(ep[0], [ep[1], oc0, oc1, c64(grp[0]), c64(grp[-1] + 1)])


def _group(k, fma, xi, yi, wb, oc0, init, grp, pairs, c, plane, taps, nv, vb, lanes, p, m):
    """One channel block's outputs at the pixels ``grp``: the loop over input channels, each tap of
    each pixel that reads inside the input unrolled, then the stores."""
    b = k.b
    vt = ir.VectorType(F32, lanes)
    users = [[(jj, off) for jj, j in enumerate(grp) for tt, off in pairs[j] if tt == t] for t in range(taps)]

    def step(ci, accs):
        accs = list(accs)
        xc = k.at(xi, b.mul(ci, c64(plane)))
        wc = k.at(wb, b.mul(ci, c64(taps * vb)))
        for t in range(taps):
            if not users[t]:
                continue
            wv = [b.load(k.at(wc, t * vb + v * lanes), typ=vt, align=4) for v in range(nv)]
            for jj, off in users[t]:
                xv = splat(b, k.load(xc, off), lanes)
                for v in range(nv):
                    accs[jj * nv + v] = b.call(fma, [wv[v], xv, accs[jj * nv + v]])
        return accs

    accs = _carry_loop(b, c, [init[v] for _ in grp for v in range(nv)], "scc", step)
    # to Y through a tile on the stack: each pixel's vectors stored whole, then copied out by rows of
    # channels (Y's rows, p apart) in a loop (unrolled stores of each lane made 2x the code)
    tile = k.f.alloca(F32, c64(len(grp) * vb), name="sctile")
    for jj in range(len(grp)):
        for v in range(nv):
            b.store(accs[jj * nv + v], b.bitcast(k.at(tile, jj * vb + v * lanes), vt.as_pointer()), align=4)
    rows = k.f.min(c64(vb), b.sub(c64(m), oc0)) if m % vb else c64(vb)
    with k.loop(rows, "scst") as ch:
        yrow = k.at(yi, b.add(b.mul(b.add(oc0, ch), c64(p)), c64(grp[0])))
        with k.loop(len(grp), "scsq") as jj:
            k.store(k.load(tile, b.add(b.mul(jj, c64(vb)), ch)), yrow, jj)


@contextmanager
def _nothing():
    yield


def _bias_vector(k, bp, oc0, v, lanes, m, vb):
    """The bias of channels ``oc0 + v*lanes ..`` as a vector (zeros without a bias)."""
    b = k.b
    vt = ir.VectorType(F32, lanes)
    if bp is None:
        return ir.Constant(vt, [0.0] * lanes)
    if m % vb == 0:
        src = k.at(bp, b.add(oc0, c64(v * lanes)))
        return b.load(src, typ=vt, align=4)
    # a ragged last block: zeros in the lanes past M
    vals = ir.Constant(vt, [0.0] * lanes)
    for lane in range(lanes):
        oc = b.add(oc0, c64(v * lanes + lane))
        inside = b.icmp_signed("<", oc, c64(m))
        val = b.select(inside, k.load(bp, k.f.min(oc, c64(m - 1))), ir.Constant(F32, 0.0))
        vals = b.insert_element(vals, val, ir.Constant(ir.IntType(32), lane))
    return vals


def splat(b: ir.IRBuilder, v, lanes: int):
    """A vector of ``lanes`` copies of the float ``v``: a call of the module's ``kiln_splat_f32x<lanes>``
    (internal, always inlined: the same code), since llvmlite prints the insert and shuffle's
    constant vectors element by element at every use (Inception-v1's module: 2,000 splats, a
    quarter of its text, whose printing is a quarter of a warm compile)."""
    mod = b.function.module
    name = f"kiln_splat_f32x{lanes}"
    fn = mod.globals.get(name)
    if fn is None:
        vt = ir.VectorType(F32, lanes)
        fn = ir.Function(mod, ir.FunctionType(vt, [F32]), name)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        fb = ir.IRBuilder(fn.append_basic_block("entry"))
        one = fb.insert_element(ir.Constant(vt, ir.Undefined), fn.args[0], ir.Constant(ir.IntType(32), 0))
        fb.ret(fb.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)))
    return b.call(fn, [v])


def _carry_loop(b: ir.IRBuilder, count: int, init: list, name: str, step) -> list:
    """``for i in range(count): vals = step(i, vals)`` with the values carried in phis (``count`` >= 1);
    the values after the loop."""
    pre = b.block
    body = b.function.append_basic_block(f"{name}.body")
    done = b.function.append_basic_block(f"{name}.end")
    b.branch(body)
    b.position_at_end(body)
    i = b.phi(I64, name=name)
    i.add_incoming(c64(0), pre)
    phis = [b.phi(v.type) for v in init]
    for ph, v in zip(phis, init):
        ph.add_incoming(v, pre)
    new = step(i, phis)
    nxt = b.add(i, c64(1), flags=["nuw", "nsw"])
    end = b.block
    i.add_incoming(nxt, end)
    for ph, v in zip(phis, new):
        ph.add_incoming(v, end)
    br = b.cbranch(b.icmp_signed("<", nxt, c64(count)), body, done)
    br.set_metadata("llvm.loop", no_unroll_metadata(b.module))  # (the body is unrolled already)
    b.position_at_end(done)
    return new


__all__ = ["SMALL_PIXELS", "emit_small_conv", "inside_taps", "pack_weight", "small_conv_applies", "splat", "tap_pairs"]
