"""Random inputs the model can take (issue 21): ``kiln dump --check`` on a BERT-style model drew
token type ids in [0, 10) for an embedding of 2 rows and failed with "index 7 is out of range". An
integer input used as indices is drawn inside the axis it indexes; an index out of range found while
checking is reported as the inputs' fault, not a pass's."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.tools.cli import main, random_inputs
from compiler.errors import InputError
from compiler.tools.feeds import index_limits
from compiler.passes.instruments import CheckNumerics
from frontends.onnx import import_model


def _embeddings() -> onnx.ModelProto:
    """Word ids (Gather into 30 rows) and token type ids (Cast, Reshape, then Gather into 2 rows)."""
    rng = np.random.default_rng(0)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])
    tt = helper.make_tensor_value_info("tt", TensorProto.INT64, [1, 6])
    other = helper.make_tensor_value_info("n", TensorProto.INT64, [2])
    nodes = [helper.make_node("Gather", ["we", "ids"], ["a"]),
             helper.make_node("Cast", ["tt"], ["t32"], to=TensorProto.INT32),
             helper.make_node("Reshape", ["t32", "shape"], ["t2"]),
             helper.make_node("Gather", ["te", "t2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"]),
             helper.make_node("Add", ["n", "n"], ["m"])]
    inits = [numpy_helper.from_array(rng.standard_normal((30, 8)).astype(np.float32), "we"),
             numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "te"),
             numpy_helper.from_array(np.array([1, 6], np.int64), "shape")]
    g = helper.make_graph(nodes, "emb", [ids, tt, other], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                                          helper.make_tensor_value_info("m", TensorProto.INT64, None)],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_index_inputs_are_drawn_inside_the_axis_they_index():
    g = import_model(_embeddings())
    assert index_limits(g) == {"ids": 30, "tt": 2}
    for seed in range(5):
        feeds = random_inputs(g, {}, seed)
        assert feeds["tt"].max() < 2 and feeds["ids"].max() < 30
        assert feeds["n"].dtype == np.int64


def test_dump_check_on_embeddings(tmp_path, capsys):
    path = tmp_path / "emb.onnx"
    onnx.save(_embeddings(), str(path))
    assert main(["dump", str(path), "--check", "--seed", "3"]) == 0
    assert "OK: no pass changed the outputs" in capsys.readouterr().out


def test_check_blames_the_inputs_for_an_index_out_of_range():
    g = import_model(_embeddings())
    feeds = {"ids": np.zeros((1, 6), np.int64), "tt": np.full((1, 6), 7, np.int64), "n": np.zeros(2, np.int64)}
    with pytest.raises(InputError, match="inputs of the check are not valid.*out of range"):
        CheckNumerics(feeds).before_pipeline(g)
