"""Kiln's GEMM core (compiler/codegen/gemm): correctness against NumPy, packed operands, threads."""
import ctypes

import numpy as np
import pytest
from llvmlite import ir

from compiler.codegen.gemm import (
    GemmLib,
    build_shared,
    config_for,
    emit_gemm,
    find_openblas,
)
from compiler.codegen.gemm.build import _init_llvm, compile_object
from compiler.codegen.gemm.config import PRESETS, host_isa
from compiler.codegen.gemm.kernel import sgemm_type
from compiler.codegen.gemm.packing import pack_a_numpy, pack_b_numpy
from compiler.codegen.gemm.stream import STREAM_COLS

from ..threads import run_threads

RNG = np.random.default_rng(1234)


def _isas():
    host = host_isa()
    order = ["avx512", "avx2", "sse"]
    return order[order.index(host):] if host in order else [host]


@pytest.fixture(scope="module", params=_isas())
def lib(request):
    return GemmLib(build_shared(config_for(request.param)), config_for(request.param))


@pytest.fixture(scope="module")
def tiny():
    """Host ISA with tiny cache blocks: small matrices then cross every KC/MC/NC boundary."""
    base = config_for()
    cfg = base.replace(KC=7, MC=2 * base.MR, NC=2 * base.NR, par_min_flops=0.0, direct_b_max_m=3,
                       direct_b_narrow_max_m=2 * base.MR)
    return GemmLib(build_shared(cfg), cfg)


def rand(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


def ref(a, b, c=None, alpha=1.0, beta=0.0, ta=False, tb=False):
    a64 = a.astype(np.float64).T if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).T if tb else b.astype(np.float64)
    out = alpha * (a64 @ b64)
    if c is not None and beta != 0:
        out += beta * c.astype(np.float64)
    return out


def check(got, want, k):
    tol = 1e-5 * max(1.0, np.sqrt(k)) * max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


SHAPES = [(1, 1, 1), (1, 512, 784), (2, 3, 4), (7, 13, 5), (13, 1, 9), (1, 37, 300), (5, 17, 1),
          (64, 100, 147), (100, 33, 300), (129, 257, 65), (12, 32, 16), (31, 49, 64),
          (3, 1500, 40), (9, 1500, 40),  # B read in place / packed for a small M
          (40, 1500, 40), (17, 2100, 33)]  # read in place on AVX-512 (rows far apart), packed on AVX2


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_shapes(lib, m, n, k):
    a, b = rand(m, k), rand(k, n)
    check(lib.gemm(a, b), ref(a, b), k)


@pytest.mark.parametrize("m,n,k", [(64, 196, 384), (96, 196, 576), (96, 196, 383), (20, 50, 90), (21, 33, 83)])
def test_narrowing_products(lib, tiny, m, n, k):
    """K >= 4 M: B read in place up to ``direct_b_narrow_max_m`` rows (AVX-512: MobileNetV2's 1x1
    projections; the tiny blocks: 2 row tiles), packed past it or for a K just short of 4 M; on
    1 and 2 threads, with beta."""
    a, b = rand(m, k), rand(k, n)
    for g in (lib, tiny):
        for nthreads in (1, 2):
            c = rand(m, n)
            check(g.gemm(a, b, c.copy(), beta=0.5, nthreads=nthreads), ref(a, b, c, 1.0, 0.5), k)


@pytest.mark.parametrize("ta,tb", [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m,n,k", [(1, 40, 33), (37, 45, 70), (6, 16, 8), (70, 129, 257)])
def test_transposed(lib, ta, tb, m, n, k):
    a = rand(k, m) if ta else rand(m, k)
    b = rand(n, k) if tb else rand(k, n)
    check(lib.gemm(a, b, trans_a=ta, trans_b=tb), ref(a, b, ta=ta, tb=tb), k)


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, -2.0), (-1.5, 0.0), (2.0, 0.25)])
def test_alpha_beta(lib, alpha, beta):
    for m, n, k in [(1, 20, 9), (23, 41, 35), (64, 64, 64)]:
        a, b, c = rand(m, k), rand(k, n), rand(m, n)
        want = ref(a, b, c, alpha, beta)
        check(lib.gemm(a, b, c.copy(), alpha=alpha, beta=beta), want, k)


def test_beta_zero_does_not_read_c(lib):
    a, b = rand(9, 20), rand(20, 33)
    c = np.full((9, 33), np.nan, np.float32)
    check(lib.gemm(a, b, c), ref(a, b), 20)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 9, 11, 17, 19, 20, 24, 25, 26, 27, 33, 36, 40, 41, 44, 49, 196])
def test_narrow_column_remainders(lib, tiny, n):
    """N remainders whose last columns run through the rows-as-lanes kernel where the ISA has one
    (col_tail), alone or after whole vectors (AVX2's 24-wide panels: 9 = 8 + 1, 17 = 16 + 1, 49 =
    2 x 24 + 1; AVX-512's 32: 17 = 16 + 1, 36 = 32 + 4, 40 = 32 + 8, 49 = 32 + 16 + 1, 196 = 6 x 32
    + 4), and past col_tail (11, 20, 44) the masked vector; M with a row remainder too, alpha/beta,
    pre-packed operands, tiny blocks."""
    m, k = 37, 70
    a, b = rand(m, k), rand(k, n)
    for g in (lib, tiny):
        c = rand(m, n)
        check(g.gemm(a, b, c.copy(), alpha=1.5, beta=0.5), ref(a, b, c, 1.5, 0.5), k)
        nan = np.full((m, n), np.nan, np.float32)  # beta 0 does not read C
        check(g.gemm(g.pack_a(a), g.pack_b(b), nan, shape=(m, n, k), nthreads=2), ref(a, b), k)


@pytest.mark.parametrize("isa,tail", [("avx2", 3), ("avx512", 8)])
def test_the_column_tail_kernel_is_built(isa, tail):
    """Structure: the tail kernels of 1..col_tail columns, each called alone and after every count
    of whole vectors a panel has fewer of (its block labels: nv{q}tail{c})."""
    cfg = config_for(isa)
    assert cfg.col_tail == tail
    text = str(emit_gemm(ir.Module(), cfg).module)
    assert f"kiln_sgemm.tail{tail}" in text and f"kiln_sgemm.tail{tail + 1}" not in text
    for q in range(cfg.NV):
        assert f"nv{q}tail1:" in text and f"nv{q}tail{tail}:" in text
    assert f"nv{cfg.NV}tail" not in text


def test_k_zero_and_alpha_zero_scale_c(lib):
    c = rand(5, 7)
    empty_a, empty_b = np.zeros((5, 0), np.float32), np.zeros((0, 7), np.float32)
    check(lib.gemm(empty_a, empty_b, c.copy(), beta=3.0), 3.0 * c, 1)
    check(lib.gemm(empty_a, empty_b, c.copy(), beta=0.0), np.zeros_like(c), 1)
    a, b = np.full((5, 4), np.nan, np.float32), rand(4, 7)
    check(lib.gemm(a, b, c.copy(), alpha=0.0, beta=-1.0), -c, 1)  # BLAS: A, B not read
    assert lib.gemm(np.zeros((0, 4), np.float32), rand(4, 7)).shape == (0, 7)


def test_strided_operands(lib):
    """Sub-matrix views: lda/ldb/ldc larger than the row length."""
    big_a, big_b, big_c = rand(50, 90), rand(80, 70), rand(40, 100)
    a, b, c = big_a[3:40, 5:66], big_b[2:63, 1:51], big_c[1:38, 7:57]
    c0 = c.copy()
    lib.gemm(a, b, c, alpha=1.0, beta=0.5)
    check(c, ref(a, b, c0, 1.0, 0.5), 61)
    untouched = big_c.copy()
    untouched[1:38, 7:57] = c
    np.testing.assert_array_equal(big_c, untouched)  # nothing outside the view written


@pytest.mark.parametrize("m", [1, 2, 3, 5, 11])
@pytest.mark.parametrize("b_form", ["plain", "transposed", "packed"])
def test_few_rows_read_in_place(lib, tiny, m, b_form):
    """Fewer rows than a panel (a batch-1 GEMV): A's rows are read in place, not packed. A strided
    view (lda > K) with beta, on the host config and across the tiny config's K blocks (each block
    reads its own columns of A's rows)."""
    k, n = 45, 70
    big_a = rand(m + 2, k + 9)
    a = big_a[1:m + 1, 4:4 + k]
    b = rand(k, n)
    for g in (lib, tiny):
        if m >= g.cfg.MR:
            continue
        c = rand(m, n)
        want = ref(a, b, c, 1.5, 0.5)
        if b_form == "packed":
            got = g.gemm(a, g.pack_b(b), c.copy(), alpha=1.5, beta=0.5, shape=(m, n, k), nthreads=2)
        elif b_form == "transposed":
            got = g.gemm(a, b.T.copy(), c.copy(), alpha=1.5, beta=0.5, trans_b=True, nthreads=2)
        else:
            got = g.gemm(a, b, c.copy(), alpha=1.5, beta=0.5, nthreads=2)
        check(got, want, k)


def test_the_in_place_row_kernels_are_built():
    """Structure: a kernel reading A in place for each edge row count and panel width, packed or
    in-place B, and none for a full panel of MR rows."""
    cfg = config_for("avx512")
    text = str(emit_gemm(ir.Module(), cfg).module)
    for rows in (1, 2, 4, 8):
        assert f"kiln_sgemm.ukr{rows}x{cfg.NV}_ar" in text and f"kiln_sgemm.ukr{rows}_direct_ar" in text
    assert f"kiln_sgemm.ukr{cfg.MR}x1_ar" not in text



@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [70, 2 * STREAM_COLS + 37])
@pytest.mark.parametrize("layout", ["rows", "transposed"])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_few_rows_stream_b(lib, tiny, m, n, layout, nthreads):
    """A B in place (not pre-packed) against at most ``stream_max_m`` rows (``gemm/stream.py``):
    row-major, streamed a row at a time; transposed, by dot products of A's rows with B's columns
    (rows of memory), a few columns at once and the rest one by one. B a strided view, K odd and
    not a whole number of vectors, columns past whole vectors and past ``STREAM_COLS``, alpha,
    beta (0: C holding NaN is not read) and the epilogue, on every panel of at most NR columns
    exactly once; with 2085 columns B holds more than ``stream_par_min_floats``, so the threads
    share it though the flops are few. M 5 (the register tiles) gives the same numbers."""
    k = 65
    a = rand(m, k)
    if layout == "rows":
        b = rand(k + 3, n + 11)[2:2 + k, 5:5 + n]
        bmem, tb = b, 0
    else:
        bmem = rand(n + 3, k + 11)[2:2 + n, 5:5 + k]
        b, tb = bmem.T, 1
    c0 = rand(m, n)
    fp = ctypes.POINTER(ctypes.c_float)
    for g in (lib, tiny):
        fn = g.lib.kiln_sgemm_ep
        fn.restype = ctypes.c_int32
        fn.argtypes = g.sgemm.argtypes + [ctypes.c_void_p] * 2
        for beta in (0.0, 0.5):
            c = c0.copy() if beta else np.full((m, n), np.nan, np.float32)
            blocks, ep = recording_epilogue()
            rc = fn(0, tb, m, n, k, 1.5, a.ctypes.data_as(fp), k, bmem.ctypes.data_as(fp), bmem.strides[0] // 4,
                    beta, c.ctypes.data_as(fp), n, nthreads, ctypes.cast(ep, ctypes.c_void_p), None)
            assert rc == 0
            check(c, ref(a, b, c0, 1.5, beta), k)
            assert sum((i1 - i0) * (j1 - j0) for i0, i1, j0, j1 in blocks) == m * n
            assert max(j1 - j0 for _, _, j0, j1 in blocks) <= g.cfg.NR



def test_few_rows_random_shapes(lib):
    """Differential check of the few-rows paths (streams, dots, and the tiles past them) on 200
    seeded shapes: 1-5 rows, 1-300 columns (some past 1000), depth 1-89, B plain or transposed, A, B
    and C strided views, alpha, beta (0: C holding NaN), 1 or 2 threads; C's columns outside the
    view are not written."""
    rng = np.random.default_rng(20261207)
    fp = ctypes.POINTER(ctypes.c_float)
    for _ in range(200):
        m, n, k = int(rng.integers(1, 6)), int(rng.integers(1, 300)), int(rng.integers(1, 90))
        n = int(rng.integers(1000, 2200)) if rng.random() < 0.1 else n
        tb, nthreads = int(rng.integers(0, 2)), int(rng.integers(1, 3))
        alpha, beta = float(rng.choice([1.0, -0.5, 2.0])), float(rng.choice([0.0, 1.0, 0.3]))
        pa, pb, pc = (int(x) for x in rng.integers(0, 5, size=3))
        a_mem = rand(m, k + pa)
        b_mem = rand(k, n + pb) if tb == 0 else rand(n, k + pb)
        b = b_mem[:, :n] if tb == 0 else b_mem[:, :k].T
        c_mem = rand(m, n + pc) if beta else np.full((m, n + pc), np.nan, np.float32)
        c0 = c_mem.copy()
        rc = lib.sgemm(0, tb, m, n, k, alpha, a_mem.ctypes.data_as(fp), k + pa, b_mem.ctypes.data_as(fp),
                       b_mem.shape[1], beta, c_mem.ctypes.data_as(fp), n + pc, nthreads)
        assert rc == 0
        check(c_mem[:, :n], ref(a_mem[:, :k], b, c0[:, :n], alpha, beta), k)
        np.testing.assert_array_equal(c_mem[:, n:], c0[:, n:])

def test_the_stream_kernels_are_built():
    """Structure: a streaming kernel and dot kernels (4 columns and 1, AVX-512) per row count up to
    ``stream_max_m``, none with it 0."""
    cfg = config_for("avx512")
    text = str(emit_gemm(ir.Module(), cfg).module)
    assert cfg.stream_max_m >= 1
    for rows in range(1, cfg.stream_max_m + 1):
        assert f"kiln_sgemm.srows{rows}" in text
    assert f"kiln_sgemm.srows{cfg.stream_max_m + 1}" not in text
    for rows, cols in ((1, 4), (1, 1), (4, 4), (4, 1)):
        assert f"kiln_sgemm.sdot{rows}x{cols}" in text
    none = str(emit_gemm(ir.Module(), cfg.replace(stream_max_m=0)).module)
    assert "kiln_sgemm.srows" not in none and "kiln_sgemm.sdot" not in none


def _function_text(text: str, name: str) -> str:
    start = text.index(f'define internal void @"{name}"(')
    return text[start:text.index("\n}\n", start)]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_a_b_in_place_is_prefetched(isa):
    """Structure: the kernels reading B in place prefetch its rows (a read hint at the configured
    locality, one per cache line of the panel and k step, ``prefetch_direct_b`` floats on); the
    packed-B kernels do not (their C prefetches are write hints); none with it 0."""
    cfg = config_for(isa)
    assert cfg.prefetch_direct_b > 0
    hint = f"i32 0, i32 {cfg.prefetch_direct_locality}, i32 1)"
    text = str(emit_gemm(ir.Module(), cfg).module)
    direct, packed = (_function_text(text, f"kiln_sgemm.ukr{cfg.MR}{s}") for s in ("_direct", f"x{cfg.NV}"))
    per_step = -(-cfg.NR // 16)  # one per 64-byte line of the panel's row
    assert direct.count(hint) == per_step * cfg.unroll + per_step, direct.count(hint)  # main loop + remainder
    assert hint not in packed
    off = _function_text(str(emit_gemm(ir.Module(), cfg.replace(prefetch_direct_b=0)).module),
                         f"kiln_sgemm.ukr{cfg.MR}_direct")
    assert hint not in off

@pytest.mark.parametrize("m,n,k", [(1, 512, 784), (37, 45, 70), (130, 50, 300), (12, 64, 5)])
def test_packed_operands(lib, m, n, k):
    cfg = lib.cfg
    a, b = rand(m, k), rand(k, n)
    ap, bp = lib.pack_a(a), lib.pack_b(b)
    np.testing.assert_array_equal(ap, pack_a_numpy(a, cfg))
    np.testing.assert_array_equal(bp, pack_b_numpy(b, cfg))
    np.testing.assert_array_equal(lib.pack_a(a.T.copy(), trans=True), ap)
    np.testing.assert_array_equal(lib.pack_b(b.T.copy(), trans=True), bp)
    want = ref(a, b)
    check(lib.gemm(ap, b, shape=(m, n, k)), want, k)
    check(lib.gemm(a, bp, shape=(m, n, k)), want, k)
    check(lib.gemm(ap, bp, shape=(m, n, k), nthreads=2), want, k)


def test_unaligned_packed_buffers(lib):
    """Packed operands from anywhere (here 4 bytes off a 64-byte boundary) are fine."""
    m, n, k = 30, 70, 40
    a, b = rand(m, k), rand(k, n)
    for packed, args in (("a", (lib.pack_a(a), b)), ("b", (a, lib.pack_b(b)))):
        buf = args[0] if packed == "a" else args[1]
        raw = np.zeros(buf.size + 32, np.float32)
        off = ((-raw.ctypes.data // 4) % 16) + 1
        moved = raw[off:off + buf.size]
        moved[:] = buf
        assert moved.ctypes.data % 64 == 4
        pa, pb = (moved, b) if packed == "a" else (a, moved)
        check(lib.gemm(pa, pb, shape=(m, n, k)), ref(a, b), k)
    ab = np.zeros(lib.pack_b(b).size + 1, np.float32)[1:]
    lib._pack_b(0, k, n, b.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n,
                ab.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))  # the native packer, unaligned
    np.testing.assert_array_equal(ab, pack_b_numpy(b, lib.cfg))


@pytest.mark.parametrize("nthreads", [-1, 0, 1, 2, 3, 8])
def test_threads(lib, nthreads):
    for m, n, k in [(256, 300, 70), (3, 2000, 64), (1000, 20, 50), (64, 64, 512)]:
        a, b = rand(m, k), rand(k, n)
        check(lib.gemm(a, b, nthreads=nthreads), ref(a, b), k)


def test_blocking_edges(tiny):
    """Crossing KC/MC/NC blocks, M remainders of every size, direct-B and packed-B paths."""
    mr = tiny.cfg.MR
    for m in [1, 2, 3, mr - 1, mr, mr + 1, 2 * mr + 3, 5 * mr + mr - 1]:
        for n, k in [(1, 1), (tiny.cfg.NR + 3, 15), (5 * tiny.cfg.NR - 1, 22)]:
            a, b, c = rand(m, k), rand(k, n), rand(m, n)
            want = ref(a, b, c, 0.75, 0.5)
            for nt in (1, 2):
                check(tiny.gemm(a, b, c.copy(), alpha=0.75, beta=0.5, nthreads=nt), want, k)
            check(tiny.gemm(b, a, trans_a=True, trans_b=True, nthreads=2),
                  ref(a, b).T, k)
            check(tiny.gemm(tiny.pack_a(a), tiny.pack_b(b), shape=(m, n, k), nthreads=3),
                  ref(a, b), k)


def test_concurrent_callers(lib):
    """Several Python threads (ctypes drops the GIL) calling at once, each also multithreaded."""
    cases = [(rand(m, k), rand(k, n)) for m, n, k in [(200, 150, 90), (64, 300, 147), (1, 512, 784),
                                                       (33, 65, 129)]]
    wants = [ref(a, b) for a, b in cases]

    def work(i):
        a, b = cases[i % len(cases)]
        for _ in range(15):
            check(lib.gemm(a, b, nthreads=1 + i % 2), wants[i % len(cases)], a.shape[1])

    errors = run_threads(work, 6)
    assert not errors, errors[0]


def test_c_function_pointer(lib):
    """The entry point as generated code sees it: a plain C function pointer."""
    fp = ctypes.POINTER(ctypes.c_float)
    i64, i32, f32 = ctypes.c_int64, ctypes.c_int32, ctypes.c_float
    proto = ctypes.CFUNCTYPE(i32, i32, i32, i64, i64, i64, f32, fp, i64, fp, i64, f32, fp, i64, i32)
    sgemm = proto(lib.address)
    a, b = rand(20, 30), rand(30, 40)
    c = np.zeros((20, 40), np.float32)
    rc = sgemm(0, 0, 20, 40, 30, 1.0, a.ctypes.data_as(fp), 30, b.ctypes.data_as(fp), 40, 0.0,
               c.ctypes.data_as(fp), 40, 2)
    assert rc == 0
    check(c, ref(a, b), 30)


@pytest.mark.parametrize("nthreads", [1, 2])
def test_caller_packs_b(tiny, nthreads):
    """``kiln_sgemm_cb``: the caller's ``pb`` makes each block of B that a task multiplies (as a conv
    packs its im2col windows); every block it is asked for lies in B, the blocks cover B for
    every task, and the product is right (tiny blocks: many K depths and column ranges)."""
    NR = tiny.cfg.NR
    # several NC column blocks and a partial panel whatever the host's register tile
    m, n, k = 13, 2 * tiny.cfg.NC + NR // 2 + 1, 30
    a, b = rand(m, k), rand(k, n)
    asked = []
    fp = ctypes.POINTER(ctypes.c_float)
    i64 = ctypes.c_int64

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, i64, i64, i64, i64, fp)
    def pack(ctx, p0, kc, j0, nc, dst):
        assert 0 <= p0 < p0 + kc <= k and 0 <= j0 < j0 + nc <= n and j0 % NR == 0
        asked.append((p0, kc, j0, nc))
        panels = -(-nc // NR)
        block = np.zeros((kc, panels * NR), np.float32)
        block[:, :nc] = b[p0:p0 + kc, j0:j0 + nc]
        out = np.ctypeslib.as_array(dst, (panels, kc, NR))
        out[...] = block.reshape(kc, panels, NR).transpose(1, 0, 2)

    fn = tiny.lib.kiln_sgemm_cb
    fn.restype = ctypes.c_int32
    fn.argtypes = tiny.sgemm.argtypes + [ctypes.c_void_p] * 4
    c = np.full((m, n), np.nan, np.float32)
    rc = fn(0, 0, m, n, k, 1.0, a.ctypes.data_as(fp), k, None, 0, 0.0, c.ctypes.data_as(fp), n, nthreads,
            None, None, ctypes.cast(pack, ctypes.c_void_p), None)
    assert rc == 0
    check(c, ref(a, b), k)
    assert len({(p0, kc) for p0, kc, _, _ in asked}) > 1 and len({j0 for _, _, j0, _ in asked}) > 1


def recording_epilogue():
    """(blocks, ep): an ``ep(epctx, i0, i1, j0, j1)`` for ``kiln_sgemm_ep``/``_taps`` appending each
    block it is called on to ``blocks``."""
    blocks = []
    i64 = ctypes.c_int64

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, i64, i64, i64, i64)
    def ep(ctx, i0, i1, j0, j1):
        blocks.append((i0, i1, j0, j1))

    return blocks, ep


@pytest.mark.parametrize("m", [5, 13, 32, 70])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_taps_read_b_in_groups(lib, tiny, m, nthreads):
    """``kiln_sgemm_taps``: B's row k is ``B + boff[k // bgroup] + (k % bgroup) * ldb`` (a conv's taps
    read in place from padded planes); B read in place (small M) or packed from those rows (M 70;
    the tiny-block config packs from M 4), columns past a multiple of NR, beta and the epilogue."""
    groups, bgroup, ldb, n = 9, 11, 300, 150
    planes = rand(bgroup * ldb + 80)
    boff = np.array([(t // 3) * 17 + t % 3 for t in range(groups)], np.int64)
    rows = [boff[k // bgroup] + (k % bgroup) * ldb for k in range(groups * bgroup)]
    bm = np.stack([planes[r:r + n] for r in rows])  # the B the taps describe
    a = rand(m, groups * bgroup)
    c0 = rand(m, n)
    blocks, ep = recording_epilogue()
    fp = ctypes.POINTER(ctypes.c_float)
    i64 = ctypes.c_int64

    for g in (lib, tiny):
        fn = g.lib.kiln_sgemm_taps
        fn.restype = ctypes.c_int32
        fn.argtypes = g.sgemm.argtypes + [ctypes.c_void_p] * 5 + [i64]
        for beta in (0.0, 0.5):
            c = c0.copy()
            blocks.clear()
            rc = fn(0, 0, m, n, a.shape[1], 1.0, a.ctypes.data_as(fp), a.shape[1], planes.ctypes.data_as(fp), ldb,
                    beta, c.ctypes.data_as(fp), n, nthreads, ctypes.cast(ep, ctypes.c_void_p), None, None, None,
                    boff.ctypes.data, bgroup)
            assert rc == 0
            check(c, ref(a, bm, c0, beta=beta), a.shape[1])
            assert sum((i1 - i0) * (j1 - j0) for i0, i1, j0, j1 in blocks) == m * n  # each block once, final


@pytest.mark.parametrize("isa", [i for i in _isas() if i != "sse"])
@pytest.mark.parametrize("m", [64, 96])
def test_task_grid_balances_the_threads(isa, m):
    """The task grid is chosen by the most padded area a thread's range of tasks covers: a 14x14
    projection (M = 64 or 96 rows, N = 196 pixels) on 2 threads gives both threads' ranges equal
    areas (by rounds of full tasks, a grid of 4 column tasks, the last one 4 pixels wide, gave one
    thread 4 tile columns and the other 3). The tasks are read from the blocks the epilogue gets,
    one per task with the AVX-512 and AVX2 register tiles (SSE's come a panel at a time)."""
    cfg = config_for(isa)
    lib = GemmLib(build_shared(cfg), cfg)
    n, k, threads = 196, 384, 2
    a, b = rand(m, k), rand(k, n)
    blocks, ep = recording_epilogue()
    fp = ctypes.POINTER(ctypes.c_float)
    fn = lib.lib.kiln_sgemm_ep
    fn.restype = ctypes.c_int32
    fn.argtypes = lib.sgemm.argtypes + [ctypes.c_void_p] * 2
    c = np.zeros((m, n), np.float32)
    rc = fn(0, 0, m, n, k, 1.0, a.ctypes.data_as(fp), k, b.ctypes.data_as(fp), n, 0.0, c.ctypes.data_as(fp), n,
            threads, ctypes.cast(ep, ctypes.c_void_p), None)
    assert rc == 0
    check(c, ref(a, b), k)
    rows, cols = sorted({(i0, i1) for i0, i1, _, _ in blocks}), sorted({(j0, j1) for _, _, j0, j1 in blocks})
    assert len(blocks) == len(rows) * len(cols)  # (a grid: each task one block here)
    pad = lambda v, t: -(-v // t) * t  # noqa: E731
    areas = [pad(i1 - i0, cfg.MR) * pad(j1 - j0, cfg.NR) for i0, i1 in rows for j0, j1 in cols]
    ranges = [sum(areas[t * len(areas) // threads:(t + 1) * len(areas) // threads]) for t in range(threads)]
    assert len(areas) >= threads and ranges[0] == ranges[1], (rows, cols, ranges)


@pytest.mark.parametrize("isa", [i for i in _isas() if i != "sse"])
@pytest.mark.parametrize("m, n", [(128, 784), (32, 169)])
def test_task_grid_splits_uneven_panels(isa, m, n):
    """Panels that do not split evenly into T * tasks_per_thread column tasks: the grid search also
    tries up to twice as many, so that the two threads' ranges differ by at most one column of
    tiles (ResNet-50's 3x3/2 conv, M 128 x N 784 in 25 panels of 32, on 2 threads: 4 column tasks of
    7, 7, 7 and 4 panels gave 14 and 11; SqueezeNet's 13x13 maps, N 169). The tasks are read from
    the blocks of B the GEMM asks the caller to pack (``kiln_sgemm_cb``: each task packs its own)."""
    cfg = config_for(isa)
    lib = GemmLib(build_shared(cfg), cfg)
    k, threads = 384, 2  # (over the serial threshold)
    a, b = rand(m, k), rand(k, n)
    asked = []
    fp = ctypes.POINTER(ctypes.c_float)
    i64 = ctypes.c_int64
    NR = cfg.NR

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, i64, i64, i64, i64, fp)
    def pack(ctx, p0, kc, j0, nc, dst):
        if p0 == 0:  # (the first block of depth of each task)
            asked.append((j0, nc))
        panels = -(-nc // NR)
        block = np.zeros((kc, panels * NR), np.float32)
        block[:, :nc] = b[p0:p0 + kc, j0:j0 + nc]
        np.ctypeslib.as_array(dst, (panels, kc, NR))[...] = block.reshape(kc, panels, NR).transpose(1, 0, 2)

    fn = lib.lib.kiln_sgemm_cb
    fn.restype = ctypes.c_int32
    fn.argtypes = lib.sgemm.argtypes + [ctypes.c_void_p] * 4
    c = np.zeros((m, n), np.float32)
    rc = fn(0, 0, m, n, k, 1.0, a.ctypes.data_as(fp), k, None, 0, 0.0, c.ctypes.data_as(fp), n, threads,
            None, None, ctypes.cast(pack, ctypes.c_void_p), None)
    assert rc == 0
    check(c, ref(a, b), k)
    cols = sorted(set(asked))
    assert len(asked) % len(cols) == 0 and sum(nc for _, nc in cols) == n
    gm = len(asked) // len(cols)  # rows of tasks (each packs the columns of its task again)
    panels = [-(-nc // NR) for _, nc in cols] * gm  # row-major tasks, rows alike up to the last's tiles
    ranges = [sum(panels[t * len(panels) // threads:(t + 1) * len(panels) // threads]) for t in range(threads)]
    assert len(panels) >= threads and max(ranges) - min(ranges) <= 1, (cols, gm, ranges)


def test_linked_into_a_generated_module(tmp_path):
    """The code generator's path: emit_gemm into its own module, call it from its own function."""
    import subprocess

    llvm = _init_llvm()
    cfg = config_for()
    mod = ir.Module("model")
    mod.triple = llvm.get_process_triple()
    sgemm = emit_gemm(mod, cfg, prefix="model_sgemm")
    f32p = ir.FloatType().as_pointer()
    fwd = ir.Function(mod, ir.FunctionType(ir.IntType(32), [f32p, f32p, f32p]), "forward")
    x, w, y = fwd.args
    bld = ir.IRBuilder(fwd.append_basic_block())
    i32 = lambda v: ir.Constant(ir.IntType(32), v)  # noqa: E731
    i64 = lambda v: ir.Constant(ir.IntType(64), v)  # noqa: E731
    f32 = lambda v: ir.Constant(ir.FloatType(), v)  # noqa: E731
    # y[8, 24] = x[8, 16] @ w[24, 16]^T  (a Linear layer, weight stored out x in)
    rc = bld.call(sgemm, [i32(0), i32(1), i64(8), i64(24), i64(16), f32(1.0), x, i64(16), w,
                          i64(16), f32(0.0), y, i64(24), i32(2)])
    bld.ret(rc)
    obj, _ = compile_object(str(mod), cfg)
    (tmp_path / "m.o").write_bytes(obj)
    subprocess.run(["cc", "-shared", "-o", str(tmp_path / "m.so"), str(tmp_path / "m.o"),
                    "-lpthread"], check=True)
    so = ctypes.CDLL(str(tmp_path / "m.so"))
    fp = ctypes.POINTER(ctypes.c_float)
    so.forward.argtypes = [fp, fp, fp]
    so.forward.restype = ctypes.c_int32
    xv, wv = rand(8, 16), rand(24, 16)
    yv = np.zeros((8, 24), np.float32)
    assert so.forward(xv.ctypes.data_as(fp), wv.ctypes.data_as(fp), yv.ctypes.data_as(fp)) == 0
    check(yv, ref(xv, wv, tb=True), 16)
    assert not hasattr(so, "model_sgemm.ukr1") and hasattr(so, "model_sgemm_pack_b")


def test_bad_config():
    with pytest.raises(ValueError):
        config_for().replace(MC=7 * config_for().MR + 1).validate()
    with pytest.raises(ValueError):
        config_for("mips")


def test_numpy_openblas():
    """Option A (docs/gemm.md): the OpenBLAS inside NumPy's wheel, called by address."""
    ob = find_openblas()
    if ob is None:
        pytest.skip("this NumPy does not bundle OpenBLAS")
    assert ob.sgemm_address
    a, b, c = rand(33, 20), rand(20, 17), rand(33, 17)
    check(ob.gemm(a, b, c.copy(), alpha=2.0, beta=0.5), ref(a, b, c, 2.0, 0.5), 20)
    check(ob.gemm(a.T.copy(), b.T.copy(), trans_a=True, trans_b=True), ref(a, b), 20)


def test_with_the_llvm_toolchain(tmp_path):
    """Built the way the code generator builds artifacts (compiler.codegen.llvm), for an AVX2 CPU."""
    target_mod = pytest.importorskip("compiler.codegen.llvm.target")
    toolchain = pytest.importorskip("compiler.codegen.llvm.toolchain")
    from compiler.codegen.gemm import config_for_target

    target = target_mod.target_for("x86-64-v3")
    if host_isa() not in ("avx2", "avx512"):
        pytest.skip("host cannot run AVX2 code")
    cfg = config_for_target(target)
    assert (cfg.isa, cfg.cpu) == ("avx2", "x86-64-v3")
    mod = ir.Module("m")
    mod.triple = target.triple
    emit_gemm(mod, cfg)
    obj = toolchain.compile_ir(str(mod), target)
    path = toolchain.link_shared([obj], tmp_path / "g.so", extra_args=["-lpthread"])
    lib = GemmLib(str(path), cfg)
    a, b = rand(70, 90), rand(90, 50)
    check(lib.gemm(a, b, nthreads=2), ref(a, b), 90)


def test_the_declared_entry_type_is_the_emitted_one():
    """Kernels declare ``kiln_sgemm`` with ``sgemm_type()`` (no GEMM emitted to learn it): it must be
    the type of the entry every preset emits."""
    for cfg in PRESETS.values():
        assert str(emit_gemm(ir.Module("g"), cfg).function_type) == str(sgemm_type())
