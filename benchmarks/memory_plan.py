"""Memory-plan figures for every suite model (docs/memory.md): arena, lower bound, naive, weights.

    .venv/bin/python benchmarks/memory_plan.py [MODEL ...] [--O 2] [--no-schedule] [--no-in-place]

Builds each program (no LLVM compile) after the -O pipeline and prints one row per model.
"""
from __future__ import annotations

import argparse
import time

SUITE = [f"light:{m}" for m in ("resnet50", "squeezenet", "shufflenet", "inception_v1", "densenet121",
                                 "bvlc_alexnet", "inception_v2", "vgg19", "zfnet512")] + \
        ["zoo:bert", "zoo:mobilenetv2?resolution=224", "zoo:mlp", "zoo:efficientnet_block"]


def figures(spec: str, opt_level: int = 2, disabled=(), in_place: bool = True) -> dict:
    from compiler.codegen.fusion import CPU_FUSION
    from compiler.codegen.llvm.target import host_target
    from compiler.codegen.program import build_program
    from compiler.models import load_graph
    from compiler.passes.manager import PassManager
    from compiler.passes.options import CompileOptions
    from compiler.passes.pipeline import pipeline
    from compiler.tools.zoo import model_of

    g = load_graph(model_of(spec))
    opts = CompileOptions.make(opt_level=opt_level, input_shapes={}, disabled_passes=tuple(disabled), verify=False)
    PassManager([p for p in pipeline(opts, CPU_FUSION) if p.name not in disabled]).run(g)
    kw = {} if in_place else {"in_place": False}
    prog = build_program(g, host_target(), **kw)
    return prog.memory_summary()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("-O", type=int, default=2)
    ap.add_argument("--no-schedule", action="store_true")
    ap.add_argument("--no-in-place", action="store_true")
    a = ap.parse_args(argv)
    mib = 1 << 20
    print(f"{'model':<32} {'arena MiB':>10} {'lower MiB':>10} {'ratio':>6} {'naive MiB':>10} {'naive/arena':>11}"
          f" {'weights MiB':>11} {'in-place':>8} {'s':>5}")
    for spec in a.models or SUITE:
        t0 = time.perf_counter()
        f = figures(spec, a.O, ("schedule-memory",) if a.no_schedule else (), not a.no_in_place)
        print(f"{spec:<32} {f['arena_bytes'] / mib:10.2f} {f['lower_bound_bytes'] / mib:10.2f} "
              f"{f['arena_bytes'] / max(f['lower_bound_bytes'], 1):6.3f} {f['naive_bytes'] / mib:10.2f} "
              f"{f['naive_bytes'] / max(f['arena_bytes'], 1):11.2f} {f['weights_bytes'] / mib:11.2f} "
              f"{f.get('in_place', 0):8d} {time.perf_counter() - t0:5.1f}", flush=True)


if __name__ == "__main__":
    main()
