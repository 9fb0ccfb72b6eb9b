"""RNN, GRU, LSTM: numbers against ONNX Runtime (directions, layouts, sequence_lens, initial states,
activations with alpha/beta, clip, linear_before_reset, input_forget, peepholes), shape inference, opset-1
import, cost, and refusals."""
from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import recurrent as RC
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import declare_output_types, ort_run

RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _rand(*shape, dtype=np.float32, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def _case(op, seq=4, batch=3, isz=5, hid=6, nd=1, layout=0, bias=True, lens=None, init=False, peep=False,
          dtype=np.float32):
    g = GATES[op]
    x = _rand(*((seq, batch, isz) if layout == 0 else (batch, seq, isz)), dtype=dtype)
    feeds = [("X", x), ("W", _rand(nd, g * hid, isz, dtype=dtype)), ("R", _rand(nd, g * hid, hid, dtype=dtype))]
    feeds.append(("B", _rand(nd, 2 * g * hid, dtype=dtype)) if bias else ("", None))
    feeds.append(("sequence_lens", np.asarray(lens, np.int32)) if lens is not None else ("", None))
    state = (nd, batch, hid) if layout == 0 else (batch, nd, hid)
    feeds.append(("initial_h", _rand(*state, dtype=dtype)) if init else ("", None))
    if op == "LSTM":
        feeds.append(("initial_c", _rand(*state, dtype=dtype)) if init else ("", None))
        feeds.append(("P", _rand(nd, 3 * hid, dtype=dtype)) if peep else ("", None))
    while feeds and not feeds[-1][0]:
        feeds.pop()
    return feeds


def _model(op, feeds, attrs, outputs, opset=22):
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds if n]
    node = helper.make_node(op, [n for n, _ in feeds], outputs, **attrs)
    outs = [helper.ValueInfoProto(name=o) for o in outputs if o]
    return helper.make_model(helper.make_graph([node], "t", vis, outs),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _vs_ort(op, feeds, attrs, outputs=None, rtol=1e-5, atol=1e-5, opset=22):
    outputs = outputs or (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    model = _model(op, feeds, attrs, outputs, opset)
    g = import_model(model)
    declare_output_types(model, g)
    fd = {n: a for n, a in feeds if n}
    got = interpret(g, fd)
    if attrs.get("layout", 0) == 1:
        # ONNX Runtime has no batch-first layout: run it sequence-first on transposed data
        seq_first = {n: (a.transpose(1, 0, 2) if n in ("X", "initial_h", "initial_c") else a) for n, a in fd.items()}
        ref_model = _model(op, [(n, seq_first.get(n)) for n, _ in feeds], {**attrs, "layout": 0}, outputs, opset)
        declare_output_types(ref_model, g)
        refs = ort_run(ref_model, seq_first)
        refs = [r.transpose(2, 0, 1, 3) if r.ndim == 4 else r.transpose(1, 0, 2) for r in refs]
    else:
        refs = ort_run(model, fd)
    for name, v, ref in zip(g.output_names, g.outputs, refs):
        out = got[name]
        assert out.dtype == ref.dtype and out.shape == ref.shape == v.type.shape, (name, out.shape, ref.shape)
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=name)
    return got


# ---------------------------------------------------------------------------------------------
# Numbers against ONNX Runtime
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(op, direction, layout):
    nd = 2 if direction == "bidirectional" else 1
    feeds = _case(op, nd=nd, layout=layout, init=True)
    _vs_ort(op, feeds, dict(hidden_size=6, direction=direction, layout=layout))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens(op, direction):
    nd = 2 if direction == "bidirectional" else 1
    feeds = _case(op, seq=5, batch=4, nd=nd, lens=[5, 2, 3, 1], init=True)
    _vs_ort(op, feeds, dict(hidden_size=6, direction=direction))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_sequence_lens_batch_first(op):
    feeds = _case(op, seq=5, batch=3, nd=2, layout=1, lens=[2, 5, 4])
    _vs_ort(op, feeds, dict(hidden_size=6, direction="bidirectional", layout=1))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_defaults_no_bias_no_state(op):
    _vs_ort(op, _case(op, bias=False), dict(hidden_size=6))


def test_hidden_size_inferred_from_weights():
    """Without hidden_size (ONNX Runtime requires it) the hidden size is R's last dimension."""
    feeds = _case("GRU", hid=7)
    fd = {n: a for n, a in feeds if n}
    g = import_model(_model("GRU", feeds, {}, ["Y", "Y_h"]))
    assert g.outputs[0].type.shape == (4, 1, 3, 7)
    got = interpret(g, fd)
    ref = _vs_ort("GRU", feeds, dict(hidden_size=7))
    np.testing.assert_array_equal(got["Y"], ref["Y"])


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr):
    _vs_ort("GRU", _case("GRU", nd=2, init=True), dict(hidden_size=6, direction="bidirectional",
                                                       linear_before_reset=lbr))


def test_lstm_peepholes_and_clip():
    feeds = _case("LSTM", nd=2, init=True, peep=True)
    _vs_ort("LSTM", feeds, dict(hidden_size=6, direction="bidirectional", clip=0.7))


def test_lstm_input_forget():
    feeds = _case("LSTM", init=True, peep=True)
    _vs_ort("LSTM", feeds, dict(hidden_size=6, input_forget=1))


@pytest.mark.parametrize("op,acts,alpha,beta", [
    ("RNN", ["Relu"], None, None),
    ("RNN", ["Affine"], [1.5], [0.25]),
    ("RNN", ["LeakyRelu", "ThresholdedRelu"], [0.2, 0.1], None),  # bidirectional: one per direction
    ("GRU", ["HardSigmoid", "Softsign"], [0.3], [0.6]),
    ("GRU", ["Sigmoid", "Elu", "Sigmoid", "ScaledTanh"], [0.5, 0.9], [1.3]),
    ("LSTM", ["Sigmoid", "Softplus", "Tanh"], None, None),
    ("LSTM", ["HardSigmoid", "Tanh", "Affine"], [0.25, 0.7], [0.4, 0.1]),
])
def test_activations(op, acts, alpha, beta):
    k = {"RNN": 1, "GRU": 2, "LSTM": 3}[op]
    nd = 2 if len(acts) == 2 * k else 1
    attrs = dict(hidden_size=6, activations=acts, direction="bidirectional" if nd == 2 else "forward")
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    _vs_ort(op, _case(op, nd=nd, init=True), attrs, rtol=1e-4, atol=1e-5)


def test_activation_alpha_consumed_only_by_functions_that_take_it():
    """Tanh takes no alpha, so Affine of the reverse direction gets the first value (as ONNX Runtime)."""
    op = RC.RNN(activations=("Tanh", "Affine"), activation_alpha=(3.0,), activation_beta=(0.25,),
                direction="bidirectional")
    fwd, bwd = op._bound_activations()
    assert (bwd[0].alpha, bwd[0].beta) == (3.0, 0.25)
    assert RC.RNN(activations=("tanh",)).direction == "forward"  # names are case-insensitive
    # a one-direction layer takes twice its functions only when both halves agree (RNN's default)
    assert len(RC.RNN(direction="reverse")._bound_activations()) == 1
    # a bidirectional layer given one direction's functions uses them for both
    fwd, bwd = RC.GRU(direction="bidirectional", activations=("HardSigmoid", "Relu"),
                      activation_alpha=(0.3,))._bound_activations()
    assert fwd[0].alpha == bwd[0].alpha == 0.3


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_selected_outputs(op):
    """Only Y_h (Y omitted with an empty name), or only Y."""
    feeds = _case(op, init=True)
    _vs_ort(op, feeds, dict(hidden_size=6), outputs=["", "Y_h"])
    _vs_ort(op, feeds, dict(hidden_size=6), outputs=["Y"])


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_double(op):
    """ONNX Runtime has no f64 kernels here: f64 results against its f32 ones."""
    feeds = _case(op, nd=2, init=True, dtype=np.float64)
    attrs = dict(hidden_size=6, direction="bidirectional")
    ref = _vs_ort(op, [(n, None if a is None else a.astype(np.float32)) for n, a in feeds], attrs)
    g = import_model(_model(op, feeds, attrs, list(ref)))
    got = interpret(g, {n: a for n, a in feeds if n})
    for name in ref:
        assert got[name].dtype == np.float64
        np.testing.assert_allclose(got[name], ref[name], atol=1e-5)


def test_half_is_computed_in_f32():
    feeds = dict((n, a) for n, a in _case("GRU", init=True) if n)
    half = {k: v.astype(np.float16) for k, v in feeds.items()}
    g = Graph()
    ins = [g.add_input(k, TensorType.of(v)) for k, v in half.items()]
    node = g.add_node(RC.GRU(hidden_size=6), ins[:3] + [ins[3], None, ins[4]])
    g.set_outputs(list(node.outputs), ["Y", "Y_h"])
    out = interpret(g, half)
    ref = RC.GRU(hidden_size=6).compute(*[v.astype(np.float32) for v in (half["X"], half["W"], half["R"], half["B"])],
                                        None, half["initial_h"].astype(np.float32))
    assert out["Y"].dtype == np.float16
    np.testing.assert_allclose(out["Y"].astype(np.float32), ref[0], atol=2e-3)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_opset_1_output_sequence(op):
    """Opsets 1-6 have output_sequence (dropped on import; ONNX Runtime has no kernel for them)."""
    feeds = _case(op, init=True)
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    fd = {n: a for n, a in feeds if n}
    old = import_model(_model(op, feeds, dict(hidden_size=6, output_sequence=1), outputs, opset=1))
    ref = _vs_ort(op, feeds, dict(hidden_size=6))
    got = interpret(old, fd)
    for name in outputs:
        np.testing.assert_array_equal(got[name], ref[name])


def test_gru_1_misspelled_default_direction():
    feeds = _case("GRU", init=True)
    g = import_model(_model("GRU", feeds, dict(hidden_size=6, direction="foward"), ["Y", "Y_h"], opset=1))
    assert g.nodes[0].op.direction == "forward"


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_zero_length_sequence(op):
    """A batch entry of length 0: zeros in Y and zero final states (as ONNX Runtime), even with initial states."""
    feeds = _case(op, seq=3, batch=3, nd=2, lens=[0, 3, 1], init=True)
    got = _vs_ort(op, feeds, dict(hidden_size=6, direction="bidirectional"))
    assert not got["Y_h"][:, 0].any() and not got["Y"][:, :, 0].any()


# ---------------------------------------------------------------------------------------------
# Inference, cost, pattern
# ---------------------------------------------------------------------------------------------

def test_symbolic_shapes():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("S", "N", 5)))
    w = g.add_input("w", TensorType(DType.f32, (2, 24, 5)))
    r = g.add_input("r", TensorType(DType.f32, (2, 24, 6)))
    node = g.add_node(RC.LSTM(direction="bidirectional"), [x, w, r])
    assert [v.type.shape for v in node.outputs] == [("S", 2, "N", 6), (2, "N", 6), (2, "N", 6)]
    node = g.add_node(RC.LSTM(direction="bidirectional", layout=1), [x, w, r])
    assert [v.type.shape for v in node.outputs] == [("S", "N", 2, 6), ("S", 2, 6), ("S", 2, 6)]


def test_cost_counts_the_matmuls():
    op = RC.GRU(hidden_size=6)
    x, w, r = TensorType(DType.f32, (4, 3, 5)), TensorType(DType.f32, (1, 18, 5)), TensorType(DType.f32, (1, 18, 6))
    outs = [TensorType(DType.f32, (4, 1, 3, 6)), TensorType(DType.f32, (1, 3, 6))]
    c = op.cost([x, w, r], outs)
    assert c.flops >= 2 * 4 * 3 * 18 * (5 + 6)
    assert RC.GRU.pattern is Pattern.OPAQUE


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make,match", [
    (lambda: RC.RNN(direction="sideways"), "direction"),
    (lambda: RC.GRU(layout=2), "layout"),
    (lambda: RC.LSTM(hidden_size=0), "hidden_size"),
    (lambda: RC.LSTM(clip=-1.0), "clip"),
    (lambda: RC.RNN(activations=("Gelu",)), "activation 'Gelu' is not supported"),
    (lambda: RC.GRU(activations=("Sigmoid",)), "activations must list 2"),
    (lambda: RC.LSTM(activations=("Sigmoid", "Tanh")), "activations must list 3"),
    (lambda: RC.RNN(activations=("Tanh",), activation_alpha=(1.0,)), "activation_alpha"),
    (lambda: RC.RNN(activations=("Affine",), activation_beta=(1.0, 2.0)), "activation_beta"),
    (lambda: RC.GRU(activations=("Sigmoid", "Tanh", "Sigmoid", "Relu")), "direction=forward takes 2"),
    (lambda: RC.GRU(linear_before_reset=2), "linear_before_reset"),
    (lambda: RC.LSTM(input_forget=3), "input_forget"),
])
def test_bad_attributes(make, match):
    with pytest.raises(OpError, match=match):
        make()


def _add(op, *types):
    g = Graph()
    ins = [None if t is None else g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    return g.add_node(op, ins)


def test_bad_inputs():
    f32 = lambda *s: TensorType(DType.f32, s)  # noqa: E731
    with pytest.raises(OpError, match="num_directions|W has shape"):
        _add(RC.RNN(direction="bidirectional"), f32(4, 3, 5), f32(1, 6, 5), f32(1, 6, 6))
    with pytest.raises(OpError, match="W has shape"):
        _add(RC.GRU(hidden_size=6), f32(4, 3, 5), f32(1, 12, 5), f32(1, 12, 6))
    with pytest.raises(OpError, match="W has shape"):
        _add(RC.LSTM(), f32(4, 3, 5), f32(1, 24, 7), f32(1, 24, 6))
    with pytest.raises(OpError, match="B has shape"):
        _add(RC.RNN(), f32(4, 3, 5), f32(1, 6, 5), f32(1, 6, 6), f32(1, 6))
    with pytest.raises(OpError, match="initial_h has shape"):
        _add(RC.RNN(layout=1), f32(4, 3, 5), f32(1, 6, 5), f32(1, 6, 6), None, None, f32(1, 4, 6))
    with pytest.raises(OpError, match="P has shape"):
        _add(RC.LSTM(), f32(4, 3, 5), f32(1, 24, 5), f32(1, 24, 6), None, None, None, None, f32(1, 12))
    with pytest.raises(OpError, match="rank 3"):
        _add(RC.RNN(), f32(4, 5), f32(1, 6, 5), f32(1, 6, 6))
    with pytest.raises(OpError, match="share one element type"):
        _add(RC.RNN(), f32(4, 3, 5), TensorType(DType.f64, (1, 6, 5)), f32(1, 6, 6))
    with pytest.raises(OpError, match="not supported"):
        _add(RC.RNN(), *[TensorType(DType.i32, s) for s in [(4, 3, 5), (1, 6, 5), (1, 6, 6)]])
    with pytest.raises(OpError, match="sequence_lens"):
        _add(RC.RNN(), f32(4, 3, 5), f32(1, 6, 5), f32(1, 6, 6), None, f32(3))


def test_sequence_lens_out_of_range_fails_at_run_time():
    feeds = dict((n, a) for n, a in _case("RNN", seq=3, batch=2, lens=[4, 1]) if n)
    with pytest.raises(ValueError, match="sequence_lens"):
        RC.RNN().compute(feeds["X"], feeds["W"], feeds["R"], feeds["B"], feeds["sequence_lens"])



def test_export_round_trip():
    from frontends.onnx.exporter import export_model

    feeds = _case("LSTM", nd=2, init=True, peep=True)
    attrs = dict(hidden_size=6, direction="bidirectional", activations=["Sigmoid", "Affine", "Tanh"] * 2,
                 activation_alpha=[0.5, 0.7], activation_beta=[0.1, 0.2], clip=2.0, input_forget=1)
    g = import_model(_model("LSTM", feeds, attrs, ["Y", "Y_h", "Y_c"]))
    model = export_model(g)
    onnx.checker.check_model(model, full_check=True)
    fd = {n: a for n, a in feeds if n}
    want, got = interpret(g, fd), interpret(import_model(model), fd)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_pytorch_exported_layers(kind):
    """PyTorch's exporter: a 2-layer bidirectional LSTM, a batch-first GRU, a ReLU RNN, against PyTorch."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    mod = {"LSTM": lambda: torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True),
           "GRU": lambda: torch.nn.GRU(5, 7, batch_first=True),
           "RNN": lambda: torch.nn.RNN(5, 7, nonlinearity="relu", bidirectional=True)}[kind]()
    x = torch.randn(4, 3, 5)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(mod, (x,), f, opset_version=14, dynamo=False)
    g = import_model(onnx.load_from_string(f.getvalue()))
    assert kind in g.op_counts()
    out = interpret(g, {g.inputs[0].name: x.numpy()})
    with torch.no_grad():
        ref = mod(x)[0].numpy()
    np.testing.assert_allclose(out[g.output_names[0]], ref, atol=1e-5)
