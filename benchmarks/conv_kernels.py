"""Time Kiln's Conv / MatMul kernels against ONNX Runtime single-node models (same thread count).

    PYTHONPATH=. .venv/bin/python benchmarks/conv_kernels.py [--threads 2] [--only NAME]

``--cpu-time --threads 1`` times by process CPU time: on a machine other processes load, it
compares per-core efficiency fairly. Each case is compiled once (one kernel, with the GEMM
configuration of a model's artifact: ``model_config``); Kiln and ORT are timed alternately in rounds
and the best round of each is reported (the machine is shared: best-of is the least noisy statistic
here). "ratio" is ORT's time over Kiln's: above 1, Kiln is faster. ORT's single-node session pays
its NCHWc layout reorders at the node's edges, which it does not inside a model: these ratios
flatter Kiln on convolutions.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
import time

import numpy as np

from compiler.codegen.gemm.config import model_config
from compiler.codegen.kernels import KernelBuilder, KernelGroup, Services, lowering_for
from compiler.codegen.kernels.testing import _aligned
from compiler.codegen.llvm import toolchain
from compiler.codegen.llvm.elementwise import new_module
from compiler.codegen.llvm.target import host_target
from compiler.ir.graph import Graph
from compiler.ir.ops import conv as cv
from compiler.ir.ops import linalg as la
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(0)

# name, x shape, Cout, kernel, group, attrs
CONVS = [
    ("res conv1 7x7/2", (1, 3, 224, 224), 64, (7, 7), 1, dict(strides=(2, 2), pads=(3, 3, 3, 3))),
    ("res2 3x3 64", (1, 64, 56, 56), 64, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("res2 1x1 256->64", (1, 256, 56, 56), 64, (1, 1), 1, {}),
    ("res2 1x1 64->256", (1, 64, 56, 56), 256, (1, 1), 1, {}),
    ("res3 3x3 128", (1, 128, 28, 28), 128, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("res3 3x3/2 128", (1, 128, 56, 56), 128, (3, 3), 1, dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    ("res4 3x3 256", (1, 256, 14, 14), 256, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("res4 3x3/2 256", (1, 256, 28, 28), 256, (3, 3), 1, dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    ("res5 3x3 512", (1, 512, 7, 7), 512, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("res5 3x3/2 512", (1, 512, 14, 14), 512, (3, 3), 1, dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    ("res 1x1/2 down 256->512", (1, 256, 56, 56), 512, (1, 1), 1, dict(strides=(2, 2))),
    ("dense 3x3 128->32 56", (1, 128, 56, 56), 32, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("dense 3x3 128->32 28", (1, 128, 28, 28), 32, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("dense 3x3 128->32 14", (1, 128, 14, 14), 32, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("mbv2 dw 3x3 144", (1, 144, 56, 56), 144, (3, 3), 144, dict(pads=(1, 1, 1, 1))),
    ("mbv2 dw 3x3/2 144", (1, 144, 56, 56), 144, (3, 3), 144, dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    ("mbv2 dw 3x3 32 112", (1, 32, 112, 112), 32, (3, 3), 32, dict(pads=(1, 1, 1, 1))),
    ("mbv2 dw 3x3 960 7", (1, 960, 7, 7), 960, (3, 3), 960, dict(pads=(1, 1, 1, 1))),
    ("mbv2 conv1 3x3/2 3->32", (1, 3, 224, 224), 32, (3, 3), 1, dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    ("mbv2 1x1 16->96 112", (1, 16, 112, 112), 96, (1, 1), 1, {}),
    ("mbv2 1x1 24->144 56", (1, 24, 56, 56), 144, (1, 1), 1, {}),
    ("mbv2 1x1 320->1280 7", (1, 320, 7, 7), 1280, (1, 1), 1, {}),
    ("mbv2 1x1 960->160 7", (1, 960, 7, 7), 160, (1, 1), 1, {}),
    # the projections that narrow the channels (each followed by a residual add in the model)
    ("mbv2 1x1 32->16 112", (1, 32, 112, 112), 16, (1, 1), 1, {}),
    ("mbv2 1x1 144->24 56", (1, 144, 56, 56), 24, (1, 1), 1, {}),
    ("mbv2 1x1 192->32 28", (1, 192, 28, 28), 32, (1, 1), 1, {}),
    ("mbv2 1x1 384->64 14", (1, 384, 14, 14), 64, (1, 1), 1, {}),
    ("mbv2 1x1 576->96 14", (1, 576, 14, 14), 96, (1, 1), 1, {}),
    ("mbv2 1x1 384->96 14", (1, 384, 14, 14), 96, (1, 1), 1, {}),
    ("squeeze conv1 3x3/2 3->64", (1, 3, 224, 224), 64, (3, 3), 1, dict(strides=(2, 2))),
    ("squeeze fire 1x1 16->64 55", (1, 16, 55, 55), 64, (1, 1), 1, {}),
    ("squeeze fire 3x3 16->64 55", (1, 16, 55, 55), 64, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("shufflenet g3 1x1", (1, 240, 28, 28), 60, (1, 1), 3, {}),
    # ResNet-18 (width 16) at 64x64, the real-architecture suite's size: few pixels, many channels
    ("r18@64 3x3 64 4x4", (1, 64, 4, 4), 64, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("r18@64 3x3 128 2x2", (1, 128, 2, 2), 128, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
    ("r18@64 3x3/2 64->128", (1, 64, 4, 4), 128, (3, 3), 1, dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    ("r18@64 3x3 16 16x16", (1, 16, 16, 16), 16, (3, 3), 1, dict(pads=(1, 1, 1, 1))),
]
# name, A shape, B shape (B constant when the flag says so)
MATMULS = [
    ("bert qkv 128x256x768", (1, 128, 256), (256, 768), True),
    ("bert ffn up 128x256x1024", (1, 128, 256), (256, 1024), True),
    ("bert attn QK^T 4x128x64x128", (1, 4, 128, 64), (1, 4, 64, 128), False),
    ("bert attn PV 4x128x128x64", (1, 4, 128, 128), (1, 4, 128, 64), False),
    ("r18@64 tail as GEMM 4x1152x128", (1, 4, 1152), (1152, 128), True),
]


def conv_graph(xs, m, k, group, attrs):
    g = Graph("b")
    x = g.add_input("x", TensorType(DType.f32, xs))
    w = RNG.standard_normal((m, xs[1] // group) + k).astype(np.float32) * 0.1
    b = RNG.standard_normal(m).astype(np.float32)
    y = g.add(cv.Conv(group=group, **attrs), x, g.add_constant(w, "w"), g.add_constant(b, "b"))
    g.set_outputs([y], ["y"])
    return g, {"x": RNG.standard_normal(xs).astype(np.float32)}, (w, b)


def matmul_graph(sa, sb, bconst):
    g = Graph("b")
    a = g.add_input("a", TensorType(DType.f32, sa))
    feed = {"a": RNG.standard_normal(sa).astype(np.float32)}
    bw = RNG.standard_normal(sb).astype(np.float32)
    if bconst:
        bv = g.add_constant(bw, "w")
    else:
        bv = g.add_input("b", TensorType(DType.f32, sb))
        feed["b"] = bw
    y = g.add(la.MatMul(), a, bv)
    g.set_outputs([y], ["y"])
    return g, feed, bw


class Compiled:
    """One node compiled to one kernel; ``__call__`` runs it on fixed buffers."""

    def __init__(self, graph: Graph, feed, nthreads: int):
        target = host_target()
        module = new_module("bench", target)
        services = Services(module, target, model_config(target))
        node = graph.nodes[0]
        group = KernelGroup.of([node])
        low, why = lowering_for(group)
        assert low is not None, why
        k = KernelBuilder(services, "kernel0", group, internal=False)
        low.emit(k, group)
        k.finish()
        self.tmp = tempfile.TemporaryDirectory()
        path = os.path.join(self.tmp.name, "b.so")
        objects = [toolchain.compile_ir(str(module), target)]
        if getattr(services, "uses_gemm", False):  # the GEMM compiled once, linked in
            from compiler.codegen.gemm.build import gemm_object

            objects.append(gemm_object(services.gemm_cfg))
        if services.uses_parallel:  # the shared thread pool (kiln_parallel_for)
            from compiler.codegen.native import support_object

            objects.append(support_object())
        toolchain.link_shared(objects, path, extra_args=["-lpthread"])
        self.lib = toolchain.load_library(path)
        env = {v: _copy(feed[v.name]) for v in graph.inputs}
        env.update({c: _copy(c.const) for c in graph.constants})
        self.y = _aligned(np.empty([int(d) for d in node.outputs[0].shape], np.float32))
        env[node.outputs[0]] = self.y
        self.keep, ptrs = [env], []
        scratch = _aligned(np.empty(max(k.scratch_bytes, 64), np.uint8))
        for s in k.slots:
            if s.kind == "value":
                ptrs.append(env[s.value].ctypes.data)
            elif s.kind == "weight":
                arr = _copy(s.array)
                self.keep.append(arr)
                ptrs.append(arr.ctypes.data)
            else:
                ptrs.append(scratch.ctypes.data + s.offset)
        self.keep.append(scratch)
        self.table = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        self.fn = getattr(self.lib, k.name)
        self.fn.argtypes, self.fn.restype = [ctypes.c_void_p, ctypes.c_int32], None
        self.nthreads = nthreads

    def __call__(self):
        self.fn(ctypes.cast(self.table, ctypes.c_void_p), self.nthreads)


def _copy(a):
    out = _aligned(np.empty(np.shape(a), np.asarray(a).dtype))
    out[...] = a
    return out


def ort_session(graph_kind, spec, weights, nthreads):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    if graph_kind == "conv":
        _, xs, m, k, group, attrs = spec
        w, b = weights
        attrs = {kk: list(v) for kk, v in attrs.items()}
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, kernel_shape=list(k), **attrs)
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
        ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)]
    else:
        _, sa, sb, bconst = spec
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        inits = [numpy_helper.from_array(weights, "b")] if bconst else []
        ins = [helper.make_tensor_value_info("a", TensorProto.FLOAT, sa)]
        if not bconst:
            ins.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, sb))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([node], "g", ins, [out], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = nthreads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


CLOCK = time.perf_counter


def best_time(fn, budget=0.15):
    fn()
    t0 = CLOCK()
    fn()
    one = max(CLOCK() - t0, 1e-6)
    reps = max(1, int(budget / one / 3))
    best = float("inf")
    for _ in range(3):
        t0 = CLOCK()
        for _ in range(reps):
            fn()
        best = min(best, (CLOCK() - t0) / reps)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by process CPU time (a loaded machine; meaningful with --threads 1 only)")
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    cases = [("conv", c) for c in CONVS] + [("matmul", mm) for mm in MATMULS]
    print(f"{'case':32s} {'GFLOP':>7s} {'kiln ms':>8s} {'ort ms':>8s} {'kiln GF/s':>9s} {'ort GF/s':>9s} {'ratio':>6s}")
    for kind, spec in cases:
        if args.only and args.only not in spec[0]:
            continue
        if kind == "conv":
            g, feed, weights = conv_graph(*spec[1:])
        else:
            g, feed, weights = matmul_graph(*spec[1:])
        flops = g.nodes[0].op.cost([v.type for v in g.nodes[0].inputs if v is not None],
                                   [v.type for v in g.nodes[0].outputs]).flops
        kiln = Compiled(g, feed, args.threads)
        sess = ort_session(kind, spec, weights, args.threads)
        kiln()
        want = sess.run(None, feed)[0]
        err = float(np.abs(kiln.y - want).max() / max(1.0, np.abs(want).max()))
        assert err < 1e-3, (spec[0], err)
        tk = to = float("inf")
        for _ in range(args.rounds):
            tk = min(tk, best_time(kiln))
            to = min(to, best_time(lambda: sess.run(None, feed)))
        print(f"{spec[0]:32s} {flops / 1e9:7.3f} {tk * 1e3:8.3f} {to * 1e3:8.3f} {flops / tk / 1e9:9.1f} "
              f"{flops / to / 1e9:9.1f} {to / tk:6.2f}", flush=True)


if __name__ == "__main__":
    main()
