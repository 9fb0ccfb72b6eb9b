"""Epilogues inside the GEMM (``kernels/tile_epilogue.py``): a conv's bias and its fused elementwise
chain applied to each finished block of C. Structure (the kernel calls ``kiln_sgemm_ep`` and no
separate bias or chain pass), numbers (native against the reference interpreter) and refusals (an
operand the block form cannot address keeps the separate pass, still right)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.fusion import CPU_FUSION
from compiler.codegen.kernels.testing import run_kernels
from compiler.codegen.kernels.tile_epilogue import TileEpilogue
from compiler.codegen.llvm.target import host_target
from compiler.codegen.program import build_program
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.passes.fuse import FuseKernels

#: (the convolutions here are of the GEMM paths)
pytestmark = pytest.mark.usefixtures("gemm_conv_paths")

RNG = np.random.default_rng(3)


def _weights(shapes: dict) -> dict:
    return {k: RNG.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _run(text: str, weights: dict):
    g = parse(text, weights)
    feeds = {v.name: RNG.standard_normal([int(d) for d in v.shape]).astype(np.float32) for v in g.inputs}
    want = interpret(g, feeds)
    FuseKernels(capabilities=CPU_FUSION).run(g)
    got = run_kernels(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-4 * float(np.abs(want[name]).max()))
    return g, build_program(g, host_target()).llvm_ir


def _ep_in_gemm(ll: str) -> bool:
    """Whether a kernel passes an epilogue to the GEMM (``kiln_sgemm_ep``, or ``kiln_sgemm_cb`` when
    a conv packs B's blocks itself)."""
    return ("kiln_sgemm_ep" in ll or "kiln_sgemm_cb" in ll) and '.ep"' in ll


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _conv_text(x, w, y, attrs, tail, outputs, extra_consts=""):
    """A graph of a biased Conv (x, w, y: shapes) followed by ``tail`` (IR lines, ending in return)."""
    x, w, y = _dims(x), _dims(w), _dims(y)
    m = w.strip("[]").split(",")[0]
    return f"""graph @g(%x: f32{x}, %r: f32{y}) -> ({outputs}) {{
  %w = const f32{w}
  %b = const f32[{m}]
{extra_consts}  %0 = Conv(%x, %w, %b) {attrs} : f32{y}
{tail}
}}"""


BN_RELU = """  %1 = Mul(%0, %s) : f32{y}
  %2 = Add(%1, %t) : f32{y}
  %3 = Relu(%2) : f32{y}
  return y=%3"""

RESIDUAL = """  %1 = Add(%0, %r) : f32{y}
  %2 = Relu(%1) : f32{y}
  return y=%2"""


@pytest.mark.parametrize("x,m,k,attrs", [
    ([1, 8, 9, 11], 12, 3, "{pads=[1, 1, 1, 1]}"),                 # im2col, one image
    ([1, 8, 9, 30], 12, 3, "{pads=[1, 1, 1, 1]}"),                 # im2col, rows wider than a panel
    ([1, 64, 3, 30], 160, 3, "{pads=[1, 1, 1, 1]}"),               # K > KC and M > MC: several blocks (8 tiles: not Winograd)
    ([2, 8, 9, 9], 16, 1, "{}"),                                     # 1x1 on the input, batch 2
    ([1, 32, 40, 40], 24, 1, "{strides=[2, 2]}"),                   # 1x1/2: subsampled, then the GEMM
    ([1, 6, 13, 13], 10, 3, "{pads=[1, 1, 1, 1], strides=[2, 2]}"),  # strided (column phases)
    ([2, 8, 7, 7], 8, 3, "{pads=[1, 1, 1, 1], group=2}"),            # groups
])
@pytest.mark.parametrize("tail", ["bn_relu", "residual"])
def test_conv_chain_inside_the_gemm(x, m, k, attrs, tail):
    c = x[1] // (2 if "group" in attrs else 1)
    w = [m, c, k, k]
    stride = 2 if "strides" in attrs else 1
    pad = 1 if "pads" in attrs else 0
    oh, ow = (x[2] + 2 * pad - k) // stride + 1, (x[3] + 2 * pad - k) // stride + 1
    y = [x[0], m, oh, ow]
    ys = _dims(y)
    body = (BN_RELU if tail == "bn_relu" else RESIDUAL).replace("{y}", ys)
    consts = f"  %s = const f32[1,{m},1,1]\n  %t = const f32[{m},1,1]\n"
    text = _conv_text(x, w, y, attrs, body, f"y: f32{ys}", consts)
    g, ll = _run(text, _weights({"w": w, "b": [m], "s": [1, m, 1, 1], "t": [m, 1, 1]}))
    assert [n.op.name for n in g.nodes] == ["Kernel"]
    assert _ep_in_gemm(ll) and "kiln_conv_fill_bias" not in ll
    assert '.loop.i0.' not in ll  # no separate elementwise pass
    packed = k == 3 and x[0] == 1 and "group" not in attrs  # one image, one group: packed panels
    # (from padded planes, or read from the input when small; asked for by the GEMM block by block,
    # or all panels packed first when the pixels fill a few)
    assert ("kiln_pack_cols" in ll or '.pb"' in ll) == packed


def test_bias_alone_runs_in_the_gemm():
    text = _conv_text([1, 4, 8, 8], [6, 4, 3, 3], [1, 6, 8, 8], "{pads=[1, 1, 1, 1]}", "  return y=%0", "y: f32[1,6,8,8]")
    _, ll = _run(text, _weights({"w": [6, 4, 3, 3], "b": [6]}))
    assert _ep_in_gemm(ll) and "kiln_conv_fill_bias" not in ll


def test_result_needed_outside_too():
    """The conv's result is an output as well as the chain's input: C + bias is written over C, the
    chain's result to its own buffer (a two-output epilogue)."""
    text = _conv_text([1, 4, 8, 8], [6, 4, 3, 3], [1, 6, 8, 8], "{pads=[1, 1, 1, 1]}",
                      "  %1 = Sigmoid(%0) : f32[1,6,8,8]\n  %2 = Mul(%0, %1) : f32[1,6,8,8]\n  return y=%2, c=%0",
                      "y: f32[1,6,8,8], c: f32[1,6,8,8]")
    _, ll = _run(text, _weights({"w": [6, 4, 3, 3], "b": [6]}))
    assert _ep_in_gemm(ll)


def test_refuses_an_operand_broadcast_over_some_columns():
    """A [1, C, H, 1] operand varies along a row of C (the pixels) but not as the pixels do: the
    block form cannot address it, so the chain runs as its own pass after the GEMM (and is right)."""
    consts = "  %h = const f32[1,6,8,1]\n"
    text = _conv_text([1, 4, 8, 8], [6, 4, 3, 3], [1, 6, 8, 8], "{pads=[1, 1, 1, 1]}",
                      "  %1 = Add(%0, %h) : f32[1,6,8,8]\n  %2 = Relu(%1) : f32[1,6,8,8]\n  return y=%2",
                      "y: f32[1,6,8,8]", consts)
    g, ll = _run(text, _weights({"w": [6, 4, 3, 3], "b": [6], "h": [1, 6, 8, 1]}))
    body = g.nodes[0].op.body
    conv_out = body.nodes[0].outputs[0]
    why = TileEpilogue.reason(conv_out, body.nodes[1:], 1)
    assert why and "columns' axes only" in why
    assert '.loop.i0.' in ll  # the chain's own pass


def test_transposed_path_keeps_the_separate_pass():
    """Few pixels, many channels, two images: the GEMM computes Y^T, which the block form does not
    describe."""
    text = _conv_text([2, 32, 3, 3], [64, 32, 3, 3], [2, 64, 3, 3], "{pads=[1, 1, 1, 1]}",
                      "  %1 = Relu(%0) : f32[2,64,3,3]\n  return y=%1", "y: f32[2,64,3,3]")
    _, ll = _run(text, _weights({"w": [64, 32, 3, 3], "b": [64]}))
    assert not _ep_in_gemm(ll)


# -- Gemm and MatMul --------------------------------------------------------------------------------

def _gemm_run(text: str, weights: dict, fused_inside: bool):
    g, ll = _run(text, weights)
    assert [n.op.name for n in g.nodes] == ["Kernel"]
    if fused_inside:
        assert _ep_in_gemm(ll)
    assert ('.loop.i0.' in ll) != fused_inside  # the chain's own pass only when refused
    return g


def test_gemm_bias_and_chain_inside_the_gemm():
    """A linear layer's C (beta 1) and activation run on the GEMM's blocks; with beta != 1 C is
    written first and the chain still runs inside."""
    for beta in ("", ", beta=0.5"):
        text = f"""graph @g(%x: f32[8,32]) -> (y: f32[8,16]) {{
  %w = const f32[16,32]
  %c = const f32[16]
  %0 = Gemm(%x, %w, %c) {{transB=1{beta}}} : f32[8,16]
  %1 = Tanh(%0) : f32[8,16]
  return y=%1
}}"""
        _gemm_run(text, _weights({"w": [16, 32], "c": [16]}), True)


def test_matmul_linear_layer_folds_the_batch_into_rows():
    text = """graph @g(%x: f32[2,5,32], %r: f32[2,5,16]) -> (y: f32[2,5,16]) {
  %w = const f32[32,16]
  %c = const f32[16]
  %0 = MatMul(%x, %w) : f32[2,5,16]
  %1 = Add(%0, %c) : f32[2,5,16]
  %2 = Relu(%1) : f32[2,5,16]
  %3 = Add(%2, %r) : f32[2,5,16]
  return y=%3
}"""
    _gemm_run(text, _weights({"w": [32, 16], "c": [16]}), True)


@pytest.mark.parametrize("x, r", [
    ((3, 1, 32), (3, 1, 16)),        # issue 21: every batch read batch 0's residual row
    ((2, 3, 1, 32), (2, 3, 1, 16)),  # several folded axes, the innermost of size 1
    ((2, 1, 4, 32), (2, 1, 4, 16)),  # a size-1 axis between folded ones
    ((3, 1, 32), (1, 1, 16)),        # a residual broadcast over every folded row
])
def test_folded_rows_with_size_one_axes(x, r):
    """C's rows fold the leading axes; a size-1 axis among them has stride 0, so the row stride of an
    operand is that of the innermost folded axis longer than 1, not the last axis's."""
    y = x[:-1] + (16,)
    text = f"""graph @g(%x: f32{_dims(x)}, %r: f32{_dims(r)}) -> (y: f32{_dims(y)}) {{
  %w = const f32[32,16]
  %0 = MatMul(%x, %w) : f32{_dims(y)}
  %1 = Add(%0, %r) : f32{_dims(y)}
  %2 = Relu(%1) : f32{_dims(y)}
  return y=%2
}}"""
    _gemm_run(text, _weights({"w": [32, 16]}), True)


def test_batched_matmul_scale_and_mask():
    """Attention scores: a batched MatMul, a scale and a mask broadcast over heads and queries."""
    text = """graph @g(%q: f32[2,3,8,16], %k: f32[2,3,16,8], %m: f32[2,1,1,8]) -> (y: f32[2,3,8,8]) {
  %s = const f32[] dense<0.25>
  %0 = MatMul(%q, %k) : f32[2,3,8,8]
  %1 = Mul(%0, %s) : f32[2,3,8,8]
  %2 = Add(%1, %m) : f32[2,3,8,8]
  return y=%2
}"""
    _gemm_run(text, {}, True)


def test_refuses_an_operand_broadcast_over_folded_rows():
    """A [5, 16] operand repeats over the batch: C's folded rows (batch x 5) cannot address it, so
    the chain runs as its own pass (and is right)."""
    text = """graph @g(%x: f32[2,5,32], %r: f32[5,16]) -> (y: f32[2,5,16]) {
  %w = const f32[32,16]
  %0 = MatMul(%x, %w) : f32[2,5,16]
  %1 = Add(%0, %r) : f32[2,5,16]
  return y=%1
}"""
    g = _gemm_run(text, _weights({"w": [32, 16]}), False)
    body = g.nodes[0].op.body
    why = TileEpilogue.reason(body.nodes[0].outputs[0], body.nodes[1:], 1, rows_from=0)
    assert why and "rows' axes only" in why


@pytest.mark.parametrize("x,attrs,inside", [
    ([1, 6, 10, 12], "{pads=[1, 1, 1, 1], group=6}", True),
    ([1, 6, 11, 11], "{pads=[1, 1, 1, 1], strides=[2, 2], group=6}", True),
    ([2, 6, 10, 12], "{pads=[1, 1, 1, 1], group=6}", False),  # two images: the chain's own pass
    ([1, 6, 3, 4], "{pads=[1, 1, 1, 1], group=6}", True),      # a tiny map, pixel by pixel
])
def test_depthwise_chain_on_each_finished_plane(x, attrs, inside):
    stride = 2 if "strides" in attrs else 1
    y = [x[0], 6, (x[2] + 2 - 3) // stride + 1, (x[3] + 2 - 3) // stride + 1]
    ys = _dims(y)
    body = f"""  %1 = Clip(%0, %lo, %hi) : f32{ys}
  %2 = Mul(%1, %s) : f32{ys}
  return y=%2"""
    consts = "  %lo = const f32[] dense<0.0>\n  %hi = const f32[] dense<6.0>\n  %s = const f32[1,6,1,1]\n"
    text = _conv_text(x, [6, 1, 3, 3], y, attrs, body, f"y: f32{ys}", consts)
    g, ll = _run(text, _weights({"w": [6, 1, 3, 3], "b": [6], "s": [1, 6, 1, 1]}))
    assert [n.op.name for n in g.nodes] == ["Kernel"]
    assert ('.loop.i0.' in ll) != inside


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_chain_on_each_strip(monkeypatch, stride):
    """A depthwise plane computed by strips of output rows (``DW_STRIP_BYTES``, here a few rows)
    runs the chain on each strip's rows as it is finished: a chain that is not idempotent (x * 2 +
    1 after a Clip) shows a row run twice, missed or run before it is computed."""
    from compiler.codegen.kernels import conv as conv_lowering

    monkeypatch.setattr(conv_lowering, "DW_STRIP_BYTES", 2000)
    x = [1, 5, 31, 45]
    y = [1, 5, (31 + 2 - 3) // stride + 1, (45 + 2 - 3) // stride + 1]
    ys = _dims(y)
    body = f"""  %1 = Clip(%0, %lo, %hi) : f32{ys}
  %2 = Mul(%1, %two) : f32{ys}
  %3 = Add(%2, %one) : f32{ys}
  return y=%3"""
    consts = ("  %lo = const f32[] dense<-1.0>\n  %hi = const f32[] dense<1.5>\n"
              "  %two = const f32[] dense<2.0>\n  %one = const f32[] dense<1.0>\n")
    text = _conv_text(x, [5, 1, 3, 3], y, f"{{pads=[1, 1, 1, 1], strides=[{stride}, {stride}], group=5}}", body,
                      f"y: f32{ys}", consts)
    g, ll = _run(text, _weights({"w": [5, 1, 3, 3], "b": [5]}))
    assert [n.op.name for n in g.nodes] == ["Kernel"]
    assert ".loop.i0." not in ll and "dws" in ll  # the chain inside, by strips


def test_epilogue_runs_once_per_block_after_the_last_k_block():
    """Several K blocks (K > KC), several row blocks (M > MC) and both threads: a chain that is
    not idempotent (x * 2 + 1) shows any block run twice or before its last K block."""
    text = """graph @g(%x: f32[300,600]) -> (y: f32[300,200]) {
  %w = const f32[600,200]
  %c = const f32[200]
  %two = const f32[] dense<2.0>
  %one = const f32[] dense<1.0>
  %0 = Gemm(%x, %w, %c) : f32[300,200]
  %1 = Mul(%0, %two) : f32[300,200]
  %2 = Add(%1, %one) : f32[300,200]
  return y=%2
}"""
    _gemm_run(text, _weights({"w": [600, 200], "c": [200]}), True)
