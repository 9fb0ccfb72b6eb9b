"""ConvInteger and QLinearConv (compiler/codegen/kernels/qconv.py): pads, strides, dilations, 1x1, no input
channels,
groups (depthwise), u8/i8 operands, zero points per tensor and per output channel, QLinearConv's int32
bias; bit-exact against the reference interpreter on the portable loop form (an AVX2 target and
numba's CUDA simulator) and, for constant weights of one group, on the im2col + int8 tile kernel of
each instruction set (AVX-512 VNNI, AVX-512 BW, AVX2) the host can run."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.int8_tiles import FAST_NOTE
from compiler.codegen.kernels.qconv import POINTWISE_MAX_CHANNELS, POINTWISE_MAX_DEPTH, ConvInteger, QLinearConv
from compiler.codegen.kernels.testing import build_kernels, run_cuda_forms, run_kernels
from compiler.codegen.llvm.target import host_target, target_for
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import quant as qn
from compiler.ir.types import DType, TensorType

CASES = [((1, 3, 7, 7), (4, 3, 3, 3), dict(pads=(1, 1, 1, 1))), ((2, 5, 9, 8), (6, 5, 3, 3), dict(strides=(2, 2))),
         ((1, 4, 6, 6), (8, 4, 1, 1), {}), ((1, 4, 9, 9), (4, 1, 3, 3), dict(group=4, pads=(1, 1, 1, 1))),
         # depthwise (the float32 kernel on the integers): stride 2 with a channel multiplier of 2 over
         # two images; grouped but not depthwise (the portable loop)
         ((2, 3, 12, 11), (6, 1, 3, 3), dict(group=3, strides=(2, 2), pads=(1, 1, 1, 1))),
         ((2, 3, 1, 9), (3, 1, 1, 3), dict(group=3, pads=(0, 1, 0, 1))),  # depthwise on one-row images
         ((1, 6, 7, 7), (4, 3, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),
         ((1, 2, 8, 8), (3, 2, 2, 3), dict(dilations=(2, 1), pads=(0, 1, 2, 0))),
         ((1, 70, 5, 5), (20, 70, 3, 3), dict(pads=(1, 1, 1, 1))),
         ((2, 0, 4, 4), (3, 0, 3, 3), {}),  # no input channels: K = 0
         # 1x1 as W x X (the input packed at run time): two images of whole panels; a partial panel
         # and channels not a multiple of 4; many output channels from few input channels on a small
         # image; and the im2col path for many of both on a small image
         ((2, 6, 8, 8), (20, 6, 1, 1), {}), ((1, 5, 9, 9), (3, 5, 1, 1), {}), ((1, 3, 4, 4), (260, 3, 1, 1), {}),
         ((1, 512, 2, 2), (256, 512, 1, 1), {}),
         # a last panel whose pixels need fewer vectors than a tile has (by a tile of that many):
         # 14x14 over two images (196 = 3 x 64 + 4 pixels with 512-bit vectors), and as W x cols 11x16
         # (176 = 2 x 64 + 48)
         ((2, 6, 14, 14), (10, 6, 1, 1), {}), ((1, 4, 11, 16), (5, 4, 3, 3), dict(pads=(1, 1, 1, 1))),
         # the same path on size-1 axes (one pixel, one channel) and on no input channels (K = 0)
         ((3, 1, 1, 1), (2, 1, 1, 1), {}), ((2, 0, 3, 3), (4, 0, 1, 1), {}),
         # other shapes as W x cols (output pixels filling 64-pixel panels, the input packed per
         # tap): padding with channels not a multiple of 4, stride 2 over two images, dilation and a
         # 1x1 with padding; 7x7 of stride 2 on 3 channels (a stem)
         ((1, 5, 8, 8), (6, 5, 3, 3), dict(pads=(1, 1, 1, 1))),
         ((2, 4, 16, 16), (3, 4, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
         ((1, 3, 10, 10), (4, 3, 3, 3), dict(dilations=(2, 2), pads=(1, 1, 1, 1))),
         ((1, 8, 6, 6), (5, 8, 1, 1), dict(pads=(1, 1, 1, 1))),
         ((1, 3, 15, 15), (7, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3))),
         # small images with channels a multiple of 4 (the NHWC copy read in place per tap): padding,
         # stride 2 with uneven padding over two images, dilation; a 1x1 of stride 2 keeps its im2col
         ((1, 8, 7, 7), (6, 8, 3, 3), dict(pads=(1, 1, 1, 1))),
         ((2, 12, 9, 8), (5, 12, 3, 3), dict(strides=(2, 2), pads=(1, 0, 1, 2))),
         ((1, 4, 9, 9), (3, 4, 3, 3), dict(dilations=(2, 2), pads=(2, 2, 2, 2))),
         ((1, 8, 9, 9), (300, 8, 1, 1), dict(strides=(2, 2))),
         # size-1 and size-0 axes on both: a one-row image of one channel (W x cols), a one-row image
         # (NHWC taps), no input channels on a panel-filling image (W x cols with K = 0)
         ((1, 1, 1, 64), (3, 1, 1, 3), dict(pads=(0, 1, 0, 1))),
         ((2, 4, 1, 9), (2, 4, 1, 3), dict(pads=(0, 1, 0, 1))),
         ((1, 0, 8, 8), (3, 0, 3, 3), dict(pads=(1, 1, 1, 1)))]
TYPES = [(DType.u8, DType.i8), (DType.i8, DType.i8), (DType.u8, DType.u8)]


def _ints(rng, dt, shape):
    lo, hi = (-128, 128) if dt is DType.i8 else (0, 256)
    return rng.integers(lo, hi, shape).astype(dt.np)


def _transposed(n) -> bool:
    """Whether ``n`` takes the W x cols path on an ISA with int8 tiles (``qconv._transposed``)."""
    w, y = n.inputs[3] if isinstance(n.op, qn.QLinearConv) else n.inputs[1], n.outputs[0]
    p = int(y.shape[2]) * int(y.shape[3])
    if tuple(w.shape[2:]) == (1, 1) and not n.op.pads and not n.op.strides:
        return int(w.shape[0]) < 256
    return p >= 0.9 * -(-p // 64) * 64


def _graph(cases=CASES, types=TYPES, constant_w=True, seed=0):
    rng = np.random.default_rng(seed)
    g = Graph("qconv")
    feeds = {}
    for xs, ws, attrs in cases:
        for xdt, wdt in types:
            x = g.add_input(f"x{len(feeds)}", TensorType(xdt, xs))
            feeds[x.name] = _ints(rng, xdt, xs)
            if constant_w:
                w = g.add_constant(_ints(rng, wdt, ws))
            else:
                w = g.add_input(f"w{len(feeds)}", TensorType(wdt, ws))
                feeds[w.name] = _ints(rng, wdt, ws)
            zx = g.add_constant(_ints(rng, xdt, ()))
            zw, zw0 = g.add_constant(_ints(rng, wdt, (ws[0],))), g.add_constant(np.array(0, wdt.np))
            g.add(qn.ConvInteger(**attrs), x, w, zx, zw)
            g.add(qn.ConvInteger(**attrs), x, w)
            sx = g.add_constant(np.float32(0.02))
            sw = g.add_constant((rng.random(ws[0]) * 0.01 + 0.001).astype(np.float32))
            bias = g.add_constant(rng.integers(-1000, 1000, ws[0]).astype(np.int32))
            g.add(qn.QLinearConv(**attrs), x, sx, zx, w, sw, zw0, g.add_constant(np.float32(0.3)),
                  g.add_constant(_ints(rng, xdt, ())), bias)
            g.add(qn.QLinearConv(**attrs), x, sx, zx, w, sw, zw, g.add_constant(np.float32(0.7)),
                  g.add_constant(_ints(rng, wdt, ())))
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds


def _check(g, got, want):
    for n, name in zip(g.nodes, g.output_names):
        np.testing.assert_array_equal(got[name], want[name], err_msg=n.describe())


#: (target CPU, the note its int8 tiles leave): VNNI, AVX-512 BW without VNNI, AVX2
ISAS = [("icelake-server", "VNNI int8 tiles (vpdpbusd, 512-bit)"),
        ("skylake-avx512", "int8 tiles (vpmaddwd, 512-bit)"), ("x86-64-v3", "int8 tiles (vpmaddwd, 256-bit)")]


def _runs_here(cpu: str) -> bool:
    return target_for(cpu).isa <= host_target().isa


@pytest.mark.parametrize("cpu", [c for c, _ in ISAS])
def test_a_zero_point_known_at_run_time(cpu):
    """int8-dynamic: DynamicQuantizeLinear gives x's zero point at run time; the 1x1 convolution's
    W x X path reads it per call for its correction."""
    if not _runs_here(cpu):
        pytest.skip(f"this CPU lacks {cpu}'s instructions")
    rng = np.random.default_rng(7)
    g = Graph("dynamic_zx")
    x = g.add_input("x", TensorType(DType.u8, (2, 6, 8, 8)))
    zx = g.add_input("zx", TensorType(DType.u8, ()))
    w = g.add_constant(_ints(rng, DType.i8, (20, 6, 1, 1)))
    g.set_outputs([g.add(qn.ConvInteger(), x, w, zx)])
    feeds = {"x": _ints(rng, DType.u8, (2, 6, 8, 8)), "zx": np.array(77, np.uint8)}
    _, _, plan = build_kernels(g, target_for(cpu))
    assert all(any("1x1 as W x X" in note for note in k.notes) for _, k in plan)
    _check(g, run_kernels(g, feeds, target=target_for(cpu)), interpret(g, feeds))


def test_the_portable_loop():
    g, feeds = _graph(constant_w=False)
    for n in g.nodes:
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], (ConvInteger, QLinearConv)), n.describe()
    _check(g, run_kernels(g, feeds, target=target_for("x86-64-v3")), interpret(g, feeds))


@pytest.mark.parametrize("cpu,note", ISAS)
def test_constant_weights_take_the_int8_tiles(cpu, note):
    """Structure on any host: one group with constant weights gets the im2col + int8 tiles of the
    target's best instructions; a grouped conv the portable loop, saying why."""
    g, _ = _graph()
    _, _, plan = build_kernels(g, target_for(cpu))
    for group, k in plan:
        grouped = group.node.op.group > 1
        assert any(x.startswith(note) for x in k.notes) != grouped, (group.node.describe(), k.notes)
        if grouped:
            depthwise = group.node.op.group == int(group.node.inputs[0].shape[1])
            assert any(x.startswith("depthwise in float32 on the integers") for x in k.notes) == depthwise
            assert any("a grouped convolution (not depthwise)" in x for x in k.notes) != depthwise
        n = group.node
        w = n.inputs[3] if isinstance(n.op, qn.QLinearConv) else n.inputs[1]
        unit = tuple(w.shape[2:]) == (1, 1) and not n.op.pads and all(int(v) == 1 for v in n.op.strides or ())
        pointwise = unit and (int(w.shape[0]) < POINTWISE_MAX_CHANNELS or int(w.shape[1]) < POINTWISE_MAX_DEPTH)
        assert any("1x1 as W x X" in x for x in k.notes) == pointwise, (n.describe(), k.notes)
        kxk = _transposed(n) and not pointwise and not grouped
        assert any("as W x cols" in x for x in k.notes) == kxk, (n.describe(), k.notes)
        taps = int(w.shape[2]) * int(w.shape[3])
        nhwc = not (kxk or pointwise or grouped) and int(n.inputs[0].shape[1]) % 4 == 0 and \
            int(n.inputs[0].shape[1]) > 0 and taps > 1
        assert any("NHWC copy" in x for x in k.notes) == nhwc, (n.describe(), k.notes)


def test_a_target_without_avx2_runs_the_portable_loop():
    g, _ = _graph(cases=CASES[:1], types=TYPES[:1])
    _, _, plan = build_kernels(g, target_for("x86-64-v2"))
    assert all(any("neither AVX-512 BW nor AVX2" in x for x in k.notes) for _, k in plan)


@pytest.mark.parametrize("types", range(len(TYPES)))
@pytest.mark.parametrize("cpu", [c for c, _ in ISAS])
def test_int8_tile_numbers(cpu, types):
    """Every case on each ISA, one pair of operand types per test (one module each: the suite's
    workers share them out)."""
    if not _runs_here(cpu):
        pytest.skip(f"this CPU lacks {cpu}'s instructions (test_constant_weights_take_the_int8_tiles checks "
                    f"the kernel is built)")
    g, feeds = _graph(types=TYPES[types:types + 1], seed=1 + types)
    _check(g, run_kernels(g, feeds, target=target_for(cpu)), interpret(g, feeds))


#: one convolution per int8 path: 1x1 as W x X, 3x3 as W x cols, the NHWC taps, the im2col, depthwise
TIE_CASES = [((1, 4, 16, 16), (6, 4, 1, 1), {}), ((1, 4, 16, 16), (5, 4, 3, 3), dict(pads=(1, 1, 1, 1))),
             ((1, 8, 7, 7), (6, 8, 3, 3), dict(pads=(1, 1, 1, 1))), ((1, 3, 7, 7), (4, 3, 3, 3), dict(pads=(1, 1, 1, 1))),
             ((1, 4, 16, 16), (4, 1, 3, 3), dict(group=4, pads=(1, 1, 1, 1)))]


@pytest.mark.parametrize("cpu", [c for c, _ in ISAS])
def test_the_float32_requantization_near_ties(cpu):
    """QLinearConv's float32 way to its f64 requantization (``int8_tiles.Fast``): with x_scale
    1 + 2^-23, w_scale 1 - 2^-23 (their product 1 - 2^-46) and y_scale 2, every odd sum 2k + 1 (plus
    bias) lies just below a tie, at k + 0.5 - (2k + 1) 2^-47, which the reference rounds down, while
    float32's combined scale is 0.5 and puts it on the tie, rounded to even; the rows holding such a
    value are finished again in f64, so every value is the reference's (the fast values alone are not)."""
    if not _runs_here(cpu):
        pytest.skip(f"this CPU lacks {cpu}'s instructions")
    rng = np.random.default_rng(3)
    g = Graph("ties")
    feeds = {}
    for xs, ws, attrs in TIE_CASES:
        x = g.add_input(f"x{len(feeds)}", TensorType(DType.u8, xs))
        feeds[x.name] = rng.integers(0, 4, xs).astype(np.uint8)
        w = g.add_constant(rng.integers(-3, 4, ws).astype(np.int8))
        sw = g.add_constant(np.full(ws[0], 1 - 2.0 ** -23, np.float32))
        bias = g.add_constant(rng.integers(-9, 10, ws[0]).astype(np.int32))
        g.add(qn.QLinearConv(**attrs), x, g.add_constant(np.float32(1 + 2.0 ** -23)), g.add_constant(np.uint8(0)), w, sw,
              g.add_constant(np.int8(0)), g.add_constant(np.float32(2.0)), g.add_constant(np.uint8(128)), bias)
    g.set_outputs([n.outputs[0] for n in g.nodes])
    _, _, plan = build_kernels(g, target_for(cpu))
    assert all(any(FAST_NOTE in note for note in k.notes) for _, k in plan)
    want = interpret(g, feeds)
    _check(g, run_kernels(g, feeds, target=target_for(cpu)), want)
    # the ties are there: float32 alone rounds some of these sums differently
    for (xs, ws, attrs), n, name in zip(TIE_CASES, g.nodes, g.output_names):
        sums = interpret_sums(n, feeds)
        fast = np.clip(np.rint(sums.astype(np.float32) * np.float32(0.5)) + 128, 0, 255)
        assert np.count_nonzero(fast != want[name]) > 0, n.describe()


def interpret_sums(n, feeds):
    """The convolution's int32 sums plus its bias (a ConvInteger of the same inputs, by the reference)."""
    x, _, zx, w, _, zw, _, _, bias = n.inputs
    g = Graph("sums")
    xi = g.add_input("x", x.type)
    s = g.add(qn.ConvInteger(**{k: getattr(n.op, k) for k in ("pads", "strides", "dilations", "group")}), xi,
              g.add_constant(w.const), g.add_constant(zx.const), g.add_constant(zw.const))
    g.set_outputs([s])
    out = interpret(g, {"x": feeds[n.inputs[0].name]})
    return next(iter(out.values())) + bias.const.reshape(1, -1, 1, 1)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_on_the_cuda_printer():
    g, feeds = _graph(cases=[CASES[0], CASES[3]], types=TYPES[:2], constant_w=False, seed=2)
    want = interpret(g, feeds)
    for n, name in zip(g.nodes, g.output_names):
        one = Graph("one")
        ins = [None if v is None else one.add_constant(v.const) if v.const is not None else one.add_input(v.name, v.type)
               for v in n.inputs]
        one.set_outputs([one.add_node(n.op, ins).outputs[0]])
        got = run_cuda_forms(one, {v.name: feeds[v.name] for v in one.inputs})
        np.testing.assert_array_equal(got[one.output_names[0]], want[name], err_msg=n.describe())


#: register tiles other than the ones the shapes above choose (``Int8Tiling.for_shape``): rows not
#: dividing the channels or pixels, narrow panels, one row
FORCED_TILES = [(8, 3), (7, 3), (5, 4), (3, 2), (1, 4)]


@pytest.mark.parametrize("mr,nv", FORCED_TILES)
def test_every_tile_shape_gives_the_same_numbers(mr, nv, monkeypatch):
    """Each path (W x X, W x cols, the NHWC taps, the im2col), forced to other register tiles than it
    chooses, bit for bit against the reference (VNNI: the tiles whose choice weighs padded sums)."""
    from compiler.codegen.gemm.int8 import VNNI, Int8Tiling

    if not _runs_here("icelake-server"):
        pytest.skip("this CPU lacks AVX-512 VNNI")
    monkeypatch.setattr(Int8Tiling, "for_shape", staticmethod(
        lambda m, n, isa=VNNI, narrow_last=False: Int8Tiling(MR=min(mr, max(m, 1)), NV=nv, isa=isa)))
    cases = [CASES[i] for i in (1, 8, 11, 14, 15, 16, 17, 19, 23, 25, 27, 28, 29)]  # (size-1 and size-0 axes too)
    g, feeds = _graph(cases=cases, types=TYPES[1:2], seed=3)
    _, _, plan = build_kernels(g, target_for("icelake-server"))
    assert all(any(re.search(rf"\bof \d+x{16 * nv}\b", x) for x in k.notes) for _, k in plan)
    _check(g, run_kernels(g, feeds, target=target_for("icelake-server")), interpret(g, feeds))
