"""Where Kiln keeps files between runs: one folder, each cache a subfolder of it.

    $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln
        artifacts/      compiled models (``compiler.cache``, ``compile(..., cache=True)``)
        objects/        compiled code by content (``codegen/llvm/objects.py``)
        gemm/           the GEMM and the thread pool's objects (``codegen/gemm/build.py``)
        roofline.json   this machine's measured peaks (``compiler.profiling``)
"""
from __future__ import annotations

import os


def cache_home() -> str:
    """Kiln's cache folder (not created here)."""
    return os.environ.get("KILN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kiln")
