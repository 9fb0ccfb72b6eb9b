"""The IR text format: printer, parser, save_text/load_text, and the round trip
print(parse(print(g), weights)) == print(g) on built graphs and on ONNX's light models."""
from __future__ import annotations

import dataclasses
import glob
import os
import textwrap
from typing import Any, ClassVar

import numpy as np
import onnx
import pytest

from compiler.errors import UnsupportedError
from compiler.ir import ops
from compiler.ir.graph import Graph, Node
from compiler.ir.ops.base import OpDef
from compiler.ir.parser import ParseError, load_text, parse
from compiler.ir.printer import external_weights, print_graph, save_text, sidecar_path
from compiler.ir.types import DType, TensorType
from compiler.ir.verify import verify



def op(name: str, **attrs) -> OpDef:
    cls = ops.lookup(name)
    assert cls is not None, f"op {name} is not defined"
    return cls(**attrs)


def f32(*shape) -> TensorType:
    return TensorType(DType.f32, shape)


def round_trip(g: Graph, limit: int = 16) -> Graph:
    """Print, parse back, print again: the texts must be identical; both graphs verify."""
    text = print_graph(g, limit)
    g2 = parse(text, external_weights(g, limit))
    assert print_graph(g2, limit) == text
    verify(g)
    verify(g2)
    return g2


def ir(text: str, weights=None) -> Graph:
    return parse(textwrap.dedent(text).strip() + "\n", weights)


# ---------------------------------------------------------------------------------------------
# A test-only op with one attribute of every kind, registered for the parser while a test runs
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class KitchenSink(OpDef):
    """y = x; attributes of every kind."""

    i: int = 0
    f: float = 0.0
    s: str = ""
    b: bool = False
    dt: DType = DType.f32
    ints: tuple[int, ...] = ()
    floats: tuple[float, ...] = ()
    strs: tuple[str, ...] = ()
    t: np.ndarray | None = None
    ts: tuple[np.ndarray, ...] = ()
    opt: int | None = 3
    anything: Any = None
    inputs: ClassVar = ("X", "Y?", "Z?")
    outputs: ClassVar = ("A", "B")

    def validate(self):
        if self.i < 0:
            raise self.fail(f"i must be >= 0, got {self.i}")

    def infer(self, ins):
        return [ins[0].type, ins[0].type]

    def compute(self, x, *_):
        return [x, x]


@pytest.fixture
def sink(monkeypatch):
    monkeypatch.setitem(ops.BY_NAME, ("", "KitchenSink"), KitchenSink)
    return KitchenSink


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------

def mlp() -> Graph:
    g = Graph("mlp")
    x = g.add_input("x", f32("N", 784))
    w1 = g.add_constant(np.full((784, 512), 0.5, np.float32), name="fc1.weight")
    split = g.add_constant(np.array([256, 256], np.int64), name="split")
    h = g.add(op("MatMul"), x, w1, name="fc1")
    r = g.add(op("Relu"), h)
    a, b = g.add_node(op("Split", axis=1), [r, split], num_outputs=2).outputs
    s = g.add(op("Add"), a, b)
    g.set_outputs([s, a], ["y", "half"])
    return g


MLP_TEXT = """\
graph @mlp(%x: f32[N,784]) -> (y: f32[N,256], half: f32[N,256]) {
  %fc1.weight = const f32[784,512]
  %split = const i64[2] dense<[256, 256]>
  %0 = MatMul(%x, %fc1.weight) : f32[N,512] @"fc1"
  %1 = Relu(%0) : f32[N,512]
  %2, %3 = Split(%1, %split) {axis=1} : f32[N,256], f32[N,256]
  %4 = Add(%2, %3) : f32[N,256]
  return y=%4, half=%2
}
"""


def test_print_is_the_documented_format():
    g = mlp()
    assert print_graph(g) == MLP_TEXT
    assert print_graph(g) == print_graph(mlp()) == str(g)  # deterministic
    g2 = round_trip(g)
    assert [v.name for v in g2.constants] == ["fc1.weight", "split"]
    assert np.array_equal(g2.constants[0].const, g.constants[0].const)


def test_inline_limit_and_weights():
    g = mlp()
    assert print_graph(g, weights_inline_limit=0).splitlines()[2] == "  %split = const i64[2]"
    assert list(external_weights(g)) == ["fc1.weight"]
    assert sorted(external_weights(g, weights_inline_limit=1)) == ["fc1.weight", "split"]
    round_trip(g, limit=0)
    g.constants[0].const = g.constants[0].const[:3, :5].copy()  # small enough to print all of it
    g.constants[0].type = f32(3, 5)
    g.nodes[0].outputs[0].type = f32("N", 5)  # (the graph is not well typed now; printing does not care)
    big = print_graph(g, weights_inline_limit=15)
    row = "[0.5, 0.5, 0.5, 0.5, 0.5]"
    assert big.splitlines()[1] == f"  %fc1.weight = const f32[3,5] dense<[{row}, {row}, {row}]>"
    assert print_graph(parse(big), weights_inline_limit=15) == big


def test_names_are_kept_quoted_made_plain_and_unique():
    g = Graph("odd name/1")
    x = g.add_input("input:0", f32(2))
    y = g.add_input("7", f32(2))  # all digits: quoted, bare %7 is a node result
    c1 = g.add_constant(np.ones(2, np.float32), name="conv1/w")
    c2 = g.add_constant(np.ones(2, np.float32), name="conv1/w")  # a duplicate
    c3 = g.add_constant(np.ones(2, np.float32), name="conv1_w")  # collides once made plain
    c4 = g.add_constant(np.ones(2, np.float32), name="123")  # digits: gets a 'c'
    c5 = g.add_constant(np.ones(2, np.float32))  # unnamed: named after its first use
    g.add_constant(np.ones(2, np.float32))  # unnamed and unused
    v = x
    for c in (y, c1, c2, c3, c4, c5):
        v = g.add(op("Add"), v, c)
    g.set_outputs([v], ["out:0"])
    text = print_graph(g)
    header = text.splitlines()[0]
    assert header == 'graph @"odd name/1"(%"input:0": f32[2], %"7": f32[2]) -> ("out:0": f32[2]) {'
    consts = [line.split(" = ")[0].strip() for line in text.splitlines()[1:7]]
    assert consts == ["%conv1_w", "%conv1_w_1", "%conv1_w_2", "%c123", "%Add.B", "%const"]
    assert "%0 = Add(%\"input:0\", %\"7\")" in text
    g2 = round_trip(g)
    assert [v.name for v in g2.inputs] == ["input:0", "7"]  # inputs keep their exact names
    assert g2.output_names == ["out:0"] and g2.name == "odd name/1"


def test_missing_optional_inputs_node_names_and_devices():
    g = Graph()
    x = g.add_input("x", f32(3))
    hi = g.add_constant(np.array(1.0, np.float32), name="hi")
    node = g.add_node(op("Clip"), [x, None, hi], name='clip "one"\n')
    node.device = "cuda:0"
    g.set_outputs([node.output], ["y"])
    line = print_graph(g).splitlines()[2]
    assert line == '  %0 = Clip(%x, _, %hi) : f32[3] @"clip \\"one\\"\\n" on "cuda:0"'
    g2 = round_trip(g)
    n2 = g2.nodes[0]
    assert n2.inputs[1] is None and n2.name == 'clip "one"\n' and n2.device == "cuda:0"


def test_graph_output_can_be_an_input_or_constant_and_empty_graphs():
    g = Graph("id")
    x = g.add_input("x", f32())
    c = g.add_constant(np.float32(2.5), name="c")
    g.set_outputs([x, c, x], ["a", "b", "c"])
    assert print_graph(g).splitlines()[-2] == "  return a=%x, b=%c, c=%x"
    round_trip(g)
    empty = Graph("empty")
    assert print_graph(empty) == "graph @empty() -> () {\n  return\n}\n"
    round_trip(empty)


# ---------------------------------------------------------------------------------------------
# Literals: constants and attributes round-trip exactly
# ---------------------------------------------------------------------------------------------

FLOAT_VALUES = [0.0, -0.0, 0.1, 1.0, -2.5, 1e-45, 1e-38, 3.4e38, 16777217.0, np.inf, -np.inf, np.nan, 1 / 3]


@pytest.mark.parametrize("dtype", [DType.f32, DType.f16, DType.f64, DType.bf16, DType.f8e4m3fn, DType.f8e5m2])
def test_float_constants_round_trip_exactly(dtype):
    with np.errstate(all="ignore"):
        arr = np.array(FLOAT_VALUES, dtype=np.float64).astype(dtype.np)
    g = Graph()
    c = g.add_constant(arr, name="c")
    g.set_outputs([c], ["c"])
    text = print_graph(g, weights_inline_limit=100)
    back = parse(text).constants[0].const
    assert back.dtype == arr.dtype
    nan = np.isnan(arr.astype(np.float64))
    assert np.array_equal(np.isnan(back.astype(np.float64)), nan)
    bits = np.dtype(f"u{arr.dtype.itemsize}")
    assert np.array_equal(back[~nan].view(bits), arr[~nan].view(bits))  # bit-exact, -0.0 included
    assert print_graph(parse(text), weights_inline_limit=100) == text


def test_float_literals_are_short_and_look_like_floats():
    g = Graph()
    c = g.add_constant(np.array([0.1, 1.0, 1e20, -0.0, 2.0 ** -149], np.float32), name="c")
    g.set_outputs([c], ["c"])
    assert "dense<[0.1, 1.0, 1e+20, -0.0, 1e-45]>" in print_graph(g)


def test_other_constant_literals():
    g = Graph()
    arrays = {
        "i64": np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max], np.int64),
        "u64": np.array([np.iinfo(np.uint64).max, 0], np.uint64),
        "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "b": np.array([[True, False]]),
        "s": np.array(['plain', 'quote " backslash \\ tab\t nl\n', "ünï©ødé ✓", "\x00\x7f\u2028"], object),
        "c64": np.array([1 + 2j, -0.5j], np.complex64),
        "scalar": np.array(7, np.int32),
        "empty": np.zeros((2, 0, 3), np.float32),
        "rank3": np.arange(8, dtype=np.int16).reshape(2, 2, 2),
        "i4": np.array([-8, 7, 0], DType.i4.np),
    }
    for name, arr in arrays.items():
        g.add_constant(arr, name=name)
    g.set_outputs([g.constants[0]], ["out"])
    text = print_graph(g)
    assert "%b = const bool[1,2] dense<[[true, false]]>" in text
    assert "%scalar = const i32[] dense<7>" in text
    assert "%empty = const f32[2,0,3] dense<[[], []]>" in text
    assert "%rank3 = const i16[2,2,2] dense<[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]>" in text
    assert "%c64 = const c64[2] dense<[(1.0, 2.0), (0.0, -0.5)]>" in text or "(-0.0, -0.5)" in text
    assert '"quote \\" backslash \\\\ tab\\t nl\\n"' in text and '"\\u0000\\u007f\\u2028"' in text
    assert len(text.splitlines()) == len(arrays) + 3  # no literal breaks a line
    g2 = parse(text)
    for c in g2.constants:
        want = arrays[c.name]
        assert c.const.dtype == want.dtype and c.const.shape == want.shape
        assert c.const.tolist() == want.tolist(), c.name
    assert print_graph(g2) == text


def test_attribute_literals_round_trip(sink):
    g = Graph()
    x = g.add_input("x", f32(2))
    attrs = dict(i=5, f=1.0, s='a "q"\n', b=True, dt=DType.bf16, ints=(1, -2, 3), floats=(0.5, 1e-05, float("inf")),
                 strs=("x", ""), t=np.array([[1, 2]], np.int64), ts=(np.array(1.5, np.float32), np.array([True])),
                 opt=None, anything=(1, "two", 3.0))
    node = g.add_node(sink(**attrs), [x, None, x], num_outputs=2)
    g.set_outputs(list(node.outputs), ["a", "b"])
    line = print_graph(g).splitlines()[1]
    assert line == (
        '  %0, %1 = KitchenSink(%x, _, %x) {anything=[1, "two", 3.0], b=true, dt=bf16, f=1.0, floats=[0.5, 1e-05, '
        'inf], i=5, ints=[1, -2, 3], opt=none, s="a \\"q\\"\\n", strs=["x", ""], t=dense<i64[1,2]: [[1, 2]]>, '
        'ts=[dense<f32[]: 1.5>, dense<bool[1]: [true]>]} : f32[2], f32[2]')
    g2 = round_trip(g)
    got = g2.nodes[0].op
    assert got == node.op and isinstance(got.f, float) and got.opt is None and got.dt is DType.bf16
    # defaults are not printed
    g3 = Graph()
    y = g3.add_input("x", f32(2))
    g3.set_outputs([g3.add_node(sink(), [y], num_outputs=1).outputs[0]], ["a"])
    assert "KitchenSink(%x) : f32[2]" in print_graph(g3)


def test_one_result_of_a_multi_result_op_and_float_attributes(sink):
    g = ir("""
        graph @g(%x: f32[2]) -> (y: f32[2]) {
          %0 = KitchenSink(%x) {f=2, floats=[1, 2.5]} : f32[2]
          %1 = LeakyRelu(%0) {alpha=0.25} : f32[2]
          return y=%1
        }""")
    assert g.nodes[0].op.f == 2.0 and isinstance(g.nodes[0].op.f, float)
    assert "{f=2.0, floats=[1.0, 2.5]}" in print_graph(g)
    verify(g)


# ---------------------------------------------------------------------------------------------
# Parsing: hand-written text, known values, errors
# ---------------------------------------------------------------------------------------------

def test_parse_hand_written_text_with_comments_and_known_values():
    g = ir("""
        # a comment
        graph @g(%x: f32[N, 3]) -> (y: f32[N,3]) {   # another
          %s = const i64[1] dense<[3]>
          %two = const i64[1] dense<[2]>
          %sum = Add(%s, %two) : i64[1]
          %y = Relu(%x) : f32[N,3]
          return y=%y
        }""")
    verify(g)
    assert g.nodes[0].outputs[0].known.tolist() == [5]  # computed as Graph.add_node does
    assert g.nodes[0].outputs[0].name == "sum"
    text = print_graph(g)
    assert "%0 = Add(%s, %two) : i64[1]" in text and "return y=%1" in text


def test_written_types_are_kept_for_the_verifier():
    g = ir("""
        graph @g(%x: f32[2]) -> (y: f32[3]) {
          %0 = Relu(%x) : f32[3]
          return y=%0
        }""")
    assert g.nodes[0].outputs[0].type == f32(3)  # as written, not as inferred


def test_symbolic_dims_and_unknown_dims():
    g = ir("""
        graph @g(%x: f32[batch,?,"seq len",3]) -> (y: f32[batch,?,"seq len",3]) {
          %0 = Relu(%x) : f32[batch,?,"seq len",3]
          return y=%0
        }""")
    assert g.inputs[0].shape == ("batch", None, "seq len", 3)
    assert print_graph(g).splitlines()[0] == \
        'graph @g(%x: f32[batch,?,"seq len",3]) -> (y: f32[batch,?,"seq len",3]) {'


def parse_error(text: str, weights=None) -> ParseError:
    with pytest.raises(ParseError) as e:
        parse(textwrap.dedent(text).strip() + "\n", weights)
    return e.value


GOOD = """
    graph @g(%x: f32[2]) -> (y: f32[2]) {
      %w = const f32[2]
      %0 = LeakyRelu(%x) {alpha=0.5} : f32[2]
      %1 = Add(%0, %w) : f32[2]
      return y=%1
    }"""


def test_parse_errors_have_positions_lines_and_carets():
    e = parse_error(GOOD.replace("%x) {", "%x) $ {"), {"w": np.ones(2, np.float32)})
    assert (e.line, e.column) == (3, 22) and "unexpected character '$'" in e.msg
    assert str(e) == ("3:22: unexpected character '$'\n"
                      "    %0 = LeakyRelu(%x) $ {alpha=0.5} : f32[2]\n"
                      "                       ^")


def test_parse_error_unknown_op_suggests():
    e = parse_error(GOOD.replace("LeakyRelu", "LeakyRelo"), {"w": np.ones(2, np.float32)})
    assert (e.line, e.column) == (3, 8)
    assert "unknown op 'LeakyRelo' (did you mean LeakyRelu" in e.msg


def test_parse_error_bad_attributes():
    w = {"w": np.ones(2, np.float32)}
    e = parse_error(GOOD.replace("alpha=0.5", "alpha=0.5, beta=2"), w)
    assert e.line == 3 and e.source_line.index("beta") + 1 == e.column
    assert "LeakyRelu has no attribute 'beta' (it takes: alpha)" in e.msg
    e = parse_error(GOOD.replace('alpha=0.5', 'alpha="big"'), w)
    assert e.column == e.source_line.index('"big"') + 1 and "alpha" in e.msg and "expected a float" in e.msg
    e = parse_error(GOOD.replace("LeakyRelu(%x) {alpha=0.5}", 'Gelu(%x) {approximate="fast"}'), w)
    assert e.column == e.source_line.index('"fast"') + 1 and "approximate must be 'none' or 'tanh'" in e.msg
    e = parse_error(GOOD.replace("alpha=0.5", "alpha=0.5, alpha=1.0"), w)
    assert "given twice" in e.msg
    e = parse_error(GOOD.replace("alpha=0.5", "alpha=fast"), w)
    assert "unknown attribute value 'fast'" in e.msg


def test_parse_error_undefined_and_redefined_values():
    w = {"w": np.ones(2, np.float32)}
    e = parse_error(GOOD.replace("Add(%0, %w)", "Add(%0, %v)"), w)
    assert (e.line, e.column) == (4, 16) and e.msg.startswith("undefined value %v")
    e = parse_error(GOOD.replace("LeakyRelu(%x)", "LeakyRelu(%1)"), w)
    assert "undefined value %1" in e.msg and e.line == 3
    e = parse_error(GOOD.replace("%1 = Add", "%0 = Add"), w)
    assert "value %0 is already defined (line 3)" in e.msg and e.line == 4
    e = parse_error(GOOD.replace("return y=%1", "return y=%9"), w)
    assert "undefined value %9" in e.msg and e.line == 5


def test_parse_error_missing_or_wrong_weights():
    e = parse_error(GOOD, None)
    assert (e.line, e.column) == (2, 3) and "constant %w (f32[2]) has no inline data, and no weights" in e.msg
    e = parse_error(GOOD, {"v": np.ones(2, np.float32)})
    assert "constant %w (f32[2]) has no inline data and is missing from the weights" in e.msg
    e = parse_error(GOOD, {"w": np.ones(3, np.float32)})
    assert "weight 'w' has type f32[3], the text declares f32[2]" in e.msg


def test_parse_error_other_mistakes():
    w = {"w": np.ones(2, np.float32)}
    cases = {
        GOOD.replace("f32[2]) -> (y", "f33[2]) -> (y"): "unknown element type 'f33'",
        GOOD.replace(": f32[2]\n      %1", "\n      %1"): "defines 1 result(s) but 0 result type(s)",
        GOOD.replace("return y=%1", "return z=%1"): "return gives z, the graph signature declares y",
        GOOD.replace("-> (y: f32[2])", "-> (y: f32[3])"): "output 'y' is declared f32[3] in the signature",
        GOOD.replace("return y=%1\n", ""): "expected 'return' before '}'",
        GOOD.replace('alpha=0.5', 'alpha="oops'): "unterminated string",
        GOOD.replace("const f32[2]", "const f32[2] dense<[1.0]>"): "dimension 0 of f32[2] has 2 elements, this list",
        GOOD.replace("const f32[2]", "const f32[2] dense<[1.0, 2.0, 3.0]>"): "too many elements",
        GOOD.replace("const f32[2]", "const i8[2] dense<[1, 300]>"): "out of range for i8",
        GOOD.replace("const f32[2]", "const f32[2] dense<[1.0, true]>"): "expected a number, got 'true'",
        GOOD + "\nextra": "unexpected 'extra' after the end of the graph",
        GOOD.rstrip().rstrip("}"): "expected '}' after the return statement, got the end of the text",
        GOOD.replace("graph @g", "graf @g"): "expected 'graph' at the start of the text",
    }
    for text, msg in cases.items():
        e = parse_error(text, w)
        assert msg in e.msg, (msg, str(e))
        assert e.line >= 1 and e.column >= 1 and e.source_line in text


def test_parse_error_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "bad.kir"
    path.write_text(GOOD.replace("LeakyRelu", "Nope").replace("f32[2]\n", "f32[2] dense<[1.0, 2.0]>\n", 1))
    with pytest.raises(ParseError, match=r"bad\.kir:4:\d+: unknown op 'Nope'"):
        load_text(path)


# ---------------------------------------------------------------------------------------------
# save_text / load_text
# ---------------------------------------------------------------------------------------------

def test_save_and_load_text(tmp_path):
    g = Graph("saved")
    x = g.add_input("x", TensorType(DType.bf16, (4, 8)))
    w = g.add_constant(np.linspace(-1, 1, 32).astype(DType.bf16.np).reshape(4, 8), name="layer/0:w")
    s = g.add_constant(np.array([f"s{i}" for i in range(20)], object), name="labels")
    g.add_constant(np.zeros(20, np.int8), name="file")  # np.savez(**weights) would choke on this name
    small = g.add_constant(np.array([1, 2], np.int64), name="small")
    y = g.add(op("Add"), x, w)
    g.set_outputs([y, s, small], ["y", "labels", "small"])
    path = tmp_path / "model.kir"
    save_text(g, path)
    assert sidecar_path(path) == str(path) + ".npz" and os.path.exists(str(path) + ".npz")
    with np.load(str(path) + ".npz", allow_pickle=False) as z:
        assert sorted(z.files) == ["file", "labels", "layer_0_w"]
    g2 = load_text(path)
    assert print_graph(g2) == print_graph(g) == path.read_text()
    assert np.array_equal(g2.constants[0].const.view(np.uint16), w.const.view(np.uint16))
    assert g2.constants[0].const.dtype == DType.bf16.np
    assert g2.constants[1].const.tolist() == s.const.tolist() and g2.constants[1].const.dtype == object
    verify(g2)
    # saving a graph without large constants removes a stale sidecar
    g.set_outputs([small], ["small"])
    g.remove(y.producer)
    g.constants = [small]
    save_text(g, path)
    assert not os.path.exists(str(path) + ".npz")
    assert print_graph(load_text(path)) == print_graph(g)


# ---------------------------------------------------------------------------------------------
# Imported ONNX models
# ---------------------------------------------------------------------------------------------

def test_imported_onnx_model_round_trips():
    from onnx import TensorProto, helper

    from frontends.onnx import import_model

    nodes = [helper.make_node("Add", ["x", "bias"], ["a"], name="add/1"),
             helper.make_node("Clip", ["a", "", "hi"], ["c"], name="clip"),
             helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT16)]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 3])],
        [helper.make_tensor("bias", TensorProto.FLOAT, [3], [0.1, 0.2, 0.3]),
         helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])])
    g = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    text = print_graph(g)
    assert '%0 = Add(%x, %bias) : f32[batch,3] @"add/1"' in text
    assert '%1 = Clip(%0, _, %hi) : f32[batch,3] @"clip"' in text
    round_trip(g)


LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))


def test_light_models_are_there():
    assert len(LIGHT) == 9


@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p)[6:-5] for p in LIGHT])
def test_light_model_round_trips(path, tmp_path):
    from frontends.onnx import import_model

    g = import_model(path)
    g2 = round_trip(g)
    assert len(g2.nodes) == len(g.nodes) and len(g2.constants) == len(g.constants)
    for a, b in zip(g.constants, g2.constants):
        assert a.type == b.type and np.array_equal(a.const, b.const)
    for a, b in zip(g.nodes, g2.nodes):
        assert a.op == b.op and a.name == b.name
        assert [v.known is None for v in a.outputs] == [v.known is None for v in b.outputs]
    save_text(g, tmp_path / "m.kir")
    assert print_graph(load_text(tmp_path / "m.kir")) == print_graph(g)


def test_node_built_by_hand_prints_and_parses():
    g = Graph()
    x = g.add_input("x", f32(2))
    node = Node(op("Relu"), [x], [f32(2)], name="r")
    g.insert(node)
    g.set_outputs([node.output], ["y"])
    round_trip(g)


CONTROL_FLOW = """\
graph @cf(%c: bool[], %x: f32[N,2], %n: i64[]) -> (y: f32[N,2], acc: f32[N,2], steps: f32[?,N,2]) {
  %w = const f32[2] dense<[1.0, 2.0]>
  %0 = If(%c, %x, %w) {else_branch=graph @else(%x: f32[N,2], %w: f32[2]) -> (y: f32[N,2]) {
    %0 = Neg(%x) : f32[N,2]
    return y=%0
  }, then_branch=graph @then(%x: f32[N,2], %w: f32[2]) -> (y: f32[N,2]) {
    %w_1 = const f32[1] dense<[0.5]>
    %0 = Mul(%x, %w) : f32[N,2]
    %1 = Add(%0, %w_1) : f32[N,2] @"bias"
    return y=%1
  }} : f32[N,2] @"branch"
  %1, %2 = Loop(%n, _, %0, %w) {body=graph @body(%i: i64[], %cond: bool[], %acc: f32[N,2], %w: f32[2]) -> (cond: bool[], acc: f32[N,2], step: f32[N,2]) {
    %0 = Add(%acc, %w) : f32[N,2]
    %1, %2 = Scan(%w, %0) {body=graph @inner(%s: f32[2], %row: f32[2]) -> (s: f32[2], r: f32[2]) {
      %0 = Max(%s, %row) : f32[2]
      return s=%0, r=%row
    }, num_scan_inputs=1, scan_input_directions=[1]} : f32[2], f32[N,2]
    return cond=%cond, acc=%0, step=%2
  }, num_captures=1} : f32[N,2], f32[?,N,2]
  return y=%0, acc=%1, steps=%2
}
"""


def test_control_flow_regions_round_trip():
    """Subgraph attributes print as indented regions, nested to any depth, and parse back identically;
    each body numbers its results from %0 and is a scope of its own."""
    g = parse(CONTROL_FLOW)
    verify(g)
    assert print_graph(g) == CONTROL_FLOW
    round_trip(g)
    loop = g.nodes[1]
    assert loop.op.body.nodes[1].op.body.name == "inner"
    from compiler.ir.interpreter import interpret

    x = np.array([[1, -1], [3, 0]], np.float32)
    out = interpret(g, {"c": np.array(False), "x": x, "n": np.array(2, np.int64)})
    np.testing.assert_array_equal(out["acc"], -x + 2 * np.array([1, 2], np.float32))
    assert out["steps"].shape == (2, 2, 2)
    with pytest.raises(ParseError, match="undefined value %acc"):  # a nested body does not see its parent's values
        parse(CONTROL_FLOW.replace("%0 = Max(%s, %row)", "%0 = Max(%s, %acc)"))
