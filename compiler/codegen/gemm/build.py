"""Build Kiln's sgemm ahead of time into a shared library and load it (tests, benchmarks, tools).

The code generator normally adds the GEMM to the model's own LLVM module (``emit_gemm``) and links
one artifact; this module builds the GEMM alone: LLVM IR -> optimized (O3) -> object file (llvmlite)
-> ``cc -shared`` -> ``.so``, cached by a hash of its sources, configuration and target
(``cache_key``), and wraps it with ctypes.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np
from llvmlite import ir

from ...paths import cache_home
from .config import GemmConfig, config_for
from .kernel import emit_gemm
from .packing import pack_a_numpy, pack_b_numpy

_initialized = False


def _init_llvm():
    global _initialized
    import llvmlite.binding as llvm

    if not _initialized:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _initialized = True
    return llvm


def build_ir(cfg: GemmConfig, prefix: str = "kiln_sgemm") -> str:
    llvm = _init_llvm()
    mod = ir.Module(name=prefix)
    mod.triple = llvm.get_process_triple()
    emit_gemm(mod, cfg, prefix)
    return str(mod)


def target_machine(cfg: GemmConfig):
    llvm = _init_llvm()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=cfg.cpu, features=cfg.features, opt=3, reloc="pic",
                                        codemodel="default")


def compile_object(ir_text: str, cfg: GemmConfig) -> tuple[bytes, str]:
    """(object file bytes, optimized IR text)."""
    llvm = _init_llvm()
    tm = target_machine(cfg)
    mod = llvm.parse_assembly(ir_text)
    mod.triple = llvm.get_process_triple()
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod), str(mod)


def cache_dir() -> str:
    """``gemm`` in Kiln's cache folder (``compiler.paths``), else (not writable) a folder in the temp
    dir."""
    d = os.path.join(cache_home(), "gemm")
    try:
        os.makedirs(d, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    d = os.path.join(tempfile.gettempdir(), f"kiln-gemm-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


@functools.lru_cache(maxsize=None)
def _sources_digest() -> str:
    """A hash of what the GEMM's IR is made from: the emitter's modules (this package's sources) and
    the llvmlite and LLVM versions that print and compile it."""
    import llvmlite
    import llvmlite.binding as llvm

    h = hashlib.sha256(f"{llvmlite.__version__} {llvm.llvm_version_info}".encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as fh:
                h.update(name.encode() + b"\0" + fh.read())
    return h.hexdigest()


def cache_key(cfg: GemmConfig, prefix: str) -> str:
    """The cache key of the GEMM for ``cfg``: its sources, configuration and symbol prefix (no IR
    built to find a cached build: emitting it took 0.5 s of every process's first compile)."""
    return hashlib.sha256(f"{_sources_digest()} {cfg!r} {prefix}".encode()).hexdigest()[:16]


def build_shared(cfg: GemmConfig, prefix: str = "kiln_sgemm", out_dir: str | None = None) -> str:
    """Path of a ``.so`` holding the GEMM for ``cfg`` (built, or found in the cache)."""
    out_dir = out_dir or cache_dir()
    path = os.path.join(out_dir, f"{prefix}-{cfg.isa}-{cache_key(cfg, prefix)}.so")
    if os.path.exists(path):
        return path
    obj, _ = compile_object(build_ir(cfg, prefix), cfg)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler/linker (cc) found to link the GEMM shared library")
    with tempfile.TemporaryDirectory() as tmp:
        o = os.path.join(tmp, "gemm.o")
        with open(o, "wb") as fh:
            fh.write(obj)
        so = os.path.join(tmp, "gemm.so")
        subprocess.run([cc, "-shared", "-o", so, o, "-lpthread"], check=True, capture_output=True)
        part = f"{path}.{os.getpid()}.part"  # publish atomically (parallel test workers)
        shutil.copyfile(so, part)
        os.chmod(part, 0o755)
        os.replace(part, path)
    return path


_OBJECTS: dict[tuple[str, str], bytes] = {}  # per process: the IR is hashed once


def gemm_object(cfg: GemmConfig, prefix: str = "kiln_sgemm") -> bytes:
    """The GEMM for ``cfg`` as a position-independent object file, compiled once and cached on disk
    (the code generator links it into every artifact that multiplies matrices)."""
    memo = (repr(cfg), prefix)
    if memo in _OBJECTS:
        return _OBJECTS[memo]
    path = os.path.join(cache_dir(), f"{prefix}-{cfg.isa}-{cache_key(cfg, prefix)}.o")
    if os.path.exists(path):
        with open(path, "rb") as fh:
            _OBJECTS[memo] = fh.read()
        return _OBJECTS[memo]
    obj, _ = compile_object(build_ir(cfg, prefix), cfg)
    _OBJECTS[memo] = obj
    part = f"{path}.{os.getpid()}.part"  # publish atomically (parallel test workers)
    with open(part, "wb") as fh:
        fh.write(obj)
    os.replace(part, path)
    return obj


_F = ctypes.POINTER(ctypes.c_float)
TRANS_NONE, TRANS_T, PACKED = 0, 1, 2


class GemmLib:
    """The compiled GEMM, callable from Python (for tests/benchmarks) and by address (generated code)."""

    def __init__(self, path: str, cfg: GemmConfig, prefix: str = "kiln_sgemm"):
        self.path, self.cfg, self.prefix = path, cfg, prefix
        self.lib = ctypes.CDLL(path)
        i64, i32, f32 = ctypes.c_int64, ctypes.c_int32, ctypes.c_float
        self.sgemm = getattr(self.lib, prefix)
        self.sgemm.restype = i32
        self.sgemm.argtypes = [i32, i32, i64, i64, i64, f32, _F, i64, _F, i64, f32, _F, i64, i32]
        for w in ("a", "b"):
            sz = getattr(self.lib, f"{prefix}_packed_{w}_size")
            sz.restype, sz.argtypes = i64, [i64, i64]
            pk = getattr(self.lib, f"{prefix}_pack_{w}")
            pk.restype, pk.argtypes = None, [i32, i64, i64, _F, i64, _F]
        self._size_a = getattr(self.lib, f"{prefix}_packed_a_size")
        self._size_b = getattr(self.lib, f"{prefix}_packed_b_size")
        self._pack_a = getattr(self.lib, f"{prefix}_pack_a")
        self._pack_b = getattr(self.lib, f"{prefix}_pack_b")

    @property
    def address(self) -> int:
        """C function pointer of the entry point (``int32 (*)(...)``, see ``kernel.py``)."""
        return ctypes.cast(self.sgemm, ctypes.c_void_p).value

    @staticmethod
    def _aligned(n: int) -> np.ndarray:
        raw = np.empty(n + 16, np.float32)
        off = (-raw.ctypes.data // 4) % 16
        return raw[off:off + n]

    def pack_a(self, a: np.ndarray, trans: bool = False) -> np.ndarray:
        """op(A) (M, K) -> packed buffer (64-byte aligned), by the native packer."""
        a = np.ascontiguousarray(a, np.float32)
        m, k = (a.shape[1], a.shape[0]) if trans else a.shape
        out = self._aligned(int(self._size_a(m, k)))
        self._pack_a(int(trans), m, k, a.ctypes.data_as(_F), a.shape[1], out.ctypes.data_as(_F))
        return out

    def pack_b(self, b: np.ndarray, trans: bool = False) -> np.ndarray:
        b = np.ascontiguousarray(b, np.float32)
        k, n = (b.shape[1], b.shape[0]) if trans else b.shape
        out = self._aligned(int(self._size_b(k, n)))
        self._pack_b(int(trans), k, n, b.ctypes.data_as(_F), b.shape[1], out.ctypes.data_as(_F))
        return out

    def gemm(self, a, b, c=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
             nthreads=1, shape=None) -> np.ndarray:
        """C = alpha * op(A) @ op(B) + beta * C.

        ``a``/``b`` are 2-D float32 arrays whose rows may be strided (any positive row stride,
        unit column stride), or 1-D packed buffers (``pack_a``/``pack_b``; then ``shape=(M, N, K)``).
        """
        packed_a, packed_b = a.ndim == 1, b.ndim == 1
        if packed_a or packed_b:
            if shape is None:
                raise ValueError("packed operands need shape=(M, N, K)")
            m, n, k = shape
        if not packed_a:
            a = _rows(a)
            m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        if not packed_b:
            b = _rows(b)
            kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
            if k != kb:
                raise ValueError(f"inner dimensions differ: {k} vs {kb}")
        if c is None:
            c = np.zeros((m, n), np.float32)
        c = _rows(c, writable=True)
        if c.shape != (m, n):
            raise ValueError(f"C has shape {c.shape}, expected {(m, n)}")
        lda = 0 if packed_a else _ld(a)
        ldb = 0 if packed_b else _ld(b)
        rc = self.sgemm(PACKED if packed_a else int(trans_a), PACKED if packed_b else int(trans_b),
                        m, n, k, alpha, a.ctypes.data_as(_F), lda, b.ctypes.data_as(_F), ldb, beta,
                        c.ctypes.data_as(_F), _ld(c), nthreads)
        if rc:
            raise MemoryError("kiln_sgemm could not allocate its packing buffers")
        return c


def _ld(x: np.ndarray) -> int:
    """Leading dimension (row stride in elements) of a row-major 2-D array."""
    return x.strides[0] // 4 if x.shape[0] > 1 else max(x.shape[1], 1)


def _rows(x: np.ndarray, writable=False) -> np.ndarray:
    if x.dtype != np.float32 or x.ndim != 2:
        raise ValueError("expected a 2-D float32 array")
    if x.size == 0:
        return x
    if (x.shape[1] > 1 and x.strides[1] != 4) or (x.shape[0] > 1 and (x.strides[0] < 4 * x.shape[1]
                                                                       or x.strides[0] % 4)):
        if writable:
            raise ValueError("C must have unit column stride")
        x = np.ascontiguousarray(x)
    return x


@functools.lru_cache(maxsize=None)
def load_gemm(isa: str | None = None, **overrides) -> GemmLib:
    """The GEMM for ``isa`` (default: the host's), built once per process (cached on disk)."""
    cfg = config_for(isa, **overrides)
    return GemmLib(build_shared(cfg), cfg)


__all__ = ["build_ir", "compile_object", "build_shared", "GemmLib", "load_gemm", "pack_a_numpy",
           "pack_b_numpy", "TRANS_NONE", "TRANS_T", "PACKED"]
