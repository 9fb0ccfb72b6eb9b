"""A survey of Kiln on real architectures (``compiler/tools/archs/``) against ONNX Runtime.

    python benchmarks/archs.py                          # every arch, 2 threads, automatic rounds
    python benchmarks/archs.py --models vit,gpt2 --runs 20 --json archs.json

For each arch: the ops that still run in Kiln's interpreter, the max abs error of Kiln's outputs
against ONNX Runtime (same ONNX bytes) and against the PyTorch module, and the median latency of
Kiln and ONNX Runtime with the same thread count, timed in interleaved rounds (``bench.measure``:
each round gives each engine a turn, the order rotating), then the geometric mean of Kiln/ORT over
the archs that ran. The batch is fixed at compile time (``--batch``). An arch that fails to compile
or disagrees with ONNX Runtime beyond ``--rtol``/``--atol`` is reported in its row (a wrong answer is
not timed) and the script exits with status 1 after the others ran.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.models import _ms, git_commit  # noqa: E402
from compiler.tools.bench import (BenchError, _kiln_engine, _OpenBLASThreads, _ort_engine, _stats,  # noqa: E402
                                  compare_outputs, cpu_name, measure)

HEADER = ["arch", "fallback ops", "max abs err vs ORT", "vs torch", "Kiln ms", "ORT ms", "Kiln/ORT", "compile s"]


def survey(r: dict, threads: int, batch: int, runs: int | None, warmup: int, budget: float, rtol: float,
           atol: float) -> None:
    """One arch (``r["arch"]``): compile, check against ONNX Runtime and PyTorch, time Kiln and ONNX
    Runtime; the results go into ``r`` as they come (a failure keeps what was measured before it)."""
    import onnx

    import compiler
    from compiler.driver import FallbackWarning
    from compiler.tools import archs

    name = r["arch"]
    onnx_bytes, _, module = archs.export_arch(name)
    _, feeds, _ = archs.build(name, batch)
    notes: list[str] = []
    r.update(batch=batch, threads=threads, notes=notes)
    with _OpenBLASThreads(threads) as blas:
        if not blas.controlled:
            notes.append("could not set OpenBLAS's thread count (the interpreter fallback uses its default)")
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FallbackWarning)  # reported from the executable
            exe = compiler.compile(onnx.load_from_string(onnx_bytes), 2, nthreads=threads,
                                   input_shapes={n: v.shape for n, v in feeds.items()})
        r["compile_seconds"] = time.perf_counter() - t0
        r["fallback_nodes"] = len(exe.fallback)
        r["fallback_ops"] = sorted({f["op"] for f in exe.fallback})
        kiln = _kiln_engine(exe, feeds)
        ort = _ort_engine(onnx_bytes, feeds, threads, notes)
        if ort is None:
            raise BenchError("; ".join(notes))
        got = kiln.outputs()
        inf = float("inf")
        r["error_vs_ort"] = compare_outputs(got, ort.outputs(), "onnxruntime", inf, inf)["max_abs"]
        ref = dict(zip(exe.output_names, archs.torch_outputs(module, feeds)))
        r["error_vs_torch"] = compare_outputs(got, ref, "torch", inf, inf)["max_abs"]
        compare_outputs(got, ort.outputs(), "onnxruntime", rtol, atol)  # BenchError: a wrong answer
        r["runs"] = measure([kiln, ort], runs, warmup, budget)
    r["engines"] = {"kiln": _stats(kiln.times), "onnxruntime": _stats(ort.times)}
    r["kiln_over_ort"] = r["engines"]["kiln"]["median_ms"] / r["engines"]["onnxruntime"]["median_ms"]


def row(r: dict) -> list[str]:
    err = lambda k: f"{r[k]:.2g}" if k in r else "-"  # noqa: E731
    if "error" in r:
        return [r["arch"], " ".join(r.get("fallback_ops", [])) or "-", err("error_vs_ort"), err("error_vs_torch"),
                f"**failed**: {r['error']}", "", "", ""]
    e = r["engines"]
    return [r["arch"], " ".join(r["fallback_ops"]) or "none", err("error_vs_ort"), err("error_vs_torch"),
            _ms(e["kiln"]["median_ms"]), _ms(e["onnxruntime"]["median_ms"]), f"{r['kiln_over_ort']:.2f}",
            f"{r['compile_seconds']:.1f}"]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows])


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main(argv=None) -> int:
    from compiler.tools import archs

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="", help=f"comma-separated archs (default: all: {', '.join(archs.ARCHS)})")
    p.add_argument("--threads", type=int, default=2, help="threads for Kiln, ONNX Runtime and OpenBLAS (default 2)")
    p.add_argument("--batch", type=int, default=1, help="the batch compiled and run (default 1)")
    p.add_argument("--runs", type=int, default=None,
                   help="timed rounds per arch (default: as many as fit in --budget seconds, 5 to 200)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds per arch (default 3)")
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timed rounds per arch without --runs")
    p.add_argument("--rtol", type=float, default=1e-3, help="error relative to the output's scale allowed (1e-3)")
    p.add_argument("--atol", type=float, default=1e-4, help="abs error allowed whatever the scale (1e-4)")
    p.add_argument("--json", metavar="FILE", help="also write every result to FILE")
    args = p.parse_args(argv)

    names = [m.strip() for m in args.models.split(",") if m.strip()] or list(archs.ARCHS)
    unknown = [n for n in names if n not in archs.ARCHS]
    if unknown:
        p.error(f"unknown arch(s) {', '.join(unknown)}; archs: {', '.join(archs.ARCHS)}")
    if args.threads < 1 or args.batch < 1 or (args.runs is not None and args.runs < 1):
        p.error("--threads, --batch and --runs must be at least 1")

    started = datetime.datetime.now(datetime.timezone.utc)
    results, failed = [], 0
    for name in names:
        print(f"[archs] {name}", file=sys.stderr, flush=True)
        r: dict = {"arch": name}
        try:
            survey(r, args.threads, args.batch, args.runs, args.warmup, args.budget, args.rtol, args.atol)
        except Exception as e:  # noqa: BLE001 - report it and go on with the others
            failed += 1
            traceback.print_exc()
            r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        results.append(r)
        print(markdown([row(r)]).splitlines()[-1], file=sys.stderr, flush=True)

    ratios = [r["kiln_over_ort"] for r in results if "kiln_over_ort" in r]
    gm = geomean(ratios)
    text = "\n".join([
        f"# Kiln vs ONNX Runtime on real architectures, {args.threads} thread{'s' if args.threads != 1 else ''}, "
        f"batch {args.batch}",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, Kiln {git_commit()}, {cpu_name()}. Median latency over interleaved "
        "rounds; Kiln/ORT below 1: Kiln is faster. Errors: max abs difference of Kiln's outputs.",
        "",
        markdown([row(r) for r in results]),
        "",
        f"Geometric mean Kiln/ORT over {len(ratios)} arch(s): {gm:.2f}" if gm else "No arch was timed.",
    ])
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"started": started.isoformat(), "commit": git_commit(), "threads": args.threads,
                       "batch": args.batch, "cpu": cpu_name(), "geomean_kiln_over_ort": gm, "results": results},
                      f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
