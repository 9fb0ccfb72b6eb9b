"""Kiln's CUDA GEMM (``codegen/cuda/gemm.py``) against its NumPy statement: both tiles, edges smaller
and larger than a tile, transposed operands through strides, batches with broadcast offsets, the bias
with broadcast strides, alpha/beta and the fused ReLU. Runs in numba's CUDA simulator (or on a GPU
with NUMBA_ENABLE_CUDASIM=0)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from compiler.codegen.cuda.gemm import GEMV_ROWS, TILES, GemmCall, choose_tile, gemm_source, grid, reference
from compiler.codegen.cuda.program import HEADER


@functools.lru_cache(maxsize=None)
def _kernel(tile):  # compiled once per tile (on a GPU each compile takes a second)
    ns: dict = {}
    exec(HEADER, ns)
    exec(gemm_source(tile), ns)
    return ns[f"kiln_sgemm_{tile}"]


def _run(tile, call, a, b, c, bias):
    _kernel(tile)[grid(call, tile)](a, b, c, bias if bias is not None else np.zeros(1, np.float32),
                                    call.a_offsets, call.b_offsets, call.c_offsets, *call.scalars())


@pytest.mark.parametrize("tile", sorted(TILES) + ["gemv"])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (4, 7, 3), (17, 33, 20), (70, 9, 17)])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1)])
def test_shapes_and_transposes(tile, M, N, K, ta, tb):
    if tile == "gemv" and M > GEMV_ROWS:
        M = GEMV_ROWS - 1 if K % 2 else 1
    rng = np.random.default_rng(M * 100 + N + K)
    a = rng.standard_normal(M * K).astype(np.float32)
    b = rng.standard_normal(K * N).astype(np.float32)
    call = GemmCall(M, N, K, (1, M) if ta else (K, 1), (1, K) if tb else (N, 1), (N, 1), alpha=0.5)
    got, want = np.full(M * N, np.nan, np.float32), np.zeros(M * N, np.float32)
    _run(tile, call, a, b, got, None)
    reference(call, a, b, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the statement itself, against NumPy's product
    A = a.reshape(K, M).T if ta else a.reshape(M, K)
    B = b.reshape(N, K).T if tb else b.reshape(K, N)
    np.testing.assert_allclose(want.reshape(M, N), 0.5 * A @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", ["s32", "gemv"])
@pytest.mark.parametrize("bias_shape", [(6,), (4, 1), (4, 6), ()])
def test_batches_bias_and_relu(bias_shape, tile):
    rng = np.random.default_rng(1)
    M, N, K, batch = 4, 6, 5, 3
    a = rng.standard_normal(batch * M * K).astype(np.float32)
    b = rng.standard_normal(K * N).astype(np.float32)  # one B for every batch entry (broadcast)
    full = np.broadcast_to(rng.standard_normal(bias_shape).astype(np.float32), (M, N))
    bias = np.array(full).reshape(-1)
    call = GemmCall(M, N, K, (K, 1), (N, 1), (N, 1), np.arange(batch) * M * K, np.zeros(batch, np.int64),
                    np.arange(batch) * M * N, beta=2.0, bias_strides=(N, 1), act=1)
    got, want = np.zeros(batch * M * N, np.float32), np.zeros(batch * M * N, np.float32)
    _run(tile, call, a, b, got, bias)
    reference(call, a, b, want, bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    expect = np.maximum(a.reshape(batch, M, K) @ b.reshape(K, N) + 2.0 * full, 0)
    np.testing.assert_allclose(want.reshape(batch, M, N), expect, rtol=1e-5, atol=1e-5)
    assert (want == 0).any() and (want > 0).any()  # the ReLU cut something and kept something


def test_the_large_tile_only_where_it_fills_the_gpu():
    assert choose_tile(4096, 4096, 1) == "s128"
    assert choose_tile(2048, 2048, 1) == "s64"
    assert choose_tile(64, 64, 1) == "s32"
    assert choose_tile(128, 128, 1000) == "s128"
    assert choose_tile(1, 512, 1) == choose_tile(4, 512, 1) == "gemv"
