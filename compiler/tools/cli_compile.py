"""The ``kiln compile``, ``kiln run`` and ``kiln inspect`` commands: models to artifacts, and back."""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np

from ..errors import KilnError
from ..runtime.artifact import ArtifactError

COMPILE_EPILOG = """\
examples:
  kiln compile light:resnet50 -o resnet50.kiln          # -O2, for this CPU
  kiln compile model.onnx -o model.kiln --input-shape x=1x3x224x224
  kiln compile model.onnx -o model.kiln --strict        # refuse ops without native code
  kiln run resnet50.kiln --input data_0=x.npy --output out.npz
  kiln inspect resnet50.kiln [--json]

An artifact is a directory (manifest.json, model.so, weights.bin, model.kir); `kiln run` and
`compiler.load` use it without compiling anything. A failed compile leaves nothing at -o.
"""


def _shapes(pairs) -> dict:
    shapes = dict(pairs)
    for name, dims in shapes.items():
        if any(not isinstance(d, int) for d in dims):
            raise KilnError(f"--input-shape {name}: compiled models need every dimension as a number, got "
                            f"{'x'.join(str(d) for d in dims)}")
    return shapes


def add_commands(sub, parse_shape, parse_input, epilog: str) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    c = sub.add_parser("compile", help="compile a model to a native artifact (a model.kiln directory)",
                       description="Import MODEL, run the -O N pass pipeline, generate native code for this CPU "
                                   "(LLVM) and write the artifact OUT: manifest, shared library, weights and "
                                   "final IR. Nodes without native code run in the reference interpreter, with a "
                                   "warning (see `kiln inspect`), unless --strict.",
                       epilog=COMPILE_EPILOG, formatter_class=fmt)
    c.add_argument("model", metavar="MODEL")
    c.add_argument("-o", "--output", required=True, metavar="OUT.kiln", help="the artifact directory to write")
    c.add_argument("-O", dest="opt_level", type=int, default=2, choices=[0, 1, 2, 3],
                   help="optimization level (default 2)")
    c.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=1x3x224x224",
                   help="give the symbolic dimensions of an input sizes (repeat per input)")
    c.add_argument("--target", metavar="CPU|cuda", default=None,
                   help="generate code for another CPU (LLVM name: znver3, x86-64-v3, haswell, ...), or "
                        "'cuda' for an NVIDIA GPU through numba.cuda (docs/cuda.md); default: this machine's CPU")
    c.add_argument("--max-dim", action="append", type=parse_max_dim, default=[], metavar="NAME=N",
                   help="the largest size a symbolic input dimension may take at run time (repeatable); a model "
                        "with symbolic dimensions gets native code per size, compiled when the size is first run")
    c.add_argument("--no-specialize", action="store_true",
                   help="for a model with symbolic input dimensions: one compile, its nodes of symbolic shape "
                        "run in the interpreter (default: native code per size, compiled at first run)")
    c.add_argument("--strict", action="store_true",
                   help="fail if any node has no native code instead of running it in the interpreter")
    c.add_argument("--verify", action="store_true", help="run the IR verifier after every pass, and emit every kernel to check that kernels sharing one function are equal")
    c.add_argument("--profile", action="store_true",
                   help="read a clock after every kernel, for `kiln profile ARTIFACT` (a little slower)")
    c.add_argument("--disable-pass", action="append", default=[], metavar="PASS",
                   help="skip this pass (repeatable; e.g. --disable-pass fuse; see `kiln dump --list-passes`)")
    c.add_argument("--memory-limit", type=parse_size, default=None, metavar="SIZE",
                   help="refuse a model needing more memory than this (arena + weights, or any one value), "
                        "e.g. 512MiB, 8GiB (default: this machine's memory)")
    q = c.add_argument_group("int8 quantization", "MatMul/Gemm/Conv with constant weights computed in int8 (exact int32 "
                             "sums: AVX-512 VNNI, else vpmaddwd on AVX-512 BW or AVX2), rescaled to float after; see "
                             "docs/quantization.md")
    q.add_argument("--quantize", choices=["int8", "int8-dynamic"], default=None,
                   help="int8: activation ranges measured on --calibration data; int8-dynamic: from each run's "
                        "own inputs (no calibration; the usual choice for transformers)")
    q.add_argument("--calibration", metavar="DIR", default=None,
                   help="samples for --quantize int8: a directory of .npz files (an array per input name) or, "
                        "for a one-input model, .npy files; one sample per file")
    q.add_argument("--calibrator", choices=["minmax", "percentile", "entropy"], default="minmax",
                   help="how a range is measured from the samples: minmax (default) the extremes seen; percentile "
                        "all but the outer (100 - P) percent; entropy the clipping closest in KL divergence")
    q.add_argument("--percentile", type=float, default=99.999, metavar="P",
                   help="the percentile calibrator's share of elements kept, in percent (default 99.999)")
    q.add_argument("--per-channel", action="store_true", help="one weight scale per output column (default: per tensor)")
    q.add_argument("--symmetric", action="store_true",
                   help="activations as int8 with zero point 0 (default: uint8 with a zero point)")
    q.add_argument("--exclude", action="append", default=[], metavar="NODE|OP",
                   help="keep this node (by name) or every node of this op in float (repeatable)")
    q.add_argument("--accuracy-budget", type=float, default=None, metavar="X",
                   help="keep the layers whose quantization costs most in float until the model output's "
                        "1 - cosine similarity with float, on the --calibration data, is at most X (e.g. 0.001); "
                        "see `kiln quantize-report`")
    from .cli_devices import add_device_arguments

    add_device_arguments(c)
    c.add_argument("--json", action="store_true", help="print the compile summary as JSON")
    c.set_defaults(func=cmd_compile)

    qr = sub.add_parser("quantize-report", help="int8 against float, layer by layer: which layer loses accuracy",
                        description="Quantize MODEL (as `kiln compile --quantize`) and run it beside the float "
                                    "model on the calibration samples, natively. For every quantized layer: its "
                                    "result's SQNR, cosine similarity and largest error against float (in the "
                                    "all-int8 model), and the model output's SQNR and cosine when only that layer "
                                    "is quantized; ranked, the most costly first. With --accuracy-budget, also "
                                    "which layers to keep in float to meet it.",
                        formatter_class=fmt)
    qr.add_argument("model", metavar="MODEL")
    qr.add_argument("--calibration", metavar="DIR", required=True,
                    help="samples (a directory of .npz/.npy files, as `kiln compile --calibration`)")
    qr.add_argument("--quantize", choices=["int8", "int8-dynamic"], default="int8", help="the mode (default int8)")
    qr.add_argument("--calibrator", choices=["minmax", "percentile", "entropy"], default="minmax",
                    help="how a range is measured from the samples (as `kiln compile --calibrator`)")
    qr.add_argument("--percentile", type=float, default=99.999, metavar="P",
                    help="the percentile calibrator's share of elements kept (default 99.999)")
    qr.add_argument("--per-channel", action="store_true", help="one weight scale per output column")
    qr.add_argument("--symmetric", action="store_true", help="activations as int8 with zero point 0")
    qr.add_argument("--exclude", action="append", default=[], metavar="NODE|OP", help="keep in float (repeatable)")
    qr.add_argument("--accuracy-budget", type=float, default=None, metavar="X",
                    help="also find the layers to keep in float for 1 - cosine of the output to be at most X")
    qr.add_argument("-O", dest="opt_level", type=int, default=2, choices=[0, 1, 2, 3],
                    help="optimization level (default 2)")
    qr.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=1x3x224x224",
                    help="give the symbolic dimensions of an input sizes (repeat per input)")
    qr.add_argument("--json", action="store_true", help="print the report as JSON")
    qr.set_defaults(func=cmd_quantize_report)

    r = sub.add_parser("run", help="run a model or a compiled artifact and print its outputs",
                       description="Run ARTIFACT (a directory written by `kiln compile`) or MODEL (compiled first, "
                                   "in a temporary directory; or run in the reference interpreter with "
                                   "--interpret) on the given inputs (random ones, seeded, of the right shape "
                                   "and dtype, for inputs not given) and print each output's shape, dtype and "
                                   "values.", epilog=epilog, formatter_class=fmt)
    r.add_argument("model", metavar="ARTIFACT|MODEL")
    r.add_argument("--input", "-i", action="append", type=parse_input, default=[], metavar="NAME=FILE.npy",
                   help="an input from a .npy file, or an .npz holding one array (NAME=FILE.npz:KEY picks "
                        "one of several); repeat for several inputs")
    r.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=1x3x224x224",
                   help="give a symbolic input dimension a size (models only)")
    r.add_argument("--output", "-o", metavar="OUT.npz", help="also save all outputs to a .npz file")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    r.add_argument("-O", dest="opt_level", type=int, default=2, choices=[0, 1, 2, 3],
                   help="optimization level when MODEL is compiled (default 2)")
    r.add_argument("--interpret", action="store_true",
                   help="run MODEL in the reference interpreter instead of compiling it")
    r.add_argument("--threads", type=int, default=None, help="threads for native code (default: all CPUs)")
    r.add_argument("--no-cache", action="store_true",
                   help="compile MODEL afresh (default: reuse the artifact of an earlier `kiln run` of the same "
                        "model bytes, options, CPU and Kiln sources, from ~/.cache/kiln/artifacts, and the "
                        "object code of parts compiled before, from ~/.cache/kiln/objects)")
    r.add_argument("--cluster", metavar="ray|ray://HOST:PORT", default=None,
                   help="run a multi-device artifact's parts as Ray actors: 'ray' joins RAY_ADDRESS's cluster or "
                        "starts a local one, ray://HOST:PORT a remote one (needs pip install 'kiln[distributed]'; "
                        "docs/devices.md)")
    r.set_defaults(func=cmd_run)

    i = sub.add_parser("inspect", help="show what a compiled artifact holds",
                       description="Print an artifact's signature, target, kernels (with the ops each computes, "
                                   "FLOPs and bytes), memory (weights, arena against its lower bound) and the "
                                   "nodes that run in the reference interpreter, with the reason.",
                       formatter_class=fmt)
    i.add_argument("artifact", metavar="ARTIFACT")
    i.add_argument("--json", action="store_true", help="print it as JSON")
    i.add_argument("--kernels", action="store_true", help="list every kernel (default: a summary by op)")
    i.add_argument("--gpu-times", action="store_true",
                   help="(CUDA artifacts) run it on random inputs and show each step's GPU time from CUDA events")
    i.set_defaults(func=cmd_inspect)


def _target(name):
    if not name:
        return None
    if name.lower() == "cuda":
        return "cuda"
    from ..codegen.llvm.target import target_for

    try:
        return target_for(name)
    except ValueError as e:
        raise KilnError(str(e)) from None


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``512MiB``, ``8G``, ``1000000`` -> bytes (binary units)."""
    import argparse
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size such as 512MiB or 8GiB, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def cmd_compile(args) -> int:
    from ..driver import FallbackWarning, compile
    from ..specialize import Specializing
    from .spec import model_of

    if _is_artifact(args.model):
        raise KilnError(f"{args.model} is a compiled Kiln artifact, not a model: run it with `kiln run "
                        f"{args.model}` (`kiln compile` takes a .onnx or .kir file, light:NAME or zoo:NAME)")
    _refuse_directory(args.model)
    timings: dict = {}
    quantize = None
    if args.quantize:
        from ..passes.quantize import QuantizeOptions

        quantize = QuantizeOptions(mode=args.quantize, calibrator=args.calibrator, percentile=args.percentile,
                                   per_channel=args.per_channel,
                                   symmetric=args.symmetric, exclude=tuple(args.exclude),
                                   accuracy_budget=args.accuracy_budget)
    elif args.calibration or args.per_channel or args.symmetric or args.exclude or args.accuracy_budget is not None:
        raise KilnError("--calibration, --per-channel, --symmetric, --exclude and --accuracy-budget go with "
                        "--quantize")
    from .cli_devices import device_options, report_compile

    devices = device_options(args)
    if devices is not None:
        exe = compile(model_of(args.model), args.opt_level, _shapes(args.input_shape), output=args.output,
                      target=_target(args.target), fallback=not args.strict, verify=args.verify, timings=timings,
                      disabled_passes=args.disable_pass, model_name=args.model, devices=devices,
                      memory_limit=args.memory_limit, quantize=quantize, profile=args.profile or None)
        return report_compile(args, exe, timings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        exe = compile(model_of(args.model), args.opt_level, _shapes(args.input_shape), output=args.output,
                      target=_target(args.target), fallback=not args.strict, verify=args.verify, timings=timings,
                      disabled_passes=args.disable_pass, memory_limit=args.memory_limit, model_name=args.model,
                      quantize=quantize, calibration=args.calibration, specialize=not args.no_specialize,
                      profile=args.profile, max_dims=dict(args.max_dim), progress=sys.stderr.isatty())
    if not hasattr(exe.manifest, "kernels"):  # a CUDA artifact
        return _report_cuda_compile(args, exe, caught, timings)
    summary = summarize(exe.manifest, args.output)
    summary["compile_seconds"] = {k: round(v, 3) for k, v in timings.items()}
    if isinstance(exe, Specializing):
        summary["specialize"] = exe.record()
    if exe.quantization is not None:
        summary["quantization"] = exe.quantization
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for w in caught:
            print(f"kiln: warning: {w.message}", file=sys.stderr)
        m = summary["memory"]
        print(f"compiled {args.model} -> {args.output} in {timings['total']:.2f} s "
              f"(passes {timings['passes']:.2f}, codegen {timings['codegen']:.2f}, "
              f"LLVM + link {timings['llvm_and_link']:.2f})")
        record = summary.get("specialize")
        if record is not None:
            print(f"  symbolic {_dims_line(record)}: native code is compiled per size when the size is first run "
                  f"(the generic compile below runs the nodes of symbolic shape in the interpreter)")
        print(f"  {summary['kernels']} kernel(s), {summary['views']} view(s), {len(summary['fallback'])} fallback node(s)")
        print(f"  {memory_line(m)}")
        if exe.quantization is not None:
            kept = exe.quantization["kept_in_float"]
            dw = len(exe.quantization.get("uint8_inputs", ()))
            print(f"  int8: {len(exe.quantization['quantized'])} layer(s) quantized"
                  + (f" ({dw} depthwise convolution(s) of them read uint8, computing in float)" if dw else "")
                  + f", {len(kept)} kept in float"
                  + "".join(f"\n    {name}: {why}" for name, why in kept.items()))
            b = exe.quantization.get("budget")
            if b is not None:
                print(f"  accuracy budget {b['budget']:g}: kept {len(b['kept_in_float'])} layer(s) in float, "
                      f"output cosine {b['output_cosine']:.6f} on the calibration data")
    return 0


def _report_cuda_compile(args, exe, caught, timings) -> int:
    m = exe.manifest
    summary = {"artifact": args.output, "model": m["model"], "target": m["target"], "launches": exe.launch_count,
               "kernels": len({k["kernel"] for k in m["kernels"]}), "fallback": m["fallback"], "memory": m["memory"],
               "compile_seconds": {k: round(v, 3) for k, v in timings.items()}}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    for w in caught:
        print(f"kiln: warning: {w.message}", file=sys.stderr)
    print(f"compiled {args.model} -> {args.output} for CUDA in {timings['total']:.2f} s (numba compiles each "
          f"kernel on the GPU at its first launch)")
    print(f"  {exe.launch_count} launch(es) of {summary['kernels']} kernel(s), {len(m['fallback'])} node(s) on the "
          f"host; weights {_mib(m['memory']['weights_bytes'])}, arena {_mib(m['memory']['arena_bytes'])}")
    return 0


def cmd_quantize_report(args) -> int:
    from ..passes.quantize import QuantizeOptions
    from ..quantize_report import quantize_report
    from .spec import model_of

    _refuse_directory(args.model)
    options = QuantizeOptions(mode=args.quantize, calibrator=args.calibrator, percentile=args.percentile,
                              per_channel=args.per_channel, symmetric=args.symmetric, exclude=tuple(args.exclude))
    report = quantize_report(model_of(args.model), args.calibration, options, opt_level=args.opt_level,
                             input_shapes=_shapes(args.input_shape), budget=args.accuracy_budget)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.text())
    return 0


def memory_line(mem: dict) -> str:
    """The memory figures in one line (docs/memory.md): arena against its lower bound and naive."""
    lb, arena, naive = mem["lower_bound_bytes"], mem["arena_bytes"], mem["naive_bytes"]
    over = f"{arena / lb:.3f}" if lb else "1.000"
    saved = f"{naive / arena:.1f}" if arena else "-"
    line = (f"weights {_mib(mem['weights_bytes'])} (mapped); arena {_mib(arena)} = {over} x lower bound "
            f"{_mib(lb)}; naive {_mib(naive)} = {saved} x arena (kernel scratch planned in the arena too: "
            f"{_mib(mem.get('scratch_bytes', 0))} over all kernels)")
    if "in_place" in mem:
        line += f"; {mem['in_place']} kernel(s) in place"
    return line


def summarize(manifest, path: str) -> dict:
    """What ``kiln compile`` reports of an artifact (a ``runtime.format.Manifest``) written to ``path``."""
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"artifact": path, "model": manifest.model, "kernels": len(manifest.kernels),
            "views": manifest.views, "fallback": manifest.fallback, "memory": manifest.memory,
            "artifact_bytes": size}


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**16 else f"{n} B"


def _is_artifact(path: str) -> bool:
    """A directory with a manifest (whether it loads is for ``read_manifest`` to say)."""
    return os.path.isdir(path) and any(os.path.lexists(os.path.join(path, f))
                                       for f in ("manifest.json", "cuda.json", "devices.json"))


def _refuse_directory(path: str) -> None:
    """A model is a file: a directory that is not an artifact gets an error saying so."""
    if os.path.isdir(path):
        raise ArtifactError(f"{path} is a directory but not a Kiln artifact (it has no manifest.json); give a "
                            f"model file (.onnx, .kir), light:NAME, zoo:NAME, or an artifact written by "
                            f"`kiln compile`")


def read_input(name: str, spec: str) -> np.ndarray:
    """``--input NAME=FILE.npy``, ``NAME=FILE.npz`` (holding one array) or ``NAME=FILE.npz:KEY``."""
    path, key = spec, None
    head, sep, tail = spec.rpartition(":")
    if sep and head.lower().endswith(".npz") and not os.path.exists(spec):
        path, key = head, tail
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise KilnError(f"cannot read input {name!r} from {path}: {e}") from None
    if isinstance(loaded, np.ndarray):
        if key is not None:
            raise KilnError(f"input {name!r}: {path} holds one array, not an archive: drop ':{key}'")
        return loaded
    with loaded:  # an .npz archive
        keys = list(loaded.files)
        if key is None and len(keys) != 1:
            raise KilnError(f"input {name!r}: {path} holds {len(keys)} arrays ({', '.join(keys) or 'none'}); "
                            f"name one with --input {name}={path}:KEY")
        key = keys[0] if key is None else key
        if key not in keys:
            raise KilnError(f"input {name!r}: {path} has no array {key!r} (it holds {', '.join(keys) or 'none'})")
        try:
            return loaded[key]
        except (OSError, ValueError, EOFError) as e:
            raise KilnError(f"cannot read input {name!r} from {path}:{key}: {e}") from None


def cmd_run(args) -> int:
    from ..models import load_graph
    from .cli import describe_array
    from .spec import model_of

    given = {name: read_input(name, path) for name, path in args.input}
    if args.interpret:
        from ..ir.interpreter import interpret

        _refuse_directory(args.model)
        graph = load_graph(model_of(args.model), dict(args.input_shape) or None)
        feeds = _feeds(graph, given, args.seed)
        outs = interpret(graph, feeds)
    else:
        from .. import compile, load

        if _is_artifact(args.model):
            if args.input_shape:
                raise KilnError("--input-shape applies to models; an artifact has fixed input shapes")
            exe = load(args.model, args.threads, cluster=args.cluster)
            feeds = artifact_feeds(exe, given, args.seed)
        else:
            if args.cluster:
                raise KilnError("--cluster runs a compiled multi-device artifact (kiln compile --devices ...)")
            from ..cache import from_cache

            exe = None
            if not args.no_cache and not args.input_shape:  # a hit needs no ONNX import: the start is the load
                _refuse_directory(args.model)
                exe = from_cache(args.model, args.opt_level, {}, nthreads=args.threads, model_name=args.model)
            if exe is not None:
                feeds = artifact_feeds(exe, given, args.seed)
            else:
                model, feeds, shapes = model_feeds(args.model, args.input_shape, given, args.seed)
                exe = compile(model, args.opt_level, shapes, nthreads=args.threads, model_name=args.model,
                              cache=not args.no_cache, kernel_cache=not args.no_cache)
        outs = exe.run(feeds)
    for name, arr in outs.items():
        print(describe_array(name, arr))
    if args.output:
        np.savez(args.output, **outs)
        print(f"saved {len(outs)} output(s) to {args.output}")
    return 0


def _feeds(graph, given, seed):
    from .cli import random_inputs

    notes: list[str] = []
    feeds = random_inputs(graph, given, seed, notes)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    return feeds


def model_feeds(spec: str, input_shape, given: dict, seed: int):
    """(the model, its inputs, the shapes to compile for) of a model spec: the inputs first (given, or
    random with symbolic dimensions 1), checked against the model's signature; the model is then
    compiled for exactly their shapes."""
    from ..ir.interpreter import check_inputs
    from ..ir.types import TensorType
    from ..models import load_graph
    from .spec import model_of

    _refuse_directory(spec)
    model = model_of(spec)  # a zoo: model is built once
    graph = load_graph(model, dict(input_shape) or None)
    feeds = _feeds(graph, given, seed)
    check_inputs(graph, feeds)
    shapes = {v.name: tuple(feeds[v.name].shape) for v in graph.inputs
              if isinstance(v.type, TensorType) and not v.type.is_static}
    return model, feeds, shapes


def artifact_feeds(exe, given: dict, seed: int) -> dict:
    """Inputs for a loaded artifact: ``given`` and random ones (a specializing artifact's symbolic
    dimensions: size 1)."""
    from ..specialize import Specializing

    return _feeds(exe.source, given, seed) if isinstance(exe, Specializing) else _feeds_for(exe, given, seed)


def _feeds_for(exe, given: dict, seed: int) -> dict:
    """Random inputs for an executable's signature (the same draws ``kiln run --interpret`` makes)."""
    from ..ir.graph import Graph
    from ..ir.types import TensorType

    g = Graph("signature")
    for name, dtype, shape in exe.inputs:
        if dtype is None:
            if name not in given:
                raise KilnError(f"input {name!r} has type {shape}: give it with --input {name}=FILE.npy")
            continue
        g.add_input(name, TensorType(dtype, shape))
    return _feeds(g, given, seed)


def _specialize_record(artifact: str) -> dict | None:
    """A specializing artifact's record (``specialize.json``), else None."""
    from ..runtime.artifact import ArtifactDir, read_manifest
    from ..specialize import RECORD, is_specializing

    m = read_manifest(artifact)
    if not is_specializing(m):
        return None
    with ArtifactDir(artifact) as d:
        return json.loads(d.read(RECORD, m.files[RECORD], 1 << 20))


def _dims_line(record: dict) -> str:
    mx = record.get("max_dims", {})
    return ", ".join(f"{d} (at most {mx[d]})" if d in mx else d for d in record.get("dims", []))


def parse_max_dim(text: str) -> tuple[str, int]:
    """NAME=N for --max-dim."""
    name, eq, value = text.partition("=")
    if not eq or not name or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=N with N a positive integer (e.g. N=64), got {text!r}")
    return name, int(value)


def _inspect_cuda(args) -> int:
    from ..runtime.cuda import load_cuda

    exe = load_cuda(args.artifact)
    m = exe.manifest
    if args.json:
        print(json.dumps({k: m[k] for k in ("model", "kiln_version", "format_version", "opt_level", "target", "inputs",
                                            "outputs", "kernels", "fallback", "memory", "compile_seconds", "nodes")},
                         indent=1))
        return 0
    cc = m["target"].get("compute_capability")
    print(f"artifact {args.artifact}: {m['model']} at -O{m['opt_level']}, Kiln {m['kiln_version']} "
          f"(CUDA format {m['format_version']})")
    print(f"target   cuda (numba.cuda){f', built on compute capability {cc}' if cc else ''}")
    for i in m["inputs"]:
        print(f"input    {i['name']}: {i['type']}")
    for o in m["outputs"]:
        print(f"output   {o['name']}: {o['type']}")
    print(f"memory   weights {_mib(m['memory']['weights_bytes'])} (uploaded once), arena "
          f"{_mib(m['memory']['arena_bytes'])} on the GPU")
    ks = m["kernels"]
    print(f"launches {len(ks)} of {len({k['kernel'] for k in ks})} distinct kernel(s)")
    times: dict = {}
    if args.gpu_times:
        feeds = _feeds_for(exe, {}, 0)
        for s, t in exe.time_launches(feeds):
            times.setdefault(s["step"], []).append(t)
    if args.kernels or args.gpu_times:
        seen: dict = {}
        for k in ks:
            j = seen[k["step"]] = seen.get(k["step"], -1) + 1  # the step's j-th launch
            t = f"{times[k['step']][j] * 1e3:8.3f} ms" if k["step"] in times else ""
            print(f"  step {k['step']:>4}  {'+'.join(k['ops'])[:40]:<40} {k['kernel']:<22} {t}")
            for note in k["notes"]:
                print(f"             {note}")
    fb = m["fallback"]
    if fb:
        print(f"fallback {len(fb)} node(s) run on the host in the reference interpreter:")
        for f in fb:
            print(f"  {f['op']} node {f['node']!r} (#{f['index']}): {f['reason']}")
    else:
        print("fallback none: every node runs on the GPU")
    return 0


def cmd_inspect(args) -> int:
    from ..runtime.artifact import read_manifest

    if os.path.isdir(args.artifact) and os.path.lexists(os.path.join(args.artifact, "cuda.json")):
        return _inspect_cuda(args)
    if os.path.isdir(args.artifact) and os.path.lexists(os.path.join(args.artifact, "devices.json")):
        from .cli_devices import inspect

        return inspect(args)

    m = read_manifest(args.artifact).to_json()  # printed as the document it is
    if args.json:
        out = {k: m[k] for k in ("model", "kiln_version", "format_version", "opt_level", "target", "inputs",
                                 "outputs", "kernels", "views", "fallback", "memory", "compile_seconds", "nodes")}
        out["concats_in_place"] = m.get("concats_in_place", [])
        out["specialize"] = _specialize_record(args.artifact)
        print(json.dumps(out, indent=1))
        return 0
    t = m["target"]
    print(f"artifact {args.artifact}: {m['model']} at -O{m['opt_level']}, Kiln {m['kiln_version']} "
          f"(format {m['format_version']})")
    print(f"target   {t['triple']} cpu={t['cpu']} ({' '.join(t['isa']) or 'baseline'})")
    for i in m["inputs"]:
        print(f"input    {i['name']}: {str(i['dtype']) + str(i['shape']) if 'dtype' in i else i['type']}")
    for o in m["outputs"]:
        print(f"output   {o['name']}: {o['type']}")
    print(f"memory   {memory_line(m['memory'])}")
    ks = m["kernels"]
    flops = sum(k["flops"] for k in ks)
    print(f"kernels  {len(ks)} ({m['views']} view ops need none), {flops / 1e9:.3f} GFLOP in all")
    if args.kernels:
        print(f"  {'#':>4}  {'kernel':<36} {'lowering':<14} {'MFLOP':>9} {'MB moved':>9} {'scratch':>10}")
        for n, k in enumerate(ks):
            print(f"  {n:>4}  {k['name'][:36]:<36} {k['lowering'] or '':<14} {k['flops'] / 1e6:>9.2f} "
                  f"{k['bytes'] / 1e6:>9.2f} {_mib(k['scratch_bytes']) if k['scratch_bytes'] else '':>10}")
            for note in k.get("notes", ()):
                print(f"  {'':>4}    {note}")
        for c in m.get("concats_in_place", ()):
            print(f"  view  Concat node {c['node']!r}: {c['note']}")
    else:
        by_op: dict[str, list] = {}
        for k in ks:
            key = "+".join(k["ops"])
            agg = by_op.setdefault(key, [0, 0, 0])
            agg[0] += 1
            agg[1] += k["flops"]
            agg[2] += k["bytes"]
        print(f"  {'ops':<28} {'kernels':>7} {'MFLOP':>10} {'MB moved':>9}")
        for key, (count, fl, by) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
            print(f"  {key[:28]:<28} {count:>7} {fl / 1e6:>10.1f} {by / 1e6:>9.1f}")
        print("  (--kernels lists each kernel)")
    record = _specialize_record(args.artifact)
    if record is not None:
        print(f"symbolic {_dims_line(record)}: native code is compiled per size when the size is first run; "
              f"the generic compile's fallback follows")
    fb = m["fallback"]
    if fb:
        print(f"fallback {len(fb)} node(s) run in the reference interpreter:")
        for f in fb:
            print(f"  {f['op']} node {f['node']!r} (#{f['index']}): {f['reason']}")
    else:
        print("fallback none: every node runs natively")
    return 0
