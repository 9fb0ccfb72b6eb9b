"""Shape and dtype inference, specializing symbolic input dimensions to the user's shapes and
binding inputs to values (``input_values``: they become constants)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ...errors import ModelError
from ...ir.graph import KNOWN_VALUE_LIMIT, Graph, Value
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


def bind_inputs(graph: Graph, values: Mapping[str, np.ndarray]) -> bool:
    """Make the named inputs constants holding ``values`` (of the input's element type and shape):
    the graph no longer takes them."""
    names = {v.name: v for v in graph.inputs}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ModelError(f"input values name unknown input(s) {unknown}; the inputs are {sorted(names)}")
    for name, data in values.items():
        v = names[name]
        if not isinstance(v.type, TensorType):
            raise ModelError(f"input {name!r} is a {v.type}; only tensor inputs can be bound to values")
        arr = np.asarray(data)
        if arr.dtype != v.dtype.np:
            raise ModelError(f"input {name!r}: the value is {arr.dtype}, the input is {v.type}")
        if len(arr.shape) != v.type.rank or any(isinstance(d, int) and d != n for d, n in zip(v.shape, arr.shape)):
            raise ModelError(f"input {name!r}: the value has shape {list(arr.shape)}, the input is {v.type}")
        c = graph.add_constant(arr.copy(), name=name)
        v.replace_all_uses_with(c)
        graph.inputs.remove(v)
    return bool(values)


def shape_determining_inputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[str]:
    """The small numeric inputs whose values (not only their shapes) some user's result type depends
    on (a Reduce's axes, a Reshape's shape, a OneHot's depth, a Range's bounds fed as inputs, also
    through values computed from them alone: a window's size cast and scaled before its Range), or
    that some user takes as a parameter (``OpDef.parameters``: a CumSum's axis, a Trilu's k). Binding
    them (``input_values``) gives static shapes and known parameters where the model otherwise has
    none. An input is listed only if its own value is needed: other inputs of the same node (data,
    Gather indices) are not."""
    stand_ins: dict[int, Value] = {}
    #: id(stand-in's value) -> the graph inputs its value comes from
    origins: dict[int, frozenset] = {}
    out: dict[str, None] = {}
    for v in graph.inputs:
        arr = feeds.get(v.name)
        if not isinstance(v.type, TensorType) or not (v.dtype.is_int or v.dtype.is_float) or arr is None \
                or np.size(arr) > KNOWN_VALUE_LIMIT:
            continue
        if any(i < len(u.op.inputs) and u.op.inputs[i].rstrip("?*") in u.op.parameters for u, i in v.uses
               if hasattr(u, "op")):
            out[v.name] = None
            continue
        s = Value(TensorType(v.dtype, tuple(np.shape(arr))), name=v.name)
        s.known = np.asarray(arr)
        stand_ins[id(v)], origins[id(v)] = s, frozenset({v.name})
    for user in graph.nodes:  # in order: a value derived from the stand-ins is one before its users
        known = {id(x) for x in user.inputs if x is not None and id(x) in stand_ins}
        if not known:
            continue
        full = _unknown_after(user, known, stand_ins)
        if full is not None and full < sum(_unknown_dims(o.type) for o in user.outputs):
            for k in known:  # each input whose value is needed: without it the types are worse
                without = _unknown_after(user, known - {k}, stand_ins)
                if without is None or without > full:
                    out.update(dict.fromkeys(origins[k]))
        _derive(user, known, stand_ins, origins)
    return [v.name for v in graph.inputs if v.name in out]


def _derive(user, known: set, stand_ins: dict, origins: dict) -> None:
    """``user``'s results as stand-ins where the stand-ins and constants decide their values."""
    if any(x is not None and id(x) not in known and x.known is None for x in user.inputs):
        return
    ins = [stand_ins[id(x)] if x is not None and id(x) in known else x for x in user.inputs]
    try:
        types, values = infer_node(user.op, ins, len(user.outputs))
    except Exception:  # noqa: BLE001 - a value this op refuses: not ours to judge here
        return
    came_from = frozenset().union(*(origins[k] for k in known))
    for o, t, val in zip(user.outputs, types, values):
        if val is not None:
            s = Value(t, name=o.name)
            s.known = val
            stand_ins[id(o)], origins[id(o)] = s, came_from


def _unknown_after(user, known: set, stand_ins: dict) -> int | None:
    """Unknown result dims of ``user`` with the inputs ``known`` (ids) given their values; None when
    the op refuses them."""
    ins = [stand_ins[id(x)] if x is not None and id(x) in known else x for x in user.inputs]
    try:
        types, _ = infer_node(user.op, ins, len(user.outputs))
    except Exception:  # noqa: BLE001 - a value this op refuses: not ours to judge here
        return None
    return sum(_unknown_dims(t) for t in types)


def _unknown_dims(t) -> int:
    if not isinstance(t, TensorType):
        return 0
    return sum(not isinstance(d, int) for d in t.shape)


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
    """Specialize input shapes (``input_shapes``), bind inputs to values (``input_values``) and re-run
    shape/dtype inference over the graph."""

    name = "infer-shapes"
    preserves = ("structure",)

    def __init__(self, input_shapes: Mapping[str, tuple] | None = None,
                 input_values: Mapping[str, np.ndarray] | None = None):
        self.input_shapes = dict(input_shapes or {})
        self.input_values = dict(input_values or {})

    def run(self, graph: Graph) -> bool:
        changed = specialize_inputs(graph, self.input_shapes)
        changed = bind_inputs(graph, self.input_values) or changed
        return reinfer(graph) or changed
