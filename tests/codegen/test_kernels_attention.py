"""Attention as one kernel (``kernels/attention.py``): structure (the fusion pass makes one
``attention`` kernel of the whole block, head transposes included), numbers (native against the
reference interpreter and a NumPy formula, on 1, 2 and 3 threads: the per-head tasks and the
sequential path) and refusals (what keeps the block apart, with the reason)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.fusion import CPU_FUSION
from compiler.codegen.kernels.testing import run_kernels
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.passes.fuse import FuseKernels

RNG = np.random.default_rng(11)


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def bert_block(b=1, s=16, h=4, d=8, mask=True, scale="Div"):
    """A BERT-style block: the projections [b, s, h*d] split into heads, scores scaled and masked,
    softmax, times V, heads merged back."""
    hd = h * d
    x, q4 = _dims([b, s, hd]), _dims([b, s, h, d])
    qh, kh, sc = _dims([b, h, s, d]), _dims([b, h, d, s]), _dims([b, h, s, s])
    mask_in = f", %m: f32[{b},1,1,{s}]" if mask else ""
    masked = f"  %8 = Add(%7, %m) : f32{sc}\n" if mask else ""
    last = "%8" if mask else "%7"
    return f"""graph @g(%q: f32{x}, %k: f32{x}, %v: f32{x}{mask_in}) -> (y: f32{x}) {{
  %shape = const i64[4] dense<[{b}, {s}, {h}, {d}]>
  %back = const i64[3] dense<[{b}, {s}, {hd}]>
  %c = const f32[] dense<{d ** 0.5 if scale == "Div" else d ** -0.5}>
  %0 = Reshape(%q, %shape) : f32{q4}
  %1 = Reshape(%k, %shape) : f32{q4}
  %2 = Reshape(%v, %shape) : f32{q4}
  %3 = Transpose(%0) {{perm=[0, 2, 1, 3]}} : f32{qh}
  %4 = Transpose(%1) {{perm=[0, 2, 3, 1]}} : f32{kh}
  %5 = Transpose(%2) {{perm=[0, 2, 1, 3]}} : f32{qh}
  %6 = MatMul(%3, %4) : f32{sc}
  %7 = {scale}(%6, %c) : f32{sc}
{masked}  %9 = Softmax({last}) {{axis=-1}} : f32{sc}
  %10 = MatMul(%9, %5) : f32{qh}
  %11 = Transpose(%10) {{perm=[0, 2, 1, 3]}} : f32{q4}
  %12 = Reshape(%11, %back) : f32{x}
  return y=%12
}}"""


def _numpy_attention(q, k, v, m, b, s, h, d):
    split = lambda t: t.reshape(b, s, h, d).transpose(0, 2, 1, 3)  # noqa: E731
    sc = split(q) @ split(k).transpose(0, 1, 3, 2) / np.float32(d ** 0.5)
    if m is not None:
        sc = sc + m
    e = np.exp(sc - sc.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return (p @ split(v)).transpose(0, 2, 1, 3).reshape(b, s, h * d)


def _fused(text):
    g = parse(text)
    feeds = {v.name: RNG.standard_normal([int(x) for x in v.shape]).astype(np.float32) for v in g.inputs}
    if "m" in feeds:  # a BERT mask: 0 or -10000
        feeds["m"] = np.where(feeds["m"] > 0.5, np.float32(-10000.0), np.float32(0.0))
    want = interpret(g, feeds)["y"]
    p = FuseKernels(capabilities=CPU_FUSION)
    p.run(g)
    return g, p, feeds, want


@pytest.mark.parametrize("b,s,h,d,mask", [(1, 16, 4, 8, True), (2, 24, 3, 16, True), (1, 7, 1, 5, False),
                                          (3, 33, 2, 9, True)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_block_is_one_kernel_and_matches(b, s, h, d, mask, threads):
    g, p, feeds, want = _fused(bert_block(b, s, h, d, mask))
    kernels = [n for n in g.nodes if n.op.name == "Kernel"]
    assert len(kernels) == 1 and kernels[0].op.kind == "attention"
    assert kernels[0].op.members() == ["Transpose", "Transpose", "MatMul", "Div"] + (["Add"] if mask else []) + \
        ["Softmax", "Transpose", "MatMul", "Transpose"]
    assert [n.op.name for n in g.nodes if n.op.name != "Kernel"] == ["Reshape"] * 4  # views only
    got = run_kernels(g, feeds, nthreads=threads)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ref = _numpy_attention(feeds["q"], feeds["k"], feeds["v"], feeds.get("m"), b, s, h, d)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_plain_matmuls_without_transposes_or_chain():
    g, p, feeds, want = _fused("""graph @g(%q: f32[2,8,4], %k: f32[2,4,8], %v: f32[2,8,6]) -> (y: f32[2,8,6]) {
  %0 = MatMul(%q, %k) : f32[2,8,8]
  %1 = Softmax(%0) {axis=-1} : f32[2,8,8]
  %2 = MatMul(%1, %v) : f32[2,8,6]
  return y=%2
}""")
    assert [n.op.kind for n in g.nodes] == ["attention"]
    for t in (1, 2):
        np.testing.assert_allclose(run_kernels(g, feeds, nthreads=t)["y"], want, rtol=1e-5, atol=1e-5)
    assert any(d.fused and d.reason == "attention" for d in p.decisions)


def test_mask_broadcast_over_batch_and_scale_by_mul():
    # the mask is one row for all batches and heads; the scale a Mul
    g, p, feeds, want = _fused("""graph @g(%q: f32[2,3,8,4], %k: f32[2,3,8,4], %v: f32[2,3,8,4], %m: f32[8])
    -> (y: f32[2,3,8,4]) {
  %c = const f32[] dense<0.5>
  %0 = Transpose(%k) {perm=[0, 1, 3, 2]} : f32[2,3,4,8]
  %1 = MatMul(%q, %0) : f32[2,3,8,8]
  %2 = Mul(%1, %c) : f32[2,3,8,8]
  %3 = Add(%2, %m) : f32[2,3,8,8]
  %4 = Softmax(%3) {axis=3} : f32[2,3,8,8]
  %5 = MatMul(%4, %v) : f32[2,3,8,4]
  return y=%5
}""")
    assert [n.op.kind for n in g.nodes] == ["attention"]
    for t in (1, 2, 3):
        np.testing.assert_allclose(run_kernels(g, feeds, nthreads=t)["y"], want, rtol=1e-5, atol=1e-5)


def test_refusals_name_the_reason():
    # the scores are needed outside: no attention kernel (the MatMul keeps its own)
    g, p, feeds, want = _fused("""graph @g(%q: f32[2,8,4], %k: f32[2,4,8], %v: f32[2,8,6])
    -> (y: f32[2,8,6], s: f32[2,8,8]) {
  %0 = MatMul(%q, %k) : f32[2,8,8]
  %1 = Softmax(%0) {axis=-1} : f32[2,8,8]
  %2 = MatMul(%1, %v) : f32[2,8,6]
  return y=%2, s=%0
}""")
    assert all(n.op.name != "Kernel" or n.op.kind != "attention" for n in g.nodes)
    np.testing.assert_allclose(run_kernels(g, feeds)["y"], want, rtol=1e-5, atol=1e-5)
    # the softmax along another axis: the lowering refuses, the decision says so
    g, p, feeds, want = _fused("""graph @g(%q: f32[2,8,4], %k: f32[2,4,8], %v: f32[2,8,6]) -> (y: f32[2,8,6]) {
  %0 = MatMul(%q, %k) : f32[2,8,8]
  %1 = Softmax(%0) {axis=1} : f32[2,8,8]
  %2 = MatMul(%1, %v) : f32[2,8,6]
  return y=%2
}""")
    assert all(n.op.name != "Kernel" for n in g.nodes)
    why = [d.reason for d in p.decisions if d.producer.op.name == "Softmax"]
    assert why and "not as attention: the Softmax is not along the last axis" in why[0]
    np.testing.assert_allclose(run_kernels(g, feeds)["y"], want, rtol=1e-5, atol=1e-5)


def test_max_fused_ops_limits_the_block():
    g = parse(bert_block())
    p = FuseKernels(5, CPU_FUSION)
    p.run(g)
    assert all(n.op.kind != "attention" for n in g.nodes if n.op.name == "Kernel")
    assert any("over max_fused_ops=5" in d.reason for d in p.decisions)


def test_attention_in_a_compiled_artifact(tmp_path):
    import compiler

    g = parse(bert_block(1, 16, 4, 8, True))
    feeds = {v.name: RNG.standard_normal([int(x) for x in v.shape]).astype(np.float32) for v in g.inputs}
    want = interpret(g, feeds)["y"]
    exe = compiler.compile(g, 2, output=str(tmp_path / "att.kiln"))
    assert any(k.get("lowering") == "Attention" for k in exe.kernels), exe.kernels
    np.testing.assert_allclose(exe.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)


def _matches_on_threads(g, feeds, want, scores, v):
    """The fused graph on 1, 2 and 3 threads against the interpreter and NumPy's softmax(scores) @ v."""
    e = np.exp(scores - scores.max(-1, keepdims=True))
    ref = (e / e.sum(-1, keepdims=True)) @ v
    for t in (1, 2, 3):
        got = run_kernels(g, feeds, nthreads=t)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def _where_block(b, s, h, d, masked_first: bool, const_mask: bool) -> str:
    """Causal or padding attention as exporters write it for a boolean mask (``masked_fill``):
    ``Where(keep, scores, -inf)``, or ``Where(drop, -inf, scores)`` with the operands the other way;
    the mask a constant [1, 1, s, s] (GPT-2's ``tril`` buffer) or an input [b, 1, 1, s]."""
    sc, qh, kh = _dims([b, h, s, s]), _dims([b, h, s, d]), _dims([b, h, d, s])
    mshape = [1, 1, s, s] if const_mask else [b, 1, 1, s]
    keep = np.tril(np.ones((s, s), bool)).reshape(mshape) if const_mask else None
    mdecl = "" if const_mask else f", %m: bool{_dims(mshape)}"
    mconst = (f"  %m = const bool{_dims(mshape)} dense<{np.array2string(keep if not masked_first else ~keep, separator=', ', threshold=10**6).replace('True', 'true').replace('False', 'false')}>\n"
              if const_mask else "")
    select = "Where(%m, %inf, %1)" if masked_first else "Where(%m, %1, %inf)"
    return f"""graph @g(%q: f32{qh}, %k: f32{kh}, %v: f32{qh}{mdecl}) -> (y: f32{qh}) {{
{mconst}  %c = const f32[] dense<{d ** -0.5}>
  %inf = const f32[] dense<-inf>
  %0 = MatMul(%q, %k) : f32{sc}
  %1 = Mul(%0, %c) : f32{sc}
  %2 = {select} : f32{sc}
  %3 = Softmax(%2) {{axis=-1}} : f32{sc}
  %4 = MatMul(%3, %v) : f32{qh}
  return y=%4
}}"""


@pytest.mark.parametrize("masked_first,const_mask", [(False, True), (True, True), (False, False), (True, False)])
def test_boolean_where_mask_is_in_the_kernel(masked_first, const_mask):
    b, s, h, d = 2, 13, 3, 8
    g = parse(_where_block(b, s, h, d, masked_first, const_mask))
    feeds = {v.name: RNG.standard_normal([int(x) for x in v.shape]).astype(np.float32)
             for v in g.inputs if v.name != "m"}
    keep = np.tril(np.ones((s, s), bool)).reshape(1, 1, s, s)
    if not const_mask:  # padding: each batch's last positions dropped (position 0 always kept)
        keep = np.arange(s).reshape(1, 1, 1, s) < np.array([s, 5]).reshape(b, 1, 1, 1)
        feeds["m"] = ~keep if masked_first else keep
    want = interpret(g, feeds)["y"]
    p = FuseKernels(capabilities=CPU_FUSION)
    p.run(g)
    assert [n.op.kind for n in g.nodes] == ["attention"]
    assert g.nodes[0].op.members() == ["MatMul", "Mul", "Where", "Softmax", "MatMul"]
    sc = feeds["q"] @ feeds["k"] * np.float32(d ** -0.5)
    _matches_on_threads(g, feeds, want, np.where(keep, sc, -np.inf), feeds["v"])


def test_scores_through_a_narrower_type_are_refused_with_the_reason():
    # a mixed-precision export casts the scores to f16 and back: no f16 loop code in the kernel
    _refused("""graph @g(%q: f32[2,8,4], %k: f32[2,4,8], %v: f32[2,8,6]) -> (y: f32[2,8,6]) {
  %0 = MatMul(%q, %k) : f32[2,8,8]
  %1 = Cast(%0) {to=f16} : f16[2,8,8]
  %2 = Cast(%1) {to=f32} : f32[2,8,8]
  %3 = Softmax(%2) {axis=-1} : f32[2,8,8]
  %4 = MatMul(%3, %v) : f32[2,8,6]
  return y=%4
}""", "not as attention: element type f16 is not supported natively", tol=1e-3)


def _refused(text, reason, tol=1e-5):
    """The graph fused: no attention kernel, ``reason`` given for its Softmax, the same numbers."""
    g, p, feeds, want = _fused(text)
    assert all(n.op.name != "Kernel" or n.op.kind != "attention" for n in g.nodes)
    why = [d.reason for d in p.decisions if d.producer.op.name == "Softmax"]
    assert why and reason in why[0], why
    np.testing.assert_allclose(run_kernels(g, feeds)["y"], want, rtol=tol, atol=tol)


def _gqa_block(b, s, hkv, rep, d, expand: bool) -> str:
    """Grouped-query attention as exporters write ``repeat_interleave`` (Reshape, Tile, Reshape) or
    ``expand`` (Reshape, Expand, Reshape) of the key and value heads; the key transposed last."""
    h = hkv * rep
    kv, kv5, rep5 = _dims([b, hkv, s, d]), _dims([b, hkv, 1, s, d]), _dims([b, hkv, rep, s, d])
    qh, kt, sc = _dims([b, h, s, d]), _dims([b, h, d, s]), _dims([b, h, s, s])
    grow = (f"Expand(%{{0}}, %to) : f32{rep5}" if expand else f"Tile(%{{0}}, %reps) : f32{rep5}")
    return f"""graph @g(%q: f32{qh}, %k: f32{kv}, %v: f32{kv}) -> (y: f32{qh}) {{
  %five = const i64[5] dense<[{b}, {hkv}, 1, {s}, {d}]>
  %four = const i64[4] dense<[{b}, {h}, {s}, {d}]>
  %reps = const i64[5] dense<[1, 1, {rep}, 1, 1]>
  %to = const i64[5] dense<[{b}, {hkv}, {rep}, {s}, {d}]>
  %c = const f32[] dense<{d ** -0.5}>
  %k1 = Reshape(%k, %five) : f32{kv5}
  %k2 = {grow.format("k1")}
  %k3 = Reshape(%k2, %four) : f32{qh}
  %k4 = Transpose(%k3) {{perm=[0, 1, 3, 2]}} : f32{kt}
  %v1 = Reshape(%v, %five) : f32{kv5}
  %v2 = {grow.format("v1")}
  %v3 = Reshape(%v2, %four) : f32{qh}
  %0 = MatMul(%q, %k4) : f32{sc}
  %1 = Mul(%0, %c) : f32{sc}
  %2 = Softmax(%1) {{axis=-1}} : f32{sc}
  %3 = MatMul(%2, %v3) : f32{qh}
  return y=%3
}}"""


@pytest.mark.parametrize("b,hkv,rep", [(2, 2, 3), (1, 1, 4)], ids=["2x2x3", "1x1x4"])
@pytest.mark.parametrize("expand", [False, True], ids=["tile", "expand"])
def test_grouped_query_heads_are_read_in_place(expand, b, hkv, rep):
    """The repeated key/value heads are not copied: the attention kernel takes the Reshape, Tile (or
    Expand), Reshape and Transpose chains and reads key/value head h // rep for query head h (a
    batch of two, and one image with one key/value head: size-1 axes)."""
    s, d = 9, 8
    g, p, feeds, want = _fused(_gqa_block(b, s, hkv, rep, d, expand))
    assert [n.op.kind for n in g.nodes] == ["attention"]
    members = g.nodes[0].op.members()
    assert members.count("Reshape") == 4 and members.count("Expand" if expand else "Tile") == 2
    q, k, v = feeds["q"], np.repeat(feeds["k"], rep, axis=1), np.repeat(feeds["v"], rep, axis=1)
    _matches_on_threads(g, feeds, want, q @ k.transpose(0, 1, 3, 2) * np.float32(d ** -0.5), v)


def test_a_movement_that_breaks_the_strides_is_refused_with_the_reason():
    # the key's features tiled along themselves: no pair of strides reads it
    _refused("""graph @g(%q: f32[2,8,8], %k: f32[2,8,4], %v: f32[2,8,6]) -> (y: f32[2,8,6]) {
  %reps = const i64[3] dense<[1, 1, 2]>
  %0 = Tile(%k, %reps) : f32[2,8,8]
  %1 = Transpose(%0) {perm=[0, 2, 1]} : f32[2,8,8]
  %2 = MatMul(%q, %1) : f32[2,8,8]
  %3 = Softmax(%2) {axis=-1} : f32[2,8,8]
  %4 = MatMul(%3, %v) : f32[2,8,6]
  return y=%4
}""", "the data movements do not leave each matrix at one pair of strides")
