"""``kiln bench``: Kiln against ONNX Runtime, OpenVINO and PyTorch on one model, in one process, as ratios.

    kiln bench zoo:bert
    kiln bench light:resnet50 --compare onnxruntime,openvino --threads 2 --runs 20
    kiln bench 'zoo:mlp?batch=64' --json

``bench_model(spec, ...)`` is the library form (``benchmarks/models.py`` runs a suite through it). It

1. compiles the model with Kiln (compile time, artifact size, kernels and fallback nodes from the
   manifest);
2. builds the peers with the same thread count: an ONNX Runtime session (ORT_ENABLE_ALL,
   ``intra_op_num_threads`` = threads, ``inter_op_num_threads`` = 1), an OpenVINO CPU model (the
   same ONNX bytes; ``PERFORMANCE_HINT`` LATENCY, one stream, ``INFERENCE_NUM_THREADS`` = threads,
   ``INFERENCE_PRECISION_HINT`` f32: no bf16 on CPUs that have it) and, for ``zoo:`` models, the
   PyTorch module in eager mode (``torch.set_num_threads``, ``torch.inference_mode``); OpenBLAS, which
   NumPy and Kiln's interpreter fallback use, gets the same thread count too;
3. checks that every peer agrees with Kiln on every output (max abs error relative to the peer's
   largest magnitude must be within ``rtol``, or the abs error within ``atol``): a ``BenchError``
   when no peer agrees, so a wrong fast number is never reported; a peer that disagrees while
   another agrees with Kiln is left out with a note (an ill-conditioned output, such as a softmax
   of equal huge logits from the ``light:`` models' placeholder weights, can differ by rounding);
4. measures interleaved rounds: each round runs every engine in turn, in an order that rotates
   from round to round, so drift on a shared machine hits every engine alike; an engine's turn is
   untimed calls for ``SETTLE_SECONDS`` (so threads the previous engine left spinning do not slow
   it) and then ``BLOCK`` timed calls;
5. measures the machine's sgemm peak in the same process, right after the rounds (Kiln's GEMM and NumPy's OpenBLAS,
   ``size``³ float32, best of a few runs, same threads); ``peak_gflops`` is the faster of the two.

Ratios are ``kiln_ms / peer_ms``: below 1 Kiln is faster. Only ratios from the same run mean much;
absolute times drift between runs and machines.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import KilnError
from ..profiling import cpu_name

ENGINES = ("kiln", "onnxruntime", "openvino", "torch")
PEERS = ("onnxruntime", "openvino", "torch")
ALIASES = {"onnxruntime": "onnxruntime", "ort": "onnxruntime", "openvino": "openvino", "ov": "openvino",
           "torch": "torch", "pytorch": "torch"}
DEFAULT_COMPARE = ("onnxruntime", "openvino", "torch")
DEFAULT_WARMUP = 3
BUDGET_SECONDS = 10.0  # automatic --runs: about this long of timed rounds
MIN_RUNS, MAX_RUNS = 5, 200
SGEMM_SIZE = 2048


class BenchError(KilnError):
    """A benchmark that cannot run or whose engines disagree."""


# -- engines ---------------------------------------------------------------------------------------

def parse_engines(compare: str | Sequence[str] | None) -> list[str]:
    """``"onnxruntime,torch"`` (or a list; aliases ort, pytorch; "" or "none" for Kiln alone) -> peer names."""
    if compare is None:
        return list(DEFAULT_COMPARE)
    items = compare.split(",") if isinstance(compare, str) else list(compare)
    out: list[str] = []
    for item in items:
        item = item.strip().lower()
        if not item or item == "none":
            continue
        if item == "kiln":
            continue  # always measured
        if item not in ALIASES:
            raise BenchError(f"unknown engine {item!r} in --compare; engines: {', '.join(PEERS)} "
                             f"(aliases: ort, ov, pytorch; 'none' for Kiln alone)")
        if ALIASES[item] not in out:
            out.append(ALIASES[item])
    return out


class Engine:
    """One way of running the model: ``call()`` runs it once; ``outputs()`` runs it and names the results."""

    def __init__(self, name: str, call: Callable[[], Any], outputs: Callable[[], dict[str, np.ndarray]]):
        self.name, self.call, self.outputs = name, call, outputs
        self.times: list[float] = []


def _kiln_engine(exe, feeds: dict) -> Engine:
    mine = {n: feeds[n] for n in exe.input_names}
    return Engine("kiln", lambda: exe.run(mine), lambda: exe.run(mine))


def _ort_engine(model_bytes_or_path, feeds: dict, nthreads: int, notes: list[str]) -> Engine | None:
    try:
        import onnxruntime as ort
    except ImportError:
        notes.append("onnxruntime: not installed (pip install onnxruntime); skipped")
        return None
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = nthreads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model_bytes_or_path, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        notes.append(f"onnxruntime: cannot load the model ({str(e).splitlines()[0][:200]}); skipped")
        return None
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in feeds]
    if missing:
        notes.append(f"onnxruntime: the model wants inputs {missing} Kiln does not take; skipped")
        return None
    mine = {n: feeds[n] for n in names}
    out_names = [o.name for o in sess.get_outputs()]
    return Engine("onnxruntime", lambda: sess.run(None, mine),
                  lambda: dict(zip(out_names, sess.run(None, mine))))


def _openvino_engine(model_bytes_or_path, feeds: dict, nthreads: int, notes: list[str]) -> Engine | None:
    """OpenVINO's CPU plugin on the same ONNX model, reshaped to the feeds' shapes (static, as Kiln
    compiles it): latency hint, one stream, ``nthreads`` threads, f32 inference precision (its default
    on CPUs with bf16 would be bf16: not the same arithmetic)."""
    try:
        import openvino as ov
    except ImportError:
        notes.append("openvino: not installed (pip install openvino); skipped")
        return None
    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": nthreads,
              "INFERENCE_PRECISION_HINT": "f32"}
    try:
        if isinstance(model_bytes_or_path, (bytes, bytearray)):
            model = core.read_model(model=bytes(model_bytes_or_path), weights=b"")
        else:
            model = core.read_model(model_bytes_or_path)
        names = [i.get_any_name() for i in model.inputs]
        missing = [n for n in names if n not in feeds]
        if missing:
            notes.append(f"openvino: the model wants inputs {missing} Kiln does not take; skipped")
            return None
        model.reshape({n: list(feeds[n].shape) for n in names})
        compiled = core.compile_model(model, "CPU", config)
    except Exception as e:  # noqa: BLE001 - OpenVINO raises its own exception types
        notes.append(f"openvino: cannot load the model ({str(e).strip().splitlines()[0][:200]}); skipped")
        return None
    request = compiled.create_infer_request()
    mine = {n: feeds[n] for n in names}
    outputs = list(compiled.outputs)

    def results() -> dict[str, np.ndarray]:
        r = request.infer(mine)
        return {o.get_any_name(): np.array(r[o]) for o in outputs}

    return Engine("openvino", lambda: request.infer(mine), results)


def _torch_engine(module, feeds: dict, output_names: Sequence[str]) -> Engine:
    import torch

    args = [torch.from_numpy(np.ascontiguousarray(v)) for v in feeds.values()]

    def call():
        with torch.inference_mode():
            return module(*args)

    def outputs():
        r = call()
        rs = list(r) if isinstance(r, (tuple, list)) else [r]
        return {n: t.detach().numpy() for n, t in zip(output_names, rs)}

    return Engine("torch", call, outputs)


# -- the machine ---------------------------------------------------------------------------------

def isa_family() -> str:
    """This machine's vector ISA as benchmark reports name it: "AVX-512 (VNNI, BF16)", "AVX2+FMA", ..."""
    from ..codegen.llvm.target import host_target

    return host_target().family

class _OpenBLASThreads:
    """Set NumPy's OpenBLAS thread count for a while (Kiln's interpreter fallback and np.matmul use it)."""

    def __init__(self, n: int):
        self.n, self.old, self.lib = n, None, None

    def __enter__(self):
        try:
            from ..codegen.gemm import find_openblas

            self.lib = find_openblas()
        except Exception:  # noqa: BLE001 - informative only
            self.lib = None
        if self.lib is not None and self.lib.set_num_threads is not None:
            self.old = self.lib.num_threads()
            self.lib.set_num_threads(self.n)
        return self

    @property
    def controlled(self) -> bool:
        return self.old is not None

    def __exit__(self, *exc):
        if self.old is not None:
            self.lib.set_num_threads(self.old)


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm: packing buffers, thread pools, page faults
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sgemm_peak(nthreads: int, size: int = SGEMM_SIZE, repeats: int = 3) -> dict:
    """GFLOP/s of a ``size``³ float32 GEMM: Kiln's sgemm and NumPy's OpenBLAS, best of ``repeats``,
    ``nthreads`` threads; ``peak_gflops`` is the faster. ``bench_model`` measures it right after timing
    the model, so both see the same machine (on a busy machine a single measurement can be low)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    c = np.zeros((size, size), np.float32)
    flops = 2.0 * size ** 3
    out: dict[str, Any] = {"size": size, "threads": nthreads}
    try:
        from ..codegen.gemm import load_gemm

        lib = load_gemm()
        out["kiln_gflops"] = flops / _best_seconds(lambda: lib.gemm(a, b, c, nthreads=nthreads), repeats) / 1e9
    except Exception as e:  # noqa: BLE001 - e.g. no C compiler to link the GEMM
        out["kiln_gflops"] = None
        out["kiln_error"] = str(e)[:200]
    with _OpenBLASThreads(nthreads) as ob:
        out["openblas_gflops"] = flops / _best_seconds(lambda: np.matmul(a, b, out=c), repeats) / 1e9
        out["openblas_threads_set"] = ob.controlled
    known = [v for v in (out["kiln_gflops"], out["openblas_gflops"]) if v]
    out["peak_gflops"] = max(known) if known else None
    return out


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


# -- the model -------------------------------------------------------------------------------------

def random_feeds(inputs: Sequence[tuple], seed: int = 0, highs: Mapping[str, int] | None = None
                 ) -> dict[str, np.ndarray]:
    """Seeded inputs for ``exe.inputs`` ((name, DType, shape) triples): normal floats, ints in [0, 10)
    or, for the names in ``highs`` (``feeds.index_limits``: inputs used as indices), in [0, high)."""
    from .feeds import DEFAULT_HIGH, random_array
    from ..ir.types import TensorType

    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dtype, shape in inputs:
        if dtype is None:
            raise BenchError(f"cannot make benchmark data for input {name!r} of type {shape}")
        try:
            feeds[name] = random_array(rng, name, TensorType(dtype, tuple(shape)), None,
                                       (highs or {}).get(name, DEFAULT_HIGH))
        except KilnError as e:
            raise BenchError(str(e)) from None
    return feeds


def _artifact_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def model_flops(exe) -> tuple[int, int]:
    """(FLOPs of one inference: native kernels + nodes run in the interpreter, native kernels only)."""
    native = sum(int(k.get("flops", 0)) for k in exe.manifest.kernels)
    fallback = exe.manifest.fallback
    if not fallback:
        return native, native
    graph = getattr(exe, "_graph", None)
    if graph is None:
        from ..ir.parser import load_text
        from ..runtime.artifact import IR_TEXT

        graph = load_text(os.path.join(exe.path, IR_TEXT))
    extra = 0
    for f in fallback:
        n = graph.nodes[f["index"]]
        try:
            c = n.op.cost([v.type if v is not None else None for v in n.inputs], [o.type for o in n.outputs])
            extra += int(c.flops)
        except Exception:  # noqa: BLE001 - cost is informative only
            pass
    return native + extra, native


def compare_outputs(kiln: Mapping[str, np.ndarray], peer: Mapping[str, np.ndarray], peer_name: str,
                    rtol: float, atol: float) -> dict:
    """Max abs error and max abs error relative to the peer's largest magnitude, over all outputs;
    ``BenchError`` when an output is missing, of another shape, or beyond tolerance."""
    worst_abs = worst_rel = 0.0
    per_output = {}
    for name, ref in peer.items():
        if name not in kiln:
            raise BenchError(f"{peer_name} has output {name!r}, Kiln has {sorted(kiln)}")
        got, ref = np.asarray(kiln[name]), np.asarray(ref)
        if got.shape != ref.shape:
            raise BenchError(f"output {name!r}: Kiln gives shape {list(got.shape)}, {peer_name} {list(ref.shape)}")
        if got.dtype.kind not in "fc":
            if not np.array_equal(got, ref):
                raise BenchError(f"output {name!r} ({got.dtype}): Kiln and {peer_name} differ in "
                                 f"{int(np.sum(got != ref))} of {got.size} elements")
            per_output[name] = {"max_abs": 0.0, "max_rel": 0.0}
            continue
        g64, r64 = got.astype(np.float64), ref.astype(np.float64)
        if not np.array_equal(np.isfinite(g64), np.isfinite(r64)):
            raise BenchError(f"output {name!r}: Kiln and {peer_name} differ in which elements are inf/NaN")
        fin = np.isfinite(r64)
        err = float(np.max(np.abs(g64[fin] - r64[fin]), initial=0.0))
        scale = float(np.max(np.abs(r64[fin]), initial=0.0))
        rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
        per_output[name] = {"max_abs": err, "max_rel": rel}
        if rel > rtol and err > atol:
            raise BenchError(f"Kiln and {peer_name} disagree on output {name!r}: max abs error {err:.3g}, "
                             f"{rel:.3g} of the output's scale {scale:.3g} (tolerance rtol={rtol:g}, atol={atol:g})")
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
    return {"ok": True, "max_abs": worst_abs, "max_rel": worst_rel, "outputs": per_output}


def _stats(times: list[float]) -> dict:
    ms = [t * 1e3 for t in times]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
            "mean_ms": statistics.fmean(ms), "runs": len(ms)}


#: an engine's turn in a round: untimed calls for SETTLE_SECONDS (at least one), then BLOCK timed
#: calls. ONNX Runtime's threads keep spinning for tens of ms after a call (measured: 20-60 ms of
#: CPU), as OpenBLAS's and, briefly, Kiln's do, which on 2 cores slows whichever engine runs next
#: (Kiln's SqueezeNet: 14 ms right after ORT, 8.8 ms with ORT's spinning turned off)
SETTLE_SECONDS = 0.1
BLOCK = 3


def measure(engines: Sequence[Engine], runs: int | None, warmup: int, budget: float = BUDGET_SECONDS) -> int:
    """Interleaved rounds (each engine once per round, order rotating); fills ``engine.times``.
    ``runs=None`` picks the number of timed rounds from the warm-up rounds to fill about ``budget``
    seconds (between 5 and 200). Returns the number of timed rounds."""
    n = len(engines)
    gc_was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        round_times = []
        for r in range(max(warmup, 1 if runs is None else 0)):
            t0 = time.perf_counter()
            for e in engines[r % n:] + engines[:r % n]:
                e.call()
            round_times.append(time.perf_counter() - t0)
        if runs is None:
            per_round = min(round_times[1:] or round_times)
            runs = int(max(MIN_RUNS, min(MAX_RUNS, budget / max(per_round, 1e-6))))
        for r in range(runs):
            k = r % n
            for e in list(engines[k:]) + list(engines[:k]):
                start = time.perf_counter()
                e.call()  # untimed while the previous engine's threads may still be spinning
                while time.perf_counter() - start < SETTLE_SECONDS:
                    e.call()
                for _ in range(BLOCK):
                    t0 = time.perf_counter()
                    e.call()
                    e.times.append(time.perf_counter() - t0)
    finally:
        if gc_was:
            gc.enable()
    return runs


def bench_model(spec: Any, compare: str | Sequence[str] | None = DEFAULT_COMPARE, nthreads: int | None = None,
                runs: int | None = None, warmup: int = DEFAULT_WARMUP, opt_level: int = 2,
                input_shapes: Mapping[str, Sequence[int]] | None = None, *, rtol: float = 1e-3,
                atol: float = 1e-5, seed: int = 0, sgemm_size: int = SGEMM_SIZE, budget: float = BUDGET_SECONDS,
                log: Callable[[str], None] | None = None) -> dict:
    """Benchmark one model (see the module docstring); returns a JSON-able dict.

    ``spec``: ``light:NAME``, ``zoo:NAME?KEY=VALUE,...``, or an ONNX path. ``compare``: the peers
    (``"onnxruntime,torch"``; a missing package is skipped with a note, torch only applies to
    ``zoo:`` models). ``nthreads``: threads for every engine (default: the CPUs this process may
    use). ``runs=None``: as many timed rounds as fit in about ``budget`` seconds. ``sgemm_size=0``
    skips the sgemm peak. Raises ``BenchError`` (or ``ModelError``) for unknown engines/models and
    when an engine disagrees with Kiln.
    """
    import compiler
    from ..runtime.executable import default_threads

    say = log or (lambda _m: None)
    peers = parse_engines(compare)
    nthreads = int(nthreads) if nthreads else default_threads()
    if nthreads < 1:
        raise BenchError(f"threads must be at least 1, got {nthreads}")
    if runs is not None and runs < 1:
        raise BenchError(f"runs must be at least 1, got {runs}")
    if warmup < 0:
        raise BenchError(f"warmup must be at least 0, got {warmup}")
    notes: list[str] = []
    name = spec if isinstance(spec, str) else type(spec).__name__
    module = None
    feeds: dict[str, np.ndarray] | None = None
    export_seconds = None
    # the model, in the form each engine wants
    if isinstance(spec, str) and spec.startswith("zoo:"):
        from . import zoo

        if input_shapes:
            raise BenchError("zoo: models take their sizes in the spec (zoo:mlp?batch=64), not --input-shape")
        name = zoo.canonical(spec)
        say(f"{name}: building with PyTorch")
        t0 = time.perf_counter()
        proto, feeds, module = zoo.load(spec)
        export_seconds = time.perf_counter() - t0
        kiln_model, ort_model = proto, proto.SerializeToString()
    elif isinstance(spec, str):
        from ..models import resolve

        path = resolve(spec)
        kiln_model, ort_model = spec, (path if path.endswith(".onnx") else None)
    else:  # a ModelProto or Graph
        kiln_model = spec
        ort_model = spec.SerializeToString() if hasattr(spec, "SerializeToString") else None

    with _OpenBLASThreads(nthreads) as blas:
        if not blas.controlled:
            notes.append("could not set OpenBLAS's thread count (interpreter fallback and np.matmul use its default)")
        # 1. Kiln
        say(f"{name}: compiling with Kiln (-O{opt_level}, {nthreads} threads)")
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exe = compiler.compile(kiln_model, opt_level=opt_level, input_shapes=input_shapes, nthreads=nthreads,
                                   timings=timings, progress=log is not None and sys.stderr.isatty(),
                                   kernel_cache=False)  # (a cold compile: its time is reported)
        compile_seconds = time.perf_counter() - t0
        for w in caught:
            if w.category.__name__ == "FallbackWarning":
                continue  # reported from the manifest below
            notes.append(f"compile: {w.category.__name__}: {w.message}")
        fallback = exe.manifest.fallback
        if fallback:
            ops = sorted({f["op"] for f in fallback})
            notes.append(f"kiln: {len(fallback)} node(s) run in the reference interpreter (no native code yet): "
                         f"{', '.join(ops)}; Kiln's time includes them")
        flops, native_flops = model_flops(exe)
        if feeds is None:
            feeds = random_feeds(exe.inputs, seed)
        engines = [_kiln_engine(exe, feeds)]
        # 2. peers
        ort_seconds = ov_seconds = old_threads = None
        for peer in peers:
            if peer in ("onnxruntime", "openvino"):
                if ort_model is None:
                    notes.append(f"{peer}: runs ONNX models only; skipped")
                    continue
                say(f"{name}: building the {'ONNX Runtime session' if peer == 'onnxruntime' else 'OpenVINO model'}")
                t0 = time.perf_counter()
                make = _ort_engine if peer == "onnxruntime" else _openvino_engine
                e = make(ort_model, feeds, nthreads, notes)
                if peer == "onnxruntime":
                    ort_seconds = time.perf_counter() - t0
                else:
                    ov_seconds = time.perf_counter() - t0
                if e is not None:
                    engines.append(e)
            elif peer == "torch":
                if module is None:
                    notes.append("torch: only zoo: models have a PyTorch module; skipped")
                    continue
                import torch

                old_threads = torch.get_num_threads()
                torch.set_num_threads(nthreads)
                engines.append(_torch_engine(module, feeds, exe.output_names))
        try:
            # 3. numerics
            say(f"{name}: checking outputs")
            kiln_out = engines[0].outputs()
            check, disagree = {}, {}
            for e in engines[1:]:
                try:
                    check[e.name] = compare_outputs(kiln_out, e.outputs(), e.name, rtol, atol)
                except BenchError as err:
                    disagree[e.name] = err
            if disagree and not check:  # no peer agrees with Kiln: Kiln may be wrong
                raise next(iter(disagree.values()))
            for peer, err in disagree.items():  # another peer agrees with Kiln: this one is left out
                notes.append(f"{peer} disagrees with Kiln and with {', '.join(check)}, which agree: not timed ({err})")
            engines = [e for e in engines if e.name not in disagree]
            flat = [n for n, a in kiln_out.items()
                    if a.size > 1 and a.dtype.kind == "f" and np.all(a == a.reshape(-1)[0])]
            if flat and len(engines) > 1:
                why = " (the light: models ship placeholder weights)" if name.startswith("light:") else ""
                notes.append(f"output(s) {', '.join(flat)} hold one value in every element{why}: the numerics "
                             f"check catches little here")
            # 4. timing
            say(f"{name}: timing {', '.join(e.name for e in engines)} (interleaved rounds)")
            load_before = _loadavg()
            runs_done = measure(engines, runs, warmup, budget)
            if getattr(exe, "adaptive_threads", False) and exe.nthreads > 1:
                notes.append(f"kiln: each call runs on {exe.nthreads} threads or 1, whichever its recent calls "
                             f"found faster (docs/runtime.md); at the end: {exe.threads_in_use}")
            load = max(load_before, _loadavg())
            ncpu = os.cpu_count() or 1
            if load > ncpu + 0.5:
                notes.append(f"the machine was busy (1-minute load {load:.1f} on {ncpu} CPUs, this benchmark "
                             f"included): times are inflated and multi-thread runs suffer most; compare ratios only")
            # 5. the machine
            peak = None
            if sgemm_size:
                say(f"sgemm peak ({sgemm_size}^3, {nthreads} threads)")
                peak = sgemm_peak(nthreads, sgemm_size)
        finally:
            if old_threads is not None:
                torch.set_num_threads(old_threads)

    results: dict[str, dict] = {}
    for e in engines:
        st = _stats(e.times)
        st["gflops"] = flops / (st["median_ms"] * 1e-3) / 1e9 if flops else None
        results[e.name] = st
    kiln = results["kiln"]
    ratios = {e.name: kiln["median_ms"] / results[e.name]["median_ms"] for e in engines[1:]}
    peak_gflops = peak["peak_gflops"] if peak else None
    if peak_gflops and kiln["gflops"] and kiln["gflops"] > peak_gflops:
        notes.append(f"Kiln's {kiln['gflops']:.1f} GFLOP/s is above the sgemm peak measured after it "
                     f"({peak_gflops:.1f}): the machine's speed changed between the two (busy machine)")
    return {
        "model": name,
        "threads": nthreads,
        "opt_level": opt_level,
        "runs": runs_done,
        "warmup": warmup,
        "inputs": {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()},
        "machine": {"cpu": cpu_name(), "target": exe.manifest.target.cpu, "isa": isa_family(),
                    "cpus": os.cpu_count(),
                    "load": round(load, 2), "sgemm": peak},
        "kiln": {
            "compile_seconds": compile_seconds,
            "compile_phases": {k: round(v, 4) for k, v in timings.items()},
            "export_seconds": export_seconds,
            "artifact_bytes": _artifact_bytes(exe.path),
            "weights_bytes": int(exe.manifest.memory.get("weights_bytes", 0)),
            "arena_bytes": int(exe.manifest.memory.get("arena_bytes", 0)),
            "kernels": len(exe.manifest.kernels),
            "fallback_nodes": len(fallback),
            "fallback_ops": sorted({f["op"] for f in fallback}),
            "flops": flops,
            "native_flops": native_flops,
        },
        "onnxruntime_session_seconds": ort_seconds,
        "openvino_compile_seconds": ov_seconds,
        "engines": results,
        "ratios": ratios,
        "gflops": kiln["gflops"],
        "peak_fraction": (kiln["gflops"] / peak_gflops) if (peak_gflops and kiln["gflops"]) else None,
        "check": check,
        "notes": notes,
    }


# -- output ----------------------------------------------------------------------------------------

def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_result(r: dict) -> str:
    """The human report of one ``bench_model`` result: a header and a small aligned table."""
    k = r["kiln"]
    lines = [f"{r['model']}  ({r['threads']} thread{'s' if r['threads'] != 1 else ''}, -O{r['opt_level']}, "
             f"{r['runs']} interleaved rounds after {r['warmup']} warm-up; inputs "
             + ", ".join(f"{n} {t}" for n, t in r["inputs"].items()) + ")"]
    lines.append(f"kiln: compile {k['compile_seconds']:.2f} s, artifact {human_bytes(k['artifact_bytes'])}, "
                 f"{k['kernels']} kernels, {k['fallback_nodes']} fallback nodes"
                 + (f" ({', '.join(k['fallback_ops'])})" if k["fallback_ops"] else "")
                 + f", {k['flops'] / 1e9:.3g} GFLOP per run")
    lines.append(f"machine: {r['machine']['cpu']}, {r['machine']['isa']}, {r['machine']['cpus']} CPUs")
    peak = r["machine"].get("sgemm")
    if peak:
        kg = f"{peak['kiln_gflops']:.1f}" if peak.get("kiln_gflops") else "n/a"
        lines.append(f"sgemm {peak['size']}^3 ({peak['threads']} threads): Kiln {kg} GFLOP/s, "
                     f"OpenBLAS {peak['openblas_gflops']:.1f} GFLOP/s; peak = {peak['peak_gflops']:.1f}")
    header = ["engine", "median ms", "min-max ms", "GFLOP/s", "% peak", "kiln/engine", "max rel err"]
    rows = []
    peak_g = peak["peak_gflops"] if peak else None
    for name, st in r["engines"].items():
        g = st.get("gflops")
        rows.append([
            name, _ms(st["median_ms"]), f"{_ms(st['min_ms'])}-{_ms(st['max_ms'])}",
            f"{g:.1f}" if g else "-", f"{100 * g / peak_g:.1f}%" if (g and peak_g) else "-",
            "-" if name == "kiln" else f"{r['ratios'][name]:.2f}x",
            "-" if name == "kiln" else f"{r['check'][name]['max_rel']:.1e}",
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda row: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths)))
    lines += ["", fmt(header)] + [fmt(row) for row in rows]
    if r["ratios"]:
        lines.append("")
        lines.append("kiln/engine = Kiln's median / the engine's median (below 1: Kiln is faster); same-run ratios only")
    for n in r["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


# -- the command -----------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``kiln bench`` arguments (``run(args)`` runs them)."""
    from .cli import parse_shape

    p.add_argument("model", metavar="MODEL",
                   help="light:NAME, zoo:NAME[?KEY=VALUE,...] (zoo:bert, 'zoo:mlp?batch=64'), or model.onnx")
    p.add_argument("--compare", default=",".join(DEFAULT_COMPARE), metavar="ENGINES",
                   help="peers to measure against, comma-separated: onnxruntime (ort), openvino (ov), torch "
                        "(zoo: models only); a peer not installed is skipped with a note; 'none' for Kiln alone "
                        "(default: onnxruntime,openvino,torch)")
    p.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                   help="threads for every engine (default: the CPUs this process may use)")
    p.add_argument("--runs", type=_positive_int, default=None, metavar="N",
                   help=f"timed rounds (default: as many as fit in about {BUDGET_SECONDS:.0f} s, {MIN_RUNS} to {MAX_RUNS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N",
                   help=f"untimed rounds first (default {DEFAULT_WARMUP})")
    p.add_argument("-O", dest="opt_level", type=int, default=2, choices=[0, 1, 2, 3],
                   help="Kiln's optimization level (default 2)")
    p.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=1x3x224x224",
                   help="give a symbolic input dimension a size (ONNX files and light: models)")
    p.add_argument("--rtol", type=float, default=1e-3,
                   help="largest error allowed relative to each output's scale (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--sgemm-size", type=int, default=SGEMM_SIZE, metavar="N",
                   help=f"measure the sgemm peak on NxNxN (default {SGEMM_SIZE}; 0 skips it)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    """``kiln bench``: prints the table (or JSON with --json); progress goes to stderr when it is a
    terminal."""
    shapes = dict(args.input_shape) or None
    if shapes:
        bad = [n for n, dims in shapes.items() if any(not isinstance(d, int) for d in dims)]
        if bad:
            raise BenchError(f"--input-shape for a benchmark needs every dimension as a number: {bad}")
    quiet = args.json or not sys.stderr.isatty()  # progress on a terminal only
    log = None if quiet else (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    result = bench_model(args.model, compare=args.compare, nthreads=args.threads, runs=args.runs,
                         warmup=args.warmup, opt_level=args.opt_level, input_shapes=shapes, rtol=args.rtol,
                         seed=args.seed, sgemm_size=args.sgemm_size, log=log)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_result(result))
    return 0


__all__ = ["BenchError", "ENGINES", "add_arguments", "bench_model", "compare_outputs", "format_result",
           "isa_family", "measure", "parse_engines", "run", "sgemm_peak"]
