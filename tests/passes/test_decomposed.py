"""Canonicalization of decomposed patterns (what exporters write for older opsets): LayerNorm from
ReduceMean/Sub/Pow/Sqrt/Div (and its affine step), RMSNorm (and its weight), GELU from Erf, rotary
embeddings from rotate_half. Structure, numbers (the reference interpreter before and after,
``run_pass``) and refusals."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.passes.simplify.canonicalize import RULES, Canonicalize

from .test_simplify import refusals
from .util import ir, run_pass

RNG = np.random.default_rng(3)
W = {"g": RNG.uniform(0.5, 1.5, 8).astype(np.float32), "b": RNG.standard_normal(8).astype(np.float32)}

LAYERNORM = """
graph @t(%x: f32[2,3,8]) -> (y: f32[2,3,8]) {
  %axes = const i64[1] dense<[AXES]>
  %two = const f32[] dense<2.0>
  %eps = const f32[] dense<1e-05>
  %g = const f32[8]
  %b = const f32[8]
  %0 = ReduceMean(%x, %axes) : f32[MEAN]
  %1 = Sub(%x, %0) : f32[2,3,8]
  %2 = Pow(%1, %two) : f32[2,3,8]
  %3 = ReduceMean(%2, %axes) : f32[MEAN]
  %4 = Add(%3, %eps) : f32[MEAN]
  %5 = Sqrt(%4) : f32[MEAN]
  %6 = Div(%1, %5) : f32[2,3,8]
  %7 = Mul(%6, %g) : f32[2,3,8]
  %8 = Add(%7, %b) : f32[2,3,8]
  return y=%8
}"""


def layernorm(axes="-1", mean="2,3,1"):
    return ir(LAYERNORM.replace("AXES", axes).replace("MEAN", mean), weights=W)


def test_a_decomposed_layernorm_and_its_affine_step_become_one_op():
    g = layernorm()
    assert run_pass(Canonicalize(), g, rtol=1e-5)
    assert g.op_counts() == {"LayerNormalization": 1}
    ln = g.nodes[0]
    assert ln.op.axis == 2 and ln.op.epsilon == pytest.approx(1e-5)
    np.testing.assert_allclose(ln.inputs[1].const, W["g"])
    np.testing.assert_allclose(ln.inputs[2].const, W["b"])


def test_a_squared_difference_as_a_product_matches_too():
    g = ir(LAYERNORM.replace("AXES", "-1").replace("MEAN", "2,3,1")
           .replace("%2 = Pow(%1, %two)", "%2 = Mul(%1, %1)"), weights=W)
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"LayerNormalization": 1}


def test_layernorm_refusals():
    """Means over a leading axis; an intermediate needed outside; a variance of something else."""
    g = layernorm(axes="1", mean="2,1,8")
    assert refusals(g, "decomposed-layernorm") == [
        "the means are not over the same trailing axes (constant, keepdims)"]
    g = ir(LAYERNORM.replace("AXES", "-1").replace("MEAN", "2,3,1")
           .replace("(y: f32[2,3,8])", "(y: f32[2,3,8], s: f32[2,3,1])").replace("return y=%8", "return y=%8, s=%5"),
           weights=W)
    assert refusals(g, "decomposed-layernorm") == ["Sqrt is used outside the pattern"]
    assert not Canonicalize(rules=[r for r in RULES if r.name == "decomposed-layernorm"]).run(g)
    g = ir(LAYERNORM.replace("AXES", "-1").replace("MEAN", "2,3,1").replace("%2 = Pow(%1, %two)", "%2 = Pow(%x, %two)"),
           weights=W)
    assert refusals(g, "decomposed-layernorm") == ["the mean is not of (x - mean(x))^2"]


GELU = """
graph @t(%x: f32[4,16]) -> (y: f32[4,16]) {
  %k = const f32[] dense<1.4142135>
  %one = const f32[] dense<1.0>
  %h = const f32[] dense<0.5>
  %0 = Div(%x, %k) : f32[4,16]
  %1 = Erf(%0) : f32[4,16]
  %2 = Add(%1, %one) : f32[4,16]
  %3 = Mul(%x, %2) : f32[4,16]
  %4 = Mul(%3, %h) : f32[4,16]
  return y=%4
}"""


@pytest.mark.parametrize("variant", ["torch", "half first", "times 1/sqrt2"])
def test_a_decomposed_gelu_becomes_gelu(variant):
    text = GELU
    if variant == "half first":  # (x * 0.5) * (1 + erf(x / sqrt 2))
        text = text.replace("%3 = Mul(%x, %2)", "%3 = Mul(%x, %h)").replace("%4 = Mul(%3, %h)", "%4 = Mul(%2, %3)")
    if variant == "times 1/sqrt2":
        text = text.replace("dense<1.4142135>", "dense<0.70710677>").replace("Div(%x, %k)", "Mul(%x, %k)")
    g = ir(text)
    assert run_pass(Canonicalize(), g, rtol=1e-5)
    assert g.op_counts() == {"Gelu": 1}


def test_gelu_refusals():
    g = ir(GELU.replace("dense<1.4142135>", "dense<1.7>"))
    assert sorted(refusals(g, "decomposed-gelu")) == [
        "no 1 + erf(x / sqrt(2)) or 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)) of the same x", "no factor 0.5"]
    g = ir(GELU.replace("(y: f32[4,16])", "(y: f32[4,16], e: f32[4,16])").replace("return y=%4", "return y=%4, e=%1"))
    assert "Erf is used outside the pattern" in refusals(g, "decomposed-gelu")
    assert not Canonicalize(rules=[r for r in RULES if r.name == "decomposed-gelu"]).run(g)


GELU_TANH = """
graph @t(%x: f32[4,16]) -> (y: f32[4,16]) {
  %c = const f32[] dense<0.044715>
  %k = const f32[] dense<0.7978846>
  %one = const f32[] dense<1.0>
  %h = const f32[] dense<0.5>
  %0 = Mul(%x, %x) : f32[4,16]
  %1 = Mul(%x, %0) : f32[4,16]
  %2 = Mul(%c, %1) : f32[4,16]
  %3 = Add(%x, %2) : f32[4,16]
  %4 = Mul(%k, %3) : f32[4,16]
  %5 = Tanh(%4) : f32[4,16]
  %6 = Add(%one, %5) : f32[4,16]
  %7 = Mul(%x, %6) : f32[4,16]
  %8 = Mul(%7, %h) : f32[4,16]
  return y=%8
}"""


@pytest.mark.parametrize("cube", ["as torch exports it", "as Pow"])
def test_the_tanh_form_becomes_gelu_tanh(cube):
    """GPT-2's GELU as PyTorch exports it before opset 20 (x * x * x), and with Pow(x, 3)."""
    text = GELU_TANH
    if cube == "as Pow":
        text = text.replace("%0 = Mul(%x, %x)", "%three = const f32[] dense<3.0>\n  %0 = Mul(%x, %x)").replace(
            "%1 = Mul(%x, %0)", "%1 = Pow(%x, %three)")
    g = ir(text)
    assert run_pass(Canonicalize(), g, rtol=1e-5)
    assert g.op_counts() == {"Gelu": 1} and g.nodes[0].op.approximate == "tanh"


def test_the_tanh_form_with_another_constant_stays():
    g = ir(GELU_TANH.replace("dense<0.044715>", "dense<0.05>"))
    # (every other Mul is no attempt at the pattern: "no factor 0.5")
    assert [r for r in refusals(g, "decomposed-gelu") if r != "no factor 0.5"] == [
        "no 1 + erf(x / sqrt(2)) or 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)) of the same x"]
    assert not Canonicalize(rules=[r for r in RULES if r.name == "decomposed-gelu"]).run(g)


@pytest.mark.parametrize("lead", ["1,1", "0,3"])
def test_size_one_and_empty_leading_axes(lead):
    """Both rules on a single row (size-1 axes) and on no rows (a size-0 axis): same structure,
    same numbers (``run_pass`` compares the interpreter before and after)."""
    g = ir(LAYERNORM.replace("AXES", "-1").replace("MEAN", "2,3,1").replace("2,3,", lead + ","), weights=W)
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"LayerNormalization": 1}
    rows = lead.split(",")[0]
    g = ir(GELU_TANH.replace("f32[4,16]", f"f32[{rows},16]"))
    assert run_pass(Canonicalize(), g)
    assert g.op_counts() == {"Gelu": 1}


RMSNORM = """
graph @t(%x: f32[2,3,8]) -> (y: f32[2,3,8]) {
  %axes = const i64[1] dense<[AXES]>
  %two = const f32[] dense<2.0>
  %eps = const f32[] dense<1e-06>
  %one = const f32[] dense<1.0>
  %g = const f32[8]
  %0 = Pow(%x, %two) : f32[2,3,8]
  %1 = ReduceMean(%0, %axes) : f32[MEAN]
  %2 = Add(%1, %eps) : f32[MEAN]
  %3 = Sqrt(%2) : f32[MEAN]
  %4 = Div(%one, %3) : f32[MEAN]
  %5 = Mul(%x, %4) : f32[2,3,8]
  %6 = Mul(%5, %g) : f32[2,3,8]
  return y=%6
}"""


def rmsnorm(*edits, axes="-1", mean="2,3,1"):
    """RMSNORM over ``axes`` with the (old, new) text ``edits``."""
    text = RMSNORM.replace("AXES", axes).replace("MEAN", mean)
    for old, new in edits:
        text = text.replace(old, new)
    return ir(text, weights=W)


@pytest.mark.parametrize("form", ["as torch exports it", "divided", "reciprocal", "square as a product",
                                  "weight first"])
def test_a_decomposed_rmsnorm_and_its_weight_become_one_op(form):
    """Llama's RMSNorm as PyTorch exports it (x * (1 / sqrt(mean(x^2) + eps)) * weight), x divided
    by the root, Reciprocal, x * x, and the weight as the first factor: one RMSNormalization with the
    weight as its scale; the same numbers (``run_pass``)."""
    edits = {"divided": [("%4 = Div(%one, %3) : f32[2,3,1]\n  %5 = Mul(%x, %4)", "%5 = Div(%x, %3)")],
             "reciprocal": [("Div(%one, %3)", "Reciprocal(%3)")],
             "square as a product": [("Pow(%x, %two)", "Mul(%x, %x)")],
             "weight first": [("Mul(%x, %4)", "Mul(%4, %x)"), ("Mul(%5, %g)", "Mul(%g, %5)")]}.get(form, [])
    g = rmsnorm(*edits)
    assert run_pass(Canonicalize(), g, rtol=1e-5)
    assert g.op_counts() == {"RMSNormalization": 1}
    rms = g.nodes[0]
    assert rms.op.axis == 2 and rms.op.epsilon == pytest.approx(1e-6)
    np.testing.assert_allclose(rms.inputs[1].const, W["g"])


def test_rmsnorm_over_the_last_two_axes():
    g = rmsnorm(("i64[1]", "i64[2]"), axes="1, 2", mean="2,1,1")
    assert run_pass(Canonicalize(), g, rtol=1e-5)
    assert g.op_counts() == {"RMSNormalization": 1} and g.nodes[0].op.axis == 1
    assert g.nodes[0].inputs[1].shape == (3, 8)


def rms_refusals(g):
    """The near misses of decomposed-rmsnorm (not the roots that are no attempt at it)."""
    return [r for r in refusals(g, "decomposed-rmsnorm") if r != "no sqrt(mean(...) + eps) divides x"]


def test_rmsnorm_refusals():
    """A mean over a leading axis; the root needed outside; the mean of another tensor's square;
    no constant eps; and a bias added after it (RMSNormalization has none: the Add stays)."""
    g = rmsnorm(axes="1", mean="2,1,8")
    assert rms_refusals(g) == ["the mean is not over trailing axes (constant, keepdims)"]
    g = rmsnorm(("(y: f32[2,3,8])", "(y: f32[2,3,8], s: f32[2,3,1])"), ("return y=%6", "return y=%6, s=%3"))
    assert rms_refusals(g) == ["Sqrt is used outside the pattern"]
    assert not Canonicalize(rules=[r for r in RULES if r.name == "decomposed-rmsnorm"]).run(g)
    g = rmsnorm(("%x: f32[2,3,8])", "%x: f32[2,3,8], %z: f32[2,3,8])"), ("Pow(%x, %two)", "Pow(%z, %two)"))
    assert rms_refusals(g) == ["the mean is not of x^2"]
    g = rmsnorm(("%x: f32[2,3,8])", "%x: f32[2,3,8], %e: f32[])"), ("Add(%1, %eps)", "Add(%1, %e)"))
    assert rms_refusals(g) == ["the square root is not of mean(...) + eps with a constant eps"]
    g = rmsnorm(("%6 = Mul(%5, %g) : f32[2,3,8]", "%6 = Add(%5, %g) : f32[2,3,8]"))
    assert run_pass(Canonicalize(), g, rtol=1e-5)
    assert g.op_counts() == {"RMSNormalization": 1, "Add": 1}
    assert "no operand is a normalization's result and the other a constant (RMS: a product)" in refusals(
        g, "norm-affine")


def test_rmsnorm_on_one_row_and_on_none():
    for lead in ("1,1", "0,3"):
        g = rmsnorm(("2,3,", lead + ","))
        assert run_pass(Canonicalize(), g)
        assert g.op_counts() == {"RMSNormalization": 1}


# -- rotary embeddings ------------------------------------------------------------------------------

_FREQS = np.outer(np.arange(6), 1.0 / 10000 ** (np.arange(4) / 4))
ROPE_W = {"cos": np.cos(np.concatenate([_FREQS, _FREQS], -1)).astype(np.float32),
          "sin": np.sin(np.concatenate([_FREQS, _FREQS], -1)).astype(np.float32)}

ROTARY = """
graph @t(%q: f32[2,6,16]) -> (y: f32[2,2,6,8]) {
  %heads = const i64[4] dense<[2, 6, 2, 8]>
  %zero = const i64[1] dense<[0]>
  %four = const i64[1] dense<[4]>
  %end = const i64[1] dense<[9223372036854775807]>
  %last = const i64[1] dense<[-1]>
  %cos = const f32[6,8]
  %sin = const f32[6,8]
  %0 = Reshape(%q, %heads) : f32[2,6,2,8]
  %1 = Transpose(%0) {perm=[0, 2, 1, 3]} : f32[2,2,6,8]
  %2 = Mul(%1, %cos) : f32[2,2,6,8]
  %3 = Slice(%1, %zero, %four, %last) : f32[2,2,6,4]
  %4 = Slice(%1, %four, %end, %last) : f32[2,2,6,4]
  %5 = Neg(%4) : f32[2,2,6,4]
  %6 = Concat(%5, %3) {axis=-1} : f32[2,2,6,8]
  %7 = Mul(%6, %sin) : f32[2,2,6,8]
  %8 = Add(%2, %7) : f32[2,2,6,8]
  return y=%8
}"""


def rotary(*edits, weights=ROPE_W):
    text = ROTARY
    for old, new in edits:
        text = text.replace(old, new)
    return ir(text, weights=weights)


@pytest.mark.parametrize("form", ["as torch exports it", "operands swapped", "no head split"])
def test_a_decomposed_rotary_embedding_becomes_one_op(form):
    """Llama's ``q * cos + rotate_half(q) * sin`` as PyTorch exports it: one RotaryEmbedding with
    per-token caches of half the features; on the head split's Transpose it rotates the projection
    ([B, S, H*D], num_heads) and the Transpose follows (for the attention kernel to read as strides);
    the same numbers (``run_pass``), each product and the sum in either order."""
    edits = {"operands swapped": [("Mul(%1, %cos)", "Mul(%cos, %1)"), ("Mul(%6, %sin)", "Mul(%sin, %6)"),
                                  ("Add(%2, %7)", "Add(%7, %2)")],
             "no head split": [("%q: f32[2,6,16]", "%q: f32[2,2,6,8]"), ("Transpose(%0) {perm=[0, 2, 1, 3]}",
                                                                        "Identity(%q)")]}.get(form, [])
    g = rotary(*edits)
    assert run_pass(Canonicalize(), g, rtol=1e-6)
    counts = g.op_counts()
    assert counts.pop("RotaryEmbedding") == 1
    rope = next(n for n in g.nodes if n.op.name == "RotaryEmbedding")
    if form == "no head split":
        assert counts == {} and rope.op.num_heads is None
    else:
        assert counts == {"Reshape": 1, "Transpose": 1} and rope.op.num_heads == 2
        assert rope.inputs[0] is g.inputs[0]  # the [2, 6, 16] projection itself
    assert rope.inputs[1].shape == (2, 6, 4)
    np.testing.assert_array_equal(rope.inputs[1].const[1], ROPE_W["cos"][:, :4])
    np.testing.assert_array_equal(rope.inputs[2].const[0], ROPE_W["sin"][:, :4])


@pytest.mark.parametrize("freqs", ["1,6,4", "6,4", "2,6,4"])
def test_rotary_with_caches_computed_at_run_time(freqs):
    """Hugging Face's rotary module with position ids fed to the model: cos and sin are
    ``cos/sin(cat(f, f))`` computed at run time, unsqueezed for the heads: the op's caches become
    ``cos(f)`` and ``sin(f)`` (reshaped and broadcast to [B, S, D/2]); the same numbers."""
    fshape = [int(v) for v in freqs.split(",")]
    cat = fshape[:-1] + [8]
    view = ("Unsqueeze(%c, %one) : f32[" + ",".join(map(str, cat[:1] + [1] + cat[1:])) + "]"
            if len(fshape) == 3 else "Identity(%c) : f32[6,8]")
    sview = view.replace("%c", "%sn")
    text = ROTARY.replace("%q: f32[2,6,16])", f"%q: f32[2,6,16], %f: f32[{freqs}])").replace(
        "  %cos = const f32[6,8]\n  %sin = const f32[6,8]\n", f"""  %one = const i64[1] dense<[1]>
  %e = Concat(%f, %f) {{axis=-1}} : f32[{",".join(map(str, cat))}]
  %c = Cos(%e) : f32[{",".join(map(str, cat))}]
  %sn = Sin(%e) : f32[{",".join(map(str, cat))}]
  %cos = {view}
  %sin = {sview}
""")
    g = ir(text)
    assert run_pass(Canonicalize(), g, rtol=1e-6)
    counts = g.op_counts()
    assert counts["RotaryEmbedding"] == 1 and "Slice" not in counts and "Neg" not in counts, counts
    rope = next(n for n in g.nodes if n.op.name == "RotaryEmbedding")
    assert rope.inputs[1].shape == (2, 6, 4)
    assert {rope.inputs[1].producer.op.name, rope.inputs[2].producer.op.name} <= {"Cos", "Sin", "Expand",
                                                                                  "Reshape"}


def rope_refusals(g):
    return [r for r in refusals(g, "decomposed-rotary") if r != "not x * cos + rotate_half(x) * sin"]


def test_rotary_refusals():
    """cos and sin computed at run time; halves that differ (not cat(freqs, freqs)); a cos per head;
    the rotated half needed elsewhere; rotate_half's halves the other way round (no match at all)."""
    g = rotary(("%q: f32[2,6,16])", "%q: f32[2,6,16], %cos: f32[6,8])"), ("  %cos = const f32[6,8]\n", ""))
    assert rope_refusals(g) == ["cos and sin are computed at run time, and not as cos/sin(cat(freqs, freqs))"]
    odd = dict(ROPE_W, sin=RNG.standard_normal((6, 8)).astype(np.float32))
    g = rotary(weights=odd)
    assert rope_refusals(g) == ["cos or sin differs between the two halves of the features (not cat(freqs, freqs))"]
    per_head = dict(ROPE_W, cos=np.stack([ROPE_W["cos"], ROPE_W["cos"] * 2])[None])
    g = rotary(("%cos = const f32[6,8]", "%cos = const f32[1,2,6,8]"), weights=per_head)
    assert rope_refusals(g) == ["cos or sin differs between heads"]
    g = rotary(("-> (y: f32[2,2,6,8])", "-> (y: f32[2,2,6,8], r: f32[2,2,6,8])"), ("return y=%8", "return y=%8, r=%6"))
    assert rope_refusals(g) == ["Concat is used outside the pattern"]
    run_pass(Canonicalize(), g)
    assert "RotaryEmbedding" not in g.op_counts()
    g = rotary(("Concat(%5, %3)", "Concat(%3, %5)"))
    assert rope_refusals(g) == [] and "RotaryEmbedding" not in g.op_counts()
