"""Constant folding: nodes whose inputs are all constant become constants.

Shape arithmetic folds too: a ``Shape`` of a statically shaped value is known even though the value
is not, so ``Shape → Gather → Concat → Reshape`` chains collapse to a constant shape. Folding is
bounded: a result larger than ``limit_bytes`` stays a node (so a ``ConstantOfShape`` of a huge shape
never blows up memory).
"""
from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ...ir.interpreter import run_node
from ..manager import Pass


class FoldConstants(Pass):
    """Nodes with constant (or compile-time known) results become constants, within a size limit."""

    name = "fold-constants"

    def __init__(self, limit_bytes: int = 1 << 26):
        self.limit_bytes = limit_bytes

    def foldable(self, node: Node) -> str | None:
        """None when the node folds; otherwise why not (for tests and --explain)."""
        if not node.op.foldable:
            return f"{node.op.name} is not deterministic"
        if all(v.known is not None for v in node.outputs):
            return None
        if any(v is not None and v.const is None for v in node.inputs):
            return "an input is not constant"
        for v in node.outputs:
            if v.type.nbytes is None:
                return "the result shape is not static"
            if v.type.nbytes > self.limit_bytes:
                return f"the result ({v.type.nbytes} bytes) exceeds the folding limit ({self.limit_bytes} bytes)"
        return None

    def run(self, graph: Graph) -> bool:
        changed = any([self.run(b) for b in graph.subgraphs()])  # bodies fold within themselves
        for node in list(graph.nodes):
            if self.foldable(node) is not None:
                continue
            if all(v.known is not None for v in node.outputs):
                results = [v.known for v in node.outputs]
            else:
                results = run_node(node, [None if v is None else v.const for v in node.inputs])
            for v, r in zip(node.outputs, results):
                if v.uses:
                    c = graph.add_constant(np.asarray(r, dtype=v.dtype.np), name=v.name)
                    c.type = v.type if v.type.is_static else c.type
                    v.replace_all_uses_with(c)
            graph.remove(node)
            changed = True
        if changed:
            graph.remove_unused_constants()
        return changed
