"""ONNX Runtime's quantized contrib ops (domain ``com.microsoft``), as ONNX Runtime's
``quantize_static(..., quant_format=QuantFormat.QOperator)`` emits them, imported as their
DequantizeLinear -> float op -> QuantizeLinear meaning (ONNX Runtime's own definition of each):

* ``QLinearAdd`` / ``QLinearMul``: ``C = Q(DQ(A) + DQ(B))`` (or ``*``); the fuse pass makes the
  dequantization, the op and the quantization one loop;
* ``QLinearGlobalAveragePool``: ``Y = Q(GlobalAveragePool(DQ(X)))`` (NCHW: ``channels_last=0``);
* ``QLinearSoftmax``: ``Y = Q(Softmax(DQ(X)))`` along ``axis`` (ONNX Runtime computes it from a table
  of exponentials of the 256 input steps, so its results can differ by a step more often);
* ``QGemm``: ``Y = [Q](Gemm(DQ(A), DQ(B), DQ(C)))`` with C the int32 bias at scale
  ``a_scale * b_scale``; without ``y_scale`` the result stays float. ``fold-qdq`` then runs the
  product on the int8 tiles.

The results can differ from ONNX Runtime's by one step of the output's quantization (a value on a
rounding boundary), as for any QDQ model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from compiler.errors import UnsupportedError
from compiler.ir.ops import elementwise as ew
from compiler.ir.ops import linalg as la
from compiler.ir.ops import pool as pl
from compiler.ir.ops import quant as qn

if TYPE_CHECKING:
    from compiler.ir.graph import Value

    from .importer import NodeContext as Ctx

MS = "com.microsoft"


def _inputs(ctx: Ctx, count: int) -> list:
    return (list(ctx.inputs) + [None] * count)[:count]


def _dq(ctx: Ctx, x: Value, scale: Value, zp: Value | None, axis: int = 1) -> Value:
    return ctx.emit(qn.DequantizeLinear(axis=axis), [x, scale, zp])[0]


def _q(ctx: Ctx, y: Value, scale: Value, zp: Value | None, like: Value) -> Value:
    """y quantized; without a zero point, to ``like``'s integer type (ONNX Runtime's T) at 0."""
    if zp is None:
        zp = ctx.const(np.zeros((), like.type.dtype.np))
    return ctx.emit(qn.QuantizeLinear(), [y, scale, zp])[0]


def _binary(op):
    def convert(ctx: Ctx) -> list[Value]:
        a, sa, za, b, sb, zb, sc, zc = _inputs(ctx, 8)
        y = ctx.emit(op(), [_dq(ctx, a, sa, za), _dq(ctx, b, sb, zb)])[0]
        return [_q(ctx, y, sc, zc, a)]
    return convert


def convert_global_average_pool(ctx: Ctx) -> list[Value]:
    x, sx, zx, sy, zy = _inputs(ctx, 5)
    if ctx.attrs.get("channels_last", 0):
        raise UnsupportedError(ctx.where("channels_last=1 (NHWC) is not supported; Kiln imports NCHW"))
    y = ctx.emit(pl.GlobalAveragePool(), [_dq(ctx, x, sx, zx)])[0]
    return [_q(ctx, y, sy, zy, x)]


def convert_softmax(ctx: Ctx) -> list[Value]:
    """``Y = Q(Softmax(DQ(X)))`` along ``axis`` (default -1); ``opset``, the Softmax's opset, below 13
    means ONNX's old 2-D coercion, the same only along the last axis."""
    from compiler.ir.ops import norm as nm

    x, sx, zx, sy, zy = _inputs(ctx, 5)
    axis = int(ctx.attrs.get("axis", -1))
    rank = x.type.rank
    if rank == 0 or not -rank <= axis < rank:
        raise UnsupportedError(ctx.where(f"axis {axis} is out of range for the input {x.type}"))
    if int(ctx.attrs.get("opset", 13)) < 13 and axis % rank != rank - 1:
        raise UnsupportedError(ctx.where(f"opset {ctx.attrs.get('opset')} (the 2-D coercion) along axis {axis}, "
                                         "not the last, is not supported"))
    y = ctx.emit(nm.Softmax(axis=axis), [_dq(ctx, x, sx, zx)])[0]
    return [_q(ctx, y, sy, zy, x)]


def convert_qgemm(ctx: Ctx) -> list[Value]:
    a, sa, za, b, sb, zb, c, sy, zy = _inputs(ctx, 9)
    alpha, ta, tb = float(ctx.attrs.get("alpha", 1.0)), int(ctx.attrs.get("transA", 0)), int(ctx.attrs.get("transB", 0))
    per_column = sb.type.numel > 1
    bd = _dq(ctx, b, sb, zb, axis=0 if tb else 1) if per_column else _dq(ctx, b, sb, zb)
    ins = [_dq(ctx, a, sa, za), bd]
    if c is not None:  # the int32 bias at scale a_scale * b_scale (a constant when both are)
        if sa.const is not None and sb.const is not None:
            sc = ctx.const((sa.const.astype(np.float32) * sb.const.astype(np.float32)).astype(np.float32))
        else:
            sc = ctx.emit(ew.Mul(), [sa, sb])[0]
        ins.append(_dq(ctx, c, sc, None, axis=0 if sc.type.rank else 1))
    y = ctx.emit(la.Gemm(alpha=alpha, beta=1.0, transA=ta, transB=tb), ins)[0]
    return [y if sy is None else _q(ctx, y, sy, zy, a)]


CONVERTERS: dict = {
    (MS, "QLinearAdd"): _binary(ew.Add),
    (MS, "QLinearMul"): _binary(ew.Mul),
    (MS, "QLinearGlobalAveragePool"): convert_global_average_pool,
    (MS, "QGemm"): convert_qgemm,
    (MS, "QLinearSoftmax"): convert_softmax,
}
