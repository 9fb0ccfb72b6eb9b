"""Simplification passes: each checked for structure (expected IR), numbers (the interpreter agrees
before and after) and refusals (where a rewrite must not fire, and why)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.interpreter import interpret
from compiler.ir.verify import verify
from compiler.passes.rewrite import explain
from compiler.passes.simplify.canonicalize import RULES, Canonicalize
from compiler.passes.simplify.cse import EliminateCommonSubexpressions
from compiler.passes.simplify.dce import EliminateDead
from compiler.passes.simplify.fold_batchnorm import FoldBatchNorm, FoldScaleBias
from compiler.passes.simplify.fold_constants import FoldConstants
from compiler.passes.simplify.infer_shapes import InferShapes, shape_determining_inputs

from .util import ir, run_pass, same_ir


def refusals(graph, rule_name):
    return [r.reason for r in explain(graph, RULES) if r.rule == rule_name]


# -- infer-shapes ---------------------------------------------------------------------------------

def test_infer_shapes_specializes_symbolic_dims():
    g = ir("""
    graph @t(%x: f32[N,3]) -> (y: f32[N,3]) {
      %0 = Relu(%x) : f32[N,3]
      return y=%0
    }""")
    assert run_pass(InferShapes({"x": (1, 3)}), g)  # random inputs give N=1
    same_ir(g, """
    graph @t(%x: f32[1,3]) -> (y: f32[1,3]) {
      %0 = Relu(%x) : f32[1,3]
      return y=%0
    }""")
    assert not run_pass(InferShapes(), g)


def test_infer_shapes_refuses_a_fixed_dimension():
    g = ir("""
    graph @t(%x: f32[N,3]) -> (y: f32[N,3]) {
      %0 = Relu(%x) : f32[N,3]
      return y=%0
    }""")
    with pytest.raises(Exception, match="dimension 1 is fixed to 3"):
        InferShapes({"x": (4, 5)}).run(g)


AXES_AS_INPUT = """
graph @t(%x: f32[2,3,4], %axes: i64[1], %idx: i64[2]) -> (y: f32[?], z: f32[2,2,4]) {
  %0 = ReduceSum(%x, %axes) {keepdims=0} : f32[?,?]
  %1 = Gather(%x, %idx) {axis=1} : f32[2,2,4]
  return y=%0, z=%1
}"""


def test_only_inputs_that_decide_shapes_are_bound():
    """A Reduce's axes fed as an input decide its result's shape; Gather indices never change a type."""
    g = ir(AXES_AS_INPUT.replace("y: f32[?]", "y: f32[?,?]"))
    feeds = {"axes": np.array([1]), "idx": np.array([0, 2]), "x": np.zeros((2, 3, 4), np.float32)}
    assert shape_determining_inputs(g, feeds) == ["axes"]
    assert InferShapes(input_values={"axes": feeds["axes"]}).run(g)
    same_ir(g, """
    graph @t(%x: f32[2,3,4], %idx: i64[2]) -> (y: f32[2,4], z: f32[2,2,4]) {
      %axes = const i64[1] dense<[1]>
      %0 = ReduceSum(%x, %axes) {keepdims=0} : f32[2,4]
      %1 = Gather(%x, %idx) {axis=1} : f32[2,2,4]
      return y=%0, z=%1
    }""")


def test_inputs_needed_together_are_bound_together_and_data_beside_them_is_not():
    """A Range's three bounds decide its length only together; the data an Expand reads beside its
    shape input is never needed."""
    g = ir("""
    graph @t(%a: f32[], %b: f32[], %d: f32[], %x: f32[1,3], %s: i64[2]) -> (r: f32[?], e: f32[?,?]) {
      %0 = Range(%a, %b, %d) : f32[?]
      %1 = Expand(%x, %s) : f32[?,?]
      return r=%0, e=%1
    }""")
    feeds = {"a": np.array(0, np.float32), "b": np.array(5, np.float32), "d": np.array(2, np.float32),
             "x": np.ones((1, 3), np.float32), "s": np.array([2, 3])}
    assert shape_determining_inputs(g, feeds) == ["a", "b", "d", "s"]


def test_inputs_that_decide_shapes_through_computed_values_are_bound():
    """A window's size cast and scaled before its Range (as ONNX's HannWindow body does) decides the
    Range's length through the values computed from it; the Cast's other input, data, does not."""
    g = ir("""
    graph @t(%n: i64[], %x: f32[3]) -> (r: f32[?], y: f32[3]) {
      %two = const f32[] dense<2.0>
      %zero = const f32[] dense<0.0>
      %one = const f32[] dense<1.0>
      %0 = Cast(%n) {to=f32} : f32[]
      %1 = Mul(%0, %two) : f32[]
      %2 = Range(%zero, %1, %one) : f32[?]
      %3 = Cast(%x) {to=f32} : f32[3]
      return r=%2, y=%3
    }""")
    feeds = {"n": np.array(4), "x": np.ones(3, np.float32)}
    assert shape_determining_inputs(g, feeds) == ["n"]
    assert InferShapes(input_values={"n": feeds["n"]}).run(g)
    assert g.outputs[0].type.shape == (8,)


@pytest.mark.parametrize("values, message", [
    ({"nope": np.array([1])}, "unknown input"),
    ({"axes": np.array([1], np.int32)}, "the value is int32"),
    ({"axes": np.array([1, 2])}, "the value has shape"),
])
def test_binding_an_input_refuses_a_wrong_value(values, message):
    g = ir(AXES_AS_INPUT.replace("y: f32[?]", "y: f32[?,?]"))
    with pytest.raises(Exception, match=message):
        InferShapes(input_values=values).run(g)


# -- fold-constants -------------------------------------------------------------------------------

SHAPE_CHAIN = """
graph @t(%x: f32[2,3,4]) -> (y: f32[2,12]) {
  %idx = const i64[] dense<0>
  %m1 = const i64[1] dense<[-1]>
  %0 = Shape(%x) : i64[3]
  %1 = Gather(%0, %idx) {axis=0} : i64[]
  %2 = Unsqueeze(%1, %idx) : i64[1]
  %3 = Concat(%2, %m1) {axis=0} : i64[2]
  %4 = Reshape(%x, %3) : f32[2,12]
  return y=%4
}"""


def test_fold_constants_collapses_shape_arithmetic():
    g = ir(SHAPE_CHAIN)
    assert run_pass(FoldConstants(), g)
    assert g.op_counts() == {"Reshape": 1}
    (shape,) = [c for c in g.constants if c.uses]
    assert shape.const.tolist() == [2, -1]


def test_fold_constants_respects_the_size_limit():
    g = ir("""
    graph @t(%x: f32[1000,1000]) -> (y: f32[1000,1000]) {
      %s = const i64[2] dense<[1000, 1000]>
      %0 = ConstantOfShape(%s) : f32[1000,1000]
      %1 = Add(%x, %0) : f32[1000,1000]
      return y=%1
    }""")
    p = FoldConstants(limit_bytes=1 << 20)
    assert p.foldable(g.nodes[0]).startswith("the result (4000000 bytes) exceeds the folding limit")
    assert not p.run(g)
    assert run_pass(FoldConstants(limit_bytes=1 << 23), g)
    assert g.op_counts() == {"Add": 1}


def test_fold_constants_refuses_non_constant_inputs():
    g = ir("""
    graph @t(%x: f32[3]) -> (y: f32[3]) {
      %0 = Relu(%x) : f32[3]
      return y=%0
    }""")
    assert FoldConstants().foldable(g.nodes[0]) == "an input is not constant"
    assert not run_pass(FoldConstants(), g)


# -- eliminate-dead / eliminate-common-subexpressions ----------------------------------------------

def test_dce_and_cse():
    g = ir("""
    graph @t(%x: f32[3]) -> (y: f32[3]) {
      %a = const f32[3] dense<[1.0, 2.0, 3.0]>
      %b = const f32[3] dense<[1.0, 2.0, 3.0]>
      %0 = Add(%x, %a) : f32[3]
      %1 = Add(%x, %b) : f32[3]
      %2 = Mul(%0, %1) : f32[3]
      %3 = Neg(%2) : f32[3]
      return y=%2
    }""")
    assert run_pass(EliminateDead(), g)
    assert g.op_counts() == {"Add": 2, "Mul": 1}
    assert run_pass(EliminateCommonSubexpressions(), g)
    same_ir(g, """
    graph @t(%x: f32[3]) -> (y: f32[3]) {
      %a = const f32[3] dense<[1.0, 2.0, 3.0]>
      %0 = Add(%x, %a) : f32[3]
      %1 = Mul(%0, %0) : f32[3]
      return y=%1
    }""")
    assert not run_pass(EliminateCommonSubexpressions(), g)


def test_cse_refuses_different_attributes():
    g = ir("""
    graph @t(%x: f32[3]) -> (y: f32[3], z: f32[3]) {
      %0 = LeakyRelu(%x) {alpha=0.1} : f32[3]
      %1 = LeakyRelu(%x) {alpha=0.2} : f32[3]
      return y=%0, z=%1
    }""")
    assert not run_pass(EliminateCommonSubexpressions(), g)


# -- canonicalize ---------------------------------------------------------------------------------

def test_canonicalize_identity_dropout_sum_reshapes_transposes():
    g = ir("""
    graph @t(%x: f32[2,3,4], %z: f32[2,3,4]) -> (y: f32[4,6], w: f32[2,3,4]) {
      %s1 = const i64[2] dense<[6, 4]>
      %0 = Identity(%x) : f32[2,3,4]
      %1 = Dropout(%0) : f32[2,3,4]
      %2 = Sum(%1, %z, %x) : f32[2,3,4]
      %3 = Reshape(%2, %s1) : f32[6,4]
      %4 = Unsqueeze(%3, %ax) : f32[1,6,4]
      %5 = Flatten(%4) {axis=2} : f32[6,4]
      %6 = Transpose(%5) {perm=[1, 0]} : f32[4,6]
      %7 = Transpose(%x) {perm=[1, 0, 2]} : f32[3,2,4]
      %8 = Transpose(%7) {perm=[1, 0, 2]} : f32[2,3,4]
      return y=%6, w=%8
    }""".replace("%s1 = ", "%ax = const i64[1] dense<[0]>\n      %s1 = "))
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"Add": 2, "Reshape": 1, "Transpose": 1}
    assert g.outputs[1] is g.inputs[0]  # the two transposes cancel
    assert not run_pass(Canonicalize(), g)


def test_a_cast_to_its_own_type_disappears():
    """``x.float()`` of a float32 tensor as PyTorch exports it: the Cast is x; a Cast that changes
    the type stays, and says why."""
    g = ir("""
    graph @t(%x: f32[2,3]) -> (y: f32[2,3], z: f16[2,3]) {
      %0 = Cast(%x) {to=f32} : f32[2,3]
      %1 = Relu(%0) : f32[2,3]
      %2 = Cast(%1) {to=f16} : f16[2,3]
      return y=%1, z=%2
    }""")
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"Relu": 1, "Cast": 1} and g.nodes[0].inputs[0] is g.inputs[0]
    assert refusals(g, "remove-identity") == ["the Cast changes the element type"]


def test_a_slice_that_keeps_every_element_disappears():
    """``x[:, :n]`` with ``n`` a size known only at run time (the PyTorch frontend's end past any
    size), once the sizes are static: the Slice is x. A Slice that drops elements, a reversing one
    and one of a symbolic shape stay, and say why."""
    g = ir("""
    graph @t(%x: f32[2,3], %s: f32[N,3], %v: f32[0,1]) -> (y: f32[2,3], z: f32[2,2], r: f32[2,3], w: f32[N,3],
                                                        e: f32[0,1]) {
      %b = const i64[1] dense<[0]>
      %e = const i64[1] dense<[4611686018427387904]>
      %e2 = const i64[1] dense<[2]>
      %a = const i64[1] dense<[1]>
      %one = const i64[1] dense<[1]>
      %rb = const i64[1] dense<[-1]>
      %re = const i64[1] dense<[-4611686018427387904]>
      %m = const i64[1] dense<[-1]>
      %0 = Slice(%x, %b, %e, %a, %one) : f32[2,3]
      %1 = Relu(%0) : f32[2,3]
      %2 = Slice(%x, %b, %e2, %a) : f32[2,2]
      %3 = Slice(%x, %rb, %re, %a, %m) : f32[2,3]
      %4 = Slice(%s, %b, %e, %a) : f32[N,3]
      %5 = Slice(%v, %b, %e, %a) : f32[0,1]
      return y=%1, z=%2, r=%3, w=%4, e=%5
    }""")
    x, s = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32), np.ones((5, 3), np.float32)
    feeds = {"x": x, "s": s, "v": np.zeros((0, 1), np.float32)}  # (a size-0 and a size-1 axis: kept whole)
    before = interpret(g, feeds)
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"Relu": 1, "Slice": 3} and g.nodes[0].inputs[0] is g.inputs[0]
    assert g.outputs[4] is g.inputs[2]
    after = interpret(g, feeds)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert sorted(refusals(g, "remove-identity")) == sorted([
        "the Slice drops elements (or its shapes are not static)", "the Slice's steps are not all 1",
        "the Slice drops elements (or its shapes are not static)"])


def test_inference_dropout_with_its_mask_used():
    g = ir("""
    graph @t(%x: f32[2,3]) -> (y: f32[2,3], m: bool[2,3]) {
      %0, %1 = Dropout(%x) : f32[2,3], bool[2,3]
      return y=%0, m=%1
    }""")
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"ConstantOfShape": 1} and g.outputs[0] is g.inputs[0]


@pytest.mark.parametrize("op_, mode, shape, out", [("DepthToSpace", "DCR", "2,8,3,2", "2,2,6,4"),
                                                   ("DepthToSpace", "CRD", "2,8,3,2", "2,2,6,4"),
                                                   ("SpaceToDepth", "DCR", "1,3,4,6", "1,12,2,3"),
                                                   ("SpaceToDepth", "CRD", "1,3,4,6", "1,12,2,3")])
def test_depth_to_space_and_back_become_transposes(op_, mode, shape, out):
    g = ir(f"""
    graph @t(%x: f32[{shape}]) -> (y: f32[{out}]) {{
      %0 = {op_}(%x) {{blocksize=2, mode="{mode}"}} : f32[{out}]
      return y=%0
    }}""")
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"Reshape": 2, "Transpose": 1}


def test_batchnorm_with_statistics_fed_as_inputs_becomes_elementwise():
    g = ir("""
    graph @t(%x: f32[2,3,4], %s: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]) -> (y: f32[2,3,4]) {
      %0 = BatchNormalization(%x, %s, %b, %m, %v) {epsilon=0.01} : f32[2,3,4]
      return y=%0
    }""")
    assert run_pass(Canonicalize(), g)
    assert "BatchNormalization" not in g.op_counts()
    g = ir("""
    graph @t(%x: f32[2,3]) -> (y: f32[2,3]) {
      %s = const f32[3] dense<[1.0, 2.0, 3.0]>
      %0 = BatchNormalization(%x, %s, %s, %s, %s) : f32[2,3]
      return y=%0
    }""")
    assert refusals(g, "batchnorm-to-elementwise") == [
        "constant statistics: fold-batchnorm and fold-scale-bias take them"]


def test_cast_like_becomes_cast():
    g = ir("""
    graph @t(%x: f32[2,3], %like: f16[4]) -> (y: f16[2,3]) {
      %0 = CastLike(%x, %like) : f16[2,3]
      return y=%0
    }""")
    assert run_pass(Canonicalize(), g)
    same_ir(g, """
    graph @t(%x: f32[2,3], %like: f16[4]) -> (y: f16[2,3]) {
      %0 = Cast(%x) {to=f16} : f16[2,3]
      return y=%0
    }""")


def test_softmax_cross_entropy_becomes_log_softmax_and_nll():
    g = ir("""
    graph @t(%x: f32[3,5], %l: i64[3], %h: f16[3,5]) -> (y: f32[], p: f32[3,5], z: f16[]) {
      %0, %1 = SoftmaxCrossEntropyLoss(%x, %l) {ignore_index=2} : f32[], f32[3,5]
      %2, %3 = SoftmaxCrossEntropyLoss(%h, %l) : f16[], f16[3,5]
      return y=%0, p=%1, z=%2
    }""")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((3, 5)).astype(np.float32), "l": np.array([4, 2, 0]),
             "h": rng.standard_normal((3, 5)).astype(np.float16)}
    before = interpret(g, feeds)
    assert Canonicalize().run(g)
    verify(g)
    after = interpret(g, feeds)
    for name in before:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-6, atol=1e-6)
    assert g.op_counts() == {"LogSoftmax": 1, "NegativeLogLikelihoodLoss": 1, "SoftmaxCrossEntropyLoss": 1}
    assert g.outputs[1].producer.op.name == "LogSoftmax"
    assert refusals(g, "sce-to-logsoftmax-nll") == ["f16 scores (the op computes them in f32 and rounds once)"]


def test_canonicalize_refusals_say_why():
    g = ir("""
    graph @t(%x: f32[N,4], %w: f32[4,5]) -> (y: f32[N,5], t: f32[4,N]) {
      %b = const f32[5] dense<[1.0, 2.0, 3.0, 4.0, 5.0]>
      %0 = MatMul(%x, %w) : f32[N,5]
      %1 = Add(%0, %b) : f32[N,5]
      %2 = Transpose(%x) {perm=[1, 0]} : f32[4,N]
      return y=%1, t=%2
    }""")
    assert refusals(g, "matmul-add-to-gemm") == ["the MatMul's right operand is not a constant matrix"]
    assert refusals(g, "compose-transposes") == [
        "the input is not a Transpose and the permutation is not the identity"]
    assert not Canonicalize(rules=[r for r in RULES if r.name == "matmul-add-to-gemm"]).run(g)


def test_matmul_add_becomes_gemm_through_a_reshape_for_3d_activations():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    g = ir("""
    graph @t(%x: f32[2,3,8]) -> (y: f32[2,3,5]) {
      %w = const f32[8,5]
      %b = const f32[5] dense<[1.0, 2.0, 3.0, 4.0, 5.0]>
      %0 = MatMul(%x, %w) : f32[2,3,5]
      %1 = Add(%b, %0) : f32[2,3,5]
      return y=%1
    }""", weights={"w": w})
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"Gemm": 1, "Reshape": 2}


@pytest.mark.parametrize("x, k", [((2, 0, 8), 8), ((2, 3, 0), 0)])
def test_matmul_add_becomes_gemm_on_empty_activations(x, k):
    """A 0 in a Reshape's target is a size-0 axis (allowzero), not "copy the input's dimension"
    (found by the fuzzer: [2,0,3] became [2,3,3]); and the rows are counted, not -1 (ambiguous
    with no elements)."""
    y = (*x[:-1], 5)
    dims = lambda s: ",".join(map(str, s))  # noqa: E731
    g = ir(f"""
    graph @t(%x: f32[{dims(x)}]) -> (y: f32[{dims(y)}]) {{
      %w = const f32[{k},5]
      %b = const f32[5] dense<[1.0, 2.0, 3.0, 4.0, 5.0]>
      %0 = MatMul(%x, %w) : f32[{dims(y)}]
      %1 = Add(%0, %b) : f32[{dims(y)}]
      return y=%1
    }}""", weights={"w": np.ones((k, 5), np.float32)})
    assert run_pass(Canonicalize(), g)
    rows = x[0] * x[1]
    assert [(n.op.name, tuple(n.output.shape)) for n in g.nodes] == [
        ("Reshape", (rows, k)), ("Gemm", (rows, 5)), ("Reshape", y)]


def test_matmul_add_refused_when_the_matmul_has_other_uses():
    g = ir("""
    graph @t(%x: f32[2,4]) -> (y: f32[2,2], z: f32[2,2]) {
      %w = const f32[4,2] dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]>
      %b = const f32[2] dense<[1.0, 2.0]>
      %0 = MatMul(%x, %w) : f32[2,2]
      %1 = Add(%0, %b) : f32[2,2]
      return y=%1, z=%0
    }""")
    assert refusals(g, "matmul-add-to-gemm") == ["the MatMul result has other uses"]


# -- fold-batchnorm / fold-scale-bias ---------------------------------------------------------------

def conv_bn_weights(c_in=3, c_out=4, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32),
            "scale": rng.uniform(0.5, 1.5, c_out).astype(np.float32),
            "bias": rng.standard_normal(c_out).astype(np.float32),
            "mean": rng.standard_normal(c_out).astype(np.float32),
            "var": rng.uniform(0.5, 2, c_out).astype(np.float32)}


CONV_BN = """
graph @t(%x: f32[1,3,8,8]) -> (y: f32[1,4,8,8]) {
  %w = const f32[4,3,3,3]
  %scale = const f32[4]
  %bias = const f32[4]
  %mean = const f32[4]
  %var = const f32[4]
  %0 = Conv(%x, %w) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]} : f32[1,4,8,8]
  %1 = BatchNormalization(%0, %scale, %bias, %mean, %var) : f32[1,4,8,8]
  return y=%1
}"""


def test_fold_batchnorm_into_conv():
    g = ir(CONV_BN, conv_bn_weights())
    assert run_pass(FoldBatchNorm(), g, rtol=1e-5)
    assert g.op_counts() == {"Conv": 1}
    assert len(g.nodes[0].inputs) == 3  # the folded bias
    assert not run_pass(FoldBatchNorm(), g)


def test_batchnorm_without_a_foldable_producer_becomes_mul_add():
    text = CONV_BN.replace("%0 = Conv(%x, %w) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]} : f32[1,4,8,8]",
                           "%0 = Relu(%x4) : f32[1,4,8,8]").replace("%x: f32[1,3,8,8]", "%x4: f32[1,4,8,8]")
    g = ir(text, conv_bn_weights())
    assert run_pass(FoldBatchNorm(), g)
    assert g.op_counts() == {"Add": 1, "Mul": 1, "Relu": 1}


def test_fold_batchnorm_refuses_a_shared_conv_result():
    text = CONV_BN.replace("-> (y: f32[1,4,8,8])", "-> (y: f32[1,4,8,8], z: f32[1,4,8,8])").replace(
        "return y=%1", "return y=%1, z=%0")
    g = ir(text, conv_bn_weights())
    assert run_pass(FoldBatchNorm(), g)
    assert g.op_counts() == {"Add": 1, "Conv": 1, "Mul": 1}  # the Conv is kept for z; BN became Mul+Add


def test_fold_scale_bias_into_conv():
    rng = np.random.default_rng(1)
    g = ir("""
    graph @t(%x: f32[1,3,8,8]) -> (y: f32[1,4,8,8]) {
      %w = const f32[4,3,3,3]
      %s = const f32[4,1,1]
      %b = const f32[1,4,1,1]
      %0 = Conv(%x, %w) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]} : f32[1,4,8,8]
      %1 = Mul(%0, %s) : f32[1,4,8,8]
      %2 = Add(%b, %1) : f32[1,4,8,8]
      return y=%2
    }""", {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
           "s": rng.standard_normal((4, 1, 1)).astype(np.float32),
           "b": rng.standard_normal((1, 4, 1, 1)).astype(np.float32)})
    assert run_pass(FoldScaleBias(), g)
    assert g.op_counts() == {"Conv": 1}


def test_fold_scale_bias_refuses_a_non_channel_constant():
    rng = np.random.default_rng(2)
    g = ir("""
    graph @t(%x: f32[1,3,8,8]) -> (y: f32[1,4,8,8]) {
      %w = const f32[4,3,3,3]
      %s = const f32[8]
      %0 = Conv(%x, %w) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]} : f32[1,4,8,8]
      %1 = Mul(%0, %s) : f32[1,4,8,8]
      return y=%1
    }""", {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
           "s": rng.standard_normal(8).astype(np.float32)})
    assert not run_pass(FoldScaleBias(), g)


@pytest.mark.parametrize("cshape, folds", [((7, 1), False), ((1, 7), True), ((7,), True), ((1,), True)])
def test_fold_scale_bias_into_gemm_only_with_a_per_column_c(cshape, folds):
    """Regression (issue 21, found by the fuzzer): a Gemm's C of shape [7, 1] has as many elements
    as output columns but is per row; the pass read it as per column and failed."""
    rng = np.random.default_rng(3)
    g = ir(f"""
    graph @t(%a: f32[1,7]) -> (y: f32[7,7]) {{
      %w = const f32[7,1]
      %c = const f32[{','.join(str(d) for d in cshape)}]
      %t = const f32[7]
      %0 = Gemm(%a, %w, %c) {{transA=1, transB=1, beta=0.25}} : f32[7,7]
      %1 = Add(%0, %t) : f32[7,7]
      return y=%1
    }}""", {"w": rng.standard_normal((7, 1)).astype(np.float32),
            "c": rng.standard_normal(cshape).astype(np.float32),
            "t": rng.standard_normal(7).astype(np.float32)})
    assert run_pass(FoldScaleBias(), g) == folds
    assert ("Add" in g.op_counts()) != folds


@pytest.mark.parametrize("eq, a, b, out, counts", [
    ("bhqd,bhkd->bhqk", "2,3,4,5", "2,3,6,5", "2,3,4,6", {"Reshape": 3, "Transpose": 1, "MatMul": 1}),
    ("bij,bjk->bik", "2,3,4", "2,4,5", "2,3,5", {"MatMul": 1}),
    ("ij,jk->ki", "3,4", "4,5", "5,3", {"MatMul": 1, "Transpose": 1}),
    ("i,j->ij", "3", "4", "3,4", {"MatMul": 1, "Reshape": 2}),
    ("abc,cd->dba", "2,3,4", "4,5", "5,3,2", {"MatMul": 1, "Reshape": 2, "Transpose": 1}),
    ("ij,jk->i", "3,4", "4,5", "3", {"MatMul": 1, "ReduceSum": 1, "Reshape": 2}),  # k summed within B first
])
def test_einsum_becomes_a_matmul(eq, a, b, out, counts):
    g = ir(f"""
    graph @t(%a: f32[{a}], %b: f32[{b}]) -> (y: f32[{out}]) {{
      %0 = Einsum(%a, %b) {{equation="{eq}"}} : f32[{out}]
      return y=%0
    }}""")
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == counts


def test_einsum_to_matmul_structure():
    g = ir("""
    graph @t(%q: f32[2,3,4,5], %k: f32[2,3,6,5]) -> (y: f32[2,3,4,6]) {
      %0 = Einsum(%q, %k) {equation="bhqd,bhkd->bhqk"} : f32[2,3,4,6]
      return y=%0
    }""")
    assert run_pass(Canonicalize(), g)
    same_ir(g, """
    graph @t(%q: f32[2,3,4,5], %k: f32[2,3,6,5]) -> (y: f32[2,3,4,6]) {
      %Reshape.shape = const i64[3] dense<[6, 4, 5]>
      %Reshape.shape_1 = const i64[3] dense<[6, 5, 6]>
      %Reshape.shape_2 = const i64[4] dense<[2, 3, 4, 6]>
      %0 = Reshape(%q, %Reshape.shape) : f32[6,4,5]
      %1 = Transpose(%k) {perm=[0, 1, 3, 2]} : f32[2,3,5,6]
      %2 = Reshape(%1, %Reshape.shape_1) : f32[6,5,6]
      %3 = MatMul(%0, %2) : f32[6,4,6]
      %4 = Reshape(%3, %Reshape.shape_2) : f32[2,3,4,6]
      return y=%4
    }""")


@pytest.mark.parametrize("eq, a, b, out, why", [
    ("ii,i->i", "3,3", "3", "3", "repeats within an operand"),
    ("ij,jk->ik", "3,1", "4,5", "3,5", "broadcast"),
])
def test_einsum_refusals(eq, a, b, out, why):
    g = ir(f"""
    graph @t(%a: f32[{a}], %b: f32[{b}]) -> (y: f32[{out}]) {{
      %0 = Einsum(%a, %b) {{equation="{eq}"}} : f32[{out}]
      return y=%0
    }}""")
    assert any(why in r for r in refusals(g, "einsum-to-matmul"))


@pytest.mark.parametrize("eq, a, out, dt, counts", [
    ("ij->i", "3,4", "3", "f64", {"ReduceSum": 1}),
    ("ij->ji", "3,4", "4,3", "bf16", {"Transpose": 1}),
    ("ijk->ki", "2,3,4", "4,2", "i32", {"ReduceSum": 1, "Transpose": 1}),
    ("->", "", "", "f32", {}),
])
def test_einsum_of_one_operand_is_a_sum_and_a_transpose(eq, a, out, dt, counts):
    g = ir(f"""
    graph @t(%a: {dt}[{a}]) -> (y: {dt}[{out}]) {{
      %0 = Einsum(%a) {{equation="{eq}"}} : {dt}[{out}]
      return y=%0
    }}""")
    assert run_pass(Canonicalize(), g)
    assert {k: v for k, v in g.op_counts().items() if k != "Reshape"} == counts


@pytest.mark.parametrize("eq, a, out", [("ii->i", "3,3", "3"), ("...ii->...i", "2,4,4", "2,4"),
                                         ("iji->j", "3,2,3", "2"), ("ii", "3,3", ""), ("bij->...", "2,3,4", "")])
def test_einsum_of_one_operand_takes_diagonals_and_ellipses(eq, a, out):
    g = ir(f"""
    graph @t(%a: f32[{a}]) -> (y: f32[{out}]) {{
      %0 = Einsum(%a) {{equation="{eq}"}} : f32[{out}]
      return y=%0
    }}""")
    assert run_pass(Canonicalize(), g)
    assert "Einsum" not in g.op_counts()


def test_einsum_of_one_operand_refuses_a_label_three_times():
    g = ir("""
    graph @t(%a: f32[3,3,3]) -> (y: f32[3]) {
      %0 = Einsum(%a) {equation="iii->i"} : f32[3]
      return y=%0
    }""")
    assert any("a label appears three times or more" in r for r in refusals(g, "einsum-of-one"))


def test_an_attention_einsum_runs_natively_and_matches_onnxruntime():
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import compiler

    node = helper.make_node("Einsum", ["q", "k"], ["y"], equation="bhqd,bhkd->bhqk")
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 16, 8]) for n in ("q", "k")]
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((1, 4, 16, 8)).astype(np.float32) for n in ("q", "k")}
    exe = compiler.compile(model, fallback=False)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(exe.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_a_narrow_float_matmul_becomes_a_float32_one_between_casts(dt):
    g = ir(f"""
    graph @t(%a: {dt}[2,3,4], %b: {dt}[4,5]) -> (y: {dt}[2,3,5]) {{
      %0 = MatMul(%a, %b) : {dt}[2,3,5]
      return y=%0
    }}""")
    assert run_pass(Canonicalize(), g, rtol=1e-2)
    same_ir(g, f"""
    graph @t(%a: {dt}[2,3,4], %b: {dt}[4,5]) -> (y: {dt}[2,3,5]) {{
      %0 = Cast(%a) : f32[2,3,4]
      %1 = Cast(%b) : f32[4,5]
      %2 = MatMul(%0, %1) : f32[2,3,5]
      %3 = Cast(%2) {{to={dt}}} : {dt}[2,3,5]
      return y=%3
    }}""")
    f32 = ir("""
    graph @t(%a: f32[2,3], %b: f32[3,5]) -> (y: f32[2,5]) {
      %0 = MatMul(%a, %b) : f32[2,5]
      return y=%0
    }""")
    assert "the operands are not float16 or bfloat16" in refusals(f32, "narrow-matmul-to-f32")
