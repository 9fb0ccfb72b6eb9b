"""MatMulInteger and QLinearMatMul (compiler/codegen/kernels/qmatmul.py): on the loop form, u8/i8
operands both ways, zero points per tensor/row/column, batch broadcasting, 1-D operands, K of 0 and
1, N not a multiple of any vector width; bit-exact against the reference interpreter on the LLVM
printer and in numba's CUDA simulator. With constant weights, on each instruction set the host runs
(AVX-512 VNNI, AVX-512 BW, AVX2): the packed tile kernel (gemm/int8.py), with every correction path (signed A, unsigned B, B's zero point per
column, A's per row), K not a multiple of 4, partial tiles and panels."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.int8_tiles import FAST_NOTE
from compiler.codegen.kernels.qmatmul import MatMulInteger, QLinearMatMul
from compiler.codegen.gemm.int8 import MADD256, VNNI, Int8Tiling, pack_b
from compiler.codegen.kernels.testing import build_kernels, run_cuda_forms, run_kernels
from compiler.codegen.llvm.target import host_target, target_for
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import quant as qn
from compiler.ir.types import DType, TensorType

SHAPES = [((3, 5), (5, 7)), ((2, 3, 17), (17, 33)), ((2, 1, 4, 6), (3, 6, 5)), ((1, 4, 3), (2, 3, 1)),
          ((1, 6, 5), (5, 4)),  # a batch of one (a batch-1 transformer's projections)
          ((6,), (6, 4)), ((2, 6), (6,)), ((4, 1), (1, 19)), ((3, 0), (0, 5))]
TYPES = [(DType.u8, DType.i8), (DType.i8, DType.u8), (DType.u8, DType.u8), (DType.i8, DType.i8)]


def _ints(rng, dt, shape):
    lo, hi = (-128, 128) if dt is DType.i8 else (0, 256)
    return rng.integers(lo, hi, shape).astype(dt.np)


def _graph(shapes=SHAPES, types=TYPES, seed=0):
    rng = np.random.default_rng(seed)
    g = Graph("qmatmul")
    feeds = {}
    for ash, bsh in shapes:
        for adt, bdt in types:
            a = g.add_input(f"a{len(feeds)}", TensorType(adt, ash))
            feeds[a.name] = _ints(rng, adt, ash)
            b = g.add_input(f"b{len(feeds)}", TensorType(bdt, bsh))
            feeds[b.name] = _ints(rng, bdt, bsh)
            m = ash[-2] if len(ash) > 1 else 1
            n = bsh[-1] if len(bsh) > 1 else 1
            za_row = g.add_constant(_ints(rng, adt, (m,) if len(ash) > 1 else ()))
            zb_col = g.add_constant(_ints(rng, bdt, (n,) if len(bsh) > 1 else ()))
            za, zb = g.add_constant(_ints(rng, adt, ())), g.add_constant(_ints(rng, bdt, (1,)))
            g.add(qn.MatMulInteger(), a, b)
            g.add(qn.MatMulInteger(), a, b, za_row, zb_col)
            sa = g.add_constant((rng.random((m,) if len(ash) > 1 else ()) * 0.02 + 0.001).astype(np.float32))
            sb = g.add_constant((rng.random((n,) if len(bsh) > 1 else ()) * 0.02 + 0.001).astype(np.float32))
            for sy, zy in ((g.add_constant(np.float32(0.05)), g.add_constant(_ints(rng, adt, ()))),
                           (g.add_constant(np.full((n,) if len(bsh) > 1 else (), 0.3, np.float32)),
                            g.add_constant(_ints(rng, bdt, (n,) if len(bsh) > 1 else ())))):
                g.add(qn.QLinearMatMul(), a, sa, za, b, sb, zb, sy, zy)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds


def test_on_the_llvm_printer():
    g, feeds = _graph()
    for n in g.nodes:
        low, why = lowering_for(KernelGroup.of_node(n))
        if n.outputs[0].type.numel:
            assert isinstance(low, (MatMulInteger, QLinearMatMul)), (n.describe(), why)
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())


def test_saturation_and_ties():
    """Sums at the ends of int32's range of int8 products, and requantized values that saturate."""
    g = Graph("edges")
    a = g.add_input("a", TensorType(DType.u8, (2, 64)))
    b = g.add_input("b", TensorType(DType.i8, (64, 3)))
    z8, zi = g.add_constant(np.uint8(0)), g.add_constant(np.int8(0))
    s = g.add_constant(np.float32(1.0))
    g.add(qn.MatMulInteger(), a, b)
    g.add(qn.QLinearMatMul(), a, s, z8, b, s, zi, g.add_constant(np.float32(2.0)), g.add_constant(np.uint8(3)))
    g.add(qn.QLinearMatMul(), a, s, z8, b, s, zi, g.add_constant(np.float32(4.0)), g.add_constant(np.int8(-1)))
    g.set_outputs([n.outputs[0] for n in g.nodes])
    feeds = {"a": np.array([[255] * 64, [1, 0] * 32], np.uint8),
             "b": np.stack([np.full(64, -128), np.full(64, 127), np.r_[[1, 0] * 31, [2, 1]]], 1).astype(np.int8)}
    want, got = interpret(g, feeds), run_kernels(g, feeds)
    assert want[g.output_names[0]][0, 0] == 255 * 64 * -128
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())


def test_refusals_name_the_parameter():
    g = Graph("r")
    a = g.add_input("a", TensorType(DType.u8, (2, 3, 4)))
    b = g.add_input("b", TensorType(DType.u8, (4, 5)))
    za = g.add_constant(np.zeros((2, 3, 1), np.uint8))  # [..., M, 1]: valid ONNX, not lowered
    n = g.add(qn.MatMulInteger(), a, b, za).producer
    low, why = lowering_for(KernelGroup.of_node(n))
    assert not isinstance(low, MatMulInteger)
    assert "a_zero_point of shape [2, 3, 1]" in str(why)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds = _graph(shapes=SHAPES[:6], types=TYPES[:2], seed=1)
    want = interpret(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        one = Graph("one")
        ins = [one.add_constant(v.const) if v.const is not None else one.add_input(v.name, v.type) for v in n.inputs]
        one.set_outputs([one.add_node(n.op, ins).outputs[0]])
        got = run_cuda_forms(one, {v.name: feeds[v.name] for v in one.inputs})
        np.testing.assert_array_equal(got[one.output_names[0]], want[name], err_msg=n.describe())


def _constant_b_graph(seed=2):
    rng = np.random.default_rng(seed)
    g = Graph("packed")
    feeds = {}
    for ash, bsh in [((3, 5), (5, 7)), ((2, 3, 17), (17, 33)), ((13, 64), (64, 100)), ((1, 7), (7, 200)),
                     ((9, 1), (1, 3))]:
        for adt, bdt in TYPES:
            a = g.add_input(f"a{len(feeds)}", TensorType(adt, ash))
            feeds[a.name] = _ints(rng, adt, ash)
            b = g.add_constant(_ints(rng, bdt, bsh))
            za, zb = g.add_constant(_ints(rng, adt, ())), g.add_constant(_ints(rng, bdt, (bsh[-1],)))
            zb0 = g.add_constant(np.array(128 if bdt is DType.u8 else 0, bdt.np))  # no rows to sum
            g.add(qn.MatMulInteger(), a, b, za, zb)
            g.add(qn.MatMulInteger(), a, b)
            g.add(qn.MatMulInteger(), a, b, None, zb0)
            if len(ash) == 2:
                g.add(qn.MatMulInteger(), a, b, g.add_constant(_ints(rng, adt, (ash[0],))), zb0)
            sa = g.add_constant(np.float32(0.02))
            sb = g.add_constant((rng.random(bsh[-1]) * 0.01 + 0.001).astype(np.float32))
            g.add(qn.QLinearMatMul(), a, sa, za, b, sb, zb, g.add_constant(np.float32(0.7)),
                  g.add_constant(_ints(rng, adt, ())))
            g.add(qn.QLinearMatMul(), a, sa, za, b, sb, zb0, g.add_constant(np.full(bsh[-1], 0.05, np.float32)),
                  g.add_constant(_ints(rng, bdt, (bsh[-1],))))
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds


#: (target CPU, the note its int8 tiles leave): VNNI, AVX-512 BW without VNNI, AVX2
ISAS = [("icelake-server", "VNNI int8 tiles (vpdpbusd, 512-bit)"),
        ("skylake-avx512", "int8 tiles (vpmaddwd, 512-bit)"), ("x86-64-v3", "int8 tiles (vpmaddwd, 256-bit)")]


@pytest.mark.parametrize("cpu,note", ISAS)
def test_constant_weights_take_the_int8_tiles(cpu, note):
    """Structure on any host: each target gets the tiles of its best instructions; without AVX2 the
    portable loop, saying why."""
    g, _ = _constant_b_graph()
    _, _, plan = build_kernels(g, target_for(cpu))
    assert all(any(n.startswith(note) for n in k.notes) for _, k in plan)
    _, _, plan = build_kernels(g, target_for("x86-64-v2"))
    assert all(any("neither AVX-512 BW nor AVX2" in n for n in k.notes) for _, k in plan)


@pytest.mark.parametrize("cpu", [c for c, _ in ISAS])
def test_int8_tile_numbers(cpu):
    if not target_for(cpu).isa <= host_target().isa:
        pytest.skip(f"this CPU lacks {cpu}'s instructions (test_constant_weights_take_the_int8_tiles checks "
                    f"the kernel is built)")
    g, feeds = _constant_b_graph()
    want, got = interpret(g, feeds), run_kernels(g, feeds, target=target_for(cpu))
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())


@pytest.mark.parametrize("cpu", [c for c, _ in ISAS])
def test_the_float32_requantization_near_ties(cpu):
    """QLinearMatMul's float32 way to its f64 requantization (``int8_tiles.Fast``): a_scale 1 + 2^-23,
    b_scale 1 - 2^-23 (their product 1 - 2^-46), y_scale 2: every odd sum lies just below a tie,
    which float32 (combined scale 0.5) puts on it; those rows are finished again in f64, so every
    value is the reference's, where the fast values alone differ, on the tiles and on the portable
    loop (B an input). Per-column y scales: no fast way."""
    if not target_for(cpu).isa <= host_target().isa:
        pytest.skip(f"this CPU lacks {cpu}'s instructions")
    rng = np.random.default_rng(4)
    g = Graph("ties")
    a = g.add_input("a", TensorType(DType.u8, (9, 20)))
    b = g.add_constant(rng.integers(-3, 4, (20, 70)).astype(np.int8))
    params = [g.add_constant(np.float32(1 + 2.0 ** -23)), g.add_constant(np.uint8(0)), b,
              g.add_constant(np.full(70, 1 - 2.0 ** -23, np.float32)), g.add_constant(np.int8(0))]
    g.add(qn.QLinearMatMul(), a, *params, g.add_constant(np.float32(2.0)), g.add_constant(np.uint8(128)))
    g.add(qn.QLinearMatMul(), a, *params, g.add_constant(np.full(70, 2.0, np.float32)),
          g.add_constant(np.full(70, 128, np.uint8)))
    bi = g.add_input("b", TensorType(DType.i8, (20, 70)))  # B not constant: the portable loop's sums
    g.add(qn.QLinearMatMul(), a, *params[:2], bi, *params[3:], g.add_constant(np.float32(2.0)),
          g.add_constant(np.uint8(128)))
    a3 = g.add_input("a3", TensorType(DType.u8, (2, 1, 20)))  # a batch of two one-row matrices
    g.add(qn.QLinearMatMul(), a3, *params[:2], bi, *params[3:], g.add_constant(np.float32(2.0)),
          g.add_constant(np.uint8(128)))
    g.set_outputs([n.outputs[0] for n in g.nodes])
    _, _, plan = build_kernels(g, target_for(cpu))
    assert [FAST_NOTE in k.notes for _, k in plan] == [True, False, True, True]
    assert any(note.startswith("portable int8 loop (B is not a constant matrix)") for note in plan[2][1].notes)
    feeds = {"a": rng.integers(0, 4, (9, 20)).astype(np.uint8), "b": b.const,
             "a3": rng.integers(0, 4, (2, 1, 20)).astype(np.uint8)}
    want, got = interpret(g, feeds), run_kernels(g, feeds, target=target_for(cpu))
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())
    sums = feeds["a"].astype(np.int64) @ b.const.astype(np.int64)
    fast = np.clip(np.rint(sums.astype(np.float32) * np.float32(0.5)) + 128, 0, 255)
    assert np.count_nonzero(fast != want[g.output_names[0]]) > 0
    np.testing.assert_array_equal(want[g.output_names[2]], want[g.output_names[0]])


def test_constant_weights_on_a_baseline_target_run_the_portable_loop():
    g, feeds = _constant_b_graph(seed=3)
    want, got = interpret(g, feeds), run_kernels(g, feeds, target=target_for("x86-64-v2"))
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())


@pytest.mark.parametrize("isa", [VNNI, MADD256], ids=lambda i: i.name)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_packed_b_layout(dtype, isa):
    """Each packed word holds one column's KPW consecutive k (4 signed bytes for VNNI, 2 signed 16-bit
    values for vpmaddwd) of b' (b - 128 for uint8); the column sums and zero points of the correction
    come with it, zero past N."""
    rng = np.random.default_rng(4)
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    b = rng.integers(lo, hi, (10, 37)).astype(dtype)
    zb = rng.integers(lo, hi, 37).astype(dtype)
    t = Int8Tiling.for_shape(5, 37, isa)
    p = pack_b(b, zb, t)
    shift = 128 if dtype == np.uint8 else 0
    panels, kpw = -(-37 // t.NR), t.KPW
    words = -(-10 // kpw)
    assert p.words.shape == (panels, words, t.NR)
    values = p.words.view(np.int8 if kpw == 4 else np.int16).reshape(panels, words, t.NR, kpw)
    for n in range(37):
        for k in range(words * kpw):
            want = int(b[k, n]) - shift if k < 10 else 0
            assert values[n // t.NR, k // kpw, n % t.NR, k % kpw] == want
    np.testing.assert_array_equal(p.colsum[:37], b.astype(np.int64).sum(0) - 10 * shift)
    np.testing.assert_array_equal(p.zb[:37], zb.astype(np.int32) - shift)
    assert not p.colsum[37:].any() and not p.zb[37:].any()


def _padded(t: Int8Tiling, m: int, n: int, narrow_last: bool) -> int:
    cols = -(-n // t.isa.lanes) * t.isa.lanes if narrow_last else -(-n // t.NR) * t.NR
    return -(-m // t.MR) * t.MR * cols


@pytest.mark.parametrize("narrow_last", [False, True])
def test_the_tile_computes_few_padded_sums(narrow_last):
    """With VNNI the tile fits the registers (at most 24 accumulators, 8 rows, 4 vectors, none past
    M or N) and pads less than the old fixed 6 x 4 wherever a fitting tile pads less by a margin:
    ResNet-50's 7x7 layers (49 pixels as rows) no longer compute 54, the 3x3 layers' 128 channels
    no longer 132 (the W x X path: its last panel narrowed). The vpmaddwd tiles keep their rule."""
    for m in range(1, 70):
        for n in (1, 15, 16, 37, 48, 64, 100, 196, 512, 784):
            t = Int8Tiling.for_shape(m, n, VNNI, narrow_last)
            assert t.MR * t.NV <= 24 and 1 <= t.MR <= min(m, 8) and 1 <= t.NV <= min(4, -(-n // 16)), (m, n, t)
            old = Int8Tiling(MR=min(m, 6), NV=min(4, -(-n // 16)))
            assert _padded(t, m, n, narrow_last) <= 1.1 * _padded(old, m, n, narrow_last), (m, n, t)
    assert Int8Tiling.for_shape(49, 512, VNNI).MR in (5, 7)
    assert Int8Tiling.for_shape(128, 784, VNNI, narrow_last=True).MR == 8
    assert Int8Tiling.for_shape(1, 512, VNNI) == Int8Tiling(MR=1, NV=4)
    assert Int8Tiling.for_shape(0, 0, VNNI) == Int8Tiling(MR=1, NV=1)
    assert Int8Tiling.for_shape(128, 784, MADD256, narrow_last) == Int8Tiling(MR=6, NV=2, isa=MADD256)
