"""frontends/onnx/functions.py: ops imported as ONNX's own function body (Attention, ...) run natively
and agree with ONNX's reference evaluator; those that must stay ops stay (RMSNormalization and
RotaryEmbedding, which have kernels of their own)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import compiler
from frontends.onnx import import_model
from frontends.onnx.functions import expand_functions

RNG = np.random.default_rng(3)


def _model(node, inputs, opset: int, elem=TensorProto.FLOAT):
    vi = [helper.make_tensor_value_info(n, elem, s) for n, s in inputs]
    outs = [helper.make_tensor_value_info(o, elem, None) for o in node.output]
    m = helper.make_model(helper.make_graph([node], "f", vi, outs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


CASES = [
    ("attention_causal", helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1),
     [("q", (2, 3, 4, 8)), ("k", (2, 3, 6, 8)), ("v", (2, 3, 6, 8))], 25),
    ("attention_gqa_3d", helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2),
     [("q", (1, 5, 32)), ("k", (1, 7, 16)), ("v", (1, 7, 16))], 25),
]


@pytest.mark.parametrize("name, node, inputs, opset", CASES, ids=[c[0] for c in CASES])
def test_expanded_ops_run_natively_and_agree_with_onnx(name, node, inputs, opset):
    m = _model(node, inputs, opset)
    assert node.op_type not in {n.op_type for n in expand_functions(m).graph.node}
    assert node.op_type not in import_model(m).op_counts()
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in inputs}
    want = ReferenceEvaluator(m).run(None, feeds)
    exe = compiler.compile(m)
    assert exe.fallback == []
    got = exe.run(feeds)
    for o, w in zip(m.graph.output, want):
        np.testing.assert_allclose(got[o.name], w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_rotary_embedding_is_imported_as_its_op_and_runs_natively(elem):
    """RotaryEmbedding stays Kiln's op (one kernel: f16 computed in f32 and rounded once), compiled with
    no fallback, within ONNX's reference evaluator (3-D input with num_heads, per-token caches)."""
    m = _model(helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], num_heads=2),
               [("x", (1, 4, 16)), ("cos", (1, 4, 4)), ("sin", (1, 4, 4))], 23, elem)
    assert expand_functions(m) is m
    assert import_model(m).op_counts() == {"RotaryEmbedding": 1}
    dt = np.float32 if elem == TensorProto.FLOAT else np.float16
    feeds = {n: RNG.standard_normal(s).astype(dt) for n, s in (("x", (1, 4, 16)), ("cos", (1, 4, 4)),
                                                                ("sin", (1, 4, 4)))}
    exe = compiler.compile(m)
    assert exe.fallback == []
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    tol = 1e-5 if elem == TensorProto.FLOAT else 5e-3
    np.testing.assert_allclose(exe.run(feeds)["y"].astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_rmsnormalization_is_imported_as_its_op_and_runs_natively(elem):
    """RMSNormalization stays Kiln's op (one row kernel; f16 computed in f32 and rounded once, not a
    body that rounds each step), compiled with no fallback, within ONNX's reference evaluator."""
    m = _model(helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-5),
               [("x", (2, 3, 16)), ("s", (16,))], 23, elem)
    assert expand_functions(m) is m
    assert import_model(m).op_counts() == {"RMSNormalization": 1}
    dt = np.float32 if elem == TensorProto.FLOAT else np.float16
    feeds = {"x": RNG.standard_normal((2, 3, 16)).astype(dt), "s": RNG.standard_normal(16).astype(dt)}
    exe = compiler.compile(m)
    assert exe.fallback == []
    tol = 1e-5 if dt is np.float32 else 2e-3
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    np.testing.assert_allclose(exe.run(feeds)["y"].astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)


def test_narrow_attention_is_a_float32_body_between_casts():
    """f16 Attention (``WIDENED``): Casts to f32, the f32 body, one Cast of the result back -- the single
    rounding Kiln's op makes -- all native, within an f16 ulp of ONNX's reference."""
    m = _model(helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1),
               [("q", (1, 2, 3, 8)), ("k", (1, 2, 5, 8)), ("v", (1, 2, 5, 8))], 25, TensorProto.FLOAT16)
    ops = [n.op_type for n in expand_functions(m).graph.node]
    assert "Attention" not in ops and ops[:3] == ["Cast"] * 3 and ops[-1] == "Cast"
    feeds = {n: RNG.standard_normal(s).astype(np.float16) for n, s in (("q", (1, 2, 3, 8)), ("k", (1, 2, 5, 8)),
                                                                        ("v", (1, 2, 5, 8)))}
    exe = compiler.compile(m)
    assert exe.fallback == []
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    np.testing.assert_allclose(exe.run(feeds)["y"].astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_an_op_without_a_function_at_the_models_opset_stays():
    """SpaceToDepth has a function body only from opset 28."""
    m = _model(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2), [("x", (1, 2, 4, 4))], 13)
    assert expand_functions(m) is m
    assert import_model(m).op_counts() == {"SpaceToDepth": 1}


def test_what_the_schema_forbids_is_refused_before_the_body_is_taken():
    """An expanded op is checked by ONNX's own inference first: a gated LinearAttention given a beta
    input (which its update rule forbids, and its body would ignore) is a ModelError naming the node."""
    from compiler.errors import ModelError

    node = helper.make_node("LinearAttention", ["q", "k", "v", "", "decay", "beta"], ["y", "state"], name="la",
                            q_num_heads=2, kv_num_heads=2, update_rule="gated")
    shapes = [(n, (2, 4, 32)) for n in ("q", "k", "v", "decay", "beta")]
    with pytest.raises(ModelError, match="LinearAttention node 'la' .*gated.*forbids beta"):
        import_model(_model(node, shapes, 27))
    node.input.pop()  # without beta it is a valid model, imported as its body
    graph = import_model(_model(node, shapes[:4], 27))
    assert all(n.op.name != "LinearAttention" for n in graph.nodes)


@pytest.mark.parametrize("attr,value", [("is_causal", 2), ("qk_matmul_output_mode", 7), ("qk_matmul_output_mode", -1),
                                        ("softcap", -1.0)])
def test_attention_attribute_values_onnx_does_not_define_are_refused(attr, value):
    """Attention's body would compute something for any is_causal, qk_matmul_output_mode or softcap (and
    ONNX's inference does not look): a value the op does not define is refused, as Kiln's own op
    refuses it (a negative softcap: the body applied its magnitude, ONNX Runtime none)."""
    from compiler.errors import ModelError

    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att", **{attr: value})
    shapes = [("q", (1, 2, 4, 8)), ("k", (1, 2, 4, 8)), ("v", (1, 2, 4, 8))]
    with pytest.raises(ModelError, match=f"Attention node 'att' .*{attr}.* got {value}"):  # (-1.0 for softcap)
        import_model(_model(node, shapes, 24))
    ok = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att", **{attr: 1.0 if attr == "softcap" else 1})
    assert import_model(_model(ok, shapes, 24)).nodes
