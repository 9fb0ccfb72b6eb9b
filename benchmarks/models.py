"""Kiln against ONNX Runtime, OpenVINO and PyTorch on the model suite: one ``bench_model`` per model.

    python benchmarks/models.py                      # every model, all CPUs, automatic rounds
    python benchmarks/models.py --threads 2 --runs 30 --out benchmarks/results
    python benchmarks/models.py --only mlp,bert      # models whose spec contains one of these

Writes OUT/models-<N>t.md (a Markdown table) and OUT/models-<N>t.json (every ``bench_model`` result)
and prints the table. A model that fails (compile error, numbers that disagree) is reported in
its row and the script exits with status 1 after the others ran. See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from compiler.tools.bench import bench_model, cpu_name, human_bytes, isa_family  # noqa: E402
from compiler.runtime.executable import default_threads  # noqa: E402

# (label, spec): ONNX model-zoo networks (light: placeholder weights, 224x224, batch 1) and PyTorch-built ones
SUITE = [
    ("resnet50", "light:resnet50"),
    ("squeezenet", "light:squeezenet"),
    ("shufflenet", "light:shufflenet"),
    ("inception_v1", "light:inception_v1"),
    ("densenet121", "light:densenet121"),
    ("bert (seq 128)", "zoo:bert?seq=128"),
    ("mobilenetv2 (224)", "zoo:mobilenetv2?resolution=224"),
    ("mlp (batch 1)", "zoo:mlp?batch=1"),
    ("mlp (batch 64)", "zoo:mlp?batch=64"),
]
PEERS = ("onnxruntime", "openvino", "torch")
#: the peers "Kiln/best" compares with: the faster of the ONNX runtimes on each model
RUNTIMES = ("onnxruntime", "openvino")


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def _ms(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def row(label: str, r: dict) -> list[str]:
    if "error" in r:
        return [label, f"**failed**: {r['error']}"] + [""] * (len(HEADER) - 2)
    e, k = r["engines"], r["kiln"]
    peak = r["peak_fraction"]
    fb = str(k["fallback_nodes"]) + (f" ({', '.join(k['fallback_ops'])})" if k["fallback_ops"] else "")
    return [
        label,
        _ms(e["kiln"]["median_ms"]),
        *[_ms(e[p]["median_ms"]) if p in e else "-" for p in PEERS],
        *[f"{r['ratios'][p]:.2f}" if p in r["ratios"] else "-" for p in PEERS],
        f"{best_ratio(r):.2f}" if best_ratio(r) else "-",
        f"{k['flops'] / 1e9:.3g}",
        f"{r['gflops']:.1f}" if r["gflops"] else "-",
        f"{100 * peak:.0f}%" if peak else "-",
        f"{k['compile_seconds']:.1f}",
        human_bytes(k["artifact_bytes"]),
        str(k["kernels"]),
        fb,
    ]


HEADER = ["model", "Kiln ms", "ORT ms", "OpenVINO ms", "torch ms", "Kiln/ORT", "Kiln/OpenVINO", "Kiln/torch",
          "Kiln/best", "GFLOP", "Kiln GFLOP/s", "% sgemm peak", "compile s", "artifact", "kernels", "fallback nodes"]


def best_ratio(r: dict) -> float | None:
    """Kiln's median over the faster of ONNX Runtime and OpenVINO on this model (None: neither ran)."""
    ratios = [r["ratios"][p] for p in RUNTIMES if p in r.get("ratios", {})]
    return max(ratios) if ratios else None


def geomeans(results: list[dict]) -> str:
    """The geometric mean of each ratio column over the models where it was measured."""
    parts = []
    for label, get in [("Kiln/ORT", lambda r: r["ratios"].get("onnxruntime")),
                       ("Kiln/OpenVINO", lambda r: r["ratios"].get("openvino")),
                       ("Kiln/best", best_ratio)]:
        vals = [v for r in results if "ratios" in r for v in [get(r)] if v]
        if vals:
            parts.append(f"{label} {math.exp(sum(math.log(v) for v in vals) / len(vals)):.2f} over {len(vals)}")
    return "Geometric means: " + ", ".join(parts) + "." if parts else ""


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=None, help="threads for every engine (default: all CPUs)")
    p.add_argument("--runs", type=int, default=None,
                   help="timed rounds per model (default: as many as fit in --budget seconds, 5 to 200)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds per model (default 3)")
    p.add_argument("--budget", type=float, default=10.0, help="seconds of timed rounds per model when --runs is "
                                                              "not given (default 10)")
    p.add_argument("--compare", default="onnxruntime,openvino,torch",
                   help="peers (default onnxruntime,openvino,torch; one not installed is skipped with a note)")
    p.add_argument("--only", default="", help="comma-separated substrings: run only the models whose label or "
                                              "spec contains one")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"), help="output directory")
    p.add_argument("--sgemm-size", type=int, default=2048, help="size of the sgemm peak measurement (default 2048)")
    args = p.parse_args(argv)

    threads = args.threads or default_threads()
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    suite = [(lab, spec) for lab, spec in SUITE if not wanted or any(w in lab or w in spec for w in wanted)]
    if not suite:
        p.error(f"--only {args.only!r} matches no model; models: {', '.join(s for _, s in SUITE)}")

    started = datetime.datetime.now(datetime.timezone.utc)
    results, rows, failed = [], [], 0
    for label, spec in suite:
        t0 = time.perf_counter()
        try:
            r = bench_model(spec, compare=args.compare, nthreads=threads, runs=args.runs, warmup=args.warmup,
                            budget=args.budget, sgemm_size=args.sgemm_size,
                            log=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
        except Exception as e:  # noqa: BLE001 - report it and go on with the others
            failed += 1
            traceback.print_exc()
            r = {"model": spec, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        r["label"], r["wall_seconds"] = label, time.perf_counter() - t0
        results.append(r)
        rows.append(row(label, r))
        print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)

    table = markdown(rows)
    head = [
        f"# Kiln vs ONNX Runtime, OpenVINO and PyTorch, {threads} thread{'s' if threads != 1 else ''}",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, Kiln {git_commit()}, {cpu_name()} ({isa_family()}). Median latency per "
        "engine over "
        "interleaved rounds (each round gives every engine a turn: untimed calls for 0.1 s, then 3 timed "
        "calls; rotating order), after warm-up. "
        "Kiln/X = Kiln's median / X's median: below 1, Kiln is faster; Kiln/best: against the faster of ONNX "
        "Runtime and OpenVINO. Only ratios from one run mean much.",
        "",
    ]
    peaks = [r["machine"]["sgemm"] for r in results if r.get("machine", {}).get("sgemm")]
    if peaks:
        def span(key):
            vals = [p[key] for p in peaks if p.get(key)]
            return f"{min(vals):.1f}-{max(vals):.1f}" if vals else "n/a"
        head += [f"sgemm peak ({args.sgemm_size}³ float32, {threads} threads, best of 3), measured right after each "
                 f"model: Kiln {span('kiln_gflops')} GFLOP/s, OpenBLAS {span('openblas_gflops')} GFLOP/s. "
                 "\"% sgemm peak\" is Kiln's GFLOP/s on the model over the faster of the two in its own "
                 "measurement.", ""]
    text = "\n".join(head) + "\n" + table + "\n"
    if geomeans(results):
        text += "\n" + geomeans(results) + "\n"
    notes = [(r["label"], n) for r in results for n in r.get("notes", [])]
    if notes:
        text += "\nNotes:\n\n" + "\n".join(f"- {label}: {n}" for label, n in notes) + "\n"
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"models-{threads}t")
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump({"started": started.isoformat(), "commit": git_commit(), "threads": threads, "cpu": cpu_name(),
                   "isa": isa_family(), "results": results}, f, indent=2)
    print(text)
    print(f"wrote {base}.md and {base}.json", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
