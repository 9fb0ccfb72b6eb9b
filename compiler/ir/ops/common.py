"""Small helpers shared by several op families: dimension logic, the type arithmetic runs in, and
attribute checks. (The core inference helpers, ``known_ints``, ``same_dtype``, ..., are in ``base``.)"""
from __future__ import annotations

import numpy as np

from .base import OpDef


def is_static(d) -> bool:
    """Whether a dimension is a known int (not a symbol or None)."""
    return isinstance(d, int)


def dims_agree(a, b) -> bool:
    """False only when two dimensions are known to differ."""
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


def precise_dim(*dims):
    """Of dimensions that must be equal, the most precise: the first static one, else the first symbolic
    one, else None."""
    for d in dims:
        if isinstance(d, int):
            return d
    for d in dims:
        if d is not None:
            return d
    return None


def is_narrow_float(dt: np.dtype) -> bool:
    """A float of 16 bits or fewer (computed in float32, as hardware accumulates them)."""
    return dt.kind not in "iubO" and dt.itemsize <= 2


def compute_dtype(*dtypes) -> np.dtype:
    """The float type arithmetic runs in: float64 if any of ``dtypes`` is float64, else float32."""
    return np.dtype(np.float64) if any(np.dtype(d) == np.float64 for d in dtypes) else np.dtype(np.float32)


def check_flags(op: OpDef, *names: str) -> None:
    """The int attributes ``names`` of ``op`` are 0 or 1."""
    for name in names:
        if getattr(op, name) not in (0, 1):
            raise op.fail(f"{name} must be 0 or 1, got {getattr(op, name)}")


def text(s) -> str:
    """A string element as str (bytes are UTF-8)."""
    return s.decode("utf-8") if isinstance(s, bytes) else str(s)


def widen_narrow(x: np.ndarray) -> np.ndarray:
    """``x`` in the type its arithmetic runs in: narrow floats as float32, anything else as it is."""
    return x.astype(np.float32) if is_narrow_float(x.dtype) else x
