"""The ``kiln`` command line."""
from __future__ import annotations

import argparse
import sys
import textwrap

import numpy as np

from ..errors import KilnError

DUMP_EPILOG = """\
examples:
  kiln dump light:resnet50                          # the IR after the -O2 pipeline
  kiln dump light:resnet50 -O0                      # just imported (and shapes inferred)
  kiln dump model.onnx --print-after fold-batchnorm # one stage on stdout
  kiln dump model.onnx --print-after-all --dump-dir stages/   # stages/NN-<pass>.kir + summary.txt
  kiln dump model.onnx --dump-dir stages/ --format dot        # Graphviz per stage (SVG with graphviz)
  kiln dump model.onnx --check                      # which pass changes the outputs?
  kiln dump light:resnet50 --memory-plan plan.svg   # the arena plan: offset x schedule step
  kiln run stages/05-fold-batchnorm.kir             # run one dumped stage
"""

EPILOG = """\
models:
  MODEL is an ONNX file (model.onnx), a saved torch.export program (model.pt2), a Kiln IR text file (stage.kir), light:NAME for one of the
  ONNX model-zoo networks shipped inside the onnx package (light:squeezenet, light:resnet50, ...), or
  zoo:NAME[?key=value,...] for a model Kiln builds with PyTorch (zoo:mlp?batch=64, zoo:bert?seq=128,
  zoo:mobilenetv2?resolution=224, zoo:efficientnet_block).

examples:
  kiln run light:squeezenet                        # compile (temporary artifact) and run natively
  kiln run light:squeezenet --interpret            # the reference interpreter instead
  kiln compile light:resnet50 -o resnet50.kiln     # a native artifact
  kiln run resnet50.kiln --input data_0=x.npy --output out.npz
  kiln inspect resnet50.kiln
  kiln run model.onnx --input-shape x=1x3x224x224
  kiln dump light:resnet50 --format text > resnet50.kir
"""


def parse_shape(text: str) -> tuple[str, tuple[int | str, ...]]:
    """NAME=1x3x224x224 (a dimension may stay symbolic: NAME=Nx3x224x224)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=DIMS like x=1x3x224x224, got {text!r}")
    name, dims = text.split("=", 1)
    out = []
    for d in dims.lower().split("x") if dims else []:
        out.append(int(d) if d.isdigit() else d)
    return name, tuple(out)


def parse_input(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got {text!r}")
    name, path = text.split("=", 1)
    return name, path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln",
        description="Kiln, a deep-learning graph compiler: import a model into Kiln's SSA graph IR, compile it to "
                    "native code, run it, and inspect what the compiler did.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from .. import __version__

    p.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    from .cli_compile import add_commands

    add_commands(sub, parse_shape, parse_input, EPILOG)
    from .cli_devices import add_commands as add_device_commands

    add_device_commands(sub)
    from .cli_profile import add_commands as add_profile_commands

    add_profile_commands(sub, parse_shape, parse_input)
    from . import bench

    b = sub.add_parser("bench", help="measure a compiled model against ONNX Runtime, OpenVINO and PyTorch in one run",
                       description=bench.__doc__.strip().splitlines()[0] if bench.__doc__ else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(b)
    b.set_defaults(func=bench.run)

    d = sub.add_parser(
        "dump", help="run the pass pipeline and show the IR of any or every stage",
        description="Import MODEL, run the pass pipeline for -O N and print the final IR (text format, see "
                    "docs/ir.md); or print/dump every stage, and check which pass changes the numbers.",
        epilog=DUMP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("model", metavar="MODEL")
    d.add_argument("-O", dest="opt_level", type=int, default=2, choices=[0, 1, 2, 3],
                   help="optimization level of the pipeline (default 2)")
    d.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=1x3x224x224",
                   help="give a symbolic input dimension a size")
    d.add_argument("--format", choices=["text", "dot", "onnx"], default="text",
                   help="format of the stages written with --dump-dir or -o (default: text; dot renders SVG "
                        "too when Graphviz is installed; onnx files run in ONNX Runtime)")
    d.add_argument("--print-after-all", action="store_true", help="print the IR after every pass")
    d.add_argument("--print-after", action="append", default=[], metavar="PASS",
                   help="print the IR after this pass (repeatable)")
    d.add_argument("--only-if-changed", action="store_true", help="with --print-after*: skip passes that changed nothing")
    d.add_argument("--dump-dir", metavar="DIR",
                   help="write DIR/00-input.kir, DIR/NN-<pass>.kir for every pass, and DIR/summary.txt")
    d.add_argument("--check", action="store_true",
                   help="run the reference interpreter on random inputs after every pass and name the first "
                        "pass whose outputs differ beyond tolerance (exit status 1 if one does)")
    d.add_argument("--rtol", type=float, default=1e-4,
                   help="--check tolerance: max abs error relative to each output's scale (default 1e-4)")
    d.add_argument("--seed", type=int, default=0, help="seed of --check's random inputs")
    d.add_argument("--disable-pass", action="append", default=[], metavar="PASS", help="skip this pass")
    d.add_argument("--extra-pass", action="append", default=[], metavar="MODULE:CLASS",
                   help="append your own Pass subclass to the pipeline (for developing passes)")
    d.add_argument("--verify", action="store_true", help="run the IR verifier after every pass")
    d.add_argument("--json", action="store_true", help="print the pass summary (and --check report) as JSON")
    d.add_argument("--list-passes", action="store_true", help="list the passes of -O N and exit")
    d.add_argument("--quantize", choices=["int8", "int8-dynamic"], default=None,
                   help="add the quantize pass (as `kiln compile --quantize`; int8 needs --calibration)")
    d.add_argument("--calibration", metavar="DIR", default=None,
                   help="samples for --quantize int8 (a directory of .npz/.npy files, as `kiln compile`)")
    d.add_argument("--explain-fusion", action="store_true",
                   help="say, for each pair of adjacent ops, whether the fuse pass put them in one kernel and "
                        "why not (pattern, shared producer, cycle, limit)")
    d.add_argument("--kernels", action="store_true",
                   help="print each kernel of the final IR: its lowering and, where the lowering is built on the "
                        "loop form, the kernel in that form (buffers, loops, scalar expressions)")
    d.add_argument("--output", "-o", metavar="FILE", help="write the final IR here instead of printing it")
    d.add_argument("--memory-plan", metavar="FILE.svg",
                   help="build the program (no LLVM compile) and draw its arena plan, offset x schedule step, "
                        "as an SVG (docs/memory.md)")
    from .cli_devices import add_device_arguments

    add_device_arguments(d, with_parallel=False)
    d.set_defaults(func=cmd_dump)
    return p


def random_inputs(graph, given: dict, seed: int = 0, notes=None) -> dict:
    """Seeded random arrays for the graph inputs not in ``given`` (symbolic dimensions become 1; a
    sequence input gets its known length, or 2 elements)."""
    from .feeds import DEFAULT_HIGH, index_limits, random_array
    from ..ir.types import OptionalType, SequenceType, TensorType

    rng = np.random.default_rng(seed)
    feeds = dict(given)
    highs = index_limits(graph)
    for v in graph.inputs:
        if v.name in feeds:
            continue
        t = v.type.elem if isinstance(v.type, OptionalType) else v.type
        if isinstance(t, SequenceType):
            if t.elem_shape is None:
                raise KilnError(f"input {v.name!r} is a sequence of elements of unknown rank ({v.type}); "
                                "give it with --input")
            elem = TensorType(t.dtype, t.elem_shape)
            n = t.length if t.length is not None else 2
            feeds[v.name] = [random_array(rng, v.name, elem, notes) for _ in range(n)]
            continue
        feeds[v.name] = random_array(rng, v.name, t, notes, highs.get(v.name, DEFAULT_HIGH))
    return feeds


def describe_array(name: str, a: np.ndarray) -> str:
    lines = [f"{name}: {a.dtype}{list(a.shape)}"]
    if a.size and a.dtype.kind in "fiub":
        f = a.astype(np.float64)
        lines.append(f"  min {f.min():.6g}  max {f.max():.6g}  mean {f.mean():.6g}")
        scores = f.reshape(-1) if a.ndim >= 2 and a.shape[0] == 1 and a.size == a.shape[1] else None
        if scores is not None and scores.size >= 10 and a.dtype.kind == "f":  # a classifier's scores
            top = np.argsort(-scores, kind="stable")[:5]
            lines.append("  top-5 " + ", ".join(f"[{i}] {scores[i]:.5g}" for i in top))
    with np.printoptions(precision=5, threshold=12, edgeitems=3, linewidth=100):
        lines.append(textwrap.indent(np.array2string(a.ravel() if a.ndim > 2 else a), "  "))
    return "\n".join(lines)


def load_pass(spec: str):
    import importlib
    import os

    from ..passes.manager import Pass

    if ":" not in spec:
        raise KilnError(f"--extra-pass wants MODULE:CLASS, got {spec!r}")
    mod, cls = spec.split(":", 1)
    if os.getcwd() not in sys.path:  # as `python -m` does: modules of the current directory load
        sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise KilnError(f"cannot load pass {spec!r}: {e}") from None
    p = obj() if isinstance(obj, type) else obj
    if not isinstance(p, Pass):
        raise KilnError(f"{spec} is not a compiler.passes.manager.Pass")
    return p


def explain_fusion(passes) -> None:
    """Every pair of adjacent nodes the fusion pass looked at: fused, or why not."""
    from ..passes.fuse import FuseKernels

    fuse = next((p for p in passes if isinstance(p, FuseKernels)), None)
    if fuse is None:
        raise KilnError("--explain-fusion: the pipeline has no fuse pass (it runs at -O2 and -O3; was it disabled?)")
    fused = [d for d in fuse.decisions if d.fused]
    refused = [d for d in fuse.decisions if not d.fused]
    print(f"fusion: {len(fused)} pair(s) fused, {len(refused)} adjacent pair(s) left apart")
    for d in fuse.decisions:
        print(("  fused      " if d.fused else "  not fused  ") + d.text().split(": ", 1)[0] + ": " + d.reason)
    canon = [p for p in passes if p.name == "canonicalize"]  # the last one's: the final graph's
    misses = list(getattr(canon[-1], "near_misses", ())) if canon else []
    if misses:  # decomposed layer norms and GELUs that did not become the op (canonicalize)
        print(f"patterns: {len(misses)} near miss(es) of a decomposed LayerNorm or GELU")
        for m in misses:
            where = m.node.op.name + (f" {m.node.name}" if m.node.name else "")
            print(f"  not matched {m.rule} at {where}: {m.reason}")


def cmd_dump(args) -> int:
    import json
    import os

    from ..codegen.fusion import CPU_FUSION
    from ..ir.printer import print_graph, save_text
    from ..models import load_graph
    from ..passes.instruments import CheckNumerics, DumpIR, write_summary
    from ..passes.manager import PassManager, PrintAfter
    from ..passes.options import CompileOptions
    from ..passes.pipeline import pipeline
    from .spec import model_of

    shapes = dict(args.input_shape)
    opts = CompileOptions.make(opt_level=args.opt_level, disabled_passes=tuple(args.disable_pass),
                               verify=args.verify, quantize=args.quantize)
    calibrate = None
    if args.calibration:
        from ..calibration import calibrator, read_samples

        calibrate = calibrator(read_samples(args.calibration))
    specs = ()
    if args.devices is not None:
        from ..devices import DeviceOptions, device_specs

        specs = device_specs(DeviceOptions.make(args.devices, dict(args.device_memory), "pipeline"))
    elif args.device_memory:
        raise KilnError("--device-memory goes with --devices")
    passes = pipeline(opts, CPU_FUSION, calibrate, devices=specs) + [load_pass(s) for s in args.extra_pass]
    if args.list_passes:
        for i, p in enumerate(passes, start=1):
            doc = (type(p).__doc__ or "").strip().splitlines()
            print(f"{i:02d} {p.name:<34} {doc[0] if doc else ''}")
        return 0
    graph = load_graph(model_of(args.model), shapes or None)
    instruments = []
    if args.print_after_all or args.print_after:
        known = {p.name for p in passes}
        bad = sorted(set(args.print_after) - known)
        if bad:
            raise KilnError(f"--print-after: unknown pass(es) {', '.join(bad)}; passes: {', '.join(sorted(known))}")
        instruments.append(PrintAfter("all" if args.print_after_all else args.print_after, args.only_if_changed))
    dumper = DumpIR(args.dump_dir, args.format, _onnx_exporter(args.format)) if args.dump_dir else None
    if dumper:
        instruments.append(dumper)
    checker = CheckNumerics(random_inputs(graph, {}, args.seed), rtol=args.rtol) if args.check else None
    if checker:
        instruments.append(checker)
    result = PassManager(passes, instruments, opts).run(graph)
    if dumper:
        write_summary(args.dump_dir, result)
        if args.json:
            write_summary(args.dump_dir, result, as_json=True)
        print(f"wrote {len(dumper.files)} stages and summary.txt to {args.dump_dir}", file=sys.stderr)
    if args.output:
        if args.format == "text":
            save_text(graph, args.output)
        else:
            DumpIR(os.path.dirname(os.path.abspath(args.output)) or ".", args.format,
                   _onnx_exporter(args.format)).write(0, "final", graph)
        print(f"wrote {args.output}", file=sys.stderr)
    if args.memory_plan:
        write_memory_plan(graph, args.memory_plan, args.model)
    if args.explain_fusion:
        explain_fusion(passes)
    if specs:
        split = next(p for p in passes if p.name == "split-devices")
        print(split.explain(), file=sys.stderr)
        if args.explain_placement:
            print(split.explain_cuts())
        if args.partition:
            from .partition_svg import partition_svg

            with open(args.partition, "w", encoding="utf-8") as f:
                f.write(partition_svg(graph, f"{args.model} on {', '.join(s.name for s in specs)}"))
            print(f"wrote {args.partition}", file=sys.stderr)
    elif args.partition or args.explain_placement:
        raise KilnError("--partition and --explain-placement go with --devices")
    if args.kernels:
        print_kernels(graph)
    if args.json:
        doc = {"passes": result.to_json()}
        if checker:
            doc["check"] = checker.report.to_json()
        print(json.dumps(doc, indent=2))
    else:
        if not (args.print_after_all or args.print_after or args.output or args.dump_dir or checker
                or args.memory_plan or args.explain_fusion or args.kernels or args.partition
                or args.explain_placement):
            sys.stdout.write(print_graph(graph))
        if args.dump_dir or checker:
            print(result.summary())
        if checker:
            print(checker.report.text())
    return 1 if checker and checker.report.first_bad else 0


def print_kernels(graph) -> None:
    """``--kernels``: each kernel group of the final IR with its lowering and loop form."""
    from ..codegen.program import kernel_forms

    for i, (group, lowering, form) in enumerate(kernel_forms(graph)):
        print(f"# kernel {i}: {group.describe()} -> {lowering}")
        print(f"  ({form})" if isinstance(form, str) else form)
        print()


def _onnx_exporter(fmt: str):
    """The frontend's exporter for ``DumpIR`` when stages are written as ONNX (else None)."""
    if fmt != "onnx":
        return None
    from frontends.onnx import export_model

    return export_model


def write_memory_plan(graph, path: str, title: str) -> dict:
    """Build ``graph``'s program for this CPU and write its arena plan as an SVG; returns the figures."""
    from ..codegen.llvm.target import host_target
    from ..codegen.plan import plan_svg
    from ..codegen.program import build_program

    prog = build_program(graph, host_target())
    figures = prog.memory_summary()
    with open(path, "w", encoding="utf-8") as f:
        f.write(plan_svg(prog.buffers, prog.arena_bytes, figures, title=title))
    lb = figures["lower_bound_bytes"]
    print(f"wrote {path}: {len(prog.buffers)} buffers, arena {figures['arena_bytes']} B = "
          f"{figures['arena_over_lower_bound']:.3f} x lower bound {lb} B, naive {figures['naive_bytes']} B",
          file=sys.stderr)
    return figures


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..ir.interpreter import InputError, InterpreterError

    try:
        return args.func(args)
    except (KilnError, InputError, InterpreterError) as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # ParseError / VerifyError and op errors are ValueErrors with clear messages
        print(f"kiln: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
