"""ONNX converters for the recurrent op family (older opset forms rewritten into the IR form)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .converters import generic, op_class

if TYPE_CHECKING:
    from compiler.ir.graph import Value

    from .importer import NodeContext as Ctx


def convert_recurrent(ctx: Ctx) -> list[Value]:
    """RNN, GRU and LSTM before opset 7 have an ``output_sequence`` attribute (whether Y is produced, a
    hint: the node's outputs say which results are used) and GRU-1 spells its default direction "foward";
    the IR form has neither."""
    cls = op_class(ctx)
    if ctx.opset >= 7:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    attrs.pop("output_sequence", None)
    if attrs.get("direction") == "foward":
        attrs["direction"] = "forward"
    return generic(ctx, cls, attrs)


CONVERTERS: dict = {
    ("", "RNN"): convert_recurrent,
    ("", "GRU"): convert_recurrent,
    ("", "LSTM"): convert_recurrent,
}
