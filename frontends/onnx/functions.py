"""ONNX functions at import: the ops of ``EXPANDED`` become ONNX's own definition of them.

ONNX defines many newer ops as *functions*: a body of simpler ops (``Attention`` is MatMul, scale,
mask, Softmax, MatMul; ``SwiGLU`` a split, Sigmoid and products). For the ops listed in ``EXPANDED`` Kiln
imports that body instead of the op: every op in it
has native code (Kiln's own ops of these names run in the reference interpreter). The body comes from ONNX's schema for the
model's opset (``get_context_dependent_function_with_opset_version`` where it depends on the input
types), and ``onnx.inliner`` splices it into the graph (names prefixed, attributes substituted),
so the result is exactly what ONNX means by the op. An op whose schema has no function at that
opset, whose input types are unknown, or that reads float16/bfloat16 (Kiln's own op computes those in
float32 and rounds once; the body would round every step, and has no native kernels for them either)
is imported as the op, except for the ops of ``WIDENED`` (Attention, LinearAttention): their narrow nodes become
float32 nodes between Casts, whose bodies are expanded (the same single rounding, native code).
"""
from __future__ import annotations

import onnx
import onnx.checker
import onnx.defs
import onnx.inliner
import onnx.shape_inference

from compiler.errors import ModelError

#: ops imported as their ONNX function body (each in ONNX's default domain)
EXPANDED = frozenset({"Attention", "CausalConvWithState", "SwiGLU",
                      "GroupNormalization", "MeanVarianceNormalization", "SpaceToDepth", "DepthToSpace",
                      "CenterCropPad", "LinearAttention"})
#: ops whose float16/bfloat16 nodes are imported as float32 ones between Casts (then expanded):
#: Kiln's own op computes them in float32 and rounds the results once, which is what the Casts give
WIDENED = frozenset({"Attention", "LinearAttention"})
#: the values ONNX defines for attributes that neither its inference nor the op's function body checks
#: (a body computes something for any value: an is_causal of 2 as causal, a qk_matmul_output_mode of 7
#: as some other mode, a negative softcap as its magnitude, where ONNX Runtime and ONNX's reference
#: apply none), so an expanded node with another value is refused, as Kiln's own op refuses it:
#: (op, attribute) -> (what the value must be, the test)
ALLOWED_VALUES = {
    ("Attention", "is_causal"): ("0 or 1", lambda v: v in (0, 1)),
    ("Attention", "qk_matmul_output_mode"): ("0, 1, 2 or 3", lambda v: v in (0, 1, 2, 3)),
    ("Attention", "softcap"): (">= 0 (0: none)", lambda v: v >= 0),
}
#: the domain the expanded nodes' functions are put in before they are inlined
DOMAIN = "kiln.expanded"
_NARROW = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def expand_functions(model: onnx.ModelProto, ops=EXPANDED) -> onnx.ModelProto:
    """``model`` with the main graph's nodes of ``ops`` replaced by their function bodies (the model
    itself when there is none to replace)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    nodes = [n for n in model.graph.node if n.op_type in ops and n.domain in ("", "ai.onnx")]
    if opset is None or not nodes:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    types = _types(out)
    found = False
    order: list[onnx.NodeProto] = []
    for node in out.graph.node:  # narrow nodes of WIDENED ops: float32 nodes between Casts
        if node.op_type in WIDENED and node.op_type in ops and node.domain in ("", "ai.onnx"):
            before, after = _widen(node, types)
            order += before + [node] + after
        else:
            order.append(node)
    if len(order) != len(out.graph.node):
        del out.graph.node[:]
        out.graph.node.extend(order)
    for i, node in enumerate(n for n in out.graph.node if n.op_type in ops and n.domain in ("", "ai.onnx")):
        fn = _function(node, opset, types)
        if fn is None:
            continue
        fn.name, fn.domain = f"{node.op_type}_{i}", DOMAIN
        node.op_type, node.domain = fn.name, DOMAIN
        out.functions.append(fn)
        found = True
    if not found:
        return model
    out.opset_import.add(domain=DOMAIN, version=1)
    return onnx.inliner.inline_selected_functions(out, [(DOMAIN, f.name) for f in out.functions
                                                        if f.domain == DOMAIN])


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Value name -> type, from the graph's declarations and ONNX's shape inference where it works."""
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - a model shape inference rejects keeps its declared types
        graph = model.graph
    types = {v.name: v.type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    for t in graph.initializer:
        types.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    return types


def _widen(node: onnx.NodeProto, types: dict) -> tuple[list, list]:
    """Casts to float32 of ``node``'s float16/bfloat16 inputs, which it now reads, and of its results
    (renamed) back to that type: (the Casts before, the Casts after); none when it reads no narrow
    float. ``types`` learns the new names."""
    narrow = [types[x].tensor_type.elem_type for x in node.input if x and x in types
              and types[x].tensor_type.elem_type in _NARROW]
    if not narrow:
        return [], []
    tag = node.name or node.output[0]
    before, after = [], []
    for k, name in enumerate(node.input):
        t = types.get(name)
        if name and t is not None and t.tensor_type.elem_type in _NARROW:
            wide = f"{name}__f32__{tag}"
            before.append(onnx.helper.make_node("Cast", [name], [wide], to=onnx.TensorProto.FLOAT))
            types[wide] = onnx.TypeProto()
            types[wide].CopyFrom(t)
            types[wide].tensor_type.elem_type = onnx.TensorProto.FLOAT
            node.input[k] = wide
    for k, name in enumerate(node.output):
        if name:
            node.output[k] = f"{name}__f32"
            after.append(onnx.helper.make_node("Cast", [node.output[k]], [name], to=narrow[0]))
    return before, after


def _check_node(node: onnx.NodeProto, schema, opset: int, types: dict) -> None:
    """``ALLOWED_VALUES``, then ONNX's own inference on ``node`` (its inputs' types known): what its
    schema forbids (an input the op's attributes rule out) is a ModelError naming the node, not a body
    that silently ignores it."""
    name = f" {node.name!r}" if node.name else ""
    for a in node.attribute:
        rule = ALLOWED_VALUES.get((node.op_type, a.name))
        value = a.i if a.type == onnx.AttributeProto.INT else a.f if a.type == onnx.AttributeProto.FLOAT else None
        if rule is not None and value is not None and not rule[1](value):
            raise ModelError(f"{node.op_type} node{name} (opset {opset}): attribute {a.name!r} must be {rule[0]}, "
                             f"got {value}")
    known = {x: types[x] for x in node.input if x and x in types}
    if schema.deprecated or any(x and x not in known for x in node.input):
        return  # (ONNX's inference refuses a deprecated op outright: GroupNormalization-18)
    try:
        onnx.shape_inference.infer_node_outputs(schema, node, known)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        why = str(e).split("] ", 1)[-1]
        raise ModelError(f"{node.op_type} node{name} (opset {opset}): {why}") from None


def _function(node: onnx.NodeProto, opset: int, types: dict) -> onnx.FunctionProto | None:
    """ONNX's function body for ``node`` at ``opset``, or None."""
    ins = [types.get(x) for x in node.input]
    if any(t is not None and t.tensor_type.elem_type in _NARROW for t in ins):
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    _check_node(node, schema, opset, types)
    for name, attr in schema.attributes.items():  # the body refers to them: give defaults explicitly
        if attr.default_value.name and not any(a.name == name for a in node.attribute):
            node.attribute.append(attr.default_value)
    fn = onnx.FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    ctx = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if plain and (not ctx or max(plain) >= max(ctx)):
        fn.ParseFromString(schema.get_function_with_opset_version(max(plain)))
    elif ctx:
        if any(x and t is None for x, t in zip(node.input, ins)):
            return None
        blank = onnx.TypeProto()
        fn.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            max(ctx), node.SerializeToString(), [(t or blank).SerializeToString() for t in ins]))
    else:
        return None
    return fn if fn.node else None


__all__ = ["DOMAIN", "EXPANDED", "WIDENED", "expand_functions"]
