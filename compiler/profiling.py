"""Profiling a compiled model: per-kernel native times over many runs, against the machine's roofline,
and a Chrome trace of them (``kiln profile``).

    exe = compiler.compile(model, profile=True)        # every kernel timed by the native code
    p = compiler.profile(exe, feeds, runs=20)
    print(p.table())                                    # kernels by time: median, min-max, GFLOP/s, % roofline
    json.dump(p.chrome_trace(), open("trace.json", "w"))

An artifact built with ``profile=True`` (``kiln compile --profile``) reads a clock after every step of
its forward function (``kiln_profile_mark``, ``codegen/native/parallel.c``) into a profile record in
the run's arena; ``Executable.run_timed`` zeroes the record before the run and reads it after, so each
run gives each kernel's time, each pool thread's time in it, and each interpreted step's time. The
end-to-end latency of the same call is measured around it; what the kernels do not cover (steps run
in the interpreter, copying the outputs out, the call itself) is reported as ``other``.

**Roofline.** ``machine_roofline`` measures this machine once (Kiln's sgemm at 1024^3 on the threads
used: the compute peak; a NumPy copy of 256 MiB: the memory bandwidth, read + write) and caches the
figures in ``<cache>/kiln/roofline.json`` keyed by CPU model, threads and Kiln version (measured
again when a profiled kernel runs over 10% faster than the cached peak: that peak was measured while
something else used the cores, e.g. 111 GFLOP/s on a 2-core AMD EPYC during a test run, 205 alone). A kernel's
bound is ``min(peak, intensity * bandwidth)`` with intensity = FLOPs / bytes (the manifest's figures
from the op table: bytes are every member op's operands and results, an upper estimate for a fused
kernel whose intermediates stay in registers); its % of roofline is its GFLOP/s over that bound, and
for kernels without FLOPs (data movement) its GB/s over the bandwidth.

**No global state.** The record lives in the arena of the call, and each concurrent caller has its
own arena, so profiling one executable from several threads, or profiling while other threads call
``run``, times each run by itself. The trace's kernel track is the calling thread's, each run's
kernels one after another at their measured durations; each pool thread's track shows, per kernel,
the time that thread spent in the kernel's parallel chunks (placed from the kernel's start: the
native code sums a thread's chunk times per step rather than keeping each chunk's start). A loop
whose caller found the pool busy with another caller's kernel runs on the calling thread alone.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from . import __version__
from .errors import KilnError
from .paths import cache_home

#: bytes of the arrays copied to measure the memory bandwidth
BANDWIDTH_BYTES = 256 << 20


@dataclass
class KernelTime:
    name: str
    step: int
    ops: list
    nodes: list
    lowering: str | None
    flops: int
    bytes: int
    median_s: float
    min_s: float
    max_s: float
    gflops: float
    gbs: float
    roofline_pct: float | None
    notes: list = field(default_factory=list)
    device: str | None = None   # a multi-device artifact's device of the kernel's part; "cuda": a CUDA artifact's
    part: int | None = None     # the index of its part in ``Profile.parts``


@dataclass
class Profile:
    model: str
    runs: int
    nthreads: int
    latency_median_s: float
    latency_min_s: float
    latency_max_s: float
    kernels: list[KernelTime]
    roofline: dict
    fallback: list
    per_run: list[list[float]]  # seconds of each kernel (in ``kernels`` order) per run
    latencies: list[float]
    #: per run, per pool thread (the threads besides the caller's), its seconds in each kernel's
    #: parallel loops (step order)
    pool_runs: list[list[list[float]]] = field(default_factory=list)
    #: a multi-device artifact's parts ({"name", "device"}) and, per run, each part's start (seconds
    #: from the run's)
    parts: list[dict] = field(default_factory=list)
    part_starts: list[list[float]] = field(default_factory=list)

    @property
    def kernel_sum_s(self) -> float:
        """The kernels' median times added up (compare with ``latency_median_s``)."""
        return sum(k.median_s for k in self.kernels)

    def table(self, top: int | None = None) -> str:
        ks = sorted(self.kernels, key=lambda k: -k.median_s)[:top]
        r = self.roofline
        where = f"on {r['gpu']}" if "gpu" in r else f"{self.nthreads} thread(s)"
        lines = [f"{self.model}: {self.runs} runs, {where}; latency median "
                 f"{self.latency_median_s * 1e3:.3f} ms (min {self.latency_min_s * 1e3:.3f}, max "
                 f"{self.latency_max_s * 1e3:.3f}); kernels {self.kernel_sum_s * 1e3:.3f} ms "
                 f"({100 * self.kernel_sum_s / max(self.latency_median_s, 1e-12):.0f}% of it), other "
                 f"{max(self.latency_median_s - self.kernel_sum_s, 0) * 1e3:.3f} ms",
                 (f"GPU: {r['gpu']}; each kernel's time from CUDA events (its launches, each over {r['repeat']} "
                  f"back-to-back launches); the latency is run()'s, inputs and outputs copied; no roofline"
                  if "gpu" in r else
                  f"roofline: {r['gflops']:.0f} GFLOP/s (sgemm 1024^3), {r['gbs']:.1f} GB/s (copy), {r['cpu']}"),
                 f"{'step kernel':<34} {'ops':<26} {'ms':>8} {'min-max':>15} {'%':>5} {'GFLOP/s':>8} {'GB/s':>7} "
                 f"{'roof%':>6}"]
        total = max(self.kernel_sum_s, 1e-12)
        for k in ks:
            roof = f"{k.roofline_pct:.0f}" if k.roofline_pct is not None else "-"
            label = f"{k.device + ' ' if k.device else ''}{k.step} {k.name}"
            lines.append(f"{label[:34]:<34} {'+'.join(k.ops)[:26]:<26} {k.median_s * 1e3:8.3f} "
                         f"{k.min_s * 1e3:7.3f}-{k.max_s * 1e3:<7.3f} {100 * k.median_s / total:5.1f} "
                         f"{k.gflops:8.1f} {k.gbs:7.1f} {roof:>6}")
        if top is not None and len(self.kernels) > top:
            rest = sorted(self.kernels, key=lambda k: -k.median_s)[top:]
            lines.append(f"... {len(rest)} more kernel(s), {sum(k.median_s for k in rest) * 1e3:.3f} ms")
        for f in self.fallback:
            lines.append(f"interpreted: {f['op']} node {f['node']!r} ({f['reason']}): "
                         f"{f.get('median_s', 0.0) * 1e3:.3f} ms (median, in 'other')")
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d["kernel_sum_s"] = self.kernel_sum_s
        del d["per_run"], d["latencies"], d["pool_runs"], d["part_starts"]
        return d

    def chrome_trace(self, compile_seconds: Mapping[str, float] | None = None) -> dict:
        """The runs as a Chrome trace / Perfetto JSON document (``chrome://tracing``, ui.perfetto.dev):
        process 1 "run" with a track for whole runs, one for the kernels on the calling thread (each
        run's kernels one after another at their measured durations) and one per pool thread (each
        kernel's chunks on that thread, from the kernel's start, for the time the thread spent in
        them), and, given ``compile_seconds``, process 2 "compile" with the compile's phases."""
        pools = max((len(r) for r in self.pool_runs), default=0)
        ev: list[dict] = [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"kiln run: {self.model}"}},
            {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "runs"}},
        ]
        if self.parts:  # a track per part, on its device
            ev += [{"ph": "M", "pid": 1, "tid": 1 + i, "name": "thread_name",
                    "args": {"name": f"{p['device']}: {p['name']}"}} for i, p in enumerate(self.parts)]
        else:
            ev += [{"ph": "M", "pid": 1, "tid": 1, "name": "thread_name",
                    "args": {"name": "calling thread: every kernel, in step order"}}]
            ev += [{"ph": "M", "pid": 1, "tid": 2 + t, "name": "thread_name",
                    "args": {"name": f"pool thread {t + 1}: its chunks of parallel loops"}} for t in range(pools)]
        t = 0.0
        for r, (lat, times) in enumerate(zip(self.latencies, self.per_run)):
            ev.append({"ph": "X", "pid": 1, "tid": 0, "name": f"run {r}", "ts": t * 1e6, "dur": lat * 1e6,
                       "args": {"kernels_ms": round(sum(times) * 1e3, 4)}})
            at = t
            pool = self.pool_runs[r] if r < len(self.pool_runs) else []
            starts = self.part_starts[r] if r < len(self.part_starts) else []
            part = None
            for j, (k, s) in enumerate(zip(self.kernels, times)):
                if k.part is not None and k.part != part:  # a part's kernels start where the part did
                    part, at = k.part, t + starts[k.part]
                ev.append({"ph": "X", "pid": 1, "tid": 1 + (k.part or 0), "name": k.name, "ts": at * 1e6,
                           "dur": s * 1e6,
                           "args": {"run": r, "ops": "+".join(k.ops), "nodes": k.nodes[:8], "lowering": k.lowering,
                                    "flops": k.flops, **({"device": k.device} if k.device else {})}})
                for th, busy in enumerate(pool):
                    if busy[j] > 0:
                        ev.append({"ph": "X", "pid": 1, "tid": 2 + th, "name": k.name, "ts": at * 1e6,
                                   "dur": min(busy[j], s) * 1e6, "args": {"run": r, "busy_ms": busy[j] * 1e3}})
                at += s
            t += max(lat, sum(times)) + 1e-6
        if compile_seconds:
            ev.append({"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "kiln compile"}})
            ev.append({"ph": "M", "pid": 2, "tid": 0, "name": "thread_name", "args": {"name": "phases"}})
            at = 0.0
            for name, s in compile_seconds.items():
                if name == "total":
                    continue
                ev.append({"ph": "X", "pid": 2, "tid": 0, "name": name, "ts": at * 1e6, "dur": float(s) * 1e6})
                at += float(s)
        return {"traceEvents": ev, "displayTimeUnit": "ms",
                "otherData": {"model": self.model, "kiln_version": __version__, "runs": self.runs}}


@dataclass
class CompileRecord:
    """What one compile did, filled by ``compile(record=...)`` for the HTML report: the pass records
    (``passes.manager.PassRecord``: time, nodes before and after), the IR text before the pipeline and
    after each pass that changed it (``stages``: (index, pass, text)), the final graph, its program
    (``codegen.program.Program``: the memory plan) and the compile's phase seconds."""

    passes: list = field(default_factory=list)
    stages: list = field(default_factory=list)
    graph: Any = None
    program: Any = None
    seconds: dict = field(default_factory=dict)


def _cache_dir(cache_dir: str | None) -> str:
    if cache_dir is not None:
        return cache_dir
    return cache_home()


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def machine_roofline(nthreads: int, cache_dir: str | None = None, refresh: bool = False) -> dict:
    """{"gflops", "gbs", "cpu", "threads", "kiln_version"}: this machine's measured sgemm peak and copy
    bandwidth, from the cache when measured before (``refresh`` measures again)."""
    cpu = cpu_name()
    key = f"{cpu}|{nthreads}|{__version__}"
    path = os.path.join(_cache_dir(cache_dir), "roofline.json")
    cached: dict = {}
    if os.path.isfile(path) and not refresh:
        try:
            with open(path, encoding="utf-8") as f:
                cached = json.load(f)
            if key in cached:
                return cached[key]
        except (OSError, ValueError):
            cached = {}
    from .codegen.gemm.build import load_gemm

    lib = load_gemm()
    n = 1024
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    pa, pb = lib.pack_a(a), lib.pack_b(b)
    c = np.zeros((n, n), np.float32)
    for _ in range(2):  # the pool's threads started, the buffers touched
        lib.gemm(pa, pb, c, shape=(n, n, n), nthreads=nthreads)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        lib.gemm(pa, pb, c, shape=(n, n, n), nthreads=nthreads)
        best = min(best, time.perf_counter() - t0)
    src = np.ones(BANDWIDTH_BYTES // 4, np.float32)
    dst = np.empty_like(src)
    copy = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copy = min(copy, time.perf_counter() - t0)
    res = {"gflops": 2 * n ** 3 / best / 1e9, "gbs": 2 * BANDWIDTH_BYTES / copy / 1e9, "cpu": cpu,
           "threads": nthreads, "kiln_version": __version__}
    cached[key] = res
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(cached, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only home: measured again next time
        pass
    return res


def _per_second(count: int, seconds: float) -> float:
    """``count`` (FLOPs or bytes) per second, in billions (0 for a time of 0)."""
    return count / seconds / 1e9 if seconds > 0 else 0.0


def _roofline_pct(flops: int, nbytes: int, seconds: float, roof: dict) -> float | None:
    if seconds <= 0:
        return None
    if flops:
        bound = min(roof["gflops"], flops / max(nbytes, 1) * roof["gbs"])
        return 100 * flops / seconds / 1e9 / bound
    if nbytes:
        return 100 * nbytes / seconds / 1e9 / roof["gbs"]
    return None


def _checked_roofline(roof: dict, manifest, order, per_run, nthreads: int, cache_dir) -> dict:
    """``roof``, measured again (and cached) when a kernel ran over 10% faster than its compute peak:
    the cached peak was then measured while something else used the cores."""
    fastest = max((manifest.kernels[i]["flops"] / min(r[j] for r in per_run) / 1e9
                   for j, i in enumerate(order) if min(r[j] for r in per_run) > 0), default=0.0)
    if fastest > 1.1 * roof["gflops"]:
        return machine_roofline(nthreads, cache_dir, refresh=True)
    return roof


def profile(exe, feeds: Mapping[str, Any], runs: int = 20, warmup: int = 3, roofline: dict | None = None,
            cache_dir: str | None = None) -> Profile:
    """Run ``exe`` (compiled with ``profile=True``) ``runs`` times on ``feeds`` and time each kernel and
    each run (see the module docstring); ``roofline`` defaults to ``machine_roofline``."""
    from .runtime.cuda import CudaExecutable
    from .runtime.multidevice import MultiDeviceExecutable
    from .specialize import Specializing

    if isinstance(exe, Specializing):  # the executable of these feeds' sizes
        exe = exe.specialized(exe.sizes_of(feeds))
    if isinstance(exe, CudaExecutable):
        return _profile_cuda(exe, feeds, runs, warmup)
    multi = isinstance(exe, MultiDeviceExecutable)
    # the units timed: an executable, or each part of a multi-device one on its device
    units = [(p.exe.manifest, p.device) for p in exe.parts] if multi else [(exe.manifest, None)]
    gpu = [d for _, d in units if d and d.startswith("cuda")]
    if gpu:
        raise KilnError(f"the part on {gpu[0]} cannot be profiled in a multi-device run (a CUDA artifact alone "
                        f"can: kiln profile MODEL --target cuda)")
    if not all(getattr(m, "profile", False) for m, _ in units):
        raise KilnError("this artifact was not built for profiling: compile it with profile=True "
                        "(kiln compile --profile), or give kiln profile the model itself")
    if runs < 1:
        raise KilnError(f"runs must be at least 1, got {runs}")
    nthreads = max(p.exe.nthreads for p in exe.parts) if multi else exe.nthreads
    roof = roofline or machine_roofline(nthreads, cache_dir)
    device_roof = {d["name"]: dict(roof, gflops=d["gflops"], gbs=d["gbs"]) for d in exe.devices} if multi else {}
    orders = [sorted(range(len(m.kernels)), key=lambda i, m=m: m.kernels[i]["step"]) for m, _ in units]
    per_run: list[list[float]] = []
    pool_runs: list[list[list[float]]] = []
    part_starts: list[list[float]] = []
    interpreted: list[dict[str, float]] = []
    latencies: list[float] = []
    for _ in range(warmup):
        exe.run(feeds)
    for _ in range(runs):
        if multi:
            t0 = time.perf_counter()
            _, timed = exe.run_timed(feeds)
            latencies.append(time.perf_counter() - t0)
            part_starts.append([start for _, start, _ in timed])
            each = [t for _, _, t in timed]
        else:
            _, t = exe.run_timed(feeds)
            latencies.append(t.seconds)
            pool_runs.append([[busy[i] for i in orders[0]] for busy in t.pool])
            each = [t]
        per_run.append([t.steps[i] for t, order in zip(each, orders) for i in order])
        merged: dict[str, float] = {}
        for t in each:
            for name, s in t.interpreted.items():
                merged[name] = merged.get(name, 0.0) + s
        interpreted.append(merged)
    if roofline is None and not multi:
        roof = _checked_roofline(roof, units[0][0], orders[0], per_run, nthreads, cache_dir)
    kernels = []
    j = 0
    for u, ((m, device), order) in enumerate(zip(units, orders)):
        for i in order:
            k = m.kernels[i]
            times = [r[j] for r in per_run]
            j += 1
            med = statistics.median(times)
            kernels.append(KernelTime(k["name"], k["step"], list(k["ops"]), list(k["nodes"]), k.get("lowering"),
                                      int(k["flops"]), int(k["bytes"]), med, min(times), max(times),
                                      _per_second(k["flops"], med), _per_second(k["bytes"], med),
                                      _roofline_pct(int(k["flops"]), int(k["bytes"]), med,
                                                    device_roof.get(device, roof)),
                                      list(k.get("notes", [])), device, u if multi else None))
    fallback = [dict(f, median_s=statistics.median(r.get(f["node"], 0.0) for r in interpreted))
                for f in exe.fallback]
    model = exe.index.get("model", "model") if multi else exe.manifest.model
    parts = [{"name": p.name, "device": p.device} for p in exe.parts] if multi else []
    return Profile(model, runs, nthreads, statistics.median(latencies), min(latencies), max(latencies), kernels,
                   roof, fallback, per_run, latencies, pool_runs, parts, part_starts)


#: back-to-back launches each CUDA-event timing covers (``CudaExecutable.launch_samples``)
CUDA_REPEAT = 10


def _profile_cuda(exe, feeds: Mapping[str, Any], runs: int, warmup: int) -> Profile:
    """A CUDA artifact's profile: each step's GPU time from CUDA events (its launches, each timed over
    ``CUDA_REPEAT`` back-to-back launches, added up), per run; the latency is ``run``'s, inputs and
    outputs copied included. No roofline (the GPU's peak is not measured): GFLOP/s and GB/s only."""
    from .runtime.cuda import gpu_name

    if runs < 1:
        raise KilnError(f"runs must be at least 1, got {runs}")
    for _ in range(warmup):
        exe.run(feeds)
    latencies = []
    for _ in range(runs):
        t0 = time.perf_counter()
        exe.run(feeds)
        latencies.append(time.perf_counter() - t0)
    steps: dict[int, dict] = {}  # step -> its ops, its launches' kernels and their seconds per run, added
    for entry, times in exe.launch_samples(feeds, runs, CUDA_REPEAT):
        st = steps.setdefault(entry["step"], {"ops": entry["ops"], "kernels": [], "per_run": [0.0] * runs})
        st["kernels"].append(entry["kernel"])
        st["per_run"] = [a + b for a, b in zip(st["per_run"], times)]
    meta = {}  # step -> the manifest's record of its first launch (FLOPs, bytes, nodes, notes)
    for k in exe.manifest["kernels"]:
        m = meta.setdefault(k["step"], dict(k, notes=[]))
        m["notes"] = m["notes"] + list(k.get("notes", []))
    kernels, per_step = [], []
    for step in sorted(steps):
        st, m = steps[step], meta.get(step, {})
        times = st["per_run"]
        med = statistics.median(times)
        flops, nbytes = int(m.get("flops", 0)), int(m.get("bytes", 0))
        kernels.append(KernelTime("+".join(st["kernels"]), step, list(st["ops"]), list(m.get("nodes", [])),
                                  None, flops, nbytes, med, min(times), max(times), _per_second(flops, med),
                                  _per_second(nbytes, med), None, list(m.get("notes", [])), "cuda"))
        per_step.append(times)
    per_run = [list(r) for r in zip(*per_step)] if per_step else [[] for _ in range(runs)]
    fallback = [dict(f, median_s=0.0) for f in exe.fallback]
    roofline = {"gpu": gpu_name(), "repeat": CUDA_REPEAT}
    return Profile(exe.manifest.get("model", "model"), runs, 1, statistics.median(latencies), min(latencies),
                   max(latencies), kernels, roofline, fallback, per_run, latencies)


__all__ = ["CompileRecord", "KernelTime", "Profile", "cpu_name", "machine_roofline", "profile"]
