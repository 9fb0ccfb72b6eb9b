"""Elementwise kernels: real kernels compiled into one shared library, called through ctypes on NumPy
arrays and compared with the reference interpreter; the math functions' ulp errors against float64;
broadcasting plans; vectorization; refusals."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from compiler.codegen.llvm.elementwise import (SCALAR_OPS, elementwise_module, emit_elementwise, new_module,
                                               plan_loops)
from compiler.codegen.llvm.target import host_target, target_for
from compiler.codegen.llvm.toolchain import CodegenError, assembly, build_library, load_library, optimized_ir
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import elementwise as ew
from compiler.ir.ops.shape import Identity
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(0)
EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-39, -1e-39, 3e38, -3e38, 88.7, 89.0,
                  -87.5, -88.8, -103.9, -104.5, -200.0, 1.0, -1.0, 0.5, -0.5, 3.9, -4.1, 9.0, -9.2, 20.0,
                  1e-7, -1e-7, 6.0, -3.0], np.float32)
SAMPLE = np.concatenate([EDGES, (RNG.standard_normal(3000) * 4).astype(np.float32),
                         RNG.uniform(-100, 100, 1000).astype(np.float32)])


def f32(*shape):
    return TensorType(DType.f32, shape)


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


def assert_matches(got, ref, max_ulps=0, atol=0.0):
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    u = ulps(got, ref)
    with np.errstate(invalid="ignore"):
        bad = (u > max_ulps) & ~(np.abs(got.astype(np.float64) - ref) <= atol)
    if bad.any():
        i = np.flatnonzero(bad)[:5]
        raise AssertionError(f"{bad.sum()} mismatches, e.g. got {got.ravel()[i]} want {ref.ravel()[i]} "
                             f"({u.ravel()[i]} ulp)")


# -- the cases: one graph each, all compiled into one library ---------------------------------------

def unary(op, shape=("N",)):
    g = Graph()
    x = g.add_input("x", f32(*shape))
    g.set_outputs([g.add(op, x)], ["y"])
    return g


def nary(op, k, shapes=None):
    g = Graph()
    xs = [g.add_input(f"x{i}", f32(*(shapes[i] if shapes else ("N",)))) for i in range(k)]
    g.set_outputs([g.add(op, *xs)], ["y"])
    return g


EXACT_UNARY = [ew.Abs(), ew.Neg(), ew.Sqrt(), ew.Floor(), ew.Ceil(), ew.Round(), ew.Reciprocal(), ew.Sign(),
               ew.Relu(), ew.LeakyRelu(alpha=0.1), ew.ThresholdedRelu(alpha=0.5), ew.HardSigmoid(),
               ew.HardSigmoid(alpha=0.3, beta=0.4), ew.HardSwish(), ew.Shrink(bias=0.1, lambd=0.4), ew.Softsign(),
               Identity()]
MATH_UNARY = [ew.Exp(), ew.Log(), ew.Tanh(), ew.Erf(), ew.Sigmoid(), ew.Softplus(), ew.Mish(), ew.Elu(alpha=0.5),
              ew.Celu(alpha=2.0), ew.Selu(), ew.Swish(alpha=1.5), ew.Gelu(), ew.Gelu(approximate="tanh")]
EXACT_NARY = [(ew.Add(), 2), (ew.Sub(), 2), (ew.Mul(), 2), (ew.Div(), 2), (ew.PRelu(), 2), (ew.Max(), 3),
              (ew.Min(), 2), (ew.Sum(), 3), (ew.Mean(), 2)]


def _label(op):
    attrs = ",".join(f"{k}={v}" for k, v in vars(op).items())
    return f"{op.name}({attrs})"


def _cases() -> dict[str, Graph]:
    cases: dict[str, Graph] = {}
    for op in EXACT_UNARY + MATH_UNARY:
        cases[_label(op)] = unary(op)
    for op, k in EXACT_NARY:
        cases[_label(op)] = nary(op, k)
    # broadcasting
    cases["bias4d"] = nary(ew.Add(), 2, [(2, 3, 4, 5), (1, 3, 1, 1)])
    cases["outer3d"] = nary(ew.Mul(), 2, [(4, 1, 5), (3, 1)])
    cases["row_col"] = nary(ew.Sub(), 2, [(5, 1), (1, 6)])
    cases["dyn_rows"] = nary(ew.Add(), 2, [("N", 8), (8,)])
    cases["scalar_input"] = nary(ew.Div(), 2, [("N",), ()])
    cases["prelu_channels"] = nary(ew.PRelu(), 2, [(2, 3, 7), (3, 1)])
    # constants: a scalar one is compiled in, a vector one is an input
    g = Graph()
    x = g.add_input("x", f32(4, 6))
    y = g.add(ew.Mul(), x, g.add_constant(np.float32(2.5)))
    y = g.add(ew.Add(), y, g.add_constant(RNG.standard_normal(6).astype(np.float32)))
    g.set_outputs([y], ["y"])
    cases["constants"] = g
    # a chain with two outputs, one of them an intermediate
    g = Graph()
    x, b = g.add_input("x", f32(3, 40)), g.add_input("b", f32(40))
    s = g.add(ew.Add(), x, b)
    z = g.add(ew.Mul(), g.add(ew.Sigmoid(), s), s)
    g.set_outputs([s, g.add(ew.Tanh(), z)], ["s", "y"])
    cases["chain"] = g
    # Clip with constant bounds, one bound, and bounds given at run time
    for label, lo, hi in (("clip_both", -1.5, 2.0), ("clip_lo", 0.25, None)):
        g = Graph()
        x = g.add_input("x", f32("N"))
        bounds = [g.add_constant(np.float32(v)) if v is not None else None for v in (lo, hi)]
        g.set_outputs([g.add(ew.Clip(), x, *bounds)], ["y"])
        cases[label] = g
    cases["clip_inputs"] = nary(ew.Clip(), 3, [("N",), (), ()])
    for e in (2.0, 0.5, -1.0, 3.0):
        g = Graph()
        x = g.add_input("x", f32("N"))
        g.set_outputs([g.add(ew.Pow(), x, g.add_constant(np.float32(e)))], ["y"])
        cases[f"pow{e}"] = g
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Every case as a kernel of one module, compiled and linked once: name -> (graph, run)."""
    module = new_module("cases")
    made = {}
    for i, (label, g) in enumerate(CASES.items()):
        made[label] = (g, emit_elementwise(module, g.nodes, f"case{i}", outputs=g.outputs))
    lib = load_library(build_library([str(module)], tmp_path_factory.mktemp("lib") / "libcases.so"))
    return {label: (g, k, k.bind(lib)) for label, (g, k) in made.items()}


def _inputs(g: Graph, n: int = len(SAMPLE)) -> dict[str, np.ndarray]:
    out = {}
    for i, v in enumerate(g.inputs):
        shape = tuple(n if not isinstance(d, int) else d for d in v.shape)
        size = int(np.prod(shape))
        data = SAMPLE if size == len(SAMPLE) else (RNG.standard_normal(size) * 3).astype(np.float32)
        out[v.name] = np.roll(data, 7 * i)[:size].reshape(shape).copy()
    return out


def _check(kernels, label, max_ulps=0, atol=0.0, n=len(SAMPLE)):
    g, kernel, run = kernels[label]
    feeds = _inputs(g, n)
    with np.errstate(all="ignore"):
        want = interpret(g, feeds)
    got = run(*[v.const if v.const is not None else feeds[v.name] for v in kernel.inputs])
    for name, value in zip(g.output_names, got):
        assert_matches(value, want[name], max_ulps, atol)


@pytest.mark.parametrize("op", EXACT_UNARY, ids=_label)
def test_exact_unary_ops(kernels, op):
    _check(kernels, _label(op))


@pytest.mark.parametrize("op,k", EXACT_NARY, ids=lambda v: _label(v) if not isinstance(v, int) else str(v))
def test_exact_nary_ops(kernels, op, k):
    _check(kernels, _label(op))


@pytest.mark.parametrize("op", MATH_UNARY, ids=_label)
def test_math_ops_against_reference(kernels, op):
    # a few ulp of NumPy's float32 results; absolute 1e-6 where the reference itself cancels or
    # underflows (exp(x) - 1 near 0, 1 + erf(x) and 1 / (1 + e^-x) on the negative tails, denormals)
    _check(kernels, _label(op), max_ulps=8, atol=1e-6)


@pytest.mark.parametrize("label", ["bias4d", "outer3d", "row_col", "scalar_input", "prelu_channels", "constants",
                                   "chain", "clip_both", "clip_lo", "clip_inputs", "pow2.0", "pow0.5", "pow-1.0"])
def test_broadcast_constants_chains(kernels, label):
    _check(kernels, label, max_ulps=4 if label == "chain" else 0)


def test_pow_cube_within_two_ulps(kernels):
    _check(kernels, "pow3.0", max_ulps=2)  # x * x * x rounds twice


@pytest.mark.parametrize("n", [1, 3, 17])
def test_symbolic_outer_dimension(kernels, n):
    _check(kernels, "dyn_rows", n=n)


def test_loop_plans(kernels):
    bias = kernels["bias4d"][1]
    assert bias.loops.sizes == (None, 3, 20) and bias.loops.strides == ((60, 20, 1), (0, 1, 0))
    outer = kernels["outer3d"][1]
    assert outer.loops.sizes == (None, 3, 5) and outer.loops.strides == ((5, 0, 1), (0, 1, 0))
    assert kernels["Add()"][1].loops.sizes == (None,)  # same shapes: one flat loop over n
    consts = kernels["constants"][1]
    assert len(consts.inputs) == 2  # x and the vector constant; the scalar 2.5 is compiled in
    chain = kernels["chain"][1]
    assert [v.name for v in chain.inputs] == ["x", "b"] and len(chain.outputs) == 2
    assert chain.signature.startswith("void case") and "int64_t n" in chain.signature


def test_in_place_and_aliasing(tmp_path):
    g = Graph()
    x, b = g.add_input("x", f32("N")), g.add_input("b", f32())
    g.set_outputs([g.add(ew.Relu(), g.add(ew.Add(), x, b))], ["y"])
    module = new_module("inplace")
    k_in = emit_elementwise(module, g.nodes, "relu_in_place", in_place={0: 0})
    k_alias = emit_elementwise(module, g.nodes, "relu_may_alias", noalias=False)
    text = str(module)
    lib = load_library(build_library([text], tmp_path / "libinplace.so"))
    assert len(k_in.argtypes) == 3 and "float *in0" in k_in.signature and "also out0" in k_in.signature
    data = (RNG.standard_normal(1001) * 2).astype(np.float32)
    bias = np.array(0.5, np.float32)
    want = interpret(g, {"x": data, "b": bias})["y"]
    buf = data.copy()
    (res,) = k_in.bind(lib)(buf, bias)
    assert res is buf
    assert_matches(buf, want)
    buf = data.copy()
    k_alias.bind(lib)(buf, bias, out=[buf])  # output over its input, with run-time overlap checks
    assert_matches(buf, want)
    opt = optimized_ir(text)
    assert re.search(r"<\d+ x float>", opt.split("relu_may_alias")[1])
    with pytest.raises(CodegenError, match="cannot hold output"):
        emit_elementwise(new_module(), g.nodes, "bad", in_place={0: 1})


# -- accuracy of the math functions against float64 ---------------------------------------------------

def _float_sweep(count: int) -> np.ndarray:
    """``count`` float32 values evenly spread over all bit patterns (every sign, binade, denormals)."""
    step = (1 << 32) // count | 1
    return np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32).view(np.float32)


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


@pytest.fixture(scope="module")
def truth_kernels(tmp_path_factory):
    module = new_module("truth")
    made = {name: emit_elementwise(module, unary(op).nodes, f"t_{name}") for name, (op, _, _) in TRUTH.items()}
    lib = load_library(build_library([str(module)], tmp_path_factory.mktemp("lib") / "libtruth.so"))
    return {name: k.bind(lib) for name, k in made.items()}


@pytest.mark.parametrize("name", list(TRUTH))
def test_math_ulp_error_against_float64(truth_kernels, name):
    op, truth, limit = TRUTH[name]
    x = _float_sweep(300_000 if name == "Erf" else 2_000_000)
    (got,) = truth_kernels[name](x)
    with np.errstate(all="ignore"):
        want = truth(x.astype(np.float64)).astype(np.float32)
    u = ulps(got, want)
    assert u.max() <= limit, f"{name}: {u.max()} ulp at x={x[np.argmax(u)]!r}"


def test_math_without_fma_or_avx(tmp_path):
    """Baseline x86-64 (SSE2: no FMA, no SSE4.1 rounding): still vectorized, still within an ulp."""
    target = target_for("x86-64")
    text, kernel = elementwise_module(unary(ew.Exp()).nodes, "exp_sse2", target)
    text2, kernel2 = elementwise_module(unary(ew.Erf()).nodes, "erf_sse2", target)
    lib = load_library(build_library([text, text2], tmp_path / "libsse2.so", target))
    x = _float_sweep(200_000)
    for k, fn in ((kernel, np.exp), (kernel2, _ERF)):
        (got,) = k.bind(lib)(x)
        with np.errstate(all="ignore"):
            assert ulps(got, fn(x.astype(np.float64)).astype(np.float32)).max() <= 1
    assert "<4 x float>" in optimized_ir(text, target)
    assert not re.search(r"call\w*\s+\w", assembly(text, target))


# -- vectorization ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("label", ["Exp()", "Log()", "Tanh()", "Erf()", "Gelu(approximate=none)", "Mish()",
                                   "bias4d", "outer3d", "chain", "clip_inputs"])
def test_inner_loops_vectorize_without_libm(label):
    g = CASES[label]
    target = target_for("znver3")
    text, _ = elementwise_module(g.nodes, "k", target, outputs=g.outputs)
    opt = optimized_ir(text, target)
    assert "<8 x float>" in opt, "the loop did not vectorize"
    assert not re.search(r"call\w*\s+\w", assembly(text, target)), "the kernel calls a function"


# -- refusals --------------------------------------------------------------------------------------

def test_refusals():
    with pytest.raises(CodegenError, match="Sin has no elementwise float32 code generation; supported: Abs"):
        elementwise_module(unary(ew.Sin()).nodes)
    g = Graph()
    a = g.add_input("a", TensorType(DType.i32, (4,)))
    g.set_outputs([g.add(ew.Add(), a, a)])
    with pytest.raises(CodegenError, match="result is i32\\[4\\]; elementwise kernels are float32 only"):
        elementwise_module(g.nodes)
    with pytest.raises(CodegenError, match="at least one node"):
        elementwise_module([])
    g = Graph()
    x, y = g.add_input("x", f32(4)), g.add_input("y", f32(3, 4))
    small = g.add(ew.Relu(), x)
    big = g.add(ew.Add(), small, y)
    with pytest.raises(CodegenError, match="must share a shape"):
        elementwise_module(g.nodes, outputs=[small, big])
    with pytest.raises(CodegenError, match="not computed by the group"):
        elementwise_module(g.nodes, outputs=[x])
    g = Graph()
    x, b = g.add_input("x", f32(4, "M")), g.add_input("b", f32(1, "M"))
    g.set_outputs([g.add(ew.Add(), x, b)])
    with pytest.raises(CodegenError, match="only the outermost dimension may be dynamic"):
        elementwise_module(g.nodes)
    with pytest.raises(CodegenError, match="does not broadcast"):
        plan_loops((4, 5), [(3, 5)])
    module = new_module()
    emit_elementwise(module, unary(ew.Exp()).nodes, "k")
    with pytest.raises(CodegenError, match="already defines 'k'"):
        emit_elementwise(module, unary(ew.Exp()).nodes, "k")


def test_every_supported_op_is_tested():
    tested = {type(op) for op in EXACT_UNARY + MATH_UNARY} | {type(op) for op, _ in EXACT_NARY} | {ew.Clip, ew.Pow}
    assert set(SCALAR_OPS) == tested


def test_host_kernels_use_the_host_vector_width():
    text, _ = elementwise_module(unary(ew.Exp()).nodes, "k")
    widths = {int(w) for w in re.findall(r"<(\d+) x float>", optimized_ir(text))}
    assert max(widths) >= host_target().f32_lanes
