"""String ops: StringConcat, StringSplit, StringNormalizer, RegexFullMatch.

A ``DType.string`` value is a NumPy object array of Python ``str``. These ops run only in the reference
interpreter (no code generation): their pattern is OPAQUE, except StringConcat's (BROADCAST).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import OpDef, OpError, Pattern, broadcast_shapes, check_dtype
from .common import check_flags, text

_STRING = frozenset({DType.string})


def _strings(items, shape) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape)


@dataclass(frozen=True, eq=False)
class StringConcat(OpDef):
    """Z = X + Y elementwise, with NumPy broadcasting."""

    inputs: ClassVar = ("X", "Y")
    outputs: ClassVar = ("Z",)
    pattern: ClassVar = Pattern.BROADCAST
    since: ClassVar = 20

    def infer(self, ins):
        x, y = ins
        check_dtype(self, x, _STRING, "X")
        check_dtype(self, y, _STRING, "Y")
        try:
            shape = broadcast_shapes(x.shape, y.shape)
        except OpError as e:
            raise self.fail(f"shapes {x.type} and {y.type} do not broadcast: {e}") from None
        return [TensorType(DType.string, shape)]

    def compute(self, x, y):
        xs, ys = np.broadcast_arrays(x, y)
        return [_strings([text(a) + text(b) for a, b in zip(xs.ravel(), ys.ravel())], xs.shape)]


@dataclass(frozen=True, eq=False)
class StringSplit(OpDef):
    """Split each string on ``delimiter`` (at most ``maxsplit`` times); Y gets one more axis, padded with
    "" to the largest number of pieces, Z the number of pieces of each string ("" has none). Without a
    delimiter (or with ""), runs of whitespace separate and leading/trailing whitespace is dropped."""

    delimiter: str = ""
    maxsplit: int | None = None
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y", "Z")
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 20

    def validate(self):
        if self.maxsplit is not None and self.maxsplit < 0:
            raise self.fail(f"maxsplit must be >= 0 (or absent), got {self.maxsplit}")

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, _STRING, "X")
        # the number of pieces is data-dependent; known when the input is
        width = None
        if x.known is not None:
            width = int(self.compute(x.known)[1].max(initial=0)) if x.known.size else 0
        elif x.type.numel == 0:
            width = 0
        return [TensorType(DType.string, x.shape + (width,)), TensorType(DType.i64, x.shape)]

    def _split(self, s: str) -> list[str]:
        if not s:
            return []  # an empty string has no pieces (as ONNX Runtime)
        n = -1 if self.maxsplit is None else self.maxsplit
        if self.delimiter:
            return s.split(self.delimiter, n)
        pieces = s.split(None, n)
        if pieces:  # the unsplit remainder loses its trailing whitespace too
            pieces[-1] = pieces[-1].rstrip()
        return pieces

    def compute(self, x):
        pieces = [self._split(text(s)) for s in x.ravel()]
        width = max((len(p) for p in pieces), default=0)
        padded = [p + [""] * (width - len(p)) for p in pieces]
        flat = [s for p in padded for s in p]
        return [_strings(flat, x.shape + (width,)), np.array([len(p) for p in pieces], np.int64).reshape(x.shape)]


@dataclass(frozen=True, eq=False)
class StringNormalizer(OpDef):
    """Drop the ``stopwords`` (case-insensitively unless ``is_case_sensitive``) from a [C] or [1, C]
    input, then change case (``case_change_action`` LOWER/UPPER/NONE). An all-dropped result is one
    "" ([1] or [1, 1]). Case changes are Unicode-aware and locale-independent (``locale`` is accepted
    when it names an English or C locale, or is empty)."""

    case_change_action: str = "NONE"
    is_case_sensitive: int = 0
    locale: str = ""
    stopwords: tuple[str, ...] = ()
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 10

    def validate(self):
        if self.case_change_action not in ("LOWER", "UPPER", "NONE"):
            raise self.fail(f"case_change_action must be LOWER, UPPER or NONE, got {self.case_change_action!r}")
        check_flags(self, "is_case_sensitive")
        loc = self.locale.split(".")[0].replace("-", "_").lower()
        if loc not in ("", "c", "posix") and not loc.startswith("en"):
            raise self.fail(f"locale {self.locale!r} is not supported (Kiln changes case the same way in "
                            "every locale; use an en_* or C locale)")

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, _STRING, "X")
        if x.type.rank not in (1, 2) or (x.type.rank == 2 and isinstance(x.shape[0], int) and x.shape[0] != 1):
            raise self.fail(f"X must be [C] or [1, C], got {x.type}")
        c = x.shape[-1]
        if x.known is not None:
            n = self.compute(x.known)[0].shape[-1]
        elif not self.stopwords and isinstance(c, int):
            n = max(c, 1)
        else:  # how many words are stop words is data-dependent
            n = None
        return [TensorType(DType.string, x.shape[:-1] + (n,))]

    def compute(self, x):
        if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
            raise ValueError(f"StringNormalizer takes a [C] or [1, C] input, got shape {list(x.shape)}")
        words = [text(s) for s in x.reshape(-1)]
        if self.is_case_sensitive:
            stop = set(self.stopwords)
            kept = [w for w in words if w not in stop]
        else:
            stop = {s.casefold() for s in self.stopwords}
            kept = [w for w in words if w.casefold() not in stop]
        if self.case_change_action == "LOWER":
            kept = [w.lower() for w in kept]
        elif self.case_change_action == "UPPER":
            kept = [w.upper() for w in kept]
        if not kept:
            kept = [""]
        return [_strings(kept, x.shape[:-1] + (len(kept),))]


# ---------------------------------------------------------------------------------------------
# RegexFullMatch: RE2 syntax on Python's re
# ---------------------------------------------------------------------------------------------

_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f",
}


def re2_to_python(pattern: str) -> str:
    """Translate an RE2 pattern to an equivalent Python ``re`` pattern (compiled with re.ASCII, as RE2's
    \\w \\d \\s \\b are ASCII). Raises ValueError for RE2 features Python lacks (\\p{..} classes,
    \\C, ungreedy (?U)) and for Python-only features RE2 rejects (backreferences, lookaround)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise ValueError("trailing backslash")
            e = pattern[i + 1]
            if e == "Q":  # \Q...\E: a literal
                end = pattern.find("\\E", i + 2)
                lit = pattern[i + 2:] if end < 0 else pattern[i + 2:end]
                out.append("".join("\\" + ch if not ch.isalnum() else ch for ch in lit))
                i = n if end < 0 else end + 2
                continue
            if e in "pP":
                raise ValueError(f"Unicode classes (\\{e}..) are not supported")
            if e == "C":
                raise ValueError("\\C (any byte) is not supported")
            if e.isdigit() and e != "0":
                raise ValueError(f"\\{e}: backreferences are not RE2 syntax (octal escapes: \\0nn)")
            if e == "z":
                out.append("\\Z")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "[" and pattern.startswith("[:", i):
                end = pattern.find(":]", i + 2)
                name = pattern[i + 2:end] if end > 0 else ""
                negate = name.startswith("^")
                key = name[1:] if negate else name
                if end < 0 or key not in _POSIX_CLASSES:
                    raise ValueError(f"unknown POSIX class {pattern[i:end + 2]!r}")
                if negate:
                    raise ValueError("negated POSIX classes ([:^name:]) are not supported")
                out.append(_POSIX_CLASSES[key])
                i = end + 2
                continue
            if c == "]" and not (out and out[-1] in ("[", "[^")):
                in_class = False
            elif c == "[":
                c = "\\["  # a literal '[' inside a class (Python warns about nested sets)
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
            else:
                out.append("[")
                i += 1
            if i < n and pattern[i] == "]":  # a leading ']' is a literal
                out.append("\\]")
                i += 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            rest = pattern[i + 2:i + 4]
            if rest[:1] in ("=", "!") or rest in ("<=", "<!"):
                raise ValueError("lookaround assertions are not RE2 syntax")
            flags = re.match(r"\(\?([a-zA-Z-]*)[:)]", pattern[i:])
            if flags and "U" in flags.group(1):
                raise ValueError("the ungreedy flag (?U) is not supported")
            if rest[:1] == "<":  # (?<name>...): Python spells it (?P<name>...)
                out.append("(?P")
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True, eq=False)
class RegexFullMatch(OpDef):
    """Y = whether each string fully matches ``regex`` (RE2 syntax; see ``re2_to_python``).

    ONNX names the attribute ``pattern``, which is OpDef's fusion-pattern class attribute: the IR
    field is ``regex`` (``onnx_attr_names`` maps it for the importer and exporter).
    """

    regex: str | None = None
    onnx_attr_names: ClassVar = {"regex": "pattern"}
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 20

    def validate(self):
        if self.regex is None:  # (ONNX Runtime and ONNX's reference refuse a node without its pattern)
            raise self.fail("the pattern attribute is required")
        self.compiled()

    def compiled(self) -> re.Pattern:
        try:
            return re.compile(re2_to_python(self.regex), re.ASCII)
        except (ValueError, re.error) as e:
            raise self.fail(f"regex {self.regex!r} is not supported: {e}") from None

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, _STRING, "X")
        return [x.type.with_dtype(DType.bool)]

    def compute(self, x):
        rx = self.compiled()
        flat = [rx.fullmatch(text(s)) is not None for s in x.ravel()]
        return [np.array(flat, dtype=np.bool_).reshape(x.shape)]


OPS = (StringConcat, StringSplit, StringNormalizer, RegexFullMatch)
