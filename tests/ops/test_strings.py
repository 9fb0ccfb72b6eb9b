"""String ops (StringConcat, StringSplit, StringNormalizer, RegexFullMatch): numbers against ONNX
Runtime or by hand, shape inference, the RE2 -> Python translation, refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, Pattern
from compiler.ir.ops import strings as S
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model
from tests.ops.util import infer_types, kiln_run, ort_run, run_op


def _strs(*items, shape=None):
    a = np.array(list(items), dtype=object)
    return a.reshape(shape) if shape is not None else a


def _model(op_type, inputs, outputs, attrs, opset=20, out_types=None):
    vis = [helper.make_tensor_value_info(n, TensorProto.STRING, a.shape) for n, a in inputs]
    node = helper.make_node(op_type, [n for n, _ in inputs], outputs, **attrs)
    out_types = out_types or [TensorProto.STRING] * len(outputs)
    outs = [helper.make_tensor_value_info(o, t, None) for o, t in zip(outputs, out_types)]
    return helper.make_model(helper.make_graph([node], "t", vis, outs),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _vs_ort(model, feeds):
    _, outs = kiln_run(model, feeds)
    for o, r in zip(outs, ort_run(model, feeds)):
        assert o.shape == r.shape, (o.shape, r.shape)
        assert o.tolist() == r.tolist()
    return outs


def _run(op, *arrays):
    return run_op(op, *arrays)[1]


_infer = infer_types


def T(shape, dtype=DType.string):
    return TensorType(dtype, tuple(shape))


# ---------------------------------------------------------------------------------------------
# StringConcat
# ---------------------------------------------------------------------------------------------

def test_string_concat_broadcasts_like_onnxruntime():
    x = _strs("a", "bé", "", "日本", shape=(2, 2))
    y = _strs("-1", "-2")
    _vs_ort(_model("StringConcat", [("x", x), ("y", y)], ["z"], {}), {"x": x, "y": y})


def test_string_concat_infer_and_refusals():
    assert _infer(S.StringConcat(), T(["N", 1]), T([3])) == [T(["N", 3])]
    with pytest.raises(OpError, match="do not broadcast"):
        _infer(S.StringConcat(), T([2]), T([3]))
    with pytest.raises(OpError, match="Y has element type f32"):
        _infer(S.StringConcat(), T([2]), T([2], DType.f32))


# ---------------------------------------------------------------------------------------------
# StringSplit
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [{"delimiter": "."}, {}, {"delimiter": "-", "maxsplit": 1}, {"maxsplit": 2},
                                   {"delimiter": "ab"}])
def test_string_split_matches_onnxruntime(attrs):
    x = _strs("abc.com", "a-b--c-", "  hello   big world ", "", "xabyabz", "no", shape=(2, 3))
    _vs_ort(_model("StringSplit", [("x", x)], ["y", "n"], attrs, out_types=[TensorProto.STRING, TensorProto.INT64]),
            {"x": x})


def test_string_split_shapes():
    y, n = _infer(S.StringSplit(delimiter=","), T(["N"]))
    assert y == T(["N", None]) and n == T(["N"], DType.i64)
    y, n = _infer(S.StringSplit(), T([0]))
    assert y == T([0, 0])
    g = Graph()
    c = g.add_constant(_strs("a,b", "c,d,e"))
    node = g.add_node(S.StringSplit(delimiter=","), [c])
    assert node.outputs[0].type == T([2, 3])  # a known input: the width is known
    with pytest.raises(OpError, match="maxsplit"):
        S.StringSplit(maxsplit=-1)


# ---------------------------------------------------------------------------------------------
# StringNormalizer
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [
    {"case_change_action": "LOWER", "stopwords": ["monday"], "is_case_sensitive": 1},
    {"case_change_action": "UPPER", "stopwords": ["MONDAY", "tuesday"]},
    {"case_change_action": "NONE"},
    {"stopwords": ["Monday", "Tuesday", "wednesday"], "is_case_sensitive": 1},
])
@pytest.mark.parametrize("shape", [(4,), (1, 4)])
def test_string_normalizer_matches_onnxruntime(attrs, shape):
    x = _strs("Monday", "tuesday", "wednesday", "Thursday", shape=shape)
    # locale "": ORT's default (en_US.UTF-8) is not installed everywhere
    _vs_ort(_model("StringNormalizer", [("x", x)], ["y"], dict(attrs, locale=""), opset=10), {"x": x})


def test_string_normalizer_all_dropped_and_unicode():
    (y,) = _run(S.StringNormalizer(stopwords=("a", "B")), _strs("A", "b", shape=(1, 2)))
    assert y.shape == (1, 1) and y.tolist() == [[""]]
    (y,) = _run(S.StringNormalizer(case_change_action="UPPER"), _strs("çé", "straße"))
    assert y.tolist() == ["ÇÉ", "STRASSE"]


def test_string_normalizer_shapes_and_refusals():
    assert _infer(S.StringNormalizer(), T([1, 5])) == [T([1, 5])]
    assert _infer(S.StringNormalizer(stopwords=("x",)), T([5])) == [T([None])]
    with pytest.raises(OpError, match=r"\[C\] or \[1, C\]"):
        _infer(S.StringNormalizer(), T([2, 5]))
    with pytest.raises(OpError, match=r"\[C\] or \[1, C\]"):
        _infer(S.StringNormalizer(), T([1, 2, 5]))
    with pytest.raises(OpError, match="case_change_action"):
        S.StringNormalizer(case_change_action="TITLE")
    with pytest.raises(OpError, match="locale"):
        S.StringNormalizer(locale="tr_TR")
    assert S.StringNormalizer(locale="en_US.UTF-8").locale == "en_US.UTF-8"


# ---------------------------------------------------------------------------------------------
# RegexFullMatch
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", [r"www\.[\w.-]+\.\bcom\b", r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)",
                                     r"[[:alpha:]]+\d*", r"(?i)abc", r"a.c", r"[^a-c]+", r"\Qa.b\E"])
def test_regex_full_match_matches_onnxruntime(pattern):
    x = _strs("www.google.com", "www.bbc.co.uk", "x@gmail.com", "Abc", "abc12", "a.b", "axb", "def", "",
              "aXc", shape=(2, 5))
    _vs_ort(_model("RegexFullMatch", [("x", x)], ["y"], {"pattern": pattern}, out_types=[TensorProto.BOOL]),
            {"x": x})


def test_regex_word_classes_are_ascii_like_re2():
    (y,) = _run(S.RegexFullMatch(regex=r"\w+"), _strs("abc_1", "été"))
    assert y.tolist() == [True, False]


def test_regex_translation_and_refusals():
    assert S.re2_to_python(r"a\z") == r"a\Z"
    assert S.re2_to_python(r"(?<name>x)[]a]") == r"(?P<name>x)[\]a]"
    for bad, why in [(r"(a)\1", "backreference"), (r"(?=a)", "lookaround"), (r"\pL", "Unicode"),
                     (r"(?U)a*", "ungreedy"), (r"[[:nope:]]", "POSIX"), (r"(", "not supported")]:
        with pytest.raises(OpError, match=why):
            S.RegexFullMatch(regex=bad)
    with pytest.raises(OpError, match="X has element type f32"):
        _infer(S.RegexFullMatch(regex="a"), T([2], DType.f32))
    with pytest.raises(OpError, match="pattern attribute is required"):  # an empty one is a pattern
        S.RegexFullMatch()
    assert _run(S.RegexFullMatch(regex=""), _strs("", "a"))[0].tolist() == [True, False]


def test_regex_onnx_pattern_attribute_imports_as_regex():
    x = _strs("ab", "b")
    g = import_model(_model("RegexFullMatch", [("x", x)], ["y"], {"pattern": "a."}, out_types=[TensorProto.BOOL]))
    op = g.nodes[0].op
    assert op.regex == "a." and op.pattern is Pattern.OPAQUE  # ``pattern`` stays the fusion pattern
    assert interpret(g, {"x": x})["y"].tolist() == [True, False]
