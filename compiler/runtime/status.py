"""The status record through which native kernels report errors in the input data (an index out of
range): ``KernelBuilder.fail_if`` writes ``(1, value, limit)`` to it, the forward function adds the
failing step and returns; the runtime zeroes it before each native call and raises afterwards."""
from __future__ import annotations

import numpy as np

from ..errors import InputError

#: i64 flag, value, limit, step (``compiler.codegen.kernels.base.STATUS_BYTES``)
STATUS_WORDS = 4


def clear(arena: np.ndarray, offset: int) -> None:
    arena[offset:offset + 8 * STATUS_WORDS] = 0


def raise_reported(arena: np.ndarray, offset: int, kernels: list) -> None:
    """Raise ``InputError`` naming the node when a kernel reported an error (nothing otherwise)."""
    flag, value, limit, step = (int(x) for x in arena[offset:offset + 8 * STATUS_WORDS].view(np.int64))
    if not flag:
        return
    kernel = next((k for k in kernels if k.get("step") == step), None)
    what = "a kernel"
    if kernel is not None:
        names = [n for n in kernel.get("nodes", []) if n]
        what = f"{'+'.join(kernel.get('ops', []))} node {names[0]!r}" if names else '+'.join(kernel.get("ops", []))
    raise InputError(f"{what}: index {value} is out of range for an axis of size {limit} "
                     f"(valid: {-limit} to {limit - 1}); the input data holds an invalid index")


__all__ = ["STATUS_WORDS", "clear", "raise_reported"]
