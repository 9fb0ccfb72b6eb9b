"""The IR text format: parsing (the grammar is in docs/ir.md; ``printer.py`` writes the format).

``parse(text, weights)`` reads one graph. It is a small hand-written recursive-descent parser over a
tokenizer. Nodes get the result types written in the text (so the verifier can compare them with
what inference gives); known values (``Value.known``) are computed as the graph builder does. Errors
are ``ParseError`` with line, column, the offending line and a caret under the position.

A subgraph attribute (``body=graph @body(...) -> (...) { ... }``) is parsed as a graph of its own, in
a scope of its own: its statements see its inputs and its own definitions only (the IR passes outer
values to a body as explicit inputs).

Nesting is bounded, so no text makes the parser exceed Python's recursion limit: subgraphs nest at
most ``max_nesting_depth`` deep (64 by default, the ONNX importer's default too), attribute lists
``MAX_LIST_DEPTH`` deep, and a dense literal has at most ``MAX_RANK`` dims (NumPy's limit).
"""
from __future__ import annotations

import bisect
import dataclasses
import difflib
import os
import re
from typing import Mapping

import numpy as np

from compiler.errors import KilnError

from . import ops
from .graph import Graph, Node, Value
from .ops.base import infer_node
from .types import DType, OptionalType, SequenceType, TensorType

__all__ = ["ParseError", "parse", "load_text", "MAX_NESTING_DEPTH"]

#: how deep subgraphs may be nested (the graph is depth 0, a body of a node in it depth 1)
MAX_NESTING_DEPTH = 64
#: how deep attribute lists may be nested ([[1, 2], [3]] is 2 deep)
MAX_LIST_DEPTH = 32
#: the most dims a dense literal may have (NumPy's limit)
MAX_RANK = 64


class ParseError(KilnError, ValueError):
    """Text that is not valid Kiln IR; ``line`` and ``column`` are 1-based."""

    def __init__(self, msg: str, line: int, column: int, source_line: str, filename: str | None = None):
        self.msg = msg
        self.line = line
        self.column = column
        self.source_line = source_line
        self.filename = filename
        where = f"{filename}:{line}:{column}" if filename else f"{line}:{column}"
        caret = " " * (column - 1) + "^"
        super().__init__(f"{where}: {msg}\n  {source_line}\n  {caret}")

    def __reduce__(self):
        return type(self), (self.msg, self.line, self.column, self.source_line, self.filename)


# ---------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------

_STR = r'"(?:[^"\\\n]|\\.)*"'
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+|\#[^\n]*)
  | (?P<value>%(?:[A-Za-z0-9_.]+|""" + _STR + r"""))
  | (?P<at>@(?:[A-Za-z0-9_.]+|""" + _STR + r"""))
  | (?P<string>""" + _STR + r""")
  | (?P<number>-(?:inf|nan)(?![A-Za-z0-9_.])|-?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<arrow>->)
  | (?P<punct>[(){}\[\]<>,:=?])
""", re.VERBOSE)

_SIMPLE_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}


@dataclasses.dataclass
class Token:
    kind: str  # value, at, string, int, float, ident, arrow, punct, eof
    text: str
    pos: int
    #: value/at: the name (unquoted); string: the contents; numbers: the Python number
    value: object = None
    quoted: bool = False


class _Source:
    def __init__(self, text: str, filename: str | None):
        self.text = text
        self.filename = filename
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def error(self, msg: str, pos: int) -> ParseError:
        if pos >= len(self.text):  # the end: point just after the last thing written
            pos = len(self.text.rstrip())
        i = bisect.bisect_right(self.line_starts, pos) - 1
        start = self.line_starts[i]
        end = self.text.find("\n", start)
        line = self.text[start:end if end >= 0 else len(self.text)]
        return ParseError(msg, i + 1, pos - start + 1, line.rstrip("\r"), self.filename)


def _unescape(src: _Source, body: str, pos: int) -> str:
    """The contents of a string literal (``body`` without the quotes, starting at ``pos``)."""
    if "\\" not in body:
        return body
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[nxt])
            i += 2
        elif nxt in "uU":
            width = 4 if nxt == "u" else 8
            digits = body[i + 2:i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise src.error(f"bad escape \\{nxt}: expects {width} hex digits", pos + i)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:  # surrogates are not characters (nor UTF-8)
                raise src.error(f"bad escape \\{nxt}{digits}: not a character", pos + i)
            out.append(chr(code))
            i += 2 + width
        else:
            raise src.error(f"unknown escape \\{nxt} (known: \\\\ \\\" \\n \\t \\r \\uXXXX \\UXXXXXXXX)", pos + i)
    return "".join(out)


def tokenize(src: _Source) -> list[Token]:
    text = src.text
    tokens: list[Token] = []
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            if ch == '"' or (ch in "%@" and text[pos + 1:pos + 2] == '"'):
                raise src.error("unterminated string (strings end on the same line; write \\n for a line break)",
                                pos)
            if ch in "%@":
                raise src.error(f"expected a name after {ch!r} (letters, digits, _ and ., or a quoted string)",
                                pos)
            raise src.error(f"unexpected character {ch!r}", pos)
        kind = m.lastgroup
        s = m.group()
        if kind == "ws":
            pos = m.end()
            continue
        tok = Token(kind, s, pos)
        if kind in ("value", "at"):
            body = s[1:]
            if body.startswith('"'):
                tok.value, tok.quoted = _unescape(src, body[1:-1], pos + 2), True
            else:
                tok.value = body
        elif kind == "string":
            tok.value = _unescape(src, s[1:-1], pos + 1)
        elif kind == "number":
            if any(c in s for c in ".eEin"):
                tok.kind, tok.value = "float", float(s)
            else:
                tok.kind, tok.value = "int", int(s)
        tokens.append(tok)
        pos = m.end()
    tokens.append(Token("eof", "", n))
    return tokens


def _describe(tok: Token) -> str:
    if tok.kind == "eof":
        return "the end of the text"
    return repr(tok.text) if len(tok.text) <= 40 else repr(tok.text[:37] + "...")


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------

_FLOAT_WORDS = {"inf": float("inf"), "nan": float("nan")}


class _Parser:
    def __init__(self, text: str, weights: Mapping[str, np.ndarray] | None, filename: str | None,
                 max_nesting_depth: int = MAX_NESTING_DEPTH):
        self.src = _Source(text, filename)
        self.toks = tokenize(self.src)
        self.i = 0
        self.weights = weights
        self.max_depth = max_nesting_depth
        self.depth = 0  # of the graph being parsed
        self.list_depth = 0
        self.graph: Graph | None = None
        # ("#", digits) for bare numbered names, ("$", name) for the others -> (value, position)
        self.scope: dict[tuple[str, str], tuple[Value, int]] = {}

    # -- token helpers ---------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def next(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def error(self, msg: str, tok: Token | int | None = None) -> ParseError:
        pos = (tok if isinstance(tok, int) else (tok or self.tok).pos)
        return self.src.error(msg, pos)

    def at_punct(self, p: str) -> bool:
        return self.tok.kind == "punct" and self.tok.text == p

    def at_word(self, w: str) -> bool:
        return self.tok.kind == "ident" and self.tok.text == w

    def expect(self, p: str, what: str = "") -> Token:
        if not self.at_punct(p):
            raise self.error(f"expected {p!r}{' ' + what if what else ''}, got {_describe(self.tok)}")
        return self.next()

    def expect_word(self, w: str, what: str = "") -> Token:
        if not self.at_word(w):
            raise self.error(f"expected {w!r}{' ' + what if what else ''}, got {_describe(self.tok)}")
        return self.next()

    def accept(self, p: str) -> bool:
        if self.at_punct(p):
            self.next()
            return True
        return False

    def comma_list(self, close: str, item) -> list:
        """``item (',' item)*`` up to the closing punctuation (consumed); empty allowed."""
        out = []
        if self.accept(close):
            return out
        while True:
            out.append(item())
            if self.accept(close):
                return out
            if not self.accept(","):
                raise self.error(f"expected ',' or {close!r}, got {_describe(self.tok)}")

    # -- names -------------------------------------------------------------------------------------
    @staticmethod
    def key(tok: Token) -> tuple[str, str]:
        name = tok.value
        return ("#", name) if not tok.quoted and name.isdigit() else ("$", name)

    def define(self, tok: Token, v: Value) -> None:
        k = self.key(tok)
        if k in self.scope:
            line = self.src.error("", self.scope[k][1]).line
            raise self.error(f"value {tok.text} is already defined (line {line}); every value is defined once",
                             tok)
        self.scope[k] = (v, tok.pos)

    def use(self) -> Value:
        tok = self.tok
        if tok.kind != "value":
            raise self.error(f"expected a value (%name), got {_describe(tok)}")
        self.next()
        found = self.scope.get(self.key(tok))
        if found is None:
            raise self.error(f"undefined value {tok.text} (a value must be defined before it is used)", tok)
        return found[0]

    def output_name(self) -> str:
        tok = self.tok
        if tok.kind in ("ident", "string"):
            self.next()
            return tok.value if tok.kind == "string" else tok.text
        raise self.error(f"expected an output name, got {_describe(tok)}")

    # -- types -----------------------------------------------------------------------------------
    def dtype(self) -> DType:
        tok = self.tok
        if tok.kind != "ident":
            raise self.error(f"expected an element type (f32, i64, ...), got {_describe(tok)}")
        try:
            dt = DType.parse(tok.text)
        except ValueError:
            known = ", ".join(d.short for d in DType)
            raise self.error(f"unknown element type {tok.text!r} (known: {known})") from None
        self.next()
        return dt

    def dim(self):
        tok = self.next()
        if tok.kind == "int":
            if tok.value < 0:
                raise self.error(f"a dimension cannot be negative: {tok.text}", tok)
            return tok.value
        if tok.kind == "ident":
            return tok.text
        if tok.kind == "string":
            return tok.value
        if tok.kind == "punct" and tok.text == "?":
            return None
        raise self.error(f"expected a dimension (an integer, a symbol such as N, or ?), got {_describe(tok)}",
                         tok)

    def type(self):
        """A value type: ``f32[N,4]``, ``seq<f32[?,4]>``, ``seq<3 x f32[4]>``, ``seq<f32>``, ``opt<...>``."""
        if self.at_word("seq"):
            self.next()
            self.expect("<", "after seq")
            length = None
            if self.tok.kind == "int":
                lt = self.next()
                if lt.value < 0:
                    raise self.error(f"a sequence length cannot be negative: {lt.text}", lt)
                length = lt.value
                self.expect_word("x", "after the sequence length (seq<3 x f32[4]>)")
            dt = self.dtype()
            shape = tuple(self.comma_list("]", self.dim)) if self.accept("[") else None
            self.expect(">", "to close seq<...>")
            return SequenceType(dt, shape, length)
        if self.at_word("opt"):
            self.next()
            self.expect("<", "after opt")
            if self.at_word("opt"):  # refused before reading it: no recursion on opt<opt<opt<...
                raise self.error("optionals do not nest: opt<opt<...>> is not a type")
            elem = self.type()
            self.expect(">", "to close opt<...>")
            return OptionalType(elem)
        return self.tensor_type()

    def tensor_type(self) -> TensorType:
        tok = self.tok
        if tok.kind == "ident" and tok.text in ("seq", "opt"):
            raise self.error(f"expected a tensor type here (f32[2,3]), not a {tok.text}<...> type")
        dt = self.dtype()
        self.expect("[", "after the element type (a scalar is f32[])")
        shape = self.comma_list("]", self.dim)
        return TensorType(dt, tuple(shape))

    # -- literals --------------------------------------------------------------------------------
    def scalar(self, dtype: DType):
        tok = self.tok
        if dtype is DType.bool:
            if tok.kind == "ident" and tok.text in ("true", "false"):
                self.next()
                return tok.text == "true"
            raise self.error(f"expected true or false for a {dtype} element, got {_describe(tok)}")
        if dtype is DType.string:
            if tok.kind == "string":
                self.next()
                return tok.value
            raise self.error(f"expected a quoted string for a string element, got {_describe(tok)}")
        if dtype in (DType.c64, DType.c128):
            if self.accept("("):
                re_ = self.real()
                self.expect(",", "between the real and imaginary parts")
                im = self.real()
                self.expect(")", "after the imaginary part")
                return complex(re_, im)
            return complex(self.real())
        if dtype.is_float:
            return self.real()
        if tok.kind == "int":
            self.next()
            return tok.value
        raise self.error(f"expected an integer for a {dtype} element, got {_describe(tok)}")

    def real(self) -> float:
        tok = self.tok
        if tok.kind in ("int", "float"):
            self.next()
            return float(tok.value)
        if tok.kind == "ident" and tok.text in _FLOAT_WORDS:
            self.next()
            return _FLOAT_WORDS[tok.text]
        raise self.error(f"expected a number, got {_describe(tok)}")

    def elements(self, t: TensorType) -> np.ndarray:
        """Nested-list elements matching the static shape of ``t``; returns the array."""
        start = self.tok
        if not t.is_static:
            raise self.error(f"a dense literal needs a static shape, not {t}", start)
        if t.rank > MAX_RANK:
            raise self.error(f"a dense literal has at most {MAX_RANK} dims, this one {t.rank}", start)
        flat: list = []

        def level(depth: int) -> None:
            if depth == len(t.shape):
                flat.append(self.scalar(t.dtype))
                return
            want = t.shape[depth]
            open_tok = self.tok
            if not self.accept("["):
                raise self.error(f"expected '[' (dimension {depth} of {t} has {want} elements), got "
                                 f"{_describe(self.tok)}")
            count = 0
            if not self.at_punct("]"):
                while True:
                    if count == want:
                        raise self.error(f"too many elements: dimension {depth} of {t} has {want}")
                    level(depth + 1)
                    count += 1
                    if not self.accept(","):
                        break
            if not self.at_punct("]"):
                raise self.error(f"expected ',' or ']', got {_describe(self.tok)}")
            if count != want:
                raise self.error(f"dimension {depth} of {t} has {want} elements, this list has {count}", open_tok)
            self.next()

        level(0)
        return self.build_array(flat, t, start)

    def build_array(self, flat: list, t: TensorType, tok: Token) -> np.ndarray:
        dt = t.dtype
        if dt.np is None:
            raise self.error(f"element type {dt} needs the ml_dtypes package", tok)
        if dt is DType.string:
            arr = np.empty(len(flat), dtype=object)
            arr[:] = flat
        elif dt in (DType.c64, DType.c128):
            arr = np.array(flat, dtype=np.complex128).astype(dt.np)
        elif dt.is_float:
            arr = np.array(flat, dtype=np.float64)
            with np.errstate(all="ignore"):
                arr = arr.astype(dt.np)
        elif dt is DType.bool:
            arr = np.array(flat, dtype=np.bool_)
        else:
            try:
                arr = np.array(flat, dtype=dt.np)
            except (OverflowError, ValueError):
                arr = None
            if arr is None or [int(x) for x in arr.tolist()] != [int(x) for x in flat]:
                raise self.error(f"an element is out of range for {dt}", tok)
        return arr.reshape(t.shape)

    def attr_value(self):
        tok = self.tok
        if tok.kind in ("int", "float", "string"):
            self.next()
            return tok.value
        if tok.kind == "punct" and tok.text == "[":
            if self.list_depth >= MAX_LIST_DEPTH:
                raise self.error(f"attribute lists are nested more than {MAX_LIST_DEPTH} deep")
            self.next()
            self.list_depth += 1
            try:
                return tuple(self.comma_list("]", self.attr_value))
            finally:
                self.list_depth -= 1
        if tok.kind == "ident":
            word = tok.text
            if word in ("true", "false"):
                self.next()
                return word == "true"
            if word == "none":
                self.next()
                return None
            if word in _FLOAT_WORDS:
                self.next()
                return _FLOAT_WORDS[word]
            if word == "dense":
                self.next()
                self.expect("<", "after dense")
                t = self.tensor_type()
                self.expect(":", f"after the type of the tensor ({t})")
                arr = self.elements(t)
                self.expect(">", "to close dense<...>")
                return arr
            if word in ("seq", "opt"):
                return self.type()
            if word == "graph":
                return self.subgraph()
            if word == "opaque":
                raise self.error("an opaque<...> attribute value cannot be read back (the printer could not "
                                 "represent it)")
            try:
                dt = DType.parse(word)
            except ValueError:
                raise self.error(f"unknown attribute value {word!r} (strings are quoted: \"{word}\"; element "
                                 "types are bare: f32, i64, ...)") from None
            if self.toks[self.i + 1].kind == "punct" and self.toks[self.i + 1].text == "[":
                return self.tensor_type()  # a type: f32[4]
            self.next()
            return dt
        raise self.error(f"expected an attribute value, got {_describe(tok)}")

    # -- statements ------------------------------------------------------------------------------
    def parse(self) -> Graph:
        g = self.parse_graph("at the start of the text")
        if self.tok.kind != "eof":
            raise self.error(f"unexpected {_describe(self.tok)} after the end of the graph")
        return g

    def subgraph(self) -> Graph:
        """A graph written as an attribute value: parsed in a scope of its own."""
        if self.depth >= self.max_depth:
            raise self.error(f"subgraphs are nested more than {self.max_depth} deep (the limit: "
                             f"max_nesting_depth={self.max_depth})")
        saved = self.graph, self.scope, self.list_depth
        self.scope = {}
        self.depth += 1
        self.list_depth = 0
        try:
            return self.parse_graph()
        finally:
            self.graph, self.scope, self.list_depth = saved
            self.depth -= 1

    def parse_graph(self, where: str = "") -> Graph:
        self.expect_word("graph", where)
        tok = self.tok
        if tok.kind != "at":
            raise self.error(f"expected the graph name (@name), got {_describe(tok)}")
        self.next()
        g = self.graph = Graph(tok.value)
        self.expect("(", "to open the graph inputs")

        def param():
            vt = self.tok
            if vt.kind != "value":
                raise self.error(f"expected a graph input (%name: type), got {_describe(vt)}")
            self.next()
            self.expect(":", f"after {vt.text}")
            v = g.add_input(vt.value, self.type())
            self.define(vt, v)
            return v

        self.comma_list(")", param)
        self.expect_word_arrow()
        self.expect("(", "to open the graph results")

        def result():
            nt = self.tok
            name = self.output_name()
            self.expect(":", f"after the output name {name!r}")
            return nt, name, self.type()

        declared = self.comma_list(")", result)
        self.expect("{", "to open the graph body")
        while True:
            tok = self.tok
            if tok.kind == "eof":
                raise self.error("the graph body is not closed: expected '}'")
            if self.at_punct("}"):
                raise self.error("expected 'return' before '}'")
            if self.at_word("return"):
                self.statement_return(declared)
                break
            self.statement()
        self.expect("}", "after the return statement")
        return g

    def expect_word_arrow(self) -> None:
        if self.tok.kind != "arrow":
            raise self.error(f"expected '->' after the graph inputs, got {_describe(self.tok)}")
        self.next()

    def statement(self) -> None:
        tok = self.tok
        results: list[Token] = []
        if tok.kind == "value":
            while True:
                vt = self.tok
                if vt.kind != "value":
                    raise self.error(f"expected a result name (%name), got {_describe(vt)}")
                results.append(self.next())
                if not self.accept(","):
                    break
            self.expect("=", "after the result name(s)")
            if self.at_word("const"):
                if len(results) != 1:
                    raise self.error("a constant defines one value", results[1])
                self.next()
                self.statement_const(results[0])
                return
        elif tok.kind != "ident":
            raise self.error(f"expected a statement (%name = ..., or return), got {_describe(tok)}")
        self.statement_node(results)

    def statement_const(self, name_tok: Token) -> None:
        g = self.graph
        type_tok = self.tok
        if type_tok.kind == "ident" and type_tok.text in ("seq", "opt"):
            raise self.error(f"a constant is a tensor, not a {type_tok.text}<...> value", type_tok)
        t = self.tensor_type()
        if self.at_word("dense"):
            self.next()
            self.expect("<", "after dense")
            arr = self.elements(t)
            self.expect(">", "to close dense<...>")
        else:
            arr = self.weight(name_tok, type_tok, t)
        v = g.add_constant(arr, name=name_tok.value)
        if v.type != t:  # cannot happen for literals; a guard for weights
            raise self.error(f"constant {name_tok.text} has data of type {v.type}, declared {t}", type_tok)
        self.define(name_tok, v)

    def weight(self, name_tok: Token, type_tok: Token, t: TensorType) -> np.ndarray:
        name = name_tok.value
        if self.weights is None:
            raise self.error(f"constant {name_tok.text} ({t}) has no inline data, and no weights were given "
                             f"(pass weights={{{name!r}: array}} to parse, or use load_text with its .kir.npz)",
                             name_tok)
        if name not in self.weights:
            raise self.error(f"constant {name_tok.text} ({t}) has no inline data and is missing from the weights "
                             f"({len(self.weights)} given)", name_tok)
        arr = np.asarray(self.weights[name])
        dt = t.dtype
        if dt is DType.string and arr.dtype.kind in "USO":
            arr = np.array([x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in arr.ravel()],
                           dtype=object).reshape(arr.shape)
        elif dt.np is not None and arr.dtype != dt.np and arr.dtype.kind in "uV" \
                and arr.dtype.itemsize == dt.np.itemsize and dt.np.type.__module__.startswith("ml_dtypes"):
            arr = arr.view(dt.np)  # the sidecar stores bfloat16, float8, int4... as raw unsigned ints
        try:
            got = TensorType.of(arr)
        except TypeError:
            got = None
        if got != t:
            raise self.error(f"weight {name!r} has type {got if got else arr.dtype}, the text declares {t}",
                             type_tok)
        return arr

    def statement_node(self, results: list[Token]) -> None:
        g = self.graph
        op_tok = self.tok
        if op_tok.kind != "ident":
            raise self.error(f"expected an op name or 'const', got {_describe(op_tok)}")
        self.next()
        cls = ops.lookup(op_tok.text)
        if cls is None and "." in op_tok.text:
            domain, _, name = op_tok.text.rpartition(".")
            cls = ops.lookup(name, domain)
        if cls is None:
            close = difflib.get_close_matches(op_tok.text, [n for _, n in ops.BY_NAME], n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise self.error(f"unknown op {op_tok.text!r}{hint}", op_tok)
        self.expect("(", f"after the op name {op_tok.text}")

        def operand():
            if self.at_word("_"):
                self.next()
                return None
            return self.use()

        inputs = self.comma_list(")", operand)
        attrs: dict[str, tuple[object, Token, Token]] = {}
        if self.accept("{"):
            def attribute():
                kt = self.tok
                if kt.kind != "ident":
                    raise self.error(f"expected an attribute name, got {_describe(kt)}")
                self.next()
                if kt.text in attrs:
                    raise self.error(f"attribute {kt.text!r} is given twice", kt)
                self.expect("=", f"after the attribute name {kt.text}")
                vt = self.tok
                attrs[kt.text] = (self.attr_value(), kt, vt)

            self.comma_list("}", attribute)
        op = self.make_op(cls, op_tok, attrs)
        types: list[TensorType] = []
        if self.accept(":"):
            types.append(self.type())
            while self.accept(","):
                types.append(self.type())
        if len(types) != len(results):
            raise self.error(f"{op_tok.text} defines {len(results)} result(s) but {len(types)} result type(s) "
                             "are written (': type, ...' after the operands)", op_tok)
        name = device = None
        if self.tok.kind == "at":
            name = self.next().value
        if self.at_word("on"):
            self.next()
            dt = self.tok
            if dt.kind != "string":
                raise self.error(f"expected a quoted device after 'on', got {_describe(dt)}")
            device = self.next().value
        node = Node(op, inputs, types, name=name, device=device)
        g.insert(node)
        for rt, v in zip(results, node.outputs):
            if not (not rt.quoted and rt.value.isdigit()):
                v.name = rt.value
            self.define(rt, v)
        # known values, as Graph.add_node computes them; left unset where the written types
        # disagree with inference (the verifier reports that)
        try:
            inferred, known = infer_node(op, inputs, len(types))
        except Exception:  # noqa: BLE001 - the verifier reports inference failures
            return
        if list(inferred) == types:
            for v, k in zip(node.outputs, known):
                v.known = k

    def make_op(self, cls, op_tok: Token, attrs: dict) -> ops.OpDef:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, (_, kt, _vt) in attrs.items():
            if key not in fields:
                takes = ", ".join(sorted(fields)) or "no attributes"
                raise self.error(f"{cls.name} has no attribute {key!r} (it takes: {takes})", kt)
        missing = [f for f, fd in fields.items() if f not in attrs and fd.default is dataclasses.MISSING
                   and fd.default_factory is dataclasses.MISSING]
        if missing:
            raise self.error(f"{cls.name} needs attribute(s) {', '.join(missing)}", op_tok)
        try:
            return cls(**{k: v for k, (v, _, _) in attrs.items()})
        except (ops.OpError, TypeError, ValueError) as e:
            msg = str(e)
            where = op_tok
            # point at the attribute the message is about (the first one it names)
            best = None
            for key, (_, _kt, vt) in attrs.items():
                m = re.search(rf"\b{re.escape(key)}\b", msg)
                if m and (best is None or m.start() < best[0]):
                    best = (m.start(), vt)
            if best is not None:
                where = best[1]
            elif attrs:
                where = next(iter(attrs.values()))[1]
            if not msg.startswith(cls.name):
                msg = f"{cls.name}: {msg}"
            raise self.error(f"bad attribute: {msg}", where) from None

    def statement_return(self, declared: list) -> None:
        ret_tok = self.next()
        pairs: list[tuple[Token, str, Value]] = []
        if self.tok.kind in ("ident", "string"):
            while True:
                nt = self.tok
                name = self.output_name()
                self.expect("=", f"after the output name {name!r} (return name=%value)")
                pairs.append((nt, name, self.use()))
                if not self.accept(","):
                    break
        if [n for _, n, _ in pairs] != [n for _, n, _ in declared]:
            want = ", ".join(n for _, n, _ in declared) or "nothing"
            got = ", ".join(n for _, n, _ in pairs) or "nothing"
            raise self.error(f"return gives {got}, the graph signature declares {want}",
                             pairs[0][0] if pairs else ret_tok)
        for (nt, name, v), (dt, _, t) in zip(pairs, declared):
            if v.type != t:
                raise self.error(f"output {name!r} is declared {t} in the signature, but the value returned has "
                                 f"type {v.type}", nt)
        self.graph.set_outputs([v for _, _, v in pairs], [n for _, n, _ in pairs])


def parse(text: str, weights: Mapping[str, np.ndarray] | None = None, *, filename: str | None = None,
          max_nesting_depth: int = MAX_NESTING_DEPTH) -> Graph:
    """The graph written in ``text`` (Kiln IR text format, as ``print_graph`` writes it; UTF-8 bytes
    are read too).

    ``weights`` maps the printed names of constants whose data is not inline (``%w = const
    f32[784,512]``) to arrays (``external_weights(graph)`` gives them for a graph; ``load_text``
    reads them from the ``.kir.npz`` sidecar). The graph is not verified: call ``verify`` for that.
    Subgraphs nested deeper than ``max_nesting_depth`` are a ``ParseError``.
    """
    if isinstance(text, (bytes, bytearray)):
        text = _decode(bytes(text), filename)
    return _Parser(text, weights, filename, max_nesting_depth).parse()


def _decode(data: bytes, filename: str | None) -> str:
    """UTF-8 text, or a ParseError pointing at the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        src = _Source(data.decode("utf-8", "replace"), filename)
        pos = len(data[:e.start].decode("utf-8", "replace"))
        raise src.error(f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}", pos) from None


def load_text(path, *, max_nesting_depth: int = MAX_NESTING_DEPTH) -> Graph:
    """Read a graph written by ``save_text``: ``path`` (``model.kir``) and, when there is one, the
    sidecar ``model.kir.npz`` holding its large constants."""
    from .printer import sidecar_path

    path = os.fspath(path)
    with open(path, "rb") as f:
        text = _decode(f.read(), path)
    side = sidecar_path(path)
    weights = None
    if os.path.exists(side):
        with np.load(side, allow_pickle=False) as z:
            weights = {k: z[k] for k in z.files}
    return parse(text, weights, filename=path, max_nesting_depth=max_nesting_depth)
