"""ONNX converters for the signal op family (older opset forms rewritten into the IR form)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .converters import generic, op_class

if TYPE_CHECKING:
    from compiler.ir.graph import Value

    from .importer import NodeContext as Ctx


def convert_dft(ctx: Ctx) -> list[Value]:
    """DFT before opset 20 takes ``axis`` as an attribute with default 1; from 20 it is input 2 (default -2)."""
    cls = op_class(ctx)
    if ctx.opset >= 20:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    axis = int(attrs.pop("axis", 1))
    inputs = list(ctx.inputs)
    while len(inputs) < 2:
        inputs.append(None)
    inputs = inputs[:2] + [ctx.const(np.asarray(axis, dtype=np.int64))]
    return generic(ctx, cls, attrs, inputs)


CONVERTERS: dict = {
    ("", "DFT"): convert_dft,
}
