"""A copy of a graph, and where each of its values went (through the text format, which keeps the
node order: the copy's node i is the original's node i)."""
from __future__ import annotations

from typing import Callable

from .graph import Graph, Value
from .parser import parse
from .printer import external_weights, print_graph


def clone(graph: Graph) -> tuple[Graph, Callable[[Value], Value]]:
    """(a copy of ``graph``, the copy's value for a graph input or node result of ``graph``)."""
    copy = parse(print_graph(graph), external_weights(graph))
    where: dict[int, Value] = {id(v): copy.input(v.name) for v in graph.inputs}
    if len(copy.nodes) != len(graph.nodes):
        raise AssertionError(f"the copy of {graph.name} has {len(copy.nodes)} nodes, not {len(graph.nodes)}")
    for a, b in zip(graph.nodes, copy.nodes):
        for va, vb in zip(a.outputs, b.outputs):
            if va is not None:
                where[id(va)] = vb

    def of(v: Value) -> Value:
        if id(v) not in where:
            raise KeyError(f"{v} is not an input or node result of {graph.name}")
        return where[id(v)]

    return copy, of


__all__ = ["clone"]
