"""ONNX → Kiln IR.

``import_model(path | bytes | ModelProto, input_shapes=None, ...) -> Graph``: initializers become constants,
``Constant`` nodes become constants too, and every other node becomes one IR node (or a few, where an
older opset's form is rewritten into the IR's one form; see ``converters.py``).

Subgraph attributes (the bodies of If, Loop, Scan, SequenceMap) import recursively as graphs of their
own, *closure-converted*: a value of an enclosing graph that a body reads by name becomes an extra
input of the body (after its ONNX inputs) and of the node (after its ONNX inputs), through every level
of nesting, so no IR value is used across graph boundaries (see ``convert_control.py``).

What ONNX's checker and ONNX Runtime refuse is refused here too, with a ``ModelError`` naming the
value, node or attribute (``checks.py``): strings that are not UTF-8, an IR version not set, no
opset_import, initializers, inputs or outputs listed twice, nodes with more or fewer inputs, outputs
than their schema allows or attributes of another type, declared types that the computed ones
disagree with, negative dims, unknown element types; and so are models over Kiln's limits
(``max_nodes``, ``max_nesting_depth``), with a ``LimitError``.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.errors import ModelError, UnsupportedError
from compiler.ir import ops
from compiler.ir.graph import Graph, Value
from compiler.ir.ops.base import OpError
from compiler.ir.types import DType, OptionalType, SequenceType, TensorType

from . import converters
from .checks import (MAX_NESTING_DEPTH, MAX_NODES, attribute_type_name, check_model, check_node_schema,
                     declared_type_problem, onnx_type_name)
from .functions import expand_functions

#: the opsets of the default domain Kiln imports (1-6 for the old models of ONNX's pytorch suites)
MIN_OPSET = 1


def max_opset() -> int:
    return onnx.defs.onnx_opset_version()


def load_proto(model) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto, with a clear error for a bad file."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        data, where = bytes(model), "the given bytes"
    else:
        path = os.fspath(model)
        if not os.path.exists(path):
            raise ModelError(f"no such model file: {path}")
        with open(path, "rb") as f:
            data = f.read()
        where = path
    if not data:
        raise ModelError(f"{where} is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError and friends
        if "MaxDepth" in str(e) or "recursion" in str(e).lower():
            raise ModelError(f"{where} is nested too deeply for protobuf to read (its limit is 100 nested "
                             "messages, about 32 levels of subgraphs)") from None
        raise ModelError(f"{where} is not a valid ONNX model (truncated or corrupt file?): "
                         f"{type(e).__name__}: {e}") from None
    if not proto.HasField("graph") or not (proto.graph.node or proto.graph.output):
        raise ModelError(f"{where} holds no ONNX graph (truncated or corrupt file, or not an ONNX model)")
    if not isinstance(model, (bytes, bytearray)) and any(
            t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        try:
            onnx.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(where)))
        except Exception as e:
            raise ModelError(f"{where}: cannot load external weights: {e}") from None
    return proto


def _opsets(proto: onnx.ModelProto) -> dict[str, int]:
    found = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in proto.opset_import}
    if "" not in found:
        found[""] = 1 if proto.ir_version < 3 else max_opset()
    return found


def _elem_and_shape(tt: onnx.TypeProto.Tensor, what: str) -> tuple[DType, tuple | None]:
    """A tensor type's element type and shape (None when the proto gives no shape: unknown rank)."""
    try:
        dt = DType.from_onnx(tt.elem_type)
    except TypeError:
        if tt.elem_type not in onnx.TensorProto.DataType.values():
            raise ModelError(f"{what}: element type {tt.elem_type} is not an ONNX element type") from None
        raise UnsupportedError(f"{what}: element type {onnx_type_name(tt.elem_type)} is not supported") from None
    if dt.np is None:
        raise UnsupportedError(f"{what}: element type {dt} needs the ml_dtypes package")
    if not tt.HasField("shape"):
        return dt, None
    dims = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            if d.dim_value < 0:
                raise ModelError(f"{what}: dimension {i} is {d.dim_value}; a dimension is >= 0 (an unknown size "
                                 "is a dim_param, or no value)")
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dt, tuple(dims)


def type_from_proto(tp: onnx.TypeProto, what: str) -> TensorType | SequenceType | OptionalType:
    """The IR type of an ONNX type: a tensor (its rank must be known), a sequence of tensors (their
    rank may be unknown) or an optional of either."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        dt, shape = _elem_and_shape(tp.tensor_type, what)
        if shape is None:
            raise ModelError(f"{what} has no shape (unknown rank); give its shape with input_shapes=")
        return TensorType(dt, shape)
    if kind == "sequence_type":
        elem = tp.sequence_type.elem_type
        if elem.WhichOneof("value") != "tensor_type":
            raise UnsupportedError(f"{what}: only sequences of tensors are supported, not of "
                                   f"{elem.WhichOneof('value')} values")
        dt, shape = _elem_and_shape(elem.tensor_type, what)
        # ONNX types each element on its own: a dim_param does not say that every element has the same
        # size (ONNX's SequenceMap tests give seq(float[N]) elements of different lengths), which is what
        # a symbolic dim of an IR sequence means, so it imports as unknown
        if shape is not None:
            shape = tuple(None if isinstance(d, str) else d for d in shape)
        return SequenceType(dt, shape)
    if kind == "optional_type":
        elem = tp.optional_type.elem_type
        if elem.WhichOneof("value") not in ("tensor_type", "sequence_type"):
            raise UnsupportedError(f"{what}: only optional tensors and sequences are supported, not optional "
                                   f"{elem.WhichOneof('value')} values")
        return OptionalType(type_from_proto(elem, what))
    raise UnsupportedError(f"{what}: only tensors, sequences and optionals are supported, not {kind} values")


def specialize(t, shape: Sequence, name: str):
    """``t`` with the shape the user gave: a tensor's shape, a sequence's element shape (also where the
    model leaves its rank unknown), the shape inside an optional."""
    if isinstance(t, OptionalType):
        return OptionalType(specialize(t.elem, shape, name))
    shape = _user_shape(shape, name)
    if isinstance(t, SequenceType):
        if t.elem_shape is None:
            return SequenceType(t.dtype, shape, t.length)
        old_shape = t.elem_shape
    else:
        old_shape = t.shape
    if len(shape) != len(old_shape):
        raise ModelError(f"input_shapes[{name!r}] = {list(shape)} has rank {len(shape)}, the model's input "
                         f"is {t}")
    for i, (old, new) in enumerate(zip(old_shape, shape)):
        if isinstance(old, int) and old != new:
            raise ModelError(f"input_shapes[{name!r}]: dimension {i} is fixed to {old} by the model, not {new}")
    if isinstance(t, SequenceType):
        return SequenceType(t.dtype, shape, t.length)
    return t.with_shape(shape)


def _user_shape(shape, name: str) -> tuple:
    """A shape given in ``input_shapes=``: dims are ints >= 0, names (symbolic sizes) or None."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ModelError(f"input_shapes[{name!r}] = {shape!r}: a shape is a sequence of dims, such as (1, 3, 224, 224)")
    dims = []
    for i, d in enumerate(shape):
        if isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d >= 0:
            dims.append(int(d))
        elif d is None or (isinstance(d, str) and d):
            dims.append(d)
        else:
            raise ModelError(f"input_shapes[{name!r}] = {list(shape)!r}: dimension {i} is {d!r}; a dimension is "
                             "an integer >= 0, a name (a symbolic size) or None")
    return tuple(dims)


def _utf8(b: bytes, what: str) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelError(f"{what}: {b[:40]!r} is not valid UTF-8 (ONNX strings are UTF-8 text)") from None


def tensor_to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise ModelError(f"{what}: cannot read tensor data: {e}") from None
    if arr.dtype.kind in "SU":
        arr = arr.astype(object)
    if arr.dtype == object:
        arr = np.array([_utf8(x, what) if isinstance(x, bytes) else x for x in arr.ravel()],
                       dtype=object).reshape(arr.shape)
    return arr


def attribute_value(a: onnx.AttributeProto, what: str):
    A = onnx.AttributeProto
    if a.type == A.FLOAT:
        return a.f
    if a.type == A.INT:
        return a.i
    if a.type == A.STRING:
        return _utf8(a.s, what)
    if a.type == A.TENSOR:
        return tensor_to_array(a.t, what)
    if a.type == A.FLOATS:
        return tuple(a.floats)
    if a.type == A.INTS:
        return tuple(a.ints)
    if a.type == A.STRINGS:
        return tuple(_utf8(s, what) for s in a.strings)
    if a.type == A.TENSORS:
        return tuple(tensor_to_array(t, what) for t in a.tensors)
    if a.type == A.TYPE_PROTO:  # Optional's type: an IR type
        if a.tp.HasField("tensor_type") and not a.tp.tensor_type.HasField("shape"):
            raise UnsupportedError(f"{what}: a tensor type without a shape (unknown rank) is not supported")
        return type_from_proto(a.tp, what)
    if a.type == A.GRAPH:  # a body: imported by the op's converter, which knows its input types
        return a.g
    if a.type == A.GRAPHS:
        raise UnsupportedError(f"{what}: lists of subgraphs are not supported")
    raise UnsupportedError(f"{what}: attribute type {attribute_type_name(a.type)} is not supported")


class NodeContext:
    """What a converter sees of one ONNX node while it is imported."""

    def __init__(self, importer: "_Importer", proto: onnx.NodeProto, opset: int):
        self.importer = importer
        self.proto = proto
        self.op_type = proto.op_type
        self.domain = "" if proto.domain in ("", "ai.onnx") else proto.domain
        self.opset = opset
        self.name = proto.name or None
        check_node_schema(proto, self.domain, opset, self.where)
        self.attrs = {a.name: attribute_value(a, self.where(f"attribute {a.name!r}")) for a in proto.attribute}
        self.inputs: list[Value | None] = [importer.lookup(n, self) if n else None for n in proto.input]
        while self.inputs and self.inputs[-1] is None:
            self.inputs.pop()
        outs = list(proto.output)
        while outs and not outs[-1]:
            outs.pop()
        self.num_outputs = len(outs)

    @property
    def graph(self) -> Graph:
        return self.importer.graph

    def where(self, detail: str = "") -> str:
        node = f"node {self.proto.name!r}" if self.proto.name else f"node #{self.importer.index}"
        dom = f"{self.domain}." if self.domain else ""
        s = f"{dom}{self.op_type} {node} (opset {self.opset})"
        return f"{s}: {detail}" if detail else s

    def const(self, array, dtype: DType | None = None) -> Value:
        """A new constant (for an attribute an older opset had where the IR form takes an input)."""
        return self.graph.add_constant(np.asarray(array, dtype=None if dtype is None else dtype.np))

    def emit(self, op: ops.OpDef, inputs: Sequence[Value | None], num_outputs: int | None = None) -> list[Value]:
        node = self.graph.add_node(op, list(inputs), name=self.name, num_outputs=num_outputs)
        return list(node.outputs)

    def make(self, cls: type[ops.OpDef], attrs: Mapping | None = None) -> ops.OpDef:
        """Build an op from attributes, naming unknown or bad ones clearly."""
        attrs = dict(self.attrs if attrs is None else attrs)
        for k, v in attrs.items():
            if isinstance(v, onnx.GraphProto):
                raise UnsupportedError(self.where(
                    f"attribute {k!r}: subgraph attributes are supported on If, Loop, Scan and SequenceMap only"))
        for field, onnx_name in cls.onnx_attr_names.items():
            if onnx_name in attrs:
                attrs[field] = attrs.pop(onnx_name)
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(attrs) - fields)
        if unknown:
            raise UnsupportedError(self.where(
                f"attribute(s) {', '.join(unknown)} not supported (Kiln's {cls.name} takes: "
                f"{', '.join(sorted(fields)) or 'no attributes'})"))
        return cls(**attrs)

    def subgraph(self, attr: str, input_types: Sequence) -> tuple[Graph, list[tuple[str, Value]]]:
        """Import the body in attribute ``attr`` whose ONNX inputs have ``input_types`` (the ONNX
        value infos give only element types, which must agree). Returns the body and its captures:
        (name, value of the enclosing graph) for each extra body input after the ONNX ones."""
        gp = self.attrs.get(attr)
        if not isinstance(gp, onnx.GraphProto):
            raise ModelError(self.where(f"attribute {attr!r} (a graph) is missing"))
        try:
            return _BodyImporter(self.importer, gp, input_types, self.where(f"attribute {attr!r}")).run_body()
        except UnsupportedError as e:
            raise UnsupportedError(self.where(f"in attribute {attr!r}: {e}")) from e
        except ModelError as e:
            raise ModelError(self.where(f"in attribute {attr!r}: {e}")) from e


class _Importer:
    def __init__(self, proto: onnx.ModelProto, input_shapes: Mapping[str, Sequence] | None):
        self.proto = proto
        self.opsets = _opsets(proto)
        self.input_shapes = dict(input_shapes or {})
        #: static dims declared for outputs are checked only when input_shapes= did not change the inputs
        self.specialized = bool(input_shapes)
        self.graph = Graph(proto.graph.name or "main")
        self.values: dict[str, Value] = {}
        self.index = 0
        #: where this graph is in the model: (node index, node and attribute) for each enclosing body
        self.path: tuple = ()
        #: (path, node index, attribute, body input types) -> the loop-carried types found for that body
        #: (convert_control), so a body imported again does not search for its inner loops' types again
        self.carried_types: dict = {}

    def resolve(self, name: str) -> Value | None:
        """The value ``name`` stands for here (in a body: capturing it from an enclosing graph)."""
        return self.values.get(name)

    def lookup(self, name: str, ctx: NodeContext) -> Value:
        v = self.resolve(name)
        if v is None:
            raise ModelError(ctx.where(f"input {name!r} is not defined by any earlier node, input or initializer "
                                       "(the graph is not in topological order, or is malformed)"))
        return v

    def run(self) -> Graph:
        opset = self.opsets[""]
        if not MIN_OPSET <= opset <= max_opset():
            raise UnsupportedError(f"model uses opset {opset} of the default ONNX domain; Kiln imports opsets "
                                   f"{MIN_OPSET} to {max_opset()}")
        g = self.proto.graph
        self.add_initializers(g)
        listed: set[str] = set()
        for vi in g.input:
            if vi.name in listed:
                raise ModelError(f"graph input {vi.name!r} is listed twice (input names are unique)")
            listed.add(vi.name)
            if vi.name in self.values:  # an initializer also listed as input (IR version < 4): a constant
                if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type == 0:
                    raise ModelError(f"graph input {vi.name!r} (an initializer) declares element type 0 "
                                     f"(UNDEFINED), which no input may have")
                problem = declared_type_problem(vi.type, self.values[vi.name].type, dims=True)
                if problem:
                    raise ModelError(f"graph input {vi.name!r} (an initializer) is {problem}")
                continue
            t = type_from_proto(vi.type, f"input {vi.name!r}")
            if vi.name in self.input_shapes:
                t = specialize(t, self.input_shapes.pop(vi.name), vi.name)
            self.values[vi.name] = self.graph.add_input(vi.name, t)
        if self.input_shapes:
            raise ModelError(f"input_shapes names unknown input(s) {sorted(self.input_shapes)}; the model's "
                             f"inputs are {[v.name for v in self.graph.inputs]}")
        for self.index, node in enumerate(g.node):
            self.convert(node)
        outs = []
        for vi in g.output:
            if vi.name not in self.values:
                raise ModelError(f"graph output {vi.name!r} is not computed by any node")
            outs.append(self.values[vi.name])
        self.check_declared(g, "graph")
        self.graph.set_outputs(outs, [vi.name for vi in g.output])
        for vi in list(g.input) + list(g.value_info):
            if vi.name in self.values and not self.values[vi.name].name:
                self.values[vi.name].name = vi.name
        return self.graph

    def add_initializers(self, g: onnx.GraphProto) -> None:
        for t in g.initializer:
            if t.name in self.values:
                raise ModelError(f"initializer {t.name!r} is defined twice (names are unique in a graph)")
            arr = tensor_to_array(t, f"initializer {t.name!r}")
            self.values[t.name] = self.graph.add_constant(arr, name=t.name)
        for t in g.sparse_initializer:
            raise UnsupportedError(f"sparse initializer {t.values.name!r} is not supported")

    def check_declared(self, g: onnx.GraphProto, kind: str) -> None:
        """The types the ``kind`` (graph or body) declares for its outputs and in its value_info must be
        what the values are computed as (kind, element type and rank; static dims in the model's graph
        when ``input_shapes=`` was not given); output names are unique."""
        seen: set[str] = set()
        for vi in g.output:
            if vi.name in seen:
                raise ModelError(f"{kind} output {vi.name!r} is listed twice (output names are unique)")
            seen.add(vi.name)
        dims = kind == "graph" and not self.specialized
        for what, vis in ((f"{kind} output", g.output), ("value_info of", g.value_info)):
            for vi in vis:
                v = self.values.get(vi.name)
                problem = declared_type_problem(vi.type, v.type, dims) if v is not None else None
                if problem:
                    raise ModelError(f"{what} {vi.name!r} is {problem} (a declared type must be the computed one)")

    def convert(self, node: onnx.NodeProto) -> None:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = self.opsets.get(domain)
        ctx = NodeContext(self, node, opset if opset is not None else 0)
        convert = converters.CONVERTERS.get((domain, node.op_type))
        cls = ops.lookup(node.op_type, domain)
        if convert is None and cls is None:
            raise UnsupportedError(ctx.where(
                f"op {node.op_type!r} is not supported by Kiln (see docs/ops.md for the {len(ops.BY_NAME)} "
                "supported ops)"))
        try:
            outs = convert(ctx) if convert is not None else converters.generic(ctx, cls)
        except (UnsupportedError, ModelError):
            raise
        except (OpError, TypeError, ValueError, IndexError) as e:
            raise ModelError(ctx.where(str(e))) from e
        names = [n for n in node.output]
        for name, v in zip(names, outs):
            if name:
                if name in self.values:
                    raise ModelError(ctx.where(f"output {name!r} is defined twice (the graph is not SSA)"))
                self.values[name] = v
                if v.name is None:
                    v.name = name


class _BodyImporter(_Importer):
    """Imports one subgraph, capturing the values of enclosing graphs it reads (closure conversion)."""

    def __init__(self, parent: _Importer, gp: onnx.GraphProto, input_types: Sequence, where: str):
        self.parent = parent
        self.proto = parent.proto
        self.opsets = parent.opsets
        self.input_shapes = {}
        self.gp = gp
        self.input_types = list(input_types)
        self.where = where
        self.graph = Graph(gp.name or "body")
        self.values: dict[str, Value] = {}
        self.index = 0
        self.captures: list[tuple[str, Value]] = []
        self.path = parent.path + ((parent.index, where),)
        self.carried_types = parent.carried_types

    def resolve(self, name: str) -> Value | None:
        v = self.values.get(name)
        if v is not None:
            return v
        outer = self.parent.resolve(name)
        if outer is None:
            return None
        taken = {x.name for x in self.graph.inputs}
        inner_name, k = name, 1
        while inner_name in taken:
            inner_name, k = f"{name}_{k}", k + 1
        v = self.graph.add_input(inner_name, outer.type)
        self.values[name] = v
        self.captures.append((name, outer))
        return v

    def run_body(self) -> tuple[Graph, list[tuple[str, Value]]]:
        gp = self.gp
        if len(gp.input) != len(self.input_types):
            raise ModelError(f"{self.where}: the body has {len(gp.input)} input(s), the op gives it "
                             f"{len(self.input_types)}")
        self.add_initializers(gp)
        for vi, t in zip(gp.input, self.input_types):
            declared = vi.type.WhichOneof("value")
            if declared == "tensor_type" and vi.type.tensor_type.elem_type and isinstance(t, TensorType):
                try:
                    dt = DType.from_onnx(vi.type.tensor_type.elem_type)
                except TypeError:
                    dt = None
                if dt is not None and dt is not t.dtype:
                    raise ModelError(f"{self.where}: body input {vi.name!r} is declared {dt}, but the op gives it {t}")
            if vi.name in self.values:
                raise ModelError(f"{self.where}: body input {vi.name!r} is defined twice")
            self.values[vi.name] = self.graph.add_input(vi.name, t)
        for self.index, node in enumerate(gp.node):
            self.convert(node)
        outs = []
        for vi in gp.output:
            v = self.resolve(vi.name)
            if v is None:
                raise ModelError(f"{self.where}: body output {vi.name!r} is not computed by any node")
            outs.append(v)
        self.check_declared(gp, "body")
        self.graph.set_outputs(outs, [vi.name for vi in gp.output])
        return self.graph, self.captures


def import_model(model, input_shapes: Mapping[str, Sequence] | None = None, *,
                 max_nesting_depth: int = MAX_NESTING_DEPTH, max_nodes: int = MAX_NODES) -> Graph:
    """Import an ONNX model (a path, serialized bytes or a ModelProto) as a Kiln graph.

    ``input_shapes`` maps input names to shapes that replace the model's symbolic dimensions (each dim
    an int >= 0, a name, or None).

    Limits (``LimitError`` past them, checked before anything is imported):
    ``max_nesting_depth`` (default 64): how deep subgraphs (the bodies of If, Loop, Scan, SequenceMap)
    may be nested; the model's graph is depth 0, an If's branch in it depth 1.
    ``max_nodes`` (default 1,000,000): how many nodes the model may hold, its subgraphs' included.

    A malformed model (what ONNX's checker or ONNX Runtime refuses) raises ``ModelError``; an op,
    opset, element type or attribute Kiln does not support raises ``UnsupportedError``.
    """
    proto = load_proto(model)
    check_model(proto, max_nesting_depth, max_nodes)
    expanded = expand_functions(proto)
    if expanded is not proto:
        try:
            return _Importer(expanded, input_shapes).run()
        except (ModelError, UnsupportedError):
            pass  # the op itself says what is wrong better than its body can: import it as written
    return _Importer(proto, input_shapes).run()
