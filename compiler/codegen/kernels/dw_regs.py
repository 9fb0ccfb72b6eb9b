"""Small depthwise planes computed in registers (the flat form of ``conv.py``'s depthwise lowering,
without its scratch planes).

The flat form pads the input plane into scratch, reads each tap as a shifted vector of it, writes
the output vectors (``rs`` apart per row) to a second scratch and compacts their rows into Y. On a
7x7 or 14x14 plane every one of those reads follows stores of other widths to the same bytes (a
padded row is a few scalar stores; the compaction reads parts of vector stores), which the CPU
cannot forward: each read waits for the stores to retire. Here the same vectors never touch
memory: the input plane is loaded as whole vectors, each vector of the padded plane is a shuffle of
the (at most a few) input vectors its elements come from, with zeros for the padding, each tap's
shifted vector a shuffle of two consecutive padded vectors (``valignd`` on x86), and each vector of
Y a shuffle of the output vectors. All index maps are compile-time constants.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..gemm.irbuild import _declare
from .base import F32, I32, KernelBuilder, PTR, VOID, c64

#: a flat depthwise plane is computed in registers when its output spans at most
#: ``DW_REG_OUTPUTS`` vectors and its padded plane at most ``DW_REG_VECTORS``. Measured on a Zen 4
#: (one thread, 3x3 + ReLU6, against the scratch form): AVX-512 7x7 2.0x, 14x14 1.2-1.3x, 14x14/2
#: 1.9x, 28x28/2 (14 outputs, 57 padded) 1.1x, 28x28 (53 outputs) 0.87x; AVX2 (code for a Zen 3)
#: 7x7 1.6x, 14x14/2 1.6x, 14x14 (28 outputs, 33 padded) 0.8-0.9x: each tap's shift is one
#: ``valignd`` with AVX-512 but two or three instructions with AVX2, so the register form pays
#: where a plane's fixed costs (its scratch round trips) outweigh its taps
DW_REG_OUTPUTS = 16
DW_REG_VECTORS = 64


def padded_vectors(taps, nvec: int, lanes: int) -> int:
    """Vectors of the padded plane that the flat form's ``nvec`` output vectors read through
    ``taps`` (element offsets into it)."""
    top = max(v * lanes + off for v in range(nvec) for off in taps)
    return top // lanes + (2 if top % lanes else 1)


def padded_sources(h: int, wd: int, hq: int, wq: int, pt: int, pl: int, sw: int, rph: int,
                   size: int) -> np.ndarray:
    """For each of the first ``size`` elements of the flat form's padded plane (laid out as
    ``im2col.pad_plane`` makes it: ``rph`` row phases of ``sw`` column phases of ``hq x wq``), the
    input element it holds (an index into the ``h x wd`` plane), or -1 (padding, or past the
    plane)."""
    idx = np.full(size, -1, np.int64)
    for r in range(rph):
        for ph in range(sw):
            base = (r * sw + ph) * hq * wq
            for rq in range(hq):
                ih = rq * rph + r - pt
                if not 0 <= ih < h:
                    continue
                for cq in range(wq):
                    iw = cq * sw + ph - pl
                    if 0 <= iw < wd and base + rq * wq + cq < size:
                        idx[base + rq * wq + cq] = ih * wd + iw
    return idx


def _gather(b: ir.IRBuilder, vectors, idx, lanes: int):
    """The vector whose lane t is element ``idx[t]`` of the concatenated ``vectors(s)`` (each
    ``lanes`` wide), 0.0 where ``idx[t]`` < 0: one two-source shuffle per source vector, starting
    from zeros (LLVM merges them into permutes with zeroing)."""
    vt, mt = ir.VectorType(F32, lanes), ir.VectorType(I32, lanes)
    acc = ir.Constant(vt, [0.0] * lanes)
    srcs = sorted({int(i) // lanes for i in idx if i >= 0})
    if len(srcs) == 1 and all(i == srcs[0] * lanes + t for t, i in enumerate(idx)):
        return vectors(srcs[0])
    for s in srcs:
        mask = [lanes + int(i) % lanes if i >= 0 and i // lanes == s else t for t, i in enumerate(idx)]
        acc = b.shuffle_vector(acc, vectors(s), ir.Constant(mt, mask))
    return acc


def _masked(k: KernelBuilder, lanes: int, store: bool, et: ir.Type = F32):
    vt, mt = ir.VectorType(et, lanes), ir.VectorType(ir.IntType(1), lanes)
    name = f"llvm.masked.{'store' if store else 'load'}.v{lanes}{'f32' if et == F32 else 'i%d' % et.width}.p0"
    args = [vt, PTR, I32, mt] if store else [PTR, I32, mt, vt]
    return _declare(k.module, name, VOID if store else vt, args), mt


class RegisterPlane:
    """One depthwise plane's padded vectors, built in registers from the input plane at ``xin``
    (``h x wd`` float32): ``build`` once per plane, then ``compute`` per output channel of it."""

    def __init__(self, k: KernelBuilder, h, wd, hq, wq, pt, pl, sw, rph, taps, nvec, oh, ow, rs, lanes):
        self.k, self.taps, self.nvec, self.oh, self.ow, self.rs, self.lanes = k, taps, nvec, oh, ow, rs, lanes
        self.n = h * wd
        self.npv = padded_vectors(taps, nvec, lanes)
        self.idx = padded_sources(h, wd, hq, wq, pt, pl, sw, rph, self.npv * lanes)

    def build(self, xin, xt: ir.Type = F32, convert=None) -> None:
        """The padded vectors from the plane at ``xin``: float32, or elements of type ``xt`` that
        ``convert(b, vector)`` turns into a vector of floats (a dequantization: the padding stays 0.0)."""
        k, b, lanes = self.k, self.k.b, self.lanes
        vt = ir.VectorType(xt, lanes)
        mload, mt = _masked(k, lanes, store=False, et=xt)
        align = 4 if xt == F32 else 1
        loaded = {}

        def x(j):  # input vector j (its elements past the plane masked off)
            if j not in loaded:
                ptr = k.at(xin, c64(j * lanes), xt)
                tail = self.n - j * lanes
                if tail >= lanes:
                    v = b.load(ptr, typ=vt, align=align)
                else:
                    mask = ir.Constant(mt, [t < tail for t in range(lanes)])
                    v = b.call(mload, [ptr, ir.Constant(I32, align), mask, ir.Constant(vt, ir.Undefined)])
                loaded[j] = v if convert is None else convert(b, v)
            return loaded[j]

        self.padded = [_gather(b, x, self.idx[j * lanes:(j + 1) * lanes], lanes) for j in range(self.npv)]

    def compute(self, ws, acc0, fma, yout) -> None:
        """Y's plane at ``yout`` (``oh x ow``): ``acc0`` (the bias vector) plus each tap's shifted
        padded vector times its weight vector in ``ws``."""
        k, b, lanes, P = self.k, self.k.b, self.lanes, self.padded
        mt = ir.VectorType(I32, lanes)
        out = []
        for v in range(self.nvec):
            acc = acc0
            for tt, off in enumerate(self.taps):
                j, s = divmod(v * lanes + off, lanes)
                val = P[j] if s == 0 else b.shuffle_vector(P[j], P[j + 1], ir.Constant(mt, list(range(s, s + lanes))))
                acc = b.call(fma, [ws[tt], val, acc])
            out.append(acc)
        mstore, m1 = _masked(k, lanes, store=True)
        p = self.oh * self.ow
        for o in range(-(-p // lanes)):
            qs = range(o * lanes, min(p, (o + 1) * lanes))
            idx = [(q // self.ow) * self.rs + q % self.ow for q in qs] + [-1] * (lanes - len(qs))
            yv = _gather(b, out.__getitem__, idx, lanes)
            ptr = k.at(yout, c64(o * lanes))
            if len(qs) == lanes:
                b.store(yv, ptr, align=4)
            else:
                mask = ir.Constant(m1, [t < len(qs) for t in range(lanes)])
                b.call(mstore, [yv, ptr, ir.Constant(I32, 4), mask])
