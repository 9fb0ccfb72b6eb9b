"""ONNX converters for the elementwise family: the opset 1–6 forms of broadcasting ops.

Before opset 7, binary ops did not broadcast by NumPy rules: without ``broadcast=1`` both shapes had to
be equal, and with it B was broadcast onto A either as a suffix (no ``axis``) or aligned to start at
dimension ``axis`` of A. The IR's ops broadcast NumPy-style, so an ``axis`` alignment becomes a
reshape of B that appends trailing 1s.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from compiler.errors import UnsupportedError
from compiler.ir.graph import Value

from .converters import generic, op_class

if TYPE_CHECKING:
    from .importer import NodeContext as Ctx


def align_for_axis(ctx: "Ctx", a: Value, b: Value, axis: int) -> Value:
    """B reshaped so NumPy broadcasting aligns it with A starting at ``axis``."""
    rank_a = a.type.rank
    axis = axis + rank_a if axis < 0 else axis
    trailing = rank_a - axis - b.type.rank
    if trailing < 0:
        raise UnsupportedError(ctx.where(f"B of rank {b.type.rank} does not fit A of rank {rank_a} at axis {axis}"))
    if trailing == 0:
        return b
    shape = tuple(b.shape) + (1,) * trailing
    if b.const is not None:
        return ctx.graph.add_constant(b.const.reshape(shape), name=b.name)
    if not b.type.is_static:
        raise UnsupportedError(ctx.where("broadcast with axis needs B's shape to be static"))
    from compiler.ir.ops import lookup

    target = ctx.const(np.asarray(shape, dtype=np.int64))
    return ctx.emit(lookup("Reshape")(), [b, target])[0]


def convert_legacy_broadcast(ctx: "Ctx") -> list[Value]:
    cls = op_class(ctx)
    attrs = dict(ctx.attrs)
    broadcast = attrs.pop("broadcast", 0)
    axis = attrs.pop("axis", None)
    inputs = list(ctx.inputs)
    if ctx.opset < 7 and broadcast and axis is not None and len(inputs) == 2:
        inputs[1] = align_for_axis(ctx, inputs[0], inputs[1], axis)
    return generic(ctx, cls, attrs, inputs)


def convert_prelu(ctx: "Ctx") -> list[Value]:
    """Before opset 7, a 1-D slope of size C applied along the channel axis (1) of X."""
    x, slope = ctx.inputs
    if ctx.opset < 7 and slope.type.rank == 1 and x.type.rank > 2 and slope.shape[0] != 1:
        slope = align_for_axis(ctx, x, slope, 1)
    return generic(ctx, op_class(ctx), inputs=[x, slope])


def convert_clip(ctx: "Ctx") -> list[Value]:
    """Before opset 11, min and max were float attributes; now they are optional scalar inputs."""
    if ctx.opset >= 11:
        return generic(ctx, op_class(ctx))
    attrs = dict(ctx.attrs)
    x = ctx.inputs[0]
    bounds = [attrs.pop(k, None) for k in ("min", "max")]
    inputs = [x] + [None if b is None else ctx.const(np.asarray(b, dtype=x.dtype.np)) for b in bounds]
    while inputs[-1] is None:
        inputs.pop()
    return generic(ctx, op_class(ctx), attrs, inputs)


_LEGACY_BROADCAST = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less")

CONVERTERS: dict = {("", name): convert_legacy_broadcast for name in _LEGACY_BROADCAST}
CONVERTERS[("", "PRelu")] = convert_prelu
CONVERTERS[("", "Clip")] = convert_clip
