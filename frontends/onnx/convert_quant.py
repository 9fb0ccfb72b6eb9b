"""ONNX converters for the quant op family (older opset forms rewritten into the IR form).

QuantizeLinear / DequantizeLinear only gained attributes over the opsets (10: per tensor; 13: ``axis``;
19: ``saturate``; 21: ``block_size``, ``output_dtype``; 23: ``precision``), each defaulting to the older
behaviour, so every opset imports as the newest form. The one rewrite: ONNX spells "not given" for the
type attributes as 0, the IR as an absent attribute (None).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .converters import generic, op_class

if TYPE_CHECKING:
    from compiler.ir.graph import Value

    from .importer import NodeContext as Ctx

_TYPE_ATTRS = ("output_dtype", "precision")


def convert_linear(ctx: Ctx) -> list[Value]:
    attrs = {k: v for k, v in ctx.attrs.items() if not (k in _TYPE_ATTRS and v == 0)}
    return generic(ctx, op_class(ctx), attrs)


CONVERTERS: dict = {
    ("", "QuantizeLinear"): convert_linear,
    ("", "DequantizeLinear"): convert_linear,
}
