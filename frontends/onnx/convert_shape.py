"""ONNX converters for the shape op family (older opset forms rewritten into the IR form).

* Squeeze / Unsqueeze (< 13): the ``axes`` attribute became an input.
* Reshape (< 5, ``shape`` attribute) is older than the opsets Kiln imports.
"""
from __future__ import annotations

from .converters import _axes_to_input

CONVERTERS: dict = {
    ("", "Squeeze"): _axes_to_input(13),
    ("", "Unsqueeze"): _axes_to_input(13),
}
