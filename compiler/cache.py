"""The compile cache: compiling the same model with the same options again loads the artifact.

    exe = compiler.compile("model.onnx", cache=True)     # ~/.cache/kiln/artifacts (XDG_CACHE_HOME)
    kiln run model.onnx                                   # cached by default; --no-cache compiles afresh

An artifact is kept under the SHA-256 of everything that decides it:

* the model's bytes (a file, ``light:NAME``'s file, or a ModelProto serialized); a model whose
  bytes cannot be had (a Graph, an ONNX file with external data) is not cached;
* the options that change the artifact (opt level, input shapes and bound values, target CPU and
  features, fallback, disabled passes, memory limit, quantization, specializing, profile);
* Kiln itself: a fingerprint of every source file of ``compiler/`` and ``frontends/`` (the version
  number does not move while Kiln is developed) and the versions of Python, llvmlite, NumPy and onnx.

A cached artifact is loaded as any artifact (checksums, CPU features): one that fails to load is
removed and compiled again. The cache keeps the ``KEEP`` most recently used artifacts. Calibrated
(static int8) compiles, CUDA and multi-device ones are not cached. A hit loads in milliseconds;
the interpreter-fallback warning of the original compile is given again.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import warnings
from typing import Any, Mapping

import numpy as np

from .paths import cache_home

#: the most artifacts the cache keeps (the least recently used go first)
KEEP = 32

_fingerprint: str | None = None


def cache_root(cache: Any = True) -> str:
    """The cache's directory: ``cache`` when it is a path, else ``artifacts`` in Kiln's cache folder
    (``compiler.paths``: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)."""
    if isinstance(cache, (str, os.PathLike)):
        return os.fspath(cache)
    return os.path.join(cache_home(), "artifacts")


def kiln_fingerprint() -> str:
    """A digest of Kiln's sources and the libraries that shape its output (once per process)."""
    global _fingerprint
    if _fingerprint is None:
        from importlib.metadata import PackageNotFoundError, version

        def installed(name: str) -> str:  # the version without importing the package (onnx: 1 s)
            try:
                return version(name)
            except PackageNotFoundError:
                return "-"

        h = hashlib.sha256()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for top in ("compiler", "frontends"):
            for d, dirs, files in os.walk(os.path.join(root, top)):
                dirs.sort()
                for f in sorted(files):
                    if f.endswith((".py", ".c")):
                        path = os.path.join(d, f)
                        h.update(os.path.relpath(path, root).encode())
                        with open(path, "rb") as fh:
                            h.update(hashlib.sha256(fh.read()).digest())
        h.update(f"{sys.version}|{installed('llvmlite')}|{np.__version__}|{installed('onnx')}".encode())
        _fingerprint = h.hexdigest()
    return _fingerprint


def model_digest(model: Any) -> str | None:
    """The SHA-256 of the model's bytes, or None when it has none to hash (see the module docstring)."""
    if isinstance(model, str):
        from .models import resolve

        if model.startswith("zoo:"):
            return None  # built by PyTorch here: compile(model_of(spec)) hashes the ModelProto
        path = resolve(model)
        if not os.path.isfile(path) or path.endswith(".pt2"):
            return None
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".onnx") and _external_data(data):
            return None
        return hashlib.sha256(data).hexdigest()
    if hasattr(model, "SerializeToString"):  # an onnx.ModelProto
        return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    return None


def _external_data(data: bytes) -> bool:
    """Whether the ONNX model keeps tensors in other files (their bytes are not hashed here): an
    external tensor names its file under the key "location", so a model without that word has none."""
    if b"location" not in data:
        return False
    try:
        import onnx

        m = onnx.load_from_string(data)
        return any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer)
    except Exception:  # not ONNX that parses: the compile will say so; nothing to cache
        return True


def _plain(value: Any) -> Any:
    """``value`` as JSON for the key: arrays by digest, dataclasses (an LLVM ``Target`` too) by their
    fields, sets in a fixed order."""
    if isinstance(value, np.ndarray):
        return {"array": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest(),
                "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):  # in a fixed order (a set's repr varies between processes)
        return sorted(repr(_plain(v)) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in sorted(value.__dataclass_fields__)}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def cache_key(model: Any, options: Mapping[str, Any]) -> str | None:
    """The key of ``model`` compiled with ``options``, or None when it cannot be cached."""
    digest = model_digest(model)
    if digest is None:
        return None
    doc = {"model": digest, "options": _plain(dict(options)), "kiln": kiln_fingerprint()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:40]


def compile_key(model, opt_level, input_shapes, input_values, target, fallback, disabled_passes, memory_limit,
                quantize, specialize, max_dims, profile, model_name) -> str | None:
    """The key of ``driver.compile``'s arguments (``cache_key`` of the model and the options that
    shape the artifact; the target resolved to this CPU's)."""
    from .codegen.llvm.target import host_target

    t = host_target() if target in (None, "cpu") else target
    return cache_key(model, dict(
        opt_level=opt_level, input_shapes=dict(input_shapes or {}), input_values=dict(input_values or {}),
        target=t, fallback=fallback, disabled_passes=sorted(disabled_passes), memory_limit=memory_limit,
        quantize=quantize, specialize=specialize, max_dims=dict(max_dims or {}), profile=profile,
        model_name=model_name))


def from_cache(model: Any, opt_level: int = 2, input_shapes: Mapping[str, Any] | None = None, *,
               nthreads: int | None = None, model_name: str | None = None, cache: Any = True):
    """The artifact ``compile(model, opt_level, input_shapes, nthreads=, model_name=, cache=cache)``
    would load from the cache (its other options at their defaults), or None when the cache holds
    none. It reads the model's bytes only: no ONNX import and no compiler import, so a hit costs the
    load alone (``kiln run``'s start)."""
    key = compile_key(model, opt_level, input_shapes, None, None, True, (), None, None, True, None, False,
                      model_name)
    return None if key is None else lookup(cache_root(cache), key, nthreads)


def lookup(root: str, key: str, nthreads: int | None):
    """The cached artifact of ``key`` loaded, or None (a broken one is removed)."""
    from . import load
    from .runtime.artifact import ArtifactError

    path = os.path.join(root, key, "model.kiln")
    if not os.path.isdir(path):
        return None
    try:
        exe = load(path, nthreads)
    except (ArtifactError, OSError, ValueError):
        shutil.rmtree(os.path.join(root, key), ignore_errors=True)
        return None
    os.utime(os.path.join(root, key))  # recently used
    if exe.fallback:
        from .driver import FallbackWarning

        ops = sorted({f["op"] for f in exe.fallback})
        warnings.warn(f"{len(exe.fallback)} node(s) run in the reference interpreter (no native code): "
                      f"{', '.join(ops)}; `kiln inspect` lists them with reasons", FallbackWarning, stacklevel=4)
    return exe


def place(root: str, key: str) -> str:
    """Where a new artifact of ``key`` goes; the least recently used beyond ``KEEP`` are removed."""
    os.makedirs(os.path.join(root, key), exist_ok=True)
    os.utime(os.path.join(root, key))
    entries = sorted((e for e in os.scandir(root) if e.is_dir()), key=lambda e: e.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old.path, ignore_errors=True)
    return os.path.join(root, key, "model.kiln")


__all__ = ["KEEP", "cache_key", "cache_root", "kiln_fingerprint", "lookup", "model_digest", "place"]
