"""Shape and dtype inference, specializing symbolic input dimensions to the user's shapes."""
from __future__ import annotations

from typing import Mapping

from ...errors import ModelError
from ...ir.graph import Graph
from ...ir.ops.base import infer_node
from ...ir.types import TensorType
from ..manager import Pass


def specialize_inputs(graph: Graph, input_shapes: Mapping[str, tuple]) -> bool:
    """Give inputs the shapes the user chose (symbolic dims only; static dims must agree)."""
    changed = False
    names = {v.name for v in graph.inputs}
    unknown = sorted(set(input_shapes) - names)
    if unknown:
        raise ModelError(f"input shapes name unknown input(s) {unknown}; the inputs are {sorted(names)}")
    for v in graph.inputs:
        if v.name not in input_shapes:
            continue
        shape = tuple(input_shapes[v.name])
        if not isinstance(v.type, TensorType):
            raise ModelError(f"input {v.name!r} is a {v.type}; input shapes apply to tensor inputs")
        if len(shape) != v.type.rank:
            raise ModelError(f"input {v.name!r}: shape {list(shape)} has rank {len(shape)}, the input is {v.type}")
        for i, (old, new) in enumerate(zip(v.shape, shape)):
            if isinstance(old, int) and old != new:
                raise ModelError(f"input {v.name!r}: dimension {i} is fixed to {old}, not {new}")
        if shape != v.shape:
            v.type = v.type.with_shape(shape)
            changed = True
    return changed


def reinfer(graph: Graph) -> bool:
    """Recompute every node's result types and known values in order; True if any type changed."""
    changed = False
    for node in graph.nodes:
        types, known = infer_node(node.op, node.inputs, len(node.outputs))
        for v, t, k in zip(node.outputs, types, known):
            if v.type != t:
                v.type = t
                changed = True
            v.known = k
    return changed


class InferShapes(Pass):
    """Specialize input shapes (``input_shapes``) and re-run shape/dtype inference over the graph."""

    name = "infer-shapes"
    preserves = ("structure",)

    def __init__(self, input_shapes: Mapping[str, tuple] | None = None):
        self.input_shapes = dict(input_shapes or {})

    def run(self, graph: Graph) -> bool:
        changed = specialize_inputs(graph, self.input_shapes)
        return reinfer(graph) or changed
