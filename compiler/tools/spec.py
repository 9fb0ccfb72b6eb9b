"""The model a command-line spec names, without importing PyTorch unless the spec needs it: a
``zoo:`` spec is built (and exported) by ``zoo.py``, which imports torch; a path or ``light:NAME``
passes through, so `kiln run model.onnx` starts without torch's second of imports."""
from __future__ import annotations


def model_of(spec):
    """``zoo.model_of(spec)`` for a ``zoo:`` spec; anything else unchanged."""
    if isinstance(spec, str) and spec.startswith("zoo:"):
        from .zoo import model_of as build

        return build(spec)
    return spec


__all__ = ["model_of"]
