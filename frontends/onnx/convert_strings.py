"""ONNX converters for the strings op family: none is needed (RegexFullMatch's ``pattern`` attribute
is renamed through ``OpDef.onnx_attr_names``)."""
from __future__ import annotations

CONVERTERS: dict = {}
