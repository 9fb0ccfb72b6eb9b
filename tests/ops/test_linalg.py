"""MatMul, Gemm, Einsum, Det: numbers (against ONNX Runtime or NumPy), shape inference (1-D operands,
batch broadcast, symbolic dimensions), older-opset import, cost, and refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.ir.graph import Graph
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import linalg as L
from compiler.ir.types import DType, TensorType
from tests.ops.util import kiln_run, ort_run, run_op

RNG = np.random.default_rng(0)


def _graph(op, *types):
    g = Graph()
    ins = [None if t is None else g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    return g.add(op, *ins)


def _run(op, *arrays):
    (y,), (out,) = run_op(op, *arrays)
    return y, out


def _vs_ort(op_type, arrays, attrs=None, opset=13, rtol=1e-5, atol=1e-5):
    names = [f"x{i}" for i in range(len(arrays))]
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in zip(names, arrays)]
    node = helper.make_node(op_type, names, ["y"], **(attrs or {}))
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(arrays[0].dtype), None)
    model = helper.make_model(helper.make_graph([node], "t", vis, [out]),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    feeds = dict(zip(names, arrays))
    ref = ort_run(model, feeds)[0]
    _, (got,) = kiln_run(model, feeds)
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# MatMul
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((2, 3), (3, 4)), ((3,), (2, 3, 4)), ((2, 3, 4), (4,)),
                                   ((2, 1, 3, 4), (5, 4, 2)), ((1, 3), (6, 3, 2))])
def test_matmul_matches_onnxruntime(sa, sb):
    a, b = _f32(*sa), _f32(*sb)
    _vs_ort("MatMul", [a, b])
    y, out = _run(L.MatMul(), a, b)
    assert y.type.shape == np.matmul(a, b).shape


@pytest.mark.parametrize("opset", [7, 9])
def test_matmul_old_opsets(opset):
    _vs_ort("MatMul", [_f32(2, 3, 4), _f32(4, 5)], opset=opset)


def test_matmul_integer_and_half():
    a = RNG.integers(-9, 9, (3, 4)).astype(np.int64)
    b = RNG.integers(-9, 9, (4, 2)).astype(np.int64)
    assert np.array_equal(_run(L.MatMul(), a, b)[1], a @ b)
    h = _f32(8, 16).astype(np.float16)
    y, out = _run(L.MatMul(), h, h.T.copy())
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, (h.astype(np.float32) @ h.T.astype(np.float32)).astype(np.float16), rtol=1e-3)


def test_matmul_symbolic_dims():
    y = _graph(L.MatMul(), TensorType(DType.f32, ("B", "T", 64)), TensorType(DType.f32, (64, 10)))
    assert y.type.shape == ("B", "T", 10)
    y = _graph(L.MatMul(), TensorType(DType.f32, ("B", 1, "T", 8)), TensorType(DType.f32, (4, 8, "T")))
    assert y.type.shape == ("B", 4, "T", "T")
    y = _graph(L.MatMul(), TensorType(DType.f32, ("K",)), TensorType(DType.f32, ("K",)))
    assert y.type.shape == ()


def test_matmul_pattern_and_cost():
    assert L.MatMul.pattern is Pattern.OUT_ELEMWISE_FUSABLE and L.Gemm.pattern is Pattern.OUT_ELEMWISE_FUSABLE
    c = L.MatMul().cost([TensorType(DType.f32, (5, 2, 3)), TensorType(DType.f32, (3, 4))],
                        [TensorType(DType.f32, (5, 2, 4))])
    assert c.flops == 2 * 5 * 2 * 4 * 3
    c = L.Gemm(transA=1).cost([TensorType(DType.f32, (3, 2)), TensorType(DType.f32, (3, 4))],
                              [TensorType(DType.f32, (2, 4))])
    assert c.flops == 2 * 2 * 4 * 3


def test_matmul_refusals():
    f = lambda *s: TensorType(DType.f32, s)  # noqa: E731
    with pytest.raises(OpError, match="inner dimensions differ"):
        _graph(L.MatMul(), f(2, 3), f(4, 5))
    with pytest.raises(OpError, match="batch dimensions .* do not broadcast"):
        _graph(L.MatMul(), f(2, 3, 4), f(3, 4, 5))
    with pytest.raises(OpError, match="rank >= 1"):
        _graph(L.MatMul(), f(), f(3))
    with pytest.raises(OpError, match="share one element type"):
        _graph(L.MatMul(), f(2, 3), TensorType(DType.f64, (3, 2)))
    with pytest.raises(OpError, match="element type bool is not supported"):
        _graph(L.MatMul(), TensorType(DType.bool, (2, 2)), TensorType(DType.bool, (2, 2)))


# ---------------------------------------------------------------------------------------------
# Gemm
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs,c_shape", [
    ({}, None), ({}, (4,)), ({"alpha": 0.5, "beta": 2.0}, (3, 4)), ({"transA": 1}, (1,)),
    ({"transB": 1, "beta": -1.0}, (3, 1)), ({"transA": 1, "transB": 1, "alpha": 0.25, "beta": 0.35}, ()),
    ({"beta": 0.0}, (1, 4))])
def test_gemm_matches_onnxruntime(attrs, c_shape):
    a = _f32(5, 3) if attrs.get("transA") else _f32(3, 5)
    b = _f32(4, 5) if attrs.get("transB") else _f32(5, 4)
    arrays = [a, b] + ([] if c_shape is None else [_f32(*c_shape)])
    _vs_ort("Gemm", arrays, attrs)


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_gemm_old_opsets(opset):
    _vs_ort("Gemm", [_f32(3, 5), _f32(5, 4), _f32(3, 4)], {"alpha": 2.0, "transB": 0}, opset=opset)


def test_gemm_integers():
    a = RNG.integers(-5, 5, (2, 3)).astype(np.int32)
    b = RNG.integers(-5, 5, (3, 2)).astype(np.int32)
    c = np.array([1, 2], np.int32)
    y, out = _run(L.Gemm(), a, b, c)
    assert out.dtype == np.int32 and np.array_equal(out, a @ b + c)
    out = _run(L.Gemm(alpha=2.0, beta=3.0), a, b, c)[1]
    assert np.array_equal(out, 2 * (a @ b) + 3 * c)


def test_gemm_shapes():
    f = lambda *s: TensorType(DType.f32, s)  # noqa: E731
    assert _graph(L.Gemm(transA=1, transB=1), f(3, "M"), f(4, 3)).type.shape == ("M", 4)
    assert _graph(L.Gemm(), f("M", 3), f(3, 4), f(7, 1)).type.shape == (7, 4)  # C pins M


def test_gemm_refusals():
    f = lambda *s: TensorType(DType.f32, s)  # noqa: E731
    with pytest.raises(OpError, match="inner dimensions differ"):
        _graph(L.Gemm(transA=1), f(3, 5), f(5, 4))
    with pytest.raises(OpError, match="must be 2-D"):
        _graph(L.Gemm(), f(2, 3, 5), f(5, 4))
    with pytest.raises(OpError, match=r"does not broadcast to the result shape \(3, 4\)"):
        _graph(L.Gemm(), f(3, 5), f(5, 4), f(3, 2))
    with pytest.raises(OpError, match="C must have rank <= 2"):
        _graph(L.Gemm(), f(3, 5), f(5, 4), f(1, 3, 4))
    with pytest.raises(OpError, match="transB must be 0 or 1"):
        L.Gemm(transB=2)
    with pytest.raises(OpError, match="share one element type"):
        _graph(L.Gemm(), f(3, 5), f(5, 4), TensorType(DType.f64, (4,)))


# ---------------------------------------------------------------------------------------------
# Einsum
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)]), ("ii->i", [(3, 3)]),
    ("ii", [(4, 4)]), ("ij->", [(3, 4)]), ("ji", [(2, 3)]), ("i,i", [(5,), (5,)]), ("i,j->ij", [(2,), (3,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]), ("...ii->...i", [(3, 4, 4)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]), ("b A , A c", [(2, 3), (3, 4)]), ("Ba,aC", [(2, 3), (3, 4)])])
def test_einsum_matches_numpy(eq, shapes):
    xs = [_f32(*s) for s in shapes]
    y, out = _run(L.Einsum(equation=eq), *xs)
    # the reference: NumPy on an equation with spaces removed (implicit mode orders labels by ASCII)
    ref = np.einsum(eq.replace(" ", ""), *xs)
    assert y.type.shape == np.shape(ref)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eq,shapes", [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij->ji", [(3, 4)]),
                                       ("...ii->...i", [(2, 3, 3)]), ("i,i", [(6,), (6,)])])
def test_einsum_matches_onnxruntime(eq, shapes):
    _vs_ort("Einsum", [_f32(*s) for s in shapes], {"equation": eq}, opset=12)


def test_einsum_implicit_output_puts_upper_case_first():
    y, out = _run(L.Einsum(equation="bA"), _f32(2, 3))
    assert y.type.shape == (3, 2)


def test_einsum_int_and_symbolic():
    a = RNG.integers(-4, 4, (2, 3)).astype(np.int32)
    assert np.array_equal(_run(L.Einsum(equation="ij,jk->ki"), a, a.T.copy())[1], (a @ a.T).T)
    y = _graph(L.Einsum(equation="bij,bjk->bik"), TensorType(DType.f32, ("B", 2, 3)),
               TensorType(DType.f32, (4, 3, 5)))
    assert y.type.shape == (4, 2, 5)


def test_einsum_refusals():
    f = lambda *s: TensorType(DType.f32, s)  # noqa: E731
    with pytest.raises(OpError, match="equation is empty"):
        L.Einsum()
    with pytest.raises(OpError, match="labels are ASCII letters"):
        L.Einsum(equation="i1,j->ij")
    with pytest.raises(OpError, match="output label.*k appear in no input"):
        L.Einsum(equation="ij->ik")
    with pytest.raises(OpError, match="the output repeats a label"):
        L.Einsum(equation="ij->ii")
    with pytest.raises(OpError, match="more than one ellipsis"):
        L.Einsum(equation="......->")
    with pytest.raises(OpError, match="has 2 operand term"):
        _graph(L.Einsum(equation="ij,jk->ik"), f(2, 3))
    with pytest.raises(OpError, match="its term 'ij' names 2 dimensions"):
        _graph(L.Einsum(equation="ij,jk->ik"), f(2, 3, 1), f(3, 4))
    with pytest.raises(OpError, match="label 'j' has size 3 and size 5"):
        _graph(L.Einsum(equation="ij,jk->ik"), f(2, 3), f(5, 4))
    with pytest.raises(OpError, match="no '...' for them"):
        _graph(L.Einsum(equation="...ij->ij"), f(2, 3, 4))


# ---------------------------------------------------------------------------------------------
# Det
# ---------------------------------------------------------------------------------------------

def test_det():
    x = _f32(3, 4, 4)
    y, out = _run(L.Det(), x)
    assert y.type.shape == (3,)
    np.testing.assert_allclose(out, np.linalg.det(x.astype(np.float64)), rtol=1e-4)
    _vs_ort("Det", [_f32(4, 4)], opset=11, rtol=1e-4)
    assert _run(L.Det(), np.array([[2.0, 1.0], [1.0, 3.0]], np.float64))[1] == pytest.approx(5.0)


def test_det_refusals():
    with pytest.raises(OpError, match="not square"):
        _graph(L.Det(), TensorType(DType.f32, (2, 3, 4)))
    with pytest.raises(OpError, match="rank >= 2"):
        _graph(L.Det(), TensorType(DType.f32, (3,)))
    with pytest.raises(OpError, match="element type i32 is not supported"):
        _graph(L.Det(), TensorType(DType.i32, (3, 3)))
