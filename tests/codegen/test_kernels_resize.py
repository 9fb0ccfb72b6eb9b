"""Native Resize (compiler/codegen/kernels/resize.py) against the reference interpreter, on the LLVM
printer and in numba's CUDA simulator, and against ONNX Runtime: modes, coordinate transformations,
element types (integers rounded and saturated), tf_crop_and_resize's extrapolation, and the refusal
when the scales are only known at run time. ONNX's own 40 Resize cases run in the conformance suite."""
from __future__ import annotations

import os

import numpy as np
import pytest

import compiler
from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.resize import Resize
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import resample as rs
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(21)

CASES = [  # (attributes, scales or None, sizes or None)
    (dict(mode="nearest"), [1, 1, 2, 3], None),
    (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"), [1, 1, 0.6, 1.7], None),
    (dict(mode="linear"), [1, 1, 2, 2], None),
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), None, [2, 3, 9, 4]),
    (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), [1, 1, 0.5, 1.5], None),
    (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), [1, 1, 1.3, 0.8], None),
    (dict(mode="linear", antialias=1), [1, 1, 0.4, 0.6], None),
    (dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0),
     None, [2, 3, 6, 7]),
]


def _graph(dt: DType, cases=CASES):
    g = Graph(f"resize_{dt}")
    x = g.add_input("x", TensorType(dt, (2, 3, 5, 6)))
    roi = g.add_constant(np.array([0, 0, -0.2, 0.3, 1, 1, 1.1, 0.9], np.float32), "roi")
    outs = []
    for k, (attrs, scales, sizes) in enumerate(cases):
        ins = [x, roi if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize" else None]
        ins.append(g.add_constant(np.array(scales, np.float32), f"s{k}") if scales is not None else None)
        if sizes is not None:
            ins.append(g.add_constant(np.array(sizes, np.int64), f"z{k}"))
        while ins[-1] is None:
            ins.pop()
        outs.append(g.add(rs.Resize(**attrs), *ins))
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    for n in g.nodes:
        low, why = lowering_for(KernelGroup.of_node(n))
        assert isinstance(low, Resize), (n.describe(), why)
    return g


def _x(dt: DType):
    x = RNG.standard_normal((2, 3, 5, 6)) * 60
    if dt.is_int:
        info = np.iinfo(dt.np)
        x = np.clip(x + (info.min + info.max) / 2, info.min, info.max)
    return x.astype(dt.np)


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16, DType.u8, DType.i8, DType.i32])
def test_every_mode_on_the_llvm_printer(dt):
    g = _graph(dt)
    ins = {"x": _x(dt)}
    got, want = run_kernels(g, ins), interpret(g, ins)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        if dt.is_int:  # rounded to the nearest integer: a sum in another order may land on the other side of .5
            assert np.abs(got[name].astype(np.int64) - want[name].astype(np.int64)).max() <= 1, name
        else:
            tol = {DType.f16: 2e-3, DType.f32: 1e-5, DType.f64: 1e-12}[dt]
            np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64), rtol=tol,
                                       atol=tol * 60, err_msg=name)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g = _graph(DType.f32, CASES[:4] + CASES[5:])
    ins = {"x": _x(DType.f32)}
    got, want = run_cuda_forms(g, ins, threads=8), interpret(g, ins)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-4, err_msg=name)


def test_a_unet_upsample_against_onnxruntime():
    """A decoder's 2x bilinear upsampling (PyTorch's export: scales 1, 1, 2, 2; half_pixel) compiled whole."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])],
                              [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((1, 64, 28, 28)).astype(np.float32)
    exe = compiler.compile(model, fallback=False)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(exe.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_scales_known_only_at_run_time_are_refused():
    g = Graph("r")
    x = g.add_input("x", TensorType(DType.f32, (1, 1, 4, 4)))
    s = g.add_input("s", TensorType(DType.f32, (4,)))
    node = g.add_node(rs.Resize(mode="linear"), [x, None, s])
    g.set_outputs(list(node.outputs))
    low, why = lowering_for(KernelGroup.of_node(node))
    assert low is None and "is not static" in why  # the output's size waits for the scales
    # a static result whose roi is fed at run time: the taps cannot be tabulated
    r = g.add_input("roi", TensorType(DType.f32, (8,)))
    crop = g.add_node(rs.Resize(mode="linear", coordinate_transformation_mode="tf_crop_and_resize"),
                      [x, r, None, g.add_constant(np.array([1, 1, 3, 3], np.int64), "z")])
    low, why = lowering_for(KernelGroup.of_node(crop))
    assert low is None and "roi" in why
