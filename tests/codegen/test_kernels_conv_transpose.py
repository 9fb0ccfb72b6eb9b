"""Native ConvTranspose (compiler/codegen/kernels/conv_transpose.py): 1-D and 2-D, strides, dilations,
pads, output padding, output_shape, groups and bias, float32 and float64, on the LLVM printer and in
numba's CUDA simulator against the reference interpreter; a UNet decoder step (2x2 stride 2 and a
fused ReLU) compiled whole against ONNX Runtime, on the CPU and for CUDA. ONNX's own ConvTranspose
cases run in the conformance suite."""
from __future__ import annotations

import os

import numpy as np
import pytest

import compiler
from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.conv_transpose import ConvTranspose
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import conv as cv
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(17)

CASES = [  # (x shape, w shape, attributes, bias)
    ((2, 4, 5, 6), (4, 3, 3, 3), dict(), True),
    ((1, 4, 5, 6), (4, 2, 2, 2), dict(strides=(2, 2)), False),
    ((1, 4, 5, 6), (4, 3, 3, 2), dict(strides=(3, 2), pads=(1, 0, 2, 1), output_padding=(1, 1)), True),
    ((1, 6, 4, 5), (6, 2, 3, 3), dict(group=3, dilations=(2, 1)), True),
    ((1, 2, 4, 4), (2, 2, 3, 3), dict(strides=(2, 2), output_shape=(9, 10)), False),
    ((2, 3, 7), (3, 4, 4), dict(strides=(2,), pads=(1, 1)), True),
]


def _graph(dt: DType):
    g = Graph(f"convt_{dt}")
    outs = []
    for k, (xs, ws, attrs, bias) in enumerate(CASES):
        x = g.add_input(f"x{k}", TensorType(dt, xs))
        w = g.add_constant(RNG.standard_normal(ws).astype(dt.np), f"w{k}")
        ins = [x, w] + ([g.add_constant(RNG.standard_normal(ws[1] * attrs.get("group", 1)).astype(dt.np), f"b{k}")]
                        if bias else [])
        outs.append(g.add(cv.ConvTranspose(**attrs), *ins))
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], ConvTranspose), n.describe()
    feeds = {f"x{k}": RNG.standard_normal(xs).astype(dt.np) for k, (xs, _, _, _) in enumerate(CASES)}
    return g, feeds


@pytest.mark.parametrize("dt", [DType.f32, DType.f64])
def test_on_the_llvm_printer(dt):
    g, feeds = _graph(dt)
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    for name in want:
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5 if dt is DType.f32 else 1e-12, atol=1e-5,
                                   err_msg=name)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds = _graph(DType.f32)
    got, want = run_cuda_forms(g, feeds, threads=8), interpret(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def _unet_step(cin: int, cout: int, hw: int):
    from onnx import TensorProto, helper, numpy_helper

    w = RNG.standard_normal((cin, cout, 2, 2)).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2]),
             helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 2 * hw, 2 * hw])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target, cin, cout, hw", [("cpu", 32, 16, 14), ("cuda", 4, 3, 5)])  # (the simulator is slow)
def test_a_unet_decoder_step_against_onnxruntime(target, cin, cout, hw):
    import onnxruntime as ort

    model = _unet_step(cin, cout, hw)
    x = RNG.standard_normal((1, cin, hw, hw)).astype(np.float32)
    exe = compiler.compile(model, target=target, fallback=False)
    assert [k["ops"] for k in exe.kernels][0] == ["ConvTranspose", "Relu"]  # one epilogue group
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(exe.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
