"""Fusion on and off: Kiln's median latency on the model suite at -O2 with and without the ``fuse``
pass (and ``sink-reshapes``, which only serves it), in one run, as a speed-up, with the ops ->
kernels counts.

    PYTHONPATH=. .venv/bin/python benchmarks/fusion.py [--threads 2] [--runs 30] [MODEL ...]

Each model is compiled twice; the two executables are timed in interleaved turns (untimed calls for
0.1 s, then 3 timed calls; as ``kiln bench``), so machine drift hits both alike.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

SUITE = ["light:resnet50", "light:squeezenet", "light:shufflenet", "light:inception_v1", "light:densenet121",
         "zoo:bert?seq=128", "zoo:mobilenetv2?resolution=224", "zoo:mlp", "zoo:mlp?batch=64"]


def main() -> None:
    import compiler
    from compiler.tools.bench import random_feeds
    from compiler.tools.zoo import model_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=SUITE)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    print("| model | nodes (unfused) | kernels fused | unfused ms | fused ms | speed-up |")
    print("|---|---|---|---|---|---|")
    for spec in args.models:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_of(spec)
            fused = compiler.compile(model, nthreads=args.threads)
            plain = compiler.compile(model, nthreads=args.threads, disabled_passes=("sink-reshapes", "fuse"))
        feeds = random_feeds(fused.inputs, 0)
        times = {"fused": [], "plain": []}
        for r in range(args.runs):
            for name, exe in (("fused", fused), ("plain", plain))[:: 1 if r % 2 else -1]:
                start = time.perf_counter()
                exe.run(feeds)
                while time.perf_counter() - start < 0.1:
                    exe.run(feeds)
                for _ in range(3):
                    t0 = time.perf_counter()
                    exe.run(feeds)
                    times[name].append(time.perf_counter() - t0)
        f, p = (statistics.median(times[k]) * 1e3 for k in ("fused", "plain"))
        print(f"| {spec} | {len(plain.kernels) + plain.manifest.views} | {len(fused.kernels)} | {p:.3f} | "
              f"{f:.3f} | {p / f:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
