"""ai.onnx.preview.training optimizers (Adagrad, Adam, Momentum): numbers against onnx.reference (ONNX
Runtime's default build has no training ops) and a hand-computed step, several tensors at once, types, and
refusals."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, lookup
from compiler.ir.ops import training as TR
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model

DOMAIN = "ai.onnx.preview.training"
GROUPS = {"Adagrad": (3, 2), "Adam": (4, 3), "Momentum": (3, 2)}


def _model(op_type, feeds, attrs, num_outputs):
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds]
    outs = [f"out{i}" for i in range(num_outputs)]
    node = helper.make_node(op_type, [n for n, _ in feeds], outs, domain=DOMAIN, **attrs)
    imports = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(helper.make_graph([node], "t", vis, [helper.ValueInfoProto(name=o) for o in outs]),
                             opset_imports=imports, ir_version=9)


def _feeds(op_type, shapes, t=3, dtype=np.float32):
    # seeded per call, so a test's data does not depend on which tests ran before it in the worker
    rng = np.random.default_rng(zlib.crc32(f"{op_type}{shapes}{t}{np.dtype(dtype)}".encode()))
    groups, _ = GROUPS[op_type]
    feeds = [("R", np.array(0.1, dtype)), ("T", np.array(t, np.int64))]
    for g in range(groups):
        for i, s in enumerate(shapes):
            a = rng.standard_normal(s).astype(dtype)
            if op_type == "Adagrad" and g == 2 or op_type == "Adam" and g == 3:
                a = np.asarray(np.abs(a))  # accumulated squares
            feeds.append((f"in{g}_{i}", a))
    return feeds


def _vs_reference(op_type, feeds, attrs, rtol=1e-6, atol=1e-6):
    n = (len(feeds) - 2) // GROUPS[op_type][0]
    model = _model(op_type, feeds, attrs, n * GROUPS[op_type][1])
    g = import_model(model)
    got = interpret(g, dict(feeds))
    refs = ReferenceEvaluator(model).run(None, dict(feeds))
    assert len(g.outputs) == len(refs)
    for name, v, ref in zip(g.output_names, g.outputs, refs):
        out = got[name]
        assert out.dtype == v.dtype.np and out.shape == v.type.shape == np.shape(ref)
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=name)
    return got


@pytest.mark.parametrize("t", [0, 4])
@pytest.mark.parametrize("shapes", [[(3,)], [(2, 3), (4,), ()]])
def test_adagrad(t, shapes):
    _vs_reference("Adagrad", _feeds("Adagrad", shapes, t), dict(decay_factor=0.1, norm_coefficient=0.01, epsilon=1e-5))


@pytest.mark.parametrize("t", [0, 5])
@pytest.mark.parametrize("shapes", [[(3,)], [(2, 3), (4,)]])
def test_adam(t, shapes):
    _vs_reference("Adam", _feeds("Adam", shapes, t), dict(alpha=0.85, beta=0.95, norm_coefficient=0.001,
                                                          norm_coefficient_post=0.02, epsilon=1e-7))


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
@pytest.mark.parametrize("shapes", [[(5,)], [(2, 2), (3,)]])
def test_momentum(mode, t, shapes):
    _vs_reference("Momentum", _feeds("Momentum", shapes, t),
                  dict(alpha=0.9, beta=0.1, norm_coefficient=0.01, mode=mode))


def test_double_and_defaults():
    _vs_reference("Adagrad", _feeds("Adagrad", [(4,)], dtype=np.float64), {}, rtol=1e-12)
    _vs_reference("Adam", _feeds("Adam", [(4,)], dtype=np.float64), {}, rtol=1e-12)


def test_adagrad_by_hand():
    x, g, h = np.array([1.0, -2.0], np.float32), np.array([0.5, 0.5], np.float32), np.array([0.0, 3.0], np.float32)
    xn, hn = TR.Adagrad(decay_factor=0.5).compute(np.array(1.0, np.float32), np.array(2, np.int64), x, g, h)
    r = 1.0 / (1 + 2 * 0.5)
    np.testing.assert_allclose(hn, [0.25, 3.25])
    np.testing.assert_allclose(xn, x - r * g / (np.sqrt([0.25, 3.25]) + 1e-6), rtol=1e-6)


def test_output_order_groups_values_then_states():
    """Two tensors: outputs are X1', X2', then the states of X1, X2 (shapes follow each tensor)."""
    g = Graph()
    r = g.add_input("r", TensorType(DType.f32, ()))
    t = g.add_input("t", TensorType(DType.i64, ()))
    xs = [g.add_input(f"v{i}", TensorType(DType.f32, s)) for i, s in enumerate([(2,), (3, 1)] * 4)]
    node = g.add_node(TR.Adam(), [r, t] + xs)
    assert [v.type.shape for v in node.outputs] == [(2,), (3, 1)] * 3
    node = g.add_node(TR.Momentum(alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0), [r, t] + xs[:6])
    assert len(node.outputs) == 4
    cost = TR.Adam().cost([n.type for n in [r, t] + xs], [v.type for v in g.nodes[0].outputs])
    assert cost.flops == 12 * 5


def test_domain():
    assert lookup("Adam", DOMAIN) is TR.Adam and lookup("Adam") is None


def _build(op, *types):
    g = Graph()
    ins = [g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    return g.add_node(op, ins)


def test_refusals():
    f32, i64 = TensorType(DType.f32, ()), TensorType(DType.i64, ())
    v = TensorType(DType.f32, (3,))
    with pytest.raises(OpError, match="3 groups of n tensors"):
        _build(TR.Adagrad(), f32, i64, v, v)
    with pytest.raises(OpError, match="4 groups"):
        _build(TR.Adam(), f32, i64, v, v, v)
    with pytest.raises(OpError, match="T \\(the update count\\) has element type f32"):
        _build(TR.Adagrad(), f32, f32, v, v, v)
    with pytest.raises(OpError, match="R \\(the learning rate\\) has element type i64"):
        _build(TR.Adagrad(), i64, i64, v, v, v)
    with pytest.raises(OpError, match="R must be a scalar"):
        _build(TR.Adagrad(), TensorType(DType.f32, (2,)), i64, v, v, v)
    with pytest.raises(OpError, match="one shape"):
        _build(TR.Adagrad(), f32, i64, v, TensorType(DType.f32, (4,)), v)
    with pytest.raises(OpError, match="share one element type"):
        _build(TR.Momentum(alpha=0.9, beta=0.1, mode="standard", norm_coefficient=0.0), f32, i64, v,
               TensorType(DType.f64, (3,)), v)
    with pytest.raises(OpError, match="the optimized tensors has element type f16"):
        h = TensorType(DType.f16, (3,))
        _build(TR.Adagrad(), f32, i64, h, h, h)


@pytest.mark.parametrize("attrs,match", [
    (dict(beta=0.1, mode="standard", norm_coefficient=0.0), "alpha is required"),
    (dict(alpha=0.9, beta=0.1, mode="heavy-ball", norm_coefficient=0.0), "mode must be"),
    (dict(alpha=0.9, beta=0.1, norm_coefficient=0.0), "mode is required"),
])
def test_momentum_attributes(attrs, match):
    with pytest.raises(OpError, match=match):
        TR.Momentum(**attrs)
