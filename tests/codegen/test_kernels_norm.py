"""Native Softmax/LogSoftmax, LayerNormalization, RMSNormalization, InstanceNormalization, GroupNormalization, LRN (compiler/codegen/kernels/norm.py: every float type, on
the LLVM printer and in numba's CUDA simulator) and float32 Reduce* kernels (reduction.py; every type and op:
test_kernels_reduce.py) against the reference interpreter."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.norm import GroupNorm, InstanceNorm, LayerNorm, Lrn, RMSNorm, Softmax
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import conv as cv
from compiler.ir.ops import norm as nm
from compiler.ir.ops import reduce as rd
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(11)


def _run(g: Graph, ins: dict, rtol=1e-5, atol=1e-6):
    got, ref = run_kernels(g, ins), interpret(g, ins)
    for name in ref:
        assert got[name].shape == ref[name].shape, name
        np.testing.assert_allclose(got[name], ref[name], rtol=rtol, atol=atol, err_msg=name)
    return got, ref


def _input(g: Graph, name: str, shape, dtype=DType.f32):
    return g.add_input(name, TensorType(dtype, tuple(shape)))


# ---------------------------------------------------------------------------------------------
# Softmax / LogSoftmax

def test_softmax_axes():
    g = Graph("sm")
    outs = []
    x = _input(g, "x", (3, 5, 37))
    for axis in (-1, 0, 1, 2):
        for op in (nm.Softmax, nm.LogSoftmax):
            outs.append(g.add(op(axis=axis), x))
    z = _input(g, "z", (2, 1000))  # long rows: vector main loop, blocks, tail
    outs += [g.add(nm.Softmax(axis=1), z), g.add(nm.LogSoftmax(axis=1), z)]
    w = _input(g, "w", (7,))
    outs += [g.add(nm.Softmax(axis=0), w), g.add(nm.LogSoftmax(axis=0), w)]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    ins = {"x": RNG.standard_normal((3, 5, 37)).astype(np.float32) * 4,
           "z": RNG.standard_normal((2, 1000)).astype(np.float32) * 10,
           "w": RNG.standard_normal(7).astype(np.float32)}
    _run(g, ins, rtol=2e-6, atol=1e-7)


def test_softmax_special_values():
    g = Graph("sm")
    x = _input(g, "x", (5, 9))
    y = _input(g, "y", (9, 5))
    outs = [g.add(nm.Softmax(axis=1), x), g.add(nm.LogSoftmax(axis=1), x),
            g.add(nm.Softmax(axis=0), y), g.add(nm.LogSoftmax(axis=0), y)]
    g.set_outputs(outs, ["a", "b", "c", "d"])
    v = RNG.standard_normal((5, 9)).astype(np.float32)
    v[0, 3] = np.inf          # row with +inf: NaN like the reference
    v[1, :] = -np.inf         # all -inf: NaN
    v[2, 4] = np.nan
    v[3, 2] = -np.inf         # one -inf: probability 0
    v[4, :] = [1e30, -1e30, 0, 88, 100, -100, 3e38, 0, 1]
    got, ref = _run(g, {"x": v, "y": np.ascontiguousarray(v.T)}, rtol=2e-6, atol=1e-7)
    for name in ("a", "b"):
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(ref[name]))


# ---------------------------------------------------------------------------------------------
# LayerNormalization

def _ln(g, op, *ins):
    return g.add_node(op, list(ins), num_outputs=1).outputs[0]


def test_layernorm():
    g = Graph("ln")
    x = _input(g, "x", (4, 6, 40))
    s40 = g.add_constant(RNG.standard_normal(40).astype(np.float32), "s40")
    b40 = _input(g, "b40", (40,))
    s240 = _input(g, "s240", (6, 40))
    b_bc = g.add_constant(RNG.standard_normal((6, 1)).astype(np.float32), "b_bc")  # broadcasts within axes
    s1 = g.add_constant(RNG.standard_normal((1, 1, 40)).astype(np.float32), "s1")
    outs = [_ln(g, nm.LayerNormalization(), x, s40, b40),
            _ln(g, nm.LayerNormalization(axis=1, epsilon=1e-3), x, s240, None),
            _ln(g, nm.LayerNormalization(axis=-2), x, s240, b_bc),
            _ln(g, nm.LayerNormalization(axis=0), x, s1, None)]
    node = g.add_node(nm.LayerNormalization(), [x, s1, b40])
    outs += list(node.outputs)
    z = _input(g, "z", (3, 1000))
    sz = g.add_constant(np.abs(RNG.standard_normal(1000)).astype(np.float32), "sz")
    outs.append(_ln(g, nm.LayerNormalization(), z, sz, None))
    z2 = _input(g, "z2", (2, 1000))
    ones = g.add_constant(np.ones(1000, np.float32), "ones")
    big_mean = _ln(g, nm.LayerNormalization(), z2, ones, None)
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    ins = {"x": RNG.standard_normal((4, 6, 40)).astype(np.float32) * 3 + 1,
           "b40": RNG.standard_normal(40).astype(np.float32),
           "s240": RNG.standard_normal((6, 40)).astype(np.float32),
           "z": RNG.standard_normal((3, 1000)).astype(np.float32) * 5 + 1,
           "z2": RNG.standard_normal((2, 1000)).astype(np.float32) + 100}
    _run(g, ins, rtol=1e-5, atol=2e-6)
    # a large mean: x - mean carries the rounding of the float32 mean (~ulp(100) / std = 8e-6 here);
    # compare both with float64 (ours is the more accurate: the row less its first element, summed in
    # float64 blocks; plain float32 block sums lost the mean's last bit on Zen 4)
    g.set_outputs([big_mean], ["y"])
    got, ref = run_kernels(g, ins)["y"], interpret(g, ins)["y"]
    d = ins["z2"].astype(np.float64)
    exact = (d - d.mean(1, keepdims=True)) / np.sqrt(d.var(1, keepdims=True) + 1e-5)
    assert np.abs(got - exact).max() <= max(np.abs(ref - exact).max(), 3e-6)


# ---------------------------------------------------------------------------------------------
# RMSNormalization

def test_rmsnorm():
    """Rows of 40 and of 1000 (past the sum block), a scale fed or constant (broadcast within the
    normalized axes), every axis, float16 X with a float32 scale (the result is scale's type), a
    row of zeros (0 / sqrt(eps)); and the refusal of a scale varying over the leading axes."""
    g = Graph("rms")
    x = _input(g, "x", (4, 6, 40))
    s40 = _input(g, "s40", (40,))
    s_bc = g.add_constant(RNG.standard_normal((6, 1)).astype(np.float32), "s_bc")
    z = _input(g, "z", (3, 1000))
    h = _input(g, "h", (5, 24), DType.f16)
    s24 = g.add_constant(RNG.standard_normal(24).astype(np.float32), "s24")
    outs = [_ln(g, nm.RMSNormalization(), x, s40), _ln(g, nm.RMSNormalization(axis=1, epsilon=1e-3), x, s_bc),
            _ln(g, nm.RMSNormalization(axis=0), x, g.add_constant(np.full((1, 1, 1), 2, np.float32))),
            _ln(g, nm.RMSNormalization(), z, g.add_constant(np.abs(RNG.standard_normal(1000)).astype(np.float32))),
            _ln(g, nm.RMSNormalization(), h, s24)]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], RMSNorm), n.describe()
    assert outs[4].dtype is DType.f32
    xv = RNG.standard_normal((4, 6, 40)).astype(np.float32) * 3 + 1
    xv[1, 2] = 0
    ins = {"x": xv, "s40": RNG.standard_normal(40).astype(np.float32),
           "z": RNG.standard_normal((3, 1000)).astype(np.float32) * 5,
           "h": RNG.standard_normal((5, 24)).astype(np.float16)}
    _run(g, ins, rtol=1e-5, atol=2e-6)
    # size-1 axes: one element per row, one row; a size-0 tensor has nothing to compute (the empty lowering)
    e = Graph("rms_edges")
    a = _input(e, "a", (2, 3, 1))
    r1 = _input(e, "r1", (1, 1, 40))
    e.set_outputs([_ln(e, nm.RMSNormalization(), a, e.add_constant(np.full(1, 3, np.float32))),
                   _ln(e, nm.RMSNormalization(axis=1), r1, e.add_constant(RNG.standard_normal((1, 40)).astype(np.float32)))],
                  ["a", "r1"])
    _run(e, {"a": RNG.standard_normal((2, 3, 1)).astype(np.float32),
             "r1": RNG.standard_normal((1, 1, 40)).astype(np.float32)}, rtol=1e-5, atol=2e-6)
    z0 = Graph("rms_empty")
    n0 = z0.add_node(nm.RMSNormalization(), [_input(z0, "x", (0, 8)), z0.add_constant(np.ones(8, np.float32))])
    z0.set_outputs([n0.outputs[0]], ["y"])
    assert not isinstance(lowering_for(KernelGroup.of_node(n0))[0], RMSNorm)
    assert run_kernels(z0, {"x": np.zeros((0, 8), np.float32)})["y"].shape == (0, 8)
    bad = Graph("rms_bad")
    node = bad.add_node(nm.RMSNormalization(), [_input(bad, "x", (4, 40)), _input(bad, "s", (4, 40))])
    low, why = lowering_for(KernelGroup.of_node(node))
    assert low is None and "leading" in why


# ---------------------------------------------------------------------------------------------
# LRN

@pytest.mark.parametrize("shape", [(2, 7, 5, 6), (1, 16, 33)])
def test_lrn(shape):
    g = Graph("lrn")
    x = _input(g, "x", shape)
    outs = [g.add(cv.LRN(size=5, alpha=1e-4, beta=0.75, bias=1.0), x),
            g.add(cv.LRN(size=3, alpha=0.5, beta=0.6, bias=2.0), x),
            g.add(cv.LRN(size=4, alpha=0.3, beta=0.5, bias=1.5), x),
            g.add(cv.LRN(size=1, alpha=0.1, beta=1.0, bias=1.0), x),
            g.add(cv.LRN(size=30, alpha=0.2, beta=1.3, bias=1.0), x)]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    _run(g, {"x": RNG.standard_normal(shape).astype(np.float32) * 2}, rtol=3e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Reduce*

REDUCE_CASES = [  # (shape, axes, keepdims)
    ((3, 5, 37, 9), [1, 3], 1),
    ((3, 5, 37, 9), [0, 2], 0),
    ((3, 5, 37, 9), [-1], 0),
    ((3, 5, 37, 9), None, 1),
    ((3, 5, 37, 9), [1, 2], 1),
    ((4, 1, 1100), [2], 1),
    ((4, 1, 1100), [0, 1], 0),
    ((6, 7), [0], 1),
    ((2, 3, 1, 4), [1, 2], 0),
    ((2, 3, 1, 4), [2], 1),
]


@pytest.mark.parametrize("op", [rd.ReduceSum, rd.ReduceMean, rd.ReduceMax, rd.ReduceMin])
def test_reductions(op):
    g = Graph("r")
    ins, outs = {}, []
    for i, (shape, axes, keep) in enumerate(REDUCE_CASES):
        name = f"x{i}"
        x = _input(g, name, shape)
        ins[name] = RNG.standard_normal(shape).astype(np.float32) + (2 if i % 2 else 0)
        a = None if axes is None else g.add_constant(np.array(axes, np.int64))
        outs.append(g.add(op(keepdims=keep), x, a))
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    _run(g, ins, rtol=2e-6, atol=2e-6)


def test_reduce_nan():
    g = Graph("r")
    x = _input(g, "x", (4, 50))
    a1 = g.add_constant(np.array([1], np.int64))
    a0 = g.add_constant(np.array([0], np.int64))
    outs = [g.add(op(), x, a) for op in (rd.ReduceMax, rd.ReduceMin, rd.ReduceSum) for a in (a0, a1)]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    v = RNG.standard_normal((4, 50)).astype(np.float32)
    v[2, 33] = np.nan
    got, ref = run_kernels(g, {"x": v}), interpret(g, {"x": v})
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-6, atol=2e-6, err_msg=name)
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(ref[name]))


# ---------------------------------------------------------------------------------------------
# refusals

def _reason(node) -> str:
    low, why = lowering_for(KernelGroup.of([node]))
    assert low is None, node.describe()
    return why


def test_refusals():
    g = Graph("r")
    x = _input(g, "x", (2, 3, 4))
    b = _input(g, "b", (2, 3, 4), DType.bf16)
    s = _input(g, "s", ("N", 3, 4))
    axes = _input(g, "axes", (1,), DType.i64)
    sc = _input(g, "sc", (3, 1))
    sc2 = _input(g, "sc2", (2, 1, 4))
    nodes = [g.add_node(nm.Softmax(), [b]),
             g.add_node(nm.LogSoftmax(), [s]),
             g.add_node(rd.ReduceSum(), [x, axes]),
             g.add_node(nm.LayerNormalization(axis=1), [x, sc], num_outputs=1),
             g.add_node(nm.LayerNormalization(axis=2), [x, sc2], num_outputs=1)]
    g.set_outputs([n.outputs[0] for n in nodes])
    assert lowering_for(KernelGroup.of([nodes[0]]))[0] is not None  # bf16: stored as its bits, computed in f32
    why = [None] + [_reason(n) for n in nodes[1:]]
    assert "static" in why[1]
    assert "run time" in why[2]
    assert "not a constant" in why[3]
    assert "leading" in why[4]


# ---------------------------------------------------------------------------------------------
# every float type, on both printers

def _typed_graph(dt: DType):
    """Softmax/LogSoftmax (last and inner axes), LayerNormalization (float32 and float64 statistics,
    a constant scale broadcast within the normalized axes, Mean and InvStdDev) and LRN, all in ``dt``."""
    g = Graph(f"norm_{dt}")
    x = _input(g, "x", (3, 5, 37), dt)
    outs = [g.add(op(axis=axis), x) for axis in (-1, 1) for op in (nm.Softmax, nm.LogSoftmax)]
    sc = g.add_constant(RNG.standard_normal(37).astype(dt.np), "sc")
    bc = g.add_constant(RNG.standard_normal((5, 1)).astype(dt.np), "bc")
    outs.append(_ln(g, nm.LayerNormalization(epsilon=1e-3), x, sc, None))
    node = g.add_node(nm.LayerNormalization(axis=1, stash_type=11), [x, g.add_constant(np.ones(1, dt.np)), bc])
    outs += list(node.outputs)
    h = _input(g, "h", (2, 7, 3, 5), dt)
    outs += [g.add(cv.LRN(size=5, alpha=1e-4, beta=0.75, bias=1.0), h),
             g.add(cv.LRN(size=2, alpha=0.5, beta=0.6, bias=2.0), h)]
    # InstanceNormalization: planes of images (rank 4), of sequences (rank 3: x seen as 3 x 5 x 37),
    # of one element (rank 2: the output is the bias), scale and bias fed
    s7, b7 = _input(g, "s7", (7,), dt), _input(g, "b7", (7,), dt)
    s5, b5 = _input(g, "s5", (5,), dt), _input(g, "b5", (5,), dt)
    outs += [g.add(nm.InstanceNormalization(epsilon=1e-3), h, s7, b7), g.add(nm.InstanceNormalization(), x, s5, b5),
             g.add(nm.InstanceNormalization(), _input(g, "p", (4, 5), dt), s5, b5)]
    # GroupNormalization: 7 channels in one group and in 7, 5 channels of sequences in 5 groups, a
    # 256-channel map in 32 groups (rows past the sum block), float64 statistics
    outs += [g.add(nm.GroupNormalization(num_groups=1, epsilon=1e-3), h, s7, b7),
             g.add(nm.GroupNormalization(num_groups=7), h, s7, b7), g.add(nm.GroupNormalization(num_groups=5), x, s5, b5),
             g.add(nm.GroupNormalization(num_groups=32, stash_type=11), _input(g, "q", (1, 256, 4, 9), dt),
                   _input(g, "s256", (256,), dt), _input(g, "b256", (256,), dt))]
    # RMSNormalization: float32 statistics over the last axis, float64 over the last two with a
    # constant scale broadcast within them
    outs += [_ln(g, nm.RMSNormalization(epsilon=1e-3), x, sc),
             _ln(g, nm.RMSNormalization(axis=1, stash_type=11), x, bc)]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    ins = {"x": (RNG.standard_normal((3, 5, 37)) * 3).astype(dt.np),
           "h": (RNG.standard_normal((2, 7, 3, 5)) * 2).astype(dt.np),
           "p": RNG.standard_normal((4, 5)).astype(dt.np), "q": (RNG.standard_normal((1, 256, 4, 9)) + 2).astype(dt.np)}
    for name, n in (("s7", 7), ("b7", 7), ("s5", 5), ("b5", 5), ("s256", 256), ("b256", 256)):
        ins[name] = RNG.standard_normal(n).astype(dt.np)
    return g, ins


def _close(got: dict, ref: dict, dt: DType) -> None:
    for name in ref:
        # y4, y13-y15, y17: float32 statistics (stash_type 1) whatever the type
        f32_stats = ("y4", "y13", "y14", "y15", "y17")
        tol = {DType.f16: 2e-3, DType.bf16: 2e-2, DType.f32: 2e-5, DType.f64: 2e-6 if name in f32_stats else 1e-9}[dt]
        assert got[name].dtype == ref[name].dtype, name
        np.testing.assert_allclose(got[name].astype(np.float64), ref[name].astype(np.float64), rtol=tol,
                                   atol=tol, err_msg=name)


@pytest.mark.parametrize("dt", [DType.f64, DType.f16, DType.bf16, DType.f32])
def test_every_float_type_on_the_llvm_printer(dt):
    g, ins = _typed_graph(dt)
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0],
                          (Softmax, LayerNorm, RMSNorm, InstanceNorm, GroupNorm, Lrn)), \
            n.describe()
    _close(run_kernels(g, ins), interpret(g, ins), dt)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
@pytest.mark.parametrize("dt", [DType.f32, DType.f64])
def test_on_the_cuda_printer(dt):
    g, ins = _typed_graph(dt)
    _close(run_cuda_forms(g, ins, threads=2), interpret(g, ins), dt)


def test_instance_normalization_against_onnxruntime():
    """A PoolFormer-style InstanceNormalization (channels of 64 x 56 x 56 planes, a model's scale and
    bias) compiled whole, against ONNX Runtime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import compiler

    scale, bias = RNG.standard_normal(64).astype(np.float32), RNG.standard_normal(64).astype(np.float32)
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])],
                              [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = (RNG.standard_normal((1, 64, 56, 56)) * 3 + 1).astype(np.float32)
    exe = compiler.compile(model, fallback=False)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(exe.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
