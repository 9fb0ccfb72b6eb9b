"""Kiln at two commits on the model suite, interleaved in one run: did a change cost speed?

    python benchmarks/ab.py --before d7f4236 [--after HEAD] [--only resnet50,bert | --model m.onnx ...]
                            [--threads 2] [--rounds 7] [--quantize int8|int8-dynamic]

Each commit is checked out into a temporary git worktree; per model, one worker process per commit
(``PYTHONPATH`` = that worktree) compiles the model (its compile time is reported) and then runs
timed rounds on command, the two workers taking turns (A, B, A, B, ...) so that the machine's drift
hits both alike. Prints a Markdown table: the median latency per commit, after/before, and the
compile times. The workers check that the two commits' outputs agree. ``--quantize``: the models
quantized (static int8 calibrated on 8 random samples, as ``benchmarks/quantize.py`` does), the
compile time then including the calibration.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.models import SUITE  # noqa: E402

WORKER = r'''
import json, sys, time
import numpy as np
import compiler
from compiler.tools.zoo import model_of
spec, nthreads, calls, quantize = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model = model_of(spec) if spec.startswith("zoo:") else spec
options = {}
if quantize != "none":
    from compiler.tools.bench import random_feeds
    f32 = compiler.compile(model, nthreads=nthreads)
    options = dict(quantize=quantize, calibration=[random_feeds(f32.inputs, seed=1 + i) for i in range(8)]
                   if quantize == "int8" else None)
t0 = time.perf_counter()
exe = compiler.compile(model, nthreads=nthreads, **options)
compile_s = time.perf_counter() - t0
rng = np.random.default_rng(0)
feeds = {}
for name, dtype, shape in exe.inputs:
    dt = dtype.np
    feeds[name] = (rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt))
out = exe.run(feeds)
digest = float(sum(np.abs(np.asarray(v, np.float64)).sum() for v in out.values()))
print(json.dumps({"compile_s": compile_s, "digest": digest}), flush=True)
for line in sys.stdin:
    t = []
    for _ in range(calls):
        s = time.perf_counter()
        exe.run(feeds)
        t.append(time.perf_counter() - s)
    print(json.dumps({"ms": 1000 * sorted(t)[len(t) // 2]}), flush=True)
'''


def worktree(rev: str, where: str) -> str:
    path = os.path.join(where, rev.replace("/", "_"))
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", path, rev], check=True,
                   capture_output=True)
    return path


def start(tree: str, spec: str, threads: int, calls: int, quantize: str) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ, PYTHONPATH=tree)
    p = subprocess.Popen([sys.executable, "-c", WORKER, spec, str(threads), str(calls), quantize], cwd=tree, env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    if not first:
        raise RuntimeError(f"{spec} did not compile at {tree}")
    return p, json.loads(first)


def timed(p: subprocess.Popen) -> float:
    p.stdin.write("run\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())["ms"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--only", default="", help="models whose spec or label contains one of these (comma list)")
    ap.add_argument("--model", action="append", default=[],
                    help="an ONNX file (or zoo:/light: spec) to time instead of the suite (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per commit, taken in turns")
    ap.add_argument("--calls", type=int, default=10, help="calls per round (its median is the round's time)")
    ap.add_argument("--quantize", default="none", choices=["none", "int8", "int8-dynamic"],
                    help="time the models quantized so (static int8: calibrated on 8 random samples)")
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    suite = [(label, spec) for label, spec in SUITE if not only or any(o in spec or o in label for o in only)]
    if args.model:
        suite = [(os.path.basename(m), os.path.abspath(m) if os.path.exists(m) else m) for m in args.model]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-ab-") as tmp:
        trees = [worktree(args.before, os.path.join(tmp, "a")), worktree(args.after, os.path.join(tmp, "b"))]
        try:
            for label, spec in suite:
                procs = [start(t, spec, args.threads, args.calls, args.quantize) for t in trees]
                times: list[list[float]] = [[], []]
                for _ in range(args.rounds):
                    for k, (p, _) in enumerate(procs):
                        times[k].append(timed(p))
                for p, _ in procs:
                    p.stdin.close()
                    p.wait()
                (_, a), (_, b) = procs
                agree = abs(a["digest"] - b["digest"]) <= 1e-3 * max(1.0, abs(a["digest"]))
                ma, mb = statistics.median(times[0]), statistics.median(times[1])
                rows.append((label, ma, mb, a["compile_s"], b["compile_s"], agree))
                print(f"{label}: {ma:.3f} ms -> {mb:.3f} ms ({mb / ma:.3f}x); compile {a['compile_s']:.2f} s -> "
                      f"{b['compile_s']:.2f} s{'' if agree else '  OUTPUTS DIFFER'}", flush=True)
        finally:
            for t in trees:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", t], capture_output=True)
    print(f"\n| model | {args.before} ms | {args.after} ms | after/before | compile before s | compile after s |")
    print("|---|---|---|---|---|---|")
    for label, ma, mb, ca, cb, agree in rows:
        print(f"| {label} | {ma:.3f} | {mb:.3f} | {mb / ma:.3f}{'' if agree else ' (outputs differ)'} | "
              f"{ca:.2f} | {cb:.2f} |")
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
