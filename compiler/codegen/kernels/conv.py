"""2-D convolution (NCHW, float32) as native code; a 1-D convolution runs as the 2-D one of height 1.

Three ways, by shape:

* **depthwise** (one input channel per group, ``group == C``; also a channel multiplier): a direct
  loop per output channel. The input plane is first copied into a zero-padded scratch plane (when
  there is padding), then every output row is one loop over the output width with all kernel taps
  unrolled (``llvm.fmuladd``), which LLVM vectorizes (strided loads for stride 2).
* **1x1, stride 1, no padding**: a GEMM directly on the input, per image and group:
  ``Y[Mg, H*W] = W[Mg, Cg] @ X[Cg, H*W]``.
* **general**: im2col of one image and group into scratch ``col[Cg*KH*KW, OH*OW]`` (each row a run
  of contiguous copies over the output width), then ``Y[Mg, OH*OW] = W[Mg, K] @ col``. With stride 1
  and ``OW == W`` a tap's rows are one contiguous run of the input; with a width stride > 1 the
  padded input is first split by column phase, so every row copy is contiguous again.
* **few pixels, many channels** (7x7 maps): the same GEMM transposed, ``Y^T = col^T @ W^T``, then a
  transposing copy, when the pixels would fill sgemm's NR-wide register tiles much worse.

A constant weight is packed for sgemm at compile time (``ta = 2``, one packed panel set per group).
The bias is written into Y first and the product accumulated onto it (sgemm ``beta = 1``).
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from llvmlite import ir

from ...ir.ops import conv as cv
from ...ir.ops.base import OpError
from ..llvm.elementwise import _For
from .base import F32, I64, PTR, VOID, KernelBuilder, KernelGroup, Lowering, c64, cf32, dtype_reason
from .linalg import call_sgemm


#: the largest im2col matrix (bytes) made at once; a larger one is made by blocks of output rows
COL_BUDGET = 16 << 20


def _geometry(node):
    """(N, C, H, W, M, KH, KW, OH, OW, strides, dilations, pad begins) of a 2-D conv node; a 1-D
    conv is the 2-D conv of height 1."""
    op = node.op
    x, w = node.inputs[0], node.inputs[1]
    nd = len(x.shape) - 2
    strides, dilations, pads = cv.spatial_attrs(op, nd, op.strides, op.dilations, op.pads)
    ins, ks = tuple(int(d) for d in x.shape[2:]), tuple(int(d) for d in w.shape[2:])
    out, pb, _ = cv.resolve_geometry(op, ins, ks, strides, dilations, pads, op.auto_pad)
    if nd == 1:
        ins, ks, out, pb = (1,) + ins, (1,) + ks, (1,) + tuple(out), (0,) + tuple(pb)
        strides, dilations = (1,) + tuple(strides), (1,) + tuple(dilations)
    n, c = (int(d) for d in x.shape[:2])
    return n, c, ins[0], ins[1], int(w.shape[0]), ks[0], ks[1], out[0], out[1], strides, dilations, pb


def _ranges(size: int, out: int, k: int, s: int, d: int, pb: int) -> list[tuple[int, int]]:
    """Per kernel tap j: the output range [lo, hi) whose input index o*s - pb + j*d is inside."""
    res = []
    for j in range(k):
        off = j * d - pb
        lo = max(0, -(off // s) if off < 0 else 0)  # ceil(-off / s) for off < 0
        hi = min(out, (size - 1 - off) // s + 1) if size - 1 - off >= 0 else 0
        res.append((lo, max(lo, hi)))
    return res


class Conv(Lowering):
    """1-D/2-D Conv (NCHW, float32, static shapes, any pads/strides/dilations/groups, optional bias)."""

    ops = (cv.Conv,)

    def check(self, group: KernelGroup) -> str | None:
        node = group.node
        why = dtype_reason(list(node.inputs) + list(node.outputs))
        if why:
            return why
        x = node.inputs[0]
        if len(x.shape) not in (3, 4):
            return f"only 1-D and 2-D convolutions are lowered natively, not {len(x.shape) - 2}-D"
        try:
            geo = _geometry(node)
        except OpError as e:
            return str(e)
        if any(int(d) == 0 for d in node.outputs[0].shape) or any(int(d) == 0 for d in x.shape) or \
                any(int(d) == 0 for d in node.inputs[1].shape):
            return "empty tensors (a zero dimension) are not lowered"
        del geo
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        node = group.node
        op = node.op
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        y = node.outputs[0]
        n, c, h, wd, m, kh, kw, oh, ow, (sh, sw), (dh, dw), (pt, pl) = _geometry(node)
        g = int(op.group)
        cg, mg = c // g, m // g
        xp, yp = k.ptr(x), k.ptr(y)
        bp = k.ptr(bias) if bias is not None else None
        if cg == 1 and g > 1:
            self._depthwise(k, xp, k.ptr(w), bp, yp, n, c, h, wd, mg, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
            return
        kk, p = cg * kh * kw, oh * ow
        cfg = k.services.gemm_cfg
        direct = kh == kw == 1 and sh == sw == 1 and pt == pl == 0 and oh == h and ow == wd
        # a col matrix over the budget is made and multiplied in blocks of output rows
        block = max(1, COL_BUDGET // (kk * ow * 4))
        chunked = not direct and block < oh
        trans = not chunked and _prefer_transposed(mg, p, cfg.MR, cfg.NR)
        if w.const is not None:
            wm = np.asarray(w.const, np.float32).reshape(g, mg, kk)
            if trans:  # W^T (K x Mg) is the B operand
                packed = [k.services.pack_b(wm[i].T) for i in range(g)]
            else:
                packed = [k.services.pack_a(wm[i]) for i in range(g)]
            wstride, wt = packed[0].size, 2
            wp = k.weight(np.concatenate(packed))
        else:
            wp, wstride, wt = k.ptr(w), mg * kk, (1 if trans else 0)
        col = None if direct else k.scratch(kk * (block * ow if chunked else p) * 4)
        # strided windows: the padded input split by column phase first, then contiguous row copies
        phased = not direct and not chunked and sw > 1
        if phased:
            hp = (oh - 1) * sh + (kh - 1) * dh + 1
            wq = -(-((ow - 1) * sw + (kw - 1) * dw + 1) // sw)
            planes = k.scratch(cg * sw * hp * wq * 4)
        ctr = k.scratch(p * mg * 4) if trans else None
        b = k.b
        with k.loop(n, "img") as img:
            ybase = b.mul(img, c64(m * p))
            if bp is not None and not trans:
                fill_bias(k, yp, ybase, bp, m, p)
            with k.loop(g, "grp") as gi:
                xbase = b.mul(b.add(b.mul(img, c64(g)), gi), c64(cg * h * wd))
                wg = k.at(wp, b.mul(gi, c64(wstride)))
                cptr = k.at(yp, b.add(ybase, b.mul(gi, c64(mg * p))))
                beta = 1.0 if bp is not None else 0.0
                if chunked:
                    self._blocks(k, k.at(xp, xbase), col, wg, wt, cptr, beta, block, cg, kk,
                                 mg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
                else:
                    if direct:
                        src = k.at(xp, xbase)
                    elif phased:
                        im2col_phased(k, xp, xbase, planes, col, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw,
                                      pt, pl, hp, wq)
                        src = col
                    else:
                        im2col(k, xp, xbase, col, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
                        src = col
                    if trans:
                        # Y^T[P, Mg] = col^T @ W^T (col [K, P] is A transposed), then transposed back
                        call_sgemm(k, 1, wt, p, mg, kk, 1.0, src, p, wg, kk, 0.0, ctr, mg)
                        boff = b.mul(gi, c64(mg))
                        _transpose_out(k, ctr, cptr, p, mg, bp, boff)
                    else:
                        call_sgemm(k, wt, 0, mg, p, kk, 1.0, wg, kk, src, p, beta, cptr, p)

    @staticmethod
    def _blocks(k, xg, col, wg, wt, cptr, beta, block, cg, kk, mg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw,
                pt, pl) -> None:
        """im2col + GEMM by blocks of ``block`` output rows (the col matrix of one block only): each
        block is the conv of the input rows it reads, its top padding what is left of ``pt``."""
        b = k.b
        nblk = -(-oh // block)
        with k.loop(nblk, "blk") as bi:
            r0 = b.mul(bi, c64(block))
            rows = k.f.min(c64(block), b.sub(c64(oh), r0))
            ih0 = b.sub(b.mul(r0, c64(sh)), c64(pt))
            ptb = k.f.max(c64(0), b.sub(c64(0), ih0))   # padding rows left above the block
            xr0 = k.f.max(c64(0), ih0)                    # first input row it reads
            need = b.add(b.mul(b.sub(rows, c64(1)), c64(sh)), c64((kh - 1) * dh + 1))
            hb = k.f.min(b.sub(c64(h), xr0), need)        # input rows available to it (may be <= 0)
            nb = b.mul(rows, c64(ow))
            im2col(k, xg, b.mul(xr0, c64(wd)), col, cg, hb, wd, kh, kw, rows, ow, sh, sw, dh, dw, ptb, pl,
                   cstride=h * wd)
            call_sgemm(k, wt, 0, mg, nb, kk, 1.0, wg, kk, col, nb, beta, k.at(cptr, b.mul(r0, c64(ow))),
                       oh * ow)


    # -- depthwise ---------------------------------------------------------------------------------
    def _depthwise(self, k, xp, wp, bp, yp, n, c, h, wd, mg, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl):
        b = k.b
        hp = (oh - 1) * sh + (kh - 1) * dh + 1
        wpd = (ow - 1) * sw + (kw - 1) * dw + 1
        padded = not (pt == 0 and pl == 0 and hp <= h and wpd <= wd and sw == 1)
        wq = -(-wpd // sw)  # columns of one phase of the padded plane
        rs = wq if padded else wd
        plane = k.scratch(sw * hp * wq * 4) if padded else None
        fma = k.module.declare_intrinsic("llvm.fmuladd", [F32], ir.FunctionType(F32, [F32, F32, F32]))
        p = oh * ow
        # tap (ki, kj) reads phase (kj*dw) % sw at column ow + (kj*dw) // sw of row oh*sh + ki*dh
        taps = [(ki, kj, ((kj * dw) % sw) * hp * wq + ki * dh * rs + (kj * dw) // sw)
                for ki in range(kh) for kj in range(kw)]
        with k.loop(n * c, "plane") as pc:  # (image, input channel)
            xin = k.at(xp, b.mul(pc, c64(h * wd)))
            if padded:
                pad_plane(k, xin, plane, h, wd, hp, wq, pt, pl, sw)
                src = plane
            else:
                src = xin
            with k.loop(mg, "mult") as j:
                mo = b.add(b.mul(pc, c64(mg)), j)  # output channel over all images: (img*C + c)*mg + j
                mch = b.urem(mo, c64(c * mg)) if n > 1 else mo
                wts = [k.load(wp, b.add(b.mul(mch, c64(kh * kw)), c64(t))) for t in range(kh * kw)]
                b0 = k.load(bp, mch) if bp is not None else cf32(0.0)
                yout = k.at(yp, b.mul(mo, c64(p)))
                with k.loop(oh, "oh") as r:
                    rowbase = k.at(src, b.mul(r, c64(sh * rs)))
                    yrow = k.at(yout, b.mul(r, c64(ow)))
                    with k.loop(ow, "ow") as q:
                        acc = b0
                        for t, (ki, kj, off) in enumerate(taps):
                            v = k.load(rowbase, b.add(q, c64(off)) if off else q)
                            acc = b.call(fma, [wts[t], v, acc])
                        k.store(acc, yrow, q)


def _prefer_transposed(mg: int, p: int, mr: int, nr: int) -> bool:
    """Compute ``Y^T = col^T @ W^T`` when the pixels fill the register tiles much worse than the
    channels would (few pixels, e.g. 7x7 maps: 49 of 72 columns of 3 NR=24 panels used)."""
    def eff(rows, cols):
        return rows / (-(-rows // mr) * mr) * cols / (-(-cols // nr) * nr)
    return eff(p, mg) > 1.15 * eff(mg, p)


def _transpose_out(k: KernelBuilder, ct, yp, p: int, mg: int, bp, boff) -> None:
    """``Y[ch, q] = C^T[q, ch] (+ bias[boff + ch])`` for ``mg`` channels and ``p`` pixels."""
    b = k.b
    with k.loop(mg, "tch") as ch:
        bias = k.load(bp, b.add(boff, ch)) if bp is not None else None
        row = k.at(yp, b.mul(ch, c64(p)))
        src = k.at(ct, ch)
        with k.loop(p, "tq") as q:
            v = k.load(src, b.mul(q, c64(mg)))
            k.store(b.fadd(v, bias) if bias is not None else v, row, q)


def fill_bias(k: KernelBuilder, yp, ybase, bp, m: int, p: int) -> None:
    """``Y[m, :] = bias[m]`` for the ``m`` channel rows (``p`` long) from element ``ybase``."""
    b = k.b
    with k.loop(m, "bch") as ch:
        v = k.load(bp, ch)
        row = k.at(yp, b.add(ybase, b.mul(ch, c64(p))))
        with k.loop(p, "bpx") as q:
            k.store(v, row, q)


def _fill_zero(k: KernelBuilder, ptr, start, stop, name: str) -> None:
    """``ptr[start:stop] = 0`` (compile-time bounds; short ranges as straight stores)."""
    if stop <= start:
        return
    b = k.b
    if stop - start <= 4:
        for i in range(start, stop):
            k.store(cf32(0.0), ptr, i)
        return
    base = k.at(ptr, start) if start else ptr
    with k.loop(stop - start, name) as q:
        k.store(cf32(0.0), base, q)


def _copy(k: KernelBuilder, dst, src, count: int, stride: int, name: str) -> None:
    """``dst[q] = src[q * stride]`` for q < count."""
    b = k.b
    with k.loop(count, name) as q:
        k.store(k.load(src, b.mul(q, c64(stride)) if stride != 1 else q), dst, q)


def _in_range(k: KernelBuilder, idx, size: int):
    """0 <= idx < size (one unsigned compare)."""
    return k.b.icmp_unsigned("<", idx, c64(size))


def im2col(k: KernelBuilder, xp, xbase, col, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
           cstride=None) -> None:
    """``col[(c*KH + ki)*KW + kj, oh*OW + ow] = x[c, oh*sh - pt + ki*dh, ow*sw - pl + kj*dw]`` (0 outside),
    by a module-level helper shared by every conv of the same width stride (compile time stays flat).
    Sizes are ints or i64 values; ``cstride``: the channel stride of x (default ``h * wd``)."""
    fn = k.services.helper(f"kiln_im2col_s{sw}", lambda mod: _build_im2col(mod, sw))
    if cstride is None:
        cstride = h * wd
    vals = (cstride, cg, h, wd, kh, kw, oh, ow, sh, dh, dw, pt, pl)
    args = [k.at(xp, xbase), col] + [v if isinstance(v, ir.Value) else c64(v) for v in vals]
    k.b.call(fn, args)


def im2col_phased(k: KernelBuilder, xp, xbase, planes, col, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw,
                  pt, pl, hp, wq) -> None:
    """im2col for a width stride > 1: each channel is first padded and split by column phase
    (``pad_plane``), after which every (tap, output row) is one contiguous copy of ``OW`` floats."""
    b = k.b
    p = oh * ow
    chan = sw * hp * wq
    with k.loop(cg, "pc") as ci:
        pad_plane(k, k.at(xp, b.add(xbase, b.mul(ci, c64(h * wd)))), k.at(planes, b.mul(ci, c64(chan))),
                  h, wd, hp, wq, pt, pl, sw)
    with k.loop(cg * kh * kw, "prow") as row:
        ci = b.udiv(row, c64(kh * kw))
        tap = b.urem(row, c64(kh * kw))
        ki, kj = b.udiv(tap, c64(kw)), b.urem(tap, c64(kw))
        cj = b.mul(kj, c64(dw))
        off = b.add(b.add(b.mul(ci, c64(chan)), b.mul(b.urem(cj, c64(sw)), c64(hp * wq))),
                    b.add(b.mul(ki, c64(dh * wq)), b.udiv(cj, c64(sw))))
        src = k.at(planes, off)
        dst = k.at(col, b.mul(row, c64(p)))
        with k.loop(oh, "por") as r:
            s_row = k.at(src, b.mul(r, c64(sh * wq)))
            d_row = k.at(dst, b.mul(r, c64(ow)))
            with k.loop(ow, "poc") as q:
                k.store(k.load(s_row, q), d_row, q)


@contextmanager
def _span(b: ir.IRBuilder, start, stop, name: str):
    """``for (i = start; i < stop; ++i)`` with i64 values (nothing when stop <= start)."""
    with _For(b, b.sub(stop, start), name) as i:
        yield b.add(i, start)


def _zero(b: ir.IRBuilder, ptr, start, stop, name: str) -> None:
    with _span(b, start, stop, name) as i:
        b.store(cf32(0.0), b.gep(ptr, [i], inbounds=True, source_etype=F32))


def _valid(b: ir.IRBuilder, off, size, out, stride):
    """[lo, hi): the outputs o < out with 0 <= o*stride + off < size (lo <= hi)."""
    zero = c64(0)
    neg = b.icmp_signed("<", off, zero)
    lo = b.select(neg, b.sdiv(b.add(b.sub(zero, off), b.sub(stride, c64(1))), stride), zero)
    last = b.sub(b.sub(size, c64(1)), off)
    hi = b.select(b.icmp_signed("<", last, zero), zero, b.add(b.sdiv(last, stride), c64(1)))
    lo = b.select(b.icmp_signed("<", lo, out), lo, out)
    hi = b.select(b.icmp_signed("<", hi, out), hi, out)
    hi = b.select(b.icmp_signed("<", hi, lo), lo, hi)
    return lo, hi


def _build_im2col(module: ir.Module, sw: int) -> ir.Function:
    names = ("cs", "cg", "h", "wd", "kh", "kw", "oh", "ow", "sh", "dh", "dw", "pt", "pl")
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR] + [I64] * len(names)), f"kiln_im2col_s{sw}")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    for a, nm in zip(fn.args, ("x", "col") + names):
        a.name = nm
    x, col = fn.args[:2]
    v = dict(zip(names, fn.args[2:]))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    gep = lambda ptr, i: b.gep(ptr, [i], inbounds=True, source_etype=F32)  # noqa: E731
    oh, ow, wd = v["oh"], v["ow"], v["wd"]
    p = b.mul(oh, ow)
    contiguous = b.icmp_signed("==", ow, wd) if sw == 1 else None
    swc = c64(sw)
    with _For(b, v["cg"], "ic") as ci:
        xc = gep(x, b.mul(ci, v["cs"]))
        with _For(b, v["kh"], "ki") as ki:
            a = b.sub(b.mul(ki, v["dh"]), v["pt"])
            rlo, rhi = _valid(b, a, v["h"], oh, v["sh"])
            with _For(b, v["kw"], "kj") as kj:
                bc = b.sub(b.mul(kj, v["dw"]), v["pl"])
                lo, hi = _valid(b, bc, wd, ow, swc)
                row = b.add(b.mul(b.add(b.mul(ci, v["kh"]), ki), v["kw"]), kj)
                dst = gep(col, b.mul(row, p))
                empty = b.or_(b.icmp_signed(">=", rlo, rhi), b.icmp_signed(">=", lo, hi))
                with b.if_else(empty) as (then, otherwise):
                    with then:
                        _zero(b, dst, c64(0), p, "z")
                    with otherwise:
                        def strided():
                            _zero(b, dst, c64(0), b.mul(rlo, ow), "za")
                            _zero(b, dst, b.mul(rhi, ow), p, "zb")
                            with _span(b, rlo, rhi, "r") as r:
                                drow = gep(dst, b.mul(r, ow))
                                ih = b.add(b.mul(r, v["sh"]), a)
                                src = gep(xc, b.add(b.mul(ih, wd), b.add(b.mul(lo, swc), bc)))
                                _zero(b, drow, c64(0), lo, "rza")
                                dlo = gep(drow, lo)
                                with _For(b, b.sub(hi, lo), "cp") as q:
                                    val = b.load(gep(src, b.mul(q, swc) if sw != 1 else q), typ=F32)
                                    b.store(val, gep(dlo, q))
                                _zero(b, drow, hi, ow, "rzb")

                        if contiguous is None:
                            strided()
                        else:
                            with b.if_else(contiguous) as (cont, other):
                                with cont:
                                    # the valid rows are one run of the plane: copy it whole, then
                                    # zero the columns that wrapped into the neighbouring rows
                                    p0 = b.add(b.mul(rlo, ow), lo)
                                    p1 = b.add(b.mul(b.sub(rhi, c64(1)), ow), hi)
                                    _zero(b, dst, c64(0), p0, "cza")
                                    _zero(b, dst, p1, p, "czb")
                                    src = gep(xc, b.add(b.mul(a, wd), bc))
                                    with _span(b, p0, p1, "ccp") as q:
                                        b.store(b.load(gep(src, q), typ=F32), gep(dst, q))
                                    edges = b.or_(b.icmp_signed(">", lo, c64(0)), b.icmp_signed("<", hi, ow))
                                    with b.if_then(edges):
                                        with _span(b, rlo, rhi, "cr") as r:
                                            drow = gep(dst, b.mul(r, ow))
                                            _zero(b, drow, c64(0), lo, "crza")
                                            _zero(b, drow, hi, ow, "crzb")
                                with other:
                                    strided()
    b.ret_void()
    return fn


def pad_plane(k: KernelBuilder, xin, plane, h, wd, hp, wq, pt, pl, sw) -> None:
    """The ``hp`` rows of the zero-padded input plane ``xpad[r, s] = x[r - pt, s - pl]`` split by
    column phase: ``plane[ph, r, t] = xpad[r, t*sw + ph]`` (``wq`` columns per phase), so that a
    strided window reads contiguous columns."""
    b = k.b
    for ph in range(sw):
        # t in [lo, hi): 0 <= t*sw + ph - pl < wd
        (lo, hi), = _ranges(wd, wq, 1, sw, 1, pl - ph)
        base = k.at(plane, ph * hp * wq)
        with k.loop(hp, f"pr{ph}") as r:
            ih = b.sub(r, c64(pt))
            dst = k.at(base, b.mul(r, c64(wq)))
            with k.f.if_else(_in_range(k, ih, h), f"prow{ph}") as (inside, outside):
                with inside:
                    _fill_zero(k, dst, 0, lo, f"pza{ph}")
                    if hi > lo:
                        src = k.at(xin, b.add(b.mul(ih, c64(wd)), c64(lo * sw + ph - pl)))
                        _copy(k, k.at(dst, lo), src, hi - lo, sw, f"pcp{ph}")
                    _fill_zero(k, dst, hi, wq, f"pzb{ph}")
                with outside:
                    _fill_zero(k, dst, 0, wq, f"pz{ph}")


__all__ = ["Conv", "fill_bias", "im2col", "pad_plane"]
