"""Groups whose every result is an empty tensor (a zero dimension, e.g. a batch of 0): there is
nothing to compute, whatever the ops, so no code at all, rather than the interpreter (issue 21)."""
from __future__ import annotations

from ...ir.types import DType, TensorType
from .base import KernelBuilder, KernelGroup, Lowering


class Empty(Lowering):
    """Any group of static tensor results with no elements: emits nothing."""

    def check(self, group: KernelGroup) -> str | None:
        for v in group.outputs:
            if not (isinstance(v.type, TensorType) and v.type.is_static and v.type.numel == 0):
                return "a result is not an empty static tensor"
            if v.type.dtype is DType.string:  # (strings never live in native buffers)
                return "string results are left to the interpreter"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup, epilogue=None) -> bool:
        k.note("every result is empty: nothing to compute")
        return False


__all__ = ["Empty"]
