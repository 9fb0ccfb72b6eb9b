"""Values, nodes and graphs: the SSA core of the IR.

SSA by construction: a value is defined exactly once, by a graph input, a constant or a node result,
and only a node creates its results. Use-lists are kept here (``Node.set_inputs`` is the one place
that changes them); passes read ``value.uses`` and call ``replace_all_uses_with`` / ``Graph.remove``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from .types import DType, TensorType

if TYPE_CHECKING:
    from .ops.base import OpDef

#: Constants up to this many elements are also "known" to shape inference (as are small results
#: computed from known inputs), so shape arithmetic resolves to static shapes without folding.
KNOWN_VALUE_LIMIT = 1 << 12


class IRError(Exception):
    """A malformed graph or an illegal IR operation."""


class Value:
    """An SSA value: a graph input, a constant (``const`` holds its data) or a node result."""

    __slots__ = ("type", "producer", "index", "uses", "name", "const", "known", "__weakref__")

    def __init__(self, type: TensorType, producer: "Node | None" = None, index: int = 0,
                 name: str | None = None, const: np.ndarray | None = None):
        self.type = type
        self.producer = producer
        self.index = index
        self.uses: list[tuple[Node | Return, int]] = []
        self.name = name
        self.const = const
        #: a small value known at compile time (constants, and results of known inputs); used by
        #: shape inference only, never printed
        self.known: np.ndarray | None = const if const is not None and const.size <= KNOWN_VALUE_LIMIT else None

    @property
    def kind(self) -> str:
        if self.producer is not None:
            return "result"
        return "const" if self.const is not None else "input"

    @property
    def users(self) -> list["Node"]:
        """The nodes that use this value (each once, in use order); the graph return is not a node."""
        seen: dict[int, Node] = {}
        for user, _ in self.uses:
            if isinstance(user, Node):
                seen.setdefault(id(user), user)
        return list(seen.values())

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self):
        return self.type.shape

    def replace_all_uses_with(self, other: "Value") -> None:
        if other is self:
            return
        for user, i in list(self.uses):
            user.set_input(i, other)

    def __repr__(self) -> str:
        what = self.producer.op.name if self.producer is not None else self.kind
        return f"<Value {self.name or '?'}: {self.type} ({what})>"


class Node:
    """One operation: an op definition applied to input values, defining its result values."""

    __slots__ = ("op", "inputs", "outputs", "name", "graph", "device")

    def __init__(self, op: "OpDef", inputs: Sequence[Value | None], result_types: Sequence[TensorType],
                 name: str | None = None, device: str | None = None):
        self.op = op
        self.inputs: list[Value | None] = []
        self.outputs = tuple(Value(t, producer=self, index=i) for i, t in enumerate(result_types))
        self.name = name
        self.graph: Graph | None = None
        self.device = device
        self.set_inputs(inputs)

    def set_inputs(self, inputs: Sequence[Value | None]) -> None:
        """Replace all inputs, keeping every use-list right (the one place that changes uses)."""
        for i, v in enumerate(self.inputs):
            if v is not None:
                v.uses.remove((self, i))
        self.inputs = list(inputs)
        for i, v in enumerate(self.inputs):
            if v is not None:
                if not isinstance(v, Value):
                    raise IRError(f"input {i} of {self.op.name} is not a Value: {v!r}")
                v.uses.append((self, i))

    def set_input(self, i: int, value: Value | None) -> None:
        old = self.inputs[i]
        if old is not None:
            old.uses.remove((self, i))
        self.inputs[i] = value
        if value is not None:
            value.uses.append((self, i))

    def drop_inputs(self) -> None:
        self.set_inputs([])

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise IRError(f"{self.op.name} has {len(self.outputs)} results, not one")
        return self.outputs[0]

    def describe(self) -> str:
        return f"{self.op.name} node {self.name!r}" if self.name else f"{self.op.name} node"

    def __repr__(self) -> str:
        return f"<Node {self.describe()}>"

    # Nodes compare by identity (the default); __eq__ is not overridden on purpose.
    __hash__ = object.__hash__


class Return:
    """The pseudo-user that stands for the graph's results in use-lists."""

    __slots__ = ("graph", "inputs")

    def __init__(self, graph: "Graph"):
        self.graph = graph
        self.inputs: list[Value] = []

    def set_input(self, i: int, value: Value) -> None:
        self.inputs[i].uses.remove((self, i))
        self.inputs[i] = value
        value.uses.append((self, i))


class Graph:
    """A function from named inputs to named outputs: inputs, constants, nodes in order, a return.

    ``nodes`` is kept in a valid topological order (the verifier checks it).

    Erasing a node and inserting one before another cost O(1): they are recorded, and the list is
    brought up to date in one pass when ``nodes`` is next read (a rewrite over 20,000 nodes would
    otherwise scan the list at every edit). ``nodes`` always reads as the plain, current list.
    """

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.constants: list[Value] = []
        self._nodes: list[Node] = []
        self._erased: set[int] = set()            # ids of erased nodes the list may still hold
        self._before: dict[int, list[Node]] = {}  # id(node) -> nodes inserted just before it, in order
        self.ret = Return(self)
        self.output_names: list[str] = []

    @property
    def nodes(self) -> list[Node]:
        if self._erased or self._before:
            self._settle()
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: list[Node]) -> None:
        self._nodes = nodes
        self._erased = set()
        self._before = {}

    def _settle(self) -> None:
        """Apply the recorded insertions and erasures to the node list (in place)."""
        before, erased = self._before, self._erased
        out: list[Node] = []
        if not before:
            out = [n for n in self._nodes if id(n) not in erased]
        else:
            for n in self._nodes:
                if id(n) not in before:
                    if id(n) not in erased:
                        out.append(n)
                    continue
                stack: list[tuple[Node, bool]] = [(n, False)]
                while stack:  # the nodes inserted before n (and before those), then n
                    x, expanded = stack.pop()
                    if expanded or id(x) not in before:
                        if id(x) not in erased:
                            out.append(x)
                    else:
                        stack.append((x, True))
                        stack.extend((p, False) for p in reversed(before[id(x)]))
        self._nodes[:] = out
        self._erased = set()
        self._before = {}

    def __getstate__(self) -> dict:  # pickle and copy: the recorded edits are keyed by id
        if self._erased or self._before:
            self._settle()
        return self.__dict__.copy()

    # -- building --------------------------------------------------------------------------------
    def add_input(self, name: str, type: TensorType) -> Value:
        v = Value(type, name=name)
        self.inputs.append(v)
        return v

    def add_constant(self, array, name: str | None = None, dtype: DType | None = None) -> Value:
        arr = np.asarray(array, dtype=dtype.np if dtype is not None else None)
        if arr.dtype.kind in "US":
            arr = arr.astype(object)
        v = Value(TensorType.of(arr), name=name, const=arr)
        self.constants.append(v)
        return v

    def add_node(self, op: "OpDef", inputs: Sequence[Value | None], name: str | None = None,
                 num_outputs: int | None = None, before: Node | None = None) -> Node:
        """Create a node whose result types come from the op's type inference, and append it
        (or insert it before ``before``)."""
        from .ops.base import infer_node  # local: ops import graph

        types, known = infer_node(op, inputs, num_outputs)
        node = Node(op, inputs, types, name=name)
        for v, k in zip(node.outputs, known):
            v.known = k
        self.insert(node, before=before)
        return node

    def add(self, op: "OpDef", *inputs: Value | None, name: str | None = None) -> Value:
        """Shorthand for a single-result node: returns its result."""
        return self.add_node(op, inputs, name=name).output

    def insert(self, node: Node, before: Node | None = None) -> Node:
        if node.graph is not None:
            raise IRError(f"{node.describe()} is already in a graph")
        if id(node) in self._erased:  # erased here and not yet dropped from the list: drop it first
            self._settle()
        node.graph = self
        if before is not None and before.graph is not self:  # not in the list, or an IR being broken
            self.nodes.insert(self.nodes.index(before), node)  # on purpose (tests): as a list does it
        elif before is None:
            self._nodes.append(node)
        else:
            self._before.setdefault(id(before), []).append(node)
        return node

    def set_outputs(self, values: Sequence[Value], names: Sequence[str] | None = None) -> None:
        for i, v in enumerate(self.ret.inputs):
            v.uses.remove((self.ret, i))
        self.ret.inputs = list(values)
        for i, v in enumerate(self.ret.inputs):
            v.uses.append((self.ret, i))
        if names is None:
            names = [v.name or f"output_{i}" for i, v in enumerate(values)]
        self.output_names = list(names)

    @property
    def outputs(self) -> list[Value]:
        return list(self.ret.inputs)

    # -- editing ---------------------------------------------------------------------------------
    def remove(self, node: Node) -> None:
        """Erase a node; refused while any of its results is still used."""
        for v in node.outputs:
            if v.uses:
                raise IRError(f"cannot erase {node.describe()}: result {v.index} still has "
                              f"{len(v.uses)} use(s)")
        node.drop_inputs()
        if node.graph is self:
            self._erased.add(id(node))  # dropped from the list when it is next read
        else:
            self.nodes.remove(node)  # ValueError: not in the list
        node.graph = None

    def remove_unused_constants(self) -> int:
        before = len(self.constants)
        self.constants = [c for c in self.constants if c.uses]
        return before - len(self.constants)

    # -- queries ---------------------------------------------------------------------------------
    def nodes_of(self, *op_classes) -> Iterator[Node]:
        for n in list(self.nodes):
            if isinstance(n.op, op_classes) and n.graph is self:
                yield n

    def subgraphs(self) -> list["Graph"]:
        """The graphs this graph's nodes hold as attributes (control-flow bodies: If's branches, the
        bodies of Loop, Scan and SequenceMap), in node order; not the graphs nested within those."""
        from .ops.base import graph_fields  # local: ops import graph

        out: list[Graph] = []
        for n in self.nodes:
            for f in graph_fields(type(n.op)):
                v = getattr(n.op, f)
                if isinstance(v, Graph) and all(v is not g for g in out):
                    out.append(v)
        return out

    def values(self) -> Iterable[Value]:
        yield from self.inputs
        yield from self.constants
        for n in self.nodes:
            yield from n.outputs

    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(f"graph has no input {name!r}; inputs: {[v.name for v in self.inputs]}")

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op.name] = counts.get(n.op.name, 0) + 1
        return dict(sorted(counts.items()))

    def __str__(self) -> str:
        from .printer import print_graph

        return print_graph(self)

    def __repr__(self) -> str:
        return f"<Graph @{self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes>"
