"""A channel shuffle read in place by the depthwise conv after it (``kernels/shuffle.py``): structure
(one ``shuffle`` kernel, no Transpose copy), numbers (native against the reference interpreter on 1
and 2 threads) and refusals (the reason the Transpose stays a copy)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.kernels.shuffle import plane_table
from compiler.codegen.kernels.testing import run_kernels

from .fused import fuse

RNG = np.random.default_rng(23)


def shuffle_block(n=1, g=4, cg=3, h=7, w=6, stride=1, perm="0, 2, 1, 3, 4", tail=""):
    c = g * cg
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    five = f"[{n},{cg},{g},{h},{w}]" if perm == "0, 2, 1, 3, 4" else f"[{n},{g},{cg},{w},{h}]"
    text = f"""graph @g(%x: f32[{n},{c},{h},{w}]) -> (y: f32[{n},{c},{oh},{ow}]) {{
  %s5 = const i64[5] dense<[{n}, {g}, {cg}, {h}, {w}]>
  %s4 = const i64[4] dense<[{n}, {c}, {h}, {w}]>
  %wt = const f32[{c},1,3,3]
  %b = const f32[{c}]
  %0 = Reshape(%x, %s5) : f32[{n},{g},{cg},{h},{w}]
  %1 = Transpose(%0) {{perm=[{perm}]}} : f32{five}
  %2 = Reshape(%1, %s4) : f32[{n},{c},{h},{w}]
  %3 = Conv(%2, %wt, %b) {{group={c}, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[{stride}, {stride}]}} \
    : f32[{n},{c},{oh},{ow}]
{tail or "  return y=%3"}
}}"""
    return text, {"wt": RNG.standard_normal((c, 1, 3, 3)).astype(np.float32),
                  "b": RNG.standard_normal(c).astype(np.float32)}


def _fuse(text, weights):
    g, p, feeds, want = fuse(text, weights, RNG)
    return g, p, feeds, want["y"]


def test_plane_table_is_the_shuffle():
    # [1, 2, 3, HW] -> [1, 3, 2, HW]: channel c reads plane (c % 2) * 3 + c // 2
    assert plane_table((1, 2, 3, 5), (0, 2, 1, 3), 5) == [0, 3, 1, 4, 2, 5]
    assert plane_table((2, 3, 4), (0, 2, 1), 4) == "the Transpose does not move whole planes of the " \
                                                    "convolution's input"


@pytest.mark.parametrize("n,stride", [(1, 1), (1, 2), (2, 1), (3, 2)])
def test_shuffle_and_depthwise_are_one_kernel(n, stride):
    g, p, feeds, want = _fuse(*shuffle_block(n=n, stride=stride))
    assert [n_.op.name for n_ in g.nodes] == ["Reshape", "Kernel"]  # the first Reshape is a view
    assert g.nodes[1].op.kind == "shuffle" and g.nodes[1].op.members() == ["Transpose", "Reshape", "Conv"]
    for t in (1, 2):
        np.testing.assert_allclose(run_kernels(g, feeds, nthreads=t)["y"], want, rtol=1e-5, atol=1e-5)


def test_refusals_name_the_reason():
    # a Transpose that moves rows within planes (H and W swapped) is no shuffle of planes
    g, p, feeds, want = _fuse(*shuffle_block(perm="0, 1, 2, 4, 3"))
    assert all(n.op.name != "Kernel" for n in g.nodes)
    why = [d.reason for d in p.decisions if d.producer.op.name == "Transpose"]
    assert why and why[0].endswith("not as a channel shuffle the convolution reads in place: the Transpose does "
                                   "not move whole planes of the convolution's input")
    np.testing.assert_allclose(run_kernels(g, feeds)["y"], want, rtol=1e-5, atol=1e-5)
    # the conv has an epilogue (a ReLU): it keeps it, and the shuffle stays a copy
    text, w = shuffle_block(tail="  %4 = Relu(%3) : f32[1,12,7,6]\n  return y=%4")
    g, p, feeds, want = _fuse(text, w)
    assert [n.op.kind for n in g.nodes if n.op.name == "Kernel"] == ["epilogue"]
    assert any("the convolution's result has an elementwise chain" in d.reason for d in p.decisions)
    np.testing.assert_allclose(run_kernels(g, feeds)["y"], want, rtol=1e-5, atol=1e-5)
