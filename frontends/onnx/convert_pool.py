"""ONNX converters for the pool op family (older opset forms rewritten into the IR form).

None is needed: the older forms of these ops (opsets 7..28) only lack attributes that the IR form has
with the value that older opset implied, so they import as they are:

* MaxPool: storage_order and the Indices output appeared at 8, ceil_mode and dilations at 10 (defaults
  0 / 1s); MaxPool-7 has a single output, which the node's own output count already says.
* AveragePool: ceil_mode at 10, dilations at 19 (defaults 0 / 1s); count_include_pad exists from 7.
* LpPool: ceil_mode and dilations at 18 (defaults 0 / 1s); p is an int (default 2) from opset 2 on.
* GlobalAveragePool, GlobalMaxPool, GlobalLpPool, MaxUnpool, MaxRoiPool: unchanged but for element types.

The output-size formulas that changed wording between versions (AveragePool 10/11/19, MaxPool 10/12)
describe one rule, which Kiln implements: floor (or, with ceil_mode, ceil but never a window starting past
the input and its begin pad) of (in + pads - ((k - 1) * d + 1)) / s + 1, and ceil(in / s) for SAME_*.
"""
from __future__ import annotations

CONVERTERS: dict = {}
