"""Errors in the input data found by native code (issue 21): a Gather with run-time indices out of
range returned zeros; now the kernel reports it through the call's status record and the run raises
an ``InputError`` naming the node and the index (as the interpreter and ONNX Runtime do)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from compiler.errors import InputError


def _gather_model(rows: int, n: int, axis: int = 0):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 3] if axis == 0 else [3, rows])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [n])
    nodes = [helper.make_node("Gather", ["x", "i"], ["t"], axis=axis, name="gat"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [x, i], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("axis", [0, 1])
def test_native_gather_reports_an_index_out_of_range(opt_level, axis):
    exe = compiler.compile(_gather_model(5, 4, axis), opt_level=opt_level, fallback=False)
    x = np.arange(15, dtype=np.float32).reshape((5, 3) if axis == 0 else (3, 5))
    good = np.array([0, -1, 4, -5])
    want = np.take(x, good, axis=axis)
    np.testing.assert_array_equal(exe.run({"x": x, "i": good})["y"], want)
    for bad in (7, 5, -6):
        with pytest.raises(InputError, match=rf"'gat'.*index {bad} is out of range for an axis of size 5"):
            exe.run({"x": x, "i": np.array([0, bad, 1, 2])})
        # the status is cleared for the next call
        np.testing.assert_array_equal(exe.run({"x": x, "i": good})["y"], want)


def test_many_indices_on_several_threads():
    exe = compiler.compile(_gather_model(50, 20000), nthreads=2, fallback=False)
    x = np.ones((50, 3), np.float32)
    idx = np.random.default_rng(0).integers(0, 50, 20000)
    assert exe.run({"x": x, "i": idx})["y"].shape == (20000, 3)
    idx[12345] = 50
    with pytest.raises(InputError, match="index 50 is out of range"):
        exe.run({"x": x, "i": idx})
