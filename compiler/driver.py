"""``compile``: a model in, a loaded ``Executable`` (and optionally a saved artifact) out.

    model --load--> Graph --pipeline(-O)--> Graph --build_program--> Program
          --write_artifact--> model.kiln/ --load--> Executable

Compiling always writes an artifact (to a temporary directory unless ``output`` names one) and
loads it back, so a compiled model and a loaded one run exactly the same code.
"""
from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
import threading
import time
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Mapping, Sequence


from . import __version__, limits
from .codegen.llvm.target import Target, host_target
from .codegen.program import Program, build_program, value_key
from .errors import KilnError
from .ir.graph import Graph
from .ir.types import TensorType
from .runtime.artifact import LIBRARY, finish_manifest, staging, write_weights_and_ir
from .runtime.executable import Executable, load
from .runtime.format import (LAYOUT_SYMBOL, BufferRef, ConstRef, FallbackStep, InputRef, Manifest, NativeStep,
                             PythonRef, Target as TargetRecord, Tensor, native_layout)


class FallbackWarning(UserWarning):
    """Some nodes have no native code and run in the reference interpreter."""


#: Python's cyclic garbage collector runs a young collection every this many allocations while a
#: compile runs (700 by default): building a program makes millions of llvmlite objects, and the
#: collections that scanned them took a third of code generation (Inception-v1: 1.00 -> 0.74 s).
#: Garbage is still collected, in fewer, larger steps.
COMPILE_GC_THRESHOLD = 100_000

_gc_lock = threading.Lock()
_gc_compiles = 0
_gc_saved: tuple = ()


@contextmanager
def fewer_collections():
    """``COMPILE_GC_THRESHOLD`` while any compile runs (the setting is the process's: the first compile
    to start raises it, the last to end puts back what it was)."""
    global _gc_compiles, _gc_saved
    with _gc_lock:
        if _gc_compiles == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(max(_gc_saved[0], COMPILE_GC_THRESHOLD), *_gc_saved[1:])
        _gc_compiles += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_compiles -= 1
            if _gc_compiles == 0:
                gc.set_threshold(*_gc_saved)


@fewer_collections()
def compile(model: Any, opt_level: int = 2, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
            output: str | os.PathLike | None = None, target: Target | str | None = None, fallback: bool = True,
            nthreads: int | None = None, verify: bool = False, disabled_passes: Sequence[str] = (),
            timings: dict | None = None, profile: bool = False, memory_limit: int | None = None,
            model_name: str | None = None, input_values: Mapping[str, Any] | None = None,
            quantize: Any = None, calibration: Any = None, specialize: bool = True,
            max_dims: Mapping[str, int] | None = None, specialize_cache: int | None = None,
            devices: Any = None, device_memory: Mapping[str, int] | None = None, parallel: str = "auto",
            microbatch: int | None = None, cache: Any = False, record: Any = None,
            progress: bool = False, kernel_cache: bool = True) -> Executable:
    """Compile ``model`` (an ONNX path or ModelProto, ``light:NAME``, a ``.kir`` file or a Graph) for
    this CPU (or ``target``: a ``Target``, an LLVM CPU name, or "cuda" for an NVIDIA GPU through
    numba.cuda, docs/cuda.md) and return it loaded.

    ``input_shapes`` fixes symbolic input dimensions (native code needs static shapes; ops on
    non-static values run in the interpreter). ``input_values`` binds inputs to values: they become
    constants and the compiled model no longer takes them (for inputs that decide shapes, such as a
    Reduce's axes fed as an input: ``passes.simplify.infer_shapes.shape_determining_inputs``). ``output`` also keeps the artifact there (a
    ``model.kiln`` directory). ``fallback=False`` refuses nodes without native code instead of running
    them in the reference interpreter (with a ``FallbackWarning``). ``nthreads``: threads per run
    (default: the CPUs this process may use). ``timings``, if given, receives seconds per phase.
    ``profile=True`` builds the forward pass with a clock read after every step
    (``Executable.run_timed``). ``memory_limit``: the most bytes the model may need (arena plus
    weights, and any one value; default: this machine's memory); past it a ``LimitError`` names the
    size and the node. ``model_name``: the model's name in the artifact (default: ``model`` when it is
    a string, else the graph's name). ``quantize``: int8 quantization of the matrix products with
    constant weights, a mode name ("int8", "int8-dynamic") or a ``passes.quantize.QuantizeOptions``;
    static "int8" measures activation ranges by running the float model on ``calibration`` (a
    directory of ``.npz``/``.npy`` samples or an iterable of feed dicts, see ``calibration.py``).

    A model with symbolic input dimensions left (not fixed by ``input_shapes``) compiles, with
    ``specialize`` (the default, CPU), to a ``specialize.Specializing`` executable: native code per
    size, compiled when a size is first run and kept (``specialize_cache`` sizes, 8 by default);
    ``max_dims`` ({"N": 64}) refuses larger sizes. ``specialize=False`` keeps one compile whose nodes
    of symbolic shape run in the interpreter.

    ``devices`` ("cpu:0,cpu:1", a list of names, or a ``devices.DeviceOptions``) compiles for several
    devices (``multidevice.py``): ``parallel`` "pipeline" (stages placed by the ``split-devices``
    pass; ``microbatch`` rows per item), "data" (a replica per device, the batch shared) or "auto";
    ``device_memory`` ({"cpu:0": bytes}) bounds each device. It returns a
    ``runtime.multidevice.MultiDeviceExecutable``.

    ``cache=True`` (or a directory) keeps the artifact in the compile cache and loads it when the same
    model is compiled with the same options again (``cache.py``; ``kiln run MODEL`` does by default).
    Independently, ``kernel_cache`` (on by default) reads the parts of the LLVM module compiled before,
    by any model, from the object cache instead of compiling them (``codegen/llvm/objects.py``).

    ``record`` (a ``profiling.CompileRecord``) receives what the compile did: the pass records, the IR
    after each pass that changed it, the final graph and its program (the HTML report of ``kiln
    profile --html``); a recorded compile does not use the cache. ``progress=True`` shows the phase and
    the pass running on one line of stderr (the CLI turns it on when stderr is a terminal).

    The passes fuse what the CPU backend can run as one kernel: the driver hands its capabilities
    (``codegen.fusion.CPU_FUSION``) to the pipeline.
    """
    if devices is not None:
        return _compile_on_devices(model, opt_level, input_shapes, devices, device_memory, parallel, microbatch,
                                   output=output, target=target, fallback=fallback, verify=verify,
                                   disabled_passes=disabled_passes, timings=timings, model_name=model_name,
                                   profile=bool(profile),
                                   unsupported={"quantize": quantize, "calibration": calibration,
                                                "input_values": input_values or None, "max_dims": max_dims or None,
                                                "memory_limit": memory_limit,
                                                "cache": cache or None, "record": record})
    if cache and calibration is None and record is None and not _is_cuda(target):
        from . import cache as artifacts

        key = artifacts.compile_key(model, opt_level, input_shapes, input_values, target, fallback, disabled_passes,
                                    memory_limit, quantize, specialize, max_dims, profile, model_name)
        if key is not None:
            t0 = time.perf_counter()
            root = artifacts.cache_root(cache)
            exe = artifacts.lookup(root, key, nthreads)
            if exe is None:
                exe = compile(model, opt_level, input_shapes, output=artifacts.place(root, key), target=target,
                              fallback=fallback, nthreads=nthreads, verify=verify, disabled_passes=disabled_passes,
                              timings=timings, profile=profile, memory_limit=memory_limit, model_name=model_name,
                              input_values=input_values, quantize=quantize, specialize=specialize,
                              max_dims=max_dims, specialize_cache=specialize_cache, progress=progress,
                              kernel_cache=kernel_cache)
            elif timings is not None:
                timings.update(cached=time.perf_counter() - t0, total=time.perf_counter() - t0)
            if output is not None:
                from . import load as load_any

                return load_any(exe.save(output), nthreads)
            return exe
    from .codegen.fusion import CPU_FUSION
    from .models import load_graph
    from .passes.manager import Verify
    from .passes.manager import PassManager
    from .passes.options import CompileOptions, OptionError
    from .passes.pipeline import pipeline

    t0 = time.perf_counter()
    opts = CompileOptions.make(opt_level=opt_level, input_shapes=dict(input_shapes or {}),
                               input_values=dict(input_values or {}),
                               disabled_passes=tuple(disabled_passes), verify=verify,
                               memory_limit_bytes=memory_limit, quantize=quantize)
    calibrate, budget = None, None
    host = None if _is_cuda(target) else target  # calibration runs the float model on this CPU
    if calibration is not None:
        from .calibration import calibrator, read_samples

        if opts.quantize is None or not (opts.quantize.needs_calibration or opts.quantize.accuracy_budget is not None):
            raise OptionError("calibration data is given, but no static int8 quantization (quantize='int8') "
                              "or accuracy budget")
        samples = read_samples(calibration)
        calibrate = calibrator(samples, target=host, nthreads=nthreads, method=opts.quantize.calibrator,
                               percentile=opts.quantize.percentile)
        if opts.quantize.accuracy_budget is not None:
            budget = _keep_within_budget(model, samples, opts, host, nthreads)
            opts = dataclasses.replace(opts, quantize=dataclasses.replace(
                opts.quantize, exclude=opts.quantize.exclude + tuple(budget.kept_in_float), accuracy_budget=None))
    elif opts.quantize is not None and opts.quantize.accuracy_budget is not None:
        raise OptionError("an accuracy budget needs calibration data to measure the error on")
    _say(progress, "importing the model")
    graph = load_graph(model, opts.input_shapes)
    source = _specialization_source(graph, opts, specialize and not _is_cuda(target) and calibration is None,
                                    max_dims)
    t1 = time.perf_counter()
    from .passes.pipeline import all_pass_names

    opts.check_pass_names(all_pass_names())
    on_gpu = _is_cuda(target)
    if on_gpu:
        from .codegen.cuda import CUDA_FUSION as fusion
    else:
        fusion = CPU_FUSION
    passes = [p for p in pipeline(opts, fusion, calibrate) if p.name not in opts.disabled_passes]
    from .passes.instruments import KeepIR, Progress

    instruments = [Verify()] if verify else []
    keep = KeepIR() if record is not None else None
    instruments += [keep] if keep else []
    instruments += [Progress(len(passes))] if progress else []
    result = PassManager(passes, instruments).run(graph)
    if record is not None:
        record.passes, record.stages, record.graph = result.records, keep.stages, graph
    t2 = time.perf_counter()
    _say(progress, f"generating code for {len(graph.nodes)} nodes")
    limit = opts.memory_limit_bytes or limits.machine_memory()
    limits.check_values(graph, limit)
    if on_gpu:
        exe = _compile_cuda(graph, model, output, fallback, model_name, opt_level, {"load": t1 - t0, "passes": t2 - t1})
        _say(progress, "")
        exe.quantization = None
        if timings is not None:
            timings.update(exe.manifest["compile_seconds"], total=time.perf_counter() - t0)
        return exe
    target = target if isinstance(target, Target) else host_target() if target in (None, "cpu") else _cpu(target)
    prog = build_program(graph, target, fallback=fallback, profile=profile, verify_shared=verify)
    limits.check_program(prog.arena_bytes, prog.weights_bytes, prog.buffers, limit)
    if record is not None:
        record.program = prog
    t3 = time.perf_counter()
    _say(progress, f"compiling {len(prog.steps)} steps with LLVM and linking")
    if prog.fallback_steps and source is None:  # a specializing compile's sizes get their own compiles
        ops = sorted({s.node.op.name for s in prog.fallback_steps})
        warnings.warn(f"{len(prog.fallback_steps)} node(s) run in the reference interpreter (no native code): "
                      f"{', '.join(ops)}; `kiln inspect` lists them with reasons", FallbackWarning, stacklevel=3)
    # a specializing compile's artifact is the generic one plus its source: written whole below
    dest, owner = _destination(None if source is not None else output)
    name = model_name or (model if isinstance(model, str) else getattr(graph, "name", "model"))
    times = {"load": t1 - t0, "passes": t2 - t1, "codegen": t3 - t2}
    exe = write_artifact(prog, dest, target, model_name=str(name), opt_level=opt_level, times=times,
                         nthreads=nthreads, kernel_cache=kernel_cache)
    t4 = time.perf_counter()
    exe._owner = owner
    quantize = next((p for p in passes if p.name == "quantize"), None)
    #: with ``quantize``: {"quantized": [node names], "kept_in_float": {node name: why}, "uint8_inputs":
    #: [the depthwise convolutions of "quantized" that read uint8 and compute in float]}
    exe.quantization = None if quantize is None else {"quantized": list(quantize.quantized),
                                                      "kept_in_float": dict(quantize.refusals),
                                                      "uint8_inputs": list(quantize.uint8_inputs)}
    if budget is not None:
        exe.quantization["budget"] = {"budget": budget.budget, "kept_in_float": budget.kept_in_float,
                                      "output_cosine": budget.budget_cosine}
    times.update(llvm_and_link=t4 - t3, total=time.perf_counter() - t0)
    _say(progress, "")
    if record is not None:
        record.seconds = dict(times)
    if timings is not None:
        timings.update(times)
    if source is not None:
        from .specialize import DEFAULT_CACHE, Specializing

        options = dict(opt_level=opt_level, target=target, fallback=fallback, nthreads=nthreads, verify=verify,
                       disabled_passes=tuple(disabled_passes), memory_limit=memory_limit, model_name=str(name),
                       quantize=quantize, profile=profile)
        spec = Specializing(exe, source, options, max_dims or {}, specialize_cache or DEFAULT_CACHE)
        spec.quantization = exe.quantization
        if output is not None:
            spec.generic = load(spec.save(output), nthreads)
        return spec
    return exe


def _say(on: bool, text: str) -> None:
    """The progress line on stderr, rewritten in place (cleared by an empty ``text``)."""
    if on:
        sys.stderr.write(f"\r\033[K{text}" if text else "\r\033[K")
        sys.stderr.flush()


def _compile_on_devices(model, opt_level, input_shapes, devices, device_memory, parallel, microbatch, *,
                        unsupported: Mapping[str, Any], target, **options):
    """``compile`` with ``devices``: ``multidevice.compile_multidevice``, for the options it takes."""
    from .devices import DeviceOptions
    from .multidevice import compile_multidevice
    from .passes.options import OptionError

    given = [k for k, v in unsupported.items() if v is not None]
    if given:
        raise OptionError(f"{', '.join(given)}: not supported with devices yet (a multi-device compile takes "
                          f"opt_level, input_shapes, output, target, fallback, verify, disabled_passes, profile)")
    if _is_cuda(target):
        raise OptionError("devices with target='cuda': CUDA devices are not placed on yet; compile for one GPU "
                          "without devices")
    if isinstance(devices, DeviceOptions):
        if device_memory or parallel != "auto" or microbatch is not None:
            raise OptionError("give device_memory, parallel and microbatch inside the DeviceOptions, not beside it")
        opts = devices
    else:
        opts = DeviceOptions.make(devices, device_memory, parallel, microbatch)
    return compile_multidevice(model, opt_level, dict(input_shapes or {}), opts, target=target, **options)


def _specialization_source(graph: Graph, opts, wanted: bool, max_dims) -> Graph | None:
    """A copy of the loaded graph, its inputs bound to ``input_values`` and shaped by ``input_shapes``,
    when symbolic input dimensions are left and specializing is wanted; else None."""
    from .specialize import check_max_dims, symbolic_dims

    if not wanted:
        if max_dims:
            raise KilnError("max_dims applies to a model compiled with specialize=True on the CPU")
        return None
    # the names left symbolic once input_shapes and input_values apply, found before any copy is made
    # (most models have none: they pay nothing here)
    fixed = {n for n, shape in opts.input_shapes.items() if all(isinstance(d, int) for d in shape)}
    fixed |= set(opts.input_values)
    left = {d: [p for p in places if p[0] not in fixed] for d, places in symbolic_dims(graph).items()}
    if not any(left.values()):
        if max_dims:
            check_max_dims(max_dims, {})  # names a dimension the model does not have
        return None
    from .ir.clone import clone
    from .passes.simplify.infer_shapes import bind_inputs, specialize_inputs

    source, _ = clone(graph)
    specialize_inputs(source, opts.input_shapes)
    if opts.input_values:
        bind_inputs(source, opts.input_values)
    dims = symbolic_dims(source)
    if not dims:
        if max_dims:
            check_max_dims(max_dims, dims)  # names a dimension the model does not have
        return None
    check_max_dims(max_dims or {}, dims)
    return source


def _destination(output):
    """(where the artifact goes, the temporary directory holding it when ``output`` is None)."""
    if output is not None:
        return os.fspath(output), None
    owner = tempfile.TemporaryDirectory(prefix="kiln-")
    return os.path.join(owner.name, "model.kiln"), owner


def _cpu(name: str) -> Target:
    from .codegen.llvm.target import target_for

    return target_for(name)


def _is_cuda(target) -> bool:
    """Whether ``target`` names the CUDA backend ("cuda"); a CPU name or a ``Target`` is the CPU's."""
    return isinstance(target, str) and target.lower() == "cuda"


def _compile_cuda(graph: Graph, model, output, fallback: bool, model_name, opt_level: int, times: dict):
    """The CUDA half of ``compile``: GPU launches (``codegen/cuda``) into a CUDA artifact, loaded."""
    from .codegen.cuda import build_cuda_program
    from .runtime.cuda import write_cuda_artifact

    t0 = time.perf_counter()
    prog = build_cuda_program(graph, fallback=fallback)
    times["codegen"] = time.perf_counter() - t0
    if prog.fallback_steps:
        ops = sorted({s.node.op.name for s in prog.fallback_steps})
        warnings.warn(f"{len(prog.fallback_steps)} node(s) have no CUDA kernel and run on the host in the reference "
                      f"interpreter: {', '.join(ops)}; `kiln inspect` lists them with reasons", FallbackWarning,
                      stacklevel=4)
    dest, owner = _destination(output)
    name = model_name or (model if isinstance(model, str) else getattr(graph, "name", "model"))
    t1 = time.perf_counter()
    exe = write_cuda_artifact(prog, dest, __version__, model_name=str(name), opt_level=opt_level, times=times)
    times["write_and_load"] = time.perf_counter() - t1
    exe.manifest["compile_seconds"] = {k: round(v, 4) for k, v in times.items()}
    exe._owner = owner
    return exe


def _keep_within_budget(model, samples, opts, target, nthreads):
    """The quantize report with ``opts.quantize.accuracy_budget``: which layers to keep in float."""
    from .quantize_report import quantize_report

    q = opts.quantize
    return quantize_report(model, samples, dataclasses.replace(q, accuracy_budget=None), opt_level=opts.opt_level,
                           input_shapes=opts.input_shapes, target=target, nthreads=nthreads,
                           budget=q.accuracy_budget)


def _read(dest: str) -> Manifest:
    from .runtime.artifact import read_manifest

    return read_manifest(dest, check_files=False)


def write_artifact(prog: Program, dest: str, target: Target, model_name: str = "model", opt_level: int = 2,
                   times: Mapping[str, float] | None = None, nthreads: int | None = None,
                   kernel_cache: bool = True) -> Executable:
    """Compile ``prog``'s LLVM IR and write the artifact directory ``dest`` (atomically); returns it
    loaded. With ``kernel_cache``, parts of the module compiled before are read from the object
    cache (``codegen/llvm/objects.py``). It is loaded from the staging directory, before the swap:
    another process writing the same path at once cannot hand this one its model (the loaded artifact
    keeps nothing open there)."""
    from .codegen.llvm import toolchain

    graph = prog.graph
    with staging(dest) as tmp:
        t0 = time.perf_counter()
        manifest = manifest_of(prog, target, model_name, opt_level, dict(times or {}), prog.profiled)
        if any(st.native and not st.alias for st in prog.steps):
            from .codegen.llvm import objects as kept

            cache_dir = kept.cache_dir() if kernel_cache else None
            objects = [*toolchain.compile_parts(prog.llvm_ir, target, cache_dir=cache_dir),
                       toolchain.data_object(LAYOUT_SYMBOL, native_layout(manifest), target)]
            if prog.uses_gemm:
                from .codegen.gemm.build import gemm_object

                objects.append(gemm_object(prog.gemm_cfg))
            if prog.uses_parallel:
                from .codegen.native import support_object

                objects.append(support_object())
            toolchain.link_shared(objects, os.path.join(tmp, LIBRARY), extra_args=["-lpthread"])
        t_llvm = time.perf_counter() - t0
        write_weights_and_ir(tmp, prog.weights, prog.weights_bytes, graph, bool(prog.fallback_steps))
        manifest.compile_seconds["llvm"] = round(t_llvm, 4)
        finish_manifest(tmp, manifest)
        exe = Executable(tmp, _read(tmp), nthreads)
    exe.path = dest
    return exe


def manifest_of(prog: Program, target: Target, model_name: str, opt_level: int, times: dict,
                profile: bool = False) -> Manifest:
    """The manifest of ``prog``'s artifact (files and checksums are added when it is written)."""
    graph = prog.graph
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    input_pos = {id(v): k for k, v in enumerate(graph.inputs)}

    def static(v) -> tuple:
        if isinstance(v.type, TensorType) and v.type.is_static:
            return v.type.dtype.name, tuple(int(d) for d in v.shape)
        return None, None  # symbolic shapes, sequences: only interpreted nodes see them

    def buffer(v) -> BufferRef | None:
        p = prog.places.get(id(v))
        return BufferRef(p.kind, p.where, *static(v)) if p is not None else None

    inputs = [Tensor(v.name, str(v.type), *static(v)) for v in graph.inputs]
    outputs = []
    for name, v in zip(graph.output_names, graph.outputs):
        dtype, shape = static(v)
        if id(v) in input_pos:
            ref = BufferRef("input", input_pos[id(v)], dtype, shape) if dtype else InputRef(input_pos[id(v)])
        elif id(v) in prog.places:
            ref = buffer(v)
        elif v.const is not None:
            raise KilnError(f"output {name!r} is a constant no kernel reads; not supported yet")
        else:
            ref = PythonRef(value_key(v, index))
        outputs.append(Tensor(name, str(v.type), dtype, shape, ref))
    kernels = []
    for st in prog.steps:
        if st.native and not st.alias:
            flops, bytes_ = st.group.cost()
            kernels.append({"name": st.kernel, "step": st.index, "ops": st.group.ops, "lowering": st.lowering,
                            "nodes": [n.name or "" for n in st.group.nodes], "flops": flops,
                            "bytes": bytes_, "scratch_bytes": st.scratch_bytes, "notes": list(st.notes)})
    fallback = [{"op": s.node.op.name, "node": s.node.name or "", "index": index[id(s.node)],
                 "reason": s.reason} for s in prog.fallback_steps]
    concats = [{"node": s.node.name or "", "note": s.notes[0]} for s in prog.steps if s.alias and s.notes]
    return Manifest(
        kiln_version=__version__, model=model_name, opt_level=opt_level,
        target=TargetRecord(target.triple, target.cpu, target.features, tuple(sorted(target.isa))),
        inputs=inputs, outputs=outputs, plan=runtime_plan(prog, index, input_pos, buffer),
        memory=prog.memory_summary(), kernels=kernels, fallback=fallback, concats_in_place=concats,
        views=sum(1 for s in prog.steps if s.native and s.alias), nodes=len(graph.nodes),
        status_offset=prog.status_offset, profile=profile, profile_offset=prog.profile_offset,
        compile_seconds={k: round(v, 4) for k, v in times.items()})


def runtime_plan(prog: Program, index: dict, input_pos: dict, buffer) -> list:
    """The steps as the runtime executes them: native segments by function name, and interpreted
    nodes by index with where each operand and result lives."""
    seg_start = {seg[0]: j for j, seg in enumerate(prog.segments) if seg}
    plan: list = []
    for st in prog.steps:
        if st.native:
            if st.index in seg_start:
                plan.append(NativeStep(prog.segment_name(seg_start[st.index])))
            continue
        n = st.node
        refs = []
        for pos, v in enumerate(n.inputs):
            if v is None:
                refs.append(None)
            elif id(v) in input_pos:
                refs.append(InputRef(input_pos[id(v)]))
            elif v.const is not None:
                refs.append(ConstRef(pos))
            else:
                refs.append(buffer(v) or PythonRef(value_key(v, index)))
        outs = tuple(buffer(v) or PythonRef(value_key(v, index)) for v in n.outputs)
        plan.append(FallbackStep(index[id(n)], n.op.name, tuple(refs), outs))
    return plan


__all__ = ["FallbackWarning", "compile", "load", "write_artifact"]
