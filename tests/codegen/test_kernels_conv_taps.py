"""The convolution whose GEMM reads its taps in place (``kernels/conv_taps.py``, ``kiln_sgemm_taps``)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.gemm.config import model_config
from compiler.codegen.kernels.conv_taps import TAPS_MIN_CHANNELS
from compiler.codegen.kernels.testing import build_kernels, run_kernels
from compiler.codegen.llvm.target import host_target, target_for
from compiler.ir.interpreter import interpret

from .test_kernels_conv import check_on, conv
from .test_kernels_linalg import Bench

#: (the GEMM paths: maps of 17 to 64 pixels would otherwise take the direct kernel, small_conv.py)
pytestmark = pytest.mark.usefixtures("gemm_conv_paths")

NOTE = "taps read in place by the GEMM from padded planes (no col matrix); the chain after it"


@pytest.mark.parametrize("cpu", ["x86-64-v3", "skylake-avx512"])
def test_taps_read_in_place(cpu):
    """Structure (the note; the GEMM's taps entry called, no im2col packer) on AVX2 and AVX-512 code,
    and numbers against the interpreter where the host runs that code, on 1 to 3 threads: a
    DenseNet growth layer (as many output channels as the GEMM reads B in place for), asymmetric
    and 2-wide pads, a dilated 5x5 window (uneven pads), a 2x3 window and no padding, output channels not a
    multiple of the register tile's rows, a map of one row with one output channel, no bias, a chain after it (not fused: run after)."""
    target = target_for(cpu)
    cfg = model_config(target)
    m = cfg.direct_b_max_m
    t = Bench()
    conv(t, (1, 128, 12, 14), m, (3, 3), pads=(1, 1, 1, 1))                         # DenseNet's growth layer
    conv(t, (1, 64, 7, 9), m - 3, (3, 3), pads=(2, 0, 1, 2), bias=False)            # asymmetric, 2-wide
    conv(t, (1, 96, 10, 10), 5, (5, 5), pads=(3, 4, 2, 4), dilations=(2, 2))        # dilated 5x5
    conv(t, (1, 70, 6, 13), 7, (2, 3))                                              # no padding
    conv(t, (1, 64, 1, 20), 1, (3, 3), pads=(1, 1, 1, 1))                          # size-1 axes: 1 row, 1 output
    y = t.outs[0]
    from compiler.ir.ops import elementwise as ew

    t.outs[0] = t.g.add(ew.Relu(), y)  # the chain after it
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    module, _, plan = build_kernels(t.g, target)
    notes = [k.notes for g, k in plan if type(g.nodes[0].op).__name__ == "Conv"]
    assert len(notes) == 5 and all(NOTE in n for n in notes), notes
    ll = str(module)
    assert "kiln_sgemm_taps" in ll and "kiln_pack_cols" not in ll and "kiln_sgemm_cb" not in ll
    check_on(t, target, cpu)

def test_taps_refused():
    """Where the taps are not read in place (the im2col path instead): fewer input channels than
    ``TAPS_MIN_CHANNELS`` (each tap's block of depth too thin), more output channels than the GEMM
    reads B in place for, two images, a stride of 2, weights as an input, a map of more panels than
    the im2col path packs first (it packs those on request: no faster here), no output channel (size 0)."""
    cfg = model_config(host_target())
    m = cfg.direct_b_max_m
    t = Bench()
    conv(t, (1, TAPS_MIN_CHANNELS // 2, 12, 12), m, (3, 3), pads=(1, 1, 1, 1))
    conv(t, (1, 64, 12, 12), m + 1, (3, 3), pads=(1, 1, 1, 1))
    conv(t, (2, 64, 12, 12), m, (3, 3), pads=(1, 1, 1, 1))
    conv(t, (1, 64, 12, 12), m, (3, 3), pads=(1, 1, 1, 1), strides=(2, 2))
    conv(t, (1, 64, 12, 12), m, (3, 3), pads=(1, 1, 1, 1), const_w=False)
    conv(t, (1, 64, 40, 40), m, (3, 5), pads=(1, 2, 1, 2))
    conv(t, (1, 64, 12, 12), 0, (3, 3), pads=(1, 1, 1, 1))  # a size-0 axis: no output channel
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, host_target())
    assert not any(NOTE in k.notes for _, k in plan if k is not None), [k.notes for _, k in plan if k]
    want, got = interpret(t.g, t.feed), run_kernels(t.g, t.feed, nthreads=2)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want[name]).max(initial=0)))
