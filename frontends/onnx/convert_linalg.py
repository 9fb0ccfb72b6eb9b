"""ONNX converters for the linalg op family (older opset forms rewritten into the IR form).

Only Gemm before opset 7 needs one (its ``broadcast`` flag). For opsets 7..28: Gemm 7..10 requires C, which the IR form (C optional, broadcast one
way, since opset 11) accepts as is (Gemm's ``broadcast`` attribute ended at opset 7); MatMul 1/9/13,
Einsum 12/28 and Det 11/22 differ only in the element types they allow, and the IR takes the union.
"""
from __future__ import annotations

from .converters import generic, op_class


def convert_gemm(ctx):
    """Gemm before opset 7 had a ``broadcast`` flag for C; NumPy-style broadcasting of C covers both."""
    attrs = dict(ctx.attrs)
    attrs.pop("broadcast", None)
    return generic(ctx, op_class(ctx), attrs)


CONVERTERS: dict = {("", "Gemm"): convert_gemm}
