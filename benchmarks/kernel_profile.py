"""Where a compiled model spends its time: every kernel timed (``compile(..., profile=True)``).

    PYTHONPATH=. .venv/bin/python benchmarks/kernel_profile.py light:squeezenet [--runs 50] [--top 25]
                                  [--quantize int8|int8-dynamic]

Prints the kernels by total time with their member ops, GFLOP/s and GB/s (from the ops' cost
model), and the total against the wall time per run (the clock reads cost well under a µs a step).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    from compiler import compile as kiln_compile
    from compiler.tools.bench import random_feeds
    from compiler.tools.zoo import model_of

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="an ONNX path, light:NAME or zoo:NAME")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("-O", dest="opt", type=int, default=2)
    p.add_argument("--disable-pass", action="append", default=[])
    p.add_argument("--quantize", choices=["int8", "int8-dynamic"],
                   help="the model quantized (static int8: calibrated on --samples random feeds)")
    p.add_argument("--samples", type=int, default=8)
    a = p.parse_args(argv)
    model = model_of(a.model)
    calibration = None
    if a.quantize == "int8":
        from compiler.models import load_graph

        graph = load_graph(model)  # (its inputs' names and types: nothing compiled for them)
        inputs = [(v.name, v.type.dtype, tuple(v.type.shape)) for v in graph.inputs]
        calibration = [random_feeds(inputs, seed=1 + i) for i in range(a.samples)]
    exe = kiln_compile(model, a.opt, nthreads=a.threads, profile=True, disabled_passes=a.disable_pass,
                       quantize=a.quantize, calibration=calibration)
    feeds = random_feeds(exe.inputs)
    for _ in range(5):
        exe.run(feeds)
    sums = [0.0] * len(exe.kernels)
    t0 = time.perf_counter()
    for _ in range(a.runs):
        _, t = exe.run_timed(feeds)
        sums = [s + k for s, k in zip(sums, t.steps)]
    wall = (time.perf_counter() - t0) / a.runs
    rows = sorted(zip(exe.kernels, sums), key=lambda r: -r[1])
    total = sum(s for _, s in rows) / a.runs
    print(f"{a.model}: {wall * 1e3:.3f} ms per run, {total * 1e3:.3f} ms in {len(rows)} kernels")
    print(f"{'ms':>8} {'%':>5} {'GF/s':>6} {'GB/s':>6}  kernel")
    for k, s in rows[:a.top]:
        t = s / a.runs
        gf = k["flops"] / t / 1e9 if t else 0
        gb = k["bytes"] / t / 1e9 if t else 0
        print(f"{t * 1e3:8.3f} {100 * t / total:5.1f} {gf:6.1f} {gb:6.1f}  {k['lowering']}: {'+'.join(k['ops'])} "
              f"[{','.join(n for n in k['nodes'] if n)[:60]}]")
    by: dict[str, float] = {}
    for k, s in rows:
        by[k["lowering"]] = by.get(k["lowering"], 0) + s / a.runs
    print("by lowering: " + ", ".join(f"{n} {t * 1e3:.2f} ms" for n, t in sorted(by.items(), key=lambda x: -x[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
