"""PyTorch-built models, exported to ONNX, imported and run by Kiln's interpreter, checked against
PyTorch and ONNX Runtime (fp32: max abs error <= 1e-4 of the output's scale)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from compiler.ir.interpreter import interpret
from frontends.onnx import import_model
from compiler.tools import zoo

CASES = {
    "mlp": dict(batch=4),
    "bert": dict(hidden=64, heads=4, layers=2, seq=16, vocab=100),
    "mobilenetv2": dict(width=0.5, resolution=96, classes=100),
    "efficientnet_block": dict(resolution=64),
}


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-6))


@pytest.mark.parametrize("name", sorted(CASES))
def test_zoo_model_matches_torch_and_onnxruntime(name):
    onnx_bytes, feeds, module = zoo.export(name, **dict(CASES[name]))
    graph = import_model(onnx_bytes)
    got = interpret(graph, feeds)["output"]
    ref_torch = zoo.torch_reference(module, feeds)
    sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    ref_ort = sess.run(None, feeds)[0]
    assert got.shape == ref_torch.shape and got.dtype == np.float32
    assert rel_error(got, ref_torch) <= 1e-4, f"{name}: Kiln vs PyTorch {rel_error(got, ref_torch):.2e}"
    assert rel_error(got, ref_ort) <= 1e-4, f"{name}: Kiln vs ONNX Runtime {rel_error(got, ref_ort):.2e}"


def test_zoo_models_use_the_ops_they_should():
    """The models exercise what the issue asks for: LayerNorm/GELU/attention, depthwise conv + ReLU6,
    SE + SiLU + HardSwish."""
    ops = {name: set(import_model(zoo.export(name, **dict(kw))[0]).op_counts()) for name, kw in CASES.items()}
    assert {"MatMul", "Softmax", "Erf"} <= ops["bert"] and ({"LayerNormalization"} <= ops["bert"]
                                                             or {"ReduceMean", "Sqrt"} <= ops["bert"])
    assert {"Conv", "Clip"} <= ops["mobilenetv2"]
    assert {"Conv", "Sigmoid", "Mul", "HardSwish"} <= ops["efficientnet_block"]
