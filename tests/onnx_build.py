"""Small ONNX models for tests: ``float_model(nodes, inputs, inits)`` wraps nodes reading float inputs
(name, shape) and initializers (name, array) into an opset-17 model whose output ``y`` has an unknown
shape."""
from __future__ import annotations

from onnx import TensorProto, helper, numpy_helper


def float_model(nodes, inputs, inits=(), name: str = "m"):
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    g = helper.make_graph(nodes, name, vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m
