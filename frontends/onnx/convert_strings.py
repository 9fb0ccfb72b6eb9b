"""ONNX converters for the strings op family (older opset forms rewritten into the IR form)."""
from __future__ import annotations

CONVERTERS: dict = {}
