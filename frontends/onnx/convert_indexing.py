"""ONNX converters for the indexing op family (older opset forms rewritten into the IR form).

* Scatter (opsets 9-10, deprecated) is ScatterElements.
* TopK before opset 10 takes ``k`` as an attribute, later as the input K.
* OneHot before opset 11 gives all-off rows for negative indices (later they count from depth).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from compiler.errors import UnsupportedError
from compiler.ir.graph import Value
from compiler.ir.types import DType

from .converters import generic, op_class

if TYPE_CHECKING:
    from .importer import NodeContext as Ctx


def convert_scatter(ctx: Ctx) -> list[Value]:
    return generic(ctx, op_class(ctx, "ScatterElements"))


def convert_topk(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 10:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    if "k" not in attrs:
        raise UnsupportedError(ctx.where("TopK before opset 10 needs the attribute k"))
    k = ctx.const(np.array([int(attrs.pop("k"))], dtype=np.int64))
    return generic(ctx, cls, attrs, [ctx.inputs[0], k])


def convert_onehot(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 11 or len(ctx.inputs) != 3:
        return generic(ctx, cls)
    idx, depth, values = ctx.inputs
    known = idx.known
    if not idx.dtype.is_signed or (known is not None and not (np.asarray(known) < 0).any()):
        return generic(ctx, cls)
    # negative indices are out of range here: move them below -depth so the IR op gives all-off rows
    from compiler.ir.ops import lookup

    cast, less, sub, where = (lookup(n) for n in ("Cast", "Less", "Sub", "Where"))
    if None in (cast, less, sub, where):
        raise UnsupportedError(ctx.where("OneHot before opset 11 with signed indices needs Cast, Less, Sub "
                                         "and Where"))
    g = ctx.graph
    i64 = g.add(cast(to=DType.i64), idx)
    d64 = g.add(cast(to=DType.i64), depth)
    neg = g.add(less(), i64, ctx.const(np.array(0, np.int64)))
    moved = g.add(where(), neg, g.add(sub(), i64, d64), i64)
    return generic(ctx, cls, None, [moved, depth, values])


CONVERTERS: dict[tuple[str, str], Callable[[Ctx], list[Value]]] = {
    ("", "Scatter"): convert_scatter,
    ("", "TopK"): convert_topk,
    ("", "OneHot"): convert_onehot,
}

__all__ = ["CONVERTERS"]
