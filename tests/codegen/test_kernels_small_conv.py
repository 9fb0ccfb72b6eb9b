"""The direct kernel of convolutions with a tiny output map (``kernels/small_conv.py``): structure
(the note, the pixel-taps it computes), numbers (native against the reference interpreter on 1 to 3
threads, on AVX2 and AVX-512 code where the host runs it) and refusals (what keeps the GEMM paths)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.kernels.small_conv import SMALL_PIXELS, pack_weight, small_conv_applies, tap_pairs
from compiler.codegen.kernels.testing import build_kernels, run_kernels
from compiler.codegen.llvm.target import host_target, target_for
from compiler.ir.interpreter import interpret

from .fused import check_native, residual_block
from .test_kernels_conv import check_on, conv
from .test_kernels_linalg import Bench


def test_tap_pairs_skip_the_padding():
    # a 2x2 map of a 3x3 window padded by 1: each pixel reads the 4 input pixels, one tap each
    pairs = tap_pairs(2, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1)
    assert [sorted(p) for p in pairs] == [[(4, 0), (5, 1), (7, 2), (8, 3)], [(3, 0), (4, 1), (6, 2), (7, 3)],
                                          [(1, 0), (2, 1), (4, 2), (5, 3)], [(0, 0), (1, 1), (3, 2), (4, 3)]]
    # 4x4 map, 3x3 padded by 1: 100 of the 144 pixel-taps read inside
    assert sum(len(p) for p in tap_pairs(4, 4, 3, 3, 4, 4, 1, 1, 1, 1, 1, 1)) == 100
    # stride 2, dilation 2, asymmetric padding: the same as the windows' definition
    h, w, kh, kw, sh, sw, dh, dw, pt, pl = 5, 7, 3, 2, 2, 3, 2, 1, 2, 1
    oh, ow = (h + pt + 1 - (kh - 1) * dh - 1) // sh + 1, (w + pl + 0 - (kw - 1) * dw - 1) // sw + 1
    for j, got in enumerate(tap_pairs(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)):
        r, q = divmod(j, ow)
        want = [(ki * kw + kj, (r * sh - pt + ki * dh) * w + q * sw - pl + kj * dw)
                for ki in range(kh) for kj in range(kw)
                if 0 <= r * sh - pt + ki * dh < h and 0 <= q * sw - pl + kj * dw < w]
        assert got == want


def test_pack_weight_layout():
    w = np.arange(5 * 3 * 2 * 2, dtype=np.float32).reshape(5, 3, 2, 2)
    wp = pack_weight(w, 4)
    assert wp.shape == (2, 3, 4, 4)  # [block][C][taps][channels of the block]
    for m in range(8):
        for c in range(3):
            for t in range(4):
                want = w[m, c].reshape(-1)[t] if m < 5 else 0.0
                assert wp[m // 4, c, t, m % 4] == want


ONES = np.ones((2, 2, 3, 3), np.float32)


def test_applies_only_to_tiny_maps_of_one_group_and_constant_weights():
    assert small_conv_applies(1, 1, 4, ONES)
    assert small_conv_applies(8, 1, SMALL_PIXELS, ONES)      # several images too
    assert not small_conv_applies(1, 1, SMALL_PIXELS + 1, ONES)
    assert not small_conv_applies(1, 2, 4, ONES)             # groups: the GEMM paths
    assert not small_conv_applies(1, 1, 4, None)            # weights an input: nothing to pack
    for bad in (np.nan, np.inf, -np.inf):  # a non-finite weight: its taps over the padding count
        assert not small_conv_applies(1, 1, 4, np.where(np.arange(ONES.size).reshape(ONES.shape) == 7, bad, ONES))


def test_non_finite_weights_keep_the_products_with_the_padding():
    """A tap over the padding adds ``w * 0``: nothing for a finite weight, NaN for a NaN or infinite
    one, so every pixel of that output channel is NaN (the reference, ONNX Runtime). The kernels that
    sum the in-bounds taps only (the tiny-map direct one, the tiny depthwise planes) would leave the
    border pixels finite: such weights take the paths that multiply the padding (found by the
    fuzzer's mutants, 0xff bytes written over a depthwise weight: 6 of 288 values finite)."""
    from compiler.ir.graph import Graph
    from compiler.ir.ops import conv as cv
    from compiler.ir.types import DType, TensorType

    rng = np.random.default_rng(5)
    g, feed = Graph("nonfinite"), {}
    for i, (xs, ws, attrs) in enumerate([((1, 8, 2, 2), (6, 8, 3, 3), {}),  # a tiny map (direct kernel)
                                         ((1, 8, 4, 4), (8, 1, 3, 3), dict(group=8)),  # tiny depthwise
                                         ((1, 8, 6, 6), (8, 1, 3, 3), dict(group=8, strides=(2, 2)))]):
        w = rng.standard_normal(ws).astype(np.float32)
        w[1, 0, 0, 0], w[2, 0, 2, 2], w[3, 0, 0, 2] = np.nan, np.inf, -np.inf  # corner taps: over the padding
        x = g.add_input(f"x{i}", TensorType(DType.f32, xs))
        feed[f"x{i}"] = rng.standard_normal(xs).astype(np.float32)
        g.add(cv.Conv(pads=(1, 1, 1, 1), **attrs), x, g.add_constant(w), g.add_constant(np.ones(ws[0], np.float32)))
    g.set_outputs([n.outputs[0] for n in g.nodes], ["y0", "y1", "y2"])
    _, _, plan = build_kernels(g, host_target())
    for _, k in plan:  # (structure) the in-bounds-only kernels refused
        assert not any("in-bounds taps" in note or note.startswith("tiny map") for note in k.notes), k.notes
    got, want = run_kernels(g, feed), interpret(g, feed)
    for name in want:
        assert np.isnan(want[name][0, 1]).all() and not np.isfinite(want[name][0, 2:4]).any()
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(want[name]), err_msg=name)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)


def _bench():
    t = Bench()
    conv(t, (1, 128, 2, 2), 128, (3, 3), pads=(1, 1, 1, 1))                      # ResNet-18@64's layer 4
    conv(t, (1, 64, 4, 4), 64, (3, 3), pads=(1, 1, 1, 1), bias=False)           # its layer 3
    conv(t, (1, 64, 4, 4), 128, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1))      # layer 4's first, stride 2
    conv(t, (1, 64, 4, 4), 128, (1, 1), strides=(2, 2), bias=False)             # its downsampling 1x1/2
    conv(t, (3, 20, 3, 3), 20, (3, 3), pads=(1, 1, 1, 1))                        # 3 images, 20 channels: ragged
    conv(t, (1, 7, 4, 3), 5, (3, 3), pads=(2, 0, 1, 1), dilations=(2, 1))       # fewer channels than lanes
    conv(t, (2, 32, 1, 1), 40, (1, 1))                                           # one pixel (an SE block)
    conv(t, (1, 16, 5, 5), 24, (5, 5), pads=(1, 1, 1, 1), strides=(2, 2))       # 2x2 of a 5x5/2
    conv(t, (1, 6, 11), 9, (3,), strides=(2,), pads=(1, 1))                      # 1-D: 6 wide
    conv(t, (1, 3, 4, 4), 2, (5, 5), pads=(3, 3, 3, 3), strides=(3, 3))         # windows mostly padding
    conv(t, (1, 40, 7, 7), 36, (3, 3), pads=(1, 1, 1, 1))                      # a 7x7 map: 3 pixel groups
    conv(t, (2, 48, 8, 8), 20, (1, 1), bias=False)                               # 8x8, the limit, 2 images
    conv(t, (1, 24, 14, 14), 32, (3, 3), pads=(1, 1, 1, 1), strides=(2, 2))     # 7x7 of a stride 2
    # every tap of every pixel over the padding (the bias alone; found by the fuzzer, seed 60606:
    # a division by the kernel's zero multiply-adds)
    conv(t, (1, 6, 1, 1), 7, (2, 2), pads=(1, 1, 1, 1), strides=(1, 3), dilations=(2, 1))
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    return t


@pytest.mark.parametrize("cpu", ["x86-64-v3", "skylake-avx512"])
def test_small_maps_take_the_direct_kernel(cpu):
    t = _bench()
    target = target_for(cpu)
    _, _, plan = build_kernels(t.g, target)
    for node, (_, k) in zip(t.g.nodes, plan):
        shape = node.outputs[0].shape
        assert int(np.prod(shape[2:])) <= SMALL_PIXELS
        assert any(note.startswith("tiny map: direct") for note in k.notes), k.notes
    # the notes count the pixel-taps computed: ResNet-18's layer 4 does 16 of 36
    assert "(16 of 36 pixel-taps)" in plan[0][1].notes[0]
    check_on(t, target, cpu)


@pytest.mark.parametrize("cpu", ["znver3", "znver4"])
def test_splats_are_one_inlined_helper(cpu):
    """The weights' broadcasts call the module's ``kiln_splat_f32x<lanes>`` (short IR text: llvmlite
    prints an insert and shuffle's constant vectors element by element at every use), which is
    always inlined: no call of it is left in the assembly, and only one definition in the IR."""
    from compiler.codegen.llvm import toolchain

    t = _bench()
    target = target_for(cpu)
    module, _, _ = build_kernels(t.g, target)
    text = str(module)
    assert text.count("define internal <") == 1 and text.count("@\"kiln_splat_f32x") > 20
    assert "kiln_splat" not in toolchain.assembly(text, target)


def test_the_same_bits_on_any_thread_count():
    t = _bench()
    runs = [run_kernels(t.g, t.feed, nthreads=n) for n in (1, 2, 3)]
    for name in runs[0]:
        assert all(np.array_equal(runs[0][name], r[name]) for r in runs[1:]), name


def test_fused_residual_chain_runs_on_each_block():
    """A BasicBlock's second conv with the residual Add and Relu: one kernel, the chain on each
    block of channels as it is computed."""
    g, feeds, want = residual_block(1, 128, 2, 30)
    _, _, plan = build_kernels(g, host_target())
    assert "chain on each block of channels as it is computed" in plan[0][1].notes, plan[0][1].notes
    check_native(g, feeds, want, threads=(1, 2, 3), rtol=1e-4)


def test_refusals_keep_the_gemm_paths():
    t = Bench()
    conv(t, (1, 16, 9, 9), 24, (3, 3), pads=(1, 1, 1, 1))                 # 81 pixels: over the limit
    conv(t, (1, 16, 2, 2), 32, (3, 3), pads=(1, 1, 1, 1), group=2)        # groups
    conv(t, (1, 16, 2, 2), 32, (3, 3), pads=(1, 1, 1, 1), const_w=False)  # weights an input
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, host_target())
    for _, k in plan:
        assert not any(note.startswith("tiny map") for note in k.notes), k.notes
    t.run()
