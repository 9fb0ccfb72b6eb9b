"""Lowerings: how each op becomes native code (see ``base.py`` for the interface).

``LOWERINGS`` is the explicit table, op class -> lowering; ``lowering_for(group)`` picks the
lowering of a group and says why there is none.
"""
from __future__ import annotations

from .base import KernelBuilder, KernelGroup, Lowering, Services
from .convert import LOWERINGS as CONVERT_LOWERINGS
from .data import LOWERINGS as DATA_LOWERINGS
from .elementwise import Elementwise, View
from .conv import Conv
from .linalg import Gemm, MatMul
from .norm import LayerNorm, Lrn, Softmax
from .pool import GlobalPool, Pool
from .reduce import Reduce

#: every lowering, in the order they are consulted
ALL: tuple[Lowering, ...] = (View(), Elementwise(), Gemm(), MatMul(), Conv(), Pool(), GlobalPool(), Reduce(), Softmax(), LayerNorm(), Lrn(), *DATA_LOWERINGS, *CONVERT_LOWERINGS)

LOWERINGS: dict[type, Lowering] = {op: low for low in ALL for op in low.ops}


def lowering_for(group: KernelGroup) -> tuple[Lowering | None, str | None]:
    """(the lowering, None), or (None, the reason the group cannot run natively)."""
    kinds = {type(n.op) for n in group.nodes}
    candidates = [low for low in ALL if kinds <= set(low.ops)]
    if not candidates:
        missing = sorted(k.__name__ for k in kinds if k not in LOWERINGS)
        return None, f"no native lowering for {', '.join(missing) or 'this combination of ops'}"
    reason = None
    for low in candidates:
        reason = low.check(group)
        if reason is None:
            return low, None
    return None, reason


__all__ = ["ALL", "LOWERINGS", "KernelBuilder", "KernelGroup", "Lowering", "Services", "lowering_for"]
