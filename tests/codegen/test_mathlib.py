"""Kiln's float32 math (``llvm/mathlib.py``: exp, log, tanh, erf and what is built on them) as the
loop form prints it: ulp errors against float64 over all bit patterns, the baseline x86-64 target
(SSE2: no FMA, no SSE4.1 rounding), and vector code without a call to libm."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from compiler.codegen.kernels.testing import build_kernels, run_kernels
from compiler.codegen.llvm.target import host_target, target_for
from compiler.codegen.llvm.toolchain import assembly, optimized_ir
from compiler.ir.graph import Graph
from compiler.ir.ops import elementwise as ew
from compiler.ir.types import DType, TensorType


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps (+0 and -0 are one point; NaN to NaN is 0, NaN to a number inf)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    oa = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ob = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    d = np.abs(oa - ob).astype(np.float64)
    na, nb = np.isnan(a), np.isnan(b)
    d[na & nb] = 0
    d[na ^ nb] = np.inf
    return d


def _float_sweep(count: int) -> np.ndarray:
    """``count`` float32 values evenly spread over all bit patterns (every sign, binade, denormals)."""
    step = (1 << 32) // count | 1
    return np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32).view(np.float32)


def unary(op, n: int) -> Graph:
    g = Graph("math")
    g.set_outputs([g.add(op, g.add_input("x", TensorType(DType.f32, (n,))))], ["y"])
    return g


_ERF = np.vectorize(math.erf, otypes=[np.float64])
TRUTH = {
    "Exp": (ew.Exp(), np.exp, 1),
    "Log": (ew.Log(), np.log, 1),
    "Tanh": (ew.Tanh(), np.tanh, 1),
    "Erf": (ew.Erf(), _ERF, 1),
    "Sigmoid": (ew.Sigmoid(), lambda x: 1 / (1 + np.exp(-x)), 2),
    "Elu": (ew.Elu(), lambda x: np.where(x < 0, np.expm1(np.minimum(x, 0)), x), 1),  # expm1
    "Softplus": (ew.Softplus(), lambda x: np.logaddexp(0, x), 2),
}


@pytest.mark.parametrize("name", list(TRUTH))
def test_math_ulp_error_against_float64(name):
    op, truth, limit = TRUTH[name]
    x = _float_sweep(300_000 if name == "Erf" else 2_000_000)
    got = run_kernels(unary(op, x.size), {"x": x})["y"]
    with np.errstate(all="ignore"):
        want = truth(x.astype(np.float64)).astype(np.float32)
    u = ulps(got, want)
    assert u.max() <= limit, f"{name}: {u.max()} ulp at x={x[np.argmax(u)]!r}"


def test_math_without_fma_or_avx():
    """Baseline x86-64 (SSE2: no FMA, no SSE4.1 rounding): still vectorized, still within an ulp."""
    target = target_for("x86-64")
    x = _float_sweep(200_000)
    for op, fn in ((ew.Exp(), np.exp), (ew.Erf(), _ERF)):
        got = run_kernels(unary(op, x.size), {"x": x}, target=target)["y"]
        with np.errstate(all="ignore"):
            assert ulps(got, fn(x.astype(np.float64)).astype(np.float32)).max() <= 1
    text = str(build_kernels(unary(ew.Exp(), 4096), target)[0])
    assert "<4 x float>" in optimized_ir(text, target)
    assert not re.search(r"call\w*\s+\w", assembly(text, target))


def _chain(n: int) -> Graph:
    """(x + b) * sigmoid(x + b), then tanh, with a broadcast operand (a kernel per node)."""
    g = Graph("chain")
    x, b = g.add_input("x", TensorType(DType.f32, (n // 64, 64))), g.add_input("b", TensorType(DType.f32, (64,)))
    s = g.add(ew.Add(), x, b)
    g.set_outputs([g.add(ew.Tanh(), g.add(ew.Mul(), g.add(ew.Sigmoid(), s), s))])
    return g


@pytest.mark.parametrize("op", [ew.Exp(), ew.Log(), ew.Tanh(), ew.Erf(), ew.Gelu(), ew.Mish(), None],
                         ids=lambda o: o.name if o is not None else "chain")
def test_inner_loops_vectorize_without_libm(op):
    """On an AVX2 target (4096 elements: one thread, no pool call) the loop is 8-wide vector code
    that calls nothing."""
    target = target_for("znver3")
    g = unary(op, 4096) if op is not None else _chain(4096)
    text = str(build_kernels(g, target)[0])
    assert "<8 x float>" in optimized_ir(text, target), "the loop did not vectorize"
    assert not re.search(r"call\w*\s+\w", assembly(text, target)), "the kernel calls a function"


def test_host_kernels_use_the_host_vector_width():
    text = str(build_kernels(unary(ew.Exp(), 4096))[0])
    widths = {int(w) for w in re.findall(r"<(\d+) x float>", optimized_ir(text))}
    assert max(widths) >= host_target().f32_lanes
