"""Loading an artifact and running it: ``load(path) -> Executable``; ``exe.run({name: array})``.

Loading compiles nothing: it verifies the manifest (format, checksum, schema, CPU features), opens
the shared library (from the verified bytes, under a private name: ``codegen/loader.py``), and
memory-maps the weights (read-only, not copied, hashed through the mapping). When some nodes have
no native code it also parses the final IR to run those nodes in the reference interpreter.

``run`` checks every input (names, element type, shape; a non-contiguous array is copied) before
any native code runs, takes an arena (one per concurrent caller, allocated once and reused), calls
the native forward function (or, with fallback nodes, the native segments and the interpreter in
turn) and copies the outputs out of the arena: results never alias Kiln's memory. It is safe to
call from several threads at once. Modules, memory and launches go through a ``Device``
(``device.py``; the host CPU by default).
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..codegen.native import PROFILE_THREADS, profile_record_bytes
from ..errors import InputError, KilnError
from .artifact import MAX_LIBRARY_BYTES, ArtifactDir, ArtifactError, read_manifest
from .device import CpuDevice, Device, Memory
from .format import (IR_TEXT, LAYOUT_SYMBOL, LIBRARY, WEIGHTS, BufferRef, ConstRef, FallbackStep, InputRef, Manifest,
                     NativeStep, PythonRef, SchemaError, check_fallback_nodes, check_layout, machine_memory, np_dtype)
from .status import clear as clear_status, raise_reported
from .threads import ThreadChoice

_np_dtype = np_dtype
_FORWARD = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


_char_at, _addressof, _clock = ctypes.c_char.from_buffer, ctypes.addressof, time.perf_counter


@dataclass
class RunTiming:
    """How one ``Executable.run_timed`` call's time went."""

    seconds: float                  # the whole call
    steps: list[float]              # per kernel (``Executable.kernels`` order): seconds on the calling thread
    pool: list[list[float]]         # per pool thread: its seconds in each kernel's parallel loops
    interpreted: dict[str, float]   # per interpreted node name: seconds


class Executable:
    """A loaded model (see the module docstring). Build one with ``compiler.compile`` or ``compiler.load``.

    ``manifest`` must come from ``read_manifest`` (validated); every file is read here, through
    ``ArtifactDir`` (regular files inside ``path`` only), and checked against the manifest's
    checksums as it is read: the bytes loaded are the bytes hashed."""

    def __init__(self, path: str, manifest: Manifest, nthreads: int | None = None, _owner: Any = None,
                 _dir: ArtifactDir | None = None, device: Device | None = None):
        self.path = path
        self.manifest = manifest
        self.device: Device = device or CpuDevice()
        self._adaptive = True
        self.nthreads = int(nthreads) if nthreads else default_threads()
        self._owner = _owner  # keeps a temporary artifact directory alive
        with contextlib.ExitStack() as stack:
            d = _dir or stack.enter_context(ArtifactDir(path))
            self._open_files(d)
        self._segments = {s.function: self._module.function(s.function, _FORWARD)
                          for s in manifest.plan if isinstance(s, NativeStep)}
        # (name, NumPy dtype, shape, element type name); dtype None for an input that only
        # interpreted nodes read (a sequence, or a tensor of symbolic shape): not checked here
        self._signature_ = [(i.name, _np_dtype(i.dtype), i.shape, i.dtype) if i.dtype is not None
                            else (i.name, None, i.type, None) for i in manifest.inputs]
        self._shown = self._signature()  # for error messages; built once, not per run
        self._table_t = ctypes.c_void_p * max(len(self._signature_), 1)  # the input pointer table's type
        self.outputs = [(o.name, o.dtype, list(o.shape) if o.shape is not None else None) for o in manifest.outputs]
        self._arenas: list[Memory] = []  # one per concurrent caller
        # what run() does, decoded once: the steps, and where each output is read
        self._steps = [(step, self._segments.get(step.function) if isinstance(step, NativeStep) else None)
                       for step in manifest.plan]
        self._outputs = []
        for o in manifest.outputs:
            r = o.ref
            if isinstance(r, BufferRef) and r.place == "arena":
                dt = _np_dtype(r.dtype)
                nbytes = int(np.prod(r.shape, dtype=np.int64)) * dt.itemsize
                self._outputs.append((o.name, r.where, r.where + nbytes, dt, r.shape, r))
            else:
                self._outputs.append((o.name, None, None, None, None, r))
        self._lock = threading.Lock()
        self.arena_bytes = int(manifest.memory["arena_bytes"])
        self._fast = self._fast_plan()
        self._fast_slots: dict = {}  # id(arena) -> (its input pointer table, its output views)

    def _fast_plan(self):
        """What ``run`` needs for the common case, decided once: on the CPU, one native segment, no
        status to check, every input a tensor of static shape and every output in the arena. Then a
        run checks each input in a few comparisons, reuses its pointer table and output views (per
        arena), and calls the segment directly (issue 20: the overhead around the native call). None
        when the model is not such a case (the general path runs)."""
        natives = [fn for _, fn in self._steps if fn is not None]
        if (type(self.device) is not CpuDevice or len(self._steps) != 1 or len(natives) != 1
                or self.manifest.status_offset is not None
                or any(dt is None for _, dt, _, _ in self._signature_)
                or any(start is None for _, start, _, _, _, _ in self._outputs)):
            return None
        return natives[0], tuple((n, dt, tuple(shape)) for n, dt, shape, _ in self._signature_)

    def _open_files(self, d: ArtifactDir) -> None:
        """The library, the weights and (with interpreted steps) the IR, each verified as it is read;
        the other files of the artifact verified too."""
        files = self.manifest.files
        used = {WEIGHTS}
        self._module = None  # absent when no node runs natively
        if self.manifest.native:
            used.add(LIBRARY)
            data = d.read(LIBRARY, files[LIBRARY], MAX_LIBRARY_BYTES)
            self._module = self.device.load_module(data, os.path.join(self.path, LIBRARY))
        self._mapped = d.map(WEIGHTS, files[WEIGHTS], self.manifest.memory["weights_bytes"])
        self._weights = np.frombuffer(self._mapped, np.uint8) if self._mapped is not None else np.zeros(64, np.uint8)
        self._wptr = self._weights.ctypes.data
        if self._module is not None:  # native code was compiled for one layout: the manifest must describe it
            try:
                check_layout(self.manifest, self._module.string(LAYOUT_SYMBOL))
            except SchemaError as e:
                raise ArtifactError(f"{self.path}: {e}") from None
        self._graph = None
        if self.manifest.interpreted:
            used |= {IR_TEXT, IR_TEXT + ".npz"}
            self._graph = self._read_graph(d)
        for name, digest in files.items():
            if name not in used:
                d.verify(name, digest)

    def _read_graph(self, d: ArtifactDir):
        """The final IR (and its sidecar of constants), for the interpreted steps, checked against the plan."""
        from ..ir.parser import parse

        files, limit = self.manifest.files, machine_memory()
        text = d.read(IR_TEXT, files[IR_TEXT], limit)
        weights = None
        side = IR_TEXT + ".npz"
        if side in files:
            data = d.read(side, files[side], limit)
            try:
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    weights = {k: z[k] for k in z.files}
            except Exception as e:  # a corrupt archive: zipfile, NumPy and OS errors alike
                raise ArtifactError(f"{self.path}: {side} is not a NumPy archive: {e}") from None
        try:
            graph = parse(text, weights, filename=os.path.join(self.path, IR_TEXT))
            check_fallback_nodes(self.manifest, graph)
        except (ValueError, KilnError, SchemaError) as e:
            raise ArtifactError(f"{self.path}: {e}") from None
        return graph

    @property
    def _lib(self):
        """The loaded shared library (the CPU device's), for tests and tools that inspect it."""
        return getattr(self._module, "lib", None)

    # -- threads -----------------------------------------------------------------------------------
    @property
    def nthreads(self) -> int:
        """The most threads a call's kernels run on (each call on this many or one: ``adaptive_threads``)."""
        return self._nthreads

    @nthreads.setter
    def nthreads(self, n: int) -> None:
        if int(n) < 1:
            raise ValueError(f"nthreads must be at least 1, got {n}")
        self._nthreads = int(n)
        self._choice = (ThreadChoice(self._nthreads) if self._adaptive and self._nthreads > 1
                        and type(self.device) is CpuDevice else None)

    @property
    def adaptive_threads(self) -> bool:
        """Whether each call runs on ``nthreads`` threads or one, whichever recent calls found faster
        (``runtime/threads.py``; the default). False: every call on ``nthreads``."""
        return self._adaptive

    @adaptive_threads.setter
    def adaptive_threads(self, on: bool) -> None:
        self._adaptive = bool(on)
        self.nthreads = self._nthreads

    @property
    def threads_in_use(self) -> int:
        """The thread count calls run with now (between probes of the other)."""
        return self._choice.using if self._choice is not None else self._nthreads

    # -- information -----------------------------------------------------------------------------
    @property
    def inputs(self) -> list[tuple]:
        """(name, DType, shape) of each input; (name, None, type text) for an input only interpreted
        nodes read (a sequence, or a tensor of symbolic shape)."""
        from ..ir.types import DType

        return [(n, DType[d], s) if d else (n, None, s) for n, _, s, d in self._signature_]

    @property
    def input_names(self) -> list[str]:
        return [n for n, _, _, _ in self._signature_]

    @property
    def output_names(self) -> list[str]:
        return [n for n, _, _ in self.outputs]

    @property
    def kernels(self) -> list[dict]:
        return self.manifest.kernels

    def run_timed(self, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], "RunTiming"]:
        """``run(inputs)`` on an artifact compiled with ``profile=True``, and how its time went
        (``RunTiming``): each kernel's seconds, each pool thread's seconds in each kernel's parallel
        loops, and each interpreted step's seconds. The times are kept in this call's arena (the
        profile record, ``native/parallel.c``), so concurrent callers each time their own run."""
        m = self.manifest
        if not m.profile:
            raise KilnError("this artifact was not compiled with profile=True: no step is timed")
        mem = self._take_arena()
        try:
            rec = None
            if m.profile_offset is not None:
                nsteps = m.nodes  # a step per node of the final graph (build_program)
                rec = self.device.view(mem, m.profile_offset, np.dtype(np.float64),
                                       (profile_record_bytes(nsteps) // 8,))
                rec[:] = 0.0
            interpreted: dict[str, float] = {}
            t0 = time.perf_counter()
            out = self._run_on(inputs, mem, interpreted, self._nthreads)  # (profiles: every call on all threads)
            seconds = time.perf_counter() - t0
            at = 1 + PROFILE_THREADS  # the last clock and the pending slots come first
            steps = [float(rec[at + k["step"]]) if rec is not None else 0.0 for k in self.kernels]
            pool = []
            if rec is not None:
                table = rec[at:at + nsteps * PROFILE_THREADS].reshape(PROFILE_THREADS, nsteps)
                pool = [[float(table[t, k["step"]]) for k in self.kernels] for t in range(1, PROFILE_THREADS)]
                while pool and not any(pool[-1]):  # the threads the pool has (those that ran something)
                    pool.pop()
            return out, RunTiming(seconds, steps, pool, interpreted)
        finally:
            self._give_arena(mem)

    @property
    def fallback(self) -> list[dict]:
        """The nodes that run in the reference interpreter (op, node, reason)."""
        return self.manifest.fallback

    def __repr__(self) -> str:
        return f"<Executable {self.manifest.model} {self._signature()} {len(self.kernels)} kernels>"

    # -- running -------------------------------------------------------------------------------
    def __call__(self, *arrays: np.ndarray):
        """Positional inputs (in signature order); one output comes back as an array, several as a tuple."""
        fast = self._fast
        if fast is not None and len(arrays) == len(fast[1]):
            for a, (_, dtype, shape) in zip(arrays, fast[1]):
                if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                    break
            else:
                vals = tuple(self._run_fast(fast[0], arrays).values())  # outputs in signature order
                return vals[0] if len(vals) == 1 else vals
        if len(arrays) != len(self._signature_):
            raise InputError(f"the model takes {len(self._signature_)} input(s) {self._shown}, "
                             f"got {len(arrays)}")
        outs = self.run(dict(zip(self.input_names, arrays)))
        vals = tuple(outs[n] for n in self.output_names)
        return vals[0] if len(vals) == 1 else vals

    def _signature(self) -> str:
        return "(" + ", ".join(f"{n}: {d}{list(s)}" if d else f"{n}: {s}" for n, _, s, d in self._signature_) + ")"

    def check_inputs(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """The inputs in signature order, each checked (and made contiguous); InputError otherwise."""
        return check_feeds(self._signature_, inputs, self._shown)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self._run_on(inputs)

    def _run_on(self, inputs: Mapping[str, Any], mem: Memory | None = None,
                interpreted: dict | None = None, threads: int | None = None) -> dict[str, np.ndarray]:
        """``run`` on ``mem`` (default: an arena of the pool's, one per concurrent caller), adding each
        interpreted step's seconds to ``interpreted`` when given; on ``threads`` threads (default:
        the thread choice's)."""
        fast = self._fast
        if fast is not None and type(inputs) is dict:
            fn, signature = fast
            arrays = []
            for name, dtype, shape in signature:
                a = inputs.get(name)
                if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                    break
                arrays.append(a)
            else:
                if len(inputs) == len(signature):
                    return self._run_fast(fn, arrays, mem, threads)
        return self._run_general(inputs, mem, interpreted, threads)

    def _run_fast(self, fn, arrays: list, given: Memory | None = None, threads: int | None = None) -> dict[str, np.ndarray]:
        mem = given
        if mem is None:
            try:
                mem = self._arenas.pop()  # list.pop is atomic: one arena per concurrent caller
            except IndexError:
                mem = self.device.allocate(max(self.arena_bytes, 64))
        slot = self._fast_slots.get(id(mem))
        if slot is None:
            views = [(name, self.device.view(mem, start, dt, shape)) for name, start, _, dt, shape, _ in self._outputs]
            slot = self._fast_slots[id(mem)] = (self._table_t(), views)
        table, views = slot
        try:
            for i, a in enumerate(arrays):
                try:  # the address through the buffer protocol: a quarter of a.ctypes.data's time
                    table[i] = _addressof(_char_at(a))
                except (TypeError, ValueError):  # a read-only or empty array
                    table[i] = a.ctypes.data
            choice = self._choice
            if threads is not None or choice is None:
                fn(_addressof(table), self._wptr, mem.address, threads or self._nthreads)
            else:
                n = choice.pick()
                t0 = _clock()
                fn(_addressof(table), self._wptr, mem.address, n)
                choice.record(n, _clock() - t0)
            return {name: v.copy() for name, v in views}
        finally:
            if given is None:
                self._arenas.append(mem)

    def _run_general(self, inputs: Mapping[str, Any], given: Memory | None = None,
                     interpreted: dict | None = None, threads: int | None = None) -> dict[str, np.ndarray]:
        arrays = self.check_inputs(inputs)
        choice = self._choice if threads is None else None
        nthreads = threads or (choice.pick() if choice is not None else self._nthreads)
        started = _clock()
        table = self._table_t(*[a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else None
                                for a in arrays])
        dev = self.device
        mem = given or self._take_arena()
        try:
            env: dict[str, Any] = {}
            status = self.manifest.status_offset
            for step, fn in self._steps:
                if fn is not None:
                    if status is not None:
                        clear_status(mem.host, status)
                    dev.run(fn, ctypes.addressof(table), self._wptr, mem.address, nthreads)
                    if status is not None:
                        dev.synchronize()
                        raise_reported(mem.host, status, self.manifest.kernels)
                elif interpreted is None:
                    dev.synchronize()
                    self._run_fallback(step, arrays, mem, env)
                else:  # run_timed: each interpreted step is timed too
                    dev.synchronize()
                    t0 = time.perf_counter()
                    self._run_fallback(step, arrays, mem, env)
                    name = self._graph.nodes[step.node].name or ""
                    interpreted[name] = interpreted.get(name, 0.0) + time.perf_counter() - t0
            dev.synchronize()
            if choice is not None:
                choice.record(nthreads, _clock() - started)
            result = {}
            for name, start, stop, dt, shape, ref in self._outputs:
                if start is not None:  # in the arena (the common case: one slice, one copy)
                    result[name] = dev.copy_out(mem, start, dt, shape)
                else:
                    result[name] = self._read(ref, arrays, mem, env)
            return result
        finally:
            if given is None:
                self._give_arena(mem)

    def _take_arena(self) -> Memory:
        with self._lock:
            if self._arenas:
                return self._arenas.pop()
        return self.device.allocate(max(self.arena_bytes, 64))

    def _give_arena(self, mem: Memory) -> None:
        with self._lock:
            self._arenas.append(mem)

    def _view(self, ref: BufferRef, arrays, arena) -> np.ndarray:
        kind, where, dtype, shape = ref.place, ref.where, ref.dtype, ref.shape
        if kind == "input":  # the input itself, or a view op's result seen through it
            return arrays[where].reshape(shape)
        dt = _np_dtype(dtype)
        if kind == "weight":
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            return self._weights[where:where + n].view(dt).reshape(shape)
        return self.device.view(arena, where, dt, shape)

    def _read(self, ref, arrays, arena, env):
        if isinstance(ref, PythonRef):
            return env[ref.key]
        if isinstance(ref, InputRef):  # a sequence or optional passed through
            return arrays[ref.index]
        return np.array(self._view(ref, arrays, arena))

    def _run_fallback(self, step: FallbackStep, arrays, arena, env: dict) -> None:
        from ..ir.interpreter import run_node

        node = self._graph.nodes[step.node]
        args, native = [], []
        for ref in step.inputs:
            if ref is None:
                args.append(None)
            elif isinstance(ref, InputRef):
                args.append(arrays[ref.index])
            elif isinstance(ref, ConstRef):
                args.append(node.inputs[ref.position].const)
            elif isinstance(ref, PythonRef):
                args.append(env[ref.key])
            else:  # a buffer native code wrote
                args.append(self._view(ref, arrays, arena))
                native.append(args[-1])
        results = run_node(node, args)
        for v, r, out in zip(node.outputs, results, step.outputs):
            if isinstance(out, PythonRef):
                # a result kept here must not be a view of an arena buffer (a Reshape's is): the
                # memory plan lets later kernels reuse that buffer
                if isinstance(r, np.ndarray) and any(np.may_share_memory(r, a) for a in native):
                    r = r.copy()
                env[out.key] = r
            else:
                view = self._view(out, arrays, arena)
                r = np.asarray(r)
                if r.shape != view.shape or r.dtype != view.dtype:
                    raise ArtifactError(f"{node.describe()} (interpreter) gave {r.dtype}{list(r.shape)}, the "
                                        f"artifact's plan has {view.dtype}{list(view.shape)}")
                view[...] = r

    # -- saving --------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> str:
        """Copy the artifact to ``path`` (a directory, conventionally ``model.kiln``); returns it."""
        from .artifact import MANIFEST, staging

        dest = os.fspath(path)
        if os.path.abspath(dest) == os.path.abspath(self.path):
            return dest
        with staging(dest) as tmp, ArtifactDir(self.path) as d:
            for name in [MANIFEST, *self.manifest.files]:
                d.copy(name, os.path.join(tmp, name))
            copied = read_manifest(tmp)  # complete and verified before it replaces anything
            if copied.manifest_sha256 != self.manifest.manifest_sha256:
                raise ArtifactError(f"{self.path} changed since it was loaded; not saved to {dest}")
        return dest


def check_feeds(signature, inputs: Mapping[str, Any], shown: str, device_array=None) -> list:
    """The inputs in ``signature`` order ((name, NumPy dtype or None, shape, element type name) each),
    checked against it (names, element type, shape) and NumPy ones made contiguous; ``InputError``
    naming the input otherwise (``shown``: the signature as the messages print it). ``device_array``,
    when given, turns an object with ``__cuda_array_interface__`` (or numba's own device array) into a
    device array (a CUDA run)."""
    if not isinstance(inputs, Mapping):
        raise InputError(f"run() takes a dict of input name -> array; the model takes {shown}")
    names = [n for n, *_ in signature]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"missing input(s) {missing}; the model takes {shown}")
    extra = [n for n in inputs if n not in names]
    if extra:
        raise InputError(f"unknown input(s) {extra}; the model takes {shown}")
    out = []
    for name, dtype, shape, tname in signature:
        a = inputs[name]
        if dtype is None:
            out.append(a)
            continue
        if device_array is not None and not isinstance(a, np.ndarray) and \
                (hasattr(a, "__cuda_array_interface__") or getattr(a, "__cuda_ndarray__", False)):
            a = device_array(a)
        elif not isinstance(a, np.ndarray):
            a = np.asarray(a)
            if a.dtype == np.float64 and tname == "f32":
                raise InputError(f"input {name!r}: got a Python sequence of float64, expected {tname}"
                                 f"{list(shape)}: pass np.asarray(..., dtype=np.float32)")
        if np.dtype(a.dtype) != dtype:
            raise InputError(f"input {name!r} has element type {a.dtype}, the model takes "
                             f"{tname}{list(shape)} ({dtype})")
        if tuple(a.shape) != shape:
            raise InputError(f"input {name!r} has shape {list(a.shape)}, the model takes {tname}{list(shape)}"
                             f" (compile with input_shapes / --input-shape for another shape)")
        if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        out.append(a)
    return out


def load(path: str | os.PathLike, nthreads: int | None = None) -> Executable:
    """Open a compiled artifact (a ``model.kiln`` directory); compiles nothing. Refuses an artifact
    that is corrupt or tampered with, newer than this Kiln, or built for CPU features this machine
    lacks (``ArtifactError``). A CUDA artifact (``--target cuda``) loads as a ``runtime.cuda.CudaExecutable``."""
    path = os.fspath(path)
    with ArtifactDir(path) as d:  # one directory for the manifest and the files it names
        from .cuda import is_cuda_artifact, load_cuda

        if is_cuda_artifact(d):
            return load_cuda(path)
        manifest = read_manifest(d, check_files=False)  # the Executable verifies each file as it reads it
        return Executable(path, manifest, nthreads, _dir=d)


__all__ = ["Executable", "RunTiming", "check_feeds", "default_threads", "load"]
