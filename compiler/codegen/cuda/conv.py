"""Window kernels for the GPU on the loop form: the column matrix of an implicit-GEMM convolution, a
direct convolution for grouped and depthwise ones (2-D, NCHW, float32, any pads, strides, dilations),
and pooling.

Both kernels put one GPU thread on each element they write (one flat parallel loop, decomposed into
the axes by constant division), so consecutive threads touch consecutive columns. Taps outside the
image read a clamped element and drop it with a ``select`` (no read is ever out of bounds).

* ``im2col_form``: ``cols[img, (c, r, s), (oh, ow)]`` = the input under tap ``(r, s)`` of channel ``c``
  for output pixel ``(oh, ow)``: per image a K x P matrix (K = C * KH * KW, P = OH * OW) that the
  GEMM multiplies by the weights seen as an M x K matrix, writing the NCHW result directly.
* ``direct_form``: per output element, the sum over its group's input channels and the taps, plus
  the bias;
* ``pool_form``: MaxPool and AveragePool per output element (the CPU's pooling kernel splits only
  the planes among threads: a few dozen GPU threads).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...ir.ops import conv as cv
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, Const, op, select


@dataclass(frozen=True)
class Geometry:
    N: int
    C: int
    H: int
    W: int
    M: int
    CG: int
    KH: int
    KW: int
    OH: int
    OW: int
    sh: int
    sw: int
    dh: int
    dw: int
    ph: int
    pw: int
    groups: int

    @property
    def K(self) -> int:
        return self.C * self.KH * self.KW

    @property
    def P(self) -> int:
        return self.OH * self.OW

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution with stride 1 and no padding: the image itself is the column matrix."""
        return (self.KH, self.KW, self.sh, self.sw, self.ph, self.pw) == (1, 1, 1, 1, 0, 0) and \
            (self.OH, self.OW) == (self.H, self.W)


def geometry(node) -> Geometry:
    """The geometry of a 2-D Conv node with static shapes."""
    conv = node.op
    x, w = node.inputs[0], node.inputs[1]
    strides, dilations, pads = cv.spatial_attrs(conv, 2, conv.strides, conv.dilations, conv.pads)
    out, pb, _ = cv.resolve_geometry(conv, [int(d) for d in x.shape[2:]], [int(d) for d in w.shape[2:]],
                                     strides, dilations, pads, conv.auto_pad)
    N, C, H, W = (int(d) for d in x.shape)
    M, CG, KH, KW = (int(d) for d in w.shape)
    return Geometry(N, C, H, W, M, CG, KH, KW, int(out[0]), int(out[1]), strides[0], strides[1], dilations[0],
                    dilations[1], int(pb[0]), int(pb[1]), conv.group)


def _split(kf: KernelForm, i, sizes: list[tuple[str, int]]) -> dict:
    """The flat index ``i`` decomposed into named axes (innermost last), each a ``let``."""
    out = {}
    rest = i
    for name, size in reversed(sizes[1:]):
        out[name] = kf.let(op("rem", rest, Const(size, INDEX)), name=name)
        rest = kf.let(op("div", rest, Const(size, INDEX)), name=f"{name}_rest")
    out[sizes[0][0]] = rest
    return out


def _tap(kf: KernelForm, g: Geometry, oh, ow, r, s):
    """(the tap is inside the image, its row clamped, its column clamped)."""
    ih = op("add", op("sub", op("mul", oh, Const(g.sh, INDEX)), Const(g.ph, INDEX)), op("mul", r, Const(g.dh, INDEX)))
    iw = op("add", op("sub", op("mul", ow, Const(g.sw, INDEX)), Const(g.pw, INDEX)), op("mul", s, Const(g.dw, INDEX)))
    ih, iw = kf.let(ih, name="ih"), kf.let(iw, name="iw")
    ok = op("and", op("and", op("ge", ih, Const(0, INDEX)), op("lt", ih, Const(g.H, INDEX))),
            op("and", op("ge", iw, Const(0, INDEX)), op("lt", iw, Const(g.W, INDEX))))
    clamp = lambda v, hi: op("min", op("max", v, Const(0, INDEX)), Const(hi - 1, INDEX))  # noqa: E731
    return ok, clamp(ih, g.H), clamp(iw, g.W)


def im2col_form(g: Geometry, name: str, x, cols) -> Kernel:
    """``cols`` (bound to ``cols``: N * K * P floats) from the image ``x`` (bound to ``x``)."""
    kf = KernelForm(name)
    xb = kf.buffer("x", DType.f32, (g.N, g.C, g.H, g.W), value=x)
    cb = kf.buffer("cols", DType.f32, (g.N, g.C, g.KH, g.KW, g.OH, g.OW), "out", value=cols)
    kf.note(f"im2col {g.KH}x{g.KW}: a {g.K} x {g.P} column matrix per image")
    with kf.loop(g.N * g.K * g.P, "parallel") as i:
        a = _split(kf, i, [("img", g.N), ("c", g.C), ("r", g.KH), ("s", g.KW), ("oh", g.OH), ("ow", g.OW)])
        ok, ih, iw = _tap(kf, g, a["oh"], a["ow"], a["r"], a["s"])
        kf.store(cb, (a["img"], a["c"], a["r"], a["s"], a["oh"], a["ow"]),
                 select(ok, xb[a["img"], a["c"], ih, iw], Const(0.0, DType.f32)))
    return kf.finish()


def direct_form(g: Geometry, name: str, x, w, y, bias=None) -> Kernel:
    """``y = conv(x, w) + bias``, one thread per output element (grouped and depthwise convolutions)."""
    kf = KernelForm(name)
    xb = kf.buffer("x", DType.f32, (g.N, g.C, g.H, g.W), value=x)
    wb = kf.buffer("w", DType.f32, (g.M, g.CG, g.KH, g.KW), value=w)
    bb = kf.buffer("b", DType.f32, (g.M,), value=bias) if bias is not None else None
    yb = kf.buffer("y", DType.f32, (g.N, g.M, g.OH, g.OW), "out", value=y)
    kf.note(f"direct {g.KH}x{g.KW} convolution, {g.groups} group(s), a thread per output element")
    mg = g.M // g.groups
    with kf.loop(g.N * g.M * g.P, "parallel") as i:
        a = _split(kf, i, [("img", g.N), ("co", g.M), ("oh", g.OH), ("ow", g.OW)])
        c0 = kf.let(op("mul", op("div", a["co"], Const(mg, INDEX)), Const(g.CG, INDEX)), name="c0")
        acc = kf.acc(Const(0.0, DType.f32) if bb is None else bb[a["co"]])
        with kf.loop(g.CG, name="ci") as ci, kf.loop(g.KH, name="r") as r, kf.loop(g.KW, name="s") as s:
            ok, ih, iw = _tap(kf, g, a["oh"], a["ow"], r, s)
            xv = select(ok, xb[a["img"], op("add", c0, ci), ih, iw], Const(0.0, DType.f32))
            kf.update(acc, "add", op("mul", xv, wb[a["co"], ci, r, s]))
        kf.store(yb, (a["img"], a["co"], a["oh"], a["ow"]), acc)
    return kf.finish()




def pool_form(node, name: str) -> Kernel:
    """MaxPool or AveragePool (1-D or 2-D, float32), one thread per output element: the window's taps
    inside the input (MaxPool: their maximum, NaN if any is; AveragePool: their sum over the taps
    counted, the padding too with ``count_include_pad``)."""
    from ...ir.ops import pool as P
    from ..kernels.pool import pool_geometry

    x, y = node.inputs[0], node.outputs[0]
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw, peh, pew = pool_geometry(node)
    N, C = int(x.shape[0]), int(x.shape[1])
    is_max = isinstance(node.op, P.MaxPool)
    include_pad = not is_max and bool(getattr(node.op, "count_include_pad", 0))
    kf = KernelForm(name)
    xb = kf.buffer("x", DType.f32, (N, C, H, W), value=x)
    yb = kf.buffer("y", DType.f32, (N, C, OH, OW), "out", value=y)
    kf.note(f"{node.op.name} {KH}x{KW}, a thread per output element")
    g = Geometry(N, C, H, W, C, 1, KH, KW, OH, OW, sh, sw, dh, dw, ph, pw, 1)
    f32 = lambda v: Const(v, DType.f32)  # noqa: E731
    with kf.loop(N * C * OH * OW, "parallel") as i:
        a = _split(kf, i, [("nc", N * C), ("oh", OH), ("ow", OW)])
        acc = kf.acc(f32(-math.inf) if is_max else f32(0.0))
        count = None if is_max else kf.acc(f32(0.0), name="count")
        with kf.loop(KH, name="r") as r, kf.loop(KW, name="s") as s:
            ok, ih, iw = _tap(kf, g, a["oh"], a["ow"], r, s)
            v = xb[op("div", a["nc"], Const(C, INDEX)), op("rem", a["nc"], Const(C, INDEX)), ih, iw]
            if is_max:
                kf.update(acc, "max", select(ok, v, f32(-math.inf)))
            else:
                kf.update(acc, "add", select(ok, v, f32(0.0)))
                if include_pad:  # the taps inside the padded input count
                    i_h = op("add", op("sub", op("mul", a["oh"], Const(sh, INDEX)), Const(ph, INDEX)),
                             op("mul", r, Const(dh, INDEX)))
                    i_w = op("add", op("sub", op("mul", a["ow"], Const(sw, INDEX)), Const(pw, INDEX)),
                             op("mul", s, Const(dw, INDEX)))
                    ok = op("and", op("and", op("ge", i_h, Const(-ph, INDEX)), op("lt", i_h, Const(H + peh, INDEX))),
                            op("and", op("ge", i_w, Const(-pw, INDEX)), op("lt", i_w, Const(W + pew, INDEX))))
                kf.update(count, "add", select(ok, f32(1.0), f32(0.0)))
        kf.store(yb, (op("div", a["nc"], Const(C, INDEX)), op("rem", a["nc"], Const(C, INDEX)), a["oh"], a["ow"]),
                 acc if is_max else op("div", acc, op("max", count, f32(1.0))))
    return kf.finish()


__all__ = ["Geometry", "direct_form", "geometry", "im2col_form", "pool_form"]
