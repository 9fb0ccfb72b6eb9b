"""RotaryEmbedding (ONNX opset 23) on the loop form, for float32, float16 and bfloat16.

X is read as ``[B, S, H, D]`` at strides (a 4-D ``[B, H, S, D]`` input through its permutation, a 3-D
``[B, S, H*D]`` one as it lies), and for each token the ``rot / 2`` pairs of each head are rotated::

    y1 = cos * x1 - sin * x2        y2 = sin * x1 + cos * x2

with pairs (x1, x2) the two halves of the first ``rot`` features, or adjacent features when
``interleaved``; the features past ``rot`` are copied. cos and sin are the token's row of the caches:
``cache[position_ids[b, s]]`` (each position checked against the cache's length, as the reference
does) or, with no position_ids, ``cache[b, s]``. Sums are in float32 (the reference's compute
type), rounded to X's type once. The tokens are split among the threads.
"""
from __future__ import annotations

from ...ir.ops import attention as at
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, Const, Expr, cast, compute_type, op
from .base import FormLowering, KernelGroup, dtype_reason, par_grain

#: elements of work a parallel task gets at least
PAR_MIN_WORK = 1 << 14
_FLOATS = (DType.f32, DType.f16, DType.bf16)


def _position(kf: KernelForm, raw: Expr, length: int) -> Expr:
    """A position read from ``position_ids``: reported when outside ``[0, length)`` (the reference
    raises; a negative one does not count from the end), clamped for the read."""
    v = kf.let(cast(raw, INDEX), "pos")
    kf.fail_if(op("or", op("lt", v, Const(0, INDEX)), op("ge", v, Const(length, INDEX))), v, length)
    return op("min", op("max", v, Const(0, INDEX)), Const(length - 1, INDEX))


def _bshd(shape, rank4: bool, heads: int | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(``[B, S, H, D]``, its element strides in the tensor) of X or Y."""
    if rank4:
        b, h, s, d = shape
        return (b, s, h, d), (h * s * d, d, s * d, 1)
    b, s, hidden = shape
    d = hidden // heads
    return (b, s, heads, d), (s * hidden, hidden, d, 1)


class Rotary(FormLowering):
    ops = (at.RotaryEmbedding,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, cos, sin = n.inputs[:3]
        pos = n.inputs[3] if len(n.inputs) > 3 else None
        return dtype_reason([x, cos, sin, n.outputs[0]], allowed=_FLOATS) or \
            dtype_reason([pos], allowed=(DType.i64,)) or self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, cos, sin = n.inputs[:3]
        pos = n.inputs[3] if len(n.inputs) > 3 else None
        y = n.outputs[0]
        rank4 = x.type.rank == 4
        shape, strides = _bshd([int(d) for d in x.shape], rank4, n.op.num_heads)
        B, S, H, D = shape
        rot = n.op.rotary_embedding_dim or D
        half = rot // 2
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, shape, strides=strides, value=x)
        yb = kf.buffer("y", y.type.dtype, shape, "out", strides=strides, value=y)
        cb = kf.buffer("cos", cos.type.dtype, [int(d) for d in cos.shape], value=cos)
        sb = kf.buffer("sin", sin.type.dtype, [int(d) for d in sin.shape], value=sin)
        pb = kf.buffer("position_ids", pos.type.dtype, [int(d) for d in pos.shape], value=pos) if pos is not None \
            else None
        work = compute_type(x.type.dtype)
        kf.note(f"RotaryEmbedding: {rot} of {D} features per head, "
                f"{'adjacent' if n.op.interleaved else 'half'} pairs, cos/sin "
                f"{'by position_ids' if pos is not None else 'per token'}")
        grain = par_grain(S * H * D, PAR_MIN_WORK)
        with kf.loop(B, "parallel", grain=grain, name="b") as b:
            with kf.loop(S, "serial", name="s") as s:
                row = (_position(kf, pb[b, s], int(cos.shape[0])),) if pb is not None else (b, s)
                with kf.loop(H, "serial", name="h") as h:
                    with kf.loop(half, "vector", name="i") as i:
                        c = kf.let(cast(cb[row + (i,)], work), "c")
                        sn = kf.let(cast(sb[row + (i,)], work), "sn")
                        j1, j2 = (2 * i, 2 * i + 1) if n.op.interleaved else (i, i + half)
                        x1 = kf.let(cast(xb[b, s, h, j1], work), "x1")
                        x2 = kf.let(cast(xb[b, s, h, j2], work), "x2")
                        kf.store(yb, (b, s, h, j1), c * x1 - sn * x2)
                        kf.store(yb, (b, s, h, j2), sn * x1 + c * x2)
                    if rot < D:
                        with kf.loop(D - rot, "vector", name="p") as p:
                            kf.store(yb, (b, s, h, p + rot), xb[b, s, h, p + rot])
        return kf.finish()


LOWERINGS = (Rotary(),)

__all__ = ["LOWERINGS", "Rotary"]
