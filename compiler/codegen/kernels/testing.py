"""Run a graph kernel by kernel, each node a group of one, buffers in NumPy: a test bench for
lowerings (``run_kernels(graph, inputs)``), independent of the program builder and the runtime.

Every node must have a native lowering (view ops included, copied here). Results come back as a
dict output name -> array, to compare with the reference interpreter.
"""
from __future__ import annotations

import ctypes
import os
import tempfile
from typing import Mapping

import numpy as np

from ...ir.graph import Graph
from ..gemm.config import model_config
from ..llvm import toolchain
from ..llvm.elementwise import new_module
from ..llvm.target import Target, host_target
from . import EMPTY, KernelBuilder, KernelGroup, Services, lowering_for


def build_kernels(graph: Graph, target: Target | None = None):
    """(the module, its Services, [(group, KernelBuilder or None for a view)]): every node of
    ``graph`` lowered into one module, a kernel each (``kernel{i}``)."""
    target = target or host_target()
    module = new_module("bench", target)
    services = Services(module, target, model_config(target))
    plan = []
    for i, node in enumerate(graph.nodes):
        group = KernelGroup.of_node(node)
        low, why = lowering_for(group)
        if low is None:
            raise NotImplementedError(f"{node.describe()}: {why}")
        if low.alias:
            plan.append((group, None))
            continue
        k = KernelBuilder(services, f"kernel{i}", group, internal=False)
        low.emit(k, group)
        k.finish()
        plan.append((group, k))
    return module, services, plan


def run_kernels(graph: Graph, inputs: Mapping[str, np.ndarray], target: Target | None = None,
                nthreads: int = 2) -> dict[str, np.ndarray]:
    target = target or host_target()
    module, services, plan = build_kernels(graph, target)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.so")
        objects = [toolchain.compile_ir(str(module), target)]
        if services.uses_gemm:
            from ..gemm.build import gemm_object

            objects.append(gemm_object(services.gemm_cfg))
        if services.uses_parallel:
            from ..native import support_object

            objects.append(support_object())
        toolchain.link_shared(objects, path, extra_args=["-lpthread"])
        lib = toolchain.load_library(path)
        env = {v: np.ascontiguousarray(inputs[v.name]) for v in graph.inputs}
        env.update({c: np.ascontiguousarray(c.const) for c in graph.constants})
        keep = []
        for group, k in plan:
            if k is None:
                x = group.node.inputs[0]
                env[group.node.outputs[0]] = env[x].reshape([int(d) for d in group.node.outputs[0].shape])
                continue
            for v in group.outputs:
                env[group.outer_of(v)] = _aligned(np.empty([int(d) for d in v.shape], v.type.dtype.np))
            ptrs = []
            for s in k.slots:
                if s.kind == "value" and s.value.const is not None:  # also a kernel body's constants
                    arr = env.setdefault(s.value, np.ascontiguousarray(s.value.const))
                    ptrs.append(arr.ctypes.data)
                elif s.kind == "value":
                    arr = env[s.value] if s.value in env else env.setdefault(
                        s.value, _aligned(np.empty([int(d) for d in s.value.shape], s.value.type.dtype.np)))
                    ptrs.append(arr.ctypes.data)
                elif s.kind == "weight":
                    keep.append(s.array)
                    ptrs.append(s.array.ctypes.data)
                else:
                    buf = _aligned(np.empty(k.scratch_bytes, np.uint8))
                    keep.append(buf)
                    ptrs.append(buf.ctypes.data + s.offset)
            table = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
            fn = getattr(lib, k.name)
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int32], None
            fn(ctypes.cast(table, ctypes.c_void_p), nthreads)
        return {name: np.array(env[v]) for name, v in zip(graph.output_names, graph.outputs)}


def _aligned(a: np.ndarray) -> np.ndarray:
    raw = np.empty(a.nbytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)


def run_cuda_forms(graph: Graph, inputs: Mapping[str, np.ndarray], threads: int = 4) -> dict[str, np.ndarray]:
    """Run each node of ``graph`` (one kernel each, every node's lowering built on the loop form) with
    the numba.cuda printer (in numba's CUDA simulator without a GPU); returns each output by name.
    Each array is passed as its buffer's element type (data movement sees every type as its bits)."""
    from ..loops.cuda import print_cuda

    env = {v: np.ascontiguousarray(inputs[v.name]) for v in graph.inputs}
    for node in graph.nodes:
        low, why = lowering_for(KernelGroup.of_node(node))
        if low is None or not (hasattr(low, "form") or low is EMPTY):
            raise NotImplementedError(f"{node.describe()}: {why or 'not built on the loop form'}")
        for y in node.outputs:
            env[y] = np.zeros([int(d) for d in y.shape], y.type.dtype.np)
        if low is EMPTY:  # results without elements: nothing to run
            continue
        cu = print_cuda(low.form(KernelGroup.of_node(node), "k"))
        cu.launch([_array(b, env).reshape(-1).view(b.dtype.np) for b in cu.buffers], threads=threads)
    return {name: env[v] for name, v in zip(graph.output_names, graph.outputs)}


def _array(buf, env) -> np.ndarray:
    """The array for a buffer: its own scratch, compile-time data, a value computed or fed, or a constant."""
    value = buf.value
    if buf.role == "scratch":
        return np.zeros(max(buf.extent, 1), buf.dtype.np)
    if isinstance(value, np.ndarray):
        return value
    return env[value] if value in env else np.ascontiguousarray(value.const)
