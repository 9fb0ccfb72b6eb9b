"""The ONNX frontend: import of real models, export back to ONNX (checked by onnx.checker and run by
ONNX Runtime), opset handling, and clear errors for bad models."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler.errors import ModelError, UnsupportedError
from compiler.ir.interpreter import InputError, interpret
from compiler.models import light_models, resolve
from frontends.onnx import export_model, import_model
from compiler.tools import zoo

LIGHT = light_models()


def _feeds(graph, seed=0):
    from compiler.tools.cli import random_inputs

    return random_inputs(graph, {}, seed)


def _tiny_model(op="Relu", opset=17, **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="the_node", **attrs)
    g = helper.make_graph([node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_nine_light_models_ship_with_onnx():
    assert len(LIGHT) == 9


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT)
def test_light_model_export_runs_in_onnxruntime(name):
    """import → export: onnx.checker accepts it and ONNX Runtime gives Kiln's interpreter's results."""
    graph = import_model(resolve(f"light:{name}"))
    model = export_model(graph)
    onnx.checker.check_model(model, full_check=True)
    feeds = _feeds(graph)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    ref = interpret(graph, feeds)
    for out, (name_, r) in zip(got, ref.items()):
        np.testing.assert_allclose(out, r, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(r).max())))


@pytest.mark.parametrize("name", ["mlp", "bert", "efficientnet_block"])
def test_zoo_model_export_round_trip(name):
    from tests.frontends.test_torch_models import CASES

    onnx_bytes, feeds, _ = zoo.export(name, **dict(CASES[name]))
    graph = import_model(onnx_bytes)
    model = export_model(graph)
    onnx.checker.check_model(model, full_check=True)
    again = import_model(model)
    assert again.op_counts() == graph.op_counts()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], interpret(graph, feeds)["output"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [1, 6, 7, 9, 11, 13, 17, 21])
def test_opsets_7_to_newest_import(opset):
    model = _tiny_model("Relu", opset)
    g = import_model(model)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(interpret(g, {"x": x})["y"], np.maximum(x, 0))


# -- bad input: each a clear error ---------------------------------------------------------------

def test_corrupt_file_is_a_clear_error(tmp_path):
    good = resolve("light:squeezenet")
    data = open(good, "rb").read()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError, match="not a valid ONNX model|holds no ONNX graph"):
        import_model(str(bad))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xfe this is not protobuf \x00\x01" * 10)
    with pytest.raises(ModelError, match="not a valid ONNX model|holds no ONNX graph"):
        import_model(str(garbage))
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        import_model(str(empty))
    with pytest.raises(ModelError, match="no such model file"):
        import_model(str(tmp_path / "missing.onnx"))


def test_unknown_op_names_op_node_and_opset():
    model = _tiny_model("FrobnicateTensor", 17)
    with pytest.raises(UnsupportedError) as e:
        import_model(model)
    msg = str(e.value)
    assert "FrobnicateTensor" in msg and "the_node" in msg and "opset 17" in msg and "not supported" in msg


def test_unsupported_domain_op_is_named():
    node = helper.make_node("FusedGemm", ["x"], ["y"], name="n1", domain="com.microsoft")
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedError, match=r"com\.microsoft\.FusedGemm.*n1"):
        import_model(model)


def test_unsupported_opset_is_named():
    model = _tiny_model("Relu", 6)
    model.opset_import[0].version = 0
    with pytest.raises(UnsupportedError, match="opset 0.*1 to"):
        import_model(model)
    newest = onnx.defs.onnx_opset_version()
    model = _tiny_model("Relu", 17)
    model.opset_import[0].version = newest + 1
    with pytest.raises(UnsupportedError, match=f"opset {newest + 1}"):
        import_model(model)


def test_unsupported_attribute_is_named():
    with pytest.raises(UnsupportedError, match="LeakyRelu.*the_node.*attribute.*beta"):
        import_model(_tiny_model("LeakyRelu", 17, beta=2.0))


def test_a_missing_required_attribute_is_named():
    """What the op's ONNX schema requires is not filled in with a default: a Cast without ``to`` (which
    Kiln's own Cast op would take as float32) and a BitShift without ``direction`` are refused."""
    with pytest.raises(ModelError, match="the_node.*required attribute 'to' is missing"):
        import_model(_tiny_model("Cast", 21))
    with pytest.raises(ModelError, match="required attribute 'direction' is missing"):
        node = helper.make_node("BitShift", ["a", "b"], ["y"], name="shift")
        g = helper.make_graph([node], "t", [helper.make_tensor_value_info(n, TensorProto.UINT8, [2]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2])])
        import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert import_model(_tiny_model("Cast", 21, to=TensorProto.FLOAT)).nodes  # given, it imports


def test_unsupported_dtype_is_named():
    node = helper.make_node("Relu", ["x"], ["y"], name="n")
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.COMPLEX64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.COMPLEX64, [2])])
    with pytest.raises(ModelError, match=r"Relu node .n. \(opset 17\): .*element type c64, supported: "):
        import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _split_model(opset, length, outputs, **attrs):
    node = helper.make_node("Split", ["x"], [f"y{i}" for i in range(outputs)], name="the_split", axis=1, **attrs)
    g = helper.make_graph([node], "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, length])],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(outputs)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_split_without_sizes_must_divide_evenly_before_opset_18():
    """Split-13 without its split input makes equal parts: a length that does not divide is a malformed
    model (as onnx's shape inference says), not a smaller last part; opset 18's num_outputs allows one,
    and from opset 18 a Split has either its split input or num_outputs."""
    with pytest.raises(ModelError, match="the_split.*axis 1 of length 11 must divide evenly into its 2 outputs"):
        import_model(_split_model(17, 11, 2))
    x = np.arange(22, dtype=np.float32).reshape(2, 11)
    even = import_model(_split_model(17, 12, 3))
    assert [tuple(v.shape) for v in even.outputs] == [(2, 4)] * 3
    with pytest.raises(ModelError, match="the_split.*needs the split input or the num_outputs attribute"):
        import_model(_split_model(18, 12, 2))  # opset 18 wants one of them
    with pytest.raises(ModelError, match="the_split.*num_outputs=3 but the node has 2 outputs"):
        import_model(_split_model(18, 12, 2, num_outputs=3))
    uneven = import_model(_split_model(18, 11, 2, num_outputs=2))
    outs = interpret(uneven, {"x": x})
    assert [o.shape for o in outs.values()] == [(2, 6), (2, 5)]
    np.testing.assert_array_equal(np.concatenate(list(outs.values()), axis=1), x)


def test_legacy_broadcast_with_axis():
    """Opset 6 Add with broadcast=1, axis=1: B [3] aligns with A's dimension 1."""
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4]),
                                        helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])])
    graph = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 6)]))
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.array([100, 200, 300], np.float32)
    np.testing.assert_array_equal(interpret(graph, {"a": a, "b": b})["y"], a + b[:, None])


def test_wrong_input_shape_dtype_and_missing_input_are_rejected():
    g = import_model(_tiny_model("Relu", 17))
    with pytest.raises(InputError, match=r"'x' has shape \[3, 2\], expected f32\[2,3\]"):
        interpret(g, {"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(InputError, match="'x' has dtype float64, expected f32"):
        interpret(g, {"x": np.zeros((2, 3), np.float64)})
    with pytest.raises(InputError, match=r"missing input\(s\) \['x'\]"):
        interpret(g, {})
    with pytest.raises(InputError, match=r"unknown input\(s\) \['z'\]"):
        interpret(g, {"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)})


def test_input_shapes_specialize_symbolic_dims():
    model = _tiny_model("Relu", 17)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    g = import_model(model)
    assert str(g.inputs[0].type) == "f32[batch,3]"
    g2 = import_model(model, input_shapes={"x": (5, 3)})
    assert str(g2.inputs[0].type) == "f32[5,3]"
    with pytest.raises(ModelError, match="dimension 1 is fixed to 3"):
        import_model(model, input_shapes={"x": (5, 4)})
    with pytest.raises(ModelError, match="unknown input"):
        import_model(model, input_shapes={"nope": (1, 3)})
