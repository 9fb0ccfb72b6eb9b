"""ONNX converters for the pool op family (older opset forms rewritten into the IR form)."""
from __future__ import annotations

CONVERTERS: dict = {}
