"""Pooling on the loop form (compiler/codegen/kernels/pool.py) against the reference interpreter:
MaxPool/AveragePool over 1-D, 2-D and 3-D windows (pads, strides, dilations, auto_pad, ceil_mode,
count_include_pad) and the global pools, on f32, f64, f16 (and i8/u8 MaxPool), in both loop orders
(taps in registers, rows), on the LLVM printer (compiled) and the numba.cuda printer (simulator)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels import pool as pool_mod
from compiler.codegen.kernels.pool import GlobalPool, Pool
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import pool as P
from compiler.ir.parser import parse
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(7)


def _attrs(d: dict) -> str:
    def fmt(v):
        if isinstance(v, (tuple, list)):
            return "[" + ", ".join(str(x) for x in v) + "]"
        if isinstance(v, str):
            return f'"{v}"'
        return str(v)
    return "{" + ", ".join(f"{k}={fmt(v)}" for k, v in sorted(d.items())) + "}"


def _graph(shape, pools, dt: DType = DType.f32):
    """One graph with one pool node per (op, attrs) of ``pools``, all reading %x."""
    g = Graph("pools")
    x = g.add_input("x", TensorType(dt, tuple(shape)))
    outs = []
    for op, attrs in pools:
        node = g.add_node(getattr(P, op)(**attrs), [x])
        outs.append(node.outputs[0])
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    return g


def _check(g, x, exact=False):
    got = run_kernels(g, {"x": x})
    ref = interpret(g, {"x": x})
    for name in ref:
        assert got[name].shape == ref[name].shape, name
        if exact:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
        else:
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)


CASES_2D = [
    dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    dict(kernel_shape=(2, 2), strides=(2, 2)),
    dict(kernel_shape=(3, 3)),
    dict(kernel_shape=(3, 2), strides=(1, 2), pads=(0, 1, 2, 0)),
    dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1),
    dict(kernel_shape=(3, 3), strides=(2, 3), pads=(1, 2, 1, 2), ceil_mode=1),
    dict(kernel_shape=(2, 3), dilations=(2, 2), pads=(1, 1, 1, 1)),
    dict(kernel_shape=(3, 3), auto_pad="SAME_UPPER", strides=(2, 2)),
    dict(kernel_shape=(4, 4), auto_pad="SAME_LOWER", strides=(3, 3)),
    dict(kernel_shape=(5, 5), strides=(1, 1), pads=(2, 2, 2, 2)),
    dict(kernel_shape=(7, 1), strides=(1, 1), pads=(3, 0, 3, 0)),
]


@pytest.mark.parametrize("shape,cases", [((2, 3, 13, 17), CASES_2D), ((1, 4, 8, 40), CASES_2D[:3])])
def test_pool_2d(shape, cases):
    pools = []
    for c in cases:
        pools.append(("MaxPool", c))
        pools.append(("AveragePool", c))
        pools.append(("AveragePool", dict(c, count_include_pad=1)))
    g = _graph(shape, pools)
    x = RNG.standard_normal(shape).astype(np.float32)
    _check(g, x, exact=True)  # taps in the reference's order: the same bits


def test_pool_1d_and_small_images():
    pools = [("MaxPool", dict(kernel_shape=(3,), strides=(2,), pads=(1, 1))),
             ("AveragePool", dict(kernel_shape=(4,), strides=(3,), ceil_mode=1)),
             ("AveragePool", dict(kernel_shape=(3,), pads=(2, 2), count_include_pad=1)),
             ("MaxPool", dict(kernel_shape=(2,), dilations=(3,)))]
    g = _graph((2, 3, 11), pools)
    _check(g, RNG.standard_normal((2, 3, 11)).astype(np.float32), exact=True)
    # a window wider than the image: every column is a border column
    pools = [("MaxPool", dict(kernel_shape=(3, 5), pads=(1, 2, 1, 2))),
             ("AveragePool", dict(kernel_shape=(3, 5), pads=(1, 2, 1, 2))),
             ("AveragePool", dict(kernel_shape=(2, 4), strides=(2, 3), pads=(1, 2, 1, 2), count_include_pad=1)),
             ("MaxPool", dict(kernel_shape=(1, 1)))]
    g = _graph((1, 2, 3, 3), pools)
    _check(g, RNG.standard_normal((1, 2, 3, 3)).astype(np.float32), exact=True)


def test_maxpool_nan_and_inf():
    x = RNG.standard_normal((1, 2, 9, 10)).astype(np.float32)
    x[0, 0, 3, 4] = np.nan
    x[0, 1, 0, 0] = -np.inf
    x[0, 1, 5, 5] = np.inf
    g = _graph(x.shape, [("MaxPool", dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
                         ("AveragePool", dict(kernel_shape=(2, 2)))])
    _check(g, x, exact=True)
    got = run_kernels(g, {"x": x})["y0"]
    assert np.isnan(got[0, 0, 2, 2]) and np.isnan(got[0, 0, 1, 2])


def test_global_pools():
    text = """graph @g(%x: f32[2,3,7,9], %z: f32[2,5,1000], %w: f32[1,2,2,3,5]) -> (a: f32[2,3,1,1],
        b: f32[2,3,1,1], c: f32[2,5,1], d: f32[2,5,1], e: f32[1,2,1,1,1]) {
      %0 = GlobalAveragePool(%x) : f32[2,3,1,1]
      %1 = GlobalMaxPool(%x) : f32[2,3,1,1]
      %2 = GlobalAveragePool(%z) : f32[2,5,1]
      %3 = GlobalMaxPool(%z) : f32[2,5,1]
      %4 = GlobalMaxPool(%w) : f32[1,2,1,1,1]
      return a=%0, b=%1, c=%2, d=%3, e=%4
    }"""
    g = parse(text)
    ins = {"x": RNG.standard_normal((2, 3, 7, 9)).astype(np.float32),
           "z": RNG.standard_normal((2, 5, 1000)).astype(np.float32) + 3,
           "w": RNG.standard_normal((1, 2, 2, 3, 5)).astype(np.float32)}
    ins["z"][1, 2, 777] = np.nan
    got, ref = run_kernels(g, ins), interpret(g, ins)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-6, atol=1e-6, err_msg=name)
    assert np.isnan(got["d"][1, 2, 0]) and np.isnan(got["c"][1, 2, 0])


def _reason(g, i=0):
    low, why = lowering_for(KernelGroup.of([g.nodes[i]]))
    assert low is None
    return why


def test_refusals():
    g = Graph("r")
    b = g.add_input("b", TensorType(DType.bf16, (1, 2, 4, 4)))
    s = g.add_input("s", TensorType(DType.f32, ("N", 2, 4, 4)))
    x = g.add_input("x", TensorType(DType.f32, (1, 2, 4, 70)))
    h = g.add_input("h", TensorType(DType.f16, (1, 1, 70, 70)))
    n0 = g.add_node(P.AveragePool(kernel_shape=(2, 2)), [b])
    n1 = g.add_node(P.MaxPool(kernel_shape=(2, 2)), [s])
    n2 = g.add_node(P.MaxPool(kernel_shape=(2, 2)), [x])
    n3 = g.add_node(P.AveragePool(kernel_shape=(1, 65)), [x])
    n4 = g.add_node(P.AveragePool(kernel_shape=(70, 64)), [h])  # 4480 taps: by rows, no f16 running sum
    n5 = g.add_node(P.GlobalAveragePool(), [b])
    g.set_outputs([n0.outputs[0], n1.outputs[0], n2.outputs[0], n2.outputs[1], n3.outputs[0], n4.outputs[0],
                   n5.outputs[0]])
    for i in (0, 5):  # bf16: native (stored as its bits, computed in f32)
        assert lowering_for(KernelGroup.of([g.nodes[i]]))[0] is not None
    assert "static" in _reason(g, 1)
    assert "Indices" in _reason(g, 2)
    assert "wider" in _reason(g, 3)
    assert "f16 AveragePool windows of more than 4096 taps" in _reason(g, 4)
    for why in (_reason(g, i) for i in range(1, 5)):
        assert "\n" not in why and why.count(". ") == 0, why  # one sentence each


# -- every type, edge shapes, both loop orders, both printers -------------------------------------
#: (input shape, op, attrs): the edge cases, each its own input
EDGES = [
    ((1, 1, 1, 1), "MaxPool", dict(kernel_shape=(1, 1))),                                  # size-1 everything
    ((1, 1, 1, 7), "AveragePool", dict(kernel_shape=(1, 3), pads=(0, 1, 0, 1))),           # one row
    ((1, 1, 5, 1), "MaxPool", dict(kernel_shape=(3, 1), strides=(2, 1), pads=(1, 0, 1, 0))),  # one column
    ((3, 1, 4, 4), "AveragePool", dict(kernel_shape=(2, 2))),                              # N > 1, C = 1
    ((1, 2, 5, 7), "AveragePool", dict(kernel_shape=(3, 7))),                              # output of 1 column
    ((2, 3, 7, 7), "AveragePool", dict(kernel_shape=(7, 7))),                              # ResNet's: 1 x 1
    ((2, 3, 6, 6), "AveragePool", dict(kernel_shape=(7, 7), pads=(0, 0, 1, 1))),           # Inception's: wider
    ((1, 2, 2, 2), "AveragePool", dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1)),
    ((1, 2, 2, 2), "AveragePool", dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 0, 0), ceil_mode=1,
                                       count_include_pad=1)),                            # past the pads
    ((1, 2, 5, 5), "MaxPool", dict(kernel_shape=(4, 4), strides=(3, 3), pads=(1, 1, 1, 1), ceil_mode=1)),
    ((1, 2, 11, 13), "MaxPool", dict(kernel_shape=(3, 3), dilations=(2, 3), pads=(2, 3, 2, 3))),
    ((1, 2, 11, 13), "AveragePool", dict(kernel_shape=(2, 3), dilations=(3, 2), strides=(2, 1), ceil_mode=1)),
    ((1, 2, 9, 10), "AveragePool", dict(kernel_shape=(3, 3), pads=(0, 2, 2, 1), count_include_pad=1)),
    ((1, 2, 9, 10), "MaxPool", dict(kernel_shape=(3, 3), pads=(2, 0, 0, 2))),              # asymmetric pads
    ((1, 2, 5, 37), "MaxPool", dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1))),              # widths not 8k
    ((1, 2, 6, 17), "AveragePool", dict(kernel_shape=(2, 2), strides=(2, 2))),
    ((1, 2, 9, 9), "AveragePool", dict(kernel_shape=(3, 3), auto_pad="SAME_UPPER", strides=(2, 2))),
    ((1, 2, 9, 9), "MaxPool", dict(kernel_shape=(4, 4), auto_pad="SAME_LOWER", strides=(3, 3))),
    ((1, 2, 9, 9), "AveragePool", dict(kernel_shape=(3, 2), auto_pad="VALID")),
    ((2, 3, 11), "MaxPool", dict(kernel_shape=(3,), strides=(2,), pads=(1, 1))),           # 1-D
    ((2, 3, 11), "AveragePool", dict(kernel_shape=(4,), strides=(3,), ceil_mode=1)),
    ((1, 1, 1), "AveragePool", dict(kernel_shape=(1,))),
    ((1, 2, 5, 6, 7), "MaxPool", dict(kernel_shape=(2, 3, 3), strides=(2, 1, 2), pads=(1, 0, 1, 0, 1, 1))),  # 3-D
    ((1, 2, 5, 6, 7), "AveragePool", dict(kernel_shape=(3, 2, 2), pads=(1, 1, 0, 1, 0, 1), count_include_pad=1)),
    ((1, 2, 4, 5, 6), "AveragePool", dict(kernel_shape=(2, 2, 3), strides=(2, 2, 2), ceil_mode=1)),
    ((2, 4, 9, 10), "AveragePool", dict(kernel_shape=(3, 3), pads=(0, 2, 2, 1), count_include_pad=1)),  # 8 planes
    ((1, 8, 2, 2), "AveragePool", dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1)),
    ((1, 9, 5, 6, 7), "MaxPool", dict(kernel_shape=(2, 3, 3), strides=(2, 1, 2), pads=(1, 0, 1, 0, 1, 1))),
]


def _data(shape, dt: DType) -> np.ndarray:
    if dt.is_float:
        return (RNG.standard_normal(shape) * 4).astype(dt.np)
    return RNG.integers(np.iinfo(dt.np).min, np.iinfo(dt.np).max, shape, endpoint=True).astype(dt.np)


def _edges_graph(cases, dt: DType, both: bool = True):
    """A graph with one input per case; with ``both``, float cases run as MaxPool and AveragePool."""
    g = Graph("edges")
    feeds, labels = {}, []
    for i, (shape, op, attrs) in enumerate(cases):
        x = g.add_input(f"x{i}", TensorType(dt, shape))
        feeds[f"x{i}"] = _data(shape, dt)
        ops = ["MaxPool", "AveragePool"] if both and dt.is_float else [op]
        for name in ops:
            if name == "MaxPool" and "count_include_pad" in attrs:
                continue
            if name == "AveragePool" and not dt.is_float:
                continue
            g.add_node(getattr(P, name)(**attrs), [x])
            labels.append(f"{name}[{dt}] {shape} {attrs}")
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds, labels


def _exact(got, want, labels, names):
    for name, label in zip(names, labels):
        assert got[name].shape == want[name].shape, label
        assert got[name].dtype == want[name].dtype, label
        np.testing.assert_array_equal(got[name], want[name], err_msg=label)  # NaN equals NaN here


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16, DType.i8, DType.u8], ids=str)
def test_every_type_and_edge_on_the_llvm_printer(dt):
    cases = EDGES if dt.is_float else [c for c in EDGES if c[1] == "MaxPool"]
    g, feeds, labels = _edges_graph(cases, dt)
    for n, label in zip(g.nodes, labels):
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], Pool), label
    # the same taps in the same order, divided by the same count: the reference's bits
    _exact(run_kernels(g, feeds), interpret(g, feeds), labels, g.output_names)


@pytest.mark.parametrize("split", ["planes", "rows"])
@pytest.mark.parametrize("dt", [DType.f32, DType.f16], ids=str)
def test_both_splits(dt, split, monkeypatch):
    """Every edge case (and the 2-D cases) with the planes split among the threads (each plane's rows
    in static ranges) and with the rows of all planes split (each row's taps tested): the same bits."""
    monkeypatch.setattr(pool_mod, "PLANES_PARALLEL", 1 if split == "planes" else 1 << 30)
    monkeypatch.setattr(pool_mod, "SEPARABLE", False)  # (2-D max pools: by planes; its own test)
    cases = EDGES + [((2, 3, 13, 17), "MaxPool", c) for c in CASES_2D] + \
        [((2, 3, 13, 17), "AveragePool", dict(c, count_include_pad=1)) for c in CASES_2D]
    g, feeds, labels = _edges_graph(cases, dt)
    notes = [Pool().form(KernelGroup.of_node(n), "k").notes[0] for n in g.nodes]
    planes = sum("planes split among the threads" in note for note in notes)
    # planes only where some kernel row is inside for some output rows only (pads, ceil_mode); 1-D: planes
    assert planes > len(notes) // 2 if split == "planes" else planes == sum(len(n.inputs[0].shape) == 3 for n in g.nodes)
    _exact(run_kernels(g, feeds), interpret(g, feeds), labels, g.output_names)


@pytest.mark.parametrize("split", ["planes", "rows"])
@pytest.mark.parametrize("dt", [DType.f32, DType.f16], ids=str)
def test_rows_order(dt, split, monkeypatch):
    """Every edge case (and the 2-D cases) with the result row as the running value: the same bits."""
    monkeypatch.setattr(pool_mod, "UNROLL_TAPS", 0)
    monkeypatch.setattr(pool_mod, "PLANES_PARALLEL", 1 if split == "planes" else 1 << 30)
    monkeypatch.setattr(pool_mod, "SEPARABLE", False)
    cases = EDGES + [((2, 3, 13, 17), "MaxPool", c) for c in CASES_2D]
    if dt is DType.f16:  # f16 AveragePool by rows is refused: MaxPool only
        cases = [(s, "MaxPool", {k: v for k, v in a.items() if k != "count_include_pad"}) for s, _, a in cases]
    g, feeds, labels = _edges_graph(cases, dt, both=dt is not DType.f16)
    for n in g.nodes:
        kernel = Pool().form(KernelGroup.of_node(n), "k")
        assert any("by rows" in note for note in kernel.notes), kernel.notes
    _exact(run_kernels(g, feeds), interpret(g, feeds), labels, g.output_names)


def test_windows_past_the_unrolled_taps(monkeypatch):
    """4480 taps (70 x 64, kw ranges cut by the pads): by rows, f32 and f64, exact."""
    monkeypatch.setattr(pool_mod, "SEPARABLE", False)
    g = Graph("big")
    feeds, names = {}, []
    for dt in (DType.f32, DType.f64):
        x = g.add_input(f"x{dt}", TensorType(dt, (1, 2, 70, 70)))
        feeds[f"x{dt}"] = _data((1, 2, 70, 70), dt)
        for op in (P.MaxPool(kernel_shape=(70, 64), pads=(0, 3, 0, 3)),
                   P.AveragePool(kernel_shape=(70, 64), pads=(0, 3, 0, 3), count_include_pad=1)):
            g.add_node(op, [x])
            names.append(f"{op.name}[{dt}]")
    g.set_outputs([n.outputs[0] for n in g.nodes])
    for n in g.nodes:
        assert any("by rows" in note for note in Pool().form(KernelGroup.of_node(n), "k").notes)
    _exact(run_kernels(g, feeds), interpret(g, feeds), names, g.output_names)


def test_nan_propagates_and_padding_never_wins():
    x = np.full((1, 1, 4, 5), -np.inf, np.float32)
    x[0, 0, 1, 2] = np.nan
    x[0, 0, 3, 4] = -3.0
    g = _graph(x.shape, [("MaxPool", dict(kernel_shape=(2, 2), pads=(1, 1, 1, 1))),
                         ("AveragePool", dict(kernel_shape=(2, 2), pads=(1, 1, 1, 1)))])
    got, want = run_kernels(g, {"x": x}), interpret(g, {"x": x})
    _exact(got, want, ["max", "avg"], ["y0", "y1"])
    assert np.isnan(got["y0"][0, 0, 1:3, 2:4]).all() and got["y0"][0, 0, 0, 0] == -np.inf
    assert got["y0"][0, 0, 4, 5] == -3.0


def _global_graph(dt: DType):
    g = Graph("global")
    feeds, labels = {}, []
    for i, shape in enumerate([(2, 5, 3, 4), (1, 3, 17, 17), (1, 1, 1, 1), (3, 2, 5), (1, 9, 2, 3, 2), (2, 4, 300)]):
        x = g.add_input(f"x{i}", TensorType(dt, shape))
        data = _data(shape, dt) + 2
        data.reshape(shape[0] * shape[1], -1)[0, -1] = np.nan
        feeds[f"x{i}"] = data
        for cls in (P.GlobalAveragePool, P.GlobalMaxPool):
            g.add_node(cls(), [x])
            labels.append(f"{cls.__name__}[{dt}] {shape}")
    g.set_outputs([n.outputs[0] for n in g.nodes])
    return g, feeds, labels


def _close(got, want, labels, names, dt):
    tol = 2e-3 if dt is DType.f16 else 2e-6 if dt is DType.f32 else 1e-12
    for name, label in zip(names, labels):
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, label
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=label)


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16], ids=str)
def test_global_pools_every_type(dt):
    """Planes shorter than 256 eight at a time (NC not a multiple of 8, fewer than 8 planes) and longer
    ones alone; a NaN in each input's first plane."""
    g, feeds, labels = _global_graph(dt)
    for n, label in zip(g.nodes, labels):
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], GlobalPool), label
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    _close(got, want, labels, g.output_names, dt)
    for name in g.output_names:
        assert np.isnan(got[name].reshape(-1)[0])


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16], ids=str)
def test_on_the_cuda_printer(dt):
    g, feeds, labels = _edges_graph(EDGES[::3], dt)
    _exact(run_cuda_forms(g, feeds, threads=3), interpret(g, feeds), labels, g.output_names)
    g, feeds, labels = _global_graph(dt)
    _close(run_cuda_forms(g, feeds, threads=3), interpret(g, feeds), labels, g.output_names, dt)


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_rows_order_on_the_cuda_printer(monkeypatch):
    monkeypatch.setattr(pool_mod, "UNROLL_TAPS", 0)
    g, feeds, labels = _edges_graph(EDGES[1::4], DType.f32)
    _exact(run_cuda_forms(g, feeds, threads=3), interpret(g, feeds), labels, g.output_names)


def test_strided_overlapping_windows_by_output_width(monkeypatch):
    """3x3 stride-2 max pools: narrow output rows (ResNet-18 at 64x64: 16 columns) by registers,
    wider ones by rows; exact either way. On x86 the kernels vectorize the strided taps without
    gathers (``CODEGEN_FEATURES``): checked in the assembly for an AVX-512 and an AVX2 target."""
    from compiler.codegen.kernels.testing import build_kernels
    from compiler.codegen.llvm import toolchain
    from compiler.codegen.llvm.target import target_for

    monkeypatch.setattr(pool_mod, "SEPARABLE", False)
    g = Graph("strided")
    feeds = {}
    shapes = {"narrow": (2, 16, 32, 32), "wide": (1, 16, 56, 56), "one row": (3, 1, 2, 32), "one column": (1, 4, 9, 1)}
    for name, shape in shapes.items():
        x = g.add_input(name, TensorType(DType.f32, shape))
        feeds[name] = _data(shape, DType.f32)
        g.add_node(P.MaxPool(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), [x])
    g.set_outputs([n.outputs[0] for n in g.nodes])
    orders = [Pool().form(KernelGroup.of_node(n), "k").notes[0].split(" by ")[1].split(",")[0] for n in g.nodes]
    assert orders == ["registers", "rows", "registers", "registers"]
    _exact(run_kernels(g, feeds), interpret(g, feeds), list(shapes), g.output_names)
    for cpu in ("znver4", "znver3"):
        target = target_for(cpu)
        module, _, _ = build_kernels(g, target)
        asm = toolchain.assembly(str(module), target)
        assert ("%ymm" in asm or "%zmm" in asm) and "gather" not in asm, cpu  # vectorized, no gathers


@pytest.mark.parametrize("order,split", [("registers", "planes"), ("registers", "rows"), ("rows", "planes"),
                                         ("rows", "rows"), ("columns then rows", "planes")])
@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16], ids=str)
def test_max_with_the_nan_taps_apart(dt, split, order, monkeypatch):
    """A float MaxPool's running maximum is a plain one with the NaN taps tested on the side
    (``NAN_APART``): a window with a NaN anywhere (its first tap, a middle one, its last, a tap of a
    row some windows have in the pads) gives NaN, +-inf and ties are the reference's, in every loop
    order and split (the separable order always splits the planes); and the same results as the
    form's NaN-propagating ``max``."""
    monkeypatch.setattr(pool_mod, "PLANES_PARALLEL", 1 if split == "planes" else 1 << 30)
    monkeypatch.setattr(pool_mod, "SEPARABLE", order == "columns then rows")
    if order == "rows":
        monkeypatch.setattr(pool_mod, "UNROLL_TAPS", 0)
    cases = [((1, 3, 9, 11), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1))),
             ((2, 2, 9, 11), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1)),
             ((1, 2, 7, 30), dict(kernel_shape=(3, 3), strides=(2, 2)))]
    if order != "columns then rows":  # (2-D only)
        cases.append(((1, 2, 5, 6, 7), dict(kernel_shape=(2, 3, 3), strides=(2, 1, 2), pads=(1, 0, 1, 0, 1, 1))))
    g = Graph("nan")
    feeds = {}
    for i, (shape, attrs) in enumerate(cases):
        x = g.add_input(f"x{i}", TensorType(dt, shape))
        data = np.round(_data(shape, dt))  # (rounded: equal values, ties among the taps)
        flat = data.reshape(-1)
        pick = RNG.permutation(flat.size)
        flat[pick[:max(1, flat.size // 12)]] = np.nan
        flat[pick[-3:]] = np.inf
        flat[pick[-6:-3]] = -np.inf
        flat[0] = flat[-1] = np.nan  # the first and last taps of the corner windows
        feeds[f"x{i}"] = data
        g.add_node(P.MaxPool(**attrs), [x])
    g.set_outputs([n.outputs[0] for n in g.nodes])
    labels = [f"{dt} {s} {a}" for s, a in cases]
    for n in g.nodes:
        assert f"by {order}" in Pool().form(KernelGroup.of_node(n), "k").notes[0]
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    _exact(got, want, labels, g.output_names)
    assert all(np.isnan(got[name]).any() and not np.isnan(got[name]).all() for name in g.output_names)
    monkeypatch.setattr(pool_mod, "NAN_APART", False)
    monkeypatch.setattr(pool_mod, "SEPARABLE", False)
    _exact(run_kernels(g, feeds), got, labels, g.output_names)


def test_max_apart_is_one_max_instruction_per_tap():
    """On x86 the plain running maximum is a ``maxps`` per tap (the form's NaN-propagating max is
    two compares and a blend), checked in the assembly for an AVX-512 and an AVX2 target."""
    from compiler.codegen.kernels.testing import build_kernels
    from compiler.codegen.llvm import toolchain
    from compiler.codegen.llvm.target import target_for

    g = _graph((1, 8, 12, 64), [("MaxPool", dict(kernel_shape=(3, 3)))])
    assert "by columns then rows" in Pool().form(KernelGroup.of_node(g.nodes[0]), "k").notes[0]
    for cpu in ("znver4", "znver3"):
        target = target_for(cpu)
        module, _, _ = build_kernels(g, target)
        asm = toolchain.assembly(str(module), target)
        assert "vmaxps" in asm and "vcmpunordps" in asm, cpu


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.f16], ids=str)
def test_separable_max(dt, monkeypatch):
    """A 2-D float MaxPool by planes as two passes per output row (``SEPARABLE``): the maximum down
    the kernel rows inside of every input column into the plane's scratch row, then along it. Every
    2-D max case (pads, strides, dilations, ceil_mode, auto_pad, windows wider than the image, one
    row, one column, a 70 x 64 window), with the rows split among the threads asked for: by planes,
    the same values as the reference and as the other orders (ties of +0 and -0 aside, which
    compare equal here)."""
    monkeypatch.setattr(pool_mod, "PLANES_PARALLEL", 1 << 30)
    cases = [c for c in EDGES if c[1] == "MaxPool" and len(c[0]) == 4] + \
        [((2, 3, 13, 17), "MaxPool", c) for c in CASES_2D] + \
        [((1, 2, 3, 3), "MaxPool", dict(kernel_shape=(3, 5), pads=(1, 2, 1, 2))),
         ((1, 2, 70, 70), "MaxPool", dict(kernel_shape=(70, 64), pads=(0, 3, 0, 3))),
         ((1, 4, 9, 1), "MaxPool", dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
         ((3, 2, 1, 8), "MaxPool", dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)))]  # one row, batch 3
    g, feeds, labels = _edges_graph(cases, dt, both=False)
    notes = [Pool().form(KernelGroup.of_node(n), "k").notes[0] for n in g.nodes]
    separable = ["by columns then rows" in note and "planes split" in note for note in notes]
    # (a 1 x 1 window, or one kernel row or column, is not two passes)
    assert separable == [n.op.kernel_shape[0] > 1 and n.op.kernel_shape[1] > 1 for n in g.nodes], labels
    got = run_kernels(g, feeds)
    _exact(got, interpret(g, feeds), labels, g.output_names)
    monkeypatch.setattr(pool_mod, "SEPARABLE", False)
    _exact(run_kernels(g, feeds), got, labels, g.output_names)
    # an empty plane is the interpreter's (tests/codegen/test_kernels_empty.py runs one end to end)
    empty = _graph((0, 3, 8, 8), [("MaxPool", dict(kernel_shape=(3, 3)))], dt)
    assert "empty" in Pool().check(KernelGroup.of_node(empty.nodes[0]))
