"""Values, nodes and graphs: the SSA core of the IR.

SSA by construction: a value is defined exactly once, by a graph input, a constant or a node result,
and only a node creates its results. Use-lists are kept here (``Node.set_inputs`` / ``set_input`` and
``Graph.set_outputs`` are the only places that change them); passes read ``value.uses`` and call
``replace_all_uses_with``. The node order is kept here too: passes read ``graph.nodes`` and edit the
order with ``Graph.insert`` / ``add_node`` (at an insertion point), ``move_before`` / ``move_after``,
``remove`` and ``reorder``.

Every edit costs O(1) (``reorder``: O(n)), so a rewrite of a graph of tens of thousands of nodes stays
linear: the order is a doubly linked list through the nodes, and a value's uses an insertion-ordered
dict keyed by ``(user, i)``. Both iterate deterministically (the order of the graph; the order in
which the uses were made), so the same edits print the same IR.
"""
from __future__ import annotations

from contextlib import contextmanager
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


class Uses(dict):
    """A value's uses: ``(user, i)`` pairs, the value being input ``i`` of ``user`` (a ``Node``, or a
    graph's ``Return`` for a graph output), in the order they were made.

    Read-only outside this module (iterate, ``len``, ``in``, ``single()``); the IR adds and removes
    entries, in O(1) each. An insertion-ordered dict whose keys are the pairs (a dict itself, not a
    wrapper: a graph holds one per value, and each object more slows the garbage collector)."""

    __slots__ = ()

    def single(self) -> "tuple[Node | Return, int] | None":
        """The one use, or None when there are none or several."""
        return next(iter(self)) if len(self) == 1 else None

    def __repr__(self) -> str:
        return f"Uses({list(self)!r})"

    def __reduce__(self):  # pickle and copy without the blocked __setitem__
        return Uses._of, (list(self),)

    @staticmethod
    def _of(pairs) -> "Uses":
        u = Uses()
        for user, i in pairs:
            u._add(user, i)
        return u

    def _add(self, user: "Node | Return", i: int) -> None:
        dict.__setitem__(self, (user, i), None)

    def _remove(self, user: "Node | Return", i: int) -> None:
        try:
            dict.__delitem__(self, (user, i))
        except KeyError:
            raise IRError(f"input {i} of {user!r} is not in its value's use-list (a use-list edited by "
                          "hand?)") from None

    def _read_only(self, *args, **kwargs):
        raise IRError("a value's uses are kept by the IR: change them with Node.set_input / set_inputs, "
                      "Value.replace_all_uses_with or Graph.set_outputs")

    __setitem__ = __delitem__ = __ior__ = pop = popitem = clear = update = setdefault = _read_only  # type: ignore


class Value:
    """An SSA value: a graph input, a constant (``const`` holds its data) or a node result."""

    __slots__ = ("type", "producer", "index", "uses", "name", "const", "known", "__weakref__")

    def __init__(self, type: TensorType, producer: "Node | None" = None, index: int = 0,
                 name: str | None = None, const: np.ndarray | None = None):
        self.type = type
        self.producer = producer
        self.index = index
        self.uses = Uses()
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
    """One operation: an op definition applied to input values, defining its result values.

    ``prev`` / ``next`` are its neighbours in its graph's order (None at either end, or outside a
    graph)."""

    __slots__ = ("op", "inputs", "outputs", "name", "graph", "device", "_prev", "_next")

    def __init__(self, op: "OpDef", inputs: Sequence[Value | None], result_types: Sequence[TensorType],
                 name: str | None = None, device: str | None = None):
        self.op = op
        self.inputs: list[Value | None] = []
        self.outputs = tuple(Value(t, producer=self, index=i) for i, t in enumerate(result_types))
        self.name = name
        self.graph: Graph | None = None
        self.device = device
        self._prev: Node | _Ends | None = None  # the links of the graph's order (Graph keeps them)
        self._next: Node | _Ends | None = None
        self.set_inputs(inputs)

    def set_inputs(self, inputs: Sequence[Value | None]) -> None:
        """Replace all inputs, keeping every use-list right."""
        for i, v in enumerate(self.inputs):
            if v is not None:
                v.uses._remove(self, i)
        self.inputs = list(inputs)
        for i, v in enumerate(self.inputs):
            if v is not None:
                if not isinstance(v, Value):
                    raise IRError(f"input {i} of {self.op.name} is not a Value: {v!r}")
                v.uses._add(self, i)

    def set_input(self, i: int, value: Value | None) -> None:
        """Replace input ``i`` (O(1)), keeping both use-lists right."""
        old = self.inputs[i]
        if old is not None:
            old.uses._remove(self, i)
        self.inputs[i] = value
        if value is not None:
            value.uses._add(self, i)

    def drop_inputs(self) -> None:
        self.set_inputs([])

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise IRError(f"{self.op.name} has {len(self.outputs)} results, not one")
        return self.outputs[0]

    @property
    def prev(self) -> "Node | None":
        p = self._prev
        return p if isinstance(p, Node) else None

    @property
    def next(self) -> "Node | None":
        n = self._next
        return n if isinstance(n, Node) else None

    def describe(self) -> str:
        return f"{self.op.name} node {self.name!r}" if self.name else f"{self.op.name} node"

    def __repr__(self) -> str:
        return f"<Node {self.describe()}>"

    # pickle and copy: not the links (the graph relinks its nodes), so that a long order does not
    # recurse node by node
    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in Node.__slots__ if k not in ("_prev", "_next")}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._prev = self._next = None

    # Nodes compare by identity (the default); __eq__ is not overridden on purpose.
    __hash__ = object.__hash__


class Return:
    """The pseudo-user that stands for the graph's results in use-lists."""

    __slots__ = ("graph", "inputs")

    def __init__(self, graph: "Graph"):
        self.graph = graph
        self.inputs: list[Value] = []

    def set_input(self, i: int, value: Value) -> None:
        self.inputs[i].uses._remove(self, i)
        self.inputs[i] = value
        value.uses._add(self, i)


class _Ends:
    """The two ends of a graph's node order: the sentinel of its circular doubly linked list."""

    __slots__ = ("_prev", "_next")

    def __init__(self):
        self._prev = self._next = self


class NodeList(Sequence):
    """``graph.nodes``: the graph's nodes in order, as a read-only sequence (iterate, ``len``, index,
    slice, ``reversed``, ``in``, ``index``). It is a view: it always shows the current order.

    Iterating (and indexing) reads a list of the order that the graph makes again after an edit, in
    one O(n) walk, so editing the graph while iterating over ``graph.nodes`` is safe (the loop sees
    the order as it was when it started), and a pass that edits node by node while iterating costs
    O(n) in all. ``len`` and ``in`` are O(1)."""

    __slots__ = ("_graph",)

    def __init__(self, graph: "Graph"):
        self._graph = graph

    def __len__(self) -> int:
        return self._graph._count

    def __iter__(self) -> Iterator[Node]:
        return iter(self._graph._order())

    def __reversed__(self) -> Iterator[Node]:
        return reversed(self._graph._order())

    def __getitem__(self, i):
        return self._graph._order()[i]

    def __contains__(self, node) -> bool:
        return isinstance(node, Node) and node.graph is self._graph and node._prev is not None

    def index(self, node, start: int = 0, stop: int | None = None) -> int:
        return self._graph._order().index(node, start, len(self) if stop is None else stop)

    def __repr__(self) -> str:
        return f"NodeList({self._graph._order()!r})"


class Graph:
    """A function from named inputs to named outputs: inputs, constants, nodes in order, a return.

    ``nodes`` (a read-only ``NodeList``) is kept in a valid topological order (the verifier checks
    it). The order is edited only through the graph's methods, each O(1) but ``reorder``:

    * ``insert(node, before=, after=)`` / ``add_node(...)`` / ``add(...)``: at ``before`` or
      ``after`` a node, else at the insertion point (``with graph.inserting_before(n):`` /
      ``inserting_after(n)``), else at the end;
    * ``move_before(node, anchor)`` / ``move_after(node, anchor)``;
    * ``remove(node)``: erase a node whose results are unused;
    * ``reorder(nodes)``: a whole new order (all the nodes, each once), for passes that compute one.
    """

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.constants: list[Value] = []
        self._ends = _Ends()               # the node order: a circular doubly linked list
        self._count = 0
        self._array: list[Node] | None = []  # the order as a list, made again when read after an edit
        self._view = NodeList(self)
        self._insert_at: tuple[Node, bool] | None = None  # (anchor, after it?): see inserting_before
        self.ret = Return(self)
        self.output_names: list[str] = []

    @property
    def nodes(self) -> NodeList:
        """The nodes in order (read-only; edit through the graph's methods)."""
        return self._view

    def _order(self) -> list[Node]:
        """The order as a list (cached until the next edit; never changed in place)."""
        arr = self._array
        if arr is None:
            arr, ends = [], self._ends
            n = ends._next
            for _ in range(self._count):  # bounded: a broken chain (see _links_problem) cannot loop
                if n is ends:
                    break
                arr.append(n)
                n = n._next
            self._array = arr
        return arr

    # -- the links (every edit of the order goes through these two) ---------------------------------
    def _link(self, node: Node, nxt: "Node | _Ends") -> None:
        prv = nxt._prev
        node._prev, node._next = prv, nxt
        prv._next = node
        nxt._prev = node
        self._count += 1
        self._array = None

    def _unlink(self, node: Node) -> None:
        node._prev._next = node._next
        node._next._prev = node._prev
        node._prev = node._next = None
        self._count -= 1
        self._array = None

    def _anchor(self, node: Node, role: str) -> Node:
        if not isinstance(node, Node) or node.graph is not self or node._prev is None:
            raise IRError(f"{role} {node!r} is not a node of graph @{self.name}")
        return node

    def _links_problem(self) -> str | None:
        """What is wrong with the links of the order (None: they are a proper chain of ``len(nodes)``
        nodes); for the verifier."""
        ends, seen = self._ends, set()
        prev, n = ends, ends._next
        while n is not ends:
            k = len(seen)
            if not isinstance(n, Node):
                return f"the node order's links are broken at #{k}: {n!r} is not a node"
            if n._prev is not prev:
                return f"the node order's links are broken at #{k} ({n.describe()}): prev is not #{k - 1}"
            if id(n) in seen or k >= self._count:
                return f"the node order's links are broken: a cycle after #{k - 1}"
            seen.add(id(n))
            prev, n = n, n._next
        if ends._prev is not prev or len(seen) != self._count:
            return f"the node order holds {len(seen)} nodes, but the graph counts {self._count}"
        return None

    def __getstate__(self) -> dict:  # pickle and copy: the order as a list (nodes carry no links)
        state = self.__dict__.copy()
        state["_ends"] = list(self._order())
        state["_array"] = None
        state["_insert_at"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        order = state.pop("_ends")
        self.__dict__.update(state)
        self._ends, self._count = _Ends(), 0
        for n in order:
            self._link(n, self._ends)

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
                 num_outputs: int | None = None, before: Node | None = None, after: Node | None = None) -> Node:
        """Create a node whose result types come from the op's type inference, and insert it (where
        ``insert`` puts it)."""
        from .ops.base import infer_node  # local: ops import graph

        types, known = infer_node(op, inputs, num_outputs)
        node = Node(op, inputs, types, name=name)
        for v, k in zip(node.outputs, known):
            v.known = k
        self.insert(node, before=before, after=after)
        return node

    def add(self, op: "OpDef", *inputs: Value | None, name: str | None = None) -> Value:
        """Shorthand for a single-result node: returns its result."""
        return self.add_node(op, inputs, name=name).output

    def insert(self, node: Node, before: Node | None = None, after: Node | None = None) -> Node:
        """Put ``node`` (in no graph) into this graph's order: just before ``before``, just after
        ``after``, else at the insertion point, else at the end. O(1)."""
        if node.graph is not None or node._prev is not None:
            raise IRError(f"{node.describe()} is already in a graph")
        if before is not None and after is not None:
            raise IRError("insert: give before= or after=, not both")
        if before is not None:
            nxt = self._anchor(before, "before=")
        elif after is not None:
            nxt = self._anchor(after, "after=")._next
        elif self._insert_at is not None:
            anchor, is_after = self._insert_at
            nxt = self._anchor(anchor, "the insertion point")
            if is_after:
                nxt = anchor._next
                self._insert_at = (node, True)  # the next one goes after this one
        else:
            nxt = self._ends
        node.graph = self
        self._link(node, nxt)
        return node

    def inserting_before(self, node: Node):
        """``with graph.inserting_before(n):`` nodes inserted without ``before=`` / ``after=`` go
        just before ``n``, in the order they are made."""
        return self._inserting(self._anchor(node, "inserting_before:"), False)

    def inserting_after(self, node: Node):
        """``with graph.inserting_after(n):`` nodes inserted without ``before=`` / ``after=`` go
        just after ``n``, in the order they are made (each after the one before it)."""
        return self._inserting(self._anchor(node, "inserting_after:"), True)

    @contextmanager
    def _inserting(self, anchor: Node, after: bool) -> Iterator[None]:
        saved, self._insert_at = self._insert_at, (anchor, after)
        try:
            yield
        finally:
            self._insert_at = saved

    def move_before(self, node: Node, anchor: Node) -> None:
        """Move ``node`` just before ``anchor`` (both in this graph). O(1)."""
        self._move(node, self._anchor(anchor, "move_before: anchor"))

    def move_after(self, node: Node, anchor: Node) -> None:
        """Move ``node`` just after ``anchor`` (both in this graph). O(1)."""
        self._move(node, self._anchor(anchor, "move_after: anchor")._next)

    def _move(self, node: Node, nxt: "Node | _Ends") -> None:
        self._anchor(node, "move: node")
        if nxt is node:
            return
        self._unlink(node)
        self._link(node, nxt)

    def reorder(self, nodes: Iterable[Node]) -> None:
        """Give the graph the order ``nodes``: all of its nodes, each once (IRError otherwise). For
        passes that compute a whole new order (scheduling, fusion). O(n). That the order is
        topological is the verifier's to check."""
        order = list(nodes)
        ids = {id(n) for n in order}
        if len(order) != self._count or len(ids) != len(order) or any(
                not isinstance(n, Node) or n.graph is not self or n._prev is None for n in order):
            raise IRError(f"reorder: the new order must hold each of the graph's {self._count} nodes once "
                          f"(got {len(order)} entries, {len(ids)} distinct)")
        prev = self._ends
        for n in order:
            prev._next, n._prev = n, prev
            prev = n
        prev._next, self._ends._prev = self._ends, prev
        self._array = order

    def set_outputs(self, values: Sequence[Value], names: Sequence[str] | None = None) -> None:
        for i, v in enumerate(self.ret.inputs):
            v.uses._remove(self.ret, i)
        self.ret.inputs = list(values)
        for i, v in enumerate(self.ret.inputs):
            v.uses._add(self.ret, i)
        if names is None:
            names = [v.name or f"output_{i}" for i, v in enumerate(values)]
        self.output_names = list(names)

    @property
    def outputs(self) -> list[Value]:
        return list(self.ret.inputs)

    # -- editing ---------------------------------------------------------------------------------
    def remove(self, node: Node) -> None:
        """Erase a node of this graph (O(its inputs)); refused while any of its results is still used."""
        for v in node.outputs:
            if v.uses:
                raise IRError(f"cannot erase {node.describe()}: result {v.index} still has "
                              f"{len(v.uses)} use(s)")
        self._anchor(node, "remove:")
        node.drop_inputs()
        self._unlink(node)
        node.graph = None

    def remove_unused_constants(self) -> int:
        before = len(self.constants)
        self.constants = [c for c in self.constants if c.uses]
        return before - len(self.constants)

    # -- queries ---------------------------------------------------------------------------------
    def nodes_of(self, *op_classes) -> Iterator[Node]:
        for n in self._order():  # the order when the loop started (the caller may edit)
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
