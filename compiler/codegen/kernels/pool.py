"""Pooling in float32: MaxPool and AveragePool (1-D and 2-D, NCHW), GlobalAveragePool, GlobalMaxPool.

**Windowed pools.** Every shape is static, so the window geometry (``auto_pad``, pads, strides,
dilations, ``ceil_mode``; the op's own ``resolve_geometry``) is worked out at compile time. Per output
row the kernel loops over the kernel rows ``kh`` whose input row is inside the image (a run-time
test), and for each one runs

* an *interior* loop over the output columns whose whole window row lies inside the input, the
  ``kw`` taps unrolled in its body: ``y[ow] = op(...op(op(y[ow], x[ow*s - p]), x[ow*s + d - p])...)``,
  contiguous in ``ow`` (stride ``s`` in x), which LLVM vectorizes;
* per tap ``kw``, short *border* loops over the columns at the edges where only some taps are inside
  (their ranges are compile-time constants).

The output row itself is the accumulator (it stays in L1). Taps are applied in the reference's order
(kernel rows, then columns), so AveragePool's sums are the reference's bits; the divisor is a
compile-time table of per-output counts (``count_include_pad`` either way; ceil_mode's extension past
the pads never counts), divided (not multiplied by a reciprocal) as the reference does: a window with
no tap inside the input gives 0/0 = NaN there too. MaxPool starts from -inf (padding never wins)
and propagates NaN like ``np.maximum``.

Refused: other element types, MaxPool's Indices output, 3-D pools, kernels wider than 64.

**Global pools** reduce each (n, c) plane with ``reduce_row`` (vector accumulators; see reduce.py).

**Threads.** Windowed pools split the output rows of all planes among the kernel's threads, global
pools the planes (``par_loop``: only kernels of 2 * ``PAR_MIN_WORK`` elements of work or more); each
output is computed as on one thread, so results do not depend on the thread count.
"""
from __future__ import annotations

import math

import numpy as np

from ...ir.ops import pool as P
from ...ir.ops.conv import resolve_geometry
from ..llvm.elementwise import fmax
from .base import KernelBuilder, KernelGroup, Lowering, c64, cf32, dtype_reason, unary_f32_reason
from .reduce import fadd, map_row, par_loop, reduce_row, vload, vstore

MAX_KW = 64


def pool_geometry(node):
    """(H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw, pe_h, pe_w) of a 1-D or 2-D pool (1-D as H = 1)."""
    op, x = node.op, node.inputs[0]
    nd = len(op.kernel_shape)
    sizes = [int(d) for d in x.shape[2:]]
    strides, dilations, pads = op._attrs(x.type.rank)
    out, pb, pe = resolve_geometry(op, sizes, op.kernel_shape, strides, dilations, pads, op.auto_pad,
                                   bool(op.ceil_mode))
    ks = list(op.kernel_shape)
    if nd == 1:
        return (1, sizes[0], 1, out[0], 1, ks[0], 1, strides[0], 1, dilations[0], 0, pb[0], 0, pe[0])
    return (sizes[0], sizes[1], out[0], out[1], ks[0], ks[1], strides[0], strides[1], dilations[0],
            dilations[1], pb[0], pb[1], pe[0], pe[1])


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class Pool(Lowering):
    """MaxPool (Y only) and AveragePool, float32, 1-D or 2-D."""

    ops = (P.MaxPool, P.AveragePool)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason([n.inputs[0], n.outputs[0]])
        if why:
            return why
        if isinstance(n.op, P.MaxPool) and len(n.outputs) > 1 and n.outputs[1].uses:
            return "MaxPool's Indices output is not computed natively"
        nd = len(n.op.kernel_shape)
        if nd not in (1, 2):
            return f"{nd}-D pooling is not lowered natively (only 1-D and 2-D)"
        if n.inputs[0].type.rank != nd + 2:
            return "the input's rank does not match kernel_shape"
        if n.op.kernel_shape[-1] > MAX_KW:
            return f"pooling windows wider than {MAX_KW} are left to the interpreter"
        if n.inputs[0].type.numel == 0 or n.outputs[0].type.numel == 0:
            return "empty tensors are left to the interpreter"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        node = group.node
        x, y = node.inputs[0], node.outputs[0]
        H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw, peh, pew = pool_geometry(node)
        is_max = isinstance(node.op, P.MaxPool)
        ident, comb = (-math.inf, fmax) if is_max else (0.0, fadd)
        NC = int(x.shape[0]) * int(x.shape[1])
        counts = None
        if not is_max:
            counts = P._tap_counts((H, W), (ph, pw), (peh, pew), (OH, OW), (KH, KW), (sh, sw), (dh, dw),
                                   bool(node.op.count_include_pad))
            counts = np.ascontiguousarray(counts.astype(np.float32).reshape(-1))
        # column ranges of each tap kw: ow with 0 <= ow*sw + kw*dw - pw < W
        lo = [min(OW, max(0, _ceil(pw - kw * dw, sw))) for kw in range(KW)]
        hi = [min(OW, max(0, _ceil(W + pw - kw * dw, sw))) for kw in range(KW)]
        a = max(lo)
        e = max(a, min(hi))  # interior: [a, e)

        # the output rows of all planes are independent: split among the threads
        with par_loop(k, NC * OH, OW * KH * KW + OW, "row") as row:
            b = k.b
            xp, yp = k.ptr(x), k.ptr(y)
            cnt = None if counts is None else k.weight(counts)
            nc, oh = b.udiv(row, c64(OH)), b.urem(row, c64(OH))
            xplane = b.mul(nc, c64(H * W))
            yrow = b.mul(row, c64(OW))
            map_row(k, OW, lambda i: vstore(k, cf32(ident), yp, b.add(yrow, i)), "init")
            ih0 = b.sub(b.mul(oh, c64(sh)), c64(ph))
            with k.loop(KH, "kh") as kh:
                ih = b.add(ih0, b.mul(kh, c64(dh)))
                with k.f.if_(b.icmp_unsigned("<", ih, c64(H)), "inside"):
                    xrow = b.add(xplane, b.mul(ih, c64(W)))

                    def interior(j):
                        ow = b.add(j, c64(a))
                        yi = b.add(yrow, ow)
                        xi = b.add(xrow, b.mul(ow, c64(sw)))
                        acc = vload(k, yp, yi)
                        for kw in range(KW):
                            acc = comb(b, acc, vload(k, xp, b.add(xi, c64(kw * dw - pw))))
                        vstore(k, acc, yp, yi)

                    if e > a:
                        map_row(k, e - a, interior, "ow")
                    for kw in range(KW):
                        for start, stop in ((lo[kw], min(hi[kw], a)), (max(lo[kw], e), hi[kw])):
                            if stop <= start:
                                continue

                            def border(j, start=start, kw=kw):
                                ow = b.add(j, c64(start))
                                yi = b.add(yrow, ow)
                                xi = b.add(xrow, b.add(b.mul(ow, c64(sw)), c64(kw * dw - pw)))
                                vstore(k, comb(b, vload(k, yp, yi), vload(k, xp, xi)), yp, yi)

                            map_row(k, stop - start, border, "edge")
            if cnt is not None:
                crow = b.mul(oh, c64(OW))
                map_row(k, OW, lambda i: vstore(k, b.fdiv(vload(k, yp, b.add(yrow, i)),
                                                           vload(k, cnt, b.add(crow, i))),
                                                yp, b.add(yrow, i)), "avg")


class GlobalPool(Lowering):
    """GlobalAveragePool and GlobalMaxPool, float32, any rank >= 3."""

    ops = (P.GlobalAveragePool, P.GlobalMaxPool)

    def check(self, group: KernelGroup) -> str | None:
        why = unary_f32_reason(group)
        if why:
            return why
        n = group.node
        if isinstance(n.op, P.GlobalAveragePool) and math.prod(n.inputs[0].shape[2:]) >= 1 << 24:
            return "averages over 2^24 or more elements (the count is not exact in float32)"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        node = group.node
        x, y = node.inputs[0], node.outputs[0]
        S = math.prod(int(d) for d in x.shape[2:])
        NC = int(x.shape[0]) * int(x.shape[1])
        avg = isinstance(node.op, P.GlobalAveragePool)
        with par_loop(k, NC, S, "nc") as nc:  # planes split among the threads
            b = k.b
            xp, yp = k.ptr(x), k.ptr(y)
            base = b.mul(nc, c64(S))
            v = reduce_row(k, S, lambda i, w: vload(k, xp, b.add(base, i), w), "sum" if avg else "max")
            if avg:
                v = b.fdiv(v, cf32(float(S)))
            vstore(k, v, yp, nc)


__all__ = ["GlobalPool", "Pool", "pool_geometry"]
