"""Native pooling kernels (compiler/codegen/kernels/pool.py) against the reference interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.testing import run_kernels
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse

RNG = np.random.default_rng(7)


def _attrs(d: dict) -> str:
    def fmt(v):
        if isinstance(v, (tuple, list)):
            return "[" + ", ".join(str(x) for x in v) + "]"
        if isinstance(v, str):
            return f'"{v}"'
        return str(v)
    return "{" + ", ".join(f"{k}={fmt(v)}" for k, v in sorted(d.items())) + "}"


def _graph(shape, pools):
    """One graph with one pool node per (op, attrs) of ``pools``, all reading %x."""
    from compiler.ir.graph import Graph
    from compiler.ir.ops import pool as P
    from compiler.ir.types import DType, TensorType

    g = Graph("pools")
    x = g.add_input("x", TensorType(DType.f32, tuple(shape)))
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
    from compiler.ir.graph import Graph
    from compiler.ir.ops import pool as P
    from compiler.ir.types import DType, TensorType

    g = Graph("r")
    x3 = g.add_input("x3", TensorType(DType.f32, (1, 2, 4, 4, 4)))
    h = g.add_input("h", TensorType(DType.f64, (1, 2, 4, 4)))
    s = g.add_input("s", TensorType(DType.f32, ("N", 2, 4, 4)))
    x = g.add_input("x", TensorType(DType.f32, (1, 2, 4, 70)))
    n0 = g.add_node(P.MaxPool(kernel_shape=(2, 2, 2)), [x3])
    n1 = g.add_node(P.AveragePool(kernel_shape=(2, 2)), [h])
    n2 = g.add_node(P.MaxPool(kernel_shape=(2, 2)), [s])
    n3 = g.add_node(P.MaxPool(kernel_shape=(2, 2)), [x])
    n4 = g.add_node(P.AveragePool(kernel_shape=(1, 65)), [x])
    g.set_outputs([n0.outputs[0], n1.outputs[0], n2.outputs[0], n3.outputs[0], n3.outputs[1], n4.outputs[0]])
    assert "3-D" in _reason(g, 0)
    assert "f64" in _reason(g, 1)
    assert "static" in _reason(g, 2)
    assert "Indices" in _reason(g, 3)
    assert "wider" in _reason(g, 4)
