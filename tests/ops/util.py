"""Helpers the op tests share: one op run through the interpreter, one-node ONNX models imported and
run by Kiln, and Kiln's results compared with ONNX Runtime's."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.types import TensorType
from frontends.onnx import import_model


# ---------------------------------------------------------------------------------------------
# One op in a graph
# ---------------------------------------------------------------------------------------------

def op_graph(op, *arrays, const=None, num_outputs=None):
    """A graph applying ``op`` to ``arrays``: each becomes the graph input ``x{i}`` (None: a missing
    optional input), except the positions in ``const`` (position -> array), which become constants
    (known to inference). The results are the outputs ``y0``, ``y1``, ...; returns (graph, feeds, node)."""
    g = Graph()
    const = const or {}
    ins, feeds = [], {}
    for i, a in enumerate(arrays):
        if i in const:
            ins.append(g.add_constant(const[i]))
        elif a is None:
            ins.append(None)
        else:
            ins.append(g.add_input(f"x{i}", TensorType.of(a)))
            feeds[f"x{i}"] = a
    node = g.add_node(op, ins, num_outputs=num_outputs)
    g.set_outputs(list(node.outputs), [f"y{i}" for i in range(len(node.outputs))])
    return g, feeds, node


def run_op(op, *arrays, const=None, num_outputs=None):
    """Run ``op`` on ``arrays`` (as ``op_graph`` builds it) in the interpreter; returns (the result
    values, with their inferred types, and the result arrays)."""
    g, feeds, node = op_graph(op, *arrays, const=const, num_outputs=num_outputs)
    res = interpret(g, feeds)
    return node.outputs, [res[n] for n in g.output_names]


def infer_types(op, *operands):
    """The result types of ``op``; operands are TensorTypes (graph inputs), arrays (constants) or None."""
    g = Graph()
    ins = [None if o is None else g.add_input(f"x{i}", o) if isinstance(o, TensorType) else g.add_constant(o)
           for i, o in enumerate(operands)]
    return [v.type for v in g.add_node(op, ins).outputs]


# ---------------------------------------------------------------------------------------------
# ONNX models
# ---------------------------------------------------------------------------------------------

def value_info(name, arr_or_dtype, shape=None):
    """A value info of an array's element type and shape (or ``shape``), or of an ONNX element type."""
    if isinstance(arr_or_dtype, np.ndarray):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr_or_dtype.dtype),
                                             arr_or_dtype.shape if shape is None else shape)
    return helper.make_tensor_value_info(name, arr_or_dtype, shape)


def one_node(op_type, inputs, outputs, attrs=None, opset=22, initializers=(), shapes=None):
    """A one-node ONNX model. ``inputs``: (name, array) pairs fed at run time ("" for a missing optional
    input), then the ``initializers`` (TensorProtos); ``outputs``: output names ("" for one not asked
    for), declared without an element type; ``shapes``: name -> declared (maybe symbolic) input shape."""
    shapes = shapes or {}
    vis = [value_info(n, a, shapes.get(n)) for n, a in inputs if n]
    names = [n for n, _ in inputs] + [t.name for t in initializers]
    node = helper.make_node(op_type, names, outputs, **(attrs or {}))
    outs = [value_info(o, TensorProto.UNDEFINED, None) for o in outputs if o]
    g = helper.make_graph([node], "t", vis, outs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def kiln_run(model, feeds):
    """``model`` imported and run by Kiln's interpreter; returns (the graph, its output arrays)."""
    g = import_model(model)
    res = interpret(g, feeds)
    return g, [res[n] for n in g.output_names]


def ort_run(model, feeds):
    """``model`` run by ONNX Runtime (CPU)."""
    import onnxruntime as ort  # only the tests that compare with it need it

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def declare_output_types(model, g) -> None:
    """Declare ``model``'s outputs with the element types Kiln infers (graph ``g``), so that ONNX Runtime
    also refuses a wrong result type."""
    for out, v in zip(model.graph.output, g.outputs):
        out.CopyFrom(helper.make_tensor_value_info(out.name, v.dtype.onnx, None))


def assert_close(outs, refs, rtol, atol, check_dtype=True) -> None:
    """Results against reference results: as many, the same shapes (and element types), close values."""
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        if check_dtype:
            assert o.dtype == r.dtype, (o.dtype, r.dtype)
        assert o.shape == r.shape, (o.shape, r.shape)
        np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)
