"""Live ranges of buffers over a schedule: the one model of liveness that memory-aware scheduling
(``passes/schedule.py``) and the program builder's memory plan (``codegen/places.py``) share.

A schedule is a list of nodes (steps) in the order they run. Values that share a buffer (a view's
result and its input; a concat piece computed into its slice of the result) have one *root*, which
the caller names (``root``: value -> a key of its buffer). A buffer is live from the first step that
writes it to the last step that reads or writes it, both included; a buffer nothing reads dies at
the step that makes it; the graph's outputs live to the end (``len(order)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Sequence

from .graph import Node, Value


@dataclass
class LiveRanges:
    """Per buffer key: the first step writing it (``start``) and the last step using it (``end``)."""

    start: dict = field(default_factory=dict)
    end: dict = field(default_factory=dict)

    def span(self, key: Hashable) -> tuple[int, int]:
        return self.start[key], self.end[key]


def live_ranges(order: Sequence[Node], root: Callable[[Value], Hashable],
                outputs: Iterable[Value] = ()) -> LiveRanges:
    """The live range of every buffer that a node of ``order`` writes or reads (see the module
    docstring). Buffers only read (graph inputs, constants) get an ``end`` but no ``start``."""
    ranges = LiveRanges()
    start, end = ranges.start, ranges.end
    for i, n in enumerate(order):
        for v in n.inputs:
            if v is not None:
                end[root(v)] = i  # steps run in order: the last assignment is the last read
        for v in n.outputs:
            key = root(v)
            start.setdefault(key, i)
            if end.get(key, -1) < i:
                end[key] = i
    last = len(order)
    for v in outputs:
        end[root(v)] = last
    return ranges


def peak(ranges: LiveRanges, size: Callable[[Hashable], int]) -> int:
    """The most bytes live at one step: the sum of ``size(key)`` over the buffers whose range holds
    that step, at its largest (a sweep over the ranges' ends)."""
    delta: dict[int, int] = {}
    for key, s in ranges.start.items():
        nbytes = size(key)
        if nbytes:
            delta[s] = delta.get(s, 0) + nbytes
            e = ranges.end[key] + 1
            delta[e] = delta.get(e, 0) - nbytes
    live = best = 0
    for step in sorted(delta):
        live += delta[step]
        best = max(best, live)
    return best


__all__ = ["LiveRanges", "live_ranges", "peak"]
