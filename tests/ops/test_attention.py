"""Attention family: Attention (MHA/GQA, 3D/4D, masks, causal, KV cache, softcap, qk output modes,
nonpad_kv_seqlen, windows), RotaryEmbedding, SwiGLU, LinearAttention, FlexAttention: numbers against
ONNX Runtime or the ONNX reference evaluator (or by hand), shape inference, and refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from compiler.errors import ModelError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import attention as A
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import assert_close, kiln_run, ort_run

RNG = np.random.default_rng(0)


def _rand(*shape, dtype=np.float32):
    return RNG.random(shape).astype(dtype)


def _model(op_type, inputs, outputs, attrs, opset, domain="", extra_opsets=()):
    """One-node model. ``inputs``: (name, array) fed at run time ("" for a missing optional input)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs if n]
    node = helper.make_node(op_type, [n for n, _ in inputs], outputs, domain=domain, **attrs)
    elem = helper.np_dtype_to_tensor_dtype(inputs[0][1].dtype)
    outs = [helper.make_tensor_value_info(o, elem, None) for o in outputs if o]
    g = helper.make_graph([node], "t", vis, outs)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    return helper.make_model(g, opset_imports=opsets, ir_version=10)


def _feeds(inputs):
    return {n: a for n, a in inputs if n}


def _kiln(model, feeds):
    return kiln_run(model, feeds)[1]


def _vs_ort(model, feeds, rtol=1e-5, atol=1e-6):
    assert_close(_kiln(model, feeds), ort_run(model, feeds), rtol, atol)


def _vs_ref(model, feeds, rtol=1e-5, atol=1e-6):
    assert_close(_kiln(model, feeds), ReferenceEvaluator(model).run(None, feeds), rtol, atol)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

def test_attention_4d_vs_ort():
    ins = [("Q", _rand(2, 3, 4, 8)), ("K", _rand(2, 3, 6, 8)), ("V", _rand(2, 3, 6, 10))]
    _vs_ort(_model("Attention", ins, ["Y"], {}, 23), _feeds(ins))


def test_attention_gqa_causal_float_mask_scale_vs_ort():
    ins = [("Q", _rand(2, 6, 4, 8)), ("K", _rand(2, 2, 4, 8)), ("V", _rand(2, 2, 4, 8)),
           ("attn_mask", _rand(4, 4))]
    _vs_ort(_model("Attention", ins, ["Y"], {"is_causal": 1, "scale": 0.3}, 23), _feeds(ins))


def test_attention_3d_with_past_and_present_vs_ort():
    ins = [("Q", _rand(2, 4, 24)), ("K", _rand(2, 3, 24)), ("V", _rand(2, 3, 24)),
           ("attn_mask", _rand(4, 8)), ("past_key", _rand(2, 3, 5, 8)), ("past_value", _rand(2, 3, 5, 8))]
    m = _model("Attention", ins, ["Y", "present_key", "present_value"], {"q_num_heads": 3, "kv_num_heads": 3}, 23)
    _vs_ort(m, _feeds(ins))
    g = import_model(m)
    assert [str(v.type) for v in g.outputs] == ["f32[2,4,24]", "f32[2,3,8,8]", "f32[2,3,8,8]"]


def test_attention_bool_mask_4d_softcap_vs_ort():
    mask = RNG.random((2, 3, 4, 6)) > 0.3
    mask[..., 0] = True  # no fully masked rows: ORT and the spec agree there
    ins = [("Q", _rand(2, 3, 4, 8)), ("K", _rand(2, 3, 6, 8)), ("V", _rand(2, 3, 6, 8)), ("attn_mask", mask)]
    _vs_ort(_model("Attention", ins, ["Y"], {"softcap": 1.5}, 23), _feeds(ins))


@pytest.mark.parametrize("mode, softcap", [(0, 0.0), (1, 2.0), (2, 2.0), (3, 2.0)])
def test_attention_qk_matmul_output_modes_vs_reference(mode, softcap):
    ins = [("Q", _rand(1, 2, 3, 4)), ("K", _rand(1, 2, 5, 4)), ("V", _rand(1, 2, 5, 4)),
           ("attn_mask", _rand(3, 5))]
    m = _model("Attention", ins, ["Y", "", "", "qk"], {"softcap": softcap, "qk_matmul_output_mode": mode}, 24)
    _vs_ref(m, _feeds(ins))


def test_attention_qk_mode0_is_raw_scores_even_with_softcap():
    """Mode 0 is the raw (scaled) QK product, as the spec and the ONNX function body say (the ONNX
    reference evaluator returns the softcapped scores here)."""
    q, k, v = _rand(1, 2, 3, 4), _rand(1, 2, 5, 4), _rand(1, 2, 5, 4)
    qk = A.Attention(softcap=0.5, scale=0.25).compute(q, k, v)[3]
    np.testing.assert_allclose(qk, q @ np.swapaxes(k, -1, -2) * 0.25, rtol=1e-6)


def test_attention_nonpad_causal_window_vs_reference():
    ins = [("Q", _rand(2, 4, 3, 8)), ("K", _rand(2, 2, 8, 8)), ("V", _rand(2, 2, 8, 8)),
           ("attn_mask", _rand(4, 3, 8)), ("", None), ("", None), ("nonpad_kv_seqlen", np.array([6, 8], np.int64))]
    m = _model("Attention", ins, ["Y"], {"is_causal": 1, "left_window_size": 2}, 25)
    _vs_ref(m, _feeds(ins))


def test_attention_fp16_softmax_precision_vs_reference():
    ins = [("Q", _rand(1, 2, 3, 8, dtype=np.float16)), ("K", _rand(1, 2, 3, 8, dtype=np.float16)),
           ("V", _rand(1, 2, 3, 8, dtype=np.float16))]
    m = _model("Attention", ins, ["Y", "", "", "qk"], {"softmax_precision": TensorProto.FLOAT,
                                                         "qk_matmul_output_mode": 3, "is_causal": 1}, 24)
    _vs_ref(m, _feeds(ins), rtol=1e-3, atol=1e-4)


def test_attention_bidirectional_window_by_hand():
    g = Graph()
    q = g.add_input("Q", TensorType(DType.f32, (1, 1, 5, 1)))
    v = g.add_input("V", TensorType(DType.f32, (1, 1, 5, 1)))
    y = g.add_node(A.Attention(left_window_size=1, right_window_size=2), [q, q, v], num_outputs=1).output
    g.set_outputs([y], ["y"])
    out = interpret(g, {"Q": np.zeros((1, 1, 5, 1), np.float32),
                        "V": np.arange(5, dtype=np.float32).reshape(1, 1, 5, 1)})["y"]
    np.testing.assert_allclose(out.ravel(), [1.0, 1.5, 2.5, 3.0, 3.5])


def test_attention_fully_masked_row_is_zero():
    op = A.Attention(qk_matmul_output_mode=3)
    q, k, v = _rand(1, 1, 2, 4), _rand(1, 1, 3, 4), _rand(1, 1, 3, 4)
    mask = np.array([[False, False, False], [True, True, False]])
    y, _, _, probs = op.compute(q, k, v, mask)
    assert np.all(np.isfinite(y)) and np.all(y[0, 0, 0] == 0) and np.all(probs[0, 0, 0] == 0)
    np.testing.assert_allclose(probs[0, 0, 1].sum(), 1.0, rtol=1e-6)
    assert probs[0, 0, 1, 2] == 0


def test_attention_gqa_head_mapping():
    """Query head h uses K/V head h // (Hq / Hkv)."""
    q, k, v = _rand(1, 4, 2, 4), _rand(1, 2, 3, 4), _rand(1, 2, 3, 4)
    y = A.Attention().compute(q, k, v)[0]
    ref = A.Attention().compute(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1))[0]
    np.testing.assert_allclose(y, ref, rtol=1e-6)


def test_attention_symbolic_shapes_and_cost():
    g = Graph()
    q = g.add_input("Q", TensorType(DType.f32, ("B", "S", 64)))
    k = g.add_input("K", TensorType(DType.f32, ("B", "T", 32)))
    pk = g.add_input("pk", TensorType(DType.f32, ("B", 2, "P", 16)))
    node = g.add_node(A.Attention(q_num_heads=4, kv_num_heads=2), [q, k, k, None, pk, pk])
    types = [str(o.type) for o in node.outputs]
    assert types == ["f32[B,S,64]", "f32[B,2,?,16]", "f32[B,2,?,16]", "f32[B,4,S,?]"]
    assert A.Attention.pattern is Pattern.OPAQUE
    ins = [TensorType(DType.f32, (2, 4, 8, 16)), TensorType(DType.f32, (2, 4, 10, 16)),
           TensorType(DType.f32, (2, 4, 10, 16))]
    outs = [TensorType(DType.f32, (2, 4, 8, 16))]
    n = 2 * 4 * 8 * 10
    assert A.Attention().cost(ins, outs).flops == 2 * n * 32 + 5 * n


def _attn_types(g, *shapes, dtypes=None):
    dtypes = dtypes or [DType.f32] * len(shapes)
    return [None if s is None else g.add_input(f"x{i}", TensorType(d, s))
            for i, (s, d) in enumerate(zip(shapes, dtypes))]


@pytest.mark.parametrize("attrs, shapes, dtypes, match", [
    ({}, [(2, 4, 24), (2, 4, 24), (2, 4, 24)], None, "q_num_heads attribute is required"),
    ({}, [(2, 3, 4, 8), (2, 3, 6, 4), (2, 3, 6, 8)], None, "head sizes differ"),
    ({}, [(2, 3, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)], None, "multiple of the number of K/V heads"),
    ({}, [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), None, (2, 3, 2, 8)], None, "given together"),
    ({}, [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), (4, 6)],
     [DType.f32, DType.f32, DType.f32, DType.i32], "attn_mask has element type i32"),
    ({}, [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), (3, 6)], None, "does not broadcast"),
    ({}, [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), (4, 7)], None, "longer than the total key length"),
    ({}, [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)], [DType.i32] * 3, "Q has element type i32"),
    ({}, [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), None, (2, 3, 2, 8), (2, 3, 2, 8), (2,)],
     [DType.f32] * 6 + [DType.i64], "cannot be combined"),
    ({}, [(2, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)], None, "same rank"),
])
def test_attention_refusals_infer(attrs, shapes, dtypes, match):
    g = Graph()
    ins = _attn_types(g, *shapes, dtypes=dtypes)
    with pytest.raises(OpError, match=match):
        g.add_node(A.Attention(**attrs), ins)


@pytest.mark.parametrize("attrs, match", [
    ({"qk_matmul_output_mode": 4}, "qk_matmul_output_mode"),
    ({"is_causal": 2}, "is_causal"),
    ({"softmax_precision": TensorProto.INT32}, "softmax_precision"),
    ({"q_num_heads": 3, "kv_num_heads": 2}, "multiple of kv_num_heads"),
    ({"left_window_size": -2}, "left_window_size"),
    ({"softcap": -1.0}, "softcap"),
])
def test_attention_refusals_attributes(attrs, match):
    with pytest.raises(OpError, match=match):
        A.Attention(**attrs)


def test_attention_bad_attribute_in_model_is_model_error():
    ins = [("Q", _rand(2, 4, 24)), ("K", _rand(2, 4, 24)), ("V", _rand(2, 4, 24))]
    with pytest.raises(ModelError, match="q_num_heads"):
        import_model(_model("Attention", ins, ["Y"], {}, 23))


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs, cache_dim", [({}, 4), ({"interleaved": 1}, 4), ({"rotary_embedding_dim": 4}, 2),
                                              ({"interleaved": 1, "rotary_embedding_dim": 4}, 2)])
def test_rotary_embedding_4d_vs_ort(attrs, cache_dim):
    ins = [("X", _rand(2, 4, 3, 8)), ("cos", _rand(20, cache_dim)), ("sin", _rand(20, cache_dim)),
           ("pos", RNG.integers(0, 20, (2, 3)).astype(np.int64))]
    _vs_ort(_model("RotaryEmbedding", ins, ["Y"], attrs, 23), _feeds(ins))


def test_rotary_embedding_3d_vs_ort():
    ins = [("X", _rand(2, 3, 32)), ("cos", _rand(20, 4)), ("sin", _rand(20, 4)),
           ("pos", RNG.integers(0, 20, (2, 3)).astype(np.int64))]
    _vs_ort(_model("RotaryEmbedding", ins, ["Y"], {"num_heads": 4}, 23), _feeds(ins))


def test_rotary_embedding_no_position_ids_vs_reference():
    ins = [("X", _rand(2, 4, 3, 8)), ("cos", _rand(2, 3, 4)), ("sin", _rand(2, 3, 4))]
    _vs_ref(_model("RotaryEmbedding", ins, ["Y"], {"interleaved": 1}, 23), _feeds(ins))


def test_rotary_embedding_by_hand():
    # one head, one token, head size 2: rotation by angle t of (1, 0) is (cos t, sin t)
    x = np.array([[[[1.0, 0.0]]]], np.float32)
    t = 0.7
    cos = np.array([[np.cos(t)]], np.float32)
    sin = np.array([[np.sin(t)]], np.float32)
    y = A.RotaryEmbedding().compute(x, cos, sin, np.zeros((1, 1), np.int64))[0]
    np.testing.assert_allclose(y.ravel(), [np.cos(t), np.sin(t)], rtol=1e-6)


@pytest.mark.parametrize("attrs, xs, cs, match", [
    ({}, (2, 3, 32), (20, 4), "num_heads attribute is required"),
    ({}, (2, 4, 3, 8), (20, 3), "last dimension must be rotary_embedding_dim/2"),
    ({"rotary_embedding_dim": 10}, (2, 4, 3, 8), (20, 5), "larger than the head size"),
    ({}, (2, 4, 3, 8), (2, 3, 4), "must be 2D"),
])
def test_rotary_embedding_refusals(attrs, xs, cs, match):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, xs))
    c = g.add_input("c", TensorType(DType.f32, cs))
    p = g.add_input("p", TensorType(DType.i64, (xs[0], 3)))
    with pytest.raises(OpError, match=match):
        g.add_node(A.RotaryEmbedding(**attrs), [x, c, c, p])


def test_rotary_embedding_odd_dim_attribute():
    with pytest.raises(OpError, match="rotary_embedding_dim"):
        A.RotaryEmbedding(rotary_embedding_dim=3)


# ---------------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, dtype", [(1.0, np.float32), (0.5, np.float32), (1.0, np.float16)])
def test_swiglu_by_hand(alpha, dtype):
    a = np.array([[1.0, -2.0, 3.0], [0.0, 0.5, -0.5]], dtype)
    b = np.array([[0.5, 1.0, -1.0], [2.0, -1.0, 4.0]], dtype)
    ins = [("A", a), ("B", b)]
    (y,) = _kiln(_model("SwiGLU", ins, ["Y"], {"alpha": alpha}, 28), _feeds(ins))
    af = a.astype(np.float64)
    ref = af / (1 + np.exp(-alpha * af)) * b.astype(np.float64)
    assert y.dtype == dtype
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=1e-3 if dtype == np.float16 else 1e-6)


def test_swiglu_refusals():
    g = Graph()
    a = g.add_input("a", TensorType(DType.f32, (2, 4)))
    b = g.add_input("b", TensorType(DType.f32, (1, 4)))
    c = g.add_input("c", TensorType(DType.f16, (2, 4)))
    with pytest.raises(OpError, match="same shape"):
        g.add_node(A.SwiGLU(), [a, b])
    with pytest.raises(OpError, match="share one element type"):
        g.add_node(A.SwiGLU(), [a, c])
    assert A.SwiGLU.pattern is Pattern.ELEMWISE


# ---------------------------------------------------------------------------------------------
# LinearAttention
# ---------------------------------------------------------------------------------------------

def _l2(x, heads):
    b, t, hd = x.shape
    x4 = x.reshape(b, t, heads, hd // heads)
    return (x4 / np.linalg.norm(x4, axis=-1, keepdims=True)).reshape(b, t, hd).astype(x.dtype)


@pytest.mark.parametrize("rule, hq, hkv, per_head_decay, past", [
    ("linear", 2, 2, False, False), ("gated", 2, 2, False, False), ("gated", 2, 2, True, True),
    ("delta", 2, 2, False, False), ("gated_delta", 4, 2, False, True), ("gated_delta", 4, 1, True, False),
])
def test_linear_attention_vs_reference(rule, hq, hkv, per_head_decay, past):
    b, t, dk, dv = 2, 5, 4, 3
    ins = [("query", RNG.standard_normal((b, t, hq * dk)).astype(np.float32)),
           ("key", _l2(RNG.standard_normal((b, t, hkv * dk)).astype(np.float32), hkv)),
           ("value", RNG.standard_normal((b, t, hkv * dv)).astype(np.float32)),
           ("past_state" if past else "", RNG.standard_normal((b, hkv, dk, dv)).astype(np.float32) * 0.1),
           ("decay" if "gated" in rule else "",
            (-np.abs(RNG.standard_normal((b, t, hkv if per_head_decay else hkv * dk))) * 0.1).astype(np.float32)),
           ("beta" if "delta" in rule else "", RNG.random((b, t, hkv)).astype(np.float32))]
    while not ins[-1][0]:
        ins.pop()
    m = _model("LinearAttention", ins, ["output", "present_state"],
               {"update_rule": rule, "q_num_heads": hq, "kv_num_heads": hkv}, 27)
    _vs_ref(m, _feeds(ins), rtol=1e-4, atol=1e-5)


def test_linear_attention_by_hand():
    # linear rule, one head, d_k = d_v = 1: S_t = sum k*v, o_t = scale * q_t * S_t
    q = np.array([[[1.0], [2.0], [3.0]]], np.float32)
    k = np.array([[[1.0], [1.0], [2.0]]], np.float32)
    v = np.array([[[2.0], [3.0], [1.0]]], np.float32)
    op = A.LinearAttention(q_num_heads=1, kv_num_heads=1, update_rule="linear", scale=0.5)
    out, state = op.compute(q, k, v)
    np.testing.assert_allclose(out.ravel(), [0.5 * 1 * 2, 0.5 * 2 * 5, 0.5 * 3 * 7])
    np.testing.assert_allclose(state.ravel(), [7.0])


def test_linear_attention_refusals():
    with pytest.raises(OpError, match="update_rule"):
        A.LinearAttention(q_num_heads=2, kv_num_heads=2, update_rule="fancy")
    with pytest.raises(OpError, match="multiple of kv_num_heads"):
        A.LinearAttention(q_num_heads=3, kv_num_heads=2)
    g = Graph()
    q = g.add_input("q", TensorType(DType.f32, (2, 4, 8)))
    with pytest.raises(OpError, match="needs the decay input"):
        g.add_node(A.LinearAttention(q_num_heads=2, kv_num_heads=2, update_rule="gated"), [q, q, q])
    with pytest.raises(OpError, match="needs the beta input"):
        g.add_node(A.LinearAttention(q_num_heads=2, kv_num_heads=2, update_rule="delta"), [q, q, q])
    bad = g.add_input("d", TensorType(DType.f32, (2, 4, 3)))
    with pytest.raises(OpError, match="decay's last dimension"):
        g.add_node(A.LinearAttention(q_num_heads=2, kv_num_heads=2, update_rule="gated"), [q, q, q, None, bad])
    node = g.add_node(A.LinearAttention(q_num_heads=2, kv_num_heads=1, update_rule="linear"),
                      [q, g.add_input("k", TensorType(DType.f32, (2, 4, 4))), g.add_input(
                          "v", TensorType(DType.f32, (2, 4, 6)))])
    assert [str(o.type) for o in node.outputs] == ["f32[2,4,12]", "f32[2,1,4,6]"]


# ---------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)
# ---------------------------------------------------------------------------------------------

def test_flex_attention_matches_attention_and_reference():
    ins = [("Q", _rand(2, 4, 5, 8)), ("K", _rand(2, 2, 6, 8)), ("V", _rand(2, 2, 6, 3))]
    m = _model("FlexAttention", ins, ["Y"], {"scale": 0.2}, 26, domain="ai.onnx.preview",
               extra_opsets=[("ai.onnx.preview", 1)])
    _vs_ref(m, _feeds(ins))
    (y,) = _kiln(m, _feeds(ins))
    ref = A.Attention(scale=0.2).compute(*[a for _, a in ins])[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5)


def test_flex_attention_refusals():
    with pytest.raises(OpError, match="subgraph"):
        A.FlexAttention(score_mod=object())
    g = Graph()
    q = g.add_input("q", TensorType(DType.f32, (2, 4, 24)))
    with pytest.raises(OpError, match="must be 4D"):
        g.add_node(A.FlexAttention(), [q, q, q])
