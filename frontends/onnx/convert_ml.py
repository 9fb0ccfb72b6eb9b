"""ONNX converters for the ai.onnx.ml op family (older opset forms rewritten into the IR form)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.errors import UnsupportedError
from compiler.ir.types import DType

from .converters import generic, op_class

if TYPE_CHECKING:
    from compiler.ir.graph import Value

    from .importer import NodeContext as Ctx


def convert_label_encoder(ctx: Ctx) -> list[Value]:
    """LabelEncoder-1 maps strings to their index in ``classes_strings`` (``default_int64`` when absent) or
    integers to ``classes_strings[i]`` (``default_string`` out of range), by X's element type; from
    ai.onnx.ml opset 2 it is a keys -> values table."""
    cls = op_class(ctx)
    if ctx.opset >= 2 or "classes_strings" not in ctx.attrs:
        return generic(ctx, cls)  # (a node in the newer form under an older declared opset imports as is)
    attrs = dict(ctx.attrs)
    classes = list(attrs.pop("classes_strings", ()))
    x = ctx.inputs[0] if ctx.inputs else None
    if x is None:
        raise UnsupportedError(ctx.where("LabelEncoder needs its input X"))
    if x.dtype is DType.string:
        first = {}
        for i, s in enumerate(classes):
            first.setdefault(s, i)  # opset 1 looks a string up by its first position
        attrs.pop("default_string", None)
        attrs["keys_strings"] = tuple(first)
        attrs["values_int64s"] = tuple(first.values())
    else:
        attrs.pop("default_int64", None)
        attrs["keys_int64s"] = tuple(range(len(classes)))
        attrs["values_strings"] = tuple(classes)
    return generic(ctx, cls, attrs)


CONVERTERS: dict = {
    ("ai.onnx.ml", "LabelEncoder"): convert_label_encoder,
}
