"""The CUDA backend: kernel groups as numba.cuda launches (docs/cuda.md).

``build_cuda_program(graph)`` (``program.py``) makes a ``CudaProgram``; ``runtime/cuda.py`` writes,
loads and runs its artifact. The loop-form kernels are the CPU's, printed by ``loops/cuda.py``; the
GEMM (``gemm.py``) and the convolution forms (``conv.py``) are the GPU's own; ``lowering.py`` says
which a group gets. ``CUDA_FUSION`` is what the passes may fuse for this backend.
"""
from __future__ import annotations

import numpy as _np

# numba-cuda (as installed on the GPU machine this was checked on) registers an overload for np.row_stack when it first compiles a kernel; NumPy 2.5
# removed that alias of np.vstack, and the import then fails. Put the alias back where it is missing.
if not hasattr(_np, "row_stack"):
    _np.row_stack = _np.vstack


def numba_cuda():
    """``numba.cuda`` (imported after the alias above is in place)."""
    from numba import cuda

    return cuda


from ...passes.fuse import FusionCapabilities  # noqa: E402
from ..fusion import check as _cpu_check, fusable
from ..kernels import KernelGroup


def check(kind: str, nodes) -> str | None:
    """Why the GPU cannot run ``nodes`` as one kernel of block ``kind``: the CPU lowering's reason
    (the group's form), then, for attention, the GPU kernel's own limits (``attention.reason``)."""
    why = _cpu_check(kind, nodes)
    if why is None and kind == "attention":
        from .attention import reason

        why = reason(KernelGroup.of(nodes))
    return why


#: elementwise chains, GEMM/convolution epilogues, row reductions (loop-form kernels) and attention
#: (``attention.py``); the CPU's hand-written shuffle and prologue blocks have no GPU kernel
CUDA_FUSION = FusionCapabilities(fusable=fusable, check=check, blocks=frozenset({"reduction", "attention"}))

from .program import CudaProgram, build_cuda_program  # noqa: E402

__all__ = ["CUDA_FUSION", "CudaProgram", "build_cuda_program", "numba_cuda"]
