"""Reproduce the GEMM tables of docs/gemm.md: GFLOP/s of numpy.matmul, NumPy's OpenBLAS called
through its C function pointer (option A), and Kiln's own LLVM sgemm (option B), plain and with the
constant operand (weights) pre-packed, and (the right operand an activation) with it transposed and
read in place, on 1 and 2 threads.

    PYTHONPATH=. .venv/bin/python benchmarks/gemm.py                # all shapes, 1 and 2 threads
    PYTHONPATH=. .venv/bin/python benchmarks/gemm.py --isa avx2 --threads 1 --shapes bert

OpenBLAS (numpy, option A) and Kiln are measured in separate processes, alternately (--rounds), so
that OpenBLAS's spinning idle threads do not take the second core from Kiln's pool thread; within a
process the variants of one shape are timed round-robin. The median of all samples is printed.
About 1.5 minutes for everything on 2 cores.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from compiler.codegen.gemm import find_openblas, load_gemm  # noqa: E402
from compiler.codegen.gemm.blas import NO_TRANS, ROW_MAJOR  # noqa: E402

# (group, name, M, N, K, constant operand: "A" = weights on the left (conv: W[Cout, Cin*kh*kw] @
# im2col), "B" = weights on the right (x @ W), None = both operands are activations)
SHAPES = [
    ("square", "512^3", 512, 512, 512, None),
    ("square", "1024^3", 1024, 1024, 1024, None),
    ("square", "2048^3", 2048, 2048, 2048, None),
    ("resnet50", "conv1 7x7/2", 64, 12544, 147, "A"),
    ("resnet50", "res2 3x3", 64, 3136, 576, "A"),
    ("resnet50", "res2 1x1 expand", 256, 3136, 64, "A"),
    ("resnet50", "res4 3x3", 512, 784, 1152, "A"),  # (the shape; 256x196x2304 in the net)
    ("resnet50", "res5 1x1 expand", 2048, 49, 512, "A"),
    ("bert", "qkv 128x256x256", 128, 256, 256, "B"),
    ("bert", "ffn up 128x1024x256", 128, 1024, 256, "B"),
    ("bert", "ffn down 128x256x1024", 128, 256, 1024, "B"),
    ("mlp", "batch 1 784->512", 1, 512, 784, "B"),
    ("mlp", "batch 64 784->512", 64, 512, 784, "B"),
]

_F = ctypes.POINTER(ctypes.c_float)


def _ptr(x):
    return x.ctypes.data_as(_F)


def variants_for(side, m, n, k, const, nthreads, kiln, ob):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.zeros((m, n), np.float32)
    pa, pb, pc = _ptr(a), _ptr(b), _ptr(c)
    keep = [a, b, c]
    variants = {}
    if side == "openblas":
        variants["numpy"] = lambda: np.matmul(a, b, out=c)
        if ob is not None:
            i = ob.int_type
            args = (ROW_MAJOR, NO_TRANS, NO_TRANS, i(m), i(n), i(k), ctypes.c_float(1.0), pa, i(k),
                    pb, i(n), ctypes.c_float(0.0), pc, i(n))
            variants["A: openblas"] = lambda: ob.sgemm(*args)
        return variants, keep
    sg = kiln.sgemm
    variants["B: kiln"] = lambda: sg(0, 0, m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n, nthreads)
    if const != "A":  # the right operand transposed, read in place (an activation: attention's keys)
        bt = np.ascontiguousarray(b.T)
        pbt = _ptr(bt)
        keep.append(bt)
        variants["B: kiln, B^T in place"] = lambda: sg(0, 1, m, n, k, 1.0, pa, k, pbt, k, 0.0, pc, n, nthreads)
    if const == "A":
        ap = kiln.pack_a(a)
        pap = _ptr(ap)
        keep.append(ap)
        variants["B: kiln, W packed"] = lambda: sg(2, 0, m, n, k, 1.0, pap, 0, pb, n, 0.0, pc, n,
                                                   nthreads)
    elif const == "B":
        bp = kiln.pack_b(b)
        pbp = _ptr(bp)
        keep.append(bp)
        variants["B: kiln, W packed"] = lambda: sg(0, 2, m, n, k, 1.0, pa, k, pbp, 0, 0.0, pc, n,
                                                   nthreads)
    return variants, keep


def time_variants(variants, reps, target_s, clock):
    """Seconds per call of each variant, ``reps`` samples each, timed round-robin."""
    calls = {}
    for name, f in variants.items():  # warm up, size the batches to ~target_s
        f()
        t = clock()
        f()
        f()
        dt = max((clock() - t) / 2, 1e-7)
        calls[name] = max(1, int(target_s / dt))
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, f in variants.items():
            n_calls = calls[name]
            t = clock()
            for _ in range(n_calls):
                f()
            times[name].append((clock() - t) / n_calls)
    return times


def concurrency(side, kiln, ob, size=1024, calls=6):
    """Two Python threads (ctypes drops the GIL) calling GEMM at once: aggregate GFLOP/s and
    whether every result was right, for 1 and 2 library threads per call."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    want = a @ b
    res = {}
    for nt in (1, 2):
        if side == "openblas":
            ob.set_num_threads(nt)
        outs = [np.zeros((size, size), np.float32) for _ in range(2)]
        bad = []

        def work(i):
            c = outs[i]
            for _ in range(calls):
                if side == "openblas":
                    ob.gemm(a, b, c)
                else:
                    kiln.gemm(a, b, c, nthreads=nt)
            if not np.allclose(c, want, atol=1e-2):
                bad.append(i)

        ths = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        t = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        dt = time.perf_counter() - t
        res[str(nt)] = {"gflops": 2 * calls * 2.0 * size ** 3 / dt / 1e9, "wrong": len(bad)}
    return res


def run_side(args):
    """One side (OpenBLAS or Kiln) in this process: {threads: {shape: {variant: [s, ...]}}}."""
    kiln = load_gemm(args.isa) if args.side == "kiln" else None
    ob = find_openblas()
    if args.concurrency:
        json.dump(concurrency(args.side, kiln, ob), sys.stdout)
        return
    out = {}
    for nt in [int(t) for t in args.threads.split(",")]:
        if args.side == "openblas" and ob is not None and ob.set_num_threads is not None:
            ob.set_num_threads(nt)  # numpy.matmul and option A use this count
        clock = time.thread_time if args.cpu_time and nt == 1 else time.perf_counter
        res = out[str(nt)] = {}
        for group, name, m, n, k, const in selected(args):
            variants, _keep = variants_for(args.side, m, n, k, const, nt, kiln, ob)
            res[f"{group} {name}"] = time_variants(variants, args.reps, args.target_ms / 1000, clock)
    json.dump(out, sys.stdout)


def selected(args):
    groups = None if args.shapes == "all" else set(args.shapes.split(","))
    return [s for s in SHAPES if not groups or s[0] in groups]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", default=None, help="avx512 / avx2 / sse (default: the host's)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default="all", help="comma list of groups: square,resnet50,bert,mlp")
    ap.add_argument("--reps", type=int, default=3, help="samples per round")
    ap.add_argument("--rounds", type=int, default=2, help="alternating OpenBLAS / Kiln processes")
    ap.add_argument("--target-ms", type=float, default=15.0, help="time per sample")
    ap.add_argument("--cpu-time", action="store_true",
                    help="1 thread: time by the calling thread's CPU time (robust on a loaded machine)")
    ap.add_argument("--concurrency", action="store_true",
                    help="instead: two callers at once (1024^3), per library and thread count")
    ap.add_argument("--side", choices=["openblas", "kiln"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        return run_side(args)
    if args.concurrency:
        print("| library | threads per call | aggregate GFLOP/s, 2 concurrent callers | wrong results |")
        print("|---|---:|---:|---:|")
        for side in ("openblas", "kiln"):
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1") if side == "kiln" else os.environ
            cmd = [sys.executable, os.path.abspath(__file__), "--concurrency", "--side", side]
            if args.isa:
                cmd += ["--isa", args.isa]
            r = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                          text=True).stdout)
            for nt, v in r.items():
                print(f"| {side} | {nt} | {v['gflops']:.1f} | {v['wrong']} |")
        return
    # Each side runs in its own process, alternately: OpenBLAS's idle threads spin for a while
    # after each call and would take the second core from Kiln's pool thread (and vice versa).
    kiln = load_gemm(args.isa)
    ob = find_openblas()
    cfg = kiln.cfg
    print(f"# kiln GEMM: isa={cfg.isa} MRxNR={cfg.MR}x{cfg.NR} KC={cfg.KC} MC={cfg.MC} NC={cfg.NC} "
          f"cpu={cfg.cpu}")
    if ob is not None:
        print(f"# numpy's OpenBLAS: {os.path.basename(ob.path)} core={ob.corename} "
              f"(OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '-')})")
    print(f"# load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    samples: dict = {}
    base = [sys.executable, os.path.abspath(__file__), "--threads", args.threads, "--shapes",
            args.shapes, "--reps", str(args.reps), "--target-ms", str(args.target_ms)]
    if args.isa:
        base += ["--isa", args.isa]
    if args.cpu_time:
        base.append("--cpu-time")
    for _ in range(args.rounds):
        for side in ("openblas", "kiln"):
            env = dict(os.environ)
            if side == "kiln":
                env["OPENBLAS_NUM_THREADS"] = "1"  # keep NumPy's BLAS threads out of the way
            out = subprocess.run(base + ["--side", side], env=env, check=True, capture_output=True,
                                 text=True).stdout
            for nt, shapes in json.loads(out).items():
                for shape, vs in shapes.items():
                    for v, ts in vs.items():
                        samples.setdefault(nt, {}).setdefault(shape, {}).setdefault(v, []).extend(ts)
    cols = ["numpy", "A: openblas", "B: kiln", "B: kiln, W packed", "B: kiln, B^T in place"]
    for nt, shapes in samples.items():
        timer = "CPU time" if args.cpu_time and nt == "1" else "wall time"
        n = args.reps * args.rounds
        print(f"\n## {nt} thread{'s' if nt != '1' else ''} (GFLOP/s by {timer}, median of {n})\n")
        print("| shape | M | N | K | " + " | ".join(cols) + " | kiln best / numpy |")
        print("|---|---:|---:|---:|" + "---:|" * (len(cols) + 1))
        for group, name, m, n_, k, const in selected(args):
            r = {v: 2.0 * m * n_ * k / np.median(ts) / 1e9
                 for v, ts in shapes[f"{group} {name}"].items()}
            best = max(r.get("B: kiln", 0), r.get("B: kiln, W packed", 0))
            cells = [f"{r[c]:.1f}" if c in r else "" for c in cols]
            print(f"| {group} {name} | {m} | {n_} | {k} | " + " | ".join(cells)
                  + f" | {best / r['numpy']:.2f} |")
    print(f"\n# load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
