"""How ONNX nodes become IR nodes.

Most ops import generically: the IR op has the ONNX op's name, its attributes are the ONNX
attributes, and its inputs are the ONNX inputs (``generic``). The IR follows the *newest* ONNX form of
each op, so a node from an older opset whose form differs (an attribute that later became an input,
changed defaults or semantics) has a converter here that rewrites it into that form.

``CONVERTERS`` is the explicit table: (domain, op type) -> converter(ctx) -> result values.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from compiler.errors import UnsupportedError
from compiler.ir import ops
from compiler.ir.graph import Value
from compiler.ir.types import DType

if TYPE_CHECKING:
    from .importer import NodeContext as Ctx


def generic(ctx: Ctx, cls: type[ops.OpDef], attrs: dict | None = None,
            inputs: list[Value | None] | None = None) -> list[Value]:
    attrs = dict(ctx.attrs if attrs is None else attrs)
    if ctx.opset < 6:
        attrs.pop("consumed_inputs", None)  # a memory hint of opsets 1-5, with no meaning for the IR
    if "num_outputs" in {f.name for f in dataclasses.fields(cls)} and "num_outputs" not in attrs:
        attrs["num_outputs"] = ctx.num_outputs
    op = ctx.make(cls, attrs)
    return ctx.emit(op, ctx.inputs if inputs is None else inputs, num_outputs=ctx.num_outputs)


def op_class(ctx: Ctx, name: str | None = None) -> type[ops.OpDef]:
    cls = ops.lookup(name or ctx.op_type, ctx.domain)
    if cls is None:
        raise UnsupportedError(ctx.where(f"op {name or ctx.op_type!r} is not supported by Kiln"))
    return cls


def attr_to_input(ctx: Ctx, attr: str, position: int, dtype: DType = DType.i64) -> tuple[dict, list]:
    """Move an attribute that newer opsets take as an input into that input position."""
    attrs = dict(ctx.attrs)
    inputs = list(ctx.inputs)
    value = attrs.pop(attr, None)
    while len(inputs) < position:
        inputs.append(None)
    if value is not None:
        inputs.insert(position, ctx.const(np.asarray(value, dtype=dtype.np)))
    return attrs, inputs


# ---------------------------------------------------------------------------------------------
# Converters
# ---------------------------------------------------------------------------------------------

def convert_constant(ctx: Ctx) -> list[Value]:
    """A Constant node becomes a graph constant (kept in the IR, not folded into its users)."""
    if len(ctx.attrs) != 1:
        raise UnsupportedError(ctx.where(f"expects exactly one value attribute, got {sorted(ctx.attrs)}"))
    ((key, value),) = ctx.attrs.items()
    kinds = {"value": None, "value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64, "value_string": object, "value_strings": object}
    if key not in kinds:
        raise UnsupportedError(ctx.where(f"attribute {key!r} is not supported (sparse tensors are not)"))
    arr = np.asarray(value, dtype=kinds[key]) if kinds[key] is not None else np.asarray(value)
    return [ctx.graph.add_constant(arr, name=ctx.proto.output[0])]


def _axes_to_input(since: int, position: int = 1) -> Callable[[Ctx], list[Value]]:
    """Ops whose ``axes`` attribute became an input at opset ``since`` (Squeeze, Unsqueeze, Reduce*)."""

    def convert(ctx: Ctx) -> list[Value]:
        cls = op_class(ctx)
        if ctx.opset >= since:
            return generic(ctx, cls)
        attrs, inputs = attr_to_input(ctx, "axes", position)
        return generic(ctx, cls, attrs, inputs)

    return convert


CONVERTERS: dict[tuple[str, str], Callable[[Ctx], list[Value]]] = {
    ("", "Constant"): convert_constant,
}


def _merge_family_tables() -> None:
    from . import (convert_attention, convert_control, convert_conv, convert_elementwise, convert_indexing,
                   convert_linalg, convert_ml, convert_msquant, convert_norm, convert_pool, convert_quant,
                   convert_random, convert_recurrent, convert_reduce, convert_resample, convert_shape,
                   convert_signal, convert_strings, convert_tensor)

    for module in (convert_elementwise, convert_shape, convert_tensor, convert_indexing, convert_resample,
                   convert_conv, convert_pool, convert_norm, convert_reduce, convert_linalg, convert_attention,
                   convert_recurrent, convert_quant, convert_msquant, convert_signal, convert_strings, convert_random,
                   convert_ml, convert_control):
        for key, fn in module.CONVERTERS.items():
            assert key not in CONVERTERS, f"converter for {key} defined twice"
            CONVERTERS[key] = fn


_merge_family_tables()
