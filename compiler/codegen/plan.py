"""Static memory planning for the arena: every buffer gets an offset so that no two buffers that are
live at the same step overlap.

Greedy by size with best fit (as in TFLite's planner, Pisarchyk & Lee 2020): buffers are placed in
some order, each at the lowest-waste gap among the buffers already placed whose lifetimes meet its
own (or above them all). ``plan_arena`` tries a few orders (largest first; longest-lived first;
largest area first; the earliest first), keeps the smallest arena and improves its order by a
short, seeded local search. ``lower_bound`` is the most
bytes live at one step, which no plan can beat; ``check_plan`` validates any plan.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class Buffer:
    """A block of arena memory live from step ``start`` to step ``end`` (inclusive).

    ``kind``: "value" (a result kernels pass on), "output" (a graph output, live to the end),
    "scratch" (one kernel's temporary memory). ``values``: more values sharing it (in-place reuse)."""

    name: str
    size: int
    start: int
    end: int
    offset: int = -1
    kind: str = "value"
    values: list[str] = field(default_factory=list)

    def meets(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _size(b: Buffer, alignment: int) -> int:
    return _align(max(b.size, 1), alignment)


#: orders to place buffers in (name -> sort key); the smallest resulting arena wins
ORDERS: dict[str, Callable[[Buffer], tuple]] = {
    "size": lambda b: (-b.size, b.start, b.name),
    "lifetime": lambda b: (-(b.end - b.start), -b.size, b.start, b.name),
    "area": lambda b: (-b.size * (b.end - b.start + 1), b.start, b.name),
    "start": lambda b: (b.start, -b.size, b.name),
}


def _place(buffers: Sequence[Buffer], idx: Sequence[int], alignment: int,
           best_fit: bool = True) -> tuple[int, list[int], int]:
    """Place ``buffers`` in the order ``idx``, each at the best-fitting (or, with ``best_fit=False``,
    the lowest) gap among the placed buffers it meets, else above them: (arena size, offsets, the
    index of a buffer that reaches the top)."""
    offsets = [-1] * len(buffers)
    sizes = [_size(b, alignment) for b in buffers]
    placed: list[int] = []
    top, top_i = 0, -1
    for i in idx:
        buf = buffers[i]
        size = sizes[i]
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in placed
                      if buffers[j].start <= buf.end and buf.start <= buffers[j].end)
        best, best_waste, cursor = None, None, 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_waste is None or gap - size < best_waste):
                best, best_waste = cursor, gap - size
                if not best_fit:
                    break
            cursor = max(cursor, hi)
        offsets[i] = best if best is not None else cursor
        if offsets[i] + size > top:
            top, top_i = offsets[i] + size, i
        placed.append(i)
    return top, offsets, top_i


def plan_arena(buffers: Sequence[Buffer], alignment: int = 64, reuse: bool = True, rounds: int = 400) -> int:
    """Give each buffer an ``offset`` (a multiple of ``alignment``); returns the arena's size.

    Greedy placement in each order of ``ORDERS``, then up to ``rounds`` steps of a local search on
    the best order (stopping at the lower bound): the buffer that sets the arena's top moves to a
    random earlier place, and every other step two random buffers swap; a step is kept when the arena
    is no larger. The random numbers are seeded: the same buffers give the same plan. (Moving the
    top buffer to the front only, the first version, cycled at 5.6% over the bound on DenseNet once
    its convs needed no col matrix; this search reaches the bound in a few dozen steps.)
    ``reuse=False`` gives every buffer memory of its own (for debugging: every value stays readable)."""
    if not reuse:
        offset = 0
        for buf in reversed(buffers):
            buf.offset = offset
            offset += _size(buf, alignment)
        return offset
    n = len(buffers)
    floor = lower_bound(buffers, alignment)
    best: tuple[int, list[int], int] = (0, [], -1)
    best_order: list[int] = []
    for order in ORDERS.values():
        idx = sorted(range(n), key=lambda i: order(buffers[i]))
        for fit in (True, False):
            placed = _place(buffers, idx, alignment, fit)
            if not best_order or placed[0] < best[0]:
                best, best_order = placed, idx
            if best[0] <= floor:
                break
        if best[0] <= floor:
            break
    rng = random.Random(0)
    idx = list(best_order)
    for step in range(rounds if best[0] > floor and n > 1 else 0):
        j = idx.index(best[2])
        cand = list(idx)
        cand.insert(rng.randrange(j + 1), cand.pop(j))
        if step % 2:
            a, b = rng.randrange(n), rng.randrange(n)
            cand[a], cand[b] = cand[b], cand[a]
        placed = _place(buffers, cand, alignment)
        if placed[0] <= best[0]:
            best, idx = placed, cand
            if best[0] <= floor:
                break
    size, offsets, _ = best
    for buf, off in zip(buffers, offsets):
        buf.offset = off
    return size


def live_bytes(buffers: Sequence[Buffer], alignment: int = 64) -> list[int]:
    """Bytes live at each step 0..max(end) (aligned sizes, as the arena holds them)."""
    if not buffers:
        return []
    n = max(b.end for b in buffers) + 1
    delta = [0] * (n + 1)
    for b in buffers:
        delta[b.start] += _size(b, alignment)
        delta[b.end + 1] -= _size(b, alignment)
    out, acc = [], 0
    for t in range(n):
        acc += delta[t]
        out.append(acc)
    return out


def lower_bound(buffers: Sequence[Buffer], alignment: int = 64) -> int:
    """The most bytes live at any one step: no plan of these lifetimes can use less."""
    return max(live_bytes(buffers, alignment), default=0)


def check_plan(buffers: Sequence[Buffer], arena_bytes: int, alignment: int = 64) -> None:
    """Raise ValueError unless every buffer lies inside the arena at an aligned offset and no two
    buffers live at the same step overlap (any plan: this does not trust the planner)."""
    for b in buffers:
        if b.offset < 0 or b.offset % alignment or b.offset + b.size > arena_bytes or b.start > b.end:
            raise ValueError(f"{b.name}: offset {b.offset} size {b.size} steps {b.start}-{b.end}: outside the "
                             f"arena of {arena_bytes} bytes, misaligned (to {alignment}) or an empty lifetime")
    bs = sorted((b for b in buffers if b.size), key=lambda b: b.offset)
    for i, a in enumerate(bs):
        for b in bs[i + 1:]:
            if b.offset >= a.offset + a.size:
                break
            if a.meets(b):
                raise ValueError(f"{a.name} [{a.offset}, +{a.size}) steps {a.start}-{a.end} overlaps "
                                 f"{b.name} [{b.offset}, +{b.size}) steps {b.start}-{b.end}")


#: SVG fill per buffer kind
KIND_COLORS = {"value": "#4e79a7", "output": "#e15759", "scratch": "#f28e2b", "in place": "#59a14f"}


def plan_svg(buffers: Sequence[Buffer], arena_bytes: int, figures: dict | None = None, title: str = "",
             width: int = 960, height: int = 540) -> str:
    """The plan drawn as offset (up) x time in schedule steps (right): one rectangle per buffer,
    colored by kind (in-place chains in green), with a legend and the figures (arena, lower bound,
    naive). A standalone SVG document, written by hand (no dependency)."""
    from xml.sax.saxutils import escape

    left, right, top, bottom = 70, 20, 54, 40
    pw, ph = width - left - right, height - top - bottom
    steps = max([b.end for b in buffers] + [0]) + 1
    scale_y = ph / max(arena_bytes, 1)
    scale_x = pw / steps
    mib = 1 << 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    f = figures or {}
    lb, naive = f.get("lower_bound_bytes"), f.get("naive_bytes")
    head = f"{escape(title)}  arena {arena_bytes / mib:.2f} MiB"
    if lb:
        head += f" = {arena_bytes / lb:.3f} x lower bound {lb / mib:.2f} MiB"
    if naive:
        head += f"; naive {naive / mib:.2f} MiB"
    out.append(f'<text x="{left}" y="18" font-size="13" font-weight="bold">{head}</text>')
    lx = left
    for kind, color in KIND_COLORS.items():
        out.append(f'<rect x="{lx}" y="28" width="12" height="12" fill="{color}"/>'
                   f'<text x="{lx + 16}" y="38">{kind}</text>')
        lx += 90
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#f4f4f4" stroke="#999"/>')
    for b in buffers:
        kind = "in place" if b.values and b.kind == "value" else b.kind
        x = left + b.start * scale_x
        w = max((b.end - b.start + 1) * scale_x, 0.5)
        y = top + ph - (b.offset + b.size) * scale_y
        h = max(b.size * scale_y, 0.5)
        names = ", ".join([b.name] + b.values)
        out.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" '
                   f'fill="{KIND_COLORS.get(kind, "#999")}" fill-opacity="0.85" stroke="white" stroke-width="0.3">'
                   f'<title>{escape(names)}: {b.size} B at {b.offset}, steps {b.start}-{b.end}</title></rect>')
    if lb:
        y = top + ph - lb * scale_y
        out.append(f'<line x1="{left}" y1="{y:.2f}" x2="{left + pw}" y2="{y:.2f}" stroke="black" '
                   f'stroke-dasharray="4 3"/><text x="{left + pw - 4}" y="{y - 3:.2f}" text-anchor="end">'
                   f'lower bound</text>')
    for frac in (0, 0.25, 0.5, 0.75, 1):
        y = top + ph - frac * ph
        out.append(f'<text x="{left - 6}" y="{y + 4:.2f}" text-anchor="end">{frac * arena_bytes / mib:.1f}</text>')
    out.append(f'<text x="14" y="{top + ph / 2:.0f}" transform="rotate(-90 14 {top + ph / 2:.0f})" '
               f'text-anchor="middle">offset (MiB)</text>')
    out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 10}" text-anchor="middle">schedule step '
               f'(0 to {steps - 1})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
