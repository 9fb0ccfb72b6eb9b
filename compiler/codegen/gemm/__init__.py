"""Kiln's GEMM core: a packed, register-blocked sgemm emitted as LLVM IR (see docs/gemm.md).

* ``emit_gemm(module, cfg, prefix)`` adds the GEMM (C ABI entry ``prefix`` and packers) to an
  llvmlite module: what the code generator links into a model's artifact.
* ``config_for(isa)`` the blocking/target parameters (``host_isa()`` by default);
  ``config_for_target(target)`` for a ``compiler.codegen.llvm.target.Target``.
* ``build_shared`` / ``load_gemm`` / ``GemmLib``: the GEMM alone as a cached ``.so`` (tests, tools).
* ``find_openblas()``: NumPy's bundled OpenBLAS (measured alternative, test oracle).
"""
from .blas import OpenBLAS, find_openblas
from .build import GemmLib, build_shared, load_gemm
from .config import PRESETS, GemmConfig, config_for, config_for_target, host_isa
from .kernel import emit_gemm
from .packing import pack_a_numpy, pack_b_numpy

__all__ = ["GemmConfig", "PRESETS", "config_for", "config_for_target", "host_isa", "emit_gemm", "pack_a_numpy",
           "pack_b_numpy", "build_shared", "load_gemm", "GemmLib", "OpenBLAS", "find_openblas"]
