"""Dead-code elimination: nodes none of whose results is used, and unused constants."""
from __future__ import annotations

from ...ir.graph import Graph
from ..manager import Pass


class EliminateDead(Pass):
    """Erase nodes whose results are all unused (to a fixed point), then unused constants."""

    name = "eliminate-dead"

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in reversed(list(graph.nodes)):
            if all(not v.uses for v in node.outputs):
                graph.remove(node)
                changed = True
        return graph.remove_unused_constants() > 0 or changed
