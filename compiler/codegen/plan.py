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

import heapq
import random
from bisect import bisect_left, bisect_right, insort
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


def best_gap(busy: list[tuple[int, int]], size: int, best_fit: bool = True) -> int:
    """The offset for ``size`` bytes among the sorted busy ranges ``busy``: the smallest gap that
    holds it (the first with ``best_fit=False``), else past the last."""
    best, best_waste, cursor = None, None, 0
    for lo, hi in busy:
        gap = lo - cursor
        if gap >= size and (best_waste is None or gap - size < best_waste):
            best, best_waste = cursor, gap - size
            if not best_fit:
                break
        cursor = max(cursor, hi)
    return best if best is not None else cursor


def _place(buffers: Sequence[Buffer], idx: Sequence[int], alignment: int,
           best_fit: bool = True) -> tuple[int, list[int], int]:
    """Place ``buffers`` in the order ``idx``, each at the best-fitting (or, with ``best_fit=False``,
    the lowest) gap among the placed buffers it meets, else above them: (arena size, offsets, the
    index of a buffer that reaches the top).

    The placed buffers a lifetime meets are found without looking at the others: a segment tree over
    the steps holds each placed buffer on the O(log steps) nodes that cover its lifetime (those live
    at a step are on the path from its leaf to the root), and a sorted list of their starts gives
    those that start inside the lifetime. A buffer's cost is then the number it meets, not the
    number placed."""
    offsets = [-1] * len(buffers)
    sizes = [_size(b, alignment) for b in buffers]
    steps = max((b.end for b in buffers), default=0) + 1
    tree: list[list[int]] = [[] for _ in range(2 * steps)]
    start_at: list[int] = []   # starts of the placed buffers, sorted
    start_of: list[int] = []   # the buffer of each
    top, top_i = 0, -1
    for i in idx:
        buf = buffers[i]
        size = sizes[i]
        s, e = buf.start, buf.end
        meets: list[int] = []
        p = s + steps
        while p:
            meets += tree[p]
            p >>= 1
        meets += start_of[bisect_right(start_at, s):bisect_right(start_at, e)]
        offsets[i] = best_gap(sorted((offsets[j], offsets[j] + sizes[j]) for j in meets), size, best_fit)
        if offsets[i] + size > top:
            top, top_i = offsets[i] + size, i
        lo, hi = s + steps, e + 1 + steps
        while lo < hi:
            if lo & 1:
                tree[lo].append(i)
                lo += 1
            if hi & 1:
                hi -= 1
                tree[hi].append(i)
            lo >>= 1
            hi >>= 1
        k = bisect_right(start_at, s)
        start_at.insert(k, s)
        start_of.insert(k, i)
    return top, offsets, top_i


#: the planner's budget, in units of about a third of a microsecond here: placing one buffer costs
#: ``PLACE_COST`` units plus one per placed buffer whose lifetime it meets. The greedy orders are
#: tried while all of them fit in ``GREEDY_WORK`` (else only the "start" order, by a sweep over the
#: steps that costs O(n log n): a graph of thousands of long-lived buffers); the local search stops
#: after ``SEARCH_WORK`` (it rarely improves a large graph: DenseNet-121 at -O0, 1,200 buffers, gained
#: nothing in 400 rounds, which took 70 s). Every suite model's plan is the same as without limits.
PLACE_COST = 25
GREEDY_WORK = 12_000_000
SEARCH_WORK = 6_000_000


def _overlaps(buffers: Sequence[Buffer]) -> int:
    """How many pairs of buffers meet (live at a common step)."""
    starts = sorted(b.start for b in buffers)
    ends = sorted(b.end for b in buffers)
    total = sum(bisect_right(starts, b.end) - bisect_left(ends, b.start) - 1 for b in buffers)
    return total // 2


def _sweep(buffers: Sequence[Buffer], alignment: int) -> tuple[int, list[int], int]:
    """``_place`` in the "start" order with best fit, in O(n log n): in that order the placed buffers
    a buffer meets are those live at its start, which never overlap one another, so the free gaps
    between them can be kept sorted by (size, offset) and the best fit is one search."""
    n = len(buffers)
    sizes = [_size(b, alignment) for b in buffers]
    order = sorted(range(n), key=lambda i: ORDERS["start"](buffers[i]))
    offsets = [-1] * n
    live: list[int] = []              # offsets of the live buffers, sorted
    end_at: dict[int, int] = {}       # a live buffer's offset -> its end offset
    gaps: list[tuple[int, int]] = []  # (size, offset) of the free gaps below the highest live buffer
    dying: list[tuple[int, int]] = []
    top, top_i = 0, -1

    def drop_gap(size: int, off: int) -> None:
        if size > 0:
            del gaps[bisect_left(gaps, (size, off))]

    for i in order:
        start = buffers[i].start
        while dying and dying[0][0] < start:
            _, j = heapq.heappop(dying)
            lo = offsets[j]
            hi = lo + sizes[j]
            p = bisect_left(live, lo)
            below = end_at[live[p - 1]] if p else 0
            drop_gap(lo - below, below)
            if p + 1 < len(live):
                above = live[p + 1]
                drop_gap(above - hi, hi)
                insort(gaps, (above - below, below))
            del live[p]
            del end_at[lo]
        size = sizes[i]
        k = bisect_left(gaps, (size, -1))
        if k < len(gaps):
            gsize, off = gaps.pop(k)
            if gsize > size:
                insort(gaps, (gsize - size, off + size))
        else:
            off = end_at[live[-1]] if live else 0
        offsets[i] = off
        insort(live, off)
        end_at[off] = off + size
        heapq.heappush(dying, (buffers[i].end, i))
        if off + size > top:
            top, top_i = off + size, i
    return top, offsets, top_i


def plan_arena(buffers: Sequence[Buffer], alignment: int = 64, reuse: bool = True, rounds: int = 400) -> int:
    """Give each buffer an ``offset`` (a multiple of ``alignment``); returns the arena's size.

    Greedy placement in each order of ``ORDERS``, then up to ``rounds`` steps of a local search on
    the best order (stopping at the lower bound): the buffer that sets the arena's top moves to a
    random earlier place, and every other step two random buffers swap; a step is kept when the arena
    is no larger. The random numbers are seeded: the same buffers give the same plan. (Moving the
    top buffer to the front only, the first version, cycled at 5.6% over the bound on DenseNet once
    its convs needed no col matrix; this search reaches the bound in a few dozen steps.) Both are
    bounded in work (``GREEDY_WORK``, ``SEARCH_WORK``) so that a graph of 20,000 nodes plans in
    seconds. ``reuse=False`` gives every buffer memory of its own (for debugging: every value stays
    readable)."""
    if not reuse:
        offset = 0
        for buf in reversed(buffers):
            buf.offset = offset
            offset += _size(buf, alignment)
        return offset
    n = len(buffers)
    floor = lower_bound(buffers, alignment)
    work = PLACE_COST * n + _overlaps(buffers)  # of one placement of all buffers
    if work * 2 * len(ORDERS) > GREEDY_WORK:
        size, offsets, _ = _sweep(buffers, alignment)
        for buf, off in zip(buffers, offsets):
            buf.offset = off
        return size
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
    rounds = min(rounds, SEARCH_WORK // max(work, 1))
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
    # a sweep over the steps: the buffers live at a step, sorted by offset, must not overlap, so a
    # buffer that starts need only be compared with its neighbours there (O(n log n))
    events = sorted((b.start, i) for i, b in enumerate(buffers) if b.size)
    dying: list[tuple[int, int]] = []
    live: list[tuple[int, int]] = []  # (offset, index), sorted
    for start, i in events:
        while dying and dying[0][0] < start:
            _, j = heapq.heappop(dying)
            del live[bisect_left(live, (buffers[j].offset, j))]
        b = buffers[i]
        p = bisect_left(live, (b.offset, i))
        for q in (p - 1, p):
            if 0 <= q < len(live):
                o = buffers[live[q][1]]
                lo, hi = (o, b) if (o.offset, live[q][1]) < (b.offset, i) else (b, o)
                if hi.offset < lo.offset + lo.size:
                    raise ValueError(f"{lo.name} [{lo.offset}, +{lo.size}) steps {lo.start}-{lo.end} overlaps "
                                     f"{hi.name} [{hi.offset}, +{hi.size}) steps {hi.start}-{hi.end}")
        live.insert(p, (b.offset, i))
        heapq.heappush(dying, (b.end, i))


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
