"""Common-subexpression elimination: one node per (op, attributes, inputs); one constant per value."""
from __future__ import annotations

from ...ir.graph import Graph, Value
from ..manager import Pass

#: constants up to this size are deduplicated by content
CONST_DEDUP_LIMIT = 1 << 16


def _const_key(v: Value):
    c = v.const
    if c.dtype == object:
        return (v.type, tuple(c.ravel()))
    return (v.type, c.tobytes())


class EliminateCommonSubexpressions(Pass):
    """Identical constants become one; a node equal to an earlier one (same op, attributes and inputs)
    is replaced by it. Ops that are not deterministic (``foldable = False``: random) are never merged.
    Each control-flow body is a scope of its own (nothing is merged across graphs); two control-flow
    nodes merge only when they hold the very same body objects."""

    name = "eliminate-common-subexpressions"

    def run(self, graph: Graph) -> bool:
        changed = any([self.run(b) for b in graph.subgraphs()])
        seen_const: dict = {}
        for c in list(graph.constants):
            if c.const.nbytes > CONST_DEDUP_LIMIT or not c.uses:
                continue
            key = _const_key(c)
            first = seen_const.setdefault(key, c)
            if first is not c:
                c.replace_all_uses_with(first)
                changed = True
        if changed:
            graph.remove_unused_constants()
        seen: dict = {}
        for node in list(graph.nodes):
            if not node.op.foldable:
                continue
            key = (node.op.key(), tuple(id(v) if v is not None else None for v in node.inputs), len(node.outputs))
            first = seen.setdefault(key, node)
            if first is node:
                continue
            for a, b in zip(node.outputs, first.outputs):
                a.replace_all_uses_with(b)
            graph.remove(node)
            changed = True
        return changed
