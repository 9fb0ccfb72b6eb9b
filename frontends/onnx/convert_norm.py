"""ONNX converters for the norm op family (older opset forms rewritten into the IR form).

* Softmax / LogSoftmax / Hardmax before opset 13 coerce the input to 2-D at ``axis`` (default 1) and
  normalize over the whole second dimension: on the last axis that is the opset-13 op with axis=-1;
  otherwise Flatten(axis) -> op(axis=-1) -> Reshape back to the input's shape.
* Dropout before opset 12 has ``ratio`` as an attribute (an input since 12) and is inference-only
  (opset 7-11; ``is_test`` in opset 6); before opset 10 its mask output has the data's type.
* BatchNormalization before opset 14 has no ``training_mode``: asking for the running statistics
  outputs means training. Opset 7's ``spatial=0`` (statistics per channel *and* position) becomes a
  BatchNormalization on the input flattened to N x (C*D1*...*Dn).
* GroupNormalization opset 18 takes one scale/bias per group; opset 21 one per channel: each group's
  value is repeated over its channels.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from compiler.errors import ModelError, UnsupportedError
from compiler.ir.graph import Value
from compiler.ir.types import DType

from .converters import generic, op_class

if TYPE_CHECKING:
    from .importer import NodeContext as Ctx


def _one(values: list[Value]) -> Value:
    (v,) = values
    return v


def _aux(ctx: Ctx, op, inputs: list[Value]) -> Value:
    """A helper node around the converted op, named after the ONNX node (``name/opname``) so node
    names stay unique."""
    name = None
    if ctx.name:
        taken = {n.name for n in ctx.graph.nodes}
        base = name = f"{ctx.name}/{op.name.lower()}"
        k = 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
    return ctx.graph.add_node(op, inputs, name=name).output


def _shape_of(ctx: Ctx, like: Value) -> Value:
    """An i64 shape operand equal to ``like``'s shape: a constant when static, else Shape(like)."""
    if like.type.is_static:
        return ctx.const(np.asarray(like.shape, dtype=np.int64))
    from compiler.ir.ops.shape import Shape

    return _aux(ctx, Shape(), [like])


def _reshape(ctx: Ctx, v: Value, shape: Value) -> Value:
    from compiler.ir.ops.shape import Reshape

    return _aux(ctx, Reshape(), [v, shape])


def _flat(ctx: Ctx, v: Value) -> Value:
    """``v`` as a 1-D tensor (a new constant when ``v`` is one)."""
    if v.type.rank == 1:
        return v
    if v.const is not None:
        return ctx.const(v.const.reshape(-1))
    return _reshape(ctx, v, ctx.const(np.asarray([-1], dtype=np.int64)))


# ---------------------------------------------------------------------------------------------
# Softmax, LogSoftmax, Hardmax
# ---------------------------------------------------------------------------------------------

def convert_softmax_family(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 13:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    axis = int(attrs.pop("axis", 1))
    if len(ctx.inputs) != 1 or ctx.inputs[0] is None:
        raise ModelError(ctx.where(f"takes one input, got {len(ctx.inputs)}"))
    x = ctx.inputs[0]
    rank = x.type.rank
    if rank == 0 or not -rank <= axis < rank:
        raise ModelError(ctx.where(f"axis {axis} is out of range for the input {x.type}"))
    a = axis % rank
    if a == rank - 1:  # the 2-D coercion keeps the last axis as the second dimension
        return ctx.emit(ctx.make(cls, {**attrs, "axis": -1}), [x])
    from compiler.ir.ops.shape import Flatten

    flat = _aux(ctx, Flatten(axis=a), [x])
    y = _one(ctx.emit(ctx.make(cls, {**attrs, "axis": -1}), [flat]))
    return [_reshape(ctx, y, _shape_of(ctx, x))]


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------

def convert_dropout(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 12:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    ratio = float(attrs.pop("ratio", 0.5))
    # opset 6 and below: is_test=0 (the default) is training; opset 7-11 Dropout is inference only
    training = not attrs.pop("is_test", 0) if ctx.opset < 7 else False
    attrs.pop("consumed_inputs", None)
    if len(ctx.inputs) != 1:
        raise ModelError(ctx.where(f"takes one input before opset 12, got {len(ctx.inputs)}"))
    x = ctx.inputs[0]
    inputs = [x]  # in inference the ratio does not matter
    if training:
        inputs += [ctx.const(np.asarray(ratio, dtype=np.float32)), ctx.const(np.asarray(True))]
    n_out = ctx.num_outputs
    if n_out > 1 and not _is_read(ctx, ctx.proto.output[1]):
        n_out = 1  # exporters name the mask even when nothing reads it: do not materialize it
    outs = ctx.emit(ctx.make(cls, attrs), inputs, num_outputs=n_out)
    if len(outs) > 1 and ctx.opset < 10:  # the mask had the data's element type
        from compiler.ir.ops.elementwise import Cast

        outs[1] = _aux(ctx, Cast(to=x.dtype), [outs[1]])
    return outs


def _is_read(ctx: Ctx, name: str) -> bool:
    """Whether a node or the graph's outputs read the ONNX value ``name``."""
    g = ctx.importer.proto.graph
    return any(o.name == name for o in g.output) or any(name in n.input for n in g.node)


# ---------------------------------------------------------------------------------------------
# BatchNormalization
# ---------------------------------------------------------------------------------------------

def convert_batchnorm(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 14:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    spatial = int(attrs.pop("spatial", 1))
    is_test = int(attrs.pop("is_test", 0))
    attrs.pop("consumed_inputs", None)
    n_out = ctx.num_outputs
    if n_out > 3:
        raise UnsupportedError(ctx.where(
            "outputs saved_mean / saved_var (training-only, opset < 14) are not supported; Kiln computes "
            "Y and the running mean / var"))
    if n_out > 1 and not is_test:
        attrs["training_mode"] = 1
    op = ctx.make(cls, attrs)
    if len(ctx.inputs) != 5 or any(v is None for v in ctx.inputs):
        raise ModelError(ctx.where(f"takes 5 inputs (X, scale, B, mean, var), got {len(ctx.inputs)}"))
    x, scale, b, mean, var = ctx.inputs
    if spatial or x.type.rank <= 2:
        return ctx.emit(op, ctx.inputs, num_outputs=n_out)
    # spatial=0: one statistic per channel and position, i.e. BatchNormalization on N x (C*D1*...*Dn)
    from compiler.ir.ops.shape import Flatten

    x2 = _aux(ctx, Flatten(axis=1), [x])
    outs = ctx.emit(op, [x2] + [_flat(ctx, v) for v in (scale, b, mean, var)], num_outputs=n_out)
    outs[0] = _reshape(ctx, outs[0], _shape_of(ctx, x))
    for i, like in ((1, mean), (2, var)):
        if i < len(outs) and like.type.rank != 1:
            outs[i] = _reshape(ctx, outs[i], _shape_of(ctx, like))
    return outs


# ---------------------------------------------------------------------------------------------
# GroupNormalization
# ---------------------------------------------------------------------------------------------

def convert_groupnorm(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 21:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    # opset 18 computes in the input's type; opset 21's default stash_type is float32
    if len(ctx.inputs) != 3 or any(v is None for v in ctx.inputs):
        raise ModelError(ctx.where(f"takes 3 inputs (X, scale, bias), got {len(ctx.inputs)}"))
    x, scale, bias = ctx.inputs
    attrs.setdefault("stash_type", DType.f64.onnx if x.dtype is DType.f64 else DType.f32.onnx)
    op = ctx.make(cls, attrs)  # validates num_groups
    g = op.num_groups
    c = x.shape[1] if x.type.rank >= 2 else None
    if not isinstance(c, int):
        raise UnsupportedError(ctx.where(
            f"opset-{ctx.opset} GroupNormalization (one scale/bias per group) needs a static channel "
            f"dimension to expand them per channel; the input is {x.type}"))
    if c % g:
        raise ModelError(ctx.where(f"the {c} channels do not split into num_groups={g} equal groups"))
    per_channel = [_per_channel(ctx, v, g, c, what) for v, what in ((scale, "scale"), (bias, "bias"))]
    return ctx.emit(op, [x] + per_channel, num_outputs=ctx.num_outputs)


def _per_channel(ctx: Ctx, v: Value, groups: int, channels: int, what: str) -> Value:
    """Repeat each of the ``groups`` values of ``v`` over the ``channels // groups`` channels of its group."""
    if v.type.rank != 1 or v.shape[0] not in (groups, channels):
        raise ModelError(ctx.where(f"{what} must hold one value per group ({groups}), got {v.type}"))
    if v.shape[0] == channels:  # already per channel (groups == channels, or a per-channel exporter)
        return v
    rep = channels // groups
    if v.const is not None:
        return ctx.const(np.repeat(v.const, rep))
    from compiler.ir.ops.tensor import Expand

    col = _reshape(ctx, v, ctx.const(np.asarray([groups, 1], dtype=np.int64)))
    wide = _aux(ctx, Expand(), [col, ctx.const(np.asarray([groups, rep], dtype=np.int64))])
    return _reshape(ctx, wide, ctx.const(np.asarray([channels], dtype=np.int64)))


CONVERTERS: dict = {
    ("", "Softmax"): convert_softmax_family,
    ("", "LogSoftmax"): convert_softmax_family,
    ("", "Hardmax"): convert_softmax_family,
    ("", "Dropout"): convert_dropout,
    ("", "BatchNormalization"): convert_batchnorm,
    ("", "GroupNormalization"): convert_groupnorm,
}
