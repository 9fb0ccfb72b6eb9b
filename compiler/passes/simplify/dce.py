"""Dead-code elimination: nodes none of whose results is used, and unused constants."""
from __future__ import annotations

from ...ir.graph import Graph
from ..manager import Pass


class EliminateDead(Pass):
    """Erase nodes whose results are all unused (to a fixed point), then unused constants; in
    control-flow bodies too (a body's inputs stay: they are its signature)."""

    name = "eliminate-dead"

    def run(self, graph: Graph) -> bool:
        changed = any([self.run(b) for b in graph.subgraphs()])
        for node in reversed(list(graph.nodes)):
            if all(not v.uses for v in node.outputs):
                graph.remove(node)
                changed = True
        return graph.remove_unused_constants() > 0 or changed
