"""Kiln: a deep-learning graph compiler.

The IR lives in ``compiler.ir``; ONNX models come in through ``frontends.onnx``.
"""
__version__ = "0.1.0"
