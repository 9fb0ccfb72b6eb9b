"""Random generators (RandomUniform(Like), RandomNormal(Like), Bernoulli, Multinomial): shapes and
types, statistics, seeds, that nothing is precomputed at compile time, import, refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError
from compiler.ir.ops import random as R
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import infer_types, run_op


def _run(op, *arrays):
    _, (y,) = run_op(op, *arrays)
    return y


_infer = infer_types


def T(shape, dtype=DType.f32):
    return TensorType(dtype, tuple(shape))


@pytest.mark.parametrize("dt", [DType.f32, DType.f16, DType.bf16, DType.f64])
def test_random_uniform_range_type_and_seed(dt):
    op = R.RandomUniform(shape=(200, 50), dtype=dt, low=-2.0, high=3.0, seed=1.5)
    y = _run(op)
    assert y.dtype == dt.np and y.shape == (200, 50)
    f = y.astype(np.float64)
    assert f.min() >= -2 and f.max() <= 3 and abs(f.mean() - 0.5) < 0.05
    np.testing.assert_array_equal(_run(op), y)  # a seed makes the draws reproducible
    assert not np.array_equal(_run(op.replace(seed=2.5)), y)


def test_random_normal_statistics():
    y = _run(R.RandomNormal(shape=(100000,), mean=3.0, scale=0.5, seed=0.0)).astype(np.float64)
    assert abs(y.mean() - 3) < 0.01 and abs(y.std() - 0.5) < 0.01


def test_unseeded_draws_differ_and_are_never_folded():
    g = Graph()
    node = g.add_node(R.RandomUniform(shape=(4,)), [])
    assert node.outputs[0].known is None  # not precomputed at compile time
    g.set_outputs([node.outputs[0]], ["y"])
    a, b = interpret(g, {})["y"], interpret(g, {})["y"]
    assert not np.array_equal(a, b)
    assert all(not cls.foldable for cls in R.OPS)


@pytest.mark.parametrize("cls", [R.RandomUniformLike, R.RandomNormalLike])
def test_like_variants_take_shape_and_type_of_input(cls):
    x = np.zeros((3, 4), np.float16)
    y = _run(cls(seed=3.0), x)
    assert y.dtype == np.float16 and y.shape == (3, 4)
    y = _run(cls(dtype=DType.f64), np.zeros((2, 5), np.int32))
    assert y.dtype == np.float64 and y.shape == (2, 5)
    with pytest.raises(OpError, match="dtype i32 is not supported"):
        _infer(cls(), T([2], DType.i32))  # an integer input needs dtype
    assert _infer(cls(dtype=DType.f32), T(["N", 3], DType.string)) == [T(["N", 3])]


def test_bernoulli_values_and_dtypes():
    p = np.array([0.0, 1.0, 0.0, 1.0] * 50, np.float32)
    y = _run(R.Bernoulli(seed=0.0), p)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, p)  # p in {0, 1} is deterministic
    half = _run(R.Bernoulli(dtype=DType.bool), np.full(20000, 0.3))
    assert half.dtype == np.bool_ and abs(half.mean() - 0.3) < 0.02
    assert _run(R.Bernoulli(dtype=DType.i64), p).dtype == np.int64
    with pytest.raises(OpError, match="input has element type i32"):
        _infer(R.Bernoulli(), T([3], DType.i32))
    with pytest.raises(OpError, match="dtype string"):
        R.Bernoulli(dtype=DType.string)


def test_multinomial_samples_follow_softmax():
    logits = np.log(np.array([[0.1, 0.2, 0.7], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], np.float32) + 1e-30)
    y = _run(R.Multinomial(sample_size=20000, seed=4.0), logits)
    assert y.dtype == np.int32 and y.shape == (3, 20000)
    freq = np.stack([(y[0] == k).mean() for k in range(3)])
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.7], atol=0.02)
    assert (y[1] == 0).all() and (y[2] == 2).all()
    assert _infer(R.Multinomial(dtype=DType.i64, sample_size=5), T(["B", 10])) == [T(["B", 5], DType.i64)]
    with pytest.raises(OpError, match="batch_size, class_size"):
        _infer(R.Multinomial(), T([10]))
    with pytest.raises(OpError, match="sample_size"):
        R.Multinomial(sample_size=0)
    with pytest.raises(OpError, match="dtype f32"):
        R.Multinomial(dtype=DType.f32)


def test_generator_refusals():
    with pytest.raises(OpError, match="negative"):
        R.RandomUniform(shape=(2, -1))
    with pytest.raises(OpError, match="low"):
        R.RandomUniform(shape=(2,), low=2.0, high=1.0)
    with pytest.raises(OpError, match="scale"):
        R.RandomNormal(shape=(2,), scale=-1.0)
    with pytest.raises(OpError, match="dtype i8"):
        R.RandomNormal(shape=(2,), dtype=DType.i8)


@pytest.mark.parametrize("opset", [7, 22])
def test_import_random_uniform_and_bernoulli(opset):
    nodes = [helper.make_node("RandomUniform", [], ["u"], shape=[2, 3], dtype=TensorProto.DOUBLE, seed=1.0)]
    outs = [helper.make_tensor_value_info("u", TensorProto.DOUBLE, [2, 3])]
    if opset >= 15:
        nodes.append(helper.make_node("Bernoulli", ["u"], ["b"], dtype=TensorProto.BOOL))
        outs.append(helper.make_tensor_value_info("b", TensorProto.BOOL, [2, 3]))
    m = helper.make_model(helper.make_graph(nodes, "t", [], outs), opset_imports=[helper.make_opsetid("", opset)],
                          ir_version=10)
    g = import_model(m)
    res = interpret(g, {})
    assert res["u"].dtype == np.float64 and res["u"].shape == (2, 3)
    if opset >= 15:
        assert res["b"].dtype == np.bool_
