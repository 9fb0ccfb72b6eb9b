"""ONNX converters for the reduce op family (older opset forms rewritten into the IR form).

The IR's Reduce* ops take ``axes`` as an optional input (ReduceSum since opset 13, the others since
opset 18); older opsets give it as an attribute, which becomes a constant input here (an absent or empty
``axes`` attribute means all axes, as the IR's default ``noop_with_empty_axes=0`` does). ArgMax/ArgMin
(no ``select_last_index`` before opset 12, non-negative ``axis`` before 11) and CumSum (since 11) need no
rewriting: their older forms are the IR form with default attributes.
"""
from __future__ import annotations

from .converters import _axes_to_input

CONVERTERS: dict = {
    ("", "ReduceSum"): _axes_to_input(13),
    **{("", op): _axes_to_input(18) for op in (
        "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare")},
}
