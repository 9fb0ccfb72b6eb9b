"""Static memory planning for the arena: every buffer gets an offset so that no two buffers that are
live at the same step overlap.

Greedy by size with best fit (as in TFLite's planner, Pisarchyk & Lee 2020): buffers are placed
largest first, each at the lowest-waste gap among the buffers already placed whose lifetimes meet
its own. ``check_plan`` validates any plan.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class Buffer:
    """A block of arena memory live from step ``start`` to step ``end`` (inclusive)."""

    name: str
    size: int
    start: int
    end: int
    offset: int = -1

    def meets(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def plan_arena(buffers: Sequence[Buffer], alignment: int = 64, reuse: bool = True) -> int:
    """Give each buffer an ``offset`` (a multiple of ``alignment``); returns the arena's size.
    ``reuse=False`` gives every buffer memory of its own (for debugging: every value stays readable)."""
    if not reuse:
        offset = 0
        for buf in reversed(buffers):
            buf.offset = offset
            offset += _align(max(buf.size, 1), alignment)
        return offset
    placed: list[Buffer] = []
    for buf in sorted(buffers, key=lambda b: (-b.size, b.start, b.name)):
        size = _align(max(buf.size, 1), alignment)
        busy = sorted((p.offset, p.offset + _align(max(p.size, 1), alignment)) for p in placed if p.meets(buf))
        best, best_waste, cursor = None, None, 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_waste is None or gap - size < best_waste):
                best, best_waste = cursor, gap - size
            cursor = max(cursor, hi)
        buf.offset = best if best is not None else cursor
        placed.append(buf)
    return max((b.offset + _align(max(b.size, 1), alignment) for b in placed), default=0)


def lower_bound(buffers: Sequence[Buffer], alignment: int = 64) -> int:
    """The most bytes live at any one step: no plan of these lifetimes can use less."""
    steps = sorted({b.start for b in buffers})
    return max((sum(_align(max(b.size, 1), alignment) for b in buffers if b.start <= t <= b.end) for t in steps),
               default=0)


def check_plan(buffers: Sequence[Buffer], arena_bytes: int, alignment: int = 64) -> None:
    """Raise ValueError if two buffers live at the same time overlap, or one lies outside the arena."""
    bs = sorted(buffers, key=lambda b: b.offset)
    for b in bs:
        if b.offset < 0 or b.offset % alignment or b.offset + b.size > arena_bytes:
            raise ValueError(f"{b.name}: offset {b.offset} size {b.size} outside the arena or misaligned")
    for i, a in enumerate(bs):
        for b in bs[i + 1:]:
            if b.offset >= a.offset + a.size:
                break
            if a.meets(b) and a.size and b.size:
                raise ValueError(f"{a.name} [{a.offset}, +{a.size}) steps {a.start}-{a.end} overlaps "
                                 f"{b.name} [{b.offset}, +{b.size}) steps {b.start}-{b.end}")
