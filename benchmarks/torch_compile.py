"""torch.compile(backend="kiln") against PyTorch eager and torch.compile(backend="inductor"), same
threads, in one run: first-call (compile) time and median latency per model.

    python benchmarks/torch_compile.py [--models mlp,bert,resnet18,gpt2] [--threads 2] [--runs 20]
        [--no-inductor] [--inductor-cache] [--kiln-cache] [--json FILE]

Models: the zoo's MLP (batch 1), BERT-style (seq 128) and MobileNetV2 (224), and the real-architecture
suite's models (``compiler/tools/archs``, batch 1). Every compiled result is checked against eager.
Latency is measured as ``kiln bench`` does (``compiler.tools.bench.measure``): interleaved rounds, each
giving eager, Kiln and inductor a turn in a rotating order (untimed calls for 0.1 s while the previous
engine's threads may still spin, then timed calls), so the three see the same moments of a noisy
host; each ratio is the ratio of medians, and its spread the quartiles of the per-round ratios.
Compile time is the first call's (dynamo, the backend's tracing and compile), with both backends'
modules imported before and both backends' on-disk caches off (``--inductor-cache`` keeps inductor's,
``--kiln-cache`` Kiln's object cache).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model(name: str):
    from compiler.tools import archs, zoo

    if name in ("mlp", "bert", "mobilenetv2"):
        size = {"bert": {"seq": 128}, "mobilenetv2": {"resolution": 224}}.get(name, {})
        m, inputs, _ = zoo.build(name, **size)
        return m.eval(), inputs
    m, feeds, _ = archs.build(name, 1)
    return m.eval(), list(feeds.values())


def _round_ratios(a, b) -> tuple[float, float]:
    """The quartiles of engine ``a``'s time over ``b``'s, round by round (each round's median block)."""
    from compiler.tools.bench import BLOCK

    n = min(len(a.times), len(b.times)) // BLOCK
    r = sorted(statistics.median(a.times[i * BLOCK:(i + 1) * BLOCK]) /
               statistics.median(b.times[i * BLOCK:(i + 1) * BLOCK]) for i in range(n))
    return r[n // 4], r[(3 * n) // 4]


def _max_error(got, want) -> float:
    """The largest absolute difference over the tensors of two outputs of one structure (a tensor,
    or tuples of them: a recurrent net's output and state)."""
    from torch.utils._pytree import tree_flatten

    a, b = tree_flatten(got)[0], tree_flatten(want)[0]
    if len(a) != len(b):
        raise AssertionError(f"{len(a)} outputs against eager's {len(b)}")
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,bert,mobilenetv2,resnet18,gpt2,vit,lstm,gru")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20, help="interleaved rounds per model (default 20)")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--inductor-cache", action="store_true",
                    help="let inductor use its on-disk caches (warm: its compile time is then a cache hit's)")
    ap.add_argument("--kiln-cache", action="store_true",
                    help="let Kiln read object code compiled before (default: off, a cold compile, as inductor's)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    from compiler.tools.bench import Engine, cpu_name, measure

    torch.set_num_threads(args.threads)
    # the compile times are the compiles' own: both backends' modules are imported first (Kiln's
    # import its code generator at the first compile; inductor its own), and inductor's on-disk
    # caches are off unless --inductor-cache (a cache hit is not a compile; Kiln's backend has none)
    import importlib

    for module in ("compiler.driver", "compiler.torch_backend", "frontends.torch") + \
            (() if args.no_inductor else ("torch._inductor.compile_fx",)):
        importlib.import_module(module)
    if not args.no_inductor:
        importlib.import_module("torch._inductor.config").force_disable_caches = not args.inductor_cache
    rows = []
    for name in args.models.split(","):
        m, inputs = _model(name)
        xs = [torch.from_numpy(v) for v in inputs]
        row = {"model": name}
        with torch.no_grad():
            want = m(*xs)
            engines = [Engine("eager", lambda: m(*xs), None)]
            for backend in ["kiln"] + ([] if args.no_inductor else ["inductor"]):
                if backend == "kiln":
                    torch._dynamo.reset()  # (inductor's compile follows Kiln's: each keeps its own entry)
                opts = {"nthreads": args.threads, "kernel_cache": args.kiln_cache} if backend == "kiln" else None
                f = torch.compile(m, backend=backend, options=opts)
                t0 = time.perf_counter()
                got = f(*xs)
                row[f"{backend}_compile_s"] = time.perf_counter() - t0
                row[f"{backend}_err"] = _max_error(got, want)
                engines.append(Engine(backend, lambda f=f: f(*xs), None))
            row["rounds"] = measure(engines, args.runs, 3)
        for e in engines:
            row[f"{e.name}_ms"] = statistics.median(e.times) * 1e3
        for e in engines[1:]:
            for peer in engines:
                if peer is not e and not (e.name == "inductor" and peer.name == "kiln"):
                    row[f"{e.name}_{peer.name}_round_ratio_iqr"] = _round_ratios(e, peer)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n# torch.compile(backend=kiln) vs eager and inductor, {args.threads} threads, {cpu_name()}\n")
    head = "| model | eager ms | kiln ms | kiln/eager (rounds' IQR) | kiln compile s |"
    if not args.no_inductor:
        head += " inductor ms | kiln/inductor (rounds' IQR) | inductor compile s |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        lo, hi = r["kiln_eager_round_ratio_iqr"]
        line = (f"| {r['model']} | {r['eager_ms']:.3f} | {r['kiln_ms']:.3f} | {r['kiln_ms'] / r['eager_ms']:.2f} "
                f"({lo:.2f}-{hi:.2f}) | {r['kiln_compile_s']:.1f} |")
        if not args.no_inductor:
            lo, hi = r["kiln_inductor_round_ratio_iqr"]
            line += (f" {r['inductor_ms']:.3f} | {r['kiln_ms'] / r['inductor_ms']:.2f} ({lo:.2f}-{hi:.2f}) | "
                     f"{r['inductor_compile_s']:.1f} |")
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "threads": args.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
