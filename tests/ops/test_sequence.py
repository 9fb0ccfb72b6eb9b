"""Sequence and optional values (SequenceType, OptionalType) and their ops: numbers against ONNX Runtime
or by hand, type inference (element shapes, known lengths), refusals, the text format, the verifier,
the interpreter's checks, import and export."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler.errors import ModelError, UnsupportedError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import InputError, InterpreterError, interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import sequence as S
from compiler.ir.ops.elementwise import Relu
from compiler.ir.ops.shape import Identity
from compiler.ir.parser import ParseError, parse
from compiler.ir.printer import print_graph
from compiler.ir.types import DType, OptionalType, SequenceType, TensorType
from compiler.ir.verify import check, verify
from frontends.onnx import import_model
from compiler.tools.onnx_backend import KilnBackend
from frontends.onnx.exporter import export_model

F32 = DType.f32
I64 = DType.i64


def T(shape, dtype=F32):
    return TensorType(dtype, tuple(shape))


def _seq_vi(name, elem, shape=None):
    return helper.make_value_info(name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape)))


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _same(a, b):
    """Equal values: arrays, or lists of arrays (sequences)."""
    if isinstance(a, list) or isinstance(b, list):
        assert isinstance(a, list) and isinstance(b, list) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    np.testing.assert_array_equal(a, b)


def _vs_ort(model, feeds):
    """Import and run ``model`` with Kiln, compare with ONNX Runtime; also export it back and run that."""
    g = import_model(model)
    verify(g)
    got = interpret(g, feeds)
    refs = _ort(model, feeds)
    for name, ref in zip(g.output_names, refs):
        _same(got[name], ref)
    exported = export_model(g)
    onnx.checker.check_model(exported, full_check=True)
    for name, ref in zip(g.output_names, _ort(exported, {k: v for k, v in feeds.items()
                                                        if k in {v.name for v in g.inputs}})):
        _same(got[name], ref)
    return g, got


def _model(nodes, inputs, outputs, opset=18, inits=()):
    return helper.make_model(helper.make_graph(nodes, "t", inputs, outputs, list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


# ---------------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------------

def test_types_print_and_answer_generic_questions():
    s = SequenceType(F32, (None, 3))
    assert str(s) == "seq<f32[?,3]>"
    assert str(SequenceType(F32, (2, 3), 3)) == "seq<3 x f32[2,3]>"
    assert str(SequenceType(I64)) == "seq<i64>"
    assert str(OptionalType(SequenceType(DType.i32, (4,)))) == "opt<seq<i32[4]>>"
    for t in (s, OptionalType(T([4]))):
        assert t.dtype is F32 and not t.is_static and t.numel is None and t.nbytes is None
    assert s.elem == T([None, 3]) and SequenceType(F32).elem is None
    with pytest.raises(ValueError):
        SequenceType(F32, (2,), -1)
    with pytest.raises(TypeError):
        OptionalType(OptionalType(T([1])))


# ---------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------

def test_construct_insert_erase_at_by_hand():
    g = Graph()
    x, y, z = (g.add_input(n, T([k, 3])) for n, k in (("x", 2), ("y", 1), ("z", 3)))
    seq = g.add(S.SequenceConstruct(), x, y)
    assert seq.type == SequenceType(F32, (None, 3), 2)
    seq = g.add(S.SequenceInsert(), seq, z, g.add_constant(np.array(0)))
    seq = g.add(S.SequenceErase(), seq, g.add_constant(np.array(-1)))
    assert seq.type == SequenceType(F32, (None, 3), 2)
    first = g.add(S.SequenceAt(), seq, g.add_constant(np.array(0, np.int32)))
    n = g.add(S.SequenceLength(), seq)
    assert n.known == 2
    g.set_outputs([seq, first, n], ["seq", "first", "n"])
    verify(g)
    sizes = (("x", 2), ("y", 1), ("z", 3))
    xs = {k: np.arange(d * 3, dtype=np.float32).reshape(d, 3) + i for i, (k, d) in enumerate(sizes)}
    out = interpret(g, xs)
    _same(out["seq"], [xs["z"], xs["x"]])
    _same(out["first"], xs["z"])
    _same(out["n"], np.array(2, np.int64))


def test_sequence_empty_then_insert_takes_the_element_type():
    g = Graph()
    x = g.add_input("x", T([2, 3]))
    empty = g.add(S.SequenceEmpty(dtype=F32))
    assert empty.type == SequenceType(F32, None, 0)
    seq = g.add(S.SequenceInsert(), empty, x)
    assert seq.type == SequenceType(F32, (2, 3), 1)
    g.set_outputs([g.add(S.SequenceAt(), seq, g.add_constant(np.array(0)))], ["y"])
    a = np.ones((2, 3), np.float32)
    _same(interpret(g, {"x": a})["y"], a)


@pytest.mark.parametrize("split,attrs", [
    (None, {"axis": 1}),
    (None, {"axis": 0, "keepdims": 0}),
    (np.array(2, np.int64), {"axis": 1}),
    (np.array(4, np.int64), {"axis": 1}),  # chunks of 4, 4, 2
    (np.array([1, 2, 0, 7], np.int64), {"axis": -1}),
    (np.array([3], np.int32), {"axis": 0}),
])
def test_split_to_sequence_vs_onnxruntime(split, attrs):
    x = np.arange(30, dtype=np.float32).reshape(3, 10)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 10])]
    inits = []
    names = ["x"]
    if split is not None:
        inits.append(onnx.numpy_helper.from_array(split, "split"))
        names.append("split")
    node = helper.make_node("SplitToSequence", names, ["s"], **attrs)
    at = helper.make_node("SequenceLength", ["s"], ["n"])
    outs = [_seq_vi("s", TensorProto.FLOAT), helper.make_tensor_value_info("n", TensorProto.INT64, [])]
    m = _model([node, at], ins, outs, inits=inits)
    g, got = _vs_ort(m, {"x": x})
    t = g.outputs[0].type
    assert t.length == len(got["s"])  # known at compile time for a constant split
    assert g.outputs[1].producer is None or g.outputs[1].known is not None


def test_split_to_sequence_inferred_types():
    g = Graph()
    x = g.add_input("x", T([3, 10]))
    c = g.add_constant
    assert g.add(S.SplitToSequence(axis=1), x).type == SequenceType(F32, (3, 1), 10)
    assert g.add(S.SplitToSequence(axis=1, keepdims=0), x).type == SequenceType(F32, (3,), 10)
    assert g.add(S.SplitToSequence(axis=1), x, c(np.array(5))).type == SequenceType(F32, (3, 5), 2)
    assert g.add(S.SplitToSequence(axis=1), x, c(np.array(4))).type == SequenceType(F32, (3, None), 3)
    assert g.add(S.SplitToSequence(axis=1), x, c(np.array([5, 5]))).type == SequenceType(F32, (3, 5), 2)
    assert g.add(S.SplitToSequence(axis=1), x, c(np.array([4, 6]))).type == SequenceType(F32, (3, None), 2)
    s = g.add_input("s", T([2], I64))  # sizes unknown, count known
    assert g.add(S.SplitToSequence(axis=1), x, s).type == SequenceType(F32, (3, None), 2)
    n = g.add_input("n", T(["N"]))
    assert g.add(S.SplitToSequence(), n).type == SequenceType(F32, (1,), None)


@pytest.mark.parametrize("axis,new_axis", [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1), (-1, 1), (-3, 1)])
def test_concat_from_sequence_vs_onnxruntime(axis, new_axis):
    xs = [np.random.default_rng(k).standard_normal((2, 3)).astype(np.float32) for k in range(3)]
    names = ["a", "b", "c"]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in names]
    nodes = [helper.make_node("SequenceConstruct", names, ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis)]
    m = _model(nodes, ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g, got = _vs_ort(m, dict(zip(names, xs)))
    assert g.outputs[0].type.is_static  # three elements of a static shape
    assert got["y"].shape == g.outputs[0].type.shape


def test_insert_erase_at_positions_vs_onnxruntime():
    ins = [_seq_vi("s", TensorProto.INT64, [None]), helper.make_tensor_value_info("t", TensorProto.INT64, [3]),
           helper.make_tensor_value_info("p", TensorProto.INT64, []),
           helper.make_tensor_value_info("q", TensorProto.INT32, [])]
    nodes = [helper.make_node("SequenceInsert", ["s", "t", "p"], ["s1"]),
             helper.make_node("SequenceErase", ["s1", "q"], ["s2"]),
             helper.make_node("SequenceErase", ["s2"], ["s3"]),
             helper.make_node("SequenceAt", ["s1", "q"], ["y"])]
    outs = [_seq_vi("s2", TensorProto.INT64), _seq_vi("s3", TensorProto.INT64),
            helper.make_tensor_value_info("y", TensorProto.INT64, None)]
    m = _model(nodes, ins, outs)
    seq = [np.arange(k, dtype=np.int64) for k in (4, 2, 5)]
    for p, q in ((0, 0), (-1, -2), (3, 3), (-3, 1)):
        _vs_ort(m, {"s": seq, "t": np.array([7, 8, 9]), "p": np.array(p), "q": np.array(q, np.int32)})


def test_optional_ops_by_hand():
    g = Graph()
    x = g.add_input("x", T([4]))
    o = g.add(S.Optional(), x)
    assert o.type == OptionalType(T([4]))
    empty = g.add(S.Optional(type=SequenceType(I64, (None,))))
    assert empty.type == OptionalType(SequenceType(I64, (None,)))
    has = g.add(S.OptionalHasElement(), o)
    has_not = g.add(S.OptionalHasElement(), empty)
    tensor_has = g.add(S.OptionalHasElement(), x)
    none_has = g.add(S.OptionalHasElement())
    assert has.known is None and tensor_has.known == True and none_has.known == False  # noqa: E712
    back = g.add(S.OptionalGetElement(), o)
    assert back.type == T([4]) and g.add(S.OptionalGetElement(), x).type == T([4])
    g.set_outputs([o, empty, has, has_not, tensor_has, none_has, back], list("abcdefg"))
    verify(g)
    a = np.arange(4, dtype=np.float32)
    out = interpret(g, {"x": a})
    _same(out["a"], a)
    assert out["b"] is None
    assert [bool(out[k]) for k in "cdef"] == [True, False, True, False]
    _same(out["g"], a)


def test_optional_get_element_of_an_empty_optional_fails_when_run():
    g = Graph()
    empty = g.add(S.Optional(type=T([2])))
    g.set_outputs([g.add(S.OptionalGetElement(), empty)], ["y"])
    with pytest.raises(InterpreterError, match="the optional is empty"):
        interpret(g, {})


def test_optional_vs_onnxruntime():
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("Optional", [], ["e"], type=tp),
             helper.make_node("OptionalHasElement", ["o"], ["h"]),
             helper.make_node("OptionalHasElement", ["e"], ["he"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])]
    outs = [helper.make_tensor_value_info(n, TensorProto.BOOL, []) for n in ("h", "he")]
    outs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]))
    g, got = _vs_ort(_model(nodes, ins, outs), {"x": np.array([1, 2], np.float32)})
    assert "type=f32[2]" in print_graph(g)
    assert [bool(got["h"]), bool(got["he"])] == [True, False]


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------

def _graph_with_seq(t=SequenceType(F32, (2, 3), 2)):
    g = Graph()
    return g, g.add_input("s", t)


def test_tensor_ops_refuse_sequences():
    g, s = _graph_with_seq()
    with pytest.raises(OpError, match=r"Relu: input 0 \(X\) is a seq<2 x f32\[2,3\]> value; Relu takes tensors"):
        g.add(Relu(), s)
    assert g.add(Identity(), s).type == s.type  # Identity passes anything through


def test_refusals():
    g, s = _graph_with_seq()
    x = g.add_input("x", T([3]))
    i = g.add_input("i", T([3], I64))
    c = g.add_constant
    with pytest.raises(OpError, match="input_sequence must be a sequence, got f32"):
        g.add(S.SequenceAt(), x, c(np.array(0)))
    with pytest.raises(OpError, match="tensor has element type i64, the sequence holds f32"):
        g.add(S.SequenceInsert(), s, i)
    with pytest.raises(OpError, match="position 2 is out of range for a sequence of 2"):
        g.add(S.SequenceAt(), s, c(np.array(2)))
    with pytest.raises(OpError, match="position 3 is out of range"):
        g.add(S.SequenceInsert(), s, c(np.zeros((2, 3), np.float32)), c(np.array(3)))
    with pytest.raises(OpError, match="position has element type f32"):
        g.add(S.SequenceAt(), s, c(np.array(0.0, np.float32)))
    with pytest.raises(OpError, match="position must be a scalar"):
        g.add(S.SequenceAt(), s, c(np.array([0, 1])))
    with pytest.raises(OpError, match="inputs must share one element type"):
        g.add(S.SequenceConstruct(), x, i)
    with pytest.raises(OpError, match="needs at least one tensor"):
        g.add(S.SequenceConstruct())
    with pytest.raises(OpError, match="input 0 must be a tensor"):
        g.add(S.SequenceConstruct(), s)
    empty = g.add(S.SequenceEmpty())
    with pytest.raises(OpError, match="cannot erase from an empty sequence"):
        g.add(S.SequenceErase(), empty)
    with pytest.raises(OpError, match="cannot concatenate an empty sequence"):
        g.add(S.ConcatFromSequence(axis=0), empty)
    anyrank = g.add_input("anyrank", SequenceType(F32))
    with pytest.raises(OpError, match="unknown rank"):
        g.add(S.SequenceAt(), anyrank, c(np.array(0)))
    with pytest.raises(OpError, match="axis 2 is out of range for rank 2"):
        g.add(S.ConcatFromSequence(axis=2), s)
    with pytest.raises(OpError, match="axis 3 is out of range for rank 3"):
        g.add(S.ConcatFromSequence(axis=3, new_axis=1), s)
    with pytest.raises(OpError, match="new_axis must be 0 or 1"):
        S.ConcatFromSequence(axis=0, new_axis=2)
    with pytest.raises(OpError, match="keepdims must be 0 or 1"):
        S.SplitToSequence(keepdims=3)
    with pytest.raises(OpError, match="split 0 must be positive"):
        g.add(S.SplitToSequence(), x, c(np.array(0)))
    with pytest.raises(OpError, match="sum to 4, not the axis length 3"):
        g.add(S.SplitToSequence(), x, c(np.array([2, 2])))
    with pytest.raises(OpError, match="cannot split a scalar"):
        g.add(S.SplitToSequence(), c(np.array(1.0)))
    with pytest.raises(OpError, match="an empty optional needs the type attribute"):
        g.add(S.Optional())
    o = g.add(S.Optional(), x)
    with pytest.raises(OpError, match="optionals do not nest"):
        g.add(S.Optional(), o)
    with pytest.raises(OpError, match="does not describe the input"):
        g.add(S.Optional(type=T([3], I64)), x)
    with pytest.raises(OpError, match="attribute type"):
        S.Optional(type="f32")


def test_interpreter_checks_sequence_and_optional_inputs():
    g, s = _graph_with_seq(SequenceType(F32, (None, 3)))
    o = g.add_input("o", OptionalType(T([2])))
    g.set_outputs([g.add(S.SequenceLength(), s), g.add(S.OptionalHasElement(), o)], ["n", "h"])
    ok = [np.zeros((1, 3), np.float32), np.zeros((4, 3), np.float32)]
    out = interpret(g, {"s": ok, "o": None})
    assert int(out["n"]) == 2 and not out["h"]
    with pytest.raises(InputError, match="a sequence is a list of arrays, got ndarray"):
        interpret(g, {"s": ok[0], "o": None})
    with pytest.raises(InputError, match="element 1: dtype float64 instead of f32"):
        interpret(g, {"s": [ok[0], ok[1].astype(np.float64)], "o": None})
    with pytest.raises(InputError, match=r"element 0: shape \[1, 2\] instead of f32\[\?,3\]"):
        interpret(g, {"s": [np.zeros((1, 2), np.float32)], "o": None})
    with pytest.raises(InputError, match=r"'o' does not match its type opt<f32\[2\]>"):
        interpret(g, {"s": ok, "o": np.zeros(3, np.float32)})


def test_interpreter_checks_known_lengths_of_results():
    g, s = _graph_with_seq(SequenceType(F32, (3,)))
    g.set_outputs([g.add(S.SequenceErase(), s)], ["y"])
    g.outputs[0].type = SequenceType(F32, (3,), 5)  # a wrong inference
    with pytest.raises(InterpreterError, match="has 1 element"):
        interpret(g, {"s": [np.zeros(3, np.float32)] * 2})


# ---------------------------------------------------------------------------------------------
# Text format and verifier
# ---------------------------------------------------------------------------------------------

TEXT = """graph @seqs(%x: f32[N,3], %y: f32[2,3], %s: seq<f32>, %o: opt<seq<i32[4]>>) -> (a: f32[?,3], n: i64[], e: opt<seq<i64[?]>>, h: bool[], c: f32[?,3], s2: seq<f32>) {
  %c0 = const i64[] dense<0>
  %0 = SequenceConstruct(%x, %y) : seq<2 x f32[?,3]>
  %1 = SequenceEmpty() {dtype=i64} : seq<0 x i64>
  %2 = SequenceAt(%0, %c0) : f32[?,3]
  %3 = SequenceLength(%0) : i64[]
  %4 = Optional() {type=seq<i64[?]>} : opt<seq<i64[?]>>
  %5 = OptionalHasElement(%o) : bool[]
  %6 = ConcatFromSequence(%0) {axis=0} : f32[?,3]
  %7 = Identity(%s) : seq<f32>
  return a=%2, n=%3, e=%4, h=%5, c=%6, s2=%7
}
"""


def test_text_round_trip():
    g = parse(TEXT)
    verify(g)
    assert print_graph(g) == TEXT
    assert g.nodes[3].outputs[0].known == 2  # recomputed from the type's length
    x, y = np.ones((1, 3), np.float32), np.zeros((2, 3), np.float32)
    out = interpret(g, {"x": x, "y": y, "s": [np.zeros(2, np.float32)], "o": [np.arange(4, dtype=np.int32)]})
    _same(out["c"], np.concatenate([x, y]))
    assert out["e"] is None and bool(out["h"])
    empty = import_model(_model([helper.make_node("SequenceEmpty", [], ["s"], dtype=TensorProto.INT32)], [],
                                [_seq_vi("s", TensorProto.INT32)]))
    assert "SequenceEmpty() {dtype=i32} : seq<0 x i32>" in print_graph(parse(print_graph(empty)))


@pytest.mark.parametrize("text,msg", [
    ("graph @g() -> () {\n  %c = const seq<f32[2]>\n  return\n}", "a constant is a tensor, not a seq<...> value"),
    ("graph @g(%o: opt<opt<f32[2]>>) -> () {\n  return\n}", "optionals do not nest"),
    ("graph @g(%s: seq<3 f32[2]>) -> () {\n  return\n}", "expected 'x' after the sequence length"),
    ("graph @g(%s: seq<f32[2]) -> () {\n  return\n}", "expected '>' to close seq<...>"),
    ("graph @g(%s: seq<-1 x f32[2]>) -> () {\n  return\n}", "a sequence length cannot be negative"),
    ("graph @g(%s: i64[1]) -> () {\n  %0 = ConstantOfShape(%s) {value=dense<seq<f32>: 1>} : f32[?]\n  return\n}",
     "expected a tensor type here"),
])
def test_parse_errors(text, msg):
    with pytest.raises(ParseError, match=msg):
        parse(text)


def test_verifier_reports_a_wrong_sequence_type():
    g = parse(TEXT)
    g.nodes[0].outputs[0].type = SequenceType(F32, (None, 3), 3)
    problems = check(g)
    assert any("has type seq<3 x f32[?,3]>, but type inference gives seq<2 x f32[?,3]>" in p.message
               for p in problems), problems


def test_patterns_and_no_folding_of_sequences():
    for cls in S.OPS:
        assert cls.pattern is Pattern.OPAQUE and not cls.tensors_only
    from compiler.passes.simplify.fold_constants import FoldConstants

    g = Graph()
    a = g.add_constant(np.ones(3, np.float32))
    seq = g.add(S.SequenceConstruct(), a, a)
    at = g.add(S.SequenceAt(), seq, g.add_constant(np.array(1)))
    g.set_outputs([seq, at, g.add(S.SequenceLength(), seq)], ["s", "a", "n"])
    FoldConstants().run(g)
    assert [n.op.name for n in g.nodes] == ["SequenceConstruct", "SequenceAt"]  # the length folded
    verify(g)
    out = interpret(g, {})
    _same(out["s"], [np.ones(3, np.float32)] * 2)
    assert int(out["n"]) == 2


# ---------------------------------------------------------------------------------------------
# Import, backend, export
# ---------------------------------------------------------------------------------------------

def test_import_types_and_input_shapes():
    m = _model([helper.make_node("SequenceLength", ["s"], ["n"])], [_seq_vi("s", TensorProto.FLOAT)],
               [helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    assert import_model(m).inputs[0].type == SequenceType(F32)
    assert import_model(m, input_shapes={"s": ["L", 3]}).inputs[0].type == SequenceType(F32, ("L", 3))
    m2 = _model([helper.make_node("SequenceLength", ["s"], ["n"])], [_seq_vi("s", TensorProto.FLOAT, [2, "K"])],
                [helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    assert import_model(m2).inputs[0].type == SequenceType(F32, (2, None))  # a dim_param in a sequence element: unknown
    with pytest.raises(ModelError, match="dimension 0 is fixed to 2"):
        import_model(m2, input_shapes={"s": [3, 4]})
    nested = helper.make_value_info("s", helper.make_sequence_type_proto(
        helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))))
    m3 = _model([helper.make_node("SequenceLength", ["s"], ["n"])], [nested],
                [helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    with pytest.raises(UnsupportedError, match="only sequences of tensors are supported"):
        import_model(m3)
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
    m4 = _model([helper.make_node("OptionalHasElement", ["o"], ["h"])], [opt],
                [helper.make_tensor_value_info("h", TensorProto.BOOL, [])])
    with pytest.raises(ModelError, match="has no shape"):
        import_model(m4)


def test_backend_takes_lists_and_none():
    seq = _seq_vi("s", TensorProto.FLOAT, [None])
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    m = _model([helper.make_node("Identity", ["s"], ["t"]), helper.make_node("OptionalHasElement", ["o"], ["h"])],
               [seq, opt], [_seq_vi("t", TensorProto.FLOAT), helper.make_tensor_value_info("h", TensorProto.BOOL, [])])
    t, h = KilnBackend.run_model(m, [[np.ones(2, np.float32), np.zeros(5, np.float32)], None])
    _same(t, [np.ones(2, np.float32), np.zeros(5, np.float32)])
    assert not h


def test_export_writes_sequence_and_optional_value_infos():
    g = parse(TEXT)
    m = export_model(g)
    onnx.checker.check_model(m, full_check=True)
    types = {vi.name: vi.type for vi in list(m.graph.input) + list(m.graph.output)}
    assert types["s"].HasField("sequence_type") and not types["s"].sequence_type.elem_type.tensor_type.HasField("shape")
    assert types["o"].optional_type.elem_type.sequence_type.elem_type.tensor_type.elem_type == TensorProto.INT32
    x, y = np.ones((1, 3), np.float32), np.zeros((2, 3), np.float32)
    feeds = {"x": x, "y": y, "s": [np.zeros(2, np.float32)], "o": [np.arange(4, dtype=np.int32)]}
    want = interpret(g, feeds)
    for name, got in zip(g.output_names, _ort(m, feeds)):
        if name == "e":
            assert got is None
        else:
            _same(got, want[name])
    back = import_model(m)
    assert [v.type for v in back.inputs] == [v.type for v in g.inputs]


def test_import_refuses_an_optional_type_attribute_of_unknown_rank():
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, None)
    m = _model([helper.make_node("Optional", [], ["o"], type=tp), helper.make_node("OptionalHasElement", ["o"], ["h"])],
               [], [helper.make_tensor_value_info("h", TensorProto.BOOL, [])])
    with pytest.raises(UnsupportedError, match="attribute 'type': a tensor type without a shape"):
        import_model(m)
