"""Signal family: DFT (forward/inverse, RFFT/IRFFT, dft_length, axis input, opset-17 axis attribute),
STFT, Hann/Hamming/Blackman windows and MelWeightMatrix: numbers against ONNX Runtime or NumPy,
shape inference, and refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError
from compiler.ir.ops import signal as S
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import assert_close, kiln_run, ort_run

RNG = np.random.default_rng(0)


def _model(op_type, inputs, outputs, attrs, opset, initializers=(), out_type=TensorProto.FLOAT, names=None):
    """One-node model. ``inputs``: (name, array) fed at run time ("" for a missing optional input), then
    the initializers (``names`` gives the node's input names in order instead)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs if n]
    names = names or [n for n, _ in inputs] + [t.name for t in initializers]
    node = helper.make_node(op_type, names, outputs, **attrs)
    outs = [helper.make_tensor_value_info(o, out_type, None) for o in outputs]
    g = helper.make_graph([node], "t", vis, outs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _vs_ort(model, feeds, rtol=1e-5, atol=1e-4):
    _, outs = kiln_run(model, feeds)
    assert_close(outs, ort_run(model, feeds), rtol, atol)
    return outs


def _complex(x):
    return x[..., 0] + 1j * x[..., 1]


def _graph1(op, *types):
    g = Graph()
    vs = [None if t is None else g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    return g, g.add_node(op, vs)


# ---------------------------------------------------------------------------------------------
# DFT
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs, parts, axis, length", [
    ({}, 1, 1, None), ({}, 2, 2, None), ({"inverse": 1}, 2, 1, None), ({"onesided": 1}, 1, 1, None),
    ({"onesided": 1, "inverse": 1}, 2, 2, None), ({}, 1, -2, 12), ({}, 2, 1, 5), ({"onesided": 1}, 1, 2, 7),
])
def test_dft_opset20_vs_ort(attrs, parts, axis, length):
    x = RNG.standard_normal((2, 6, 8, parts)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(axis, np.int64), "axis")]
    names = [("x", x)]
    if length is not None:
        inits.insert(0, numpy_helper.from_array(np.array(length, np.int64), "n"))
    else:
        names.append(("", None))
    _vs_ort(_model("DFT", names, ["y"], attrs, 20, inits), {"x": x})


def test_dft_numbers_vs_numpy():
    x = RNG.standard_normal((3, 10, 2)).astype(np.float64)
    op = S.DFT()
    (y,) = op.compute(x, None, np.array(1))
    np.testing.assert_allclose(_complex(y), np.fft.fft(_complex(x), axis=1), rtol=1e-12)
    (yi,) = S.DFT(inverse=1).compute(y, None, np.array(-2))
    np.testing.assert_allclose(yi, x, rtol=1e-12, atol=1e-12)
    (r,) = S.DFT(onesided=1).compute(x[..., :1], np.array(9), np.array(1))
    np.testing.assert_allclose(_complex(r), np.fft.rfft(x[..., 0], n=9, axis=1), rtol=1e-12)
    (back,) = S.DFT(onesided=1, inverse=1).compute(r, np.array(9), np.array(1))
    np.testing.assert_allclose(back[..., 0], x[:, :9, 0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("axis", [None, 1, 2])
def test_dft_opset17_axis_attribute_vs_ort(axis):
    """Opset 17 takes axis as an attribute with default 1 (opset 20's input defaults to -2)."""
    x = RNG.standard_normal((2, 5, 6, 1)).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    m = _model("DFT", [("x", x)], ["y"], attrs, 17)
    (y,) = _vs_ort(m, {"x": x})
    np.testing.assert_allclose(_complex(y), np.fft.fft(x[..., 0], axis=axis or 1), rtol=1e-4, atol=1e-4)
    assert "axis" not in import_model(m).nodes[0].op.attributes()


def test_dft_shape_inference():
    # axis known -> the transformed dim is dft_length (or the one-sided bin count)
    g, n = _graph1(S.DFT(onesided=1), TensorType(DType.f32, ("B", 16, 1)))
    assert str(n.output.type) == "f32[B,9,2]"
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("B", "N", 2)))
    assert str(g.add(S.DFT(), x).type) == "f32[B,N,2]"
    ln = g.add_constant(np.array(32, np.int64))
    assert str(g.add(S.DFT(inverse=1, onesided=1), x, ln).type) == "f32[B,32,1]"
    # axis unknown at compile time: the rank is still known
    ax = g.add_input("ax", TensorType(DType.i64, ()))
    assert str(g.add(S.DFT(), x, None, ax).type) == "f32[B,N,2]"
    assert str(g.add(S.DFT(onesided=1, inverse=1), x, None, ax).type) == "f32[?,?,1]"


@pytest.mark.parametrize("op, shape, axis, match", [
    (S.DFT(), (2, 8, 1), 2, "out of range"),
    (S.DFT(), (2, 8, 3), -2, "must be 1 \\(real\\) or 2"),
    (S.DFT(onesided=1), (2, 8, 2), -2, "needs a real input"),
    (S.DFT(onesided=1, inverse=1), (2, 8, 1), -2, "one-sided complex input"),
    (S.DFT(), (8,), None, "rank >= 2"),
])
def test_dft_refusals(op, shape, axis, match):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, shape))
    ax = None if axis is None else g.add_constant(np.array(axis, np.int64))
    with pytest.raises(OpError, match=match):
        g.add_node(op, [x, None, ax])


def test_dft_refusals_attributes_and_types():
    with pytest.raises(OpError, match="onesided"):
        S.DFT(onesided=2)
    g = Graph()
    x = g.add_input("x", TensorType(DType.i32, (2, 8, 1)))
    with pytest.raises(OpError, match="input has element type i32"):
        g.add_node(S.DFT(), [x])
    y = g.add_input("y", TensorType(DType.f32, (2, 8, 1)))
    n = g.add_constant(np.array([4, 5], np.int64))
    with pytest.raises(OpError, match="dft_length must be a scalar"):
        g.add_node(S.DFT(), [y, n])


# ---------------------------------------------------------------------------------------------
# STFT
# ---------------------------------------------------------------------------------------------

def test_stft_with_window_vs_ort():
    sig = RNG.standard_normal((2, 100, 1)).astype(np.float32)
    win = np.hanning(16).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(6, np.int64), "step"), numpy_helper.from_array(win, "win")]
    m = _model("STFT", [("sig", sig)], ["y"], {}, 17, inits)
    (y,) = _vs_ort(m, {"sig": sig})
    assert y.shape == (2, (100 - 16) // 6 + 1, 9, 2)
    assert str(import_model(m).outputs[0].type) == "f32[2,15,9,2]"


def test_stft_frame_length_two_sided_complex_vs_numpy():
    sig = RNG.standard_normal((1, 40, 2)).astype(np.float64)
    (y,) = S.STFT(onesided=0).compute(sig, np.array(5), None, np.array(8))
    c = _complex(sig)[0]
    ref = np.stack([np.fft.fft(c[i * 5: i * 5 + 8]) for i in range((40 - 8) // 5 + 1)])
    assert y.shape == (1, 7, 8, 2) and y.dtype == np.float64
    np.testing.assert_allclose(_complex(y)[0], ref, rtol=1e-12, atol=1e-12)


def test_stft_frame_length_vs_ort():
    sig = RNG.standard_normal((1, 64, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(8, np.int64), "step"),
             numpy_helper.from_array(np.array(16, np.int64), "len")]
    m = _model("STFT", [("sig", sig)], ["y"], {}, 17, inits, names=["sig", "step", "", "len"])
    _vs_ort(m, {"sig": sig})


def test_stft_refusals():
    g = Graph()
    sig = g.add_input("s", TensorType(DType.f32, (1, 64, 2)))
    real = g.add_input("r", TensorType(DType.f32, (1, 64, 1)))
    step = g.add_constant(np.array(4, np.int64))
    win = g.add_constant(np.ones(16, np.float32))
    ln = g.add_constant(np.array(8, np.int64))
    with pytest.raises(OpError, match="onesided=1 needs a real signal"):
        g.add_node(S.STFT(), [sig, step])
    with pytest.raises(OpError, match="differs from the window length"):
        g.add_node(S.STFT(), [real, step, win, ln])
    with pytest.raises(OpError, match="must be 3D"):
        g.add_node(S.STFT(), [g.add_input("x", TensorType(DType.f32, (64,))), step])
    with pytest.raises(OpError, match="frame_step must be positive"):
        g.add_node(S.STFT(), [real, g.add_constant(np.array(0, np.int64)), win])


# ---------------------------------------------------------------------------------------------
# Windows and MelWeightMatrix
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_vs_ort(op_type, periodic):
    size = np.array(11, np.int64)
    _vs_ort(_model(op_type, [("n", size)], ["y"], {"periodic": periodic}, 17), {"n": size}, atol=1e-6)


def test_windows_by_hand_and_output_datatype():
    (w,) = S.HannWindow(periodic=0, output_datatype=DType.f64).compute(np.array(5))
    assert w.dtype == np.float64
    np.testing.assert_allclose(w, [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-15)
    (w,) = S.BlackmanWindow().compute(np.array(4, np.int32))
    np.testing.assert_allclose(w, 0.42 - 0.5 * np.cos(np.arange(4) * np.pi / 2) + 0.08 * np.cos(np.arange(4) * np.pi),
                               atol=1e-12)
    (w,) = S.HammingWindow(periodic=0).compute(np.array(1))
    np.testing.assert_allclose(w, [1.0])
    m = _model("HannWindow", [("n", np.array(8, np.int32))], ["y"], {"output_datatype": TensorProto.DOUBLE}, 17,
               out_type=TensorProto.DOUBLE)
    g = import_model(m)
    assert str(g.outputs[0].type) == "f64[?]"
    assert interpret(g, {"n": np.array(8, np.int32)})["y"].shape == (8,)


def test_window_refusals():
    with pytest.raises(OpError, match="periodic"):
        S.HannWindow(periodic=3)
    with pytest.raises(OpError, match="output_datatype"):
        S.HammingWindow(output_datatype=DType.string)
    g = Graph()
    with pytest.raises(OpError, match="element type f32"):
        g.add_node(S.HannWindow(), [g.add_input("n", TensorType(DType.f32, ()))])
    with pytest.raises(OpError, match="size must be a scalar"):
        g.add_node(S.HannWindow(), [g.add_constant(np.array([3, 4], np.int64))])
    assert str(g.add(S.BlackmanWindow(), g.add_constant(np.array(6, np.int64))).type) == "f32[6]"


@pytest.mark.parametrize("mel, dft, rate, lo, hi", [(8, 64, 16000, 0.0, 8000.0), (10, 512, 22050, 80.0, 7600.0),
                                                     (4, 16, 8192, 0.0, 4096.0)])
def test_mel_weight_matrix_vs_ort(mel, dft, rate, lo, hi):
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("m", mel), ("d", dft), ("r", rate))]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", lo), ("hi", hi))]
    m = _model("MelWeightMatrix", [], ["y"], {}, 17, inits)
    (y,) = _vs_ort(m, {}, atol=1e-6)
    assert y.shape == (dft // 2 + 1, mel)
    assert str(import_model(m).outputs[0].type) == f"f32[{dft // 2 + 1},{mel}]"


def test_mel_weight_matrix_refusals():
    with pytest.raises(OpError, match="output_datatype"):
        S.MelWeightMatrix(output_datatype=DType.bool)
    g = Graph()
    i = g.add_constant(np.array(8, np.int64))
    f = g.add_constant(np.array(0.0, np.float32))
    with pytest.raises(OpError, match="lower_edge_hertz has element type i64"):
        g.add_node(S.MelWeightMatrix(), [i, i, i, i, f])
    with pytest.raises(OpError, match="num_mel_bins must be positive"):
        g.add_node(S.MelWeightMatrix(), [g.add_constant(np.array(0, np.int64)), i, i, f, f])
