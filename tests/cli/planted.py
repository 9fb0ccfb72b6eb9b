"""A deliberately wrong pass, planted by tests to check that ``kiln dump --check`` names it."""
from __future__ import annotations

from compiler.passes.manager import Pass


class SkewFirstWeights(Pass):
    """Multiplies the largest floating-point constant (a weight) by 1.01: a 1% error."""

    name = "planted-wrong-pass"

    def run(self, graph):
        weights = [c for c in graph.constants if c.dtype.is_float]
        if not weights:
            return False
        c = max(weights, key=lambda c: c.const.size)
        c.replace_all_uses_with(graph.add_constant(c.const * c.const.dtype.type(1.01), name=c.name))
        graph.remove_unused_constants()
        return True
