"""Control flow (If, Loop, Scan, SequenceMap): numbers against ONNX Runtime or by hand, closure
conversion on import (outer values become explicit inputs, through nested bodies), type inference
across body boundaries (joins, loop-carried fixed points), refusals, the text format with nested
regions, the verifier, the passes (CSE, folding, DCE inside bodies) and export."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler.codegen.fusion import CPU_FUSION
from compiler.errors import ModelError, UnsupportedError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import InterpreterError, interpret
from compiler.ir.ops import OpError, Pattern, lookup
from compiler.ir.ops.control import If, Loop, Scan, SequenceMap, bind, inline_graph, join_types
from compiler.ir.parser import ParseError, parse
from compiler.ir.printer import external_weights, print_graph
from compiler.ir.types import DType, OptionalType, SequenceType, TensorType
from compiler.ir.verify import check, verify
from compiler.passes.manager import PassManager
from compiler.passes.options import CompileOptions
from compiler.passes.pipeline import pipeline
from compiler.passes.simplify.cse import EliminateCommonSubexpressions
from compiler.passes.simplify.fold_constants import FoldConstants
from frontends.onnx import import_model
from frontends.onnx.exporter import export_model

F32, I64, BOOL = DType.f32, DType.i64, DType.bool
Add, Mul, Neg, Abs, Identity, Concat, RandomNormal = (lookup(n) for n in (
    "Add", "Mul", "Neg", "Abs", "Identity", "Concat", "RandomNormal"))


def T(shape, dtype=F32):
    return TensorType(dtype, tuple(shape))


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def fv(name):
    """A float value info of unknown shape (as ONNX bodies often declare them)."""
    return vi(name, TensorProto.FLOAT, None)


def model(nodes, inputs, outputs, opset=18, inits=()):
    m = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def run_ort(m, feeds):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def kiln(m, feeds):
    g = import_model(m)
    verify(g)
    out = interpret(g, feeds)
    return g, [out[n] for n in g.output_names]


def check_all_ways(m, feeds, rtol=1e-6):
    """Kiln = ONNX Runtime on the model; the text round trip and the exported model agree too."""
    g, got = kiln(m, feeds)
    want = run_ort(m, feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol)
        assert a.dtype == b.dtype and a.shape == b.shape
    text = print_graph(g)
    g2 = parse(text, external_weights(g))
    verify(g2)
    assert print_graph(g2) == text
    exported = export_model(g)
    onnx.checker.check_model(exported, full_check=True)
    for a, b in zip(run_ort(exported, feeds), want):
        np.testing.assert_allclose(a, b, rtol=rtol)
    return g


def branch(name, opcls, t=T(["N"])):
    b = Graph(name)
    x = b.add_input("x", t)
    b.set_outputs([b.add(opcls(), x)], ["y"])
    return b


# ---------------------------------------------------------------------------------------------
# If
# ---------------------------------------------------------------------------------------------

def _if_model(outer_in_then=True):
    """y = If(c) {then: x * w (w: an outer initializer), else: Neg(x)}: both branches read outer x."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t"])], "then", [], [fv("t")])
    els = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [fv("e")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)
    w = helper.make_tensor("w", TensorProto.FLOAT, [3], [2.0, 3.0, 4.0])
    return model([node], [vi("c", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, ["N", 3])],
                 [vi("y", TensorProto.FLOAT, ["N", 3])], inits=[w])


@pytest.mark.parametrize("c", [True, False])
def test_if_numbers_and_closure_conversion(c):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    g = check_all_ways(_if_model(), {"c": np.array(c), "x": x})
    (node,) = g.nodes
    # the captures are explicit: cond, then the union of what either branch reads (x, w)
    assert [v.name for v in node.inputs] == ["c", "x", "w"]
    assert [v.name for v in node.op.then_branch.inputs] == ["x", "w"]
    assert [v.name for v in node.op.else_branch.inputs] == ["x", "w"]  # w unused here, but taken
    assert node.output.type == T(["N", 3])
    assert node.op.pattern is Pattern.OPAQUE


def test_if_result_types_join_and_known_cond_picks():
    t, e = branch("t", Abs, T([2])), branch("e", Abs, T([3]))
    op = If(then_branch=t, else_branch=e)
    g = Graph()
    c = g.add_input("c", T([], BOOL))
    x = g.add_input("x", T([2]))
    # the branches take x as their own f32[2] / f32[3]: the else branch does not fit
    with pytest.raises(OpError, match=r"else_branch input 0 \(x\): f32\[2\] is given where the body takes f32\[3\]"):
        g.add(op, c, x)
    e2 = Graph("e")
    xe = e2.add_input("x", T([2]))
    e2.set_outputs([g2 := e2.add(Concat(axis=0), xe, xe)], ["y"])
    op = If(then_branch=t, else_branch=e2)
    assert g.add(op, c, x).type == T([None])  # f32[2] or f32[4]
    assert g.add(op, g.add_constant(np.array(True)), x).type == T([2])
    assert g.add(op, g.add_constant(np.array(False)), x).type == T([4])
    assert g2.type == T([4])


def test_if_refusals():
    t, e = branch("t", Abs), branch("e", Abs)
    g = Graph()
    x = g.add_input("x", T([2]))
    with pytest.raises(OpError, match="cond must be a bool tensor, got f32"):
        g.add(If(then_branch=t, else_branch=e), x, x)
    c = g.add_input("c", T([2], BOOL))
    with pytest.raises(OpError, match="cond must have one element"):
        g.add(If(then_branch=t, else_branch=e), c, x)
    c1 = g.add_input("c1", T([], BOOL))
    with pytest.raises(OpError, match=r"takes cond and the 1 captured value\(s\)"):
        g.add(If(then_branch=t, else_branch=e), c1)
    two = Graph("two")
    a, b = two.add_input("a", T([2])), two.add_input("b", T([2]))
    two.set_outputs([a], ["y"])
    with pytest.raises(OpError, match="the branches take different numbers of inputs"):
        If(then_branch=t, else_branch=two)
    with pytest.raises(OpError, match="attribute then_branch=3: expected a graph"):
        If(then_branch=3, else_branch=e)
    # different ranks with a condition not known at compile time: no rank for the result
    scalar = Graph("s")
    s_in = scalar.add_input("x", T(["N"]))
    scalar.set_outputs([scalar.add(lookup("ReduceSum")(keepdims=0), s_in)], ["y"])
    with pytest.raises(OpError, match=r"result 0: then_branch gives f32\[\], else_branch f32\[2\]"):
        g.add(If(then_branch=scalar, else_branch=e), c1, x)


def test_if_with_known_cond_imports_only_the_taken_branch():
    # the else branch is not even valid for these inputs (a Split of 3 into 2 equal parts)
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [fv("t")])
    els = helper.make_graph([helper.make_node("Split", ["x"], ["e", "e2"], num_outputs=2, axis=0)], "else", [],
                            [fv("e")])
    nodes = [helper.make_node("Constant", [], ["c"], value_int=1),
             helper.make_node("Cast", ["c"], ["cb"], to=TensorProto.BOOL),
             helper.make_node("If", ["cb"], ["y"], then_branch=then, else_branch=els)]
    m = model(nodes, [vi("x", TensorProto.FLOAT, [3])], [vi("y", TensorProto.FLOAT, [3])])
    g, (y,) = kiln(m, {"x": np.array([1, 2, 3], np.float32)})
    assert g.op_counts() == {"Cast": 1, "Neg": 1}
    np.testing.assert_array_equal(y, [-1, -2, -3])


# ---------------------------------------------------------------------------------------------
# Loop
# ---------------------------------------------------------------------------------------------

def _loop_model(cond_stop=None):
    """acc = acc + x * i for i < M (and while acc[0] < cond_stop); scan out the running acc.
    The body reads the outer x (a capture)."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
             helper.make_node("Identity", ["acc_out"], ["scan"])]
    if cond_stop is None:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        nodes += [helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
                  helper.make_node("Less", ["s", "stop"], ["cond_out"])]
    body = helper.make_graph(nodes, "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []),
                                              fv("acc_in")],
                             [vi("cond_out", TensorProto.BOOL, []), fv("acc_out"),
                              fv("scan")])
    loop = helper.make_node("Loop", ["M", "cond", "acc0"], ["acc", "scans"], body=body)
    stop = helper.make_tensor("stop", TensorProto.FLOAT, [], [cond_stop or 0.0])
    return model([loop], [vi("M", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []),
                          vi("acc0", TensorProto.FLOAT, [2]), vi("x", TensorProto.FLOAT, [2])],
                 [vi("acc", TensorProto.FLOAT, [2]), vi("scans", TensorProto.FLOAT, [None, 2])], inits=[stop])


@pytest.mark.parametrize("trip", [1, 4])
def test_loop_numbers_against_onnxruntime(trip):
    feeds = {"M": np.array(trip, np.int64), "cond": np.array(True), "acc0": np.array([1, 2], np.float32),
             "x": np.array([0.5, -1], np.float32)}
    g = check_all_ways(_loop_model(), feeds)
    (node,) = g.nodes
    assert node.op.num_captures == 1 and node.inputs[-1].name == "x"
    assert [v.type for v in node.outputs] == [T([2]), T([None, 2])]


def test_loop_zero_iterations():
    feeds = {"M": np.array(0, np.int64), "cond": np.array(True), "acc0": np.array([1, 2], np.float32),
             "x": np.array([0.5, -1], np.float32)}
    _, (acc, scans) = kiln(_loop_model(), feeds)
    np.testing.assert_array_equal(acc, [1, 2])
    assert scans.shape == (0, 2)  # ONNX Runtime gives (0,): it does not know the per-iteration shape


def test_loop_stops_on_its_condition():
    feeds = {"M": np.array(100, np.int64), "cond": np.array(True), "acc0": np.array([0, 0], np.float32),
             "x": np.array([1, 1], np.float32)}
    g = check_all_ways(_loop_model(cond_stop=10.0), feeds)
    out = interpret(g, feeds)
    assert out["scans"].shape == (4, 2)  # sums 0, 2, 6, 12: stops after the fourth


def test_loop_carried_value_that_grows_gets_a_widened_type():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["co"]), helper.make_node("Concat", ["v", "one"], ["vo"], axis=0)],
        "grow", [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []), fv("v")],
        [vi("co", TensorProto.BOOL, []), fv("vo")])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    m = model([helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
              [vi("M", TensorProto.INT64, []), vi("v0", TensorProto.FLOAT, [0])], [vi("v", TensorProto.FLOAT, [None])],
              inits=[one])
    g = check_all_ways(m, {"M": np.array(3, np.int64), "v0": np.zeros(0, np.float32)})
    (node,) = g.nodes
    assert node.op.body.inputs[2].type == T([None])  # f32[0] at first, one longer each time
    assert node.output.type == T([None])


def test_loop_known_trip_count_gives_static_scan_outputs_and_folds():
    body = Graph("body")
    i = body.add_input("i", T([], I64))
    c = body.add_input("c", T([], BOOL))
    acc = body.add_input("acc", T([]))
    s = body.add(Add(), acc, body.add(lookup("Cast")(to=F32), i))
    body.set_outputs([c, s, s], ["c", "acc", "s"])
    g = Graph()
    node = g.add_node(Loop(body=body), [g.add_constant(np.array(4, np.int64)), None, g.add_constant(np.float32(0))])
    assert [v.type for v in node.outputs] == [T([]), T([4])]
    np.testing.assert_array_equal(node.outputs[1].known, [0, 1, 3, 6])  # known: all inputs are
    g.set_outputs(list(node.outputs), ["acc", "s"])
    assert FoldConstants().run(g) and not g.nodes
    np.testing.assert_array_equal(interpret(g, {})["s"], [0, 1, 3, 6])


def test_loop_refusals():
    body = Graph("body")
    i, c = body.add_input("i", T([], I64)), body.add_input("c", T([], BOOL))
    body.set_outputs([c], ["c"])
    g = Graph()
    with pytest.raises(OpError, match="neither a trip count M nor a condition"):
        g.add_node(Loop(body=body), [None, None])
    with pytest.raises(OpError, match="M must be a i64 tensor"):
        g.add_node(Loop(body=body), [g.add_input("m", T([], DType.i32)), None])
    bad = Graph("bad")
    bad.add_input("i", T([], DType.i32))
    bad.add_input("c", T([], BOOL))
    with pytest.raises(OpError, match=r"input 0 \(the iteration number\) must be i64\[\]"):
        Loop(body=bad)
    grows = Graph("grows")
    grows.add_input("i", T([], I64))
    c2 = grows.add_input("c", T([], BOOL))
    v = grows.add_input("v", T([2]))
    grows.set_outputs([c2, grows.add(Concat(axis=0), v, v)], ["c", "v"])
    with pytest.raises(OpError, match=r"loop-carried value 0 \(v\) is taken as f32\[2\] but returned as f32\[4\]"):
        Loop(body=grows)
    keeps = Graph("keeps")
    keeps.add_input("i", T([], I64))
    c3 = keeps.add_input("c", T([], BOOL))
    v3 = keeps.add_input("v", T([2]))
    keeps.set_outputs([c3, v3], ["c", "v"])
    with pytest.raises(OpError, match=r"takes M, cond, 1 loop-carried value\(s\) and 0 captured"):
        g.add_node(Loop(body=keeps), [g.add_constant(np.array(1, np.int64)), None])
    with pytest.raises(OpError, match="num_captures must be >= 0"):
        Loop(body=body, num_captures=-1)


# ---------------------------------------------------------------------------------------------
# Scan
# ---------------------------------------------------------------------------------------------

def _scan_body(extra=None):
    nodes = [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "k"], ["y_t"])]
    return helper.make_graph(nodes, "sb", [fv("s_in"), fv("x_t")],
                             [fv("s_out"), fv("y_t")])


@pytest.mark.parametrize("attrs", [{}, {"scan_input_axes": [1], "scan_output_axes": [1]},
                                   {"scan_input_directions": [1], "scan_output_directions": [1]},
                                   {"scan_input_axes": [-1], "scan_output_axes": [-1], "scan_input_directions": [1]}])
def test_scan_numbers_against_onnxruntime(attrs):
    node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=_scan_body(), num_scan_inputs=1, **attrs)
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [2.0])  # read by the body: a capture
    m = model([node], [vi("s0", TensorProto.FLOAT, [3]), vi("x", TensorProto.FLOAT, [3, 3])],
              [fv("s"), fv("y")], inits=[k])
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    g = check_all_ways(m, {"s0": np.array([1, 0, -1], np.float32), "x": x})
    assert g.nodes[0].op.num_captures == 1
    assert [v.type for v in g.nodes[0].outputs] == [T([3]), T([3, 3])]


def test_scan_opset8_batched_form_becomes_a_loop():
    node = helper.make_node("Scan", ["", "s0", "x"], ["s", "y"], body=_scan_body(), num_scan_inputs=1)
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [2.0])
    m = model([node], [vi("s0", TensorProto.FLOAT, [2, 3]), vi("x", TensorProto.FLOAT, [2, 4, 3])],
              [vi("s", TensorProto.FLOAT, [2, 3]), vi("y", TensorProto.FLOAT, [2, 4, 3])], opset=8, inits=[k])
    s0 = np.array([[1, 0, -1], [0, 0, 1]], np.float32)
    x = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    g, (s, y) = kiln(m, {"s0": s0, "x": x})
    assert g.op_counts() == {"Loop": 1}
    assert [v.type for v in g.nodes[0].outputs] == [T([2, 3]), T([2, 4, 3])]
    want_s = s0 + x.sum(axis=1)
    np.testing.assert_allclose(s, want_s)
    np.testing.assert_allclose(y, 2 * (s0[:, None, :] + np.cumsum(x, axis=1)))
    lens = helper.make_tensor("lens", TensorProto.INT32, [2], [4, 3])
    node8 = helper.make_node("Scan", ["lens", "s0", "x"], ["s", "y"], body=_scan_body(), num_scan_inputs=1)
    m8 = model([node8], [vi("s0", TensorProto.FLOAT, [2, 3]), vi("x", TensorProto.FLOAT, [2, 4, 3])],
               [vi("s", TensorProto.FLOAT, [2, 3])], opset=8, inits=[k, lens])
    with pytest.raises(UnsupportedError, match="sequence_lens shorter than the scan inputs"):
        import_model(m8)


def test_scan_refusals():
    body = Graph("b")
    s, x = body.add_input("s", T([2])), body.add_input("x", T([2]))
    body.set_outputs([body.add(Add(), s, x)], ["s"])
    with pytest.raises(OpError, match="num_scan_inputs must be >= 1"):
        Scan(body=body, num_scan_inputs=0)
    with pytest.raises(OpError, match="scan_input_directions must hold 0 .forward. or 1"):
        Scan(body=body, num_scan_inputs=1, scan_input_directions=(2,))
    with pytest.raises(OpError, match="scan_input_axes has 2 entries, expected 1"):
        Scan(body=body, num_scan_inputs=1, scan_input_axes=(0, 1))
    g = Graph()
    s0, xs = g.add_input("s0", T([2])), g.add_input("xs", T([5, 3]))
    with pytest.raises(OpError, match=r"body input 1 \(x\): f32\[3\] is given where the body takes f32\[2\]"):
        g.add_node(Scan(body=body, num_scan_inputs=1), [s0, xs])
    with pytest.raises(OpError, match="scan_input_axes.0. = 2 is out of range for rank 2"):
        g.add_node(Scan(body=body, num_scan_inputs=1, scan_input_axes=(2,)), [s0, xs])
    ys = g.add_input("ys", T([5, 2]))
    assert [v.type for v in g.add_node(Scan(body=body, num_scan_inputs=1), [s0, ys]).outputs] == [T([2])]


# ---------------------------------------------------------------------------------------------
# SequenceMap
# ---------------------------------------------------------------------------------------------

def test_sequence_map_numbers_and_types():
    body = Graph("b")
    e, t = body.add_input("e", T([None])), body.add_input("t", T([1]))
    body.set_outputs([body.add(Add(), e, t), body.add(lookup("Shape")(), e)], ["sum", "shape"])
    g = Graph()
    s = g.add_input("s", SequenceType(F32, (None,)))
    one = g.add_input("one", T([1]))
    node = g.add_node(SequenceMap(body=body), [s, one])
    assert [v.type for v in node.outputs] == [SequenceType(F32, (None,)), SequenceType(I64, (1,))]
    g.set_outputs(list(node.outputs), ["sums", "shapes"])
    out = interpret(g, {"s": [np.array([1, 2], np.float32), np.array([5], np.float32)], "one": np.ones(1, np.float32)})
    assert [a.tolist() for a in out["sums"]] == [[2, 3], [6]]
    assert [a.tolist() for a in out["shapes"]] == [[2], [1]]
    with pytest.raises(OpError, match="input_sequence must be a sequence"):
        g.add_node(SequenceMap(body=body), [one, one])
    assert interpret(g, {"s": [], "one": np.ones(1, np.float32)})["sums"] == []


def test_sequence_map_import_needs_the_element_rank():
    body = helper.make_graph([helper.make_node("Identity", ["e"], ["o"])], "b", [fv("e")],
                             [fv("o")])
    any_seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    seq = helper.make_value_info("s", any_seq)
    m = model([helper.make_node("SequenceMap", ["s"], ["o"], body=body)], [seq],
              [helper.make_value_info("o", helper.make_sequence_type_proto(
                  helper.make_tensor_type_proto(TensorProto.FLOAT, None)))])
    with pytest.raises(UnsupportedError, match="elements have unknown rank"):
        import_model(m)
    assert import_model(m, input_shapes={"s": [None, 2]}).nodes[0].output.type == SequenceType(F32, (None, 2))


# ---------------------------------------------------------------------------------------------
# Nesting, closure conversion through levels
# ---------------------------------------------------------------------------------------------

def test_nested_capture_goes_through_every_level():
    """A Loop body holds an If whose branch reads w from the outermost graph: w becomes an input of
    the If node in the Loop body, and so an input of the Loop body and of the Loop node."""
    then = helper.make_graph([helper.make_node("Mul", ["v", "w"], ["t"])], "then", [], [fv("t")])
    els = helper.make_graph([helper.make_node("Add", ["v", "w"], ["e"])], "else", [], [fv("e")])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["co"]),
         helper.make_node("Constant", [], ["two"], value_int=2),
         helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Cast", ["r"], ["odd"], to=TensorProto.BOOL),
         helper.make_node("If", ["odd"], ["vo"], then_branch=then, else_branch=els)],
        "body", [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []), fv("v")],
        [vi("co", TensorProto.BOOL, []), fv("vo")])
    m = model([helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
              [vi("M", TensorProto.INT64, []), vi("v0", TensorProto.FLOAT, [2]), vi("w", TensorProto.FLOAT, [2])],
              [vi("v", TensorProto.FLOAT, [2])])
    feeds = {"M": np.array(5, np.int64), "v0": np.array([1, 2], np.float32), "w": np.array([3, -1], np.float32)}
    g = check_all_ways(m, feeds)
    (loop,) = g.nodes
    assert loop.inputs[-1].name == "w" and loop.op.num_captures == 1
    (inner,) = loop.op.body.nodes_of(If)
    assert inner.inputs[1:] == [loop.op.body.inputs[2], loop.op.body.inputs[3]]  # v and w of the body
    text = print_graph(g)
    assert "\n    %3 = If(%2, %v, %w) {else_branch=graph @else(%v: f32[2], %w: f32[2]) -> (e: f32[2]) {\n" \
           "      %0 = Add(%v, %w) : f32[2]\n" in text


def test_undefined_outer_value_in_a_body_is_a_model_error():
    then = helper.make_graph([helper.make_node("Neg", ["nowhere"], ["t"])], "then", [], [fv("t")])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)],
              [vi("c", TensorProto.BOOL, [])], [fv("y")])
    with pytest.raises(ModelError, match=r"If node #0 .*in attribute 'then_branch': Neg node #0.*'nowhere' is not "
                                         "defined"):
        import_model(m)


def test_subgraph_attribute_on_another_op_is_refused():
    g = helper.make_graph([], "g", [], [])
    node = helper.make_node("Relu", ["x"], ["y"])
    node.attribute.append(helper.make_attribute("body", g))
    m = model([node], [vi("x", TensorProto.FLOAT, [2])], [vi("y", TensorProto.FLOAT, [2])])
    with pytest.raises(UnsupportedError, match="subgraph attributes are supported on If, Loop, Scan and SequenceMap"):
        import_model(m)


# ---------------------------------------------------------------------------------------------
# Text format, verifier
# ---------------------------------------------------------------------------------------------

TEXT = """graph @main(%c: bool[], %x: f32[N,2]) -> (y: f32[N,2]) {
  %w = const f32[2] dense<[1.0, 2.0]>
  %0 = If(%c, %x, %w) {else_branch=graph @else(%x: f32[N,2], %w: f32[2]) -> (y: f32[N,2]) {
    %0 = Neg(%x) : f32[N,2]
    return y=%0
  }, then_branch=graph @then(%x: f32[N,2], %w: f32[2]) -> (y: f32[N,2]) {
    %w_1 = const f32[2] dense<[3.0, 4.0]>
    %0 = Mul(%x, %w) : f32[N,2]
    %1 = Add(%0, %w_1) : f32[N,2]
    return y=%1
  }} : f32[N,2]
  return y=%0
}
"""


def test_text_round_trip_and_scopes():
    g = parse(TEXT)
    verify(g)
    assert print_graph(g) == TEXT
    out = interpret(g, {"c": np.array(True), "x": np.ones((1, 2), np.float32)})
    np.testing.assert_array_equal(out["y"], [[4, 6]])
    # a body is its own scope: it cannot read %w of the outer graph without taking it as an input
    bad = TEXT.replace("then_branch=graph @then(%x: f32[N,2], %w: f32[2])", "then_branch=graph @then(%x: f32[N,2])")
    with pytest.raises(ParseError, match="undefined value %w"):
        parse(bad)


def test_large_constants_of_bodies_travel_as_weights_with_unique_names(tmp_path):
    g = Graph()
    c = g.add_input("c", T([], BOOL))
    x = g.add_input("x", T([20]))
    w = g.add_constant(np.arange(20, dtype=np.float32), name="w")
    bodies = []
    for k in range(2):
        b = Graph(f"b{k}")
        bx = b.add_input("x", T([20]))
        bw = b.add_constant(np.full(20, k + 5, np.float32), name="w")  # the same name in every graph
        b.set_outputs([b.add(Add(), bx, bw)], ["y"])
        bodies.append(b)
    y = g.add(If(then_branch=bodies[0], else_branch=bodies[1]), c, g.add(Add(), x, w))
    g.set_outputs([y], ["y"])
    text = print_graph(g)
    weights = external_weights(g)
    assert sorted(weights) == ["w", "w_1", "w_2"]
    again = parse(text, weights)
    assert print_graph(again) == text
    feeds = {"c": np.array(False), "x": np.zeros(20, np.float32)}
    np.testing.assert_array_equal(interpret(again, feeds)["y"], np.arange(20) + 6)
    from compiler.ir.parser import load_text
    from compiler.ir.printer import save_text

    save_text(g, tmp_path / "m.kir")
    assert print_graph(load_text(tmp_path / "m.kir")) == text


def test_verifier_checks_bodies_and_signatures():
    g = parse(TEXT)
    then = g.nodes[0].op.then_branch
    then.nodes[1].outputs[0].type = T([3])
    probs = check(g)
    msgs = [p.message for p in probs]
    assert any(m.startswith("If node (#0, result %0): in then_branch (graph @then): Add node (#1, result %1): result "
                            "%1 has type f32[3], but type inference gives f32[N,2]") for m in msgs), msgs
    inner = next(p for p in probs if "in then_branch" in p.message)
    assert "  >>  %1 = Add(%0, %w_1) : f32[3]" in inner.context  # the body's own lines
    # a node input that does not fit its body's signature
    g = parse(TEXT.replace("%w = const f32[2] dense<[1.0, 2.0]>", "%w = const f32[3] dense<[1.0, 2.0, 3.0]>"))
    with pytest.raises(Exception, match=r"then_branch input 1 \(w\): f32\[3\] is given where the body takes f32\[2\]"):
        verify(g)


# ---------------------------------------------------------------------------------------------
# Passes and equality
# ---------------------------------------------------------------------------------------------

def test_cse_never_merges_different_bodies_and_fold_runs_a_known_if():
    g = Graph()
    c = g.add_input("c", T([], BOOL))
    x = g.add_input("x", T([2]))
    a = If(then_branch=branch("t", Abs, T([2])), else_branch=branch("e", Neg, T([2])))
    b = If(then_branch=branch("t", Abs, T([2])), else_branch=branch("e", Neg, T([2])))  # prints the same
    assert a != b and a == a.replace() and hash(a) == hash(a.replace())
    y1, y2, y3 = g.add(a, c, x), g.add(b, c, x), g.add(a, c, x)
    g.set_outputs([y1, y2, y3], ["y1", "y2", "y3"])
    assert EliminateCommonSubexpressions().run(g)
    assert len(g.nodes) == 2 and g.outputs[0] is g.outputs[2]
    k = Graph()
    kc = k.add_constant(np.array(False))
    kx = k.add_constant(np.array([1, -2], np.float32))
    k.set_outputs([k.add(a, kc, kx)], ["y"])
    assert FoldConstants().run(k) and not k.nodes
    np.testing.assert_array_equal(k.outputs[0].const, [-1, 2])


def test_random_bodies_are_not_deterministic():
    b = Graph("r")
    b.set_outputs([b.add(RandomNormal(shape=(2,)))], ["y"])
    op = If(then_branch=b, else_branch=b)
    assert not op.foldable
    assert If(then_branch=branch("t", Abs), else_branch=branch("e", Abs)).foldable


def test_passes_simplify_inside_bodies():
    body = Graph("b")
    x = body.add_input("x", T([2]))
    one = body.add_constant(np.ones(2, np.float32))
    folded = body.add(Add(), one, one)  # constant: folds
    dead = body.add(Mul(), x, x)  # unused: erased
    body.set_outputs([body.add(Add(), body.add(Identity(), x), folded)], ["y"])
    assert not dead.uses
    g = Graph()
    c = g.add_input("c", T([], BOOL))
    gx = g.add_input("x", T([2]))
    g.set_outputs([g.add(If(then_branch=body, else_branch=branch("e", Neg, T([2]))), c, gx)], ["y"])
    PassManager(pipeline(CompileOptions(opt_level=2, verify=True), CPU_FUSION)).run(g)
    assert body.op_counts() == {"Add": 1}
    np.testing.assert_array_equal(interpret(g, {"c": np.array(True), "x": np.ones(2, np.float32)})["y"], [3, 3])


def test_type_helpers():
    env = {}
    assert bind(T(["N", 3]), T([5, 3]), env) is None and env == {"N": 5}
    assert "dimension 0" in bind(T(["N", 3]), T([6, 3]), env)
    assert bind(T([3]), T([None]), {}) is None and bind(T([3]), T([None]), {}, strict=True) is not None
    assert bind(OptionalType(SequenceType(F32)), SequenceType(F32, (2,)), {}) is None
    assert join_types(T([2, 3]), T([2, 4])) == T([2, None])
    assert join_types(T([2]), T([])) is None
    assert join_types(OptionalType(SequenceType(F32, (2,))), SequenceType(F32, (3,), 1)) == \
        OptionalType(SequenceType(F32, (None,)))
    g = Graph()
    a = g.add_input("a", T([4]))
    (out,) = inline_graph(branch("b", Neg), [a], g)
    assert out.type == T([4]) and g.op_counts() == {"Neg": 1}


def test_interpreter_reports_a_failing_body():
    body = Graph("b")
    x = body.add_input("x", T([None]))
    body.set_outputs([body.add(lookup("Reshape")(), x, body.add_constant(np.array([2], np.int64)))], ["y"])
    g = Graph()
    c = g.add_input("c", T([], BOOL))
    gx = g.add_input("x", T([None]))
    g.set_outputs([g.add(If(then_branch=body, else_branch=body), c, gx)], ["y"])
    with pytest.raises(InterpreterError, match="If node failed: InterpreterError: Reshape node failed"):
        interpret(g, {"c": np.array(True), "x": np.ones(3, np.float32)})
