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


def _residual_cnn(path):
    """Conv -> Relu -> Add (residual) -> Relu -> GlobalAveragePool -> Flatten -> Gemm, in ONNX."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    init = [numpy_helper.from_array((rng.standard_normal((6, 6, 3, 3)) * 0.2).astype(np.float32), "w"),
            numpy_helper.from_array((rng.standard_normal(6) * 0.1).astype(np.float32), "b"),
            numpy_helper.from_array((rng.standard_normal((5, 6)) * 0.5).astype(np.float32), "fw"),
            numpy_helper.from_array((rng.standard_normal(5) * 0.1).astype(np.float32), "fb")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["t"]), helper.make_node("GlobalAveragePool", ["t"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def test_qoperator_model_with_contrib_ops(tmp_path):
    """ONNX Runtime's QOperator format: QLinearConv, and its com.microsoft QLinearAdd,
    QLinearGlobalAveragePool and QGemm, imported as DequantizeLinear -> op -> QuantizeLinear; fully
    native, within one step of the output's quantization of ONNX Runtime."""
    src, path = str(tmp_path / "float.onnx"), str(tmp_path / "qop.onnx")
    _residual_cnn(src)
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((2, 6, 8, 8)).astype(np.float32)} for _ in range(5)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds[:4])

        def get_next(self):
            return next(self.it, None)

    quantize_static(src, path, Reader(), quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    model = onnx.load(path)
    ms = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= ms
    exe = compiler.compile(path, 2, fallback=False)
    got = exe.run(feeds[4])["y"]
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds[4])[0]
    last = model.graph.node[-1]  # the DequantizeLinear of the result: its scale is one step
    assert last.op_type == "DequantizeLinear"
    step = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == last.input[1])))
    assert np.abs(got - want).max() <= step * 1.0001


def test_qlinear_softmax_against_onnx_runtime():
    """com.microsoft QLinearSoftmax (ONNX Runtime's QOperator attention): Q(Softmax(DQ(x))) along the
    last axis, within one step of ONNX Runtime's (which computes it from a table of exponentials);
    the old opset's 2-D coercion along another axis is refused, saying so."""
    from onnx import TensorProto, helper

    def model(axis, opset):
        node = helper.make_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft",
                                axis=axis, opset=opset)
        init = [numpy_helper.from_array(np.float32(0.07), "sx"), numpy_helper.from_array(np.uint8(100), "zx"),
                numpy_helper.from_array(np.float32(1 / 256), "sy"), numpy_helper.from_array(np.uint8(0), "zy")]
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [3, 4, 37])],
                                  [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], init)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                       helper.make_opsetid("com.microsoft", 1)])

    x = np.random.default_rng(0).integers(0, 256, (3, 4, 37)).astype(np.uint8)
    got = compiler.compile(model(-1, 13), 2, fallback=False).run({"x": x})["y"]
    want = ort.InferenceSession(model(-1, 13).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    assert got.dtype == np.uint8 and np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert np.abs(got.astype(np.float64).sum(-1) / 256 - 1).max() < 0.1  # probabilities
    with pytest.raises(compiler.errors.UnsupportedError, match="2-D coercion"):
        compiler.compile(model(1, 11), 2)


def test_qoperator_transformer_runs_natively(tmp_path):
    """A BERT-style model quantized by ONNX Runtime in its QOperator format: QLinearMatMul on
    [1, seq, hidden] activations (a batch of one) and QLinearSoftmax, every node native, close to
    ONNX Runtime's outputs."""
    from compiler.tools import zoo

    proto, feeds, _ = zoo.load("zoo:bert?seq=8,vocab=30,hidden=16,heads=2,layers=1")
    src, path = str(tmp_path / "float.onnx"), str(tmp_path / "qop.onnx")
    onnx.save(proto, src)
    samples = [dict(feeds) for _ in range(3)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(src, path, Reader(), quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"QLinearMatMul", "QLinearSoftmax"} <= ops
    exe = compiler.compile(path, 2, fallback=False)
    assert exe.fallback == []
    got = next(iter(exe.run(feeds).values()))
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    cos = float((got * want).sum() / np.sqrt((got * got).sum() * (want * want).sum()))
    assert cos > 0.999, cos


def test_contrib_ops_say_what_they_do_not_support(tmp_path):
    from onnx import TensorProto, helper

    node = helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft",
                            channels_last=1)
    init = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(3), "z")]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(compiler.errors.UnsupportedError, match="channels_last=1"):
        compiler.compile(model, 2)
