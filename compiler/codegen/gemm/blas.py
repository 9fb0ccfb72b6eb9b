"""Option A: the OpenBLAS that NumPy's wheel bundles, reached from native code.

NumPy >= 2 wheels ship ``scipy-openblas`` (an ILP64 build, every public symbol prefixed
``scipy_`` and suffixed ``64_``) as ``numpy.libs/libscipy_openblas64_-<hash>.so`` (or, on some
builds, inside ``numpy/_core``). Nothing here is linked at build time: the library is found at run
time, loaded with ``ctypes.CDLL`` (NumPy already has it loaded, so this returns the same mapping) and
the *address* of ``cblas_sgemm`` is handed to generated code, which calls it through a function
pointer with the ILP64 CBLAS signature::

    void sgemm(int order, int transA, int transB, int64 M, int64 N, int64 K, float alpha,
               const float *A, int64 lda, const float *B, int64 ldb, float beta, float *C, int64 ldc)

Kiln's own GEMM (``compiler.codegen.gemm.kernel``) is what the code generator uses; this module is
kept for the measurements in docs/gemm.md and as a test oracle / fallback.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
from dataclasses import dataclass

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


@dataclass(frozen=True)
class OpenBLAS:
    """A loaded OpenBLAS: its path, the handle and the symbols Kiln needs (None if missing)."""

    path: str
    lib: ctypes.CDLL
    sgemm: ctypes._CFuncPtr  # cblas_sgemm, ILP64 or LP64 (see ``int_type``)
    int_type: type  # ctypes.c_int64 (ILP64) or ctypes.c_int
    set_num_threads: ctypes._CFuncPtr | None
    set_num_threads_local: ctypes._CFuncPtr | None
    get_num_threads: ctypes._CFuncPtr | None
    corename: str
    config: str

    @property
    def sgemm_address(self) -> int:
        """The C function pointer to pass into generated code."""
        return ctypes.cast(self.sgemm, ctypes.c_void_p).value

    def num_threads(self) -> int:
        return int(self.get_num_threads()) if self.get_num_threads else 1

    def gemm(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, *, trans_a=False,
             trans_b=False, alpha=1.0, beta=0.0) -> np.ndarray:
        """C = alpha * op(A) @ op(B) + beta * C on C-contiguous float32 arrays (for tests/benchmarks)."""
        a = np.ascontiguousarray(a, np.float32)
        b = np.ascontiguousarray(b, np.float32)
        m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
        if k != kb:
            raise ValueError(f"inner dimensions differ: {k} vs {kb}")
        if c is None:
            c = np.zeros((m, n), np.float32)
        if c.shape != (m, n) or c.dtype != np.float32 or not c.flags.c_contiguous:
            raise ValueError("c must be a C-contiguous float32 array of shape (M, N)")
        i = self.int_type
        fp = ctypes.POINTER(ctypes.c_float)
        self.sgemm(ROW_MAJOR, TRANS if trans_a else NO_TRANS, TRANS if trans_b else NO_TRANS,
                   i(m), i(n), i(k), ctypes.c_float(alpha), a.ctypes.data_as(fp), i(a.shape[1]),
                   b.ctypes.data_as(fp), i(b.shape[1]), ctypes.c_float(beta), c.ctypes.data_as(fp),
                   i(max(n, 1)))
        return c


def _candidates() -> list[str]:
    np_dir = os.path.dirname(np.__file__)
    site = os.path.dirname(np_dir)
    pats = [os.path.join(site, "numpy.libs", "*openblas*.so*"),
            os.path.join(np_dir, ".dylibs", "*openblas*"),
            os.path.join(np_dir, "_core", "*openblas*.so*"),
            os.path.join(site, "scipy_openblas*", "lib", "*openblas*.so*")]
    return sorted(p for pat in pats for p in glob.glob(pat))


def _sym(lib, *names):
    for n in names:
        try:
            return getattr(lib, n)
        except AttributeError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def find_openblas() -> OpenBLAS | None:
    """The OpenBLAS NumPy uses, or None (NumPy built against another BLAS, or none)."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        ilp64 = _sym(lib, "scipy_cblas_sgemm64_", "cblas_sgemm64_")
        sgemm = ilp64 or _sym(lib, "scipy_cblas_sgemm", "cblas_sgemm")
        if sgemm is None:
            continue
        sgemm.restype = None
        int_type = ctypes.c_int64 if ilp64 is not None else ctypes.c_int
        suf = ("64_", "_64_", "") if ilp64 is not None else ("",)
        pre = ("scipy_", "")
        set_nt = _sym(lib, *[p + "openblas_set_num_threads" + s for p in pre for s in suf])
        get_nt = _sym(lib, *[p + "openblas_get_num_threads" + s for p in pre for s in suf])
        set_local = _sym(lib, "openblas_set_num_threads_local")
        corename = _sym(lib, *[p + "openblas_get_corename" + s for p in pre for s in suf])
        config = _sym(lib, *[p + "openblas_get_config" + s for p in pre for s in suf])
        for f in (corename, config):
            if f is not None:
                f.restype = ctypes.c_char_p
        for f in (set_nt, set_local):
            if f is not None:
                f.argtypes = [ctypes.c_int]
        if set_local is not None:
            set_local.restype = ctypes.c_int
        if get_nt is not None:
            get_nt.restype = ctypes.c_int
        return OpenBLAS(path, lib, sgemm, int_type, set_nt, set_local, get_nt,
                        corename().decode() if corename else "?", config().decode() if config else "?")
    return None
