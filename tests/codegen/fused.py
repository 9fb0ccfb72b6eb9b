"""Helpers for the fused-kernel tests: fuse a graph written as IR text and run it natively against
the reference interpreter's results from before fusion."""
from __future__ import annotations

import numpy as np

from compiler.codegen.fusion import CPU_FUSION
from compiler.codegen.kernels.testing import run_kernels
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.passes.fuse import FuseKernels


def fuse(text: str, weights=None, rng=None, feeds=None, **kw):
    """(the fused graph, the pass, the inputs, the interpreter's outputs before fusion). Inputs not
    in ``feeds`` are standard normal from ``rng``."""
    rng = rng if rng is not None else np.random.default_rng(0)
    g = parse(text, weights)
    feeds = dict(feeds or {})
    for v in g.inputs:
        if v.name not in feeds:
            feeds[v.name] = rng.standard_normal([int(d) for d in v.shape]).astype(np.float32)
    want = interpret(g, feeds)
    p = FuseKernels(**{"capabilities": CPU_FUSION, **kw})
    p.run(g)
    return g, p, feeds, want


def check_native(g, feeds, want, threads=(1, 2), rtol=1e-5):
    """Native results on each thread count equal ``want`` (atol relative to each output's size)."""
    for t in threads:
        got = run_kernels(g, feeds, nthreads=t)
        for name, ref in want.items():
            np.testing.assert_allclose(got[name], ref, rtol=rtol, atol=rtol * max(1.0, float(np.abs(ref).max())),
                                       err_msg=f"{name}, {t} thread(s)")


def residual_block(n: int, c: int, hw: int, scale: float, seed: int = 3):
    """A ResNet block's second conv (3x3, ``c`` channels on ``hw x hw`` maps, ``n`` images) with the
    residual Add and Relu, fused: (the graph, the inputs, the interpreter's outputs before fusion);
    the fusion made it one epilogue kernel."""
    t = f"f32[{n},{c},{hw},{hw}]"
    text = f"""graph @g(%x: {t}, %r: {t}) -> (y: {t}) {{
  %w = const f32[{c},{c},3,3]
  %b = const f32[{c}]
  %0 = Conv(%x, %w, %b) {{kernel_shape=[3, 3], pads=[1, 1, 1, 1]}} : {t}
  %1 = Add(%0, %r) : {t}
  %2 = Relu(%1) : {t}
  return y=%2
}}"""
    rng = np.random.default_rng(seed)
    weights = {"w": (rng.standard_normal((c, c, 3, 3)) / scale).astype(np.float32),
               "b": rng.standard_normal(c).astype(np.float32)}
    g, _, feeds, want = fuse(text, weights, rng)
    assert [node.op.kind for node in g.nodes] == ["epilogue"]
    return g, feeds, want
