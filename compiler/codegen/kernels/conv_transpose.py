"""ConvTranspose (1-D and 2-D, float32 and float64; any strides, dilations, pads, output padding or
output_shape, groups, bias).

**float32** (``emit``): as the reference computes it, a GEMM then the taps gathered back. Per image and
group, Kiln's sgemm computes the column matrix ``cols = W[g]^T x[n, g]`` (``MG * KH * KW`` rows of
``H * W``: what each tap of each output channel receives from each input position) into scratch;
then a loop-form kernel (``col2im_form``) gives each output element the bias plus the column entries
of the taps that land on it, phase by phase along each axis so that each tap's loop covers exactly
the outputs it reaches (no test, no division). The heavy part runs at GEMM speed.

**Otherwise** (float64, many images and groups; and the GPU, where a thread per output is what it
wants: ``form``), a gather: output ``(oh, ow)`` takes tap ``(r, s)`` of input channel ``ci`` from input
``((oh + ph - r * dh) / sh, (ow + pw - s * dw) / sw)`` where both divisions are exact and inside the
input. Per image and output channel (the parallel loop) and output row, the row starts as the bias;
then for each input channel of the group and each tap whose input row exists (one test per row), a
vector pass along the row adds ``x * w`` where the column's division is exact and inside (a
``select``; the read is clamped). Sums in the result's type, in a different order than the
reference's scatter (float rounding only).
"""
from __future__ import annotations

import numpy as np

from ...ir.ops import conv as cv
from ...ir.types import DType
from ..loops import Kernel, KernelForm, print_llvm
from ..loops.expr import INDEX, Const, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain
from .linalg import call_sgemm

#: the most GEMMs (images x groups) the float32 path calls one after another
MAX_GEMMS = 64


def _geometry(node):
    """(N, C, H, W), (M, CG, MG, KH, KW), (OH, OW), (sh, sw), (dh, dw), (ph, pw): 1-D as H = 1."""
    x, w = node.inputs[0], node.inputs[1]
    xs, ws = [int(d) for d in x.shape], [int(d) for d in w.shape]
    out, begins, strides, dilations = node.op._geometry(xs[2:], ws[2:])
    if len(xs) == 3:
        xs, ws = xs[:2] + [1] + xs[2:], ws[:2] + [1] + ws[2:]
        out, begins, strides, dilations = (1,) + tuple(out), (0,) + tuple(begins), (1,) + tuple(strides), \
            (1,) + tuple(dilations)
    N, C, H, W = xs
    CG, MG, KH, KW = ws
    M = MG * node.op.group
    return (N, C, H, W), (M, C // node.op.group, MG, KH, KW), tuple(int(o) for o in out), strides, dilations, \
        tuple(int(b) for b in begins)


def _tap(o, pad: int, k, d: int, s: int, size: int):
    """(input index is exact and inside, that index clamped) for output ``o`` and tap ``k``."""
    t = op("sub", op("add", o, Const(pad, INDEX)), op("mul", k, Const(d, INDEX)))
    inside = op("and", op("ge", t, Const(0, INDEX)), op("lt", t, Const(s * size, INDEX)))
    if s > 1:
        inside = op("and", inside, op("eq", op("rem", op("max", t, Const(0, INDEX)), Const(s, INDEX)),
                                      Const(0, INDEX)))
    i = op("div", op("max", t, Const(0, INDEX)), Const(s, INDEX)) if s > 1 else op("max", t, Const(0, INDEX))
    return inside, op("min", i, Const(size - 1, INDEX))


class ConvTranspose(FormLowering):
    ops = (cv.ConvTranspose,)

    def emit(self, k, group: KernelGroup, epilogue=None) -> bool:
        """The kernel (see the module docstring); as an epilogue group's anchor (``epilogue.py``) the
        chain after it is not taken inside (False: the chain runs over the result in place)."""
        n = group.node
        (N, C, H, W), (M, CG, MG, KH, KW), _, _, _, _ = _geometry(n)
        G = n.op.group
        if n.outputs[0].type.dtype is not DType.f32 or N * G > MAX_GEMMS:
            super().emit(k, group)
            return False
        kn, P = KH * KW, H * W
        cols = k.scratch(N * M * kn * P * 4)
        xp, w = k.ptr(n.inputs[0]), n.inputs[1]
        if w.const is not None:  # constant weights: each group's A packed when compiling
            wc = np.asarray(w.const, np.float32).reshape(G, CG, MG * kn)
            packed = [k.weight(k.services.pack_a(np.ascontiguousarray(wc[g].T))) for g in range(G)]
        else:
            wp = k.ptr(w)
        for img in range(N):
            for g in range(G):  # cols[img, g] (MG*kn x P) = W[g] (CG x MG*kn, transposed) x[img, g] (CG x P)
                a, ta, lda = (packed[g], 2, CG) if w.const is not None else (k.at(wp, g * CG * MG * kn), 1, MG * kn)
                call_sgemm(k, ta, 0, MG * kn, P, CG, 1.0, a, lda,
                           k.at(xp, (img * C + g * CG) * P), P, 0.0, k.at(cols, (img * G + g) * MG * kn * P), P)
        k.note(f"{N * G} GEMM(s) of {MG * kn}x{P}x{CG} into a column matrix, then its taps gathered")
        print_llvm(k, col2im_form(group, f"{k.name}.col2im", cols))
        return False

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason(list(n.inputs) + [n.outputs[0]], allowed=(DType.f32, DType.f64))
        if why:
            return why
        if n.inputs[0].type.rank not in (3, 4):
            return f"only 1-D and 2-D transposed convolutions are lowered, not {n.inputs[0].type.rank - 2}-D"
        if n.inputs[0].type.numel == 0 or n.outputs[0].type.numel == 0 or n.inputs[1].type.numel == 0:
            return "empty tensors are left to the interpreter"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, w = n.inputs[0], n.inputs[1]
        bias = n.inputs[2] if len(n.inputs) > 2 else None
        y = n.outputs[0]
        (N, C, H, W), (M, CG, MG, KH, KW), (OH, OW), (sh, sw), (dh, dw), (ph, pw) = _geometry(n)
        dt = y.type.dtype
        kf = KernelForm(name)
        xb = kf.buffer("x", dt, (N, C, H, W), value=x)
        wb = kf.buffer("w", dt, (C, MG, KH, KW), value=w)
        bb = kf.buffer("b", dt, (M,), value=bias) if bias is not None else None
        yb = kf.buffer("y", dt, (N, M, OH, OW), "inout", value=y)  # rows accumulate in place
        kf.note(f"ConvTranspose {KH}x{KW}, stride {sh}x{sw}, {n.op.group} group(s): a gather per output row")
        zero = Const(0.0, dt)
        with kf.loop(N * M, "parallel", grain=par_grain(OH * OW * CG * KH * KW), name="nm") as nm:
            img = kf.let(op("div", nm, Const(M, INDEX)), name="img")
            co = kf.let(op("rem", nm, Const(M, INDEX)), name="co")
            m = kf.let(op("rem", co, Const(MG, INDEX)), name="m")
            c0 = kf.let(op("mul", op("div", co, Const(MG, INDEX)), Const(CG, INDEX)), name="c0")
            with kf.loop(OH, name="oh") as oh:
                with kf.loop(OW, "vector", name="ow") as ow:
                    kf.store(yb, (img, co, oh, ow), bb[co] if bb is not None else zero)
                with kf.loop(CG, name="ci") as ci, kf.loop(KH, name="r") as r:
                    ok_h, ih = _tap(oh, ph, r, dh, sh, H)
                    ok_h, ih = kf.let(ok_h, name="okh"), kf.let(ih, name="ih")
                    c = kf.let(op("add", c0, ci), name="c")
                    with kf.loop(KW, name="s") as s:
                        wv = kf.let(wb[c, m, r, s], name="wv")
                        with kf.loop(OW, "vector", name="ow") as ow:
                            ok_w, iw = _tap(ow, pw, s, dw, sw, W)
                            v = select(op("and", ok_h, ok_w), op("mul", xb[img, c, ih, iw], wv), zero)
                            kf.store(yb, (img, co, oh, ow), op("add", yb[img, co, oh, ow], v))
        return kf.finish()


def _phases(out: int, size: int, s: int, d: int, pad: int, k: int) -> list[tuple[int, list]]:
    """Per phase ``p`` of an output axis (outputs ``p + s * q``): the taps landing there, each as
    (tap, input offset, first q, end q): output ``p + s * q`` takes input ``offset + q`` through the
    tap for q in [first, end) (the input inside). All known when compiling: no test at run time."""
    phases = []
    for p in range(min(s, out)):
        nq = -(-(out - p) // s)
        taps = []
        for r in range(k):
            t = p + pad - r * d
            if t % s:
                continue
            off = t // s
            lo, hi = max(0, -off), min(nq, size - off)
            if lo < hi:
                taps.append((r, off, lo, hi))
        phases.append((p, taps))
    return phases


def col2im_form(group: KernelGroup, name: str, cols) -> Kernel:
    """``y[img, co, oh, ow] = bias[co] + sum over the taps (r, s) landing on (oh, ow) of
    cols[img, co, r, s, ih, iw]`` (``cols`` bound to the column matrix: see the module docstring).
    The outputs are taken phase by phase along each axis (``_phases``), so each tap's loop runs over
    exactly the outputs it reaches: no division, no test, no wasted tap."""
    n = group.node
    bias = n.inputs[2] if len(n.inputs) > 2 else None
    y = n.outputs[0]
    (N, C, H, W), (M, CG, MG, KH, KW), (OH, OW), (sh, sw), (dh, dw), (ph, pw) = _geometry(n)
    rows, columns = _phases(OH, H, sh, dh, ph, KH), _phases(OW, W, sw, dw, pw, KW)
    kf = KernelForm(name)
    cb = kf.buffer("cols", DType.f32, (N, M, KH, KW, H, W), value=cols)
    bb = kf.buffer("b", DType.f32, (M,), value=bias) if bias is not None else None
    yb = kf.buffer("y", DType.f32, (N, M, OH, OW), "inout", value=y)
    i64 = lambda v: Const(v, INDEX)  # noqa: E731
    with kf.loop(N * M, "parallel", grain=par_grain(OH * OW * KH * KW), name="nm") as nm:
        img = kf.let(op("div", nm, i64(M)), name="img")
        co = kf.let(op("rem", nm, i64(M)), name="co")
        with kf.loop(OH, name="oh") as oh, kf.loop(OW, "vector", name="ow") as ow:
            kf.store(yb, (img, co, oh, ow), bb[co] if bb is not None else Const(0.0, DType.f32))
        for p, taps in rows:
            for r, off, lo, hi in taps:
                with kf.loop(hi - lo, name="qh") as qh:
                    q = op("add", qh, i64(lo))
                    oh = kf.let(op("add", op("mul", q, i64(sh)), i64(p)), name="oh")
                    ih = kf.let(op("add", q, i64(off)), name="ih")
                    for pc, ctaps in columns:
                        for s_, offc, loc, hic in ctaps:
                            with kf.loop(hic - loc, "vector", name="qw") as qw:
                                qc = op("add", qw, i64(loc))
                                ow = op("add", op("mul", qc, i64(sw)), i64(pc))
                                at = (img, co, oh, ow)
                                kf.store(yb, at, op("add", yb[at], cb[img, co, i64(r), i64(s_), ih,
                                                                     op("add", qc, i64(offc))]))
    return kf.finish()


__all__ = ["ConvTranspose", "col2im_form"]
