"""Gemm and MatMul lowerings against the reference interpreter (many kernels per compiled graph)."""
from __future__ import annotations

import numpy as np

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.testing import run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import linalg as la
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


class Bench:
    """One graph holding many independent nodes; inputs random."""

    def __init__(self, seed: int | None = None):
        """``seed``: inputs and constants from a generator of their own (the same numbers whichever
        tests ran before in the process); None: the module's."""
        self.rng = RNG if seed is None else np.random.default_rng(seed)
        self.g = Graph("t")
        self.feed: dict[str, np.ndarray] = {}
        self.outs: list = []

    def input(self, *shape, dtype=DType.f32):
        name = f"x{len(self.feed)}"
        arr = (self.rng.standard_normal(shape).astype(np.float32) if dtype is DType.f32
               else self.rng.integers(-3, 3, shape).astype(dtype.np))
        self.feed[name] = arr
        return self.g.add_input(name, TensorType(dtype, tuple(shape)))

    def const(self, *shape):
        return self.g.add_constant(self.rng.standard_normal(shape).astype(np.float32))

    def add(self, op, *ins):
        v = self.g.add(op, *ins)
        self.outs.append(v)
        return v

    def run(self, rtol=1e-4, atol=1e-4):
        self.g.set_outputs(self.outs, [f"y{i}" for i in range(len(self.outs))])
        want = interpret(self.g, self.feed)
        got = run_kernels(self.g, self.feed)
        for name in want:
            w, r = want[name], got[name]
            assert w.shape == r.shape, name
            scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
            np.testing.assert_allclose(r, w, rtol=rtol, atol=atol * scale, err_msg=name)


def test_gemm_shapes_and_attributes():
    t = Bench()
    for (m, n, k) in [(1, 1, 1), (5, 7, 3), (17, 33, 29), (64, 100, 130), (3, 200, 9)]:
        for ta in (0, 1):
            for tb in (0, 1):
                a = t.input(*((k, m) if ta else (m, k)))
                b = t.input(*((n, k) if tb else (k, n)))
                t.add(la.Gemm(transA=ta, transB=tb), a, b)
    # constant B (packed), transB like a Linear layer, bias row vector
    for (m, n, k) in [(1, 10, 16), (7, 50, 33), (128, 96, 64)]:
        a = t.input(m, k)
        t.add(la.Gemm(transB=1), a, t.const(n, k), t.const(n))
        t.add(la.Gemm(alpha=0.5, beta=2.0), a, t.const(k, n), t.input(n))
    # constant A (packed), alpha/beta, every C shape
    m, n, k = 13, 27, 19
    for cshape in [(), (1,), (n,), (1, n), (m, 1), (m, n), (1, 1)]:
        a, b = t.const(m, k), t.input(k, n)
        t.add(la.Gemm(alpha=1.5, beta=-0.75), a, b, t.input(*cshape))
    t.add(la.Gemm(transA=1, alpha=-2.0, beta=0.0), t.const(k, m), t.input(k, n), t.input(m, n))
    t.add(la.Gemm(transA=1, transB=1), t.const(k, m), t.const(n, k), t.const(m, 1))
    t.run()


def test_matmul_shapes():
    t = Bench()
    # 2-D, vectors
    for (m, n, k) in [(1, 1, 1), (9, 31, 17), (70, 45, 260)]:
        t.add(la.MatMul(), t.input(m, k), t.input(k, n))
        t.add(la.MatMul(), t.input(m, k), t.const(k, n))
        t.add(la.MatMul(), t.const(m, k), t.input(k, n))
    t.add(la.MatMul(), t.input(11), t.input(11, 6))
    t.add(la.MatMul(), t.input(5, 11), t.input(11))
    t.add(la.MatMul(), t.input(11), t.input(11))
    t.add(la.MatMul(), t.input(3, 4, 11), t.input(11))
    t.add(la.MatMul(), t.input(11), t.input(3, 11, 4))
    # linear layer: batch folded into M, B constant
    t.add(la.MatMul(), t.input(2, 3, 5, 16), t.const(16, 24))
    t.add(la.MatMul(), t.input(1, 20, 32), t.const(1, 32, 40))
    # attention-like batched products
    t.add(la.MatMul(), t.input(1, 4, 24, 8), t.input(1, 4, 8, 24))
    t.add(la.MatMul(), t.input(2, 3, 7, 5), t.input(2, 3, 5, 9))
    # batched products big enough for a parallel GEMM each (batches in sequence, not as tasks)
    t.add(la.MatMul(), t.input(2, 130, 100), t.input(2, 100, 120))
    # broadcast batch dims
    t.add(la.MatMul(), t.input(3, 1, 6, 5), t.input(1, 4, 5, 7))
    t.add(la.MatMul(), t.input(6, 5), t.input(2, 3, 5, 7))
    t.add(la.MatMul(), t.const(6, 5), t.input(2, 5, 7))
    t.add(la.MatMul(), t.input(2, 1, 6, 5), t.const(3, 5, 7))
    t.add(la.MatMul(), t.const(3, 6, 5), t.input(2, 1, 5, 7))
    t.run()


def test_matmul_of_float64_and_integers_as_loops():
    """float64 and 32/64-bit integer MatMuls run as loops (matmul_loops.py): promoted 1-D operands,
    broadcast batches, integers wrapping as NumPy's do (exactly), float64 to the last bits."""
    from compiler.codegen.kernels.matmul_loops import MatMulLoops

    t = Bench()
    for dt, sa, sb in ((DType.f64, (5, 2, 3), (5, 3, 4)), (DType.f64, (5,), (5,)), (DType.i32, (2, 1, 3, 4), (3, 4, 5)),
                       (DType.i64, (4,), (2, 4, 3)), (DType.u32, (3, 4), (4,)), (DType.u64, (1, 3, 7), (4, 7, 2)),
                       (DType.f64, (70, 33), (33, 65)), (DType.f64, (3, 1, 4, 0), (2, 0, 5)),  # K = 0: zeros
                       (DType.i64, (1, 1, 1), (1, 1, 1))):
        v = t.add(la.MatMul(), t.input(*sa, dtype=dt), t.input(*sb, dtype=dt))
        assert type(lowering_for(KernelGroup.of([v.producer]))[0]) is MatMulLoops
    t.feed = {k: (v if v.dtype.kind != "f" else RNG.standard_normal(v.shape) * 100) for k, v in t.feed.items()}
    t.run(rtol=1e-12, atol=1e-12)


def test_refusals():
    g = Graph("r")
    s = g.add_input("s", TensorType(DType.f32, ("N", 4)))
    w = g.add_input("w", TensorType(DType.f32, (4, 4)))
    z = g.add(la.Gemm(), s, w)
    e = g.add_input("e", TensorType(DType.f32, (4, 0)))
    ez = g.add(la.MatMul(), e, g.add_input("e2", TensorType(DType.f32, (0, 4))))  # [4, 4] from K = 0
    for v, words in ((z, "static"), (ez, "empty")):
        low, why = lowering_for(KernelGroup.of([v.producer]))
        assert low is None and words in why, why
