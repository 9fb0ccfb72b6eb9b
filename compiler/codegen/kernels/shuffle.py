"""A channel shuffle read in place by the depthwise convolution after it.

ShuffleNet mixes its groups' channels with ``Reshape([N, g, C/g, H, W])``, ``Transpose([0, 2, 1, 3,
4])`` and ``Reshape([N, C, H, W])``, and a depthwise Conv reads the result. The Transpose moves whole
``H x W`` planes: channel ``c`` of its result is plane ``(c % g) * C/g + c // g`` of its input. The
fusion pass groups the Transpose, the Reshape after it and the depthwise Conv (``kiln.Kernel`` of
kind ``shuffle``, ``fuse.py``; the Reshape before it is a view), and this lowering runs the
depthwise conv with each input plane taken from a compile-time table instead of copying the
shuffled tensor. Any Transpose (with Reshapes around it) qualifies whose effect on the flat buffer
is a permutation of whole planes of the conv's input: the table is computed with NumPy, which also
checks it.
"""
from __future__ import annotations

import math

import numpy as np

from ...ir.ops import conv as cv
from ...ir.ops import shape as sh
from .base import KernelBuilder, KernelGroup, Lowering, dtype_reason
from .conv import Conv, _geometry

#: the largest tensor (elements) whose plane table is worked out at compile time
MAX_ELEMENTS = 1 << 24


def plane_table(in_shape, perm, plane: int) -> list[int] | str:
    """For each ``plane``-long plane of ``transpose(x, perm)`` read flat (x of ``in_shape``), the plane
    of ``x`` it is; or why it is not a permutation of whole planes."""
    n = math.prod(in_shape)
    if n > MAX_ELEMENTS:
        return f"more than {MAX_ELEMENTS} elements"
    idx = np.arange(n, dtype=np.int64).reshape(in_shape).transpose(perm).reshape(-1, plane)
    first = idx[:, :1]
    if np.any(first % plane) or np.any(idx != first + np.arange(plane)):
        return "the Transpose does not move whole planes of the convolution's input"
    return [int(v) for v in first[:, 0] // plane]


def _table(t, x):
    """The plane table of Transpose node ``t`` read as the conv input ``x`` (NCHW)."""
    src = t.inputs[0]
    return plane_table(tuple(int(d) for d in src.shape), t.op._perm(len(src.shape)), int(x.shape[2]) * int(x.shape[3]))


class ShuffledDepthwise(Lowering):
    ops = (sh.Transpose, sh.Reshape, cv.Conv)

    @staticmethod
    def _parts(group: KernelGroup):
        if [type(n.op) for n in group.nodes] != [sh.Transpose, sh.Reshape, cv.Conv]:
            return "a shuffle group is a Transpose, a Reshape and a depthwise Conv"
        t, r, conv = group.nodes
        if r.inputs[0] is not t.outputs[0] or conv.inputs[0] is not r.outputs[0]:
            return "the Conv does not read the Transpose through the Reshape"
        return t, conv

    def check(self, group: KernelGroup) -> str | None:
        parts = self._parts(group)
        if isinstance(parts, str):
            return parts
        t, conv = parts
        why = Conv().check(KernelGroup.of([conv])) or dtype_reason([t.inputs[0]])
        if why:
            return why
        x = conv.inputs[0]
        c, g = int(x.shape[1]), int(conv.op.group)
        if len(x.shape) != 4 or g != c or g == 1:
            return "the Conv is not a 2-D depthwise convolution"
        table = _table(t, x)
        return table if isinstance(table, str) else None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        t, conv = self._parts(group)
        x = conv.inputs[0]
        src = t.inputs[0]
        table = _table(t, x)
        w = conv.inputs[1]
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        n, c, h, wd, m, kh, kw, oh, ow, (sh_, sw), (dh, dw), (pt, pl) = _geometry(conv)
        Conv()._depthwise(k, src, w, bias, conv.outputs[0], n, c, h, wd, m // c, kh, kw, oh, ow, sh_, sw, dh, dw,
                          pt, pl, planes_of=table)
        k.note("depthwise: direct loop on padded planes; the channel shuffle read in place (a plane table)")


__all__ = ["ShuffledDepthwise", "plane_table"]
