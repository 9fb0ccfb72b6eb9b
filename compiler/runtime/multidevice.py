"""Multi-device executables: a model's parts on several devices, run as a pipeline or as replicas.

A multi-device artifact is a directory holding ``devices.json`` (the index: the devices, the
mode, the model's signature and the parts) and one ordinary artifact per part:

* **pipeline** (``parallel: "pipeline"``): part *j* is stage *j*, on its device; it reads model
  inputs and the wires earlier stages send it, and returns model outputs and wires for later ones.
  ``run`` runs the stages in turn (the latency of one item); ``run_many`` streams items through
  them, every stage on its own device thread at once (the throughput of the slowest stage), with at
  most two items per stage in flight. With a micro-batch, the stages are compiled for ``micro``
  rows and ``run`` cuts the batch into micro-batches that stream the same way.
* **data** (``parallel: "data"``): every part is a whole model for some rows of the batch (the
  replicas of one size share one artifact); ``run`` cuts the batch, runs the replicas at once on
  their devices and joins their outputs.

Each device has one thread, pinned to its cores (``os.sched_setaffinity`` on the thread), that runs
its parts; a part's kernels use the device's core count as their thread count. Every part is loaded
on its own (replicas of one artifact too), so each has its own copy of the library and with it its
own thread pools (``parallel.c``'s and the GEMM's: static state of the library); a part with more
than one thread always runs on its device's thread, so its pool threads start there and inherit the
device's cores. Outputs are the
single-device artifact's, bit for bit where the kernels are the same (a replica's kernels are
compiled for its own rows, so their blocking may differ).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import queue
import re
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InputError, KilnError
from .artifact import ArtifactError
from .executable import _np_dtype, check_feeds, load

INDEX = "devices.json"
FORMAT = 1
_PART_DIR = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


@dataclass
class Part:
    """One part of the model: where it runs and what it reads and returns (``rows``: a replica's
    share of the batch, as [start, stop))."""

    name: str
    device: str
    cores: tuple[int, ...]
    inputs: list[str]
    outputs: list[str]
    rows: tuple[int, int] | None = None
    exe: Any = None
    keep: frozenset = frozenset()  # a pipeline stage: the names later stages or the caller still need


class DeviceThread:
    """The thread that runs a device's work, pinned to its cores; ``submit`` returns a future."""

    def __init__(self, name: str, cores: Sequence[int]):
        self.name, self.cores = name, tuple(cores)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"kiln-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self.cores:
            try:
                os.sched_setaffinity(0, self.cores)  # 0: this thread (Linux)
            except (AttributeError, OSError):
                pass
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:
                    fut.set_exception(e)

    def submit(self, fn, *args) -> cf.Future:
        fut: cf.Future = cf.Future()
        self._q.put((fut, fn, args))
        return fut

    def close(self) -> None:
        self._q.put(None)


class MultiDeviceExecutable:
    """A loaded multi-device artifact (see the module docstring); ``run``/``__call__``/``save`` as an
    ``Executable``'s, plus ``run_many`` and what was placed where (``parts``, ``placement``)."""

    def __init__(self, path: str, index: dict, parts: list[Part]):
        self._setup(path, index, parts)
        self._threads = {d["name"]: DeviceThread(d["name"], d["cores"]) for d in index["devices"]}
        # the device threads stop when the executable goes (they hold nothing of it)
        self._finalizer = weakref.finalize(self, _stop, list(self._threads.values()))

    def _setup(self, path: str, index: dict, parts: list[Part]) -> None:
        self.path = path
        self.index = index
        self.parallel: str = index["parallel"]
        self.parts = parts
        self.placement: dict = index.get("placement", {})
        self.batch: int | None = index.get("batch")
        self.micro: int | None = index.get("micro")
        self._signature_ = [(i["name"], _np_dtype(i["dtype"]), tuple(i["shape"]), i["dtype"]) for i in index["inputs"]]
        self._shown = "(" + ", ".join(f"{n}: {t}{list(s)}" for n, _, s, t in self._signature_) + ")"
        self.output_names: list[str] = list(index["outputs"])
        needed = set(self.output_names)
        for p in reversed(parts):  # what is still needed after each stage
            p.keep = frozenset(needed)
            needed |= set(p.inputs)
        self.quantization = None

    # -- information -----------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [n for n, *_ in self._signature_]

    @property
    def inputs(self) -> list[tuple]:
        from ..ir.types import DType

        return [(n, DType[t], s) for n, _, s, t in self._signature_]

    @property
    def devices(self) -> list[dict]:
        return list(self.index["devices"])

    @property
    def kernels(self) -> list[dict]:
        return [dict(k, device=p.device) for p in self._distinct_parts() for k in p.exe.kernels]

    @property
    def fallback(self) -> list[dict]:
        return [dict(f, device=p.device) for p in self._distinct_parts() for f in p.exe.fallback]

    def _distinct_parts(self) -> list[Part]:
        seen, out = set(), []
        for p in self.parts:
            if p.exe is not None and id(p.exe) not in seen:
                seen.add(id(p.exe))
                out.append(p)
        return out

    def __repr__(self) -> str:
        where = ", ".join(f"{p.name} on {p.device}" for p in self.parts)
        return f"<MultiDeviceExecutable {self.index.get('model')} {self.parallel}: {where}>"

    # -- running -------------------------------------------------------------------------------
    def __call__(self, *arrays: np.ndarray):
        if len(arrays) != len(self._signature_):
            raise InputError(f"the model takes {len(self._signature_)} input(s) {self._shown}, got {len(arrays)}")
        outs = self.run(dict(zip(self.input_names, arrays)))
        vals = tuple(outs[n] for n in self.output_names)
        return vals[0] if len(vals) == 1 else vals

    def _check(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return dict(zip(self.input_names, check_feeds(self._signature_, inputs, self._shown)))

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        feeds = self._check(inputs)
        if self.parallel == "data":
            futs = [self._threads[p.device].submit(p.exe.run, _rows(feeds, *p.rows)) for p in self.parts]
            outs = [f.result() for f in _all_done(futs)]
            return {n: np.concatenate([o[n] for o in outs]) for n in self.output_names}
        if self.micro is None:
            env = feeds
            for p in self.parts:  # one item: the stages in turn
                if (p.exe.nthreads or 1) > 1:  # on its device's thread: its pool threads start there, on its cores
                    env = self._threads[p.device].submit(_stage, p, env).result()
                else:  # one thread: run here, without a hand-over
                    env = _stage(p, env)
            return {n: env[n] for n in self.output_names}
        pieces = self._stream([_rows(feeds, s, s + self.micro) for s in range(0, self.batch, self.micro)])
        return {n: np.concatenate([o[n] for o in pieces]) for n in self.output_names}

    def run_timed(self, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], list[tuple[Part, float, Any]]]:
        """``run(inputs)`` with each part timed (parts compiled with ``profile=True``): the outputs and,
        per part, (the part, its start in seconds from the call's, its ``RunTiming``). Replicas run at
        once on their devices; a pipeline's stages run in turn on theirs (one item, so a micro-batched
        pipeline is refused: its stages take micro-batches)."""
        for p in self._distinct_parts():
            if not getattr(p.exe.manifest, "profile", False):
                raise KilnError(f"part {p.name} on {p.device} was not built for profiling: compile with "
                                f"profile=True (kiln compile --profile)")
        if self.micro is not None:
            raise KilnError("profiling a micro-batched pipeline is not supported: its stages take micro-batches; "
                            "compile it without microbatch to profile it")
        feeds = self._check(inputs)
        t0 = time.perf_counter()

        def timed(p: Part, f: dict):
            start = time.perf_counter() - t0
            out, t = p.exe.run_timed(f)
            return out, (p, start, t)

        if self.parallel == "data":
            futs = [self._threads[p.device].submit(timed, p, _rows(feeds, *p.rows)) for p in self.parts]
            res = [f.result() for f in _all_done(futs)]
            return ({n: np.concatenate([o[n] for o, _ in res]) for n in self.output_names}, [t for _, t in res])
        env, times = feeds, []
        for p in self.parts:
            outs, t = self._threads[p.device].submit(timed, p, {n: env[n] for n in p.inputs}).result()
            times.append(t)
            nxt = {k: v for k, v in env.items() if k in p.keep}
            nxt.update((k, v) for k, v in outs.items() if k in p.keep)
            env = nxt
        return {n: env[n] for n in self.output_names}, times

    def run_many(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
        """Outputs for each of ``items`` (feed dicts), in order, the devices working at once: a
        pipeline streams the items through its stages; replicas take their rows of each item."""
        checked = [self._check(x) for x in items]
        if self.parallel == "data":  # one task per replica: its rows of every item
            futs = [self._threads[p.device].submit(_replica, p, checked) for p in self.parts]
            per_part = [f.result() for f in _all_done(futs)]
            return [{n: np.concatenate([outs[i][n] for outs in per_part]) for n in self.output_names}
                    for i in range(len(checked))]
        if self.micro is None:
            return self._stream(checked)
        n = self.batch // self.micro
        pieces = self._stream([_rows(f, s, s + self.micro) for f in checked for s in range(0, self.batch, self.micro)])
        return [{k: np.concatenate([o[k] for o in pieces[i * n:(i + 1) * n]]) for k in self.output_names}
                for i in range(len(checked))]

    def _stream(self, items: list[dict]) -> list[dict]:
        """Each item through the stages; stage j of item i runs on stage j's device thread after
        stage j-1 of item i, so the devices work on consecutive items at once."""
        depth = 2 * len(self.parts)
        last: list[cf.Future] = []
        for env in items:
            if len(last) >= depth:
                last[len(last) - depth].exception()  # at most `depth` items in flight
            fut: cf.Future | Any = env
            for p in self.parts:
                fut = self._threads[p.device].submit(_stage_after, p, fut)
            last.append(fut)
        return [{n: f.result()[n] for n in self.output_names} for f in _all_done(last)]


    def close(self) -> None:
        """Stop the device threads (also done when the executable is collected; they are daemons:
        a process may also just exit)."""
        self._finalizer()

    # -- saving --------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> str:
        """Copy the artifact (index and parts) to ``path``; returns it."""
        from .artifact import staging

        dest = os.fspath(path)
        if os.path.abspath(dest) == os.path.abspath(self.path):
            return dest
        with staging(dest) as tmp:
            for p in self._distinct_parts():
                p.exe.save(os.path.join(tmp, p.name))
            with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as f:
                json.dump(self.index, f, indent=1)
        return dest


def _stop(threads: list[DeviceThread]) -> None:
    for t in threads:
        t.close()


def _rows(feeds: dict, start: int, stop: int) -> dict:
    return {k: np.ascontiguousarray(v[start:stop]) for k, v in feeds.items()}


def _replica(p: Part, items: list[dict]) -> list[dict]:
    return [p.exe.run(_rows(f, *p.rows)) for f in items]


def _stage(p: Part, env: dict) -> dict:
    outs = p.exe.run({n: env[n] for n in p.inputs})
    nxt = {k: v for k, v in env.items() if k in p.keep}
    nxt.update((k, v) for k, v in outs.items() if k in p.keep)
    return nxt


def _stage_after(p: Part, prev) -> dict:
    return _stage(p, prev.result() if isinstance(prev, cf.Future) else prev)


def _all_done(futs: list[cf.Future]) -> list[cf.Future]:
    """``futs`` once every one has finished; the first error raised after all have (none left running)."""
    cf.wait(futs)
    for f in futs:
        if f.exception() is not None:
            raise f.exception()
    return futs


# ---------------------------------------------------------------------------------------------
# The index and loading
# ---------------------------------------------------------------------------------------------

def part_digest(part_dir: str) -> str:
    """What the index records of a part: its manifest's SHA-256 (a CUDA part: of its cuda.json)."""
    from .artifact import MANIFEST, read_manifest, sha256_file

    if os.path.isfile(os.path.join(part_dir, MANIFEST)):
        return read_manifest(part_dir, check_files=False).manifest_sha256
    return sha256_file(os.path.join(part_dir, "cuda.json"))


def part_memory(exe) -> dict:
    """A loaded part's memory figures (weights_bytes, arena_bytes), CPU or CUDA."""
    m = exe.manifest
    return m.memory if hasattr(m, "memory") else m["memory"]


def is_multidevice(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, INDEX))


def read_index(path: str) -> dict:
    """The index of a multi-device artifact, checked; ``ArtifactError`` naming what is wrong."""
    try:
        with open(os.path.join(path, INDEX), encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: cannot read {INDEX}: {e}") from None
    try:
        if index.get("format") != FORMAT:  # each part's own manifest checks its format and CPU too
            raise ArtifactError(f"{path}: {INDEX} has format {index.get('format')!r} (Kiln "
                                f"{index.get('kiln_version', '?')} wrote it); this Kiln reads format {FORMAT}")
        if index["parallel"] not in ("pipeline", "data"):
            raise ArtifactError(f"{path}: unknown parallel mode {index['parallel']!r}")
        names = {d["name"] for d in index["devices"]}
        for p in index["parts"]:
            if not _PART_DIR.match(p["path"]):
                raise ArtifactError(f"{path}: part directory {p['path']!r} is not a plain name")
            if p["device"] not in names:
                raise ArtifactError(f"{path}: part {p['path']} is on {p['device']}, not one of the devices")
        for i in index["inputs"]:
            _np_dtype(i["dtype"]), tuple(int(d) for d in i["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: {INDEX} is malformed ({type(e).__name__}: {e})") from None
    return index


def load_multidevice(path: str | os.PathLike, nthreads: int | None = None,
                     cluster: str | None = None) -> MultiDeviceExecutable:
    """Open a multi-device artifact: each part's artifact is loaded (and verified) as ``load`` does;
    a part's kernels run with its device's core count as their threads (``nthreads`` overrides).
    ``cluster`` ("ray", "ray://HOST:PORT") runs the parts as Ray actors instead (``cluster.py``)."""
    path = os.fspath(path)
    index = read_index(path)
    cores = {d["name"]: tuple(d["cores"]) for d in index["devices"]}
    parts = []
    for p in index["parts"]:
        exe = None
        if cluster is not None:  # loaded by the actors
            if p.get("kind", "cpu") != "cpu":
                raise KilnError(f"{path}: part {p['path']} is on {p['device']}: Ray runs CPU parts only, for now")
        else:  # every part its own load (replicas of one artifact too): its own library, so its own pools
            where = os.path.join(path, p["path"])
            if part_digest(where) != p["manifest_sha256"]:
                raise ArtifactError(f"{path}: part {p['path']} is not the one this index was written with")
            if p.get("kind", "cpu") == "cuda":
                from .cuda import load_cuda

                exe = load_cuda(where)
            else:
                exe = load(where, nthreads or max(1, len(cores[p["device"]])))
        rows = tuple(p["rows"]) if p.get("rows") is not None else None
        parts.append(Part(p["path"], p["device"], cores[p["device"]], list(p["inputs"]), list(p["outputs"]), rows,
                          exe))
    if not parts:
        raise KilnError(f"{path}: a multi-device artifact without parts")
    if cluster is not None:
        from .cluster import RayExecutable

        return RayExecutable(path, index, parts, cluster, nthreads)
    return MultiDeviceExecutable(path, index, parts)


__all__ = ["INDEX", "DeviceThread", "MultiDeviceExecutable", "Part", "is_multidevice", "load_multidevice",
           "read_index"]
