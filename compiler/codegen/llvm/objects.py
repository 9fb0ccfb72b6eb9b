"""Object files kept by content: a module (or a part of one, ``split.py``) that was compiled before,
for the same target and optimization level by the same LLVM and the same toolchain, is read back
instead of compiled.

    ~/.cache/kiln/objects/<sha256>.o      ($KILN_CACHE_DIR/objects, or $XDG_CACHE_HOME/kiln/objects)

The key is the SHA-256 of the module's text, the target (triple, CPU, features), the optimization
level, the llvmlite and LLVM versions and the sources of ``toolchain.py`` and ``workarounds.py``
(what is done to the text before code comes out). Each file holds the SHA-256 of its object first: a
file that does not match (cut short, overwritten) is removed and the module compiled again. Files
are written under a temporary name and renamed, so processes compiling side by side never read half
a file; the ``KEEP`` most recently used are kept.

``toolchain.compile_parts(text, target, cache_dir=objects.cache_dir())`` uses it; the driver does for
every compile unless ``compile(..., kernel_cache=False)`` (``kiln run --no-cache``). A model compiled
again in a new process (a ``torch.compile`` of the same module, a test run) then spends no time in
LLVM for the parts it compiled before.
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import time

from ...paths import cache_home
from .target import Target

#: the most object files the cache keeps (the least recently used go first)
KEEP = 2048


def cache_dir() -> str | None:
    """``objects`` in Kiln's cache folder (``compiler.paths``); None where it cannot be made or
    written."""
    d = os.path.join(cache_home(), "objects")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        return None
    return d if os.access(d, os.W_OK) else None


@functools.lru_cache(maxsize=1)
def _toolchain_digest() -> str:
    import llvmlite
    import llvmlite.binding as llvm

    h = hashlib.sha256(f"{llvmlite.__version__} {llvm.llvm_version_info}".encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("toolchain.py", "workarounds.py"):
        with open(os.path.join(here, name), "rb") as fh:
            h.update(name.encode() + b"\0" + fh.read())
    return h.hexdigest()


def object_key(text: str, target: Target, opt_level: int) -> str:
    """The cache key of ``text`` compiled for ``target`` at ``opt_level``."""
    h = hashlib.sha256(f"{_toolchain_digest()}\0{target.triple}\0{target.cpu}\0{target.features}\0"
                       f"{target.opt_level}\0{opt_level}\0".encode())
    h.update(text.encode())
    return h.hexdigest()


def lookup(root: str, key: str) -> bytes | None:
    """The object kept under ``key``, or None (none kept, or a damaged file, which is removed)."""
    path = os.path.join(root, f"{key}.o")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    digest, obj = data[:32], data[32:]
    if len(data) <= 32 or hashlib.sha256(obj).digest() != digest:
        try:
            os.remove(path)
        except OSError:
            pass
        return None
    try:
        os.utime(path)  # (recently used: kept longest)
    except OSError:
        pass
    return obj


def store(root: str, key: str, obj: bytes) -> None:
    """Keep ``obj`` under ``key`` (best effort: a full disk or a read-only folder only means no cache)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=root, suffix=".part")
        with os.fdopen(fd, "wb") as fh:
            fh.write(hashlib.sha256(obj).digest() + obj)
        os.replace(tmp, os.path.join(root, f"{key}.o"))
        _prune(root)
    except OSError:
        pass


def _prune(root: str) -> None:
    """Remove all but the ``KEEP`` most recently used objects, and temporary files an hour old (a
    process stopped while writing)."""
    entries, stale = [], []
    now = time.time()
    with os.scandir(root) as it:
        for e in it:
            try:
                if e.name.endswith(".o"):
                    entries.append((e.stat().st_mtime, e.path))
                elif e.name.endswith(".part") and now - e.stat().st_mtime > 3600:
                    stale.append(e.path)
            except OSError:
                pass
    for _, path in sorted(entries)[:max(0, len(entries) - KEEP)] + [(0, p) for p in stale]:
        try:
            os.remove(path)
        except OSError:
            pass


__all__ = ["KEEP", "cache_dir", "lookup", "object_key", "store"]
