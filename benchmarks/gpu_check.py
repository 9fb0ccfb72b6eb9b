"""The GPU check: Kiln's CUDA backend on a real NVIDIA GPU (or, with ``--sim``, in numba's simulator).

    python benchmarks/gpu_check.py [--out DIR] [--only resnet,bert] [--runs N]
    python benchmarks/gpu_check.py --sim          # a reduced run in the CUDA simulator (make test runs it)

It needs only this repository plus numba (numba-cuda), llvmlite, numpy, onnx and torch, and runs in
under 8 minutes on a GPU machine:

1. the CUDA kernel tests (``tests/cuda``) on the real device (``NUMBA_ENABLE_CUDASIM=0``);
2. Kiln's GEMM at 4096^3 fp32 (TFLOP/s from CUDA events) against ``torch.matmul`` fp32 (TF32 off);
3. the suite models (ResNet-50, BERT-style, MobileNetV2, MLP at batch 1 and 64) compiled for ``cuda``,
   each checked against the CPU artifact, and their latency against PyTorch eager fp32 on the same
   GPU: Kiln with host arrays in and out (copies included; replayed as one CUDA graph where the
   plan allows) and with device arrays (a torch CUDA tensor in, device arrays out: launched from
   Python, a device allocation per output), PyTorch with the input on the GPU.

4. with ``--light NAMES|all`` and ``--archs NAMES|all``: the ONNX model-zoo networks the ``onnx`` package
   ships (``light:NAME``) and the real-architecture suite (``compiler/tools/archs``, batch 1), each
   compiled for ``cuda`` and checked against the CPU artifact on random inputs (host path latency
   and the nodes left on the host reported); ``--only none`` skips the suite models, ``--skip-gemm``
   the GEMM.

Prints a table and writes ``gpu_check.json`` (to ``--out``, default the current directory).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (name, full-size spec, simulator spec)
MODELS = [
    ("mlp_b1", "zoo:mlp", "zoo:mlp?sizes=32x16x8"),
    ("mlp_b64", "zoo:mlp?batch=64", "zoo:mlp?batch=4,sizes=32x16x8"),
    ("bert", "zoo:bert?seq=128", "zoo:bert?seq=4,vocab=20,hidden=8,heads=2,layers=1"),
    ("resnet50", "zoo:resnet", "zoo:resnet?layers=1x1x1x1,resolution=16,width=4,classes=10"),
    ("mobilenetv2", "zoo:mobilenetv2", "zoo:mobilenetv2?resolution=8,width=0.25,classes=10"),
]


def log(*a):
    print(*a, flush=True)


def kernel_tests(sim: bool) -> dict:
    """The CUDA kernel tests on the device (skipped with --sim: make test runs them in the simulator)."""
    if sim:
        return {"skipped": "the simulator run of tests/cuda is part of make test"}
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=ROOT)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                        os.path.join(ROOT, "tests", "cuda")], cwd=ROOT, env=env, capture_output=True, text=True)
    tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
    log("\n".join(tail))
    return {"returncode": r.returncode, "seconds": round(time.perf_counter() - t0, 1), "tail": tail[-3:]}


def gemm_check(sim: bool) -> dict:
    import numpy as np
    from numba import cuda

    from compiler.codegen.cuda.gemm import GemmCall, choose_tile, gemm_source, grid, reference
    from compiler.codegen.cuda.program import HEADER

    n = 64 if sim else 4096
    ns: dict = {}
    exec(HEADER, ns)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n * n).astype(np.float32)
    b = rng.standard_normal(n * n).astype(np.float32)
    call = GemmCall(n, n, n, (n, 1), (n, 1), (n, 1))
    tile = choose_tile(n, n, 1)
    exec(gemm_source(tile), ns)
    fn = ns[f"kiln_sgemm_{tile}"]
    blocks, threads = grid(call, tile)
    da, db, dc = cuda.to_device(a), cuda.to_device(b), cuda.device_array(n * n, np.float32)
    extra = [cuda.to_device(np.zeros(1, np.float32))] + [cuda.to_device(x) for x in
                                                         (call.a_offsets, call.b_offsets, call.c_offsets)]
    args = [da, db, dc, *extra, *call.scalars()]
    fn[blocks, threads](*args)
    cuda.synchronize()
    out = {"n": n, "tile": tile}
    if sim:
        want = np.zeros(n * n, np.float32)
        reference(call, a, b, want)
        out["max_error"] = float(np.abs(dc.copy_to_host() - want).max())
        return out
    # correctness on a corner: 64 rows against float64
    got = dc.copy_to_host().reshape(n, n)[:64]
    want = (a.reshape(n, n)[:64].astype(np.float64) @ b.reshape(n, n).astype(np.float64))
    out["max_rel_error"] = float(np.abs(got - want).max() / np.abs(want).max())
    reps = 10
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(reps):
        fn[blocks, threads](*args)
    end.record()
    end.synchronize()
    sec = cuda.event_elapsed_time(start, end) / 1e3 / reps
    out["kiln_tflops"] = round(2 * n ** 3 / sec / 1e12, 2)
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        ta, tb = torch.from_numpy(a.reshape(n, n)).cuda(), torch.from_numpy(b.reshape(n, n)).cuda()
        torch.matmul(ta, tb)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            torch.matmul(ta, tb)
        e.record()
        torch.cuda.synchronize()
        out["torch_tflops"] = round(2 * n ** 3 / (s.elapsed_time(e) / 1e3 / reps) / 1e12, 2)
    except Exception as ex:  # torch is the reference, not a requirement of Kiln
        out["torch_error"] = f"{type(ex).__name__}: {ex}"
    return out


def _median_ms(fn, runs: int, sync=None) -> float:
    import numpy as np

    fn()
    if sync:
        sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def model_check(name: str, spec: str, sim: bool, runs: int) -> dict:
    import warnings

    import numpy as np

    import compiler
    from compiler.tools import zoo

    out: dict = {"model": name, "spec": spec}
    proto, feeds, module = zoo.load(spec)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = compiler.compile(proto, target="cuda")
    out["compile_s"] = round(time.perf_counter() - t0, 2)
    out["fallback"] = [f["op"] for f in exe.fallback]
    out["launches"] = exe.launch_count
    out["warnings"] = [str(w.message)[:200] for w in caught][:3]
    cpu = compiler.compile(proto)
    want = cpu.run(feeds)
    t0 = time.perf_counter()
    got = exe.run(feeds)
    out["first_run_s"] = round(time.perf_counter() - t0, 2)  # numba compiles each kernel on its first launch
    err = max(float(np.abs(got[k] - want[k]).max() / max(np.abs(want[k]).max(), 1e-6)) for k in want)
    out["max_rel_error_vs_cpu"] = err
    out["matches_cpu"] = bool(err < 1e-3)
    if sim:
        return out
    import torch

    out["kiln_host_ms"] = round(_median_ms(lambda: exe.run(feeds), runs), 3)
    tfeeds = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    out["kiln_device_ms"] = round(_median_ms(lambda: exe.run(tfeeds, device_outputs=True), runs,
                                             torch.cuda.synchronize), 3)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m = module.cuda().eval()
    args = [tfeeds[k] for k in feeds]
    with torch.no_grad():
        out["torch_eager_ms"] = round(_median_ms(lambda: m(*args), runs, torch.cuda.synchronize), 3)
        ref = m(*args).cpu().numpy()
    out["max_rel_error_vs_torch"] = float(np.abs(got["output"] - ref).max() / max(np.abs(ref).max(), 1e-6))
    again = exe.run(feeds)  # after the timed runs: the launches with arguments marshalled once
    out["max_rel_error_vs_cpu_after_timing"] = max(
        float(np.abs(again[k] - want[k]).max() / max(np.abs(want[k]).max(), 1e-6)) for k in want)
    out["matches_cpu"] = out["matches_cpu"] and out["max_rel_error_vs_cpu_after_timing"] < 1e-3
    out["fast_launches"] = exe.fast_launch_count
    out["cuda_graph"] = exe.uses_graph
    out["kiln_host_over_torch"] = round(out["kiln_host_ms"] / out["torch_eager_ms"], 2)
    out["kiln_device_over_torch"] = round(out["kiln_device_ms"] / out["torch_eager_ms"], 2)
    try:
        launches = exe.time_launches(feeds, runs=3)
        notes = {(k["step"], k["kernel"]): k["notes"] for k in exe.kernels}
        top = sorted(launches, key=lambda s: -s[1])[:8]
        out["slowest_launches"] = [["+".join(s["ops"]), s["node"], " ".join(notes.get((s["step"], s["kernel"]), [])),
                                    round(t * 1e3, 4)] for s, t in top]
        out["gpu_ms_total"] = round(sum(t for _, t in launches) * 1e3, 3)
        # the profiler's table from the same events (kiln profile --target cuda): its kernel sum
        prof = compiler.profile(exe, feeds, runs=3)
        out["profile_kernels_ms"] = round(prof.kernel_sum_s * 1e3, 3)
        out["profile_latency_ms"] = round(prof.latency_median_s * 1e3, 3)
    except Exception as ex:
        out["timing_error"] = str(ex)
    return out


def graph_check(name: str, proto, feeds: dict, runs: int) -> dict:
    """A model compiled for cuda against its CPU artifact on ``feeds``, and its host-path latency."""
    import warnings

    import numpy as np

    import compiler

    out: dict = {"model": name}
    shapes = {k: v.shape for k, v in feeds.items()}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exe = compiler.compile(proto, input_shapes=shapes, target="cuda")
        cpu = compiler.compile(proto, input_shapes=shapes)
    out["compile_s"] = round(time.perf_counter() - t0, 2)
    out["on_host"] = sorted({f["op"] for f in exe.fallback})
    out["launches"] = exe.launch_count
    want = cpu.run(feeds)
    t0 = time.perf_counter()
    got = exe.run(feeds)
    out["first_run_s"] = round(time.perf_counter() - t0, 2)
    err = 0.0
    for k in want:
        w, g = want[k].astype(np.float64), got[k].astype(np.float64)
        err = max(err, float(np.abs(g - w).max(initial=0.0) / max(np.abs(w).max(initial=0.0), 1e-6)))
    out["max_rel_error_vs_cpu"] = err
    out["matches_cpu"] = bool(err < 1e-3)
    if runs:
        out["kiln_host_ms"] = round(_median_ms(lambda: exe.run(feeds), runs), 3)
        out["cpu_ms"] = round(_median_ms(lambda: cpu.run(feeds), max(3, runs // 4)), 3)
    return out


def zoo_graphs(light: str, arch: str):
    """(name, ONNX model, feeds) of the light models and archs selected ("all" or comma-separated)."""
    import onnx

    from compiler.models import light_models, load_graph, resolve
    from compiler.tools.cli import random_inputs

    names = light_models() if light == "all" else [n for n in light.split(",") if n]
    for n in names:
        path = resolve(f"light:{n}")
        feeds = random_inputs(load_graph(path), {}, 0, [])
        yield f"light:{n}", onnx.load(path), feeds
    if arch:
        from compiler.tools import archs

        for n in (list(archs.ARCHS) if arch == "all" else [a for a in arch.split(",") if a]):
            data, feeds, _ = archs.export_arch(n, batch=1)
            yield f"arch:{n}", onnx.load_from_string(data), feeds


def _save(report: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", action="store_true", help="numba's CUDA simulator, small sizes, no timings")
    ap.add_argument("--out", default=".", help="where gpu_check.json goes")
    ap.add_argument("--only", default="", help="models whose name contains one of these (comma-separated)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per model (median)")
    ap.add_argument("--skip-tests", action="store_true", help="do not run tests/cuda on the device")
    ap.add_argument("--skip-gemm", action="store_true", help="do not time the 4096^3 GEMM")
    ap.add_argument("--light", default="", metavar="NAMES|all", help="light: ONNX model-zoo networks to check")
    ap.add_argument("--archs", default="", metavar="NAMES|all", help="real-architecture suite models to check")
    args = ap.parse_args(argv)
    if args.sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    sys.path.insert(0, ROOT)
    import numba
    from numba import cuda

    report: dict = {"numba": numba.__version__, "simulator": bool(args.sim)}
    if not args.sim:
        if not cuda.is_available():
            log("no CUDA GPU here (numba.cuda.is_available() is False); use --sim for the simulator")
            return 2
        dev = cuda.get_current_device()
        report["gpu"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        report["compute_capability"] = ".".join(map(str, dev.compute_capability))
    log(json.dumps(report))
    t_all = time.perf_counter()
    report["kernel_tests"] = {"skipped": "--skip-tests"} if args.skip_tests else kernel_tests(args.sim)
    report["gemm"] = {"skipped": "--skip-gemm"} if args.skip_gemm else gemm_check(args.sim)
    log("gemm", json.dumps(report["gemm"]))
    only = [s for s in args.only.split(",") if s]
    report["models"] = []
    ok = report["kernel_tests"].get("returncode", 0) == 0
    for name, full, small in MODELS:
        if only and not any(o in name for o in only):
            continue
        try:
            r = model_check(name, small if args.sim else full, args.sim, args.runs)
        except Exception as ex:  # one model's failure is reported, the others still run
            import traceback

            r = {"model": name, "error": f"{type(ex).__name__}: {ex}", "trace": traceback.format_exc()[-1500:]}
        ok = ok and r.get("matches_cpu", False)
        report["models"].append(r)
        log(name, json.dumps(r))
        _save(report, args.out)
    report["graphs"] = []
    for name, proto, feeds in zoo_graphs(args.light, args.archs):
        try:
            r = graph_check(name, proto, feeds, 0 if args.sim else max(3, args.runs // 2))
        except Exception as ex:
            import traceback

            r = {"model": name, "error": f"{type(ex).__name__}: {ex}", "trace": traceback.format_exc()[-1500:]}
        ok = ok and r.get("matches_cpu", False)
        report["graphs"].append(r)
        log(name, json.dumps(r))
        _save(report, args.out)
    report["seconds"] = round(time.perf_counter() - t_all, 1)
    log("\nmodel          match  compile s  kiln host ms  kiln dev ms  torch ms  host/torch  dev/torch  graph")
    for r in report["models"]:
        if "error" in r:
            log(f"{r['model']:<14} ERROR {r['error'][:90]}")
            continue
        log(f"{r['model']:<14} {str(r['matches_cpu']):<6} {r['compile_s']:>9} {r.get('kiln_host_ms', '-'):>13} "
            f"{r.get('kiln_device_ms', '-'):>12} {r.get('torch_eager_ms', '-'):>9} "
            f"{r.get('kiln_host_over_torch', '-'):>11} {r.get('kiln_device_over_torch', '-'):>10} "
            f"{str(r.get('cuda_graph', '-')):>6}")
    if report["graphs"]:
        log("\nmodel                       match  rel.err   compile s  first run s  kiln ms   cpu ms  on host")
        for r in report["graphs"]:
            if "error" in r:
                log(f"{r['model']:<27} ERROR {r['error'][:90]}")
                continue
            log(f"{r['model']:<27} {str(r['matches_cpu']):<6} {r['max_rel_error_vs_cpu']:<9.2g} {r['compile_s']:>9} "
                f"{r['first_run_s']:>12} {r.get('kiln_host_ms', '-'):>8} {r.get('cpu_ms', '-'):>8}  "
                f"{','.join(r['on_host']) or '-'}")
    _save(report, args.out)
    log(f"total {report['seconds']} s; {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
