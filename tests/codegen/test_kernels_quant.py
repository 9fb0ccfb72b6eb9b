"""QuantizeLinear and DequantizeLinear on the loop form (compiler/codegen/kernels/quant.py): per tensor,
per axis and blocked, every integer type, ties rounded half to even and saturation, against the
reference interpreter on the LLVM printer and in numba's CUDA simulator."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.fusion import CPU_FUSION
from compiler.codegen.kernels.elementwise import Elementwise
from compiler.codegen.kernels.quant import DequantizeLinear, QuantizeLinear
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import elementwise as ew
from compiler.ir.ops import quant as qn
from compiler.ir.types import DType, TensorType
from compiler.passes.fuse import FuseKernels

RNG = np.random.default_rng(8)
LAYOUTS = [({}, ()), ({"axis": 1}, (4,)), ({"axis": 0, "block_size": 2}, (2, 4, 3))]  # x: (3, 4, 3)


def _graph(types=(DType.u8, DType.i8, DType.i16, DType.u16)):
    g = Graph("q")
    x = g.add_input("x", TensorType(DType.f32, (3, 4, 3)))
    feeds = {"x": np.concatenate([[0.5, 1.5, 2.5, -0.5, -2.5, 1e9, -1e9,  # ties to even; saturation
                                   np.nan, np.inf, -np.inf],  # NaN: 0 (the reference's cast), infinities saturate
                                  RNG.standard_normal(26) * 40]).astype(np.float32).reshape(3, 4, 3)}
    for attrs, sshape in LAYOUTS:
        scale = g.add_constant((RNG.random(sshape) + 0.5).astype(np.float32))
        for dt in types:
            zp = g.add_constant(RNG.integers(-3 if dt.is_signed else 0, 4, sshape).astype(dt.np))
            q = g.add(qn.QuantizeLinear(**attrs), x, scale, zp)
            for out in (None, DType.f16):
                g.add(qn.DequantizeLinear(**attrs, output_dtype=out), q, scale, zp)
        g.add(qn.QuantizeLinear(**attrs), x, scale)  # no zero point: u8
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds


def _check(got, want, label):
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-3 if want.dtype == np.float16 else 1e-6, err_msg=label)
    else:
        np.testing.assert_array_equal(got, want, err_msg=label)


def test_on_the_llvm_printer():
    """Per tensor, float32 to and from 8/16-bit integers: the elementwise loop (the op's scalar
    semantics, what a fused chain computes); per axis, per block or to float16: the op's own kernel."""
    g, feeds = _graph()
    for n in g.nodes:
        low = lowering_for(KernelGroup.of_node(n))[0]
        simple = n.inputs[1].type.numel == 1 and n.outputs[0].dtype is not DType.f16
        assert isinstance(low, Elementwise if simple else (QuantizeLinear, DequantizeLinear)), n.describe()
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        _check(got[name], want[name], n.describe())


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds = _graph((DType.u8, DType.i8))
    want = interpret(g, feeds)
    env = dict(feeds)
    for n, name in zip(g.nodes, g.output_names):  # a Dequantize reads its Quantize's result
        one = Graph("one")
        ins = []
        for v in n.inputs:
            if v.const is not None:
                ins.append(one.add_constant(v.const))
            else:
                src = "x" if v.name == "x" else g.output_names[g.outputs.index(v)]
                ins.append(one.add_input(src, v.type))
        one.set_outputs([one.add_node(n.op, ins).outputs[0]])
        got = run_cuda_forms(one, {v.name: env[v.name] for v in one.inputs})
        _check(got[one.output_names[0]], want[name], n.describe())
        env[name] = want[name]


def _dynamic_cases():
    rng = np.random.default_rng(9)
    return {"mixed": (rng.standard_normal((3, 50)) * 4).astype(np.float32),
            "positive": (rng.random(17) * 9 + 1).astype(np.float32),
            "negative": -(rng.random((2, 2, 5)) * 3 + 0.5).astype(np.float32),
            "zeros": np.zeros((4, 4), np.float32),
            "ties": np.array([0.0, 2.55, 1.275, -1.275, 5.1, 0.005, 0.015], np.float32),
            "size-1 axes": (rng.standard_normal((1, 5, 1)) * 2).astype(np.float32),
            "large": (rng.standard_normal(70_001) * 10).astype(np.float32),  # past a vector loop's unrolled body
            # the CPU's parallel range (blocks of RANGE_BLOCK = 32768): whole blocks only, positive;
            # the extremes in the tail after the blocks
            "whole blocks": (rng.random(4 * 32768) * 3 + 0.25).astype(np.float32),
            "extremes in the tail": np.concatenate([rng.standard_normal(2 * 32768), [-40.0, 7.0, 55.5]]).astype(
                np.float32)}


def _dynamic_graph(shape):
    from compiler.codegen.kernels.quant import DynamicQuantizeLinear

    g = Graph("dq")
    x = g.add_input("x", TensorType(DType.f32, shape))
    n = g.add_node(qn.DynamicQuantizeLinear(), [x])
    g.set_outputs(list(n.outputs))
    assert isinstance(lowering_for(KernelGroup.of_node(n))[0], DynamicQuantizeLinear)
    return g


@pytest.mark.parametrize("case", sorted(_dynamic_cases()))
def test_dynamic_quantize_on_the_llvm_printer(case):
    x = _dynamic_cases()[case]
    g = _dynamic_graph(x.shape)
    want, got = interpret(g, {"x": x}), run_kernels(g, {"x": x})
    for name in g.output_names:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{case} {name}")


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
@pytest.mark.parametrize("case", ["mixed", "zeros", "ties"])
def test_dynamic_quantize_on_the_cuda_printer(case):
    x = _dynamic_cases()[case]
    g = _dynamic_graph(x.shape)
    want, got = interpret(g, {"x": x}), run_cuda_forms(g, {"x": x})
    for name in g.output_names:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{case} {name}")


def test_a_fused_rescale_requantize_chain_is_exact():
    """int32 sums rescaled, a dequantized residual added (its DequantizeLinear in the loop too), Relu,
    quantized: one fused loop, bit-exact against the interpreter (ties to even, saturation at both
    ends)."""
    g = Graph("chain")
    acc = g.add_input("acc", TensorType(DType.i32, (2, 8, 5)))
    r = g.add_input("r", TensorType(DType.u8, (2, 8, 5)))
    s_acc = g.add_constant((RNG.random((8, 1)) * 1e-3).astype(np.float32))
    sy, zy = g.add_constant(np.float32(0.05)), g.add_constant(np.array(9, np.uint8))
    y = g.add(ew.Mul(), g.add(ew.Cast(to=DType.f32), acc), s_acc)
    y = g.add(ew.Relu(), g.add(ew.Add(), y, g.add(qn.DequantizeLinear(), r, sy, zy)))
    g.set_outputs([g.add(qn.QuantizeLinear(), y, sy, zy)], ["y"])
    feeds = {"acc": RNG.integers(-30000, 30000, (2, 8, 5)).astype(np.int32),
             "r": RNG.integers(0, 256, (2, 8, 5)).astype(np.uint8)}
    feeds["acc"][0, 0, :3] = [1000, 3000, -50]  # scales to about ties and out of range
    want = interpret(g, feeds)["y"]
    FuseKernels(capabilities=CPU_FUSION).run(g)
    assert [n.op.name for n in g.nodes] == ["Kernel"]  # the dequantized side operand computed in the loop
    np.testing.assert_array_equal(run_kernels(g, feeds)["y"], want)
