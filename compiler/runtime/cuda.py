"""CUDA artifacts: writing one (``write_cuda_artifact``), loading it (``load_cuda``) and running it
(``CudaExecutable``).

::

    model.kiln/
      cuda.json       format and Kiln version, target "cuda" (and the compute capability where it was
                      built on a GPU), the input/output signature, the launch plan, memory sizes, the
                      CPU fallback, and a SHA-256 of every other file
      kernels.py      every kernel, as numba.cuda source (numba compiles it on the GPU at load)
      kernels.ptx     where built on a GPU: the PTX numba made of each kernel (for inspection)
      weights.bin     the weights, uploaded to the GPU once at load
      model.kir       the final IR (the fallback nodes run from it on the host)

Loading needs numba and a CUDA GPU (or numba's simulator, ``NUMBA_ENABLE_CUDASIM=1``), not the
compiler's code generators. A run copies the inputs to the GPU (a caller's device array, anything
with ``__cuda_array_interface__``, is read where it is: the launches reading it get views of it,
nothing is copied), launches every kernel in schedule
order on one stream with its buffers' device memory (one arena, the CPU's memory plan), runs the
fallback nodes on the host between launches (their operands copied out, results copied back), and
copies the outputs back (``device_outputs=True``: device arrays, still copies of the arena).
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Mapping

import numpy as np

from ..errors import InputError, KilnError
from .artifact import ArtifactDir, ArtifactError, sha256_file, staging, write_weights_and_ir
from .format import IR_TEXT, WEIGHTS, machine_memory

CUDA_MANIFEST = "cuda.json"
KERNELS = "kernels.py"
PTX = "kernels.ptx"
FORMAT = "kiln-cuda-artifact"
FORMAT_VERSION = 1


def _cuda():
    """numba.cuda, with a GPU (or the simulator) present; ``ArtifactError`` otherwise."""
    from ..codegen.cuda import numba_cuda

    try:
        cuda = numba_cuda()
    except ImportError as e:  # pragma: no cover - numba is a dependency
        raise ArtifactError(f"CUDA artifacts need numba.cuda: {e}") from None
    if not cuda.is_available():
        raise ArtifactError("this artifact was compiled for CUDA (--target cuda) and this machine has no usable "
                            "CUDA GPU (numba.cuda.is_available() is False); compile the model for the CPU, or run "
                            "it where a GPU is (NUMBA_ENABLE_CUDASIM=1 runs it in numba's CUDA simulator, slowly)")
    return cuda


def compute_capability() -> str | None:
    """The GPU's compute capability ("9.0"), or None in the simulator or without a GPU."""
    import numba

    if numba.config.ENABLE_CUDASIM:
        return None
    try:
        from numba import cuda

        if not cuda.is_available():
            return None
        major, minor = cuda.get_current_device().compute_capability
        return f"{major}.{minor}"
    except Exception:
        return None


def gpu_name() -> str:
    """The GPU's name ("NVIDIA H200"), or what runs the kernels instead (the simulator)."""
    import numba

    if numba.config.ENABLE_CUDASIM:
        return "numba's CUDA simulator"
    try:
        from numba import cuda

        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - a name for a report only
        return "a CUDA GPU"


# -- writing ---------------------------------------------------------------------------------------

def write_cuda_artifact(prog, dest: str, kiln_version: str, model_name: str = "model", opt_level: int = 2,
                        times: Mapping[str, float] | None = None) -> "CudaExecutable":
    """Write the artifact of ``prog`` (a ``codegen.cuda.CudaProgram``) to ``dest`` (atomically) and
    return it loaded; ``kiln_version`` is recorded in the manifest."""
    graph = prog.graph
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    input_pos = {id(v): k for k, v in enumerate(graph.inputs)}

    def tensor(name, v, ref=None):
        t = v.type
        static = hasattr(t, "is_static") and t.is_static
        d = {"name": name, "type": str(t), "dtype": t.dtype.name if static else None,
             "shape": [int(x) for x in v.shape] if static else None}
        if ref is not None:
            d["ref"] = ref
        return d

    outputs = []
    for name, v in zip(graph.output_names, graph.outputs):
        if id(v) in input_pos:
            ref = ["input", input_pos[id(v)]]
        elif v.const is not None and id(v) not in prog.places:
            raise KilnError(f"output {name!r} is a constant no kernel reads; not supported yet")
        else:
            ref = prog.ref(v, index)
        outputs.append(tensor(name, v, ref))
    with staging(dest) as tmp:
        with open(os.path.join(tmp, KERNELS), "w", encoding="utf-8") as f:
            f.write(prog.source)
        write_weights_and_ir(tmp, prog.weights, prog.weights_bytes, graph, bool(prog.fallback_steps))
        kernels = []
        for st in prog.steps:
            flops, bytes_ = st.group.cost()  # the step's, on each of its launches (the profiler adds them once)
            for ln in prog.launches.get(st.index, []):
                kernels.append({"step": st.index, "kernel": ln.kernel, "ops": st.group.ops,
                                "nodes": [n.name or "" for n in st.group.nodes], "notes": ln.notes,
                                "flops": flops, "bytes": bytes_})
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kiln_version": kiln_version, "model": model_name,
            "opt_level": opt_level, "target": {"kind": "cuda", "compute_capability": compute_capability()},
            "inputs": [tensor(v.name, v) for v in graph.inputs], "outputs": outputs,
            "memory": {"arena_bytes": int(prog.arena_bytes), "weights_bytes": int(prog.weights_bytes)},
            "plan": prog.plan(), "kernels": kernels,
            "fallback": [{"op": s.node.op.name, "node": s.node.name or "", "index": index[id(s.node)],
                          "reason": s.reason} for s in prog.fallback_steps],
            "nodes": len(graph.nodes), "compile_seconds": {k: round(v, 4) for k, v in dict(times or {}).items()},
        }
        exe = _write_manifest_and_load(tmp, manifest)
    exe.path = dest
    return exe


def _write_manifest_and_load(tmp: str, manifest: dict) -> "CudaExecutable":
    manifest["files"] = {name: sha256_file(os.path.join(tmp, name)) for name in sorted(os.listdir(tmp))}
    with open(os.path.join(tmp, CUDA_MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return CudaExecutable(tmp, manifest)


# -- loading ---------------------------------------------------------------------------------------

def is_cuda_artifact(d: ArtifactDir) -> bool:
    return d.has(CUDA_MANIFEST)


def load_cuda(path: str | os.PathLike) -> "CudaExecutable":
    path = os.fspath(path)
    with ArtifactDir(path) as d:
        data = d.read(CUDA_MANIFEST, None, 64 << 20)
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise ArtifactError(f"{path}: {CUDA_MANIFEST} is not JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: {CUDA_MANIFEST} is not a Kiln CUDA manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: CUDA artifact format {manifest.get('format_version')!r}; this Kiln reads "
                            f"{FORMAT_VERSION} (recompile the model)")
    return CudaExecutable(path, manifest)


class CudaExecutable:
    """A loaded CUDA artifact (see the module docstring): ``run({name: array})``, ``exe(*arrays)``."""

    def __init__(self, path: str, manifest: dict, nthreads: int | None = None):
        self.path, self.manifest = path, manifest
        self.nthreads = nthreads
        self._lock = threading.Lock()
        cuda = _cuda()
        self._cuda = cuda
        files = manifest.get("files")
        read = {KERNELS, WEIGHTS} | ({IR_TEXT, IR_TEXT + ".npz"} if manifest["fallback"] else set())
        if not isinstance(files, dict) or not {KERNELS, WEIGHTS, IR_TEXT} <= set(files):
            raise ArtifactError(f"{path}: {CUDA_MANIFEST} does not give the checksums of {KERNELS}, {WEIGHTS} "
                                f"and {IR_TEXT}")
        with ArtifactDir(path) as d:
            for name, digest in files.items():
                if name not in read:  # the others are hashed as they are read
                    d.verify(name, digest)
            source = d.read(KERNELS, files[KERNELS], 1 << 30).decode("utf-8")
            weights = np.frombuffer(d.read(WEIGHTS, files[WEIGHTS], machine_memory()), np.uint8)
            self._graph = None
            if manifest["fallback"]:
                from ..ir.parser import parse

                text = d.read(IR_TEXT, files[IR_TEXT], machine_memory()).decode("utf-8")
                side = None
                if IR_TEXT + ".npz" in files:
                    import io

                    with np.load(io.BytesIO(d.read(IR_TEXT + ".npz", files[IR_TEXT + ".npz"],
                                                   machine_memory())), allow_pickle=False) as z:
                        side = {k: z[k] for k in z.files}
                self._graph = parse(text, side, filename=os.path.join(path, IR_TEXT))
        self._namespace = _exec_kernels(source, path)
        self.stream = cuda.stream()
        self._weights_host = weights
        self._weights = cuda.to_device(weights if weights.size else np.zeros(64, np.uint8), stream=self.stream)
        self.arena_bytes = int(manifest["memory"]["arena_bytes"])
        self._arena = cuda.device_array(max(self.arena_bytes, 64), np.uint8, stream=self.stream)
        self._status = cuda.to_device(np.zeros(4, np.int64), stream=self.stream)
        self._signature_ = [(i["name"], np.dtype(_np(i["dtype"])) if i["dtype"] else None,
                             tuple(i["shape"]) if i["shape"] is not None else None, i["dtype"])
                            for i in manifest["inputs"]]
        self._inputs = [cuda.device_array(max(int(np.prod(s, dtype=np.int64)), 1) * dt.itemsize, np.uint8)
                        if dt is not None else None for _, dt, s, _ in self._signature_]
        self.outputs = [(o["name"], o["dtype"], o["shape"]) for o in manifest["outputs"]]
        # what each call copies, set up once: every input's device view and page-locked staging
        # buffer, every arena output's view and page-locked landing buffer
        self._staging = [(buf[:max(int(np.prod(sh, dtype=np.int64)), 1) * dt.itemsize].view(dt),
                          cuda.pinned_array(max(int(np.prod(sh, dtype=np.int64)), 1), dt))
                         if buf is not None else None
                         for buf, (_, dt, sh, _) in zip(self._inputs, self._signature_)]
        self._landing = {}
        for o in manifest["outputs"]:
            ref = o["ref"]
            if ref[0] == "buffer" and ref[1] == "arena":
                dt, n = np.dtype(_np(ref[3])), int(np.prod(ref[4], dtype=np.int64))
                self._landing[o["name"]] = (self._view("arena", ref[2], dt, n), cuda.pinned_array(max(n, 1), dt),
                                            n, tuple(ref[4]))
        self._steps = [self._decode(s) for s in manifest["plan"]["steps"]]
        #: whether runs may be captured and replayed as one CUDA graph (``_Graph``); None: not tried
        self.graphs = True
        self._graph_run = None
        self.launch_count = sum(len(s[1]) for s in self._steps if s[0] == "launch")

    # -- decoding the plan once ----------------------------------------------------------------
    def _view(self, kind: str, where: int, dtype, count: int):
        dt = np.dtype(dtype)
        nbytes = int(count) * dt.itemsize
        base = {"arena": self._arena, "weight": self._weights}.get(kind)
        if base is None:
            base = self._inputs[where]
            where = 0
        return base[where:where + max(nbytes, dt.itemsize)].view(dt)

    def _decode(self, step: dict):
        if step["kind"] == "fallback":
            return ("fallback", step)
        launches = []
        for ln in step["launches"]:
            fn = self._namespace[ln["kernel"]]
            args = [self._view(*a) for a in ln["args"]]
            args += [getattr(np, t)(v) for t, v in ln["scalars"]]
            if ln["status"]:
                args.append(self._status)
            launch = _Launch(fn, (tuple(ln["blocks"]), tuple(ln["threads"]), self.stream), args, ln["status"])
            launch.inputs = [(pos, int(where), np.dtype(_np(dt)), int(count))
                             for pos, (kind, where, dt, count) in enumerate(ln["args"]) if kind == "input"]
            launches.append(launch)
        return ("launch", launches, step)

    # -- running ---------------------------------------------------------------------------------
    @property
    def inputs(self) -> list[tuple]:
        """(name, DType, shape) of each input, as ``Executable.inputs``."""
        from ..ir.types import DType

        return [(n, DType[d], s) if d else (n, None, s) for n, _, s, d in self._signature_]

    @property
    def input_names(self) -> list[str]:
        return [n for n, *_ in self._signature_]

    @property
    def output_names(self) -> list[str]:
        return [n for n, *_ in self.outputs]

    @property
    def fast_launch_count(self) -> int:
        """Launches whose arguments are marshalled once (``_Launch``; 0 in the simulator)."""
        return sum(1 for s in self._steps if s[0] == "launch" for ln in s[1] if ln.fast)

    @property
    def fallback(self) -> list[dict]:
        return list(self.manifest["fallback"])

    @property
    def kernels(self) -> list[dict]:
        return list(self.manifest["kernels"])

    def __repr__(self) -> str:
        return f"<kiln CudaExecutable {self.manifest['model']!r}: {self.launch_count} launches>"

    def __call__(self, *arrays):
        if len(arrays) != len(self._signature_):
            raise InputError(f"the model takes {len(self._signature_)} input(s), got {len(arrays)}")
        outs = self.run(dict(zip(self.input_names, arrays)))
        vals = tuple(outs[n] for n in self.output_names)
        return vals[0] if len(vals) == 1 else vals

    def _check(self, inputs: Mapping[str, Any]) -> list:
        from .executable import check_feeds

        shown = "(" + ", ".join(f"{n}: {d}{list(s)}" if d else f"{n}: {s}" for n, _, s, d in self._signature_) + ")"
        return check_feeds(self._signature_, inputs, shown,
                           device_array=lambda a: a if getattr(a, "__cuda_ndarray__", False) else self._cuda.as_cuda_array(a))

    def run(self, inputs: Mapping[str, Any], device_outputs: bool = False) -> dict:
        arrays = self._check(inputs)
        with self._lock:  # one arena: one caller at a time
            if self._graph_run and not device_outputs and \
                    all(isinstance(a, np.ndarray) for a in arrays):
                return self._replay(arrays)
            result = self._run(arrays, device_outputs)
            if self._graph_run is None and not device_outputs and self._graphable(arrays):
                self._graph_run = self._capture(arrays, result) or False
            return result

    def _graphable(self, arrays) -> bool:
        return (all(isinstance(a, np.ndarray) for a in arrays) and not self.manifest["fallback"]
                and set(self._landing) == {o["name"] for o in self.manifest["outputs"]}
                and all(s[0] == "launch" for s in self._steps)
                and all(ln.fast and not ln.status for s in self._steps for ln in s[1]))

    def _enqueue(self, arrays) -> None:
        """The copies in, the launches and the copies out, on the stream (the graph's body)."""
        s = self.stream
        for staged, a in zip(self._staging, arrays):
            if staged is not None and a.size:
                staged[0][:a.size].copy_to_device(staged[1][:a.size], stream=s)
        for step in self._steps:
            for launch in step[1]:
                launch()
        for view, pinned, n, shape in self._landing.values():
            if n:
                view.copy_to_host(pinned, stream=s)

    def _stage(self, arrays) -> None:
        for staged, a in zip(self._staging, arrays):
            if staged is not None and a.size:
                staged[1][:a.size] = a.reshape(-1)

    def _replay(self, arrays) -> dict:
        self._stage(arrays)
        self._graph_run.launch()
        self.stream.synchronize()
        return {name: pinned[:n].reshape(shape).copy() for name, (view, pinned, n, shape) in self._landing.items()}

    def _capture(self, arrays, result: dict):
        """The run as a CUDA graph (``_Graph``), checked against ``result``; None where not possible."""
        import numba

        if numba.config.ENABLE_CUDASIM or not self.graphs:
            return None
        graph = _Graph.capture(self.stream, lambda: self._enqueue(arrays))
        if graph is None:
            return None
        self._graph_run = graph
        try:
            again = self._replay(arrays)
        except Exception:
            return None
        finally:
            self._graph_run = None
        same = all(np.array_equal(again[k], result[k], equal_nan=True) for k in result)
        return graph if same else None

    @property
    def uses_graph(self) -> bool:
        """Whether runs replay one CUDA graph (``_Graph``) instead of launching from Python."""
        return bool(self._graph_run)

    def _run(self, arrays, device_outputs: bool) -> dict:
        s = self.stream
        for staged, a in zip(self._staging, arrays):
            if staged is None or not a.size:
                continue
            flat, pinned = staged
            if isinstance(a, np.ndarray):
                pinned[:a.size] = a.reshape(-1)
                flat[:a.size].copy_to_device(pinned[:a.size], stream=s)
            elif not a.is_c_contiguous():
                raise InputError("a device array input must be C-contiguous")
        # a caller's device array is read where it is: the launches reading an input take a view of it
        device = {i: a.reshape(a.size) for i, a in enumerate(arrays)
                  if self._staging[i] is not None and not isinstance(a, np.ndarray) and a.size}
        env: dict = {}
        for step in self._steps:
            if step[0] == "launch":
                for launch in step[1]:
                    if device and any(where in device for _, where, _, _ in launch.inputs):
                        launch.with_inputs(device)
                    else:
                        launch()
                    if launch.status:
                        self._raise_reported(step[2])
            else:
                self._run_fallback(step[1], arrays, env)
        result = {}
        for o in self.manifest["outputs"]:
            name = o["name"]
            if name in self._landing and not device_outputs:
                view, pinned, n, shape = self._landing[name]
                if n:
                    view.copy_to_host(pinned, stream=s)
                result[name] = pinned  # copied out below, once the stream is done
            else:
                result[name] = self._output(o["ref"], arrays, env, device_outputs)
        s.synchronize()
        for name in self._landing:
            if name in result and not device_outputs:
                view, pinned, n, shape = self._landing[name]
                result[name] = pinned[:n].reshape(shape).copy()  # results never alias Kiln's memory
        return result

    def _raise_reported(self, step: dict) -> None:
        st = self._status.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        if st[0]:
            self._status.copy_to_device(np.zeros(4, np.int64), stream=self.stream)
            value, limit = int(st[1]), int(st[2])
            raise InputError(f"{'+'.join(step['ops'])} node {step['node']!r}: index {value} is out of range for an "
                             f"axis of size {limit} (valid: {-limit} to {limit - 1}); the input data holds an "
                             f"invalid index")

    def _buffer(self, ref, arrays):
        _, kind, where, dtype, shape = ref
        dt = np.dtype(_np(dtype))
        n = int(np.prod(shape, dtype=np.int64))
        if kind == "input":
            a = arrays[where]
            return a.reshape(shape) if isinstance(a, np.ndarray) else a.copy_to_host().reshape(shape)
        if kind == "weight":
            return self._weights_host[where:where + n * dt.itemsize].view(dt).reshape(shape)
        host = self._view(kind, where, dt, n).copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return host.reshape(shape)

    def _output(self, ref, arrays, env, device: bool):
        if ref[0] == "python":
            return env[ref[1]]
        if ref[0] == "input":
            a = arrays[ref[1]]
            return np.array(a) if isinstance(a, np.ndarray) else a.copy_to_host()
        _, kind, where, dtype, shape = ref
        if device and kind == "arena":
            dt = np.dtype(_np(dtype))
            out = self._cuda.device_array(shape, dt, stream=self.stream)
            n = int(np.prod(shape, dtype=np.int64))
            if n:
                out.reshape(n).copy_to_device(self._view(kind, where, dt, n), stream=self.stream)
            return out
        return np.array(self._buffer(ref, arrays))

    def _run_fallback(self, step: dict, arrays, env: dict) -> None:
        from ..ir.interpreter import run_node

        node = self._graph.nodes[step["node"]]
        args = []
        for pos, ref in enumerate(step["inputs"]):
            if ref is None:
                args.append(None)
            elif ref[0] == "input":
                a = arrays[ref[1]]
                args.append(a if isinstance(a, np.ndarray) or not hasattr(a, "copy_to_host") else a.copy_to_host())
            elif ref[0] == "const":
                args.append(node.inputs[ref[1]].const)
            elif ref[0] == "python":
                args.append(env[ref[1]])
            else:
                args.append(self._buffer(ref, arrays))
        results = run_node(node, args)
        for r, ref in zip(results, step["outputs"]):
            if ref[0] == "python":
                env[ref[1]] = r
                continue
            _, kind, where, dtype, shape = ref
            r = np.ascontiguousarray(np.asarray(r))
            dt = np.dtype(_np(dtype))
            if tuple(r.shape) != tuple(shape) or r.dtype != dt:
                raise ArtifactError(f"{node.describe()} (interpreter) gave {r.dtype}{list(r.shape)}, the plan has "
                                    f"{dtype}{list(shape)}")
            if r.size:
                self._view(kind, where, dt, r.size).copy_to_device(r.reshape(-1), stream=self.stream)

    # -- timing ----------------------------------------------------------------------------------
    def time_launches(self, inputs: Mapping[str, Any], runs: int = 5, repeat: int = 10) -> list[tuple[dict, float]]:
        """Per launch: (its step's plan entry with ``kernel`` and ``notes`` of the launch, its median GPU
        time in seconds from CUDA events, each timed over ``repeat`` back-to-back launches). The arena
        holds garbage afterwards (a launch repeated over its own output); the next ``run`` recomputes."""
        return [(entry, float(np.median(times))) for entry, times in self.launch_samples(inputs, runs, repeat)]

    def launch_samples(self, inputs: Mapping[str, Any], runs: int = 5, repeat: int = 10) -> list[tuple[dict, list]]:
        """``time_launches`` with every run's seconds of each launch (a list of ``runs``), not the median."""
        cuda = self._cuda
        self.run(inputs)
        samples: dict[tuple, list[float]] = {}
        with self._lock:
            for _ in range(runs):
                for step in self._steps:
                    if step[0] != "launch":
                        continue
                    for j, launch in enumerate(step[1]):
                        start, end = cuda.event(), cuda.event()
                        start.record(self.stream)
                        for _ in range(repeat):
                            launch()
                        end.record(self.stream)
                        end.synchronize()
                        samples.setdefault((step[2]["step"], j), []).append(start.elapsed_time(end) / 1e3 / repeat)
        out = []
        for step in self._steps:
            if step[0] != "launch":
                continue
            for j, ln in enumerate(step[2]["launches"]):
                entry = dict(step[2], kernel=ln["kernel"], launch=j)
                out.append((entry, samples[(step[2]["step"], j)]))
        return out

    def save(self, path: str | os.PathLike) -> str:
        dest = os.fspath(path)
        if os.path.abspath(dest) == os.path.abspath(self.path):
            return dest
        with staging(dest) as tmp, ArtifactDir(self.path) as d:
            for name in [CUDA_MANIFEST, *self.manifest["files"]]:
                d.copy(name, os.path.join(tmp, name))
        return dest


class _Graph:
    """A whole run (input copies, every launch, output copies) captured once as a CUDA graph and
    replayed with one launch: Python launches cost tens of microseconds each (numba passes each
    array as seven parameters), which for a small model is most of the run. Captured after a run
    has marshalled every launch (``_Launch``), for plans with no host step and no status check,
    through ``cuda.bindings.driver`` (cuda-python, which numba-cuda itself uses); where that is
    missing or capture fails, runs keep launching from Python. The first replay is checked against
    the run it was captured from (bit for bit) before it is used."""

    def __init__(self, cu, exec_, stream):
        self.cu, self.exec_, self.stream = cu, exec_, stream

    def launch(self) -> None:
        (err,) = self.cu.cuGraphLaunch(self.exec_, self.stream)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuGraphLaunch: {err}")

    @staticmethod
    def capture(stream, body) -> "_Graph | None":
        """The graph of what ``body()`` enqueues on ``stream`` (None where it cannot be made)."""
        try:
            from cuda.bindings import driver as cu
        except ImportError:
            try:
                from cuda import cuda as cu  # cuda-python before 12.6
            except ImportError:
                return None
        h = stream.handle
        h = h if isinstance(h, cu.CUstream) else cu.CUstream(int(getattr(h, "value", h) or 0))
        ok = cu.CUresult.CUDA_SUCCESS
        (err,) = cu.cuStreamBeginCapture(h, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        if err != ok:
            return None
        failed = False
        try:
            body()
        except Exception:
            failed = True
        err, graph = cu.cuStreamEndCapture(h)  # always ends the capture, whatever body() did
        if failed or err != ok:
            return None
        err, exec_ = cu.cuGraphInstantiate(graph, 0)
        return _Graph(cu, exec_, h) if err == ok else None


class _Launch:
    """One kernel launch of the plan, its arguments fixed (device memory allocated at load). The
    first call goes through numba (which compiles the kernel); on a GPU it then marshals the
    arguments once (``_marshalled``) and later calls only launch: numba's launch converts every
    argument again on every call, tens of microseconds for a GEMM's twenty. Where numba's internals
    are not as expected (another numba-cuda version) it keeps launching through numba."""

    __slots__ = ("fn", "config", "args", "status", "fast", "inputs")

    def __init__(self, fn, config, args, status: bool):
        self.fn, self.config, self.args, self.status = fn, config, args, status
        self.fast = None  # None: not tried yet; False: not available
        self.inputs: list = []  # (argument position, input index, dtype, count) of the args viewing an input

    def with_inputs(self, device: dict) -> None:
        """The launch with the arguments viewing input i replaced by views of ``device[i]`` (a caller's
        device array, flat): the kernel reads the caller's memory, nothing copied."""
        args = list(self.args)
        for pos, where, dt, count in self.inputs:
            a = device.get(where)
            if a is not None:
                args[pos] = (a if a.dtype == dt else a.view(np.uint8).view(dt))[:max(count, 1)]
        self.fn[self.config](*args)

    def __call__(self) -> None:
        if self.fast:
            self.fast()
            return
        self.fn[self.config](*self.args)  # configured at each call: the simulator's kernels keep one
        if self.fast is None:
            self.fast = _marshalled(self.fn, self.config, self.args) or False


def _marshalled(fn, config, args):
    """A callable launching ``fn`` on ``args`` with arguments converted once, or None."""
    import sys

    import numba

    if numba.config.ENABLE_CUDASIM:
        return None
    try:
        kernels = list(fn.overloads.values())
        if len(kernels) != 1 or getattr(kernels[0], "debug", False):
            return None
        k = kernels[0]
        blocks, threads, stream = config
        grid = tuple(blocks) + (1,) * (3 - len(blocks))
        block = tuple(threads) + (1,) * (3 - len(threads))
        retr: list = []
        kargs: list = []
        for t, v in zip(k.argument_types, args):
            k._prepare_args(t, v, stream, retr, kargs)
        if retr:
            return None
        cufunc = k._codelibrary.get_cufunc()
        mod = sys.modules[type(k).__module__]
        if hasattr(mod, "LaunchConfig") and hasattr(mod, "launch") and hasattr(cufunc, "kernel"):
            cooperative = {"is_cooperative": False} if getattr(mod, "CUDA_CORE_GE_1_0", True) else \
                {"cooperative_launch": False}
            cfg = mod.LaunchConfig(grid=grid, block=block, shmem_size=0, **cooperative)
            kernel, launch = cufunc.kernel, mod.launch
            return lambda: launch(stream, cfg, kernel, *kargs)
        driver = mod.driver
        handle = stream.handle
        return lambda: driver.launch_kernel(cufunc.handle, *grid, *block, 0, handle, kargs)
    except Exception:  # numba internals differ: keep numba's own launch
        return None


def _np(name: str) -> str:
    from ..ir.types import DType

    return DType[name].np if name in DType.__members__ else name


def _exec_kernels(source: str, label: str) -> dict:
    """The kernels of ``kernels.py`` (compiled by numba on first launch)."""
    import math

    import numba

    ns: dict = {"__name__": "kiln_cuda_kernels"}
    exec(compile(source, os.path.join(label, KERNELS), "exec"), ns)
    if numba.config.ENABLE_CUDASIM:  # the simulator's math: IEEE results where Python's math raises
        from ..codegen.loops.cuda import _SimMath

        ns["math"] = _SimMath()
    else:
        ns["math"] = math
    return ns


__all__ = ["CUDA_MANIFEST", "CudaExecutable", "is_cuda_artifact", "load_cuda", "write_cuda_artifact"]
