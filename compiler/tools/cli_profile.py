"""``kiln profile`` and ``kiln summary``."""
from __future__ import annotations

import argparse
import json

from ..errors import KilnError

PROFILE_HELP = ("time every kernel of a model over N runs, against this machine's roofline (and write a "
                "Chrome trace)")
SUMMARY_HELP = "parameters, FLOPs, activation memory and op mix per layer, without running the model"


def add_commands(sub, parse_shape, parse_input) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("profile", help=PROFILE_HELP, formatter_class=fmt,
                       description="Compile MODEL with a clock read after every kernel (or load an ARTIFACT "
                                   "compiled with `kiln compile --profile`), run it --runs times on random (or "
                                   "given) inputs, and print each kernel's median time, min-max, share, "
                                   "GFLOP/s, GB/s and %% of the roofline (this machine's measured sgemm peak "
                                   "and copy bandwidth, measured once and cached). The kernel times add up "
                                   "to the native part of the latency; 'other' is the rest (interpreted "
                                   "steps, output copies, the call). See docs/profiling.md.",
                       epilog="examples:\n  kiln profile zoo:bert --runs 50\n"
                              "  kiln profile light:resnet50 --trace trace.json   # chrome://tracing, ui.perfetto.dev\n"
                              "  kiln profile light:resnet50 --html report.html    # one page, opens offline\n"
                              "  kiln compile m.onnx -o m.kiln --profile && kiln profile m.kiln --json\n"
                              "  kiln profile zoo:resnet --target cuda            # GPU times from CUDA events")
    p.add_argument("model", metavar="ARTIFACT|MODEL")
    p.add_argument("--runs", type=int, default=20, help="timed runs (default 20), after 3 untimed ones")
    p.add_argument("--top", type=int, default=25, help="kernels listed, slowest first (default 25; 0: all)")
    p.add_argument("--trace", metavar="TRACE.json", help="write the runs as a Chrome trace / Perfetto JSON file")
    p.add_argument("--html", metavar="REPORT.html",
                   help="write a self-contained report page: model summary, passes with their IR, the fused "
                        "kernels drawn, the memory plan, the kernel table, roofline plot and timeline")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument("--input", "-i", action="append", type=parse_input, default=[], metavar="NAME=FILE.npy",
                   help="an input from a .npy file (repeatable; the others are random)")
    p.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=1x3x224x224",
                   help="give a symbolic input dimension a size (models only)")
    p.add_argument("-O", dest="opt_level", type=int, default=2, choices=[0, 1, 2, 3], help="optimization level")
    p.add_argument("--threads", type=int, default=None, help="threads for native code (default: all CPUs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--target", choices=["cuda"], default=None,
                   help="compile the model for an NVIDIA GPU (docs/cuda.md) and time each kernel with CUDA "
                        "events (a CUDA artifact is timed so as it is; default: this machine's CPU)")
    p.set_defaults(func=cmd_profile)

    s = sub.add_parser("summary", help=SUMMARY_HELP, formatter_class=fmt,
                       description="Read MODEL (no compile, no run) and print its parameters, FLOPs (a "
                                   "multiply-add is 2), activation memory and op mix: per name scope as a "
                                   "tree (--depth levels), per op type, and in all.",
                       epilog="examples:\n  kiln summary zoo:resnet\n  kiln summary model.onnx --depth 3 --json")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--depth", type=int, default=2, help="levels of name scopes in the tree (default 2)")
    s.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=1x3x224x224",
                   help="give a symbolic input dimension a size (its FLOPs are counted as 0 otherwise)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON (every node too)")
    s.set_defaults(func=cmd_summary)


def cmd_profile(args) -> int:
    from .. import compile, load
    from ..profiling import profile
    from .cli_compile import _is_artifact, artifact_feeds, model_feeds, read_input

    import sys

    from ..profiling import CompileRecord

    given = {name: read_input(name, path) for name, path in args.input}
    compile_seconds, record, summary = None, None, None
    if _is_artifact(args.model):
        if args.input_shape:
            raise KilnError("--input-shape applies to models; an artifact has its input shapes")
        if args.target:
            raise KilnError("--target applies to models; an artifact has its target")
        exe = load(args.model, args.threads)
        feeds = artifact_feeds(exe, given, args.seed)
    elif args.target == "cuda":
        model, feeds, shapes = model_feeds(args.model, args.input_shape, given, args.seed)
        exe = compile(model, args.opt_level, shapes, target="cuda", model_name=args.model, progress=sys.stderr.isatty())
    else:
        model, feeds, shapes = model_feeds(args.model, args.input_shape, given, args.seed)
        timings: dict = {}
        record = CompileRecord() if args.html else None
        exe = compile(model, args.opt_level, shapes, nthreads=args.threads, model_name=args.model, profile=True,
                      timings=timings, record=record, progress=sys.stderr.isatty())
        compile_seconds = {k: v for k, v in timings.items() if k != "total"}
        if args.html:
            from ..models import load_graph
            from .summary import summarize_graph

            summary = summarize_graph(load_graph(model, shapes or None))
    from ..runtime.cuda import CudaExecutable
    if args.html and isinstance(exe, CudaExecutable):
        raise KilnError("--html reports CPU profiles only; for a CUDA artifact: the table, --json or --trace")
    prof = profile(exe, feeds, runs=args.runs)
    if args.trace:
        with open(args.trace, "w", encoding="utf-8") as f:
            json.dump(prof.chrome_trace(compile_seconds), f)
    if args.html:
        from .report import report_html

        with open(args.html, "w", encoding="utf-8") as f:
            f.write(report_html(prof, record, summary, title=args.model))
    if args.json:
        print(json.dumps(prof.to_json(), indent=1))
    else:
        print(prof.table(args.top or None))
        if args.trace:
            print(f"wrote {args.trace} (open it in chrome://tracing or ui.perfetto.dev)")
        if args.html:
            print(f"wrote {args.html} (open it in a browser; it needs no network)")
    return 0


def cmd_summary(args) -> int:
    from ..models import load_graph
    from .summary import render, summarize_graph, to_json
    from .spec import model_of

    if args.depth < 1:
        raise KilnError(f"--depth must be at least 1, got {args.depth}")
    graph = load_graph(model_of(args.model), dict(args.input_shape) or None)
    s = summarize_graph(graph)
    print(to_json(s, args.depth) if args.json else render(s, args.depth))
    return 0


__all__ = ["add_commands"]
