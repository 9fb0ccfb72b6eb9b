"""Fixtures of the codegen tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def gemm_conv_paths(monkeypatch):
    """Convolutions keep the GEMM paths: maps of 17 to 64 pixels with constant weights would
    otherwise take the direct kernel (``small_conv.py``, tested in test_kernels_small_conv.py)."""
    from compiler.codegen.kernels import small_conv

    monkeypatch.setattr(small_conv, "SMALL_PIXELS", 16)
