"""The GPU's attention kernel (``codegen/cuda/attention.py``) in numba's CUDA simulator: structure (the
whole block, head transposes included, is one launch), numbers (against the reference interpreter
and a NumPy formula: several blocks of query rows per head, cross attention, a boolean mask) and
refusals (what the GPU kernel does not take stays separate kernels, with the reason)."""
from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler.codegen.cuda import CUDA_FUSION
from compiler.codegen.cuda import check as cuda_check
from compiler.codegen.cuda import attention as cuda_attention
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.passes.fuse import FuseKernels
from tests.codegen.test_kernels_attention import _numpy_attention, bert_block

RNG = np.random.default_rng(5)


def _feeds(text):
    g = parse(text)
    feeds = {v.name: RNG.standard_normal([int(x) for x in v.shape]).astype(np.float32) for v in g.inputs}
    if "m" in feeds:  # a BERT mask: 0 or -10000
        feeds["m"] = np.where(feeds["m"] > 0.5, np.float32(-10000.0), np.float32(0.0))
    return feeds


def _attention_steps(exe):
    return [k for k in exe.kernels if any(n.startswith("attention:") for n in k["notes"])]


@pytest.mark.parametrize("b,s,h,d", [(1, 5, 2, 3), (2, 18, 1, 4)])  # 18 rows: two blocks per head, 16 + 2
def test_a_bert_block_is_one_launch_and_matches(b, s, h, d):
    text = bert_block(b, s, h, d, mask=True)
    feeds = _feeds(text)
    exe = compiler.compile(parse(text), target="cuda")
    steps = _attention_steps(exe)
    assert len(steps) == 1 and steps[0]["ops"] == ["Transpose", "Transpose", "MatMul", "Div", "Add", "Softmax",
                                                   "Transpose", "MatMul", "Transpose"]
    blocks = -(-s // min(s, cuda_attention.ROWS_MAX))
    assert f"({b * h} heads x {blocks} blocks)" in steps[0]["notes"][0] and "2 ops on them" in steps[0]["notes"][0]
    assert exe.fallback == []
    got = exe.run(feeds)["y"]
    np.testing.assert_allclose(got, interpret(parse(text), feeds)["y"], rtol=1e-5, atol=1e-5)
    ref = _numpy_attention(feeds["q"], feeds["k"], feeds["v"], feeds["m"], b, s, h, d)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


CROSS = """graph @g(%q: f32[2,6,3], %k: f32[2,3,4], %v: f32[2,4,5]) -> (y: f32[2,6,5]) {
  %c = const f32[] dense<0.75>
  %keep = const bool[6,4] dense<[[true, false, false, false], [true, true, false, false], [true, true, true, false],
                                  [true, true, true, true], [false, true, true, true], [false, false, true, true]]>
  %inf = const f32[] dense<-inf>
  %0 = MatMul(%q, %k) : f32[2,6,4]
  %1 = Mul(%c, %0) : f32[2,6,4]
  %2 = Where(%keep, %1, %inf) : f32[2,6,4]
  %3 = Softmax(%2) {axis=-1} : f32[2,6,4]
  %4 = MatMul(%3, %v) : f32[2,6,5]
  return y=%4
}"""


def test_cross_attention_with_a_boolean_mask():
    """6 queries on 4 keys (the scores are not square), the scale on the left, a Where of a boolean
    mask with -inf: the chain's operands in either position, a broadcast mask and literal constants."""
    feeds = _feeds(CROSS)
    exe = compiler.compile(parse(CROSS), target="cuda")
    steps = _attention_steps(exe)
    assert len(steps) == 1 and steps[0]["ops"] == ["MatMul", "Mul", "Where", "Softmax", "MatMul"]
    got = exe.run(feeds)["y"]
    np.testing.assert_allclose(got, interpret(parse(CROSS), feeds)["y"], rtol=1e-5, atol=1e-5)
    keep = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]], bool)
    s = np.where(keep, 0.75 * (feeds["q"] @ feeds["k"]), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ feeds["v"], rtol=1e-4, atol=1e-5)


TANH = CROSS.replace("%2 = Where(%keep, %1, %inf)", "%2 = Tanh(%1)")


def test_refusals_keep_separate_kernels_and_say_why(monkeypatch):
    # an op on the scores the GPU kernel has no form for (the CPU's attention kernel takes it)
    g = parse(TANH)
    p = FuseKernels(capabilities=CUDA_FUSION)
    p.run(g)
    assert all(getattr(n.op, "kind", None) != "attention" for n in g.nodes)
    why = [d.reason for d in p.decisions if d.producer.op.name == "Softmax"]
    assert why and "not as attention: Tanh on the scores has no form in the GPU's attention kernel" in why[0]
    feeds = _feeds(TANH)
    exe = compiler.compile(parse(TANH), target="cuda")
    assert _attention_steps(exe) == [] and exe.fallback == []
    np.testing.assert_allclose(exe.run(feeds)["y"], interpret(parse(TANH), feeds)["y"], rtol=1e-5, atol=1e-5)
    # a head size of 0 (K = 0: the scores are all zeros), which the block sizes cannot divide by
    g = parse(CROSS.replace("f32[2,6,3]", "f32[2,6,0]").replace("f32[2,3,4]", "f32[2,0,4]"))
    assert cuda_check("attention", [n for n in g.nodes if n.op.name in ("MatMul", "Mul", "Where", "Softmax")]) == \
        "an empty attention (an axis of size 0)"
    # a row of scores longer than the shared memory a block keeps
    monkeypatch.setattr(cuda_attention, "SCORES_FLOATS", 3)
    g = parse(CROSS)
    p = FuseKernels(capabilities=CUDA_FUSION)
    p.run(g)
    why = [d.reason for d in p.decisions if d.producer.op.name == "Softmax"]
    assert why and "a row of 4 scores is over the 3 floats of shared memory a block keeps" in why[0]
