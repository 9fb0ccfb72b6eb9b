"""Normalizations, softmax family, Dropout and losses: numbers against ONNX Runtime (or by hand),
older-opset import (Softmax's 2-D coercion, Dropout's ratio attribute, BatchNormalization's spatial,
GroupNormalization-18's per-group scale), and refusals."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.errors import ModelError, UnsupportedError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import InterpreterError, interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import norm as N
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import (assert_close, declare_output_types, kiln_run, one_node, op_graph, ort_run, run_op,
                            value_info)

RNG = np.random.default_rng(0)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


#: a one-node model (inputs fed at run time, then initializers; outputs without an element type)
_model = one_node


def _feeds(inputs):
    return {n: a for n, a in inputs if n}


def _vs_ort(model, feeds, rtol=1e-5, atol=1e-6, check_dtype=True):
    """Kiln's import of ``model`` against ONNX Runtime. The outputs are declared with the element types
    Kiln infers, so ONNX Runtime also refuses a wrong result type."""
    g, outs = kiln_run(model, feeds)
    declare_output_types(model, g)
    assert_close(outs, ort_run(model, feeds), rtol, atol, check_dtype)
    return outs


def _run(op, *arrays, num_outputs=None):
    return run_op(op, *arrays, num_outputs=num_outputs)[1]


def _infer(op, *types):
    g = Graph()
    ins = [None if t is None else g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    return g.add_node(op, ins).outputs


def T(shape, dtype=DType.f32):
    return TensorType(dtype, tuple(shape))


# ---------------------------------------------------------------------------------------------
# BatchNormalization
# ---------------------------------------------------------------------------------------------

def _bn_inputs(c=3, shape=(2, 3, 4, 5)):
    return [("x", _rand(*shape)), ("s", _rand(c)), ("b", _rand(c)), ("m", _rand(c)),
            ("v", RNG.uniform(0.5, 2, c).astype(np.float32))]


@pytest.mark.parametrize("opset", [9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4, 5), (1, 3, 2, 2, 2)])
def test_batchnorm_inference_matches_onnxruntime(opset, shape):
    ins = _bn_inputs(shape=shape)
    _vs_ort(_model("BatchNormalization", ins, ["y"], {"epsilon": 1e-3}, opset), _feeds(ins))


def test_batchnorm_training_mode_by_hand():
    ins = _bn_inputs()
    x, s, b, m, v = (a for _, a in ins)
    y, rm, rv = _run(N.BatchNormalization(training_mode=1, momentum=0.8), x, s, b, m, v)
    axes = (0, 2, 3)
    mean, var = x.mean(axes), x.var(axes)
    want = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * s[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm, m * 0.8 + mean * 0.2, rtol=1e-5)
    np.testing.assert_allclose(rv, v * 0.8 + var * 0.2, rtol=1e-5)
    assert rm.dtype == np.float32 and rm.shape == (3,)


@pytest.mark.parametrize("opset", [9, 15])
def test_batchnorm_training_matches_onnxruntime(opset):
    ins = _bn_inputs()
    # before opset 14, asking for the running statistics means training (ONNX wants 1 or 5 outputs)
    attrs = {"momentum": 0.7} if opset < 14 else {"momentum": 0.7, "training_mode": 1}
    outs = ["y", "rm", "rv", "", ""] if opset < 14 else ["y", "rm", "rv"]
    _vs_ort(_model("BatchNormalization", ins, outs, attrs, opset), _feeds(ins), atol=1e-5)


def test_batchnorm_opset9_running_outputs_mean_training():
    ins = _bn_inputs()
    model = _model("BatchNormalization", ins, ["y", "rm", "rv"], {"momentum": 0.5}, 9)
    g = import_model(model)
    (node,) = g.nodes
    assert node.op.training_mode == 1 and node.op.pattern is Pattern.REDUCE
    y, rm, _ = (interpret(g, _feeds(ins))[n] for n in ("y", "rm", "rv"))
    x, m = ins[0][1], ins[3][1]
    np.testing.assert_allclose(rm, 0.5 * m + 0.5 * x.mean((0, 2, 3)), rtol=1e-5)


def test_batchnorm_opset9_saved_stats_refused():
    ins = _bn_inputs()
    model = _model("BatchNormalization", ins, ["y", "rm", "rv", "sm", "sv"], {}, 9)
    with pytest.raises(UnsupportedError, match="saved_mean"):
        import_model(model)


def test_batchnorm_opset7_non_spatial_matches_onnxruntime():
    x = _rand(2, 3, 4)
    ins = [("x", x), ("s", _rand(3, 4)), ("b", _rand(3, 4)), ("m", _rand(3, 4)),
           ("v", RNG.uniform(0.5, 2, (3, 4)).astype(np.float32))]
    model = _model("BatchNormalization", ins, ["y"], {"spatial": 0}, 7)
    (got,) = _vs_ort(model, _feeds(ins))
    _, s, b, m, v = (a for _, a in ins)
    np.testing.assert_allclose(got, (x - m) / np.sqrt(v + 1e-5) * s + b, rtol=1e-5, atol=1e-6)


def test_batchnorm_pattern_and_refusals():
    assert N.BatchNormalization().pattern is Pattern.BROADCAST
    assert N.BatchNormalization(training_mode=1).pattern is Pattern.REDUCE
    with pytest.raises(OpError, match="training_mode"):
        N.BatchNormalization(training_mode=2)
    c3 = T([3])
    with pytest.raises(OpError, match="scale must be a 1-D tensor of 3"):
        _infer(N.BatchNormalization(), T([2, 3, 4]), T([4]), c3, c3, c3)
    with pytest.raises(OpError, match="element type i32"):
        _infer(N.BatchNormalization(), T([2, 3], DType.i32), c3, c3, c3, c3)
    with pytest.raises(OpError, match="rank >= 2"):
        _infer(N.BatchNormalization(), T([3]), c3, c3, c3, c3)


# ---------------------------------------------------------------------------------------------
# Instance, group, layer, RMS, Lp, mean-variance normalization
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5)])
def test_instancenorm_matches_onnxruntime(shape):
    ins = [("x", _rand(*shape)), ("s", _rand(3)), ("b", _rand(3))]
    _vs_ort(_model("InstanceNormalization", ins, ["y"], {"epsilon": 1e-3}, 22), _feeds(ins), atol=1e-5)


def test_groupnorm21_matches_onnxruntime():
    ins = [("x", _rand(2, 6, 3, 3)), ("s", _rand(6)), ("b", _rand(6))]
    _vs_ort(_model("GroupNormalization", ins, ["y"], {"num_groups": 3}, 21), _feeds(ins), atol=1e-5)


@pytest.mark.parametrize("as_const", [True, False])
def test_groupnorm18_per_group_scale_expanded(as_const):
    x, s, b = _rand(2, 6, 3, 3), _rand(3), _rand(3)
    if as_const:
        ins = [("x", x)]
        inits = [numpy_helper.from_array(s, "s"), numpy_helper.from_array(b, "b")]
    else:
        ins, inits = [("x", x), ("s", s), ("b", b)], []
    model = _model("GroupNormalization", ins, ["y"], {"num_groups": 3, "epsilon": 1e-3}, 18, inits)
    got = interpret(import_model(model), {"x": x})["y"] if as_const else \
        interpret(import_model(model), _feeds(ins))["y"]
    xr = x.reshape(2, 3, -1)
    norm = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + 1e-3)).reshape(x.shape)
    want = norm * np.repeat(s, 2)[:, None, None] + np.repeat(b, 2)[:, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_groupnorm18_with_symbolic_channels_imports_as_its_function_body():
    """Kiln's GroupNormalization-18 needs static channels to expand its per-group scale; ONNX's
    function body (frontends/onnx/functions.py) needs none."""
    ins = [("x", _rand(2, 6, 3)), ("s", _rand(3)), ("b", _rand(3))]
    model = _model("GroupNormalization", ins, ["y"], {"num_groups": 3}, 18, shapes={"x": ["N", "C", 3]})
    assert "GroupNormalization" not in import_model(model).op_counts()
    _vs_ort(model, _feeds(ins), rtol=1e-4, atol=1e-5)


def test_groupnorm_refusals():
    with pytest.raises(OpError, match="num_groups is required"):
        N.GroupNormalization()
    with pytest.raises(OpError, match="num_groups must be >= 1"):
        N.GroupNormalization(num_groups=0)
    with pytest.raises(OpError, match="do not split into num_groups=4"):
        _infer(N.GroupNormalization(num_groups=4), T([1, 6, 2]), T([6]), T([6]))
    with pytest.raises(OpError, match="stash_type 7"):
        N.GroupNormalization(num_groups=2, stash_type=7)


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm_matches_onnxruntime(axis, with_bias):
    x = _rand(2, 3, 4)
    norm_shape = x.shape[axis % 3:]
    ins = [("x", x), ("w", _rand(*norm_shape))] + ([("b", _rand(*norm_shape))] if with_bias else [])
    _vs_ort(_model("LayerNormalization", ins, ["y", "mean", "inv"], {"axis": axis, "epsilon": 1e-3}, 17),
            _feeds(ins), atol=1e-5)


def test_layernorm_f16_and_stash_types():
    x, w, b = _rand(3, 8, dtype=np.float16), _rand(8, dtype=np.float16), _rand(8, dtype=np.float16)
    ins = [("x", x), ("w", w), ("b", b)]
    ys = _vs_ort(_model("LayerNormalization", ins, ["y", "mean", "inv"], {}, 17), _feeds(ins), rtol=2e-3,
                 atol=2e-3)
    assert ys[0].dtype == np.float16 and ys[1].dtype == np.float32
    y, mean, inv = _infer(N.LayerNormalization(stash_type=11), T([3, 8], DType.f16), T([8], DType.f16))
    assert y.type == T([3, 8], DType.f16) and mean.type == T([3, 1], DType.f64) == inv.type


def test_layernorm_refusals():
    with pytest.raises(OpError, match="stash_type 2"):
        N.LayerNormalization(stash_type=2)
    with pytest.raises(OpError, match="axis 3 is out of range"):
        _infer(N.LayerNormalization(axis=3), T([2, 3, 4]), T([4]))
    with pytest.raises(OpError, match="Scale f32\\[5\\] does not broadcast"):
        _infer(N.LayerNormalization(), T([2, 3, 4]), T([5]))
    with pytest.raises(OpError, match="share one element type"):
        _infer(N.LayerNormalization(), T([2, 4]), T([4], DType.f16))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_rmsnorm_matches_onnxruntime(axis):
    x = _rand(2, 3, 4)
    ins = [("x", x), ("w", _rand(*x.shape[axis % 3:]))]
    _vs_ort(_model("RMSNormalization", ins, ["y"], {"axis": axis, "epsilon": 1e-3}, 23), _feeds(ins),
            atol=1e-5)


def test_rmsnorm_by_hand_and_result_type():
    x = np.array([[3.0, 4.0]], np.float32)
    (y,) = _run(N.RMSNormalization(epsilon=0.0), x, np.array([1.0, 2.0], np.float32))
    rms = np.sqrt(12.5)
    np.testing.assert_allclose(y, [[3 / rms, 8 / rms]], rtol=1e-6)
    (y,) = _infer(N.RMSNormalization(), T([2, 4], DType.f16), T([4]))
    assert y.type == T([2, 4])  # the scale's element type
    with pytest.raises(OpError, match="does not broadcast"):
        _infer(N.RMSNormalization(), T([2, 4]), T([2, 4, 1]))


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lpnorm_matches_onnxruntime(p, axis):
    x = _rand(3, 4)
    ins = [("x", x)]
    _vs_ort(_model("LpNormalization", ins, ["y"], {"p": p, "axis": axis}, 22), _feeds(ins))


def test_lpnorm_zero_vector_gives_zero():
    (y,) = _run(N.LpNormalization(axis=0), np.array([[0.0, 3.0], [0.0, 4.0]], np.float32))
    np.testing.assert_allclose(y, [[0, 0.6], [0, 0.8]], rtol=1e-6)
    with pytest.raises(OpError, match="p must be 1 or 2"):
        N.LpNormalization(p=3)


@pytest.mark.parametrize("axes", [None, [0, 2], [1]])
def test_mvn_matches_onnxruntime(axes):
    x = _rand(2, 3, 4, 2)
    ins = [("x", x)]
    attrs = {} if axes is None else {"axes": axes}
    _vs_ort(_model("MeanVarianceNormalization", ins, ["y"], attrs, 13), _feeds(ins), atol=1e-5)


def test_mvn_refusals():
    with pytest.raises(OpError, match="repeat an axis"):
        _infer(N.MeanVarianceNormalization(axes=(0, -3)), T([2, 3, 4]))
    with pytest.raises(OpError, match="axes entry 3 is out of range"):
        _infer(N.MeanVarianceNormalization(), T([2, 3, 4]))


# ---------------------------------------------------------------------------------------------
# Softmax, LogSoftmax, Hardmax
# ---------------------------------------------------------------------------------------------

SOFTMAXES = ["Softmax", "LogSoftmax", "Hardmax"]


@pytest.mark.parametrize("op_type", SOFTMAXES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax13_matches_onnxruntime(op_type, axis):
    x = _rand(2, 3, 4) * 10
    ins = [("x", x)]
    _vs_ort(_model(op_type, ins, ["y"], {"axis": axis}, 13), _feeds(ins))


@pytest.mark.parametrize("op_type", SOFTMAXES)
@pytest.mark.parametrize("opset,attrs", [(7, {}), (7, {"axis": 0}), (7, {"axis": 2}), (11, {}),
                                         (11, {"axis": 0}), (11, {"axis": 2}), (11, {"axis": -2})])
def test_softmax_old_2d_coercion_matches_onnxruntime(op_type, opset, attrs):
    x = _rand(2, 3, 4)
    ins = [("x", x)]
    model = _model(op_type, ins, ["y"], attrs, opset)
    _vs_ort(model, _feeds(ins))
    ops = import_model(model).op_counts()
    if attrs.get("axis") == 2:
        assert ops == {op_type: 1}  # the last axis: no reshapes
    else:
        assert ops == {"Flatten": 1, op_type: 1, "Reshape": 1}


def test_softmax_old_symbolic_shape_uses_shape_op():
    x = _rand(2, 3, 4)
    model = _model("Softmax", [("x", x)], ["y"], {}, 11, shapes={"x": ["N", 3, 4]})
    g = import_model(model)
    assert g.op_counts() == {"Flatten": 1, "Reshape": 1, "Shape": 1, "Softmax": 1}
    assert g.outputs[0].type.rank == 3
    _vs_ort(model, {"x": x})


def test_softmax_by_hand_and_extremes():
    x = np.array([[1000.0, 1000.0, -np.inf], [0.0, np.log(3.0), -1e30]], np.float32)
    (y,) = _run(N.Softmax(), x)
    np.testing.assert_allclose(y, [[0.5, 0.5, 0], [0.25, 0.75, 0]], rtol=1e-6, atol=1e-7)
    (y,) = _run(N.LogSoftmax(), x[:, :2])
    np.testing.assert_allclose(y, np.log([[0.5, 0.5], [0.25, 0.75]]), rtol=1e-6)
    (y,) = _run(N.Hardmax(axis=0), np.array([[1.0, 5.0], [1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(y, [[1, 1], [0, 0]])  # ties: the first one


def test_softmax_refusals():
    with pytest.raises(OpError, match="element type i32"):
        _infer(N.Softmax(), T([2, 3], DType.i32))
    with pytest.raises(OpError, match="axis 2 is out of range"):
        _infer(N.LogSoftmax(axis=2), T([2, 3]))
    model = _model("Softmax", [("x", _rand(2, 3))], ["y"], {"axis": 3}, 11)
    with pytest.raises(ModelError, match="axis 3 is out of range"):
        import_model(model)


def test_patterns_and_costs():
    for cls in (N.InstanceNormalization, N.LayerNormalization, N.RMSNormalization, N.LpNormalization,
                N.MeanVarianceNormalization, N.Softmax, N.LogSoftmax, N.Hardmax,
                N.SoftmaxCrossEntropyLoss, N.NegativeLogLikelihoodLoss):
        assert cls.pattern is Pattern.REDUCE
    assert N.GroupNormalization(num_groups=1).pattern is Pattern.REDUCE
    assert N.Dropout.pattern is Pattern.ELEMWISE
    t = T([4, 10])
    assert N.Softmax().cost([t], [t]).flops == 12 * 40
    assert N.LayerNormalization().cost([t, T([10]), None], [t]).flops == 8 * 40
    assert N.Softmax().cost([t], [t]).bytes == 2 * 160


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset,with_ratio", [(22, False), (22, True), (13, True), (12, False)])
def test_dropout_inference_matches_onnxruntime(opset, with_ratio):
    x = _rand(3, 4)
    ins = [("x", x)] + ([("r", np.array(0.3, np.float32))] if with_ratio else [])
    y, mask = _vs_ort(_model("Dropout", ins, ["y", "mask"], {"seed": 3}, opset), _feeds(ins))
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_ and mask.all()


@pytest.mark.parametrize("opset", [7, 10, 11])
def test_dropout_old_ratio_attribute(opset):
    x = _rand(3, 4)
    _vs_ort(_model("Dropout", [("x", x)], ["y"], {"ratio": 0.2}, opset), {"x": x})
    # the mask: all kept, as ONNX's reference and opset 12+ define it (ONNX Runtime gives all zeros
    # before opset 12); before opset 10 it has the data's element type
    g = import_model(_model("Dropout", [("x", x)], ["y", "mask"], {"ratio": 0.2}, opset))
    y, mask = (interpret(g, {"x": x})[n] for n in ("y", "mask"))
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == (np.float32 if opset < 10 else np.bool_) and (mask == 1).all()


def test_dropout_old_unread_mask_not_materialized():
    x = _rand(3, 4)
    vis = [value_info("x", x)]
    nodes = [helper.make_node("Dropout", ["x"], ["d", "unread_mask"], name="drop", ratio=0.3),
             helper.make_node("Softmax", ["d"], ["y"], name="sm", axis=0)]
    model = helper.make_model(helper.make_graph(nodes, "t", vis, [value_info("y", TensorProto.FLOAT, None)]),
                              opset_imports=[helper.make_opsetid("", 9)], ir_version=9)
    g = import_model(model)
    assert g.op_counts() == {"Dropout": 1, "Flatten": 1, "Reshape": 1, "Softmax": 1}
    names = [n.name for n in g.nodes]
    assert len(set(names)) == len(names) and "sm/flatten" in names
    _vs_ort(model, {"x": x})


def test_dropout_training_with_seed():
    x = np.ones((50, 40), np.float32)
    r, t = np.array(0.25, np.float32), np.array(True)
    y1, m1 = _run(N.Dropout(seed=7), x, r, t)
    y2, m2 = _run(N.Dropout(seed=7), x, r, t)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(m1, m2)
    assert 0.6 < m1.mean() < 0.9
    np.testing.assert_allclose(y1, m1 / 0.75, rtol=1e-6)
    y3, m3 = _run(N.Dropout(seed=8), x, r, t)
    assert (m3 != m1).any()
    # ratio 0 in training: identity
    y, m = _run(N.Dropout(seed=1), x, np.array(0.0, np.float32), t)
    np.testing.assert_array_equal(y, x)
    assert m.all()


def test_dropout_training_is_not_folded():
    g = Graph()
    x = g.add_constant(np.ones((2, 2), np.float32))
    node = g.add_node(N.Dropout(), [x, g.add_constant(np.array(0.5, np.float32)), g.add_constant(np.array(True))])
    assert node.outputs[0].known is None
    node = g.add_node(N.Dropout(), [x, g.add_constant(np.array(0.5, np.float32)), g.add_constant(np.array(False))])
    np.testing.assert_array_equal(node.outputs[0].known, np.ones((2, 2)))


def test_dropout_refusals():
    with pytest.raises(OpError, match="ratio must be in \\[0, 1\\)"):
        g = Graph()
        g.add_node(N.Dropout(), [g.add_input("x", T([2])), g.add_constant(np.array(1.5, np.float32))])
    with pytest.raises(OpError, match="training_mode has element type f32"):
        _infer(N.Dropout(), T([2]), T([]), T([]))
    with pytest.raises(OpError, match="ratio must be a scalar"):
        _infer(N.Dropout(), T([2]), T([3]))
    with pytest.raises(OpError, match="data has element type i64"):
        _infer(N.Dropout(), T([2], DType.i64))


# ---------------------------------------------------------------------------------------------
# SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss
# ---------------------------------------------------------------------------------------------

LOSS_CASES = [
    # (scores shape, reduction, with weights, ignore_index)
    ((4, 5), "mean", False, None),
    ((4, 5), "sum", True, None),
    ((4, 5), "none", True, 2),
    ((3, 5, 2), "mean", True, 1),
    ((3, 5, 2, 2), "mean", False, -1),
    ((3, 5, 2), "none", False, None),
]


def _loss_inputs(shape, weights, ignore_index, labels_dtype=np.int64):
    x = _rand(*shape)
    labels = RNG.integers(0, shape[1], (shape[0],) + shape[2:]).astype(labels_dtype)
    if ignore_index is not None:
        labels.flat[0] = ignore_index
    ins = [("x", x), ("t", labels)]
    if weights:
        ins.append(("w", RNG.uniform(0.1, 1, shape[1]).astype(np.float32)))
    return ins


@pytest.mark.parametrize("shape,reduction,weights,ii", LOSS_CASES)
def test_sce_matches_onnxruntime(shape, reduction, weights, ii):
    ins = _loss_inputs(shape, weights, ii)
    attrs = {"reduction": reduction} if ii is None else {"reduction": reduction, "ignore_index": ii}
    _vs_ort(_model("SoftmaxCrossEntropyLoss", ins, ["loss", "logp"], attrs, 13), _feeds(ins), atol=1e-5)


@pytest.mark.parametrize("shape,reduction,weights,ii", LOSS_CASES)
def test_nll_matches_onnxruntime(shape, reduction, weights, ii):
    ins = _loss_inputs(shape, weights, ii, np.int32)
    attrs = {"reduction": reduction} if ii is None else {"reduction": reduction, "ignore_index": ii}
    _vs_ort(_model("NegativeLogLikelihoodLoss", ins, ["loss"], attrs, 22), _feeds(ins), atol=1e-5)


def test_nll_by_hand():
    x = np.array([[[1.0, 2.0], [2.0, 2.0], [3.0, 2.0]], [[0.0, 1.0], [2.0, 2.0], [1.0, 2.0]]], np.float32)
    t = np.array([[2, 1], [0, 2]], np.int64)
    w = np.array([0.2, 0.3, 0.1], np.float32)
    (y,) = _run(N.NegativeLogLikelihoodLoss(reduction="none"), x, t)
    np.testing.assert_allclose(y, [[-3, -2], [-0, -2]])
    (y,) = _run(N.NegativeLogLikelihoodLoss(reduction="sum"), x, t, w)
    np.testing.assert_allclose(y, -1.1, rtol=1e-6)
    (y,) = _run(N.NegativeLogLikelihoodLoss(), x, t, w)
    np.testing.assert_allclose(y, -1.1 / 0.7, rtol=1e-6)
    assert y.shape == ()


def test_loss_shapes_and_refusals():
    loss, logp = _infer(N.SoftmaxCrossEntropyLoss(reduction="none"), T(["N", 5, 7]), T(["N", 7], DType.i64))
    assert loss.type == T(["N", 7]) and logp.type == T(["N", 5, 7])
    (loss,) = _infer(N.NegativeLogLikelihoodLoss(), T([2, 5]), T([2], DType.i32))
    assert loss.type == T([])
    with pytest.raises(OpError, match="reduction must be one of"):
        N.SoftmaxCrossEntropyLoss(reduction="max")
    with pytest.raises(OpError, match="target f32\\[2\\]|target has element type f32"):
        _infer(N.NegativeLogLikelihoodLoss(), T([2, 5]), T([2]))
    with pytest.raises(OpError, match="shape without the class axis"):
        _infer(N.NegativeLogLikelihoodLoss(), T([2, 5, 3]), T([2, 4], DType.i64))
    with pytest.raises(OpError, match="weights must be a 1-D tensor of 5"):
        _infer(N.SoftmaxCrossEntropyLoss(), T([2, 5]), T([2], DType.i64), T([4]))
    with pytest.raises(OpError, match="rank >= 2"):
        _infer(N.SoftmaxCrossEntropyLoss(), T([5]), T([], DType.i64))
    with pytest.raises(InterpreterError, match="out of range \\[0, 5\\)"):
        _run(N.NegativeLogLikelihoodLoss(), _rand(2, 5), np.array([1, 5], np.int64))


def test_ops_table_and_export_round_trip():
    from frontends.onnx.exporter import export_model

    assert {c.name for c in N.OPS} >= {"BatchNormalization", "GroupNormalization", "Dropout",
                                        "SoftmaxCrossEntropyLoss", "Hardmax"}
    g, feeds, _ = op_graph(N.GroupNormalization(num_groups=2, epsilon=1e-3), _rand(2, 4, 3), _rand(4), _rand(4))
    model = export_model(g)
    assert model.opset_import[0].version >= 21
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], interpret(g, feeds)["y0"], rtol=1e-5, atol=1e-5)
