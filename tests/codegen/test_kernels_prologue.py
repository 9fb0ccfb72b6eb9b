"""Elementwise prologues of a 1x1 convolution (``kernels/prologue.py``): structure (one kernel of
the chain, the conv and its epilogue), numbers (native against the reference interpreter on 1, 2
and 3 threads, panel edges and several K blocks included) and refusals (the reason the chain stays
a loop of its own)."""
from __future__ import annotations

import numpy as np
import pytest

from .fused import check_native, fuse

RNG = np.random.default_rng(29)


def densenet_layer(n=1, c=20, h=7, w=7, m=12, k=1, extra_out=False):
    """BatchNorm as a scale and shift per channel, ReLU, a kxk conv with bias, ReLU."""
    pad = (k - 1) // 2
    outs = f"y: f32[{n},{m},{h},{w}]" + (f", r: f32[{n},{c},{h},{w}]" if extra_out else "")
    ret = "y=%4" + (", r=%2" if extra_out else "")
    text = f"""graph @g(%x: f32[{n},{c},{h},{w}]) -> ({outs}) {{
  %s = const f32[{c},1,1]
  %t = const f32[{c},1,1]
  %wt = const f32[{m},{c},{k},{k}]
  %b = const f32[{m}]
  %0 = Mul(%x, %s) : f32[{n},{c},{h},{w}]
  %1 = Add(%0, %t) : f32[{n},{c},{h},{w}]
  %2 = Relu(%1) : f32[{n},{c},{h},{w}]
  %3 = Conv(%2, %wt, %b) {{kernel_shape=[{k}, {k}], pads=[{pad}, {pad}, {pad}, {pad}]}} : f32[{n},{m},{h},{w}]
  %4 = Relu(%3) : f32[{n},{m},{h},{w}]
  return {ret}
}}"""
    weights = {"s": RNG.standard_normal((c, 1, 1)).astype(np.float32),
               "t": RNG.standard_normal((c, 1, 1)).astype(np.float32),
               "wt": RNG.standard_normal((m, c, k, k)).astype(np.float32),
               "b": RNG.standard_normal(m).astype(np.float32)}
    return text, weights


def _fuse(text, weights):
    return fuse(text, weights, RNG)


def _check(g, feeds, want, threads=(1, 2, 3)):
    check_native(g, feeds, want, threads, rtol=2e-4)


# 7x7 = 49 pixels (2 whole panels of 24 and one of 1), 300 channels (several K blocks), a wide map
@pytest.mark.parametrize("c,h,w,m", [(20, 7, 7, 12), (300, 7, 7, 40), (64, 30, 29, 33), (3, 1, 5, 4)])
def test_chain_conv_and_epilogue_are_one_kernel(c, h, w, m):
    g, p, feeds, want = _fuse(*densenet_layer(c=c, h=h, w=w, m=m))
    assert [n.op.name for n in g.nodes] == ["Kernel"]
    assert g.nodes[0].op.kind == "prologue"
    assert g.nodes[0].op.members() == ["Mul", "Add", "Relu", "Conv", "Relu"]
    assert any(d.fused and "a prologue" in d.reason for d in p.decisions)
    _check(g, feeds, want)


def test_refusals_name_the_reason():
    # a 3x3 conv reads windows, not rows of its input: the chain stays a loop
    g, p, feeds, want = _fuse(*densenet_layer(k=3))
    assert [n.op.kind for n in g.nodes] == ["elementwise", "epilogue"]
    why = [d.reason for d in p.decisions if d.consumer.op.name == "Conv"]
    assert why == ["Conv is not elementwise (pattern out_elemwise_fusable); not as the chain's prologue: "
                   "the convolution is not 1x1 with stride 1 and no padding"]
    _check(g, feeds, want, threads=(2,))
    # two images
    g, p, feeds, want = _fuse(*densenet_layer(n=2))
    assert "the convolution has several images or groups" in \
        [d.reason for d in p.decisions if d.consumer.op.name == "Conv"][0]
    _check(g, feeds, want, threads=(2,))
    # the chain's result is needed outside too: it is computed once, into its buffer
    g, p, feeds, want = _fuse(*densenet_layer(extra_out=True))
    assert "a value of the chain is needed outside the kernel" in \
        [d.reason for d in p.decisions if d.consumer.op.name == "Conv"][0]
    _check(g, feeds, want, threads=(2,))
