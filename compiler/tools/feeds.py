"""Seeded random inputs for a model (``kiln run``/``dump --check`` without ``--input``, ``kiln bench``)
that the model can take: an integer input used as indices (a Gather's, e.g. BERT's token type ids
into an embedding of 2 rows) is drawn inside the axis it indexes, not from a fixed range (issue 21)."""
from __future__ import annotations

import numpy as np

from ..errors import KilnError
from ..ir.graph import Graph, Node

#: integer inputs not used as indices are drawn from [0, DEFAULT_HIGH)
DEFAULT_HIGH = 10

#: ops whose first operand reaches their result unchanged in value (indices pass through them)
_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose"}


def index_limits(graph: Graph) -> dict[str, int]:
    """Graph input name -> the size of the smallest axis its values index (through pass-through
    ops), for the integer inputs used as Gather/GatherElements indices with a static axis."""
    limits: dict[str, int] = {}
    for v in graph.inputs:
        todo, seen = [v], set()
        while todo:
            val = todo.pop()
            for user, i in val.uses:
                if not isinstance(user, Node) or id(user) in seen:
                    continue
                seen.add(id(user))
                name = user.op.name
                if name in _PASS_THROUGH and i == 0:
                    todo.extend(user.outputs[:1])
                elif name in ("Gather", "GatherElements") and i == 1:
                    data = user.inputs[0]
                    d = data.shape[user.op.axis % len(data.shape)] if len(data.shape) else None
                    if isinstance(d, int) and d > 0:
                        limits[v.name] = min(limits.get(v.name, d), d)
    return limits


def random_array(rng: np.random.Generator, name: str, t, notes: list | None = None,
                 high: int = DEFAULT_HIGH) -> np.ndarray:
    """Random data of tensor type ``t`` (symbolic dimensions become 1, noted in ``notes``): normal
    floats, booleans, integers in [0, high)."""
    from ..ir.types import DType

    shape = []
    for d in t.shape:
        if not isinstance(d, int):
            if notes is not None:
                notes.append(f"input {name!r}: dimension {d or '?'} set to 1 (use --input-shape to choose)")
            d = 1
        shape.append(d)
    dt = t.dtype
    if dt.is_float:
        return rng.standard_normal(shape).astype(dt.np)
    if dt is DType.bool:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.is_int:
        return rng.integers(0, high, shape).astype(dt.np)
    if dt is DType.string:
        return np.array(["kiln"] * int(np.prod(shape)), dtype=object).reshape(shape)
    raise KilnError(f"cannot make random data for input {name!r} of type {t}")


__all__ = ["DEFAULT_HIGH", "index_limits", "random_array"]
