"""ONNX converters for the tensor op family (older opset forms rewritten into the IR form).

* Split (< 13): the ``split`` attribute became an input; without sizes the parts are equal, one per
  declared output. Opset 18 adds ``num_outputs``; the IR always carries the part count.
* Slice (< 10): the ``starts`` / ``ends`` / ``axes`` attributes became inputs.
* Pad (< 11): the ``pads`` / ``value`` attributes became inputs.
"""
from __future__ import annotations

import numpy as np

from compiler.errors import ModelError, UnsupportedError

from .converters import attr_to_input, generic, op_class


def convert_split(ctx):
    cls = op_class(ctx)
    if ctx.opset < 13:
        attrs, inputs = attr_to_input(ctx, "split", 1)
    else:
        attrs, inputs = dict(ctx.attrs), list(ctx.inputs)
    has_sizes = len(inputs) > 1 and inputs[1] is not None
    if "num_outputs" not in attrs:
        if not has_sizes and ctx.opset >= 18:
            raise ModelError(ctx.where("needs the split input or the num_outputs attribute (from opset 18)"))
        # equal parts, one per declared output (empty trailing output names count: they fix the sizes)
        attrs["num_outputs"] = None if has_sizes else len(ctx.proto.output)
        if not has_sizes and inputs and inputs[0] is not None:
            # before opset 18 the parts must be equal (num_outputs, from 18 on, allows a smaller last one)
            x = inputs[0].type
            axis = int(attrs.get("axis", 0))
            d = x.shape[axis] if -x.rank <= axis < x.rank else None
            n = attrs["num_outputs"]
            if isinstance(d, int) and n and d % n:
                raise ModelError(ctx.where(f"without split sizes, axis {axis} of length {d} must divide evenly "
                                           f"into its {n} outputs"))
    elif has_sizes:
        raise UnsupportedError(ctx.where("takes either the split input or the num_outputs attribute, not both"))
    elif attrs["num_outputs"] != len(ctx.proto.output):
        raise ModelError(ctx.where(f"num_outputs={attrs['num_outputs']} but the node has {len(ctx.proto.output)} "
                                   "outputs"))
    return generic(ctx, cls, attrs, inputs)


def convert_slice(ctx):
    cls = op_class(ctx)
    if ctx.opset >= 10:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    if "starts" not in attrs or "ends" not in attrs:
        raise UnsupportedError(ctx.where("Slice before opset 10 needs the starts and ends attributes"))
    inputs = list(ctx.inputs[:1])
    for name in ("starts", "ends", "axes"):
        if name in attrs:
            inputs.append(ctx.const(np.asarray(attrs.pop(name), dtype=np.int64)))
    return generic(ctx, cls, attrs, inputs)


def convert_pad(ctx):
    cls = op_class(ctx)
    if ctx.opset >= 11:
        return generic(ctx, cls)
    attrs = dict(ctx.attrs)
    pads = attrs.pop("pads", attrs.pop("paddings", None))
    if pads is None:
        raise UnsupportedError(ctx.where("Pad before opset 11 needs the pads attribute"))
    value = attrs.pop("value", 0.0)
    data = ctx.inputs[0]
    inputs = [data, ctx.const(np.asarray(pads, dtype=np.int64))]
    if attrs.get("mode", "constant") == "constant":
        inputs.append(ctx.const(np.asarray(value).astype(data.dtype.np)))
    return generic(ctx, cls, attrs, inputs)


CONVERTERS: dict = {
    ("", "Split"): convert_split,
    ("", "Slice"): convert_slice,
    ("", "Pad"): convert_pad,
}
