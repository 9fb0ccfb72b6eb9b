"""ONNX converters for the conv op family (older opset forms rewritten into the IR form).

None is needed: every older form of these ops imports as it is (checked against the schema history of
opsets 7..28).

* Conv (1, 11, 22), ConvTranspose (1, 11, 22), DeformConv (19, 22), LRN (1, 13), Col2Im (18) and
  CausalConvWithState (27) kept their inputs, attributes and defaults; later versions only added element
  types (bfloat16 at 22) or reworded the docs.
* ConvTranspose-1's formula for auto_pad split the odd padding with ``!= SAME_UPPER``, contradicting its
  own attribute text ("extra padding at the end for SAME_UPPER"); opset 11 fixed the formula to match the
  text. Kiln reads every opset the corrected way, as ONNX Runtime does (tests/ops/test_conv.py checks
  opsets 7 and 10 against it).
"""
from __future__ import annotations

CONVERTERS: dict = {}
