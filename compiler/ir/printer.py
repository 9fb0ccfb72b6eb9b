"""The IR text format: printing (the parser is ``parser.py``; the format is described in docs/ir.md).

The printed text is deterministic: the same graph always prints the same text. Names are chosen at
print time: graph inputs keep their names (quoted when they are not plain), constants keep their
names made plain (other characters become ``_``) and unique, node results are numbered ``%0``,
``%1``, ... in node order. Attributes print sorted, and only those that differ from the op's
defaults. Constants with at most ``weights_inline_limit`` elements print their data inline
(``dense<...>``); larger ones print only their type and travel separately (``external_weights``,
``save_text`` and its ``.kir.npz`` sidecar).

Subgraphs (the bodies of If, Loop, Scan, SequenceMap) print as indented regions inside the
attribute list (``then_branch=graph @then(%x: f32[2]) -> (y: f32[2]) { ... }``). Each body is its
own scope (its values are numbered from ``%0`` again), except that constant names are unique across
the whole text, so the weights of every graph travel in one flat ``{name: array}`` dict.

The printer never fails on a malformed graph (the verifier prints the IR around a problem): a value
that is not defined in the graph prints as ``%"<outside graph #k>"``.
"""
from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING

import numpy as np

from .types import DType, OptionalType, SequenceType, TensorType

if TYPE_CHECKING:
    from .graph import Graph, Node, Value

__all__ = ["print_graph", "external_weights", "save_text", "sidecar_path", "format_type", "format_attr",
           "quote", "Printer"]

#: characters of a bare (unquoted) value name: %fc1.weight, %0
_BARE_VALUE = re.compile(r"[A-Za-z0-9_.]+")
#: a bare identifier (output names, symbolic dims, attribute names, op names)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_NOT_PLAIN = re.compile(r"[^A-Za-z0-9_.]")

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}

#: the element types printed with NumPy's shortest round-trip repr (others: repr of the exact float)
_NUMPY_FLOATS = (DType.f16, DType.f32, DType.f64)


def _text(s) -> str:
    """A name as text: the importers give only ``str`` names; anything else a graph built by hand holds
    (bytes that are not UTF-8, say) prints as its escaped text, so printing never fails."""
    if isinstance(s, str):
        return s
    if isinstance(s, (bytes, bytearray)):
        return bytes(s).decode("utf-8", "backslashreplace")
    return str(s)


def quote(s: str) -> str:
    """A double-quoted string literal: backslash escapes for \\ \" \\n \\t \\r, \\uXXXX for other
    unprintable characters (so a printed line never contains a line break)."""
    s = _text(s)
    out = []
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def _value_ref(name: str) -> str:
    """``%name`` for a plain name, ``%"name"`` otherwise (all-digit names are quoted: bare digits
    are node results)."""
    name = _text(name)
    if _BARE_VALUE.fullmatch(name) and not name.isdigit():
        return "%" + name
    return "%" + quote(name)


def _ident_or_quoted(name: str) -> str:
    name = _text(name)
    return name if _IDENT.fullmatch(name) else quote(name)


def _plain(name: str) -> str:
    """A constant's printed name: characters other than [A-Za-z0-9_.] become '_'; all digits get a
    'c' in front (bare digits are node results)."""
    s = _NOT_PLAIN.sub("_", _text(name))
    return "c" + s if s.isdigit() else s


def format_dim(d) -> str:
    if d is None:
        return "?"
    if isinstance(d, str):
        return _ident_or_quoted(d)
    return str(d)


def _format_shape(shape) -> str:
    return f"[{','.join(format_dim(d) for d in shape)}]"


def format_type(t) -> str:
    """``f32[N,784]``, ``seq<f32[?,3]>``, ``seq<2 x f32[4]>``, ``seq<f32>``, ``opt<f32[4]>``: the same as
    ``str(t)`` except that odd symbolic dims are quoted."""
    if isinstance(t, TensorType):
        return t.dtype.short + _format_shape(t.shape)
    if isinstance(t, SequenceType):
        n = "" if t.length is None else f"{t.length} x "
        return f"seq<{n}{t.dtype.short}{'' if t.elem_shape is None else _format_shape(t.elem_shape)}>"
    if isinstance(t, OptionalType):
        return f"opt<{format_type(t.elem)}>"
    return f"<not a type: {t!r}>"


# ---------------------------------------------------------------------------------------------
# Literals
# ---------------------------------------------------------------------------------------------

def _format_float(x, dtype: DType | None) -> str:
    """A float that re-parses to exactly the same value of ``dtype`` (always with '.' or an exponent)."""
    f = float(x)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if dtype in _NUMPY_FLOATS:
        s = str(dtype.np.type(x))  # shortest repr that round-trips in this precision
        try:
            ok = np.array(float(s)).astype(dtype.np) == dtype.np.type(x)
        except (ValueError, OverflowError):
            ok = False
        if not ok:
            s = repr(f)
    else:
        s = repr(f)
    if not any(c in s for c in ".eE"):
        s += ".0"
    return s


def _format_scalar(x, dtype: DType) -> str:
    if dtype is DType.bool:
        return "true" if bool(x) else "false"
    if dtype is DType.string:
        if isinstance(x, bytes):
            x = x.decode("utf-8", errors="replace")
        return quote(str(x))
    if dtype in (DType.c64, DType.c128):
        part = DType.f32 if dtype is DType.c64 else DType.f64
        c = complex(x)
        return f"({_format_float(c.real, part)}, {_format_float(c.imag, part)})"
    if dtype.is_float:
        return _format_float(x, dtype)
    return str(int(x))


def format_elements(arr: np.ndarray, dtype: DType | None = None) -> str:
    """The elements of an array as nested lists (``[[1, 2], [3, 4]]``; a scalar for rank 0)."""
    arr = np.asarray(arr)
    if dtype is None:
        dtype = DType.from_numpy(arr.dtype)
    items = [_format_scalar(x, dtype) for x in arr.ravel()]
    shape = arr.shape
    if not shape:
        return items[0]

    def nest(offset: int, dims: tuple) -> str:
        if len(dims) == 1:
            return "[" + ", ".join(items[offset:offset + dims[0]]) + "]"
        step = int(np.prod(dims[1:]))
        return "[" + ", ".join(nest(offset + k * step, dims[1:]) for k in range(dims[0])) + "]"

    return nest(0, shape)


def format_attr(v) -> str:
    """An attribute value: 3, 1.5, "same", true, f32, [1, 2], dense<i64[2]: [1, 2]>, none, and types
    (Optional's ``type``): f32[4], seq<i64[?]>."""
    if v is None:
        return "none"
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, DType):
        return v.short
    if isinstance(v, (TensorType, SequenceType, OptionalType)):
        return format_type(v)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return _format_float(v, DType.f64)
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, bytes):
        return quote(v.decode("utf-8", errors="replace"))
    if isinstance(v, np.ndarray):
        try:
            dt = DType.from_numpy(v.dtype)
        except TypeError:
            return f"opaque<{quote(repr(v))}>"
        return f"dense<{format_type(TensorType(dt, v.shape))}: {format_elements(v, dt)}>"
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    from .graph import Graph

    if isinstance(v, Graph):  # a subgraph: its whole text (the node printer indents it as a region)
        return print_graph(v).rstrip("\n")
    return f"opaque<{quote(type(v).__name__ + ': ' + repr(v))}>"


# ---------------------------------------------------------------------------------------------
# The printer
# ---------------------------------------------------------------------------------------------

class Printer:
    """Names the values of one graph and prints its lines (the verifier uses the lines one by one).

    ``depth`` is the nesting of a subgraph (its lines are indented two spaces per level);
    ``const_names`` is the set of constant names taken in the whole text, shared with the printers of
    the enclosing and nested graphs (constant names are unique across graphs; other names are per
    graph)."""

    def __init__(self, graph: "Graph", weights_inline_limit: int = 16, depth: int = 0,
                 const_names: set[str] | None = None):
        self.graph = graph
        self.limit = weights_inline_limit
        self.depth = depth
        self.indent = "  " * depth
        self.const_names: set[str] = set() if const_names is None else const_names
        self.names: dict[int, str] = {}  # id(value) -> printed reference (with the %)
        self.plain_names: dict[int, str] = {}  # id(value) -> name without % (inputs and constants)
        self._foreign = 0
        self._keep: list = []  # keeps named foreign values alive so their ids stay unique
        #: (id(node), attribute name) -> the printer of that subgraph attribute
        self.subs: dict[tuple[int, str], Printer] = {}
        self._name_values()
        self._name_bodies()

    # -- naming --------------------------------------------------------------------------------
    def _name_values(self) -> None:
        g = self.graph
        taken: set[str] = set()
        wanted: list[tuple[Value, str | None, str]] = []
        for v in g.inputs:
            wanted.append((v, _text(v.name) if v.name else None, "input"))
        for v in g.constants:
            wanted.append((v, _plain(v.name) if v.name else None, "const"))
        pending = []
        seen: set[int] = set()
        for v, name, kind in wanted:  # first come keeps its name
            if id(v) in seen:
                continue
            seen.add(id(v))
            if name is not None and name not in taken and not (kind == "const" and name in self.const_names):
                taken.add(name)
                if kind == "const":
                    self.const_names.add(name)
                self.plain_names[id(v)] = name
            else:
                pending.append((v, name, kind))
        first_use: dict[int, str] = {}
        if any(name is None and kind == "const" for _, name, kind in pending):
            for n in g.nodes:
                for i, x in enumerate(n.inputs):
                    if x is not None and id(x) not in first_use and n.op is not None:
                        spec = n.op.inputs[min(i, len(n.op.inputs) - 1)] if n.op.inputs else f"in{i}"
                        first_use[id(x)] = _plain(f"{n.op.name}.{spec.rstrip('?*')}")
        next_k: dict[str, int] = {}  # base -> the first suffix not yet tried (names are only ever taken)
        for v, name, kind in pending:
            if name is None:
                name = "input" if kind == "input" else first_use.get(id(v), "const")
            base, k, cand = name, next_k.get(name, 1), name
            while cand in taken or (kind == "const" and cand in self.const_names):
                cand, k = f"{base}_{k}", k + 1
            next_k[base] = k
            taken.add(cand)
            if kind == "const":
                self.const_names.add(cand)
            self.plain_names[id(v)] = cand
        for vid, name in self.plain_names.items():
            self.names[vid] = _value_ref(name)
        number = 0
        for n in g.nodes:
            for v in n.outputs:
                if id(v) not in self.names:
                    self.names[id(v)] = f"%{number}"
                    number += 1

    def _name_bodies(self) -> None:
        """Printers for the subgraph attributes, in print order (so constant names are chosen in the
        order they appear in the text)."""
        from .graph import Graph

        for n in self.graph.nodes:
            try:
                attrs = n.op.non_default_attributes()
            except Exception:  # noqa: BLE001 - never fail while printing a broken graph
                continue
            for k, v in attrs.items():
                if isinstance(v, Graph):
                    self.subs[(id(n), k)] = Printer(v, self.limit, self.depth + 1, self.const_names)

    def printers(self) -> list["Printer"]:
        """This printer and those of all nested subgraphs (depth first, in print order)."""
        out = [self]
        for sub in self.subs.values():
            out += sub.printers()
        return out

    def ref(self, v: "Value | None") -> str:
        if v is None:
            return "_"
        name = self.names.get(id(v))
        if name is None:
            self._foreign += 1
            name = "%" + quote(f"<outside graph #{self._foreign}>")
            self.names[id(v)] = name
            self._keep.append(v)
        return name

    # -- lines ---------------------------------------------------------------------------------
    def header(self) -> str:
        g = self.graph
        params = ", ".join(f"{self.ref(v)}: {format_type(v.type)}" for v in g.inputs)
        results = ", ".join(f"{_ident_or_quoted(name)}: {format_type(v.type)}"
                            for name, v in zip(self._output_names(), g.outputs))
        gname = _text(g.name)
        at = "@" + (gname if _BARE_VALUE.fullmatch(gname) else quote(gname))
        return f"graph {at}({params}) -> ({results}) {{"

    def _output_names(self) -> list[str]:
        names = list(self.graph.output_names)
        outs = self.graph.outputs
        return names[: len(outs)] + [f"output_{i}" for i in range(len(names), len(outs))]

    def inline(self, v: "Value") -> bool:
        return v.const is not None and np.asarray(v.const).size <= self.limit

    def const_line(self, v: "Value") -> str:
        line = f"{self.indent}  {self.ref(v)} = const {format_type(v.type)}"
        if v.const is None:
            return line + " dense<?>"  # malformed: a constant without data (the verifier says so)
        if self.inline(v):
            try:
                line += f" dense<{format_elements(v.const, v.type.dtype)}>"
            except Exception as e:  # noqa: BLE001 - never fail while printing a broken graph
                line += f" dense<? {type(e).__name__}>"
        return line

    def node_line(self, node: "Node") -> str:
        op = node.op
        opname = f"{op.domain}.{op.name}" if getattr(op, "domain", "") else getattr(op, "name", repr(op))
        args = ", ".join(self.ref(v) for v in node.inputs)
        s = f"{opname}({args})"
        try:
            attrs = op.non_default_attributes()
        except Exception:  # noqa: BLE001
            attrs = {}
        if attrs:
            s += " {" + ", ".join(f"{k}={self._attr(node, k, v)}" for k, v in attrs.items()) + "}"
        if node.outputs:
            s = ", ".join(self.ref(v) for v in node.outputs) + " = " + s
            s += " : " + ", ".join(format_type(v.type) for v in node.outputs)
        if node.name:
            s += f" @{quote(str(node.name))}"
        if node.device:
            s += f" on {quote(str(node.device))}"
        return self.indent + "  " + s

    def _attr(self, node: "Node", key: str, v) -> str:
        sub = self.subs.get((id(node), key))
        if sub is not None and sub.graph is v:
            return "\n".join(sub.lines())  # a region: the body's lines, indented one level deeper
        return format_attr(v)

    def return_line(self) -> str:
        g = self.graph
        if not g.outputs:
            return f"{self.indent}  return"
        pairs = ", ".join(f"{_ident_or_quoted(name)}={self.ref(v)}"
                          for name, v in zip(self._output_names(), g.outputs))
        return f"{self.indent}  return {pairs}"

    def lines(self) -> list[str]:
        g = self.graph
        out = [self.header()]
        out += [self.const_line(c) for c in g.constants]
        out += [self.node_line(n) for n in g.nodes]
        out += [self.return_line(), self.indent + "}"]
        return out

    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"


def print_graph(graph: "Graph", weights_inline_limit: int = 16) -> str:
    """The text form of ``graph`` (constants with more than ``weights_inline_limit`` elements print
    only their type; get their data with ``external_weights``)."""
    return Printer(graph, weights_inline_limit).text()


def external_weights(graph: "Graph", weights_inline_limit: int = 16) -> dict[str, np.ndarray]:
    """The constants that ``print_graph`` does not print inline, by printed name (without the %):
    the ``weights`` to give ``parse`` with the text."""
    out: dict[str, np.ndarray] = {}
    for p in Printer(graph, weights_inline_limit).printers():  # also the constants of subgraphs
        out.update({p.plain_names[id(c)]: c.const for c in p.graph.constants
                    if c.const is not None and not p.inline(c) and id(c) in p.plain_names})
    return out


def sidecar_path(path) -> str:
    """Where ``save_text`` puts the large constants of ``path``: ``model.kir`` -> ``model.kir.npz``."""
    return os.fspath(path) + ".npz"


def _storable(arr: np.ndarray) -> np.ndarray:
    """An array that np.savez writes and np.load reads without pickle: strings as unicode, the
    ml_dtypes types (bfloat16, float8, int4...) as raw unsigned ints (their type is in the text)."""
    if arr.dtype == object:
        return np.array([x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in arr.ravel()],
                        dtype=str).reshape(arr.shape)
    if arr.dtype.kind == "V" or arr.dtype.type.__module__.startswith("ml_dtypes"):
        return np.ascontiguousarray(arr).view(np.dtype(f"u{arr.dtype.itemsize}"))
    return arr


def _write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """np.savez's format, written by hand: np.savez(**arrays) would refuse a constant named
    ``file`` or ``allow_pickle`` (its own parameter names)."""
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, arr in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)


def save_text(graph: "Graph", path, weights_inline_limit: int = 16) -> None:
    """Write ``graph`` as text to ``path`` (e.g. ``model.kir``) and its large constants to the
    sidecar ``model.kir.npz`` (by printed name); ``load_text(path)`` reads both back."""
    text = print_graph(graph, weights_inline_limit)
    weights = external_weights(graph, weights_inline_limit)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    side = sidecar_path(path)
    if weights:
        _write_npz(side, {k: _storable(v) for k, v in weights.items()})
    elif os.path.exists(side):
        os.remove(side)  # a stale sidecar from an earlier save would be read back with the new text
