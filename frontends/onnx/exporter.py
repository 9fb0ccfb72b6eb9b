"""Kiln IR → ONNX: constants become initializers, every node one ONNX node at the IR's opset;
control-flow bodies become subgraph attributes again (their captures, references to outer names)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.errors import UnsupportedError
from compiler.ir.graph import Graph, Value
from compiler.ir.ops.kernel import Kernel
from compiler.ir.types import DType, OptionalType, SequenceType, TensorType

#: the lowest opset an exported model declares: every op's IR form is valid from here on
EXPORT_MIN_OPSET = 18


def _type_proto(t) -> onnx.TypeProto:
    """The ONNX type of an IR type (a sequence's known length is not expressible, and dropped)."""
    if isinstance(t, TensorType):
        return helper.make_tensor_type_proto(t.dtype.onnx, list(t.shape))
    if isinstance(t, SequenceType):
        shape = None if t.elem_shape is None else list(t.elem_shape)
        return helper.make_sequence_type_proto(helper.make_tensor_type_proto(t.dtype.onnx, shape))
    if isinstance(t, OptionalType):
        return helper.make_optional_type_proto(_type_proto(t.elem))
    raise UnsupportedError(f"cannot export a value of type {t!r}")


def _value_info(name: str, t) -> onnx.ValueInfoProto:
    if isinstance(t, TensorType):
        return helper.make_tensor_value_info(name, t.dtype.onnx, [d if d is not None else None for d in t.shape])
    return helper.make_value_info(name, _type_proto(t))


def _array_to_tensor(arr: np.ndarray, name: str) -> onnx.TensorProto:
    if arr.dtype == object:
        t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.STRING, dims=arr.shape)
        t.string_data.extend(s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in arr.ravel())
        return t
    return numpy_helper.from_array(np.ascontiguousarray(arr).reshape(arr.shape), name=name)  # keeps 0-d


def _attribute(name: str, value) -> onnx.AttributeProto:
    if isinstance(value, DType):
        return helper.make_attribute(name, value.onnx)
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, _array_to_tensor(value, name))
    if isinstance(value, onnx.TypeProto):
        return helper.make_attribute(name, value)
    if isinstance(value, (TensorType, SequenceType, OptionalType)):
        return helper.make_attribute(name, _type_proto(value))
    if isinstance(value, tuple):
        if value and all(isinstance(v, np.ndarray) for v in value):
            return helper.make_attribute(name, [_array_to_tensor(v, name) for v in value])
        if value and all(isinstance(v, float) for v in value):
            return helper.make_attribute(name, list(value), attr_type=onnx.AttributeProto.FLOATS)
        if value and all(isinstance(v, str) for v in value):
            return helper.make_attribute(name, list(value), attr_type=onnx.AttributeProto.STRINGS)
        return helper.make_attribute(name, [int(v) for v in value], attr_type=onnx.AttributeProto.INTS)
    if isinstance(value, bool):
        return helper.make_attribute(name, int(value))
    return helper.make_attribute(name, value)


def _required_attributes(op_name: str, domain: str, opset: int) -> set[str]:
    """Attributes the ONNX schema requires (written even when they hold Kiln's default)."""
    try:
        schema = onnx.defs.get_schema(op_name, opset, domain)
    except Exception:
        return set()
    return {name for name, a in schema.attributes.items() if a.required}


def _unique(name: str, taken: set[str]) -> str:
    n, k = name, 1
    while n in taken:
        n, k = f"{name}_{k}", k + 1
    taken.add(n)
    return n


def _all_nodes(graph: Graph):
    """The nodes of ``graph`` and of every subgraph within (for the opsets the model needs)."""
    for n in graph.nodes:
        yield n
        for v in n.op.attributes().values():
            if isinstance(v, Graph):
                yield from _all_nodes(v)


def _captures(op) -> int:
    """How many trailing inputs of a node (and of each of its bodies) are captured outer values."""
    fn = getattr(op, "captures", None)
    return fn() if callable(fn) else 0


def export_model(graph: Graph, opset: int | None = None) -> onnx.ModelProto:
    """An ONNX model computing the same as ``graph`` (checked by onnx.checker in the tests).

    A fused ``kiln.Kernel`` is written as the nodes of its body, inline. A control-flow body becomes
    a GraphProto attribute; its capture inputs (the IR's explicit form of
    the outer values a body reads) become references to the outer values' names again, as ONNX
    requires. Names are unique across the model and its subgraphs."""
    names: dict[Value, str] = {}
    taken: set[str] = set()

    def name_of(v: Value, hint: str | None = None) -> str:
        if v in names:
            return names[v]
        base = hint or v.name or (f"{v.producer.op.name.lower()}_{len(names)}" if v.producer else f"v{len(names)}")
        n, k = base, 1
        while n in taken:
            n, k = f"{base}_{k}", k + 1
        taken.add(n)
        names[v] = n
        return n

    domains: dict[str, int] = {}
    needed = EXPORT_MIN_OPSET
    for n in _all_nodes(graph):
        needed = max(needed, n.op.since)
    opset = opset or needed
    node_names: set[str] = set()

    def export_nodes(g: Graph) -> list[onnx.NodeProto]:
        nodes = []
        for n in g.nodes:
            if isinstance(n.op, Kernel):  # a fused kernel: ONNX has none, so its nodes go inline
                body = n.op.body
                for inner, v in zip(body.inputs, n.inputs):
                    names[inner] = name_of(v)
                for inner, v in zip(body.outputs, n.outputs):
                    names.setdefault(inner, name_of(v))
                nodes += [helper.make_node("Constant", [], [name_of(c)], value=_array_to_tensor(c.const, name_of(c)))
                          for c in body.constants]
                nodes += export_nodes(body)
                continue
            if n.op.domain:
                domains[n.op.domain] = max(domains.get(n.op.domain, 1), n.op.since)
            caps = _captures(n.op)
            onnx_inputs = n.inputs[:len(n.inputs) - caps] if caps else n.inputs
            in_names = [name_of(v) if v is not None else "" for v in n.inputs]
            node = helper.make_node(n.op.name, in_names[:len(onnx_inputs)], [name_of(v) for v in n.outputs],
                                    name=_unique(n.name, node_names) if n.name else "", domain=n.op.domain)
            attrs = n.op.non_default_attributes()
            attrs.pop("num_captures", None)  # the IR's count of capture inputs: no ONNX attribute
            field_of = {v: k for k, v in n.op.onnx_attr_names.items()}
            for a in _required_attributes(n.op.name, n.op.domain, opset if not n.op.domain else 1000):
                k = field_of.get(a, a)
                if k not in attrs and getattr(n.op, k, None) is not None:
                    attrs[k] = getattr(n.op, k)
            rename = n.op.onnx_attr_names
            for k, v in sorted(attrs.items()):
                if isinstance(v, Graph):
                    outer = n.inputs[len(n.inputs) - caps:] if caps else []
                    node.attribute.append(helper.make_attribute(rename.get(k, k), export_body(v, outer)))
                else:
                    node.attribute.append(_attribute(rename.get(k, k), v))
            nodes.append(node)
        return nodes

    def export_body(body: Graph, outer: list[Value]) -> onnx.GraphProto:
        caps = len(outer)
        own = body.inputs[:len(body.inputs) - caps] if caps else body.inputs
        for inner, v in zip(body.inputs[len(own):], outer):
            names[inner] = name_of(v)  # a capture: the outer value, by name
        inputs = [_value_info(name_of(v), v.type) for v in own]
        nodes = [helper.make_node("Constant", [], [name_of(c)], value=_array_to_tensor(c.const, name_of(c)))
                 for c in body.constants]
        nodes += export_nodes(body)
        outputs, used = [], set()
        for name, v in zip(body.output_names, body.outputs):
            if v.producer is not None and v.producer.graph is body and v not in used:
                used.add(v)
                outputs.append(_value_info(names[v], v.type))
            else:  # an input, a capture, a constant or a repeated value: through an Identity
                out = name_of(Value(v.type), hint=name)
                nodes.append(helper.make_node("Identity", [name_of(v)], [out]))
                outputs.append(_value_info(out, v.type))
        return helper.make_graph(nodes, body.name, inputs, outputs)

    # graph inputs keep their names; node results that are graph outputs take the output's name
    inputs = [_value_info(name_of(v), v.type) for v in graph.inputs]
    for name, v in zip(graph.output_names, graph.outputs):
        if v.producer is not None and v not in names and name not in taken:
            names[v] = name
            taken.add(name)
    initializers = [_array_to_tensor(c.const, name_of(c)) for c in graph.constants]
    nodes = export_nodes(graph)
    outputs = []
    for name, v in zip(graph.output_names, graph.outputs):
        if names[v] != name:  # an input, a constant or a repeated value: rename through Identity
            if name in taken:
                raise UnsupportedError(f"cannot export: output name {name!r} is also an internal value name")
            nodes.append(helper.make_node("Identity", [names[v]], [name]))
            taken.add(name)
        outputs.append(_value_info(name, v.type))
    model = helper.make_model(
        helper.make_graph(nodes, graph.name, inputs, outputs, initializers),
        opset_imports=[helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains.items()],
        producer_name="kiln")
    model.ir_version = min(model.ir_version, 10)
    return model
