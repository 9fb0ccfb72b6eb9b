"""ONNX converters for the random op family (older opset forms rewritten into the IR form).

None needed: RandomUniform/RandomNormal(Like) (opsets 1 and 22), Bernoulli (15, 22) and Multinomial
(7, 22) only gained element types, so every opset imports generically as the newest form.
"""
from __future__ import annotations

CONVERTERS: dict = {}
