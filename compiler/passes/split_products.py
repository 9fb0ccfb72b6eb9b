"""split-products: a matrix product whose weights are too large for a device becomes several.

With devices (a multi-device pipeline compile), a node holds all its weights on one device, so a
Gemm or MatMul whose 2-D weight matrix B is larger than ``limit_bytes`` (half the largest device's
memory, as the pipeline sets it) could be placed nowhere. ``SplitProducts`` cuts B along its
output columns N into ``k = ceil(bytes / limit_bytes)`` pieces as even as they go, computes one
product per piece (the Gemm's bias cut the same way where it runs along N) and joins the results
with a Concat on the last axis: the same numbers, column by column, and pieces that
``split-devices`` can place on different devices. It runs before fusion, so each piece fuses with
what follows as the whole product would not (the join stays a Concat, written in place where the
program builder can).

B is cut where it is known: a constant (sliced), or a ``ConstantOfShape`` of a constant shape (one
per piece). A product refuses (``refusals``) when B is computed otherwise, or a Gemm's bias is a
computed value that would need cutting.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.linalg import Gemm, MatMul
from ..ir.ops.tensor import Concat, ConstantOfShape
from ..ir.types import TensorType
from .manager import Pass


class SplitProducts(Pass):
    """Cut products with weights over ``limit_bytes`` along N (see the module docstring)."""

    name = "split-products"
    preserves = ("shapes", "values")

    def __init__(self, limit_bytes: int):
        self.limit_bytes = int(limit_bytes)
        self.split: dict[str, int] = {}  # node -> pieces
        self.refusals: dict[str, str] = {}

    def run(self, graph: Graph) -> bool:
        self.split, self.refusals = {}, {}
        changed = False
        for n in list(graph.nodes):
            if not isinstance(n.op, (Gemm, MatMul)) or len(n.inputs) < 2:
                continue
            b = n.inputs[1]
            if not isinstance(b.type, TensorType) or not b.type.is_static or b.type.rank != 2:
                continue
            nbytes = int(b.type.nbytes or 0)
            if nbytes <= self.limit_bytes:
                continue
            why = self._refusal(n)
            if why:
                self.refusals[n.name or n.describe()] = why
                continue
            k = math.ceil(nbytes / self.limit_bytes)
            self._cut(graph, n, k)
            self.split[n.name or n.describe()] = k
            changed = True
        if changed:
            graph.remove_unused_constants()
        return changed

    # -- the rewrite ---------------------------------------------------------------------------
    @staticmethod
    def _columns_axis(n: Node) -> int:
        """The axis of B that runs along the output columns N."""
        return 0 if isinstance(n.op, Gemm) and n.op.transB else 1

    def _refusal(self, n: Node) -> str | None:
        b = n.inputs[1]
        if b.const is None and not _filled(b):
            return "its weights are computed (not a constant or a ConstantOfShape of a constant shape)"
        if isinstance(n.op, Gemm) and len(n.inputs) > 2 and n.inputs[2] is not None:
            c = n.inputs[2]
            n_cols = b.shape[self._columns_axis(n)]
            if c.type.rank and c.shape[-1] == n_cols and n_cols != 1 and c.const is None and not _filled(c):
                return "its bias runs along N and is computed"
        if n.outputs[0].type.rank < 1:
            return "its result has no column axis"
        return None

    def _cut(self, graph: Graph, n: Node, k: int) -> None:
        b = n.inputs[1]
        axis = self._columns_axis(n)
        cols = b.shape[axis]
        bounds = [cols * i // k for i in range(k + 1)]
        pieces = []
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            ins = list(n.inputs)
            ins[1] = _slice(graph, n, b, axis, lo, hi, f"{b.name or 'B'}_part{i}")
            if isinstance(n.op, Gemm) and len(ins) > 2 and ins[2] is not None:
                c = ins[2]
                if c.type.rank and c.shape[-1] == cols and cols != 1:
                    ins[2] = _slice(graph, n, c, c.type.rank - 1, lo, hi, f"{c.name or 'C'}_part{i}")
            name = f"{n.name}/part{i}" if n.name else None
            pieces.append(graph.add_node(n.op, ins, name=name, before=n).output)
        rank = n.outputs[0].type.rank
        joined = graph.add_node(Concat(axis=rank - 1), pieces, name=f"{n.name}/join" if n.name else None, before=n)
        n.outputs[0].replace_all_uses_with(joined.output)
        operands = list(n.inputs[1:])
        graph.remove(n)
        for v in operands:
            if v is not None:
                _drop_unused_fill(graph, v)


def _filled(v: Value) -> bool:
    """A ConstantOfShape of a constant shape (the light model-zoo networks' weights)."""
    p = v.producer
    return p is not None and isinstance(p.op, ConstantOfShape) and p.inputs[0] is not None \
        and p.inputs[0].const is not None


def _slice(graph: Graph, user: Node, v: Value, axis: int, lo: int, hi: int, name: str) -> Value:
    """Columns [lo, hi) of ``v`` along ``axis``: a sliced constant, or a ConstantOfShape of that shape."""
    if v.const is not None:
        index = [slice(None)] * v.const.ndim
        index[axis] = slice(lo, hi)
        return graph.add_constant(np.ascontiguousarray(v.const[tuple(index)]), name=name)
    fill = v.producer
    shape = np.array(v.shape, dtype=np.int64)
    shape[axis] = hi - lo
    return graph.add_node(fill.op, [graph.add_constant(shape, name=f"{name}_shape")], name=name, before=user).output


def _drop_unused_fill(graph: Graph, b: Value) -> None:
    p = b.producer
    if p is not None and not any(v.uses for v in p.outputs):
        graph.remove(p)


__all__ = ["SplitProducts"]
