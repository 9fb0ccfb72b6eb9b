"""ONNX converters for the resample op family (older opset forms rewritten into the IR form).

* Resize 10 and Upsample (7: scales attribute, 9-10: scales input) use asymmetric coordinates; their
  nearest mode takes the floor when upsampling an axis and the ceiling when downsampling it (as
  onnxruntime does), so an axis that shrinks and one that grows become two Resize nodes.
* GridSample before opset 20 names its modes bilinear / bicubic (later linear / cubic).
* RoiAlign before opset 16 has no coordinate_transformation_mode and behaves as output_half_pixel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from compiler.errors import UnsupportedError
from compiler.ir.graph import Value

from .converters import generic, op_class

if TYPE_CHECKING:
    from .importer import NodeContext as Ctx


def _resize_asymmetric(ctx: Ctx, x: Value, scales: Value, mode: str) -> list[Value]:
    """Resize-10 / Upsample semantics in the IR's Resize."""
    cls = op_class(ctx, "Resize")
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise UnsupportedError(ctx.where(f"mode {mode!r} is not supported (nearest or linear)"))
    base = dict(mode=mode, coordinate_transformation_mode="asymmetric")
    if mode == "linear":
        return ctx.emit(cls(**base), [x, None, scales], num_outputs=1)
    known = scales.known
    if known is None:  # decided at run time: assume upsampling (Upsample's case)
        return ctx.emit(cls(nearest_mode="floor", **base), [x, None, scales], num_outputs=1)
    sc = np.asarray(known, dtype=np.float32).ravel()
    down, up = sc < 1, sc > 1
    if not down.any():
        return ctx.emit(cls(nearest_mode="floor", **base), [x, None, scales], num_outputs=1)
    if not up.any():
        return ctx.emit(cls(nearest_mode="ceil", **base), [x, None, scales], num_outputs=1)
    (shrunk,) = ctx.emit(cls(nearest_mode="ceil", **base),
                         [x, None, ctx.const(np.where(down, sc, 1).astype(np.float32))], num_outputs=1)
    return ctx.emit(cls(nearest_mode="floor", **base),
                    [shrunk, None, ctx.const(np.where(up, sc, 1).astype(np.float32))], num_outputs=1)


def convert_resize(ctx: Ctx) -> list[Value]:
    if ctx.opset >= 11:
        return generic(ctx, op_class(ctx))
    unknown = sorted(set(ctx.attrs) - {"mode"})
    if unknown:
        raise UnsupportedError(ctx.where(f"attribute(s) {', '.join(unknown)} not supported in opset 10 Resize"))
    if len(ctx.inputs) != 2 or ctx.inputs[1] is None:
        raise UnsupportedError(ctx.where("opset 10 Resize takes inputs (X, scales)"))
    return _resize_asymmetric(ctx, ctx.inputs[0], ctx.inputs[1], ctx.attrs.get("mode", "nearest"))


def convert_upsample(ctx: Ctx) -> list[Value]:
    unknown = sorted(set(ctx.attrs) - {"mode", "scales"})
    if unknown:
        raise UnsupportedError(ctx.where(f"attribute(s) {', '.join(unknown)} not supported"))
    mode = ctx.attrs.get("mode", "nearest")
    if ctx.opset < 9:
        if "scales" not in ctx.attrs:
            raise UnsupportedError(ctx.where("Upsample before opset 9 needs the attribute scales"))
        scales = ctx.const(np.asarray(ctx.attrs["scales"], dtype=np.float32))
    else:
        if len(ctx.inputs) != 2 or ctx.inputs[1] is None:
            raise UnsupportedError(ctx.where("Upsample takes inputs (X, scales)"))
        scales = ctx.inputs[1]
    return _resize_asymmetric(ctx, ctx.inputs[0], scales, mode)


_GRID_MODES = {"bilinear": "linear", "bicubic": "cubic"}


def convert_gridsample(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 20:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    mode = attrs.get("mode", "bilinear")
    attrs["mode"] = _GRID_MODES.get(mode, mode)
    return generic(ctx, cls, attrs)


def convert_roialign(ctx: Ctx) -> list[Value]:
    cls = op_class(ctx)
    if ctx.opset >= 16:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    attrs.setdefault("coordinate_transformation_mode", "output_half_pixel")
    return generic(ctx, cls, attrs)


CONVERTERS: dict[tuple[str, str], Callable[[Ctx], list[Value]]] = {
    ("", "Resize"): convert_resize,
    ("", "Upsample"): convert_upsample,
    ("", "GridSample"): convert_gridsample,
    ("", "RoiAlign"): convert_roialign,
}

__all__ = ["CONVERTERS"]
