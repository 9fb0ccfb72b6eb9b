"""Native support code that generated kernels link against: ``parallel.c`` (``kiln_parallel_for``, a
persistent thread pool for the loops of non-GEMM kernels). Compiled once with the system C compiler
and cached, like the GEMM object; linked into every artifact that uses it."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile

from ..llvm.toolchain import CodegenError, find_cc

_SOURCE = os.path.join(os.path.dirname(__file__), "parallel.c")
#: pool threads a profile record keeps chunk times of, the caller's slot 0 included
#: (``KILN_PROFILE_THREADS`` in parallel.c)
PROFILE_THREADS = 16


def profile_record_bytes(nsteps: int) -> int:
    """The size of a profile record for ``nsteps`` steps (``kiln_profile_rec`` in parallel.c: the last
    clock, a pending slot per thread, then nsteps step times and nsteps per pool thread)."""
    return 8 * (1 + PROFILE_THREADS + nsteps * PROFILE_THREADS)
_OBJECTS: dict[str, bytes] = {}


def support_object() -> bytes:
    """``parallel.c`` as a position-independent object file (cached on disk by its source's hash)."""
    from ..gemm.build import cache_dir

    with open(_SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(source).hexdigest()[:16]
    if key in _OBJECTS:
        return _OBJECTS[key]
    path = os.path.join(cache_dir(), f"kiln_parallel-{key}.o")
    if not os.path.exists(path):
        cc = find_cc()
        with tempfile.TemporaryDirectory() as tmp:
            obj = os.path.join(tmp, "parallel.o")
            r = subprocess.run([cc, "-O2", "-fPIC", "-pthread", "-c", _SOURCE, "-o", obj], capture_output=True,
                               text=True)
            if r.returncode != 0:
                raise CodegenError(f"compiling {_SOURCE} failed ({cc}):\n{r.stderr.strip()}")
            part = f"{path}.{os.getpid()}.part"
            with open(obj, "rb") as src, open(part, "wb") as dst:
                dst.write(src.read())
            os.replace(part, path)
    with open(path, "rb") as f:
        _OBJECTS[key] = f.read()
    return _OBJECTS[key]
