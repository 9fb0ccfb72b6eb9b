"""Hostile IR text (issue 21): deep nesting, bytes that are not UTF-8, characters that are not characters.
Each is a ParseError with a line, a column and a reason, never a RecursionError or another traceback;
and at the nesting limit, the parser, printer, verifier and interpreter all work."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import KilnError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.parser import MAX_NESTING_DEPTH, ParseError, load_text, parse
from compiler.ir.printer import print_graph
from compiler.ir.types import DType, TensorType
from compiler.ir.verify import verify

F2 = TensorType(DType.f32, (2,))


def nested_if_text(depth: int) -> str:
    """A graph whose If's then_branch holds an If ... ``depth`` levels of subgraphs; the innermost one
    negates x, every else_branch returns x."""
    leaf = "graph @e(%c: bool[], %x: f32[2]) -> (y: f32[2]) { return y=%x }"
    text = "graph @b(%c: bool[], %x: f32[2]) -> (y: f32[2]) {\n %0 = Neg(%x) : f32[2]\n return y=%0\n}"
    for d in range(depth):
        name = "main" if d == depth - 1 else "b"
        text = (f"graph @{name}(%c: bool[], %x: f32[2]) -> (y: f32[2]) {{\n"
                f" %0 = If(%c, %c, %x) {{else_branch={leaf}, then_branch={text}}} : f32[2]\n return y=%0\n}}")
    return text


def _run(g: Graph, cond: bool) -> np.ndarray:
    x = np.array([1.0, -2.0], np.float32)
    return interpret(g, {"c": np.array(cond), "x": x})["y"]


def test_at_the_nesting_limit_everything_works():
    assert MAX_NESTING_DEPTH == 64
    g = parse(nested_if_text(MAX_NESTING_DEPTH))
    verify(g)
    text = print_graph(g)
    assert print_graph(parse(text)) == text
    np.testing.assert_array_equal(_run(g, True), [-1.0, 2.0])
    np.testing.assert_array_equal(_run(g, False), [1.0, -2.0])


@pytest.mark.parametrize("depth", [65, 160, 2000])
def test_past_the_nesting_limit_is_a_parse_error(depth):
    with pytest.raises(ParseError, match="subgraphs are nested more than 64 deep") as e:
        parse(nested_if_text(depth))
    assert e.value.line == 66  # where the 65th subgraph starts


def test_nesting_limit_is_an_option():
    text = nested_if_text(3)
    parse(text, max_nesting_depth=3)
    with pytest.raises(ParseError, match=r"more than 2 deep \(the limit: max_nesting_depth=2\)"):
        parse(text, max_nesting_depth=2)


def _one_node(attrs: str) -> str:
    return f"graph @g(%x: f32[2]) -> (y: f32[2]) {{\n  %0 = Transpose(%x) {{{attrs}}} : f32[2]\n  return y=%0\n}}"


@pytest.mark.parametrize("text,message", [
    (_one_node("perm=" + "[" * 5000 + "]" * 5000), "attribute lists are nested more than 32 deep"),
    ("graph @g(%x: " + "opt<" * 5000 + "f32[2]" + ">" * 5000 + ") -> () {\n  return\n}", "optionals do not nest"),
    ("graph @g() -> () {\n  %c = const f32[" + ",".join(["1"] * 100) + "] dense<" + "[" * 100 + "1.0" + "]" * 100
     + ">\n  return\n}", "a dense literal has at most 64 dims, this one 100"),
    ('graph @g(%"a\\ud800": f32[2]) -> (y: f32[2]) {\n  return y=%"a\\ud800"\n}',
     r"bad escape \\ud800: not a character"),
    ('graph @g(%"a\\udfff": f32[2]) -> (y: f32[2]) {\n  return y=%"a\\udfff"\n}', "not a character"),
], ids=["lists", "optionals", "rank", "surrogate", "low surrogate"])
def test_deep_or_odd_text_is_a_parse_error(text, message):
    with pytest.raises(ParseError, match=message):
        parse(text)


def test_deepest_accepted_list_and_rank():
    g = parse("graph @g() -> (y: f32[" + ",".join(["1"] * 64) + "]) {\n  %c = const f32[" + ",".join(["1"] * 64)
              + "] dense<" + "[" * 64 + "1.5" + "]" * 64 + ">\n  return y=%c\n}")
    assert g.outputs[0].const.ndim == 64
    with pytest.raises(ParseError, match="bad attribute"):  # 32 deep is read; Transpose then refuses it
        parse(_one_node("perm=" + "[" * 32 + "]" * 32))


def test_text_that_is_not_utf8(tmp_path):
    data = b'graph @g(%x: f32[2]) -> (y: f32[2]) {\n  %0 = Neg(%"\xff\xfe") : f32[2]\n  return y=%0\n}\n'
    path = tmp_path / "bad.kir"
    path.write_bytes(data)
    with pytest.raises(ParseError, match=r"bad.kir:2:14: not UTF-8 text: byte 0xff at offset 51"):
        load_text(path)
    with pytest.raises(ParseError, match="2:14: not UTF-8"):
        parse(data)
    good = "graph @g(%\"é\": f32[2]) -> (y: f32[2]) {\n  return y=%\"é\"\n}"
    assert parse(good.encode()).inputs[0].name == "é"


def test_printer_never_fails_on_names_that_are_not_text():
    """Graphs built by hand can hold any name: it prints escaped (deterministic, and parses back)."""
    g = Graph(b"g\xff")
    x = g.add_input(b"x\xff", F2)
    g.set_outputs([x], [b"y\xfe"])
    text = print_graph(g)
    assert text == print_graph(g)
    again = parse(text)
    assert again.inputs[0].name == "x\\xff" and again.output_names == ["y\\xfe"]


def test_every_error_is_a_kiln_error():
    for text in (nested_if_text(200), _one_node("perm=" + "[" * 100000), "graph @g(%x: " + "opt<" * 100000):
        with pytest.raises(KilnError):
            parse(text)


def test_malformed_kir_file_is_a_model_error(tmp_path):
    """A .kir file that parses but is not a valid graph (a wrong result type) is the file's fault: a
    ModelError naming the file and the node, not a VerifyError (which reports a compiler bug)."""
    from compiler.errors import ModelError
    from compiler.models import load_graph

    path = tmp_path / "bad.kir"
    path.write_text("graph @g(%x: f32[2]) -> (y: f32[3]) {\n  %0 = Neg(%x) : f32[3]\n  return y=%0\n}\n")
    with pytest.raises(ModelError, match=r"(?s)bad.kir: graph @g is malformed.*Neg node.*f32\[3\].*f32\[2\]"):
        load_graph(str(path))
    path.write_text("graph @g(%x: f32[2]) -> (y: f32[2]) {\n  %0 = Neg(%x) : f32[2]\n  return y=%0\n}\n")
    assert load_graph(str(path)).nodes[0].op.name == "Neg"
