"""The parallel-for facility (KernelBuilder.parallel_for, native/parallel.c) and the lowerings that use
it: results must not depend on the thread count, small loops run inline, chunks cover [0, n) once."""
from __future__ import annotations

import ctypes
import os
import tempfile

import numpy as np
import pytest

import compiler
from compiler.codegen.gemm.config import config_for_target
from compiler.codegen.kernels import KernelBuilder, KernelGroup, Services
from compiler.codegen.kernels.base import F32
from compiler.codegen.kernels.testing import _aligned, run_kernels
from compiler.codegen.llvm import toolchain
from compiler.codegen.llvm.elementwise import new_module
from compiler.codegen.llvm.target import host_target
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import conv as cv
from compiler.ir.ops import elementwise as ew
from compiler.ir.ops import indexing as ix
from compiler.ir.ops import norm as nm
from compiler.ir.ops import pool as P
from compiler.ir.ops import reduce as rd
from compiler.ir.ops import shape as sh
from compiler.ir.ops import tensor as tn
from compiler.ir.types import DType, TensorType

from ..threads import run_threads

RNG = np.random.default_rng(5)


def _chain(shape=(64, 4096)):
    """A large elementwise chain (one kernel whose outer loop parallel_for splits)."""
    g = Graph("chain")
    x = g.add_input("x", TensorType(DType.f32, shape))
    w = g.add_input("w", TensorType(DType.f32, shape[-1:]))
    y = g.add(ew.Tanh(), g.add(ew.Mul(), g.add(ew.Add(), x, w), x))
    g.set_outputs([y], ["y"])
    ins = {"x": RNG.standard_normal(shape).astype(np.float32),
           "w": RNG.standard_normal(shape[-1:]).astype(np.float32)}
    return g, ins


# ---------------------------------------------------------------------------------------------
# the facility

def test_compile_same_result_any_thread_count():
    g, ins = _chain()
    exe = compiler.compile(g, nthreads=1)
    ref = exe.run(ins)["y"]
    np.testing.assert_allclose(ref, interpret(g, ins)["y"], rtol=1e-5, atol=1e-6)
    for n in (2, 8):
        exe.nthreads = n
        np.testing.assert_array_equal(exe.run(ins)["y"], ref)
    np.testing.assert_array_equal(compiler.compile(g, nthreads=2).run(ins)["y"], ref)


def test_run_kernels_same_result_any_thread_count():
    g, ins = _chain((33, 3001))  # rows not divisible by the chunking
    ref = run_kernels(g, ins, nthreads=1)["y"]
    for n in (2, 8):
        np.testing.assert_array_equal(run_kernels(g, ins, nthreads=n)["y"], ref)


def test_concurrent_calls():
    g, _ = _chain((48, 4096))
    exe = compiler.compile(g, nthreads=2)
    inputs = [_chain((48, 4096))[1] for _ in range(4)]
    want = [exe.run(i)["y"] for i in inputs]

    def worker(t):
        for r in range(10):
            j = (t + r) % len(inputs)
            assert np.array_equal(exe.run(inputs[j])["y"], want[j]), (t, r)

    errors = run_threads(worker, 4)
    assert not errors


class _Probe:
    """A kernel of its own: y[i] += 1 and first[i] = begin of the chunk, over a parallel_for of
    ``count`` iterations, y zeroed first on the calling thread; with ``chunks``, the kernel's chunks per
    thread."""

    def __init__(self, count: int, min_per_task: int = 1, chunks: int | None = None):
        g = Graph("probe")
        x = g.add_input("x", TensorType(DType.f32, (max(count, 1),)))
        node = g.add_node(ew.Relu(), [x])
        node2 = g.add_node(ew.Relu(), [x])
        self.group = KernelGroup([node, node2], (x,), (node.outputs[0], node2.outputs[0]))
        self.y, self.first = node.outputs[0], node2.outputs[0]
        target = host_target()
        self.module = new_module("probe", target)
        self.services = Services(self.module, target, config_for_target(target))
        k = KernelBuilder(self.services, "probe", self.group, internal=False)
        k.chunks_per_thread = chunks
        yp = k.ptr(self.y)
        k.ptr(self.first)
        with k.loop(count) as i:
            k.store(ir_f32(0.0), yp, i)
        with k.parallel_for(count, min_per_task) as (lo, hi):
            b = k.b
            yp, fp = k.ptr(self.y), k.ptr(self.first)
            with k.loop(b.sub(hi, lo)) as j:
                i = b.add(lo, j)
                k.store(b.fadd(k.load(yp, i), ir_f32(1.0)), yp, i)
                k.store(b.sitofp(lo, F32), fp, i)
        k.finish()
        self.k, self.count = k, count

    def run(self, nthreads: int):
        from compiler.codegen.native import support_object

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "probe.so")
            objects = [toolchain.compile_ir(str(self.module), self.services.target)]
            if self.services.uses_parallel:
                objects.append(support_object())
            toolchain.link_shared(objects, path, extra_args=["-lpthread"])
            lib = toolchain.load_library(path)
            n = max(self.count, 1)
            bufs = {id(self.y): _aligned(np.full(n, 7, np.float32)),
                    id(self.first): _aligned(np.full(n, -1, np.float32))}
            x = _aligned(np.zeros(n, np.float32))
            ptrs = [bufs[id(s.value)].ctypes.data if id(s.value) in bufs else x.ctypes.data for s in self.k.slots]
            table = (ctypes.c_void_p * len(ptrs))(*ptrs)
            fn = lib.probe
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int32], None
            fn(ctypes.cast(table, ctypes.c_void_p), nthreads)
            return bufs[id(self.y)][:self.count].copy(), bufs[id(self.first)][:self.count].copy()


def ir_f32(v: float):
    from llvmlite import ir

    return ir.Constant(F32, v)


@pytest.mark.parametrize("count", [7, 9, 37, 1000])
def test_chunks_cover_each_index_once(count):
    p = _Probe(count)
    assert p.services.uses_parallel
    for nthreads in (1, 2, 3, 8):
        y, first = p.run(nthreads)
        np.testing.assert_array_equal(y, np.ones(count, np.float32), err_msg=f"nthreads={nthreads}")
        # chunks are contiguous ranges starting at 0 and covering [0, count)
        starts = np.unique(first)
        assert starts[0] == 0
        assert np.all(np.diff(first) >= 0)
        for s in starts:
            assert first[int(s)] == s  # each chunk starts where its first index is
        if nthreads == 1:
            assert np.all(first == 0)  # one call: the whole range on the calling thread
        if nthreads == 2 and count == 7:  # about 4 chunks per thread: 7 chunks of 1 row
            assert len(starts) == 7


@pytest.mark.parametrize("chunks", [1, 8])
def test_chunks_per_thread(chunks):
    """A kernel's own chunks per thread (the int8 kernels take 8): 37 iterations on 2 threads in about
    2 * chunks chunks (of ceil(37 / (2 * chunks)) iterations), each index once, whatever the threads."""
    p = _Probe(37, chunks=chunks)
    assert "kiln_parallel_for_chunks" in str(p.module)
    size = -(-37 // (2 * chunks))
    for nthreads in (1, 2, 3):
        y, first = p.run(nthreads)
        np.testing.assert_array_equal(y, np.ones(37, np.float32), err_msg=f"nthreads={nthreads}")
        if nthreads == 2:
            np.testing.assert_array_equal(np.unique(first), np.arange(0, 37, size))


def test_small_count_runs_inline():
    p = _Probe(3, min_per_task=2)  # 3 < 2 * 2: no pool
    assert not p.services.uses_parallel
    assert "kiln_parallel_for" not in str(p.module)
    for nthreads in (1, 2):
        y, first = p.run(nthreads)
        np.testing.assert_array_equal(y, np.ones(3, np.float32))
        np.testing.assert_array_equal(first, np.zeros(3, np.float32))
    p = _Probe(4, min_per_task=2)
    assert p.services.uses_parallel and "call void @\"kiln_parallel_for\"" in str(p.module)


def test_small_kernels_have_no_parallel_call():
    g, ins = _chain((4, 256))
    from compiler.codegen.program import build_program

    prog = build_program(g, host_target())
    assert not prog.uses_parallel and "kiln_parallel_for" not in prog.llvm_ir


# ---------------------------------------------------------------------------------------------
# lowerings that split their loops: bit-identical for 1, 2 and 3 threads, and right


def _same_any_threads(g: Graph, ins: dict, rtol=1e-5, atol=1e-6, exact=False):
    one = run_kernels(g, ins, nthreads=1)
    for n in (2, 3):
        got = run_kernels(g, ins, nthreads=n)
        for name in one:
            np.testing.assert_array_equal(got[name], one[name], err_msg=f"{name} nthreads={n}")
    ref = interpret(g, ins)
    for name in ref:
        if exact:
            np.testing.assert_array_equal(one[name], ref[name], err_msg=name)
        else:
            np.testing.assert_allclose(one[name], ref[name], rtol=rtol, atol=atol, err_msg=name)


def _uses_parallel(g: Graph) -> bool:
    """Whether every kernel of the graph calls the pool (each node compiled on its own)."""
    from compiler.codegen.kernels import lowering_for
    from compiler.codegen.kernels.base import Services as S

    for node in g.nodes:
        group = KernelGroup.of([node])
        low, why = lowering_for(group)
        assert low is not None, why
        if low.alias:
            continue
        target = host_target()
        services = S(new_module("one", target), target, config_for_target(target))
        k = KernelBuilder(services, "one", group)
        low.emit(k, group)
        k.finish()
        if not services.uses_parallel:
            return False
    return True


def _graph(shape, build, dtype=DType.f32):
    g = Graph("p")
    x = g.add_input("x", TensorType(dtype, tuple(shape)))
    outs = build(g, x)
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    return g


def test_pools_split():
    shape = (2, 32, 61, 67)
    g = _graph(shape, lambda g, x: [
        g.add_node(P.MaxPool(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), [x]).outputs[0],
        g.add(P.AveragePool(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1), x),
        g.add(P.GlobalAveragePool(), x), g.add(P.GlobalMaxPool(), x)])
    ins = {"x": RNG.standard_normal(shape).astype(np.float32)}
    assert _uses_parallel(g)
    _same_any_threads(g, ins)


def test_norms_split():
    g = Graph("n")
    a = g.add_input("a", TensorType(DType.f32, (12, 128, 129)))
    c = g.add_input("c", TensorType(DType.f32, (40, 33, 300)))
    s = g.add_input("s", TensorType(DType.f32, (770,)))
    h = g.add_input("h", TensorType(DType.f32, (130, 770)))
    r = g.add_input("r", TensorType(DType.f32, (1, 32, 57, 57)))
    outs = [g.add(nm.Softmax(axis=-1), a), g.add(nm.LogSoftmax(axis=-1), a),
            g.add(nm.Softmax(axis=1), c), g.add(nm.LogSoftmax(axis=1), c)]
    ln = g.add_node(nm.LayerNormalization(axis=-1, epsilon=1e-5), [h, s, s], 3)
    outs += list(ln.outputs)
    bias = g.add_constant(RNG.standard_normal((770,)).astype(np.float32))
    outs.append(g.add_node(nm.LayerNormalization(axis=1, epsilon=1e-5), [h, s, bias], 3).outputs[0])
    z = g.add_input("z", TensorType(DType.f32, (64, 24, 100)))
    zs = g.add_constant(RNG.standard_normal((100,)).astype(np.float32))
    outs.append(g.add_node(nm.LayerNormalization(axis=1, epsilon=1e-5), [z, zs, zs], 3).outputs[0])
    outs.append(g.add(cv.LRN(size=5, alpha=1e-3, beta=0.75, bias=1.0), r))
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    ins = {"a": RNG.standard_normal((12, 128, 129)).astype(np.float32) * 4,
           "c": RNG.standard_normal((40, 33, 300)).astype(np.float32) * 4,
           "s": RNG.standard_normal((770,)).astype(np.float32),
           "h": RNG.standard_normal((130, 770)).astype(np.float32),
           "r": RNG.standard_normal((1, 32, 57, 57)).astype(np.float32),
           "z": RNG.standard_normal((64, 24, 100)).astype(np.float32)}
    assert _uses_parallel(g)
    _same_any_threads(g, ins, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("axes,keep", [((1,), 1), ((2, 3), 0), ((1, 3), 1), ((0,), 0), ((3,), 1)])
def test_reductions_split(axes, keep):
    shape = (8, 24, 40, 37)
    axes_v = np.array(axes, np.int64)

    def build(g, x):
        ax = g.add_constant(axes_v)
        return [g.add(op(keepdims=keep), x, ax) for op in (rd.ReduceSum, rd.ReduceMean, rd.ReduceMax,
                                                           rd.ReduceMin)]
    g = _graph(shape, build)
    ins = {"x": RNG.standard_normal(shape).astype(np.float32)}
    assert _uses_parallel(g) == (0 not in axes)  # the outermost kept axes are split
    # sums of ~900 normal values (magnitude ~30) in float32: 1e-5 absolute is below their rounding
    _same_any_threads(g, ins, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dt", [DType.f32, DType.i8, DType.f64])
def test_data_split(dt):
    def rand(shape):
        if dt is DType.i8:
            return RNG.integers(-128, 127, shape, dtype=np.int8)
        return RNG.standard_normal(shape).astype(dt.np)

    g = Graph("d")
    shapes = [(1, 64, 56, 56), (1, 32, 56, 56), (1, 96, 56, 56)]
    xs = [g.add_input(f"x{i}", TensorType(dt, s)) for i, s in enumerate(shapes)]
    t = g.add_input("t", TensorType(dt, (64, 56, 57)))
    w = g.add_input("w", TensorType(dt, (3, 2000, 97)))
    outs = [g.add(tn.Concat(axis=1), *xs), g.add(tn.Concat(axis=3), xs[0], xs[0]),
            g.add(sh.Transpose(perm=(0, 2, 1)), t), g.add(sh.Transpose(perm=(0, 2, 3, 1)), xs[0]),
            g.add(sh.Transpose(perm=(2, 0, 1)), w)]
    idx = g.add_constant(RNG.integers(-2000, 2000, (1500,)).astype(np.int64))
    outs.append(g.add(ix.Gather(axis=1), w, idx))
    ridx = g.add_input("ridx", TensorType(DType.i64, (700,)))
    outs.append(g.add(ix.Gather(axis=1), w, ridx))
    outs.append(g.add(tn.Slice(), xs[2], g.add_constant(np.array([1, 3], np.int64)),
                      g.add_constant(np.array([55, 50], np.int64)), g.add_constant(np.array([2, 3], np.int64))))
    outs.append(g.add(tn.Pad(mode="constant"), xs[2], g.add_constant(np.array([0, 0, 2, 3, 0, 0, 1, 2], np.int64))))
    outs.append(g.add(tn.Expand(), g.add_input("e", TensorType(dt, (1, 1, 1, 3000))),
                      g.add_constant(np.array([2, 3, 40, 1], np.int64))))
    outs.append(g.add(ew.Cast(to=DType.f32 if dt is not DType.f32 else DType.i32), w))
    cond = g.add_input("cond", TensorType(DType.bool, (3, 1, 97)))
    outs.append(g.add(ew.Where(), cond, w, g.add_input("v", TensorType(dt, (2000, 1)))))
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    ins = {f"x{i}": rand(s) for i, s in enumerate(shapes)}
    ins.update(t=rand((64, 56, 57)), w=rand((3, 2000, 97)), e=rand((1, 1, 1, 3000)), v=rand((2000, 1)),
               ridx=RNG.integers(-2100, 2100, (700,)).astype(np.int64),
               cond=RNG.integers(0, 2, (3, 1, 97)).astype(bool))
    ins["ridx"][ins["ridx"] < -2000] = 0  # in range (out-of-range indices differ from the interpreter)
    ins["ridx"][ins["ridx"] >= 2000] = 1
    assert _uses_parallel(g) or dt is DType.i8  # (small byte tensors: some run on one thread)
    _same_any_threads(g, ins, exact=True)



def test_small_batched_matmuls_split_over_the_batch():
    """Attention's per-head products are each too small for a parallel GEMM: the batch indices are
    the pool's tasks (each product computed by one thread: the same bits on any thread count), also
    with the scaled, masked scores computed inside the GEMMs (MatMul + Mul + Add, one kernel)."""
    from compiler.ir.ops import linalg as la

    ins = {"q": RNG.standard_normal((1, 4, 32, 16)).astype(np.float32),
           "k": RNG.standard_normal((1, 4, 16, 32)).astype(np.float32)}
    g = Graph("attn")
    q, k = (g.add_input(n, TensorType(DType.f32, a.shape)) for n, a in ins.items())
    s = g.add(la.MatMul(), q, k)
    g.set_outputs([s], ["s"])
    assert _uses_parallel(g)
    _same_any_threads(g, ins)
    mask = g.add_constant(RNG.standard_normal((1, 1, 1, 32)).astype(np.float32))
    y = g.add(ew.Add(), g.add(ew.Mul(), s, g.add_constant(np.float32(0.25))), mask)
    g.set_outputs([y], ["y"])
    exe = compiler.compile(g, nthreads=1)
    assert [k["ops"] for k in exe.manifest.kernels] == [["MatMul", "Mul", "Add"]]
    ref = exe.run(ins)["y"]
    np.testing.assert_allclose(ref, interpret(g, ins)["y"], rtol=1e-5, atol=1e-5)
    exe.nthreads = 2
    np.testing.assert_array_equal(exe.run(ins)["y"], ref)


def test_small_grouped_conv_gemms_split_over_groups():
    """A grouped 1x1 conv (ShuffleNet's) of 2 images whose per-group GEMMs are small: the (image,
    group) pairs are the pool's tasks when they fit the thread count (6 on 1, 2 or 3 threads: here
    always); an im2col conv of 2 images likewise, with a scratch copy per task (on 3 threads, in
    sequence: both paths run)."""
    ins = {"x": RNG.standard_normal((2, 24, 14, 14)).astype(np.float32)}
    g = Graph("grouped")
    x = g.add_input("x", TensorType(DType.f32, (2, 24, 14, 14)))
    w1 = g.add_constant(RNG.standard_normal((12, 8, 1, 1)).astype(np.float32))
    w2 = g.add_constant(RNG.standard_normal((6, 24, 3, 3)).astype(np.float32))
    g.set_outputs([g.add(cv.Conv(group=3), x, w1), g.add(cv.Conv(pads=(1, 1, 1, 1)), x, w2)], ["y1", "y2"])
    assert _uses_parallel(g)
    _same_any_threads(g, ins, rtol=1e-4, atol=1e-4)
    exe = compiler.compile(g, nthreads=2)
    notes = [k["notes"] for k in exe.manifest.kernels]
    assert "6 GEMMs (images x groups) as parallel tasks when they fit the threads" in notes[0]
    assert "2 GEMMs (images x groups) as parallel tasks when they fit the threads" in notes[1]
