"""Native RNN, GRU and LSTM (compiler/codegen/kernels/recurrent.py) against the reference interpreter:
every direction and layout, sequence lengths (zero and full), initial states, peepholes, clip,
input_forget, linear_before_reset and activations with parameters; a sequence length out of range
is reported; float64 is refused (the interpreter runs it). ONNX's own RNN/GRU/LSTM cases run in the
conformance suite; PyTorch's nn.LSTM/nn.GRU in the real-architecture tests."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.recurrent import Recurrent
from compiler.codegen.kernels.testing import run_kernels
from compiler.errors import InputError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import recurrent as rc
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(7)
SEQ, BATCH, ISZ, HID = 5, 3, 4, 6


def _graph(op: rc._Recurrent, lens=False, init=False, peep=False, bias=True, batch=BATCH, hid=HID, r_input=False):
    nd, gates = op.num_directions, op.gates
    BATCH, HID = batch, hid  # noqa: N806 (the sizes of this graph)
    g = Graph(type(op).__name__.lower())
    xs = (SEQ, BATCH, ISZ) if op.layout == 0 else (BATCH, SEQ, ISZ)
    ins = [g.add_input("x", TensorType(DType.f32, xs)),
           g.add_constant(RNG.standard_normal((nd, gates * HID, ISZ)).astype(np.float32) * 0.5, "w"),
           g.add_input("r", TensorType(DType.f32, (nd, gates * HID, HID))) if r_input else
           g.add_constant(RNG.standard_normal((nd, gates * HID, HID)).astype(np.float32) * 0.5, "r"),
           g.add_constant(RNG.standard_normal((nd, 2 * gates * HID)).astype(np.float32) * 0.3, "b") if bias else None,
           g.add_input("lens", TensorType(DType.i32, (BATCH,))) if lens else None]
    state = (nd, BATCH, HID) if op.layout == 0 else (BATCH, nd, HID)
    for i in range(op.num_states):
        ins.append(g.add_input(f"s{i}", TensorType(DType.f32, state)) if init else None)
    if peep:
        ins.append(g.add_constant(RNG.standard_normal((nd, 3 * HID)).astype(np.float32) * 0.3, "p"))
    while ins[-1] is None:
        ins.pop()
    node = g.add_node(op, ins)
    g.set_outputs(list(node.outputs), ["y", "yh", "yc"][:len(node.outputs)])
    assert isinstance(lowering_for(KernelGroup.of_node(node))[0], Recurrent), node.describe()
    return g


def _feeds(g: Graph, lens=(5, 0, 3)):
    feeds = {}
    for v in g.inputs:
        if v.name == "lens":
            n = int(v.shape[0])
            feeds["lens"] = np.resize(np.array(lens, np.int32), n)
        else:
            feeds[v.name] = RNG.standard_normal([int(d) for d in v.shape]).astype(np.float32) * 0.5
    return feeds


CASES = [
    (rc.RNN(), {}),
    (rc.RNN(direction="reverse", activations=("Relu",)), {"init": True}),
    (rc.RNN(direction="bidirectional", layout=1, activations=("LeakyRelu", "Affine"), activation_alpha=(0.2, 0.5),
            activation_beta=(0.1,)), {"lens": True}),
    (rc.GRU(), {}),
    (rc.GRU(linear_before_reset=1, direction="bidirectional"), {"init": True, "lens": True}),
    (rc.GRU(layout=1, clip=0.7, activations=("HardSigmoid", "Softsign"), activation_alpha=(0.3,),
            activation_beta=(0.4,)), {"bias": False}),
    (rc.GRU(direction="reverse", layout=1), {"lens": True, "r_input": True}),
    (rc.GRU(linear_before_reset=1), {"r_input": True}),
    (rc.LSTM(), {}),
    (rc.LSTM(direction="bidirectional", layout=1), {"init": True, "lens": True, "peep": True}),
    (rc.LSTM(input_forget=1, clip=1.5), {"peep": True, "r_input": True}),
    (rc.LSTM(direction="reverse", activations=("Sigmoid", "ScaledTanh", "Elu"), activation_alpha=(1.2, 0.8),
             activation_beta=(0.9,)), {"lens": True, "init": True}),
    (rc.LSTM(activations=("ThresholdedRelu", "Softplus", "Tanh"), activation_alpha=(0.1,)), {}),
]


@pytest.mark.parametrize("op,kw", CASES, ids=[f"{type(o).__name__}-{i}" for i, (o, _) in enumerate(CASES)])
def test_on_the_llvm_printer(op, kw):
    g = _graph(op, **kw)
    feeds = _feeds(g)
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("batch,hid", [(3, 21), (6, 10)])  # GEMV rows in blocks and a remainder; the GEMM
def test_step_products(batch, hid):
    for op in (rc.LSTM(direction="bidirectional"), rc.GRU(), rc.GRU(linear_before_reset=1, layout=1)):
        g = _graph(op, lens=True, batch=batch, hid=hid)
        feeds = _feeds(g)
        got, want = run_kernels(g, feeds), interpret(g, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=f"{op} {name}")


def test_full_and_empty_lengths_and_one_step():
    global SEQ
    g = _graph(rc.LSTM(direction="bidirectional"), lens=True, init=True)
    feeds = _feeds(g, lens=(SEQ, SEQ, 0))
    got, want = run_kernels(g, feeds), interpret(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=name)
    assert not got["yh"][:, 2].any() and not got["yc"][:, 2].any()  # length 0: zero final states
    seq, SEQ = SEQ, 1
    try:
        g = _graph(rc.GRU(direction="bidirectional", layout=1))
        feeds = _feeds(g)
        got, want = run_kernels(g, feeds), interpret(g, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=name)
    finally:
        SEQ = seq


def _lstm_model(seq=4, batch=2, hid=3):
    w = helper.make_tensor("w", TensorProto.FLOAT, (1, 4 * hid, 2), RNG.standard_normal(8 * hid).tolist())
    r = helper.make_tensor("r", TensorProto.FLOAT, (1, 4 * hid, hid), RNG.standard_normal(4 * hid * hid).tolist())
    node = helper.make_node("LSTM", ["x", "w", "r", "", "lens"], ["y", "yh"], hidden_size=hid, name="lstm")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (seq, batch, 2)),
                                            helper.make_tensor_value_info("lens", TensorProto.INT32, (batch,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("yh", TensorProto.FLOAT, None)], [w, r])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    m.ir_version = 10
    return m


def test_a_sequence_length_out_of_range_is_reported():
    exe = compiler.compile(_lstm_model(), fallback=False)
    x = RNG.standard_normal((4, 2, 2)).astype(np.float32)
    out = exe.run({"x": x, "lens": np.array([4, 2], np.int32)})
    assert out["y"][2:, 0, 1].sum() == 0 and out["y"][:, 0, 0].all()
    for bad in (5, -1):
        with pytest.raises(InputError, match=rf"'lstm'.*{bad}"):
            exe.run({"x": x, "lens": np.array([bad, 2], np.int32)})


def test_float64_is_left_to_the_interpreter():
    g = Graph("f64")
    x = g.add_input("x", TensorType(DType.f64, (2, 1, 3)))
    node = g.add_node(rc.LSTM(hidden_size=1), [x, g.add_constant(np.zeros((1, 4, 3)), "w"),
                                               g.add_constant(np.zeros((1, 4, 1)), "r")])
    low, why = lowering_for(KernelGroup.of_node(node))
    assert low is None and "f64" in why, why
