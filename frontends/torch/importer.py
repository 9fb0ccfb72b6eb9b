"""An ATen-level FX graph to a Kiln graph: ``import_fx(gm, example_inputs, constants)``.

Placeholders become graph inputs (static shapes from the example inputs), except those in
``constants`` (parameters and buffers, frozen at compile time), which become constants; each
``call_function`` node goes through its lowering in ``lowerings.LOWERINGS``; ``getitem`` picks a
result of a multi-result node; the output node's values become the graph's outputs, in order.
"""
from __future__ import annotations

import operator
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from compiler.errors import ModelError
from compiler.ir.graph import Graph, Value
from compiler.ir.types import TensorType

from .lowerings import DTYPES, LOWERINGS, Unsupported, op


#: multi-result ATen ops whose first result alone is lowered (statistics and indices are not)
FIRST_RESULT_ONLY = (torch.ops.aten.max_pool2d_with_indices.default, torch.ops.aten.native_layer_norm.default,
                     torch.ops.aten._native_batch_norm_legit_no_training.default,
                     torch.ops.aten.native_batch_norm.default, torch.ops.aten.native_group_norm.default)


def supported(node: torch.fx.Node) -> str | None:
    """None when ``node`` (a call_function) has a lowering that takes it, else why not."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and src.target in FIRST_RESULT_ONLY and node.args[1] != 0:
            return f"{src.target} result {node.args[1]} (only the first is lowered)"
        return None
    if node.target not in LOWERINGS:
        return f"no Kiln lowering for {node.target}"
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    for v in vals:
        if isinstance(v, torch.Tensor) and v.dtype not in DTYPES:
            return f"{node.target} makes {v.dtype}, which Kiln's IR does not hold"
    return None


class Lowerer:
    """The state of one import: FX node -> Kiln value(s)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.values: dict[Any, Any] = {}

    # -- what lowerings use ----------------------------------------------------------------------
    def meta_shape(self, arg) -> list[int]:
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(val, torch.Tensor):
            return [int(d) for d in val.shape]
        v = self.values.get(arg)
        if isinstance(v, Value):
            return [int(d) for d in v.shape]
        raise Unsupported(f"no shape for {arg}")

    def meta_numel(self, arg) -> int:
        return int(np.prod(self.meta_shape(arg), dtype=np.int64))

    def kiln_dtype(self, dt):
        if dt not in DTYPES:
            raise Unsupported(f"dtype {dt}")
        return DTYPES[dt]

    def const(self, array) -> Value:
        return self.graph.add_constant(np.asarray(array))

    def value(self, arg) -> Value:
        """The Kiln value of an FX node's result (numbers: ``typed``, in the type the op computes in)."""
        if isinstance(arg, torch.fx.Node):
            v = self.values[arg]
            if not isinstance(v, Value):
                raise Unsupported(f"{arg.name} has several results")
            return v
        raise Unsupported(f"argument {arg!r} of type {type(arg).__name__}")

    def result_dtype(self, node) -> torch.dtype:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"no result type for {node.name}")
        return val.dtype

    def promoted(self, *args) -> torch.dtype:
        """The dtype PyTorch computes ``args`` (tensors' FX nodes and Python numbers) in."""
        tensors = [a.meta["val"] for a in args if isinstance(a, torch.fx.Node)]
        scalars = [a for a in args if isinstance(a, (bool, int, float))]
        dt = tensors[0].dtype
        for x in tensors[1:]:
            dt = torch.promote_types(dt, x.dtype)
        for x in scalars:
            if isinstance(x, float) and not (dt.is_floating_point or dt.is_complex):
                dt = torch.get_default_dtype()
            elif isinstance(x, int) and not isinstance(x, bool) and dt == torch.bool:
                dt = torch.int64
        return dt

    def typed(self, arg, dt: torch.dtype) -> Value:
        """``arg`` as a value of ``dt``: a tensor cast where its type differs, a number a constant of it."""
        kdt = self.kiln_dtype(dt)
        if isinstance(arg, torch.fx.Node):
            v = self.value(arg)
            return v if v.type.dtype is kdt else self.add("Cast", [v], to=kdt)
        if isinstance(arg, (bool, int, float)):
            return self.const(np.asarray(arg, dtype=kdt.np))
        raise Unsupported(f"argument {arg!r} of type {type(arg).__name__}")

    def add(self, name: str, inputs: Sequence[Value | None], **attrs) -> Value:
        return self.graph.add_node(op(name, **attrs), list(inputs)).output

    def add_multi(self, name: str, inputs, count: int, **attrs):
        return self.graph.add_node(op(name, **attrs), list(inputs), num_outputs=count).outputs


def import_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], constants: Mapping[int, torch.Tensor] = (),
              name: str = "torch") -> tuple[Graph, list[int]]:
    """(the Kiln graph, the positions of the placeholders it takes as inputs, in order)."""
    constants = dict(constants or {})
    g = Graph(name)
    low = Lowerer(g)
    taken: list[int] = []
    pos = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            ex = example_inputs[pos]
            if not isinstance(ex, torch.Tensor):
                raise ModelError(f"input {node.name} is a {type(ex).__name__}, not a tensor")
            if ex.dtype not in DTYPES:
                raise ModelError(f"input {node.name} is {ex.dtype}, which Kiln's IR does not hold")
            if pos in constants:
                low.values[node] = g.add_constant(constants[pos].detach().cpu().numpy().copy(), name=node.name)
            else:
                low.values[node] = g.add_input(node.name, TensorType(DTYPES[ex.dtype], tuple(int(d) for d in ex.shape)))
                taken.append(pos)
            pos += 1
        elif node.op == "call_function":
            if node.target is operator.getitem:
                src = low.values[node.args[0]]
                low.values[node] = src[node.args[1]]
                continue
            why = supported(node)
            if why:
                raise Unsupported(why)
            got = LOWERINGS[node.target](low, node)
            low.values[node] = got
        elif node.op == "output":
            outs = node.args[0]
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            vals = [low.value(o) for o in outs]
            g.set_outputs(vals, [f"output{i}" for i in range(len(vals))])
        elif node.op == "get_attr":
            attr = getattr(gm, node.target)
            low.values[node] = g.add_constant(attr.detach().cpu().numpy().copy(), name=node.name)
        else:
            raise Unsupported(f"FX node kind {node.op} ({node.target})")
    return g, taken


__all__ = ["Lowerer", "import_fx", "supported"]
