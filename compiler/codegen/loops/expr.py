"""Scalar expressions of the loop form: typed trees over loop indices, bound names and loads.

An expression is one of

    Const(value, dtype)         a number (or bool)
    Var(name, dtype)            a loop index (i64), a ``Let``-bound value, an accumulator
    Load(buf, index)            one element of a buffer: ``index`` holds one i64 expression per axis
    Op(prim, args, dtype)       a primitive (``PRIMS``) applied to expressions

Expressions are immutable and typed at construction: ``op("add", a, b)`` checks that ``a`` and
``b`` have one element type and gives the result's. The primitives are few and each has one meaning
on every backend (written down in ``PRIMS``); an ONNX op's scalar semantics are built from them once,
in ``scalar.py``. Arithmetic on float16/bfloat16 is not a primitive: values of those types are
converted to float32 to compute (``scalar.py`` rounds after each op, as the reference does).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ...ir.types import DType

Number = Union[int, float, bool]

#: the types arithmetic is done in (narrow floats are converted to f32 first)
COMPUTE_TYPES = frozenset({DType.f32, DType.f64, DType.i8, DType.i16, DType.i32, DType.i64, DType.u8, DType.u16,
                           DType.u32, DType.u64, DType.bool})
#: the 4- and 2-bit integers (a byte each, as ml_dtypes stores them: the value's low bits) -> (their
#: compute type, bits); loads sign- or zero-extend the bits, stores keep them
NARROW_INTS = {DType.i4: (DType.i8, 4), DType.u4: (DType.u8, 4), DType.i2: (DType.i8, 2), DType.u2: (DType.u8, 2)}


@dataclass(frozen=True)
class SmallFloat:
    """A float 8 or float 4 layout: in the low ``width`` bits of a byte, sign, exponent, ``man``
    mantissa bits, exponent ``bias``. ``fnuz``: no negative zero and no infinities, 0x80 is the NaN;
    else E4M3FN (0x7F/0xFF are NaN, no infinities), E5M2 (IEEE's infinities and NaNs: the high byte of
    a float16) or E2M1 (no NaN, no infinities). ``max_code``: the largest finite magnitude;
    ``nan_code``: what a store writes for NaN (with the value's sign, except FNUZ), as ml_dtypes
    (E2M1: a zero of the opposite sign)."""

    man: int
    bias: int
    fnuz: bool
    max_code: int
    nan_code: int
    width: int = 8

    @property
    def max(self) -> float:
        e, m = self.max_code >> self.man, self.max_code & ((1 << self.man) - 1)
        return (1 + m / (1 << self.man)) * 2.0 ** (e - self.bias)

    @property
    def has_inf(self) -> bool:
        return not self.fnuz and self.width == 8 and self.max_code == 0x7B

    def overflows(self, magnitude: Expr) -> Expr:
        """Whether ``magnitude`` (>= 0, f32) rounds (to nearest even) beyond ``max``: past the midpoint
        to the next power of the grid, or onto it when max's last mantissa bit is odd."""
        e = self.max_code >> self.man
        mid = self.max + 2.0 ** (e - self.bias - self.man) / 2
        return op("ge" if self.max_code & 1 else "gt", magnitude, Const(mid, magnitude.dtype))


#: the float 8 and float 4 types of ONNX: stored as their byte, computed in f32 (loads widen exactly,
#: stores round to nearest even, saturating finite values to +-max; infinities stay infinite in E5M2,
#: become +-max in the others: ``scalar._cast`` gives Cast's ``saturate`` semantics on top)
SMALL_FLOATS = {
    DType.f8e4m3fn: SmallFloat(3, 7, False, 0x7E, 0x7F), DType.f8e4m3fnuz: SmallFloat(3, 8, True, 0x7F, 0x80),
    DType.f8e5m2: SmallFloat(2, 15, False, 0x7B, 0x7E), DType.f8e5m2fnuz: SmallFloat(2, 16, True, 0x7F, 0x80),
    DType.f4e2m1: SmallFloat(1, 1, False, 0x7, 0x8, width=4)}
#: the types a buffer may hold (loads and stores convert f16, bf16 and the float 8/4 types to and from
#: f32, and the narrow integers to and from 8 bits)
STORAGE_TYPES = COMPUTE_TYPES | {DType.f16, DType.bf16} | set(NARROW_INTS) | set(SMALL_FLOATS)
INDEX = DType.i64


def compute_type(dt: DType) -> DType:
    """The type a buffer's elements are computed in: f32 for f16, bf16, float 8/4 (loads widen,
    stores round to nearest even), i8/u8 for the 4- and 2-bit integers, else the type itself."""
    if dt in NARROW_INTS:
        return NARROW_INTS[dt][0]
    return DType.f32 if dt in (DType.f16, DType.bf16) or dt in SMALL_FLOATS else dt


class FormError(Exception):
    """An ill-typed expression or an ill-formed kernel (a bug in a lowering, not in the model)."""


# -- the primitives ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prim:
    """A primitive: its arity, the operand types it takes and how its result type follows.

    ``kind``: "same" (operands of one type, result that type), "cmp" (operands of one type, result
    bool), "test" (one float operand, result bool), "select" (bool, a, b -> a's type), "cast"
    (result: the type given)."""

    name: str
    arity: int
    takes: str           # "any", "num" (not bool), "float", "int" (integers), "intbool", "signed"
    kind: str = "same"
    doc: str = ""


def _prims(*ps: Prim) -> dict[str, Prim]:
    return {p.name: p for p in ps}


#: every primitive, with its meaning on every backend
PRIMS: dict[str, Prim] = _prims(
    Prim("add", 2, "num"), Prim("sub", 2, "num"), Prim("mul", 2, "num"),
    Prim("div", 2, "num", doc="float: IEEE division; integer: truncated toward zero, 0 when dividing by 0 "
                              "(and the wrapped result for MIN / -1)"),
    Prim("rem", 2, "num", doc="the remainder of ``div`` (sign of the dividend; C's fmod for floats), 0 for "
                              "integer division by 0"),
    Prim("min", 2, "num", doc="the smaller; NaN if either is NaN (NumPy's minimum)"),
    Prim("max", 2, "num", doc="the larger; NaN if either is NaN (NumPy's maximum)"),
    Prim("neg", 1, "num", doc="negation (integers wrap)"),
    Prim("abs", 1, "num", doc="absolute value (integers wrap at MIN)"),
    Prim("fma", 3, "float", doc="a * b + c, rounded once where the target has it, else twice"),
    Prim("lt", 2, "any", "cmp"), Prim("le", 2, "any", "cmp"), Prim("gt", 2, "any", "cmp"),
    Prim("ge", 2, "any", "cmp"), Prim("eq", 2, "any", "cmp"),
    Prim("ne", 2, "any", "cmp", doc="true for NaN operands (IEEE unordered)"),
    Prim("and", 2, "intbool"), Prim("or", 2, "intbool"), Prim("xor", 2, "intbool"),
    Prim("not", 1, "intbool", doc="logical not for bool, bitwise not for integers"),
    Prim("shl", 2, "int", doc="shift left; the amount must be below the width (else undefined)"),
    Prim("shr", 2, "int", doc="shift right (arithmetic for signed types); amount below the width"),
    Prim("select", 3, "any", "select", doc="select(c, a, b): a where c holds, else b"),
    Prim("cast", 1, "any", "cast", doc="conversion: float to integer truncates toward zero (NaN and out of range: "
                                       "the x86 'integer indefinite', MIN of i32/i64, narrow types through i32), "
                                       "to bool is != 0 (NaN is true), bool to number is 0/1, integers wrap"),
    Prim("isnan", 1, "float", "test"), Prim("isinf", 1, "float", "test", doc="+-infinity"),
    # math functions (floats): every backend computes them to about one ulp of float32
    *(Prim(n, 1, "float") for n in ("sqrt", "exp", "expm1", "log", "log1p", "tanh", "erf", "sigmoid", "softplus",
                                    "floor", "ceil", "round", "trunc", "sin", "cos", "tan", "asin", "acos", "atan",
                                    "sinh", "cosh", "asinh", "acosh", "atanh")),
    Prim("gelu", 1, "float", doc="x/2 (1 + erf(x / sqrt 2)), accurate on the negative tail"),
    Prim("xsigmoid", 2, "float", doc="xsigmoid(x, t) = x / (1 + e^-t), without underflow on the negative tail"),
    Prim("pow", 2, "float", doc="x ** y as C's pow"),
    Prim("to_f16", 1, "float", doc="the float16 value nearest x (ties to even; overflow to infinity), as x's type"),
    Prim("to_bf16", 1, "float", doc="the bfloat16 value nearest x (ties to even), as x's type"),
    Prim("odd_f32", 1, "float", doc="x rounded to float32 toward odd (exact values stay, else the neighbour "
                                    "whose last bit is 1), as x's type: a later rounding to a narrower float "
                                    "(f16, bf16, float 8) is then the one correct rounding of x"),
)


def _takes(prim: Prim, dt: DType) -> bool:
    t = prim.takes
    if t == "any":
        return True
    if t == "num":
        return dt is not DType.bool
    if t == "float":
        return dt.is_float
    if t == "int":
        return dt.is_int
    if t == "intbool":
        return dt.is_int or dt is DType.bool
    raise AssertionError(t)


# -- expressions ------------------------------------------------------------------------------------
class Expr:
    """The base of expressions; ``dtype`` is the element type of the value."""

    dtype: DType
    __slots__ = ()

    # operators for writing lowerings and tests: e.g. ``i * 4 + j``
    def __add__(self, o): return op("add", self, lift(o, self.dtype))
    def __radd__(self, o): return op("add", lift(o, self.dtype), self)
    def __sub__(self, o): return op("sub", self, lift(o, self.dtype))
    def __rsub__(self, o): return op("sub", lift(o, self.dtype), self)
    def __mul__(self, o): return op("mul", self, lift(o, self.dtype))
    def __rmul__(self, o): return op("mul", lift(o, self.dtype), self)
    def __neg__(self): return op("neg", self)


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: Number
    dtype: DType

    def __post_init__(self):
        if self.dtype not in COMPUTE_TYPES:
            raise FormError(f"a constant of type {self.dtype}: compute types are {_names(COMPUTE_TYPES)}")
        v = self.value
        if self.dtype is DType.bool:
            object.__setattr__(self, "value", bool(v))
        elif self.dtype.is_int:
            lo, hi = _int_range(self.dtype)
            if not lo <= int(v) <= hi:
                raise FormError(f"{int(v)} does not fit {self.dtype}")
            object.__setattr__(self, "value", int(v))
        else:
            object.__setattr__(self, "value", float(v))


@dataclass(frozen=True, eq=False)
class Var(Expr):
    name: str
    dtype: DType = INDEX

    def __post_init__(self):
        if self.dtype not in COMPUTE_TYPES:
            raise FormError(f"variable {self.name} of type {self.dtype}: compute types are {_names(COMPUTE_TYPES)}")


@dataclass(frozen=True, eq=False)
class Load(Expr):
    buf: "object"            # a form.Buffer (typed loosely to keep this module free of form.py)
    index: tuple[Expr, ...]

    def __post_init__(self):
        if len(self.index) != len(self.buf.shape):
            raise FormError(f"load of {self.buf.name} with {len(self.index)} indices; it has "
                            f"{len(self.buf.shape)} axes")
        for e in self.index:
            if e.dtype is not INDEX:
                raise FormError(f"index into {self.buf.name} of type {e.dtype}, not i64")

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return compute_type(self.buf.dtype)


@dataclass(frozen=True, eq=False)
class Op(Expr):
    prim: str
    args: tuple[Expr, ...]
    dtype: DType


def _names(types) -> str:
    return ", ".join(sorted(t.short for t in types))


def _int_range(dt: DType) -> tuple[int, int]:
    import numpy as np

    info = np.iinfo(dt.np)
    return int(info.min), int(info.max)


def lift(x, dtype: DType) -> Expr:
    """``x`` as an expression: expressions as they are, numbers as constants of ``dtype``."""
    return x if isinstance(x, Expr) else Const(x, dtype)


def const(value: Number, dtype: DType) -> Const:
    return Const(value, dtype)


def op(name: str, *args, to: DType | None = None) -> Expr:
    """The primitive ``name`` applied to ``args`` (typed; numbers take the type of the first
    expression among the operands). ``to``: the result type of a cast."""
    prim = PRIMS.get(name)
    if prim is None:
        raise FormError(f"unknown primitive {name!r}; the primitives are {', '.join(PRIMS)}")
    if len(args) != prim.arity:
        raise FormError(f"{name} takes {prim.arity} operands, got {len(args)}")
    first = next((a for a in args[1:] if isinstance(a, Expr)) if prim.kind == "select" else
                 (a for a in args if isinstance(a, Expr)), None)
    if first is None:
        raise FormError(f"{name}: no operand is an expression (give constants a type with const())")
    if prim.kind == "select":
        c = lift(args[0], DType.bool)
        a, b = lift(args[1], first.dtype), lift(args[2], first.dtype)
        if c.dtype is not DType.bool:
            raise FormError(f"select: the condition is {c.dtype}, not bool")
        if a.dtype is not b.dtype:
            raise FormError(f"select: the arms are {a.dtype} and {b.dtype}")
        return Op(name, (c, a, b), a.dtype)
    xs = tuple(lift(a, first.dtype) for a in args)
    if prim.kind == "cast":
        if to is None or to not in COMPUTE_TYPES:
            raise FormError(f"cast to {to}: compute types are {_names(COMPUTE_TYPES)}")
        return xs[0] if xs[0].dtype is to else Op(name, xs, to)
    dt = xs[0].dtype
    if any(x.dtype is not dt for x in xs):
        raise FormError(f"{name}: operands of types {', '.join(str(x.dtype) for x in xs)}; one type is needed")
    if not _takes(prim, dt):
        raise FormError(f"{name} does not take {dt} operands ({prim.takes})")
    return Op(name, xs, DType.bool if prim.kind in ("cmp", "test") else dt)


def cast(x: Expr, to: DType) -> Expr:
    return op("cast", x, to=to)


def select(c: Expr, a, b) -> Expr:
    return op("select", c, a, b)


def walk(e: Expr):
    """Every sub-expression of ``e`` (``e`` first), each once."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        if isinstance(x, Op):
            stack.extend(reversed(x.args))
        elif isinstance(x, Load):
            stack.extend(reversed(x.index))
