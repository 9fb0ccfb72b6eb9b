"""Memory-aware scheduling: reorder ``graph.nodes`` (a topological order) to lower peak live bytes.

Any topological order computes the same results; the order decides which intermediates are alive
at once, so the arena's lower bound (docs/memory.md). ``ScheduleForMemory`` simulates the memory
the program builder will plan for an order (``peak_bytes``, with the live ranges the builder uses,
``ir/liveness.py``: a result is live from its node to its last reader, a view op's result shares
its input's buffer, graph inputs and constants take no arena memory, graph outputs live to the end)
and tries:

* the order as it is;
* a greedy list scheduler: among the ready nodes, the one whose net allocation (bytes it
  allocates less bytes it frees) is lowest, ties to the earliest in the current order;
* the same, preferring to finish a branch: ready nodes that read what the last node made come
  first (depth-first, as a DenseNet or Inception block wants: finish a branch, free it, go on).

It keeps the order with the lowest peak, and the current one unless another is strictly lower,
so it never makes the peak worse and running it twice changes nothing. Graphs holding control flow
(subgraphs may read outer values that are not node inputs) are left as they are; fused kernels
(``kiln.Kernel``, whose bodies read only their inputs) are scheduled like any node.
"""
from __future__ import annotations

from typing import Sequence

from ..ir.graph import Graph, Node, Value
from ..ir.liveness import live_ranges, peak
from ..ir.ops import shape as sh
from ..ir.ops.base import graph_fields
from ..ir.ops.kernel import Kernel
from ..ir.types import TensorType
from .manager import Pass

VIEW_OPS = (sh.Reshape, sh.Flatten, sh.Squeeze, sh.Unsqueeze, sh.Identity)
ALIGN = 64


def _bytes(v: Value) -> int:
    t = v.type
    if not isinstance(t, TensorType) or not t.is_static:
        return 0
    return -(-max(t.nbytes or 0, 1) // ALIGN) * ALIGN


class _Model:
    """Buffers and their readers for one graph: what scheduling a node allocates and frees."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.buf: dict[int, int] = {}        # id(value) -> id(root value) (views share their input's)
        self.size: dict[int, int] = {}       # id(root) -> bytes (0: not in the arena)
        outside = {id(v) for v in graph.inputs} | {id(c) for c in graph.constants}
        for n in graph.nodes:
            for v in n.outputs:
                if isinstance(n.op, VIEW_OPS) and n.inputs and n.inputs[0] is not None:
                    self.buf[id(v)] = self.buf.get(id(n.inputs[0]), id(n.inputs[0]))
                else:
                    self.buf[id(v)] = id(v)
                    self.size[id(v)] = _bytes(v)
        for key in outside:
            self.size[key] = 0
        self.kept = {self.root(v) for v in graph.outputs}
        #: per node, the distinct buffers it reads
        self.reads: dict[int, list[int]] = {}
        self.readers: dict[int, int] = {}
        for n in graph.nodes:
            rs = list(dict.fromkeys(self.root(v) for v in n.inputs if v is not None))
            self.reads[id(n)] = rs
            for r in rs:
                self.readers[r] = self.readers.get(r, 0) + 1

    def root(self, v: Value) -> int:
        return self.buf.get(id(v), id(v))

    def allocates(self, n: Node) -> int:
        return sum(self.size.get(id(v), 0) for v in n.outputs if self.buf.get(id(v)) == id(v))

    def peak(self, order: Sequence[Node]) -> int:
        """Most bytes live at one node of ``order`` (the live ranges the program builder plans with:
        ``ir/liveness.py``)."""
        ranges = live_ranges(order, self.root, self.graph.outputs)
        return peak(ranges, lambda r: self.size.get(r, 0))

    def greedy(self, order: Sequence[Node], branch_first: bool) -> list[Node]:
        """A list schedule: repeatedly the ready node with the lowest (net allocation, position in
        ``order``), where a node's net allocation only falls as other readers of its inputs run; with
        ``branch_first``, the ready nodes that read what the last node made come first. The ready
        nodes are kept in a heap with lazy deletion (an entry is stale once its node has run or its
        score fell), so a graph of n nodes takes O(n log n), not O(n^2)."""
        import heapq

        rank = {id(n): i for i, n in enumerate(order)}
        producer: dict[int, Node] = {id(v): n for n in order for v in n.outputs}
        deps: dict[int, int] = {}
        users: dict[int, list[Node]] = {}
        readers_of: dict[int, list[Node]] = {}
        for n in order:
            preds = {id(producer[id(v)]) for v in n.inputs if v is not None and id(v) in producer}
            deps[id(n)] = len(preds)
            for p in preds:
                users.setdefault(p, []).append(n)
            for r in self.reads[id(n)]:
                readers_of.setdefault(r, []).append(n)
        pending = dict(self.readers)
        done: set[int] = set()

        def score(n: Node) -> int:
            freed = sum(self.size.get(r, 0) for r in self.reads[id(n)] if pending[r] == 1 and r not in self.kept)
            return self.allocates(n) - freed

        heap = [(score(n), rank[id(n)], n) for n in order if deps[id(n)] == 0]
        heapq.heapify(heap)
        ready = {id(n) for _, _, n in heap}
        out: list[Node] = []
        fresh: list[Node] = []  # the nodes the last one made ready: the only ones that read its results
        while ready:
            best = None
            if branch_first and fresh:
                best = min(fresh, key=lambda n: (score(n), rank[id(n)]))
            while best is None:
                sc, _, n = heapq.heappop(heap)
                if id(n) in ready and sc == score(n):
                    best = n
            ready.discard(id(best))
            done.add(id(best))
            out.append(best)
            for r in self.reads[id(best)]:
                pending[r] -= 1
                if pending[r] == 1 and r not in self.kept and self.size.get(r, 0):
                    for u in readers_of[r]:  # its last reader now frees it: a lower score
                        if id(u) in ready:
                            heapq.heappush(heap, (score(u), rank[id(u)], u))
            fresh = []
            for u in users.get(id(best), ()):
                deps[id(u)] -= 1
                if deps[id(u)] == 0:
                    ready.add(id(u))
                    fresh.append(u)
                    heapq.heappush(heap, (score(u), rank[id(u)], u))
        return out


def peak_bytes(graph: Graph, order: Sequence[Node] | None = None) -> int:
    """The most bytes live at once when ``graph`` runs in ``order`` (default: ``graph.nodes``)."""
    return _Model(graph).peak(list(graph.nodes) if order is None else order)


class ScheduleForMemory(Pass):
    """Reorder nodes (still a topological order) to lower the peak of live intermediate bytes."""

    name = "schedule-memory"
    preserves = ("shapes", "values")

    def __init__(self):
        self.report: dict[str, int] = {}

    def run(self, graph: Graph) -> bool:
        if any(graph_fields(type(n.op)) and not isinstance(n.op, Kernel) for n in graph.nodes):
            self.report = {"refused": 1}
            return False  # bodies may read outer values that are not node inputs
        model = _Model(graph)
        current = list(graph.nodes)
        best, best_peak = current, model.peak(current)
        self.report = {"before": best_peak}
        for branch_first in (False, True):
            order = model.greedy(current, branch_first)
            if len(order) != len(current):
                continue  # not a DAG as seen here: leave it
            p = model.peak(order)
            if p < best_peak:
                best, best_peak = order, p
        self.report["after"] = best_peak
        if best is current or [id(n) for n in best] == [id(n) for n in current]:
            return False
        graph.reorder(best)
        return True


__all__ = ["ScheduleForMemory", "peak_bytes"]
