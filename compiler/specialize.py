"""Models with symbolic input dimensions: native code per size, specialized when a size is first run.

A model exported with a dynamic batch (or sequence) dimension has inputs such as ``x: f32[N,3,224,224]``.
Native kernels are built for static shapes, so ``compile`` returns a ``Specializing`` executable for
such a model (unless ``specialize=False``, or the sizes are given with ``input_shapes``):

* it holds the generic compile (the model as given: nodes whose shapes depend on a symbolic size run
  in the interpreter) and the model's graph as loaded, before any pass;
* ``run(feeds)`` binds each symbolic dimension to its size in the feeds (one name, one size: an input
  whose dimensions disagree is refused), refuses a size past its declared maximum
  (``max_dims={"N": 64}``, ``kiln compile --max-dim N=64``), and runs the compile specialized to
  those sizes: made on first use (the full pipeline on the static shapes, every node native where the
  static model's would be), then kept (the ``cache`` most recently used sizes; 8 by default);
* ``specializations`` lists the sizes compiled so far, each with its executable (``kiln inspect``
  names the symbolic dimensions and their maxima).

Saved (``save``), the artifact is the generic one plus the source graph (``source.kir`` and its
constants) and the specialization record in ``specialize.json``; ``compiler.load`` gives back a
``Specializing`` executable, which compiles a size on first use (the compiler is needed then).

Specializing costs a compile per new size (seconds for a large model): for a serving loop with few
sizes (batch 1 and a few batch sizes) it is paid once per size. The sizes are exact: no padding.
"""
from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np

from .errors import InputError, KilnError, ModelError
from .runtime.artifact import ArtifactError
from .ir.graph import Graph
from .ir.types import TensorType

#: the file of a saved Specializing artifact that records its symbolic inputs and options
RECORD = "specialize.json"
#: the source graph (before any pass) of a saved Specializing artifact
SOURCE = "source.kir"
#: specialized executables kept by default
DEFAULT_CACHE = 8


def symbolic_dims(graph: Graph) -> dict[str, list[tuple[str, int]]]:
    """Symbolic dimension name -> [(input name, axis)] where it appears, for the graph's tensor inputs."""
    dims: dict[str, list[tuple[str, int]]] = {}
    for v in graph.inputs:
        if isinstance(v.type, TensorType):
            for axis, d in enumerate(v.shape):
                if isinstance(d, str):
                    dims.setdefault(d, []).append((v.name, axis))
    return dims


def check_max_dims(max_dims: Mapping[str, int], dims: Mapping[str, Any]) -> dict[str, int]:
    """The maxima, checked: each names a symbolic dimension of the model and is a positive integer."""
    out = {}
    for name, bound in dict(max_dims or {}).items():
        if name not in dims:
            known = ", ".join(sorted(dims)) or "none"
            raise ModelError(f"max_dims names {name!r}, which is not a symbolic input dimension of the model "
                             f"(its symbolic dimensions: {known})")
        if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 1:
            raise ModelError(f"max_dims[{name!r}] = {bound!r}: a maximum is a positive integer")
        out[name] = int(bound)
    return out


class SizeCompileError(KilnError):
    """Compiling the graph for one size failed (the message names the sizes and the reason): the
    caller may run that size elsewhere. The failure is remembered, so a size is tried once."""


class PerSize:
    """Native code per size for a graph with symbolic input dimensions: ``run``/``__call__`` bind the
    sizes, compile the graph specialized to them on first use and keep the ``cache`` most recently
    used. Nothing is compiled before a size is run. (``Specializing`` adds the generic compile of a
    model, its artifact and ``save``; the ``torch.compile`` backend uses this as it is.)"""

    def __init__(self, source: Graph, options: Mapping[str, Any], max_dims: Mapping[str, int] | None = None,
                 cache: int = DEFAULT_CACHE):
        self._source = source
        self._options = dict(options)
        self.dims = symbolic_dims(source)
        self.max_dims = check_max_dims(max_dims or {}, self.dims)
        if int(cache) < 1:
            raise ValueError(f"the specialization cache holds at least one executable, got {cache}")
        self.cache_size = int(cache)
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self._failed: OrderedDict[tuple, str] = OrderedDict()  # sizes that did not compile -> why
        self._lock = threading.Lock()
        self._inputs = {v.name: v for v in source.inputs}
        self._input_names = [v.name for v in source.inputs]
        self._output_names = list(source.output_names)

    @property
    def input_names(self) -> list[str]:
        return self._input_names

    @property
    def output_names(self) -> list[str]:
        return self._output_names

    @property
    def source(self) -> Graph:
        """The model's graph as loaded (symbolic inputs; read it, do not change it)."""
        return self._source

    @property
    def specializations(self) -> list[tuple[dict, Any]]:
        """(sizes, executable) of each size compiled and kept, least recently used first."""
        with self._lock:
            return [(dict(key), exe) for key, exe in self._cache.items()]

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}<={self.max_dims[d]}" if d in self.max_dims else d for d in self.dims)
        return f"<{type(self).__name__} {self._label()}: symbolic {dims}; {len(self._cache)} size(s) compiled>"

    def _label(self) -> str:
        return self._source.name

    # -- running -------------------------------------------------------------------------------
    def sizes_of(self, inputs: Mapping[str, Any]) -> dict[str, int]:
        """Each symbolic dimension's size in ``inputs`` (InputError where they disagree or exceed a maximum)."""
        sizes: dict[str, int] = {}
        for dim, places in self.dims.items():
            for name, axis in places:
                if name not in inputs:
                    raise InputError(f"missing input {name!r}; the model takes {self.input_names}")
                shape = np.shape(inputs[name])
                want = self._inputs[name].type
                if len(shape) != want.rank:
                    raise InputError(f"input {name!r}: expected rank {want.rank} ({want}), got shape {list(shape)}")
                got = getattr(inputs[name], "dtype", None)
                if got is not None and np.dtype(got) != want.dtype.np:
                    raise InputError(f"input {name!r} has element type {np.dtype(got)}, the model takes {want} "
                                     f"({want.dtype.np})")
                n = int(shape[axis])
                if sizes.setdefault(dim, n) != n:
                    first = places[0]
                    raise InputError(f"symbolic dimension {dim} is {sizes[dim]} in input {first[0]!r} (axis "
                                     f"{first[1]}) but {n} in input {name!r} (axis {axis}); one name is one size")
                bound = self.max_dims.get(dim)
                if bound is not None and n > bound:
                    raise InputError(f"input {name!r}: symbolic dimension {dim} = {n} is past its maximum {bound} "
                                     f"(compile with a larger --max-dim {dim}=...)")
        return sizes

    def specialized(self, sizes: Mapping[str, int]):
        """The executable for these sizes: kept, or compiled now."""
        key = tuple(sorted(sizes.items()))
        with self._lock:
            exe = self._cache.get(key)
            if exe is not None:
                self._cache.move_to_end(key)
                return exe
            why = self._failed.get(key)
            if why is None:
                try:
                    exe = self._compile(dict(key))
                except (KilnError, MemoryError) as e:  # (an InputError here is the graph's, not the caller's)
                    why = self._failed[key] = f"{type(e).__name__}: {e}"
                    while len(self._failed) > self.cache_size:
                        self._failed.popitem(last=False)
            if why is not None:
                raise SizeCompileError(f"{self._label()}: compiling for {dict(key)} failed: {why}")
            self._cache[key] = exe
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return exe

    def _compile(self, sizes: dict[str, int]):
        from .driver import compile as compile_
        from .ir.clone import clone

        shapes = {v.name: tuple(sizes[d] if isinstance(d, str) else d for d in v.shape)
                  for v in self._source.inputs if isinstance(v.type, TensorType) and not v.type.is_static}
        graph, _ = clone(self._source)
        return compile_(graph, input_shapes=shapes, specialize=False, **self._options)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self.specialized(self.sizes_of(inputs)).run(inputs)

    def __call__(self, *arrays):
        if len(arrays) != len(self.input_names):
            raise InputError(f"the model takes {len(self.input_names)} input(s) {self.input_names}, got {len(arrays)}")
        return self.specialized(self.sizes_of(dict(zip(self.input_names, arrays))))(*arrays)


class Specializing(PerSize):
    """An executable for a model with symbolic input dimensions (see the module docstring)."""

    def __init__(self, generic, source: Graph, options: Mapping[str, Any], max_dims: Mapping[str, int],
                 cache: int = DEFAULT_CACHE):
        super().__init__(source, options, max_dims, cache)
        self.generic = generic

    # -- what the generic executable says ----------------------------------------------------------
    @property
    def path(self) -> str:
        return self.generic.path

    @property
    def manifest(self):
        return self.generic.manifest

    @property
    def inputs(self) -> list[tuple]:
        return self.generic.inputs

    @property
    def fallback(self) -> list[dict]:
        """The nodes the generic compile interprets (what runs in the interpreter before a size is
        known); each specialization has its own ``fallback``."""
        return self.generic.fallback

    @property
    def kernels(self) -> list[dict]:
        return self.generic.kernels

    def __getattr__(self, name: str):
        """Anything else (``nthreads``, ``arena_bytes``, ``quantization``, ...) is the generic compile's."""
        if name.startswith("_") or name == "generic":
            raise AttributeError(name)
        return getattr(self.generic, name)

    def _label(self) -> str:
        return self.generic.manifest.model

    # -- saving ----------------------------------------------------------------------------------
    def record(self) -> dict:
        """What ``specialize.json`` holds: the maxima, the cache size and the compile options kept."""
        return {"dims": sorted(self.dims), "max_dims": self.max_dims, "cache": self.cache_size,
                "options": {k: v for k, v in self._options.items() if k in SAVED_OPTIONS and _plain(v)}}

    def save(self, path: str | os.PathLike) -> str:
        """The generic artifact with the source graph and the specialization record."""
        from .ir.printer import save_text
        from .runtime.artifact import MANIFEST, ArtifactDir, finish_manifest, read_manifest, staging

        dest = os.fspath(path)
        if os.path.abspath(dest) == os.path.abspath(self.generic.path) and is_specializing(self.generic.manifest):
            return dest
        with staging(dest) as tmp, ArtifactDir(self.generic.path) as d:
            for name in [MANIFEST, *self.generic.manifest.files]:
                if name not in (SOURCE, SOURCE + ".npz", RECORD):
                    d.copy(name, os.path.join(tmp, name))
            save_text(self._source, os.path.join(tmp, SOURCE))
            record = self.record()
            with open(os.path.join(tmp, RECORD), "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1, sort_keys=True)
            manifest = read_manifest(tmp, check_files=False)
            finish_manifest(tmp, manifest)  # the checksums now cover the source and the record
        return dest


#: the compile options a saved Specializing artifact keeps (plain values; the target is this machine's)
SAVED_OPTIONS = ("opt_level", "fallback", "nthreads", "disabled_passes", "memory_limit", "model_name", "quantize")


def _plain(v) -> bool:
    """Whether an option value is JSON (a quantize option object is not: such artifacts keep none)."""
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v))


def load_specializing(path: str, generic, nthreads: int | None = None) -> Specializing:
    """The Specializing executable of a saved artifact whose generic part ``generic`` is loaded."""
    from .ir.parser import parse
    from .runtime.artifact import ArtifactDir

    files = generic.manifest.files
    with ArtifactDir(path) as d:
        try:
            record = json.loads(d.read(RECORD, files[RECORD], 1 << 20))
            text = d.read(SOURCE, files[SOURCE], 1 << 40)
            side = SOURCE + ".npz"
            weights = None
            if side in files:
                import io

                with np.load(io.BytesIO(d.read(side, files[side], 1 << 40)), allow_pickle=False) as z:
                    weights = {k: z[k] for k in z.files}
            source = parse(text.decode() if isinstance(text, bytes) else text, weights,
                           filename=os.path.join(path, SOURCE))
        except (KeyError, ValueError, OSError) as e:
            raise ArtifactError(f"{path}: the specialization record or source graph is unreadable: {e}") from None
    options = dict(record.get("options", {}))
    if nthreads:
        options["nthreads"] = nthreads
    return Specializing(generic, source, options, record.get("max_dims", {}), record.get("cache", DEFAULT_CACHE))


def is_specializing(manifest) -> bool:
    return RECORD in manifest.files and SOURCE in manifest.files


__all__ = ["DEFAULT_CACHE", "PerSize", "SizeCompileError", "Specializing", "check_max_dims", "is_specializing",
           "load_specializing", "symbolic_dims"]
