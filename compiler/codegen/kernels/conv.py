"""2-D convolution (NCHW, float32) as native code; a 1-D convolution runs as the 2-D one of height 1.

By shape:

* **depthwise** (one input channel per group, ``group == C``; also a channel multiplier): a direct
  loop per output channel. The input plane is first copied into a zero-padded scratch plane (when
  there is padding), then every output row is one loop over the output width with all kernel taps
  unrolled (``llvm.fmuladd``), which LLVM vectorizes. Narrow outputs (14x14, 7x7: a row is less than
  a vector or two) are computed instead as one flat loop of explicit vectors over the padded plane,
  split by row and column phase when strided, so that each tap is one shifted vector load; the
  outputs land ``rs`` (the plane's row length) apart and are compacted into Y's rows after; on the
  smallest of those planes all of it in registers (``dw_regs.py``). A fused chain runs on each
  output plane as soon as it is computed (one image).
* **small output maps** (at most 64 pixels: 8x8, 7x7, 4x4, 2x2; one group, constant weights, all
  finite): a direct kernel vectorized over output channels, each pixel summed over its in-bounds
  taps only (``small_conv.py``; a 2x2 map of a padded 3x3 window has 4 of its 9 taps inside). A tap
  over the padding adds ``w * 0``, which is NaN for a NaN or infinite weight: such weights (and
  weights given at run time) take the paths that multiply the padding, as the tiny depthwise
  planes do.
* **3x3, stride 1, many tiles and channels** (ResNet's 56x56 and 28x28 stages; one group,
  constant weights): Winograd F(4x4, 3x3) (``winograd.py``): 36 GEMMs of a quarter of the
  arithmetic between an input and an output transform.
* **1x1, stride 1, no padding**: a GEMM directly on the input, per image and group:
  ``Y[Mg, H*W] = W[Mg, Cg] @ X[Cg, H*W]``. A strided 1x1 without padding of one image and group,
  on planes too big for the packer to read itself, first subsamples the pixels it reads into
  ``X'[C, OH*OW]`` and multiplies that the same way.
* **one image and group**: ``Y[Mg, OH*OW] = W[Mg, K] @ col`` with the col matrix
  ``col[Cg*KH*KW, OH*OW]`` never made: the GEMM calls back for each block of it, which is packed
  straight from the padded input into the GEMM's panel layout (``packed_cols.py``). When the
  pixels fill at most ``PREPACK_PANELS`` panels, the threads pack all of them first instead.
* **several images or groups**: im2col per image and group (``im2col.py``), then the same GEMM; a
  col matrix over ``COL_BUDGET`` is made and multiplied by blocks of output rows. For an output
  narrower than ``TABLE_WIDTH`` (a 2x2 map) the col matrix is one gather through a compile-time
  index table instead of run-by-run copies.
* **few pixels, many channels** (7x7 maps of several images or groups, 2x2 maps of one whose
  weights are an input): the same
  GEMM transposed, ``Y^T = col^T @ W^T``, then a transposing copy, when the pixels would fill
  sgemm's NR-wide register tiles much worse (``_prefer_transposed``).

A constant weight is packed for sgemm at compile time (``ta = 2``, one packed panel set per group).
The bias and a fused elementwise chain run inside the GEMM on each finished block of Y
(``tile_epilogue.py``); on the blocked and transposed paths the bias is written into Y first and
the product accumulated onto it (sgemm ``beta = 1``), and a chain runs after.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...ir.ops import conv as cv
from ...ir.ops.base import OpError
from ..llvm.elementwise import _For
from .base import F32, I64, PTR, KernelBuilder, KernelGroup, Lowering, c64, dtype_reason
from .dw_regs import DW_REG_OUTPUTS, DW_REG_VECTORS, RegisterPlane, padded_vectors
from .conv_taps import emit_conv_taps, taps_applies
from .im2col import (_copy, _fill_zero, _gep, _helper_fn, _span, im2col, im2col_phased, im2col_table,
                     im2col_table_packed_a, pad_plane, table_applies, window_table)
from .linalg import TASK_MAX_FLOPS, call_sgemm, const_table, gemm_loop, table_load
from .packed_cols import emit_packed_cols, packed_cols_applies, reads_input, scratch_floats
from .prologue import ProloguePacker, prologue_reason
from .small_conv import emit_small_conv, inside_taps, small_conv_applies, splat
from .tile_epilogue import plan_tile_epilogue
from .winograd import emit_winograd, winograd_applies


#: the largest im2col matrix (bytes) made at once; a larger one is made by blocks of output rows
COL_BUDGET = 16 << 20

#: the most scratch (bytes) for per-task copies when the images x groups GEMMs run as tasks
TASK_SCRATCH_BUDGET = 16 << 20

#: rows of a one-panel col matrix per thread at least, when the threads pack it (``_pack_panel``)
PANEL_MIN_ROWS = 64
#: rows of K per thread at least, when the threads gather a transposed conv's packed A
GATHER_MIN_ROWS = 256


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

    @staticmethod
    def prologue_reason(node, nodes) -> str | None:
        """Why the elementwise chain ``nodes`` computing the input of conv ``node`` cannot run in its
        GEMM's B packing (``prologue.py``; None if it can): a 1x1 conv, stride 1, no padding, one
        image and group."""
        n, c, h, wd, m, kh, kw, oh, ow, strides, _, pads = _geometry(node)
        if not (kh == kw == 1 and all(int(v) == 1 for v in strides) and all(int(v) == 0 for v in pads)
                and (oh, ow) == (h, wd) and len(node.inputs[0].shape) == 4):
            return "the convolution is not 1x1 with stride 1 and no padding"
        if n != 1 or int(node.op.group) != 1:
            return "the convolution has several images or groups"
        return prologue_reason(nodes, node.inputs[0])

    def emit(self, k: KernelBuilder, group: KernelGroup, epilogue=None, prologue=None) -> bool:
        """Emit the conv; with ``epilogue`` = (chain nodes, their values needed outside, the value
        written over the result's buffer or None) also the chain, as a tile epilogue of the GEMM
        when this conv's path allows (returns True; False: the caller emits the chain after). With
        ``prologue`` (the chain computing the input; ``prologue_reason`` must have allowed it) the
        GEMM's B blocks are computed by it as they are packed (the input has no buffer)."""
        node = group.node
        op = node.op
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        y = node.outputs[0]
        n, c, h, wd, m, kh, kw, oh, ow, (sh, sw), (dh, dw), (pt, pl) = _geometry(node)
        g = int(op.group)
        cg, mg = c // g, m // g
        xp, yp = (None if prologue else k.ptr(x)), k.ptr(y)
        bp = k.ptr(bias) if bias is not None else None
        if cg == 1 and g > 1:
            # one image: the chain on each output plane as soon as it is computed (in cache)
            te, _ = plan_tile_epilogue(k, y, epilogue if n == 1 else None, None, row_axis=1)
            self._depthwise(k, x, w, bias, y, n, c, h, wd, mg, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, te)
            k.note("depthwise: each pixel over its in-bounds taps, unrolled (a tiny map)" if tiny_depthwise(oh, ow, w.const)
                   else "depthwise: direct loop on padded planes")
            if te is not None:
                k.note("chain on each output plane as it is computed")
            return te is not None
        if prologue is None and winograd_applies(n, g, w.const is not None, kh, kw, sh, sw, dh, dw, c, m, oh, ow):
            te, fused = plan_tile_epilogue(k, y, epilogue, None, row_axis=1)
            emit_winograd(k, x, np.asarray(w.const, np.float32), bias, y, n, c, h, wd, m, oh, ow, pt, pl, te)
            if te is not None:
                k.note("chain on each output channel's plane as it is computed")
            return fused
        if prologue is None and small_conv_applies(n, g, oh * ow, w.const):
            te, fused = plan_tile_epilogue(k, y, epilogue, None, row_axis=1)
            emit_small_conv(k, x, np.asarray(w.const, np.float32).reshape(m, c, kh, kw), bias, y, n, c, h, wd, m,
                            kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, te)
            if te is not None:
                k.note("chain on each block of channels as it is computed")
            return fused
        cfg = k.services.gemm_cfg
        # few panels of pixels (where the im2col path packs them all first): the taps read in place
        if (prologue is None and -(-(oh * ow) // cfg.NR) <= PREPACK_PANELS
                and taps_applies(n, g, kh, kw, sh, sw, w.const, mg, cg, cfg.direct_b_max_m)):
            emit_conv_taps(k, x, np.asarray(w.const, np.float32), bias, y, c, h, wd, m, kh, kw, oh, ow, dh, dw, pt, pl)
            k.note("taps read in place by the GEMM from padded planes (no col matrix); the chain after it")
            return False
        kk, p = cg * kh * kw, oh * ow
        direct = kh == kw == 1 and sh == sw == 1 and pt == pl == 0 and oh == h and ow == wd
        # a strided 1x1 of one image and group reading no padding, on planes too big for the packer
        # to read the input itself: the pixels it reads subsampled into a [C, OH*OW] matrix first (a
        # quarter of the input at stride 2), then the GEMM on it as on a stride-1 input (padded phase
        # planes would copy the whole input: ResNet-50's 1x1/2 256->512 1.21 -> 1.05 ms, 2 threads)
        sub = (not direct and kh == kw == 1 and pt == pl == 0 and n * g == 1 and prologue is None
               and (oh - 1) * sh < h and (ow - 1) * sw < wd
               and not reads_input(cg, kh, kw, oh, ow, sh, sw, dh, dw, cfg.NR))
        direct = direct or sub
        # a col matrix over the budget is made and multiplied in blocks of output rows
        block = max(1, COL_BUDGET // (kk * ow * 4))
        chunked = not direct and block < oh
        trans = not chunked and prologue is None and _prefer_transposed(mg, p, cfg.MR, cfg.NR, n * g)
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
        # one image and group: the GEMM's B blocks packed on its request (packed_cols.py), no col matrix
        packed = not direct and not chunked and not trans and packed_cols_applies(n, g)
        # outputs a few pixels wide: the col matrix gathered through an index table
        table = (window_table(cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
                 if not direct and not chunked and not packed and table_applies(kk, ow, p) else None)
        # transposed with a table: the gather writes col^T as the GEMM's packed A (it packs nothing)
        packed_a = trans and table is not None
        # strided windows: the padded input split by column phase first, then contiguous row copies
        phased = not direct and not chunked and not packed and table is None and sw > 1
        hp = (oh - 1) * sh + (kh - 1) * dh + 1
        wq = -(-((ow - 1) * sw + (kw - 1) * dw + 1) // sw)
        col_rows = -(-p // cfg.MR) * cfg.MR if packed_a else block * ow if chunked else p
        col_f = 0 if direct or packed else kk * col_rows
        planes_f = cg * sw * hp * wq if phased else 0
        ctr_f = p * mg if trans else 0
        # small images x groups GEMMs may run as parallel tasks (gemm_loop), each with its own scratch
        flops = 2 * mg * p * kk
        tasks = (n * g > 1 and not chunked and flops < TASK_MAX_FLOPS
                 and n * g * (col_f + planes_f + ctr_f) * 4 <= TASK_SCRATCH_BUDGET)
        copies = n * g if tasks else 1
        pad_f = scratch_floats(cg, kh, kw, oh, ow, sh, sw, dh, dw, cfg.NR) if packed else 0
        xpad = k.scratch(pad_f * 4) if pad_f else None  # (none: the packer reads the input)
        col = k.scratch(copies * col_f * 4) if col_f else None
        planes = k.scratch(copies * planes_f * 4) if phased else None
        ctr = k.scratch(copies * ctr_f * 4) if trans else None
        # bias and epilogue inside the GEMM, on each block of Y as it is finished (not for the
        # transposed or blocked paths: their GEMMs do not write Y's layout)
        te, fused = (None, False) if trans or chunked else plan_tile_epilogue(k, y, epilogue, bias, row_axis=1)
        if bias is not None and not trans and te is None:
            fill_bias(k, y, bias, n * m, m, p)
        k.note("1x1 strided: the pixels subsampled, then a GEMM on them" if sub else
               "1x1: GEMM on the input" if direct else "im2col packed block by block for the GEMM" if packed else
               f"im2col by blocks of {block} output rows" if chunked else
               "transposed GEMM (few pixels)" if trans else "im2col + GEMM")
        if table is not None:
            k.note("im2col gathered through an index table (a narrow output)" + (", as the GEMM's packed A"
                                                                                  if packed_a else ""))
        if packed and pad_f == 0:
            k.note("the packer reads the input: no padded copy")
        if te is not None:
            k.note("bias and chain inside the GEMM" if fused else "bias inside the GEMM")
        if prologue:
            k.note("the elementwise chain before it computed as the GEMM packs B (a prologue)")
        pre = ProloguePacker(k, prologue, x, cfg.NR) if prologue else None
        # one image and group: the input padded here, the GEMM's B blocks packed when it asks
        pack_cb = None
        if packed:
            pack_cb = emit_packed_cols(k, x, xpad, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, cfg.NR, cfg.W)
        # the pixels fill one panel, so the GEMM can split only the channels among its tasks, and
        # each would pack the whole panel again: the threads pack it once first, a range of rows each
        one_panel = packed and p <= cfg.NR and mg >= 2 * cfg.MR
        # a few panels (a 14x14 map): packed once, all of them, by the threads first (the GEMM splits
        # such a product by rows of A, and each thread would pack every block of B again: ResNet-50's
        # 3x3/2 256 on 28x28 1.90 -> 1.36 ms on 2 threads; on 28x28 maps and wider, no faster)
        npanels = -(-p // cfg.NR)
        all_panels = (packed and not one_panel and npanels <= PREPACK_PANELS
                      and kk * npanels * cfg.NR * 4 <= PREPACK_BUDGET)
        panel = k.scratch(kk * npanels * cfg.NR * 4) if one_panel or all_panels else None
        if one_panel:
            k.note("B's one panel packed by the threads before the GEMM")
        if all_panels:
            k.note("B's panels packed by the threads before the GEMM")
        beta = 1.0 if bp is not None and te is None else 0.0

        def one(i):
            """The GEMM of image ``i // g``, group ``i % g`` (its im2col first; scratch copy i)."""
            b = k.b
            img, gi = b.udiv(i, c64(g)), b.urem(i, c64(g))
            slot = i if copies > 1 else c64(0)
            xbase = b.mul(i, c64(cg * h * wd))
            xt, wg = (k.again(xp) if xp is not None else None), k.at(k.again(wp), b.mul(gi, c64(wstride)))
            cptr = k.at(k.again(yp), b.mul(i, c64(mg * p)))
            colt, pln, ctt = (k.at(k.again(v), b.mul(slot, c64(f))) if v is not None else None
                              for v, f in ((col, col_f), (planes, planes_f), (ctr, ctr_f)))
            ep = te.call_args([img], b.mul(gi, c64(mg))) if te is not None else None
            if chunked:
                self._blocks(k, k.at(xt, xbase), colt, wg, wt, cptr, beta, block, cg, kk,
                             mg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
                return
            if pre is not None:
                src = ir.Constant(PTR, None)  # (not read: the prologue packer makes B's blocks)
            elif sub:
                src = k.again(subs)
            elif direct:
                src = k.at(xt, xbase)
            elif packed:
                src = xt  # (not read: the packer makes B's blocks)
            elif packed_a and n * g == 1:  # one GEMM: the threads gather, rows of K each
                with k.parallel_for(kk, min_per_task=GATHER_MIN_ROWS) as (lo, hi):
                    im2col_table_packed_a(k, k.again(xp), c64(0), k.again(col), table, cfg.MR, (lo, hi))
                src = colt
            elif packed_a:
                im2col_table_packed_a(k, xt, xbase, colt, table, cfg.MR)
                src = colt
            elif table is not None:
                im2col_table(k, xt, xbase, colt, table)
                src = colt
            elif phased:
                im2col_phased(k, xt, xbase, pln, colt, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, hp, wq)
                src = colt
            else:
                im2col(k, xt, xbase, colt, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
                src = colt
            if trans:
                # Y^T[P, Mg] = col^T @ W^T (col [K, P] is A transposed), then transposed back
                call_sgemm(k, 2 if packed_a else 1, wt, p, mg, kk, 1.0, src, p, wg, kk, 0.0, ctt, mg)
                _transpose_out(k, ctt, cptr, p, mg, k.again(bp) if bp is not None else None, b.mul(gi, c64(mg)))
            elif one_panel or all_panels:
                if one_panel:
                    _pack_panel(k, pack_cb, x, xpad, panel, kk, p, cfg.NR)
                else:
                    _pack_panels(k, pack_cb, x, xpad, panel, kk, p, cfg.NR)
                call_sgemm(k, wt, 2, mg, p, kk, 1.0, wg, kk, k.again(panel), p, beta, cptr, p, epilogue=ep)
            else:
                call_sgemm(k, wt, 0, mg, p, kk, 1.0, wg, kk, src, p, beta, cptr, p, epilogue=ep,
                           pack_b=(pack_cb, k.again(xpad) if xpad is not None else xt) if packed
                           else pre.call_args() if pre else None)

        subs = k.scratch(c * p * 4) if sub else None
        if sub:
            _subsample(k, x, subs, c, h, wd, oh, ow, sh, sw)
        # (image, group) pairs: input, output and the chain's context are laid out by i = img * g + gi
        gemm_loop(k, n * g, tasks, one, "imgrp")
        if tasks:
            k.note(f"{n * g} GEMMs (images x groups) as parallel tasks when they fit the threads")
        return fused

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
    def _depthwise(self, k, x, w, bias, y, n, c, h, wd, mg, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, te=None,
                   planes_of=None, load=None, store=None, convert=None, weights=None):
        """Planes (image, input channel) split among the threads in ``ntask`` runs, each with a padded
        scratch plane of its own; each plane by a module-level helper taking the sizes at run time
        (one helper per kernel size and width stride). ``te``: a ``TileEpilogue`` run on each output
        plane once computed (one image). ``planes_of``: for each input plane, the plane of ``x`` it
        is (a channel shuffle read in place, ``shuffle.py``); None: plane i is x's plane i.
        ``load(stride)``: a row function ``f(x elements, float32 out, n)`` computing the conv's input
        from every ``stride``-th element of ``x`` (then of another element type: uint8 dequantized,
        ``qdepthwise.py``), run on the padded copy's rows (or on each input plane into scratch);
        ``store``: one computing ``y``'s elements (of another type) from the conv's float32 result,
        run on each output plane computed into scratch; ``convert(b, vector)``: ``load``'s semantics on
        a vector of elements (or None), for the padded copy of a width stride 2; ``store`` may also be
        a Python function ``store(float32 plane, y's plane, n, channel)`` printing that code in place.
        ``weights``: the float32 weights ``[channels, kh * kw]`` as compile-time data, instead of ``w``'s."""
        hp = (oh - 1) * sh + (kh - 1) * dh + 1
        wpd = (ow - 1) * sw + (kw - 1) * dw + 1
        # tiny planes: each output pixel's sum over its in-bounds taps, unrolled, read in place
        tiny = tiny_depthwise(oh, ow, weights if weights is not None else w.const)
        # small planes: one flat loop of explicit vectors over the padded plane (always copied: the
        # last vector reads past it into slack of its own)
        flat = not tiny and ow * sw <= DW_FLAT_SPAN
        padded = not tiny and (flat or not (pt == 0 and pl == 0 and hp <= h and wpd <= wd and sw == 1))
        wq = -(-wpd // sw)  # columns of one phase of the padded plane
        lanes = k.services.gemm_cfg.W
        # the rows form (not flat): each phase's rows a whole number of vectors apart and the plane
        # placed so that column ``a``, where every phase's copied columns begin (the padding before
        # it), falls on a vector boundary: the padded copy's vector stores then write whole cache
        # lines (misaligned, each 64-byte store wrote two; Zen 4, 3x3 with ReLU6 on one thread: 96
        # planes of 112x112/2 in uint8 202 -> 183 us, in float 216 -> 205; 32 of 112x112 178 -> 167)
        aligned = padded and not flat
        if aligned:
            wq = -(-wq // lanes) * lanes
            a = max(max(0, -(-(pl - ph) // sw)) for ph in range(sw))
            shift = -a % lanes  # floats before the plane in the task's (aligned) scratch
        rph = sh if flat and padded else 1  # row phases (the flat form reads consecutive rows)
        hq = -(-hp // rph)  # rows of one phase
        rs = wq if padded else wd  # row stride of the plane read
        # a padded plane over DW_STRIP_BYTES (not the flat form's) is padded and computed by strips of
        # ``strip`` output rows: the padded rows are still in L1 when the taps read them. Each strip
        # pads the window's rows past its own again: not when that would be over half of its own
        # (rows so wide that few fit: the whole plane padded once, as before)
        window = (kh - 1) * dh + 1
        strip = 0
        if padded and not flat and sw * hq * wq * 4 > DW_STRIP_BYTES:
            strip = max(1, (DW_STRIP_BYTES // (sw * wq * 4) - window) // sh + 1)
            strip = strip if strip < oh and 2 * (window - sh) <= strip * sh else 0
        if strip:
            hq = (strip - 1) * sh + window  # the strip's padded rows
            k.note(f"padded and computed by strips of {strip} output rows")
        planes, p = n * c, oh * ow
        nvec = -(-((oh - 1) * rs + ow) // lanes)  # vectors of the flat form's output
        taps = [(((ki * dh) % rph * sw + (kj * dw) % sw) * hq * wq + (ki * dh) // rph * rs + (kj * dw) // sw)
                for ki in range(kh) for kj in range(kw)]
        # a small flat plane: its padded plane and outputs in registers, no scratch (``dw_regs.py``)
        regs = flat and DW_REGS and nvec <= DW_REG_OUTPUTS and padded_vectors(taps, nvec, lanes) <= DW_REG_VECTORS
        if regs:
            rplane = RegisterPlane(k, h, wd, hq, wq, pt, pl, sw, rph, taps, nvec, oh, ow, rs, lanes)
            k.note("the padded plane and outputs in registers")
        pexact = rph * sw * hq * wq if padded and not regs else 0
        psize = pexact + (lanes if flat and not regs else 0) + (shift if aligned else 0)
        wsize = nvec * lanes if flat and not regs else 0  # the flat form's output plane, rs wide
        per_plane = mg * p * kh * kw + psize
        xt = F32 if load is None else ir.IntType(8 * x.type.dtype.itemsize)  # x's element type
        yt = F32 if store is None else ir.IntType(8 * y.type.dtype.itemsize)
        # ``load`` on the padded copy's rows, else on the whole input plane into scratch first (not
        # before a padded copy: its element loads of the vector stores just made would stall)
        lsize = h * wd if load is not None and (regs and convert is None or not padded) else 0
        ssize = p if store is not None else 0  # the float output plane ``store`` reads
        ntask = min(planes, 64)
        # each task run owns a scratch plane; at least ~DW_MIN multiply-adds per task
        group_size = -(-planes // ntask)
        ntask = -(-planes // group_size)
        with k.parallel_for(ntask, min_per_task=max(1, -(-DW_MIN // (per_plane * group_size)))) as (lo, hi):
            b = k.b
            xp, wp, yp = k.ptr(x), k.weight(weights) if weights is not None else k.ptr(w), k.ptr(y)
            bp = k.ptr(bias) if bias is not None else k.weight(_zeros(c * mg))
            per_task = -(-(psize + wsize + lsize + ssize) // lanes) * lanes  # (each task's scratch aligned)
            scr = k.scratch(ntask * per_task * 4) if per_task else None  # per task run
            fma = k.module.declare_intrinsic("llvm.fmuladd", [F32], ir.FunctionType(F32, [F32, F32, F32]))
            vt = ir.VectorType(F32, lanes)
            vname = f"llvm.fmuladd.v{lanes}f32"
            vfma = k.module.globals.get(vname) or ir.Function(k.module, ir.FunctionType(vt, [vt] * 3), vname)
            ep = te.call_args([c64(0)], c64(0)) if te is not None else None
            table = const_table(k, "planes", planes_of) if planes_of is not None else None

            # a row's outputs in vectors of ``rl`` lanes (of a full vector or a half, whichever
            # leaves the fewest lanes unused), the last overlapping the one before, where ``ow`` is
            # not a multiple of half a vector: the loop LLVM vectorizes leaves the remainder one
            # output at a time (28 = 3 x 8 + 4 on Zen 4: 97 -> 89 us for 144 planes of 56x56 / 2,
            # uint8). Where it divides, LLVM's loop (its two accumulators in flight) measured 5%
            # faster (32 planes of 112x112, 144 of 56x56).
            rl = min((lanes, lanes // 2), key=lambda v: (-(-ow // v) * v, -v))
            rl = rl if ow % (lanes // 2) and ow >= rl else None
            if rl:
                rvt, rname = ir.VectorType(F32, rl), f"llvm.fmuladd.v{rl}f32"
                rfma = k.module.globals.get(rname) or ir.Function(k.module, ir.FunctionType(rvt, [rvt] * 3), rname)

            def row_taps(rowbase, yrow, wts, b0, rws):
                """One output row ``yrow`` from the plane's rows at ``rowbase`` (``rws``: the
                weights and the bias splat to ``rl`` lanes)."""
                if rl is None:
                    with k.loop(ow, "ow") as q:
                        acc = b0
                        for tt, off in enumerate(taps):
                            acc = b.call(fma, [wts[tt], k.load(rowbase, b.add(q, c64(off)) if off else q), acc])
                        k.store(acc, yrow, q)
                    return
                with k.loop(-(-ow // rl), "owv") as v:
                    q = k.f.min(b.mul(v, c64(rl)), c64(ow - rl))
                    acc = rws[1]
                    for tt, off in enumerate(taps):
                        val = b.load(k.at(rowbase, b.add(q, c64(off)) if off else q), typ=rvt, align=4)
                        acc = b.call(rfma, [rws[0][tt], val, acc])
                    b.store(acc, k.at(yrow, q), align=4)

            with _span(b, lo, hi, "dwt") as t:
                mine = k.at(scr, b.mul(t, c64(per_task))) if scr is not None else None
                plane = (k.at(mine, c64(shift)) if aligned and shift else mine) if padded else None
                wide = k.at(mine, c64(psize)) if wsize else None
                loaded = k.at(mine, c64(psize + wsize)) if lsize else None
                stored = k.at(mine, c64(psize + wsize + lsize)) if ssize else None
                p0 = b.mul(t, c64(group_size))
                p1 = k.f.min(b.add(p0, c64(group_size)), c64(planes))
                with _span(b, p0, p1, "dwp") as pc:  # (image, input channel)
                    xin = k.at(xp, b.mul(pc if table is None else table_load(k, table, pc), c64(h * wd)), xt)
                    if lsize:
                        b.call(load(1), [xin, loaded, c64(h * wd)])
                        xin = loaded
                    if regs:  # (from the loaded floats, or converting the elements as it reads them)
                        rplane.build(xin) if lsize else rplane.build(xin, xt, convert)
                    elif padded and not strip:
                        pad_plane(k, xin, plane, h, wd, hp, wq, pt, pl, sw, rph,
                                  load=None if load is None else load(sw), xt=xt, convert=convert)
                    if flat and not regs:
                        _fill_zero(k, plane, pexact, psize, "dwslack")
                    src = plane if padded else xin
                    # specialized (constant sizes and tap offsets): measured 2x faster than run-time sizes
                    with k.loop(mg, "mult") as j:
                        mo = b.add(b.mul(pc, c64(mg)), j)
                        mch = b.urem(mo, c64(c * mg)) if n > 1 else mo
                        wts = [k.load(wp, b.add(b.mul(mch, c64(kh * kw)), c64(tt))) for tt in range(kh * kw)]
                        b0 = k.load(bp, mch)
                        yout = k.at(yp, b.mul(mo, c64(p))) if store is None else stored
                        if tiny:
                            for r in range(oh):
                                for q in range(ow):
                                    acc = b0
                                    for tt, off in inside_taps(r, q, h, wd, kh, kw, sh, sw, dh, dw, pt, pl):
                                        acc = b.call(fma, [wts[tt], k.load(src, c64(off)), acc])
                                    k.store(acc, yout, c64(r * ow + q))
                        elif regs:
                            rplane.compute([splat(b, v, lanes) for v in wts], splat(b, b0, lanes), vfma, yout)
                        elif flat:
                            # the plane as one loop of vectors over the rows of the padded plane (rs
                            # wide: its columns past ow are no outputs), then its rows compacted into Y
                            ws, acc0 = [splat(b, v, lanes) for v in wts], splat(b, b0, lanes)
                            with k.loop(nvec, "dwv") as v:
                                base = b.mul(v, c64(lanes))
                                acc = acc0
                                for tt, off in enumerate(taps):
                                    val = b.load(k.at(src, b.add(base, c64(off))), typ=vt, align=4)
                                    acc = b.call(vfma, [ws[tt], val, acc])
                                b.store(acc, k.at(wide, base), align=4)
                            with k.loop(oh, "dwc") as r:
                                wrow, yrow = k.at(wide, b.mul(r, c64(rs))), k.at(yout, b.mul(r, c64(ow)))
                                # into y: LLVM's loop, vectorized; into the float plane ``store``
                                # reads (scratch, as the wide plane: LLVM cannot tell them apart) in
                                # explicit vectors (``_copy_row``)
                                _copy_row(k, wrow, yrow, ow, lanes if store is not None else 1)
                        elif strip:
                            rws = ([splat(b, v, rl) for v in wts], splat(b, b0, rl)) if rl else None
                            with k.loop(-(-oh // strip), "dws") as st:
                                r0 = b.mul(st, c64(strip))
                                nrows = k.f.min(c64(strip), b.sub(c64(oh), r0))
                                pad_plane(k, xin, plane, h, wd, hq, wq, pt, pl, sw,
                                          load=None if load is None else load(sw), xt=xt, convert=convert,
                                          row0=b.mul(r0, c64(sh)),
                                          rows=b.add(b.mul(b.sub(nrows, c64(1)), c64(sh)), c64(window)))
                                with k.loop(nrows, "oh") as r:
                                    rowbase = k.at(src, b.mul(r, c64(sh * rs)))
                                    yrow = k.at(yout, b.mul(b.add(r0, r), c64(ow)))
                                    row_taps(rowbase, yrow, wts, b0, rws)
                                if ep is not None and store is None:  # the chain on the strip's rows
                                    b.call(ep[0], [ep[1], mo, b.add(mo, c64(1)), b.mul(r0, c64(ow)),
                                                   b.mul(b.add(r0, nrows), c64(ow))])
                        else:
                            rws = ([splat(b, v, rl) for v in wts], splat(b, b0, rl)) if rl else None
                            with k.loop(oh, "oh") as r:
                                rowbase = k.at(src, b.mul(r, c64(sh * rs)))
                                yrow = k.at(yout, b.mul(r, c64(ow)))
                                row_taps(rowbase, yrow, wts, b0, rws)
                        if isinstance(store, ir.Function):
                            b.call(store, [stored, k.at(yp, b.mul(mo, c64(p)), yt), c64(p)])
                        elif store is not None:
                            store(stored, k.at(yp, b.mul(mo, c64(p)), yt), c64(p), mch)
                        if ep is not None and not (strip and store is None):
                            # output channel mo is row mo of Y viewed [channels, pixels]
                            b.call(ep[0], [ep[1], mo, b.add(mo, c64(1)), c64(0), c64(p)])


def _copy_row(k, src, dst, n: int, lanes: int) -> None:
    """``n`` floats from ``src`` to ``dst`` in vectors of the widest of ``lanes``, half and a quarter
    of it that ``n`` fills, the last overlapping the one before (the same values written twice);
    below 2 lanes, by LLVM's loop. From one scratch plane to another LLVM's loop copied two floats at
    a time (a 28-wide row: 14 moves); in vectors, int8 depthwise convs (the float plane the uint8
    store reads) on one thread, Zen 4: 192 channels on 28x28 85.7 -> 74.7 us, 96 on 28x28 44.8 ->
    39.1, 32 on 32x32 21.0 -> 18.8, 144 on 28x28 / 2 26.7 -> 25.6. Into y (float models) LLVM's
    loop vectorizes the copy itself: even (0.98-1.01x), so it is kept there."""
    b = k.b
    cl = next((v for v in (lanes, lanes // 2, lanes // 4) if 1 < v <= n), None)
    if cl is None:
        return _copy(k, dst, src, n, 1, "cq")
    ct = ir.VectorType(F32, cl)
    with k.loop(-(-n // cl), "cv") as v:
        q = k.f.min(b.mul(v, c64(cl)), c64(n - cl))
        b.store(b.load(k.at(src, q), typ=ct, align=4), k.at(dst, q), align=4)


def tiny_depthwise(oh: int, ow: int, weights) -> bool:
    """Whether a depthwise plane is computed pixel by pixel over its in-bounds taps only
    (``DW_TINY_PIXELS``): only with constant weights, all finite, since a tap over the padding adds
    ``w * 0``, which is 0 for a finite weight but NaN for a NaN or infinite one."""
    return oh * ow <= DW_TINY_PIXELS and weights is not None and bool(np.isfinite(weights).all())


#: a depthwise plane of at most this many output pixels (a 2x2 or 4x4 map) is computed pixel by
#: pixel, each over its in-bounds taps only, unrolled: no padded copy, no compaction (EfficientNet-B0
#: at 32x32 on 2 threads: 480 channels of 3x3 on 2x2 maps 20 -> 4 us, the model 0.89x; MobileNetV3
#: at 32x32 0.93x)
DW_TINY_PIXELS = 16


#: a depthwise plane whose output width x width stride is at most this is computed as one flat loop
#: of vectors spanning rows (measured on MobileNetV2's planes: 2.2-2.5x faster at 14x14 and 7x7,
#: 1.1x at 28x28 stride 1; 10-20% slower from 56x56 or a 28-wide stride-2 output)
DW_FLAT_SPAN = 32


#: small flat planes in registers (``dw_regs.py``); False: through scratch (for A/B measurements)
DW_REGS = True


#: a depthwise conv's padded plane over this many bytes is padded and computed by strips of output
#: rows that fit it (in L1 between the copy and the taps)
DW_STRIP_BYTES = 8 << 10


#: multiply-adds per parallel task of a depthwise conv at least
DW_MIN = 1 << 16


def _prefer_transposed(mg: int, p: int, mr: int, nr: int, gemms: int) -> bool:
    """Compute ``Y^T = col^T @ W^T`` when the pixels fill the register tiles much worse than the
    channels would: for several images or groups by 15% (e.g. 7x7 maps: 49 of 72 columns of 3 NR=24
    panels used); for one, by 2x (a 2x2 map: 4 of NR=32 columns, against 4 of MR=12 rows
    transposed, 2.6x less work: ResNet-18's last stage at 64x64 input), since packed panels and the
    epilogue inside the GEMM (which the transposed result cannot have) measured 2% faster on
    ResNet-50's 7x7 maps than transposing."""
    def eff(rows, cols):
        return rows / (-(-rows // mr) * mr) * cols / (-(-cols // nr) * nr)
    return eff(p, mg) > (1.15 if gemms > 1 else 2.0) * eff(mg, p)


#: floats read per parallel task of a subsample at least
SUBSAMPLE_MIN = 1 << 15


def _subsample(k: KernelBuilder, x, dst, c: int, h: int, wd: int, oh: int, ow: int, sh: int, sw: int) -> None:
    """``dst[ch, r * ow + q] = x[ch, r * sh, q * sw]`` for the ``c`` channels of one image, split among
    the threads by channels."""
    def body(b, a):
        with _span(b, a["c0"], a["c1"], "sbc") as ch:
            src = _gep(b, a["x"], b.mul(ch, b.mul(a["h"], a["wd"])))
            out = _gep(b, a["dst"], b.mul(ch, b.mul(a["oh"], a["ow"])))
            with _For(b, a["oh"], "sbr") as r:
                srow = _gep(b, src, b.mul(b.mul(r, a["sh"]), a["wd"]))
                drow = _gep(b, out, b.mul(r, a["ow"]))
                with _For(b, a["ow"], "sbq") as q:
                    b.store(b.load(_gep(b, srow, b.mul(q, a["sw"])), typ=F32), _gep(b, drow, q))
    fn = _helper_fn(k, "kiln_conv_subsample", [("x", PTR), ("dst", PTR)] + [
        (nm, I64) for nm in ("c0", "c1", "h", "wd", "oh", "ow", "sh", "sw")], body)
    with k.parallel_for(c, min_per_task=-(-SUBSAMPLE_MIN // (oh * ow))) as (lo, hi):
        k.b.call(fn, [k.ptr(x), k.again(dst), lo, hi] + [c64(v) for v in (h, wd, oh, ow, sh, sw)])


def _pack_panel(k: KernelBuilder, pack_cb, x, xpad, panel, kk: int, p: int, nr: int) -> None:
    """The col matrix's one panel (``kk`` rows of ``nr`` columns, ``p`` of them pixels) into
    ``panel`` as the GEMM's pre-packed B, by the conv's packer ``pack_cb``, rows split among the
    threads."""
    with k.parallel_for(kk, min_per_task=PANEL_MIN_ROWS) as (lo, hi):
        b = k.b
        src = k.again(xpad) if xpad is not None else k.ptr(x)
        b.call(pack_cb, [src, lo, b.sub(hi, lo), c64(0), c64(p), k.at(k.again(panel), b.mul(lo, c64(nr)))])


#: the most panels, and bytes, of a col matrix packed whole before its GEMM (``_pack_panels``)
PREPACK_PANELS, PREPACK_BUDGET = 8, 16 << 20


def _pack_panels(k: KernelBuilder, pack_cb, x, xpad, panels, kk: int, p: int, nr: int) -> None:
    """The col matrix (``kk`` rows, ``p`` pixels) as the GEMM's pre-packed B: ``ceil(p / nr)`` panels
    of ``kk x nr`` floats, by the conv's packer ``pack_cb``, panels split among the threads."""
    count = -(-p // nr)
    with k.parallel_for(count) as (lo, hi):
        b = k.b
        src = k.again(xpad) if xpad is not None else k.ptr(x)
        j0 = b.mul(lo, c64(nr))
        cols = b.sub(k.f.min(b.mul(hi, c64(nr)), c64(p)), j0)
        b.call(pack_cb, [src, c64(0), c64(kk), j0, cols, k.at(k.again(panels), b.mul(lo, c64(kk * nr)))])


def _transpose_out(k: KernelBuilder, ct, yp, p: int, mg: int, bp, boff) -> None:
    """``Y[ch, q] = C^T[q, ch] (+ bias[boff + ch])`` for ``mg`` channels and ``p`` pixels."""
    def body(b, a):
        with _For(b, a["mg"], "tch") as ch:
            bias = b.load(_gep(b, a["bias"], ch), typ=F32)
            row = _gep(b, a["y"], b.mul(ch, a["p"]))
            src = _gep(b, a["ct"], ch)
            with _For(b, a["p"], "tq") as q:
                v = b.load(_gep(b, src, b.mul(q, a["mg"])), typ=F32)
                b.store(b.fadd(v, bias), _gep(b, row, q))
    fn = _helper_fn(k, "kiln_conv_transpose_out", [("ct", PTR), ("y", PTR), ("bias", PTR), ("p", I64),
                                                   ("mg", I64)], body)
    if bp is None:
        bp, boff = k.weight(_zeros(mg)), c64(0)
    k.b.call(fn, [ct, yp, k.at(bp, boff), c64(p), c64(mg)])


_ZEROS: dict[int, np.ndarray] = {}


def _zeros(n: int) -> np.ndarray:
    """A zero bias of ``n`` channels (one array per size, shared by the kernels of a process)."""
    if n not in _ZEROS:
        _ZEROS[n] = np.zeros(n, np.float32)
    return _ZEROS[n]


#: floats written per parallel task of the bias fill at least
FILL_MIN = 1 << 16


def fill_bias(k: KernelBuilder, y, bias, rows: int, m: int, p: int) -> None:
    """``Y[r, :] = bias[r % m]`` for the ``rows`` channel rows (``p`` long) of the output value ``y``
    (every image: ``rows = N * M``), split among the threads by rows."""
    def body(b, a):
        with _span(b, a["r0"], a["r1"], "bch") as r:
            v = b.load(_gep(b, a["bias"], b.urem(r, a["m"])), typ=F32)
            row = _gep(b, a["y"], b.mul(r, a["p"]))
            with _For(b, a["p"], "bpx") as q:
                b.store(v, _gep(b, row, q))
    fn = _helper_fn(k, "kiln_conv_fill_bias", [("y", PTR), ("bias", PTR), ("r0", I64), ("r1", I64),
                                               ("m", I64), ("p", I64)], body)
    with k.parallel_for(rows, min_per_task=-(-FILL_MIN // p)) as (lo, hi):
        k.b.call(fn, [k.ptr(y), k.ptr(bias), lo, hi, c64(m), c64(p)])


__all__ = ["Conv", "fill_bias"]
