"""Resource limits checked at compile time, so that a model too big for the machine is refused with
its size and the node responsible instead of failing (or swapping) when it runs (issue 21)."""
from __future__ import annotations

import os

from .errors import LimitError
from .ir.graph import Graph
from .ir.types import TensorType


def machine_memory() -> int:
    """This machine's physical memory in bytes (the default memory limit)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no default limit
        return 1 << 62


def gib(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 20 else f"{n} bytes"


def _hint(limit: int) -> str:
    return (f"the memory limit is {gib(limit)} (compile(..., memory_limit=BYTES) or "
            f"`kiln compile --memory-limit SIZE` to change it)")


def check_values(graph: Graph, limit: int) -> None:
    """Refuse a graph with an input or a node result larger than ``limit`` bytes on its own."""
    for v in graph.inputs:
        n = _nbytes(v)
        if n > limit:
            raise LimitError(f"input {v.name!r} ({v.type}) needs {gib(n)}; {_hint(limit)}")
    for node in graph.nodes:
        for v in node.outputs:
            n = _nbytes(v)
            if n > limit:
                raise LimitError(f"{node.describe()} makes {v.type}, {gib(n)}; {_hint(limit)}")


def check_program(arena_bytes: int, weights_bytes: int, buffers, limit: int) -> None:
    """Refuse a program whose arena and weights together exceed ``limit``, naming its largest buffer."""
    total = arena_bytes + weights_bytes
    if total <= limit:
        return
    big = max(buffers, key=lambda b: b.size, default=None)
    largest = f"; the largest buffer is {big.name} ({gib(big.size)})" if big is not None else ""
    raise LimitError(f"the compiled model needs {gib(total)} (arena {gib(arena_bytes)} + weights "
                     f"{gib(weights_bytes)}){largest}; {_hint(limit)}")


def _nbytes(v) -> int:
    t = v.type
    if isinstance(t, TensorType) and t.is_static:
        return int(t.nbytes or 0)
    return 0


__all__ = ["check_program", "check_values", "gib", "machine_memory"]
