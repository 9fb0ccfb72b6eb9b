"""Checks of an ONNX model that the importer runs before and while it builds the graph, for what ONNX's
checker and ONNX Runtime refuse and for Kiln's own limits.

* ``check_model`` walks the whole ModelProto once, without recursion, before anything is imported:
  every string field must be valid UTF-8 (protobuf hands an invalid one over as ``bytes``, which no
  name may be), subgraphs must not be nested deeper than ``max_nesting_depth``, and the model (all
  its graphs) must not hold more than ``max_nodes`` nodes.
* ``check_node_schema``: a node's number of inputs and outputs and its attributes' types (INT, FLOAT,
  ...) must be what the op's ONNX schema says (``epsilon=1`` as an INT on BatchNormalization is refused,
  as ONNX Runtime refuses it), and the attributes it requires must be there (a Cast without ``to``).
* ``declared_type_problem``: a declared type (a graph output, a value_info) must agree with the type
  Kiln computes for the value (kind, element type, rank, and static dims where asked).
"""
from __future__ import annotations

import functools

import onnx
from google.protobuf.descriptor import FieldDescriptor

from compiler.errors import LimitError, ModelError, UnsupportedError
from compiler.ir.parser import MAX_NESTING_DEPTH  # noqa: F401 - the default depth limit, as for IR text
from compiler.ir.types import DType, OptionalType, SequenceType, TensorType

#: the default node-count limit of ``import_model``
MAX_NODES = 1_000_000

#: string fields that Kiln never reads (free text): not required to be valid UTF-8
_FREE_TEXT = frozenset({"doc_string"})


def onnx_type_name(code: int) -> str:
    """The name of an ONNX element type code (``FLOAT``), also for a code ONNX does not define."""
    try:
        return onnx.TensorProto.DataType.Name(code)
    except ValueError:
        return f"{code} (not an ONNX element type)"


def attribute_type_name(code: int) -> str:
    try:
        return onnx.AttributeProto.AttributeType.Name(code)
    except ValueError:
        return f"{code} (not an ONNX attribute type)"


@functools.lru_cache(maxsize=None)
def _fields(descriptor) -> tuple:
    """A message type's (single string fields, repeated string fields, single message fields, repeated
    message fields), by name."""
    out: tuple = ([], [], [], [])
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_STRING and f.name not in _FREE_TEXT:
            out[1 if f.is_repeated else 0].append(f.name)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            out[3 if f.is_repeated else 2].append(f.name)
    return out


# an entry of the walk: (message, parent entry, field name, index in a repeated field or None, graph depth)

def _path(entry) -> str:
    """``graph.node[3] (If 'cond').attribute[0] ('then_branch').g...``: where a message is in the model."""
    parts = []
    while entry is not None and entry[1] is not None:
        msg, parent, field, index, _depth = entry
        label = field if index is None else f"{field}[{index}]"
        if isinstance(msg, onnx.NodeProto):
            label += f" ({_show(msg.op_type)}{' ' + repr(_show(msg.name)) if msg.name else ''})"
        elif isinstance(msg, onnx.AttributeProto):
            label += f" ({_show(msg.name)!r})"
        parts.append(label)
        entry = parent
    return ".".join(reversed(parts))


def _holder(entry) -> str:
    """``If node 'n3' in graph 'then_1', attribute 'then_branch'``: the node whose attribute a subgraph is."""
    attr = entry[1]
    node = attr[1] if attr is not None else None
    graph = node[1] if node is not None else None
    if not (attr and isinstance(attr[0], onnx.AttributeProto) and node and isinstance(node[0], onnx.NodeProto)):
        return _path(entry)
    n = node[0]
    name = repr(_show(n.name)) if n.name else f"#{node[3]}"
    in_graph = f" in graph {_show(graph[0].name)!r}" if graph and isinstance(graph[0], onnx.GraphProto) else ""
    return f"{_show(n.op_type)} node {name}{in_graph}, attribute {_show(attr[0].name)!r}"


def _show(s) -> str:
    return s if isinstance(s, str) else repr(s)


def _not_utf8(entry, field: str, index: int | None, value: bytes) -> ModelError:
    where = _path(entry)
    field = field if index is None else f"{field}[{index}]"
    return ModelError(f"{where + '.' if where else ''}{field} is not valid UTF-8: {value[:40]!r} (ONNX names and "
                      "strings are UTF-8 text)")


def _too_many_nodes(max_nodes: int) -> LimitError:
    return LimitError(f"the model has more than {max_nodes:,} nodes (its graph and subgraphs together): "
                            f"over Kiln's limit (import_model's max_nodes={max_nodes})")


def check_model(proto: onnx.ModelProto, max_nesting_depth: int = MAX_NESTING_DEPTH,
                max_nodes: int = MAX_NODES) -> None:
    """Refuse a model with a string that is not UTF-8 (``ModelError``), subgraphs nested deeper than
    ``max_nesting_depth`` or more than ``max_nodes`` nodes (``LimitError``). One pass over the messages, without
    recursion; large data (raw_data, float_data, ...) is never read. Also refused: an IR version that is
    not set or newer than the installed ``onnx`` knows, and no opset_import at all since IR version 3
    (ONNX Runtime refuses those too)."""
    if proto.ir_version <= 0:
        raise ModelError(f"the model's ir_version is {proto.ir_version}: not set (every ONNX model says which "
                         "IR version it follows)")
    if proto.ir_version >= 3 and not proto.opset_import:
        raise ModelError(f"the model (IR version {proto.ir_version}) has no opset_import: it does not say which "
                         "ONNX opset its ops follow")
    if proto.ir_version > onnx.IR_VERSION:
        raise UnsupportedError(f"the model's ir_version is {proto.ir_version}, newer than the installed onnx "
                               f"package knows ({onnx.IR_VERSION})")
    if len(proto.graph.node) > max_nodes:  # at once, without walking them
        raise _too_many_nodes(max_nodes)
    nodes = 0
    stack: list = [(proto, None, "", None, 0)]
    while stack:
        entry = stack.pop()
        msg, _parent, _field, _index, depth = entry
        if isinstance(msg, onnx.NodeProto):
            nodes += 1
            if nodes > max_nodes:
                raise _too_many_nodes(max_nodes)
        elif isinstance(msg, onnx.GraphProto):
            depth += 1  # the model's graph is 1: nested depth - 1 deep
            if depth - 1 > max_nesting_depth:
                raise LimitError(
                    f"{_holder(entry)}: subgraphs are nested {depth - 1} deep, deeper than Kiln's limit "
                    f"(import_model's max_nesting_depth={max_nesting_depth})")
        singles, repeats, messages, message_lists = _fields(msg.DESCRIPTOR)
        for name in singles:  # protobuf gives a string that is not UTF-8 as bytes
            if type(getattr(msg, name)) is bytes:
                raise _not_utf8(entry, name, None, getattr(msg, name))
        for name in repeats:
            values = getattr(msg, name)
            if values and bytes in map(type, values):
                k = next(k for k, v in enumerate(values) if type(v) is bytes)
                raise _not_utf8(entry, name, k, values[k])
        for name in messages:
            if msg.HasField(name):
                stack.append((getattr(msg, name), entry, name, None, depth))
        for name in message_lists:
            stack.extend((sub, entry, name, k, depth) for k, sub in enumerate(getattr(msg, name)))


@functools.lru_cache(maxsize=None)
def _schema(op_type: str, domain: str, opset: int):
    """(min inputs, max inputs, min outputs, max outputs, {attribute: type}, [required attributes]) of
    the op's ONNX schema at ``opset``, or None for an op ONNX does not define (another domain, or a
    newer op)."""
    try:
        s = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    return (s.min_input, s.max_input, s.min_output, s.max_output,
            {name: int(a.type) for name, a in s.attributes.items()},
            sorted(name for name, a in s.attributes.items() if a.required))


def check_node_schema(proto: onnx.NodeProto, domain: str, opset: int, where) -> None:
    """The node must have as many inputs and outputs as the op's ONNX schema (at this opset) allows,
    each attribute the type the schema gives it, and every attribute the schema requires (a Cast
    without ``to`` is refused, not cast to a default type)."""
    schema = _schema(proto.op_type, domain, opset)
    if schema is None:
        return
    lo_in, hi_in, lo_out, hi_out, types, required = schema
    for what, n, lo, hi in (("inputs", len(proto.input), lo_in, hi_in), ("outputs", len(proto.output), lo_out, hi_out)):
        if not lo <= n <= hi:
            allowed = f"{lo}" if lo == hi else f"{lo} or more" if hi >= 2 ** 31 - 1 else f"{lo} to {hi}"
            raise ModelError(where(f"has {n} {what}; {proto.op_type} (opset {opset}) takes {allowed}"))
    given = {a.name for a in proto.attribute}
    missing = [name for name in required if name not in given]
    if missing:
        raise ModelError(where(f"required attribute {missing[0]!r} is missing ({proto.op_type}, opset {opset})"))
    for a in proto.attribute:
        want = types.get(a.name)
        if want is not None and a.type != want and not a.ref_attr_name:
            raise ModelError(where(f"attribute {a.name!r} is given as {attribute_type_name(a.type)}, but "
                                   f"{proto.op_type} (opset {opset}) takes a {attribute_type_name(want)}"))


def declared_type_problem(tp: onnx.TypeProto, t, dims: bool = False) -> str | None:
    """Why the ONNX type ``tp`` a model declares for a value disagrees with ``t``, the type Kiln
    computes for it (None when they agree). Compared: the kind (tensor or sequence), the element type, a
    tensor's rank, and with ``dims`` its dims where both are static; an optional agrees with its element
    (ONNX's own tests declare a Loop's optional sequence result as a sequence)."""
    kind = tp.WhichOneof("value")
    if kind == "optional_type":
        return declared_type_problem(tp.optional_type.elem_type, t, dims)
    if isinstance(t, OptionalType):
        t = t.elem
    if kind == "tensor_type":
        code = tp.tensor_type.elem_type
        if not isinstance(t, TensorType):
            return f"declared a tensor, but it is {t}"
        if code and code != t.dtype.onnx:
            return f"declared {_elem_name(code)}, but it is computed as {t}"
        if tp.tensor_type.HasField("shape"):
            declared = tp.tensor_type.shape.dim
            if len(declared) != t.rank:
                return f"declared with rank {len(declared)}, but it is computed as {t}"
            for i, (d, got) in enumerate(zip(declared, t.shape)):
                if dims and d.HasField("dim_value") and isinstance(got, int) and d.dim_value != got:
                    return f"declared with dimension {i} = {d.dim_value}, but it is computed as {t}"
    elif kind == "sequence_type":
        if not isinstance(t, SequenceType):
            return f"declared a sequence, but it is {t}"
        elem = tp.sequence_type.elem_type
        if elem.WhichOneof("value") == "tensor_type" and elem.tensor_type.elem_type \
                and elem.tensor_type.elem_type != t.dtype.onnx:
            return f"declared a sequence of {_elem_name(elem.tensor_type.elem_type)}, but it is {t}"
    return None


def _elem_name(code: int) -> str:
    try:
        return str(DType.from_onnx(code))
    except TypeError:
        return onnx_type_name(code)
