"""Compiling for several devices: a pipeline of stages, or replicas that share the batch.

    compiler.compile("model.onnx", devices="cpu:0,cpu:1")                       # parallel="auto"
    compiler.compile("model.onnx", devices=DeviceOptions(("cpu:0", "cpu:1"), {"cpu:0": 64 << 20},
                                                         parallel="pipeline", microbatch=8))

* **pipeline**: the model's pass pipeline ends with ``split-devices`` (``passes/split_devices.py``),
  which places the kernels on the devices as balanced stages within each device's memory and puts
  ``kiln.Transfer`` nodes between them; the graph is cut at the Transfers into one program per
  device, each compiled as an ordinary artifact and checked against its device's memory (constants
  plus arena, exactly). With ``microbatch`` m the stages are compiled for m rows and a run streams
  the batch through them m rows at a time.
* **data**: one replica per device, each the whole model compiled for its rows of the batch (sizes
  as even as they go; replicas of one size share one artifact).
* **auto** picks data when the batch can be shared (the model's inputs all lead with the same
  symbolic batch dimension, its outputs too, and the batch is at least 2) and every replica fits its
  device; otherwise pipeline. It says why (``exe.placement["why"]``).

Cutting the batch (data, micro-batches) needs a model whose batch is symbolic (exported with a
dynamic batch axis): its outputs then lead with the same dimension, and rows are taken to be
independent, as in every inference model whose batch is a free dimension. The written artifact is a
directory of parts with an index (``runtime/multidevice.py``).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Mapping

from . import __version__
from .devices import DeviceOptions, device_specs
from .errors import LimitError
from .limits import gib
from .ir.types import TensorType
from .passes.options import OptionError
from .runtime.artifact import staging
from .runtime.multidevice import FORMAT, INDEX, MultiDeviceExecutable, load_multidevice, part_digest, part_memory

#: how many times a pipeline is placed when a built stage turns out larger than its device
PLACEMENT_TRIES = 4


def compile_multidevice(model: Any, opt_level: int, input_shapes: Mapping[str, tuple], devices: DeviceOptions, *,
                        output=None, target=None, fallback: bool = True, verify: bool = False,
                        disabled_passes=(), timings: dict | None = None, model_name: str | None = None,
                        roofline=None, profile: bool = False) -> MultiDeviceExecutable:
    """``compiler.compile`` with ``devices`` (see the module docstring)."""
    from .driver import _destination
    from .models import load_graph
    from .passes.manager import PassManager
    from .passes.simplify.infer_shapes import InferShapes

    t0 = time.perf_counter()
    specs = device_specs(devices, roofline)
    raw = load_graph(model)
    PassManager([InferShapes()]).run(raw)
    symbol, why_not = _batch_symbol(raw)
    shapes = dict(input_shapes or {})
    batch = _fixed_batch(raw, symbol, shapes) if symbol else None
    full = load_graph(model, shapes)
    PassManager([InferShapes(shapes)]).run(full)
    loose = [v.name for v in full.inputs if isinstance(v.type, TensorType) and not v.type.is_static]
    if loose:
        raise OptionError(f"a multi-device compile needs every input's shape: give {', '.join(loose)} with "
                          f"input_shapes / --input-shape")
    name = str(model_name or (model if isinstance(model, str) else getattr(full, "name", "model")))
    common = dict(opt_level=opt_level, target=target, fallback=fallback, verify=verify,
                  disabled_passes=tuple(disabled_passes), model_name=name, profile=profile)
    mode, why = _choose(devices, symbol, batch, why_not)
    dest, owner = _destination(output)
    with staging(dest) as tmp:
        parts, placement = None, {}
        if mode == "data":
            parts, refusal = _replicas(model, full, shapes, symbol, batch, specs, tmp, common)
            if refusal is not None:
                if devices.parallel == "data":
                    raise LimitError(refusal)
                mode, why = "pipeline", f"{why}; but {refusal}: a pipeline instead"
                for entry in os.listdir(tmp):
                    shutil.rmtree(os.path.join(tmp, entry))  # the replicas written so far (directories)
        if mode == "pipeline":
            micro = devices.microbatch
            if micro is not None:
                if symbol is None:
                    raise OptionError(f"microbatch needs a model with a symbolic batch dimension ({why_not})")
                if batch % micro:
                    raise OptionError(f"microbatch {micro} does not divide the batch {batch}")
            stage_shapes = _with_batch(full, shapes, symbol, micro) if micro is not None else shapes
            parts, placement = _stages(model, stage_shapes, specs, tmp, common)
        placement["why"] = f"{mode}: {why}"
        index = {"format": FORMAT, "kiln_version": __version__, "model": name, "parallel": mode,
                 "devices": [{"name": s.name, "cores": list(s.cores), "memory_bytes": s.memory_bytes,
                              "gflops": round(s.gflops, 1), "gbs": round(s.gbps, 1)} for s in specs],
                 "inputs": [{"name": v.name, "dtype": v.type.dtype.name, "shape": [int(d) for d in v.shape]}
                            for v in full.inputs],
                 "outputs": list(full.output_names), "batch": batch,
                 "micro": devices.microbatch if mode == "pipeline" else None,
                 "parts": parts, "placement": placement,
                 "compile_seconds": round(time.perf_counter() - t0, 4)}
        with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1)
    exe = load_multidevice(dest)
    exe._owner = owner
    if timings is not None:
        timings.update(total=time.perf_counter() - t0)
    return exe


def _batch_symbol(graph) -> tuple[str | None, str]:
    """(the symbolic batch dimension every input and output leads with, or None and why not)."""
    tensors = [v for v in graph.inputs if isinstance(v.type, TensorType)]
    if not tensors or len(tensors) != len(graph.inputs):
        return None, "the model has inputs that are not tensors"
    lead = {v.shape[0] if v.type.rank else None for v in tensors}
    if len(lead) != 1 or not isinstance(next(iter(lead)), str):
        shown = ", ".join(f"{v.name}: {v.type}" for v in tensors)
        return None, f"its inputs do not all lead with one symbolic batch dimension ({shown})"
    sym = next(iter(lead))
    bad = [f"{n}: {v.type}" for n, v in zip(graph.output_names, graph.outputs)
           if not isinstance(v.type, TensorType) or not v.type.rank or v.shape[0] != sym]
    if bad:
        return None, f"not every output leads with the batch dimension {sym} ({', '.join(bad)})"
    return sym, ""


def _fixed_batch(graph, symbol: str, shapes: Mapping[str, tuple]) -> int | None:
    sizes = {int(shapes[v.name][0]) for v in graph.inputs if v.name in shapes and isinstance(shapes[v.name][0], int)}
    if len(sizes) > 1:
        raise OptionError(f"the inputs' batch dimension {symbol} is given different sizes: {sorted(sizes)}")
    return next(iter(sizes), None)


def _with_batch(graph, shapes: Mapping[str, tuple], symbol: str, rows: int) -> dict:
    """``shapes`` with every input's batch dimension ``rows``."""
    out = dict(shapes)
    for v in graph.inputs:
        out[v.name] = (rows, *tuple(shapes.get(v.name, v.shape))[1:])
    return out


def _choose(devices: DeviceOptions, symbol, batch, why_not: str) -> tuple[str, str]:
    k = len(devices.devices)
    if devices.parallel == "pipeline":
        return "pipeline", "asked for"
    shareable = symbol is not None and batch is not None and batch >= 2
    if devices.parallel == "data":
        if not shareable:
            why = why_not or f"the batch is {batch}: there is nothing to share"
            raise OptionError(f"data parallelism needs a batch to share over the devices: {why}")
        return "data", "asked for"
    if devices.microbatch is not None:
        return "pipeline", f"a micro-batch of {devices.microbatch} was asked for"
    if shareable:
        return "data", (f"the batch of {batch} splits over {min(k, batch)} replicas; each device runs the whole model on "
                        f"its rows and nothing crosses between devices")
    return "pipeline", f"the batch cannot be shared ({why_not or f'the batch is {batch}'})"


def _replicas(model, graph, shapes, symbol, batch, specs, tmp, common) -> tuple[list | None, str | None]:
    """The data-parallel parts (``graph``: the model as imported, for its signature), or (None, why
    not) when a replica does not fit its device."""
    from .driver import compile as compile_one

    k = min(len(specs), batch)
    sizes = [batch // k + (1 if i < batch % k else 0) for i in range(k)]
    built: dict[tuple, Any] = {}
    parts, start = [], 0
    for spec, rows in zip(specs, sizes):
        kind = _kind(spec.name)
        if (rows, kind) not in built:
            part = f"replica-{rows}" + ("-cuda" if kind == "cuda" else "")
            options = dict(common, target="cuda" if kind == "cuda" else common["target"])
            options.pop("opt_level")
            exe = compile_one(model, common["opt_level"], _with_batch(graph, shapes, symbol, rows),
                              output=os.path.join(tmp, part), nthreads=max(1, len(spec.cores)), specialize=False,
                              **options)
            built[rows, kind] = (part, exe)
        part, exe = built[rows, kind]
        memory = part_memory(exe)
        need = memory["arena_bytes"] + memory["weights_bytes"]
        if need > spec.memory_bytes:
            return None, f"a replica of {rows} rows needs {gib(need)}, more than {spec.name}'s {gib(spec.memory_bytes)}"
        parts.append({"path": part, "device": spec.name, "kind": kind, "inputs": [v.name for v in graph.inputs],
                      "outputs": list(graph.output_names), "rows": [start, start + rows],
                      "manifest_sha256": part_digest(os.path.join(tmp, part))})
        start += rows
    return parts, None


def _kind(device: str) -> str:
    return device.split(":")[0]


def _stages(model, shapes, specs, tmp, common) -> tuple[list, dict]:
    """The pipeline's parts: the pass pipeline, then split-devices, the cut, each stage built and
    written. The placement estimates each stage's memory; the build knows it (packed weights, the
    arena's plan): a stage over its device's memory places again with that device's budget less the
    overshoot (at most ``PLACEMENT_TRIES`` times) before the compile gives up."""
    import dataclasses

    from .codegen.cuda import CUDA_FUSION, build_cuda_program
    from .codegen.fusion import CPU_FUSION
    from .codegen.llvm.target import Target, host_target
    from .passes.fuse import NO_FUSION
    from .runtime.cuda import write_cuda_artifact
    from .codegen.program import build_program
    from .driver import _cpu, write_artifact
    from .ir.clone import clone
    from .models import load_graph
    from .passes.manager import PassManager, Verify
    from .passes.options import CompileOptions
    from .passes.pipeline import all_pass_names, pipeline
    from .passes.split_devices import SplitDevices, cut_stages
    from .passes.split_products import SplitProducts

    opts = CompileOptions.make(opt_level=common["opt_level"], input_shapes=shapes,
                               disabled_passes=common["disabled_passes"], verify=common["verify"])
    opts.check_pass_names(all_pass_names())
    if "split-devices" in opts.disabled_passes:
        raise OptionError("split-devices cannot be disabled in a multi-device pipeline compile")
    checks = [Verify()] if common["verify"] else []
    optimized = load_graph(model, opts.input_shapes)
    # CPU devices only: fused for the CPU before placing (a kernel as it will run is the unit placed);
    # with a GPU: placed unfused, and each stage fused for its own backend after the cut
    gpu = any(_kind(s.name) == "cuda" for s in specs)
    passes = [p for p in pipeline(opts, NO_FUSION if gpu else CPU_FUSION, devices=specs)
              if p.name not in opts.disabled_passes and not isinstance(p, SplitDevices)]  # placed below
    PassManager(passes, checks).run(optimized)
    products = next((p for p in passes if isinstance(p, SplitProducts)), None)
    target = common["target"]
    target = target if isinstance(target, Target) else host_target() if target in (None, "cpu") else _cpu(target)
    budget, over = list(specs), None
    for attempt in range(PLACEMENT_TRIES):
        graph, _ = clone(optimized)
        split = SplitDevices(budget)
        try:
            PassManager([split], checks).run(graph)
        except LimitError:
            if over is None:
                raise
            raise _overflow(specs, over, attempt) from None  # the smaller budget places nothing
        built, over = [], None
        for j, stage in enumerate(cut_stages(graph)):
            k = next(i for i, s in enumerate(specs) if s.name == stage.device)
            if _kind(stage.device) == "cuda":
                PassManager(_fusion_passes(opts, CUDA_FUSION), checks).run(stage.graph)
                prog = build_cuda_program(stage.graph, fallback=common["fallback"])
            else:
                if gpu:
                    PassManager(_fusion_passes(opts, CPU_FUSION), checks).run(stage.graph)
                prog = build_program(stage.graph, target, fallback=common["fallback"], verify_shared=common["verify"],
                                     profile=common["profile"])
            need = prog.arena_bytes + prog.weights_bytes
            if need > specs[k].memory_bytes:
                over = (k, j, need, prog, split.stages[j].memory_bytes)
                break
            built.append((stage, specs[k], prog))
        if over is None:
            break
        k, j, need, prog, estimate = over
        if attempt + 1 == PLACEMENT_TRIES:
            raise _overflow(specs, over, attempt + 1)
        smaller = max(1, budget[k].memory_bytes - (need - specs[k].memory_bytes))
        budget[k] = dataclasses.replace(budget[k], memory_bytes=smaller)
    parts = []
    for j, (stage, spec, prog) in enumerate(built):
        part = f"stage{j}-{stage.device.replace(':', '')}"
        name = f"{common['model_name']}@{spec.name}"
        if _kind(spec.name) == "cuda":
            write_cuda_artifact(prog, os.path.join(tmp, part), __version__, model_name=name,
                                opt_level=common["opt_level"])
        else:
            write_artifact(prog, os.path.join(tmp, part), target, model_name=name, opt_level=common["opt_level"],
                           nthreads=max(1, len(spec.cores)))
        parts.append({"path": part, "device": spec.name, "kind": _kind(spec.name),
                      "inputs": [v.name for v in stage.graph.inputs], "outputs": list(stage.graph.output_names),
                      "rows": None, "manifest_sha256": part_digest(os.path.join(tmp, part))})
    placement = {"explain": split.explain(), "placements": attempt + 1,
                 "split_products": dict(products.split) if products else {},
                 "stages": [{"device": s.device, "nodes": len(s.nodes), "estimated_ms": round(s.seconds * 1e3, 4),
                             "weight_bytes": s.weight_bytes, "peak_bytes": s.peak_bytes,
                             "transfer_in_bytes": s.transfer_in_bytes} for s in split.stages],
                 "cuts": [{"devices": list(c["devices"]), "why": c["why"],
                           "kept_after": c["min_cut_after"] if "min-byte cut is no slower" in c["why"]
                           else c["balanced_after"]} for c in split.cuts],
                 "estimated_bottleneck_ms": round(split.bottleneck_seconds * 1e3, 4),
                 "estimated_single_device_ms": round(split.single_device_seconds * 1e3, 4)}
    return parts, placement


def _fusion_passes(opts, fusion) -> list:
    """What the pipeline does after its simplifications, for one stage's backend."""
    from .passes.fuse import FuseKernels
    from .passes.schedule import ScheduleForMemory
    from .passes.sink_reshapes import SinkReshapes

    if opts.opt_level < 2:
        return []
    passes = [SinkReshapes(opts.max_rewrite_rounds, fusion), FuseKernels(opts.max_fused_ops, fusion),
              ScheduleForMemory()]
    return [p for p in passes if p.name not in opts.disabled_passes]


def _overflow(specs, over, placements: int) -> LimitError:
    k, j, need, prog, estimate = over
    spec = specs[k]
    return LimitError(f"stage {j} on {spec.name} needs {gib(need)} (weights {gib(prog.weights_bytes)} + arena "
                      f"{gib(prog.arena_bytes)}), more than its {gib(spec.memory_bytes)}, and {placements} placement(s) "
                      f"found no split that fits (the placement estimated {gib(estimate)}): give the devices more "
                      f"memory or add a device")


__all__ = ["compile_multidevice"]
