"""Models quantized by others: ONNX Runtime's ``quantize_static`` (QDQ: QuantizeLinear/DequantizeLinear
around float ops) and ``quantize_dynamic`` (DynamicQuantizeLinear, ConvInteger, MatMulInteger) applied
to the digits CNN run fully native in Kiln and match ONNX Runtime's outputs to within one
quantization step. (``reduce_range``: 7-bit weights, so that ONNX Runtime's own AVX2 kernels, which add
pairs of uint8 x int8 products in saturating 16 bits, are exact on CPUs without VNNI too.)"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

import compiler

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "digits")
BATCH = 40


@pytest.fixture(scope="module")
def data():
    with np.load(os.path.join(HERE, "digits_data.npz")) as z:
        return z["calib"], z["test_x"]


def _ort(path, x):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])


def test_qdq_model_from_quantize_static(data, tmp_path):
    calib, test_x = data

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.it, None)

    path = str(tmp_path / "qdq.onnx")
    quantize_static(os.path.join(HERE, "digits_cnn.onnx"), path, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range=True)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    exe = compiler.compile(path, 2, {"x": [BATCH, 1, 8, 8]}, fallback=False)
    # fold-qdq: the products run on the int8 tiles (ConvInteger/MatMulInteger and their rescale)
    ops = [o for k in exe.manifest.kernels for o in k["ops"]]
    assert "ConvInteger" in ops and "Conv" not in ops and "Gemm" not in ops
    got = np.concatenate([exe.run({"x": test_x[i:i + BATCH]})["logits"] for i in range(0, 120, BATCH)])
    step = float(numpy_helper.to_array(next(t for t in onnx.load(path).graph.initializer if t.name == "logits_scale")))
    assert np.abs(got - _ort(path, test_x[:120])).max() <= step * 1.0001


def test_integer_ops_from_quantize_dynamic(data, tmp_path):
    _, test_x = data
    path = str(tmp_path / "dynamic.onnx")
    quantize_dynamic(os.path.join(HERE, "digits_cnn.onnx"), path, weight_type=QuantType.QInt8, reduce_range=True)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= ops
    # one image per call, as ONNX Runtime runs here: the activations' ranges (per call) are the same
    exe = compiler.compile(path, 2, {"x": [1, 1, 8, 8]}, fallback=False)
    got = np.concatenate([exe.run({"x": test_x[i:i + 1]})["logits"] for i in range(60)])
    want = _ort(path, test_x[:60])
    assert (got.argmax(1) == want.argmax(1)).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
