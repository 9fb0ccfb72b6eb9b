"""Devices: where a compiled program's code runs and its memory lives.

``Executable`` (``executable.py``) runs an artifact's plan — native segments and interpreted steps —
through a ``Device``, so that another device (a GPU through numba.cuda, a device per core set for
multi-device plans) plugs in without touching the executable's logic. A device

* loads a compiled module (``load_module(data, label) -> Module``; ``module.function(name, argtypes)``
  and ``module.string(name)`` find what the module itself defines);
* allocates and frees its memory (``allocate(nbytes) -> Memory``, ``free``), each ``Memory`` with
  an ``address`` for native code;
* copies between host arrays and its memory (``copy_in``, ``copy_out``) and gives the host a view of
  it where it can (``view``: the interpreted steps read and write native buffers through it);
* runs a function of a loaded module on addresses (``run``) and waits for what it started
  (``synchronize``).

``CpuDevice`` is the host: memory is 64-byte-aligned NumPy memory, ``view`` is zero-copy, ``run`` is
a call on the calling thread (the kernels use Kiln's thread pool themselves), ``synchronize`` has
nothing to wait for.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..codegen.loader import load_library
from .artifact import ArtifactError, library_function, library_string


@dataclass
class Memory:
    """A block of a device's memory: ``address`` for native code, ``nbytes``; ``host`` is a NumPy
    array over it where the host can see it (None otherwise)."""

    address: int
    nbytes: int
    host: np.ndarray | None = None


class Module(Protocol):
    def function(self, name: str, argtypes: Sequence, restype=None): ...

    def string(self, name: str) -> bytes: ...


class Device(Protocol):
    name: str

    def load_module(self, data: bytes, label: str) -> Module: ...

    def allocate(self, nbytes: int) -> Memory: ...

    def free(self, mem: Memory) -> None: ...

    def copy_in(self, mem: Memory, offset: int, array: np.ndarray) -> None: ...

    def copy_out(self, mem: Memory, offset: int, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray: ...

    def view(self, mem: Memory, offset: int, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray: ...

    def run(self, fn, *args) -> None: ...

    def synchronize(self) -> None: ...


class CpuModule:
    """A shared library loaded from its verified bytes (``codegen/loader.py``); only symbols it defines
    itself are found (``artifact.library_function``)."""

    def __init__(self, lib: ctypes.CDLL, label: str):
        self.lib, self.label = lib, label

    def function(self, name: str, argtypes: Sequence, restype=None):
        fn = library_function(self.lib, name, self.label)
        fn.argtypes, fn.restype = list(argtypes), restype
        return fn

    def string(self, name: str) -> bytes:
        return library_string(self.lib, name, self.label)


class CpuDevice:
    """The host CPU (see the module docstring)."""

    name = "cpu"
    ALIGN = 64

    def load_module(self, data: bytes, label: str) -> CpuModule:
        try:
            return CpuModule(load_library(data, label), label)
        except OSError as e:
            raise ArtifactError(f"cannot load {label}: {e}") from None

    def allocate(self, nbytes: int) -> Memory:
        raw = np.empty(nbytes + self.ALIGN, np.uint8)
        off = (-raw.ctypes.data) % self.ALIGN
        host = raw[off:off + nbytes]
        return Memory(host.ctypes.data, nbytes, host)

    def free(self, mem: Memory) -> None:
        mem.host = None  # NumPy frees it with the last view

    def copy_in(self, mem: Memory, offset: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        mem.host[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)

    def view(self, mem: Memory, offset: int, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
        dt = np.dtype(dtype)
        n = math.prod(int(d) for d in shape) * dt.itemsize  # (per call: no NumPy reduction here)
        return mem.host[offset:offset + n].view(dt).reshape(shape)

    def copy_out(self, mem: Memory, offset: int, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
        return self.view(mem, offset, dtype, shape).copy()

    def run(self, fn, *args) -> None:
        fn(*args)

    def synchronize(self) -> None:
        pass


__all__ = ["CpuDevice", "CpuModule", "Device", "Memory", "Module"]
