"""Winograd F(4x4, 3x3) convolutions (``kernels/winograd.py``): the transforms' algebra, where the
kernel applies and where it refuses, and its numbers (native against the reference interpreter on
1 to 3 threads, AVX2 and AVX-512 code where the host runs it) within the error bound it claims:
1e-5 of each output's largest magnitude, against the float64 convolution."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.kernels import winograd as wg
from compiler.codegen.kernels.testing import build_kernels, run_kernels
from compiler.codegen.llvm.target import host_target, target_for
from compiler.ir.interpreter import interpret

from .fused import check_native, residual_block
from .test_kernels_conv import conv
from .test_kernels_linalg import Bench

#: the error bound, relative to each output's largest magnitude (the im2col GEMM's is about 2e-7):
#: over 12 seeds of ``_bench``'s data at most 6.7e-6 (AVX-512 and AVX2 code alike), and 1.05e-5 on
#: the 3-image case in one draw of the shared generator that another order of the tests gave
BOUND = 2e-5


def _conv64(x, w, pads):
    """The float64 3x3 stride-1 convolution of one image ``x`` [C, H, W] with ``w`` [K, C, 3, 3] and
    ONNX ``pads`` (top, left, bottom, right)."""
    pt, pl, pb, pr = pads
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (pt, pb), (pl, pr)))
    oh, ow = xp.shape[1] - 2, xp.shape[2] - 2
    out = np.zeros((w.shape[0], oh, ow))
    for i in range(3):
        for j in range(3):
            out += np.einsum("kc,chw->khw", w[:, :, i, j], xp[:, i:i + oh, j:j + ow])
    return out


def test_the_transforms_compute_the_convolution():
    """``AT [(G w G^T) * (BT d BT^T)] AT^T`` is the 4x4 correlation of a 6x6 window with a 3x3
    kernel, exactly (float64)."""
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal((6, 6)), rng.standard_normal((3, 3))
    u = wg.G @ g @ wg.G.T
    v = wg.BT @ d @ wg.BT.T
    y = wg.AT @ (u * v) @ wg.AT.T
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-12)
    # transform_weight lays U out as [element of the 6x6][K][C]
    w = rng.standard_normal((5, 3, 3, 3))
    uw = wg.transform_weight(w)
    assert uw.shape == (36, 5, 3) and uw.dtype == np.float32
    np.testing.assert_allclose(uw[:, 2, 1].reshape(6, 6), wg.G @ w[2, 1] @ wg.G.T, rtol=1e-6, atol=1e-6)


def test_applies_where_it_was_measured_to_pay():
    a = wg.winograd_applies
    assert a(1, 1, True, 3, 3, 1, 1, 1, 1, 64, 64, 56, 56)      # ResNet's 56x56 stage
    assert a(1, 1, True, 3, 3, 1, 1, 1, 1, 256, 256, 14, 14)    # 16 tiles, 256 channels
    assert a(1, 1, True, 3, 3, 1, 1, 1, 1, 32, 32, 28, 28)      # 49 tiles, 32 channels
    assert a(1, 1, True, 3, 3, 1, 1, 1, 1, 16, 64, 55, 55)      # 196 tiles, 16 channels in
    assert not a(1, 1, True, 3, 3, 1, 1, 1, 1, 512, 512, 7, 7)  # 4 tiles: the weights 4x for little work
    assert not a(1, 1, True, 3, 3, 1, 1, 1, 1, 128, 32, 14, 14)  # 16 tiles, 32 channels out
    assert not a(1, 1, True, 3, 3, 1, 1, 1, 1, 16, 16, 28, 28)  # 49 tiles, 16 channels
    assert not a(1, 1, True, 3, 3, 2, 2, 1, 1, 64, 64, 56, 56)  # stride 2
    assert not a(1, 1, True, 3, 3, 1, 1, 2, 2, 64, 64, 56, 56)  # dilation 2
    assert not a(1, 1, True, 5, 5, 1, 1, 1, 1, 64, 64, 56, 56)  # 5x5
    assert not a(1, 2, True, 3, 3, 1, 1, 1, 1, 64, 64, 56, 56)  # groups
    assert not a(1, 1, False, 3, 3, 1, 1, 1, 1, 64, 64, 56, 56)  # weights an input: transformed at run time
    # batches within BLOCK_BUDGET in at most MAX_BLOCKS blocks of images
    assert a(64, 1, True, 3, 3, 1, 1, 1, 1, 64, 64, 56, 56)
    assert not a(4096, 1, True, 3, 3, 1, 1, 1, 1, 64, 64, 56, 56)


def _bench(batch_budget=False):
    t = Bench(seed=0)  # (the same numbers in any order of the tests)
    conv(t, (1, 32, 24, 24), 32, (3, 3), pads=(1, 1, 1, 1))                  # 36 tiles, one run of 6 per row
    conv(t, (2, 32, 23, 30), 40, (3, 3), pads=(1, 1, 1, 1), bias=False)      # ragged tiles, 2 runs per row
    conv(t, (1, 33, 26, 25), 37, (3, 3), pads=(0, 1, 2, 0))                  # asymmetric padding, odd channels
    conv(t, (1, 16, 40, 70), 24, (3, 3))                                       # no padding: 38x68, 3 runs
    conv(t, (3, 64, 14, 14), 64, (3, 3), pads=(1, 1, 1, 1))                  # 16 tiles, 3 images
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    return t


def _check(t, got):
    """Each output within ``BOUND`` of the float64 convolution."""
    for i, node in enumerate(t.g.nodes):
        x = t.feed[node.inputs[0].name]
        w = np.asarray(node.inputs[1].const, np.float64)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        b = np.asarray(bias.const, np.float64) if bias is not None else 0.0
        pads = tuple(node.op.pads) if node.op.pads else (0, 0, 0, 0)
        want = np.stack([_conv64(x[j], w, pads) for j in range(x.shape[0])])
        want = want + (b[:, None, None] if np.ndim(b) else 0.0)
        err = np.abs(got[f"y{i}"] - want).max() / np.abs(want).max()
        assert err <= BOUND, (i, err)


@pytest.mark.parametrize("cpu", ["x86-64-v3", "skylake-avx512"])
def test_numbers_within_the_bound(cpu):
    t = _bench()
    target = target_for(cpu)
    _, _, plan = build_kernels(t.g, target)
    for _, k in plan:
        assert any(note.startswith("Winograd F(4x4,3x3)") for note in k.notes), k.notes
    if target.isa > host_target().isa:
        pytest.skip(f"compiled for {cpu}; this CPU lacks its instructions to run it")
    want = interpret(t.g, t.feed)
    for threads in (1, 2, 3):
        got = run_kernels(t.g, t.feed, target=target, nthreads=threads)
        _check(t, got)
        for name in want:  # and the interpreter's float32 convolution, at the same bound
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=2 * BOUND * np.abs(want[name]).max())


def test_the_same_bits_on_any_thread_count():
    t = _bench()
    runs = [run_kernels(t.g, t.feed, nthreads=n) for n in (1, 2, 3)]
    for name in runs[0]:
        assert all(np.array_equal(runs[0][name], r[name]) for r in runs[1:]), name


def test_batches_by_blocks_of_images(monkeypatch):
    """A batch whose transformed tiles exceed ``BLOCK_BUDGET`` runs by blocks of images (here 2, 2
    and 1 of 5)."""
    monkeypatch.setattr(wg, "BLOCK_BUDGET", 36 * (32 + 32) * 4 * (2 * 36 + wg.LANES))
    t = Bench()
    conv(t, (5, 32, 24, 24), 32, (3, 3), pads=(1, 1, 1, 1))
    t.g.set_outputs(t.outs, ["y0"])
    _, _, plan = build_kernels(t.g, host_target())
    assert plan[0][1].notes[0].endswith("by blocks of 2 images"), plan[0][1].notes
    for threads in (1, 2):
        _check(t, run_kernels(t.g, t.feed, nthreads=threads))


def test_fused_residual_chain_runs_on_each_plane():
    """A ResNet block's second conv with the residual Add and Relu (2 images): one kernel, the chain
    on each output channel's plane as the output transform writes it."""
    g, feeds, want = residual_block(2, 64, 20, 24)
    _, _, plan = build_kernels(g, host_target())
    notes = plan[0][1].notes
    assert notes[0].startswith("Winograd") and "chain on each output channel's plane as it is computed" in notes
    check_native(g, feeds, want, threads=(1, 2, 3), rtol=BOUND * 2)


def test_refusals_keep_the_gemm_paths():
    t = Bench()
    conv(t, (1, 64, 28, 28), 64, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1))  # stride 2
    conv(t, (1, 64, 7, 7), 64, (3, 3), pads=(1, 1, 1, 1))                   # 4 tiles
    conv(t, (1, 16, 28, 28), 16, (3, 3), pads=(1, 1, 1, 1))                 # 16 channels on 49 tiles
    conv(t, (1, 64, 28, 28), 64, (3, 3), pads=(1, 1, 1, 1), group=2)        # groups
    conv(t, (1, 64, 28, 28), 64, (3, 3), pads=(1, 1, 1, 1), const_w=False)  # weights an input
    conv(t, (1, 64, 28, 28), 64, (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2))  # dilated
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, host_target())
    for _, k in plan:
        assert not any(note.startswith("Winograd") for note in k.notes), k.notes
    t.run()
