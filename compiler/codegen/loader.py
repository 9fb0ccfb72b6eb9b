"""Loading a shared library from its bytes, under a name no earlier load can alias.

The code generator's tools (``llvm/toolchain.load_library``, the kernel tests) and the runtime
(``runtime/artifact.py``, for an artifact's verified ``model.so``) both load libraries this way; it
lives here, below the runtime, so that code generation never imports the runtime.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import secrets
import tempfile

_serial = itertools.count()


def load_library(data: bytes, label: str = "model.so") -> ctypes.CDLL:
    """Load the shared library ``data`` (bytes already verified) under a name no earlier load can alias.

    ``dlopen`` returns an already-loaded library when the path, or the file's device and inode, match
    one: loading a rebuilt ``model.so`` from the same path would run the old code. So the bytes are
    written to a new private file (pid and a per-process serial in its name, created with O_EXCL, mode
    0600), opened, and unlinked at once. The mapping keeps the inode alive (Kiln never unloads a
    library), so neither its name nor its inode can be reused while it is loaded; nothing is left on
    disk. ``OSError`` if the library cannot be loaded (message in terms of ``label``)."""
    tmp = tempfile.gettempdir()
    while True:
        path = os.path.join(tmp, f".kiln-{os.getpid()}-{next(_serial)}-{secrets.token_hex(4)}.so")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            hint = (f" (is {tmp} mounted noexec? set TMPDIR to a directory that allows executables)"
                    if "map" in str(e) or "ermission" in str(e) else "")
            raise OSError(str(e).replace(path, label) + hint) from None
    finally:
        os.unlink(path)


__all__ = ["load_library"]
