"""The newer kernels (Resize, TopK, GridSample, LpPool, ConvTranspose, Instance- and GroupNormalization,
GRU, Einsum) on the shapes that break kernels: several images, size-1 axes and size-0
axes, compiled whole (a size-0 result needs no code; a size-0 input the lowerings leave to the
interpreter, which gives the reference's answer) against the reference interpreter, on the CPU and in
numba's CUDA simulator."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import compiler
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse

CASES = {
    "resize": ("%x: f32[{n},{c},{h},{w}]", "f32[{n},{c},{h2},{w2}]",
               "%s = const f32[4] dense<[1.0, 1.0, 2.0, 2.0]>\n  %0 = Resize(%x, _, %s) {{mode=\"linear\"}}"),
    "topk": ("%x: f32[{n},{c},{h},{w}]", "f32[{n},{c},{h},{k}]",
             "%k = const i64[1] dense<[{k}]>\n  %0, %i = TopK(%x, %k)"),
    "gridsample": ("%x: f32[{n},{c},{h},{w}], %g: f32[{n},{h},{w},2]", "f32[{n},{c},{h},{w}]",
                   "%0 = GridSample(%x, %g)"),
    "lppool": ("%x: f32[{n},{c},{h},{w}]", "f32[{n},{c},{h},{w}]",
               "%0 = LpPool(%x) {{kernel_shape=[1, 1], p=2}}"),
    "convtranspose": ("%x: f32[{n},{c},{h},{w}], %w: f32[{c},2,2,2]", "f32[{n},2,{h2},{w2}]",
                      "%0 = ConvTranspose(%x, %w) {{strides=[2, 2]}}"),
    "instancenorm": ("%x: f32[{n},{c},{h},{w}], %s: f32[{c}], %b: f32[{c}]", "f32[{n},{c},{h},{w}]",
                     "%0 = InstanceNormalization(%x, %s, %b)"),
    "groupnorm": ("%x: f32[{n},{c},{h},{w}], %s: f32[{c}], %b: f32[{c}]", "f32[{n},{c},{h},{w}]",
                  "%0 = GroupNormalization(%x, %s, %b) {{num_groups=1}}"),
    # a GRU over a sequence of h steps, batch n, input w, hidden c (X laid out [seq, batch, input])
    "gru": ("%x: f32[{h},{n},{w}], %W: f32[1,{c3},{w}], %R: f32[1,{c3},{c}]", "f32[{h},1,{n},{c}]",
            "%0, %yh = GRU(%x, %W, %R) {{hidden_size={c}}}"),
    "einsum": ("%x: f32[{n},{c},{h},{w}], %y: f32[{n},{c},{w},{h}]", "f32[{n},{c},{h},{h}]",
               "%0 = Einsum(%x, %y) {{equation=\"bcij,bcjk->bcik\"}}"),
}
SHAPES = [dict(n=3, c=2, h=4, w=5), dict(n=2, c=1, h=1, w=3), dict(n=1, c=1, h=1, w=1), dict(n=2, c=0, h=3, w=2),
          dict(n=2, c=2, h=0, w=3)]


def _graph(case: str, dims: dict):
    ins, out, body = CASES[case]
    d = dict(dims, h2=2 * dims["h"], w2=2 * dims["w"], k=min(2, dims["w"]), c3=3 * dims["c"])
    if case == "topk" and d["w"] == 0:
        d["k"] = 0
    text = (f"graph @g({ins.format(**d)}) -> (y: {out.format(**d)}) {{\n  {body.format(**d)} : {out.format(**d)}"
            + EXTRA.get(case, "").format(**d) + "\n  return y=%0\n}")
    return parse(text)


#: the types of a case's results after the first
EXTRA = {"topk": ", i64[{n},{c},{h},{k}]", "gru": ", f32[1,{n},{c}]"}

#: (case, SHAPES index) pairs the op itself refuses (in shape inference, as the reference): a pooling
#: window larger than a size-0 input, a transposed convolution of a size-0 image, a hidden size of 0
INVALID = {("lppool", 4), ("convtranspose", 4), ("gru", 3)}


@pytest.mark.parametrize("case, dims", [(c, d) for c in sorted(CASES) for j, d in enumerate(SHAPES)
                                        if (c, j) not in INVALID],
                         ids=lambda v: v if isinstance(v, str) else "x".join(str(v[k]) for k in "nchw"))
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_edge_shapes(case, dims, target):
    g = _graph(case, dims)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([int(s) for s in v.shape]).astype(np.float32) for v in g.inputs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a size-0 input is left to the interpreter, with a warning
        exe = compiler.compile(_graph(case, dims), target=target)
    got, want = exe.run(feeds)["y"], interpret(g, feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if 0 not in dims.values() and not (case == "gru" and target == "cuda"):  # (a GRU runs on the host there)
        assert exe.fallback == [], exe.fallback  # every node native on these shapes
