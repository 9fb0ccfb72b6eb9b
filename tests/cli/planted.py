"""A deliberately wrong pass, planted by tests to check that ``kiln dump --check`` names it."""
from __future__ import annotations

from compiler.passes.manager import Pass


class SkewFirstWeights(Pass):
    """Multiplies the largest floating-point constant (a weight) by 1.01: a 1% error."""

    name = "planted-wrong-pass"

    def run(self, graph):
        # the graph's constants and those of fused kernels' bodies (where -O2 moves the weights)
        weights = [(g, c) for g in [graph] + graph.subgraphs() for c in g.constants if c.dtype.is_float]
        if not weights:
            return False
        g, c = max(weights, key=lambda gc: gc[1].const.size)
        c.replace_all_uses_with(g.add_constant(c.const * c.const.dtype.type(1.01), name=c.name))
        g.remove_unused_constants()
        return True
