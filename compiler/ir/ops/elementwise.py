"""Elementwise and broadcasting ops: unary math, activations, binary arithmetic, comparisons, logic."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from ..graph import Value
from ..types import DType, TensorType
from .base import (ANY, FLOATS, NUMERIC, STD_FLOATS, STD_INTS, STD_NUMERIC, Cost, OpDef, Pattern,
                   broadcast_shapes, check_dtype, same_dtype)
from .common import check_flags, text

_NARROW = {DType.f16, DType.bf16} | {d for d in FLOATS if d.itemsize == 1}


def _float_op(fn, x: np.ndarray, *rest) -> np.ndarray:
    """Apply fn computing narrow floats in f32 (as hardware does), returning x's dtype."""
    if x.dtype.itemsize <= 2 and x.dtype.kind not in "iub":
        out = fn(x.astype(np.float32), *[r.astype(np.float32) if isinstance(r, np.ndarray) else r for r in rest])
    else:
        out = fn(x, *rest)
    return np.asarray(out).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# Unary
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Unary(OpDef):
    """y = fn(x), same type as x."""

    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.ELEMWISE
    dtypes: ClassVar[frozenset] = STD_FLOATS
    #: FLOPs per element (for cost)
    flops: ClassVar[int] = 1

    def fn(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, self.dtypes)
        return [x.type]

    def compute(self, x):
        return [_float_op(self.fn, x) if x.dtype.kind == "f" or x.dtype.itemsize <= 2 and x.dtype.kind not in "iub"
                else np.asarray(self.fn(x)).astype(x.dtype, copy=False)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(self.flops * (outs[0].numel or 0), base.bytes)


def _unary(name: str, fn, dtypes=STD_FLOATS, flops: int = 1, doc: str = ""):
    """Define a parameterless unary op class."""
    cls = dataclass(frozen=True, eq=False)(type(name, (Unary,), {
        "__doc__": doc or f"Elementwise {name}.", "fn": lambda self, x: fn(x), "dtypes": dtypes,
        "flops": flops, "__module__": __name__, "__qualname__": name}))
    return cls


_SIGNED_NUMERIC = STD_FLOATS | {DType.i8, DType.i16, DType.i32, DType.i64}

Abs = _unary("Abs", np.abs, STD_NUMERIC)
Neg = _unary("Neg", np.negative, _SIGNED_NUMERIC)
Sign = _unary("Sign", np.sign, STD_NUMERIC)
Ceil = _unary("Ceil", np.ceil)
Floor = _unary("Floor", np.floor)
Round = _unary("Round", np.round, doc="Round half to even.")
Reciprocal = _unary("Reciprocal", np.reciprocal)
Sqrt = _unary("Sqrt", np.sqrt, flops=4)
Exp = _unary("Exp", np.exp, flops=8)
Log = _unary("Log", np.log, flops=8)
Sin = _unary("Sin", np.sin, flops=8)
Cos = _unary("Cos", np.cos, flops=8)
Tan = _unary("Tan", np.tan, flops=8)
Asin = _unary("Asin", np.arcsin, flops=8)
Acos = _unary("Acos", np.arccos, flops=8)
Atan = _unary("Atan", np.arctan, flops=8)
Sinh = _unary("Sinh", np.sinh, flops=8)
Cosh = _unary("Cosh", np.cosh, flops=8)
Tanh = _unary("Tanh", np.tanh, flops=8)
Asinh = _unary("Asinh", np.arcsinh, flops=8)
Acosh = _unary("Acosh", np.arccosh, flops=8)
Atanh = _unary("Atanh", np.arctanh, flops=8)
Relu = _unary("Relu", lambda x: np.maximum(x, x.dtype.type(0)), _SIGNED_NUMERIC)
Sigmoid = _unary("Sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), flops=10)
Softsign = _unary("Softsign", lambda x: x / (1 + np.abs(x)), flops=3)
Softplus = _unary("Softplus", lambda x: np.logaddexp(0, x), flops=10)
Mish = _unary("Mish", lambda x: x * np.tanh(np.logaddexp(0, x)), flops=20)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to within float32 precision (Abramowitz–Stegun 7.1.26 is not enough; use math.erf)."""
    import math

    flat = np.asarray(x, dtype=np.float64).ravel()
    return np.fromiter((math.erf(v) for v in flat), dtype=np.float64, count=flat.size).reshape(np.shape(x))


Erf = _unary("Erf", _erf, STD_NUMERIC, flops=20)


@dataclass(frozen=True, eq=False)
class Not(Unary):
    dtypes: ClassVar = frozenset({DType.bool})

    def fn(self, x):
        return np.logical_not(x)


@dataclass(frozen=True, eq=False)
class BitwiseNot(Unary):
    dtypes: ClassVar = STD_INTS

    def fn(self, x):
        return np.invert(x)


@dataclass(frozen=True, eq=False)
class IsNaN(Unary):
    dtypes: ClassVar = FLOATS

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, self.dtypes)
        return [x.type.with_dtype(DType.bool)]

    def compute(self, x):
        return [np.isnan(x.astype(np.float32) if x.dtype.itemsize < 4 else x)]


@dataclass(frozen=True, eq=False)
class IsInf(Unary):
    detect_negative: int = 1
    detect_positive: int = 1
    dtypes: ClassVar = FLOATS

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, self.dtypes)
        return [x.type.with_dtype(DType.bool)]

    def compute(self, x):
        x = x.astype(np.float32) if x.dtype.itemsize < 4 else x
        neg = np.isneginf(x) if self.detect_negative else np.zeros(x.shape, bool)
        pos = np.isposinf(x) if self.detect_positive else np.zeros(x.shape, bool)
        return [neg | pos]


# -- activations with attributes ----------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class LeakyRelu(Unary):
    alpha: float = 0.01

    def fn(self, x):
        return np.where(x < 0, x * self.alpha, x)


@dataclass(frozen=True, eq=False)
class Elu(Unary):
    alpha: float = 1.0

    def fn(self, x):
        return np.where(x < 0, self.alpha * (np.exp(np.minimum(x, 0)) - 1), x)


@dataclass(frozen=True, eq=False)
class Celu(Unary):
    alpha: float = 1.0

    def fn(self, x):
        return np.maximum(0, x) + np.minimum(0, self.alpha * (np.exp(x / self.alpha) - 1))


@dataclass(frozen=True, eq=False)
class Selu(Unary):
    alpha: float = 1.67326319217681884765625
    gamma: float = 1.05070102214813232421875

    def fn(self, x):
        return self.gamma * np.where(x <= 0, self.alpha * (np.exp(np.minimum(x, 0)) - 1), x)


@dataclass(frozen=True, eq=False)
class ThresholdedRelu(Unary):
    alpha: float = 1.0

    def fn(self, x):
        return np.where(x > self.alpha, x, 0)


@dataclass(frozen=True, eq=False)
class HardSigmoid(Unary):
    alpha: float = 0.2
    beta: float = 0.5

    def fn(self, x):
        return np.clip(self.alpha * x + self.beta, 0, 1)


@dataclass(frozen=True, eq=False)
class HardSwish(Unary):
    def fn(self, x):
        return x * np.clip(x / 6 + 0.5, 0, 1)


@dataclass(frozen=True, eq=False)
class Shrink(Unary):
    bias: float = 0.0
    lambd: float = 0.5
    dtypes: ClassVar = STD_NUMERIC

    def fn(self, x):
        return np.where(x < -self.lambd, x + self.bias, np.where(x > self.lambd, x - self.bias, 0))


@dataclass(frozen=True, eq=False)
class Gelu(Unary):
    approximate: str = "none"
    flops: ClassVar = 20

    def validate(self):
        if self.approximate not in ("none", "tanh"):
            raise self.fail(f"approximate must be 'none' or 'tanh', got {self.approximate!r}")

    def fn(self, x):
        if self.approximate == "tanh":
            return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        return 0.5 * x * (1 + _erf(x / np.sqrt(2.0)))


@dataclass(frozen=True, eq=False)
class Swish(Unary):
    alpha: float = 1.0
    flops: ClassVar = 10

    def fn(self, x):
        return x / (1.0 + np.exp(-self.alpha * x))


# ---------------------------------------------------------------------------------------------
# Binary, broadcasting
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Binary(OpDef):
    """z = fn(a, b) with NumPy broadcasting; both inputs of one element type."""

    inputs: ClassVar = ("A", "B")
    outputs: ClassVar = ("C",)
    pattern: ClassVar = Pattern.BROADCAST
    dtypes: ClassVar[frozenset] = STD_NUMERIC
    result_dtype: ClassVar[DType | None] = None  # None: the inputs' type

    def fn(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def infer(self, ins):
        a, b = ins
        dt = same_dtype(self, ins, self.dtypes)
        try:
            shape = broadcast_shapes(a.shape, b.shape)
        except ValueError as e:
            raise self.fail(f"shapes {a.type} and {b.type}: {e}") from None
        return [TensorType(self.result_dtype or dt, shape)]

    def compute(self, a, b):
        out_dt = self.result_dtype.np if self.result_dtype else a.dtype
        if a.dtype.kind not in "iubO" and a.dtype.itemsize <= 2:
            r = self.fn(a.astype(np.float32), b.astype(np.float32))
        else:
            with np.errstate(all="ignore"):
                r = self.fn(a, b)
        return [np.asarray(r).astype(out_dt, copy=False)]


def _binary(name: str, fn, dtypes=STD_NUMERIC, result=None, doc: str = ""):
    return dataclass(frozen=True, eq=False)(type(name, (Binary,), {
        "__doc__": doc or f"Elementwise {name} with broadcasting.", "fn": lambda self, a, b: fn(a, b),
        "dtypes": dtypes, "result_dtype": result, "__module__": __name__, "__qualname__": name}))


def _div(a, b):
    if a.dtype.kind in "iu":
        q = np.zeros(np.broadcast_shapes(a.shape, b.shape), a.dtype)
        nz = np.broadcast_to(b != 0, q.shape)
        aa, bb = np.broadcast_arrays(a, b)
        q[nz] = np.trunc(aa[nz].astype(np.float64) / bb[nz]).astype(a.dtype) if a.dtype.kind == "i" \
            else aa[nz] // bb[nz]
        return q
    return a / b


Add = _binary("Add", np.add)
Sub = _binary("Sub", np.subtract)
Mul = _binary("Mul", np.multiply)
Div = _binary("Div", _div, doc="Division; integer division truncates toward zero.")
And = _binary("And", np.logical_and, frozenset({DType.bool}))
Or = _binary("Or", np.logical_or, frozenset({DType.bool}))
Xor = _binary("Xor", np.logical_xor, frozenset({DType.bool}))
BitwiseAnd = _binary("BitwiseAnd", np.bitwise_and, STD_INTS)
BitwiseOr = _binary("BitwiseOr", np.bitwise_or, STD_INTS)
BitwiseXor = _binary("BitwiseXor", np.bitwise_xor, STD_INTS)
Equal = _binary("Equal", np.equal, ANY, DType.bool)
Less = _binary("Less", np.less, STD_NUMERIC, DType.bool)
LessOrEqual = _binary("LessOrEqual", np.less_equal, STD_NUMERIC, DType.bool)
Greater = _binary("Greater", np.greater, STD_NUMERIC, DType.bool)
GreaterOrEqual = _binary("GreaterOrEqual", np.greater_equal, STD_NUMERIC, DType.bool)


@dataclass(frozen=True, eq=False)
class PRelu(Binary):
    """x if x >= 0 else slope * x, slope broadcast to x."""

    inputs: ClassVar = ("X", "slope")
    dtypes: ClassVar = STD_FLOATS | {DType.i32, DType.i64, DType.u32, DType.u64}

    def fn(self, x, slope):
        return np.where(x < 0, x * slope, x)


@dataclass(frozen=True, eq=False)
class Pow(Binary):
    """x ** y; the exponent may have another numeric type; the result has x's type."""

    inputs: ClassVar = ("X", "Y")

    def infer(self, ins):
        x, y = ins
        check_dtype(self, x, STD_NUMERIC, "base")
        check_dtype(self, y, STD_NUMERIC, "exponent")
        return [TensorType(x.dtype, broadcast_shapes(x.shape, y.shape))]

    def compute(self, x, y):
        if x.dtype.kind in "iu":
            r = np.power(x.astype(np.float64), y.astype(np.float64))
        else:
            r = np.power(x.astype(np.float64 if x.dtype == np.float64 else np.float32), y)
        return [np.asarray(r).astype(x.dtype)]


@dataclass(frozen=True, eq=False)
class Mod(Binary):
    """Remainder with the sign of the divisor (fmod=0, Python's %) or of the dividend (fmod=1, C's fmod)."""

    fmod: int = 0

    def validate(self):
        check_flags(self, "fmod")

    def fn(self, a, b):
        return np.fmod(a, b) if self.fmod else np.mod(a, b)


@dataclass(frozen=True, eq=False)
class BitShift(Binary):
    """Shift X by Y bits (opset 28: signed types too).

    RIGHT on a signed type is arithmetic (sign-extending); LEFT discards the bits shifted out, sign bit
    included. A shift by a negative amount or by the bit width or more gives what the sign extension
    alone gives: -1 for RIGHT of a negative X, 0 otherwise.
    """

    direction: str = "LEFT"
    inputs: ClassVar = ("X", "Y")
    outputs: ClassVar = ("Z",)
    dtypes: ClassVar = STD_INTS
    since: ClassVar = 28

    def validate(self):
        if self.direction not in ("LEFT", "RIGHT"):
            raise self.fail(f"direction must be LEFT or RIGHT, got {self.direction!r}")

    def fn(self, a, b):
        bits = a.dtype.itemsize * 8
        ok = (b >= 0) & (b < bits)
        s = np.where(ok, b, 0).astype(a.dtype)
        if self.direction == "LEFT":
            # shift the unsigned view: bits past the top (the sign bit included) are dropped, no overflow
            u = np.dtype(f"u{a.dtype.itemsize}")
            shifted = np.left_shift(a.view(u), s.astype(u)).view(a.dtype)
            return np.where(ok, shifted, a.dtype.type(0))
        fill = np.where(a < 0, a.dtype.type(-1), a.dtype.type(0)) if a.dtype.kind == "i" else a.dtype.type(0)
        return np.where(ok, np.right_shift(a, s), fill)


# ---------------------------------------------------------------------------------------------
# Variadic and ternary
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Variadic(OpDef):
    """Reduce any number of broadcast inputs with a binary function."""

    inputs: ClassVar = ("data_0", "data*")
    outputs: ClassVar = ("result",)
    pattern: ClassVar = Pattern.BROADCAST
    dtypes: ClassVar = STD_NUMERIC

    def fn(self, a, b):
        raise NotImplementedError

    def infer(self, ins):
        dt = same_dtype(self, ins, self.dtypes)
        return [TensorType(dt, broadcast_shapes(*[v.shape for v in ins]))]

    def compute(self, *xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = self.fn(acc, x)
        shape = np.broadcast_shapes(*[x.shape for x in xs])
        return [np.broadcast_to(acc, shape).astype(xs[0].dtype)]


@dataclass(frozen=True, eq=False)
class Sum(Variadic):
    def fn(self, a, b):
        return a + b


@dataclass(frozen=True, eq=False)
class Max(Variadic):
    def fn(self, a, b):
        return np.maximum(a, b)


@dataclass(frozen=True, eq=False)
class Min(Variadic):
    def fn(self, a, b):
        return np.minimum(a, b)


@dataclass(frozen=True, eq=False)
class Mean(Variadic):
    dtypes: ClassVar = STD_FLOATS

    def fn(self, a, b):
        return a + b

    def compute(self, *xs):
        (total,) = super().compute(*xs)
        return [(total / len(xs)).astype(xs[0].dtype)]


@dataclass(frozen=True, eq=False)
class Where(OpDef):
    """cond ? x : y, broadcasting all three."""

    inputs: ClassVar = ("condition", "X", "Y")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.BROADCAST

    def infer(self, ins):
        c, x, y = ins
        check_dtype(self, c, {DType.bool}, "condition")
        dt = same_dtype(self, [x, y])
        return [TensorType(dt, broadcast_shapes(c.shape, x.shape, y.shape))]

    def compute(self, c, x, y):
        return [np.where(c, x, y).astype(x.dtype, copy=False)]


@dataclass(frozen=True, eq=False)
class Clip(OpDef):
    """min(max(x, lo), hi); lo and hi are optional scalars."""

    inputs: ClassVar = ("input", "min?", "max?")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.ELEMWISE
    since: ClassVar = 13

    def infer(self, ins):
        x = ins[0]
        check_dtype(self, x, STD_NUMERIC)
        for v in ins[1:]:
            if v is not None and (v.dtype != x.dtype or v.type.rank not in (0, 1)):
                raise self.fail(f"min/max must be scalars of {x.dtype}, got {v.type}")
        return [x.type]

    def compute(self, x, lo=None, hi=None):
        y = x
        if lo is not None:
            y = np.maximum(y, lo.reshape(()))
        if hi is not None:
            y = np.minimum(y, hi.reshape(()))
        return [np.asarray(y).astype(x.dtype, copy=False)]


# ---------------------------------------------------------------------------------------------
# Casts
# ---------------------------------------------------------------------------------------------

#: the float 8 types whose conversion the ``saturate`` attribute controls (E8M0 has its own rules)
_SATURATING_F8 = frozenset({DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz})
#: Cast's element types: every Kiln type but the complex ones
CAST_TYPES = frozenset(DType) - {DType.c64, DType.c128}
ROUND_MODES = ("up", "down", "nearest")
_E8M0_BIAS = 127


def cast_array(x: np.ndarray, to: DType, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """ONNX Cast semantics (opset 25) for every type NumPy and ml_dtypes hold.

    * to float 8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ): round to nearest even; with ``saturate``, values
      (infinities included) beyond the type's range become +-max, without it they become Inf (E5M2)
      or NaN (the types without infinities);
    * to E8M0 (a bare power-of-two exponent): rounded as ``round_mode`` says (see ``_to_e8m0``);
    * integers to narrower integers keep the low bits (two's complement), int4/int2 included;
    * from strings: decimal or scientific notation, "INF"/"+INF"/"-INF"/"NaN" in any case;
      to strings: the shortest decimal that reads back to the same value, positional for
      1e-4 <= |x| < 1e16 ("1", "0.1", "1000000", "1e-07"; "NaN", "INF", "-INF"), booleans as "1"/"0".
    """
    if to is DType.string:
        return _to_strings(x)
    if x.dtype == object:
        x = _parse_strings(x, to)
    if to is DType.f8e8m0:
        return _to_e8m0(x, saturate, round_mode)
    with np.errstate(all="ignore"):
        if to in _SATURATING_F8 and saturate and x.dtype.kind != "b":
            limit = float(_ml_finfo(to).max)
            # every source value is exact in f64, and f64 -> f8 rounds once (RNE): clipping first
            # gives the saturating result, infinities included; NaN stays NaN
            x = np.clip(x.astype(np.float64), -limit, limit)
        return x.astype(to.np)


def _ml_finfo(to: DType):
    import ml_dtypes

    return ml_dtypes.finfo(to.np)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """E8M0 holds 2**(code - 127) for codes 0..254 (255 is NaN); no zero, no sign.

    A value 2**k * f (1 <= f < 2) rounds to 2**k (``down``), 2**(k+1) when f > 1 (``up``) or when
    f >= 1.5 (``nearest``, ties up). Out of range (zero and infinity included): the nearest end of
    the range with ``saturate``, else NaN. The sign is ignored (negative inputs are unspecified).
    """
    v = np.abs(x.astype(np.float64))
    nan, inf, zero = np.isnan(v), np.isinf(v), v == 0
    frac, exp = np.frexp(np.where(nan | inf | zero, 1.0, v))  # v = frac * 2**exp, 0.5 <= frac < 1
    k = exp.astype(np.int64) - 1
    if round_mode == "up":
        k += frac > 0.5
    elif round_mode == "nearest":
        k += frac >= 0.75
    code = k + _E8M0_BIAS
    if saturate:
        code = np.clip(code, 0, 254)
        code[zero] = 0
        code[inf] = 254
    else:
        code[(code < 0) | (code > 254) | zero | inf] = 255
    code[nan] = 255
    return code.astype(np.uint8).view(DType.f8e8m0.np).reshape(x.shape)


def _to_strings(x: np.ndarray) -> np.ndarray:
    if x.dtype == object:
        return np.array([text(s) for s in x.ravel()], dtype=object).reshape(x.shape)
    if x.dtype.kind == "b":
        flat = ["1" if v else "0" for v in x.ravel()]
    elif x.dtype.kind in "iu":
        flat = [str(v) for v in x.ravel().tolist()]
    elif DType.from_numpy(x.dtype).is_int:  # int4/uint4/int2/uint2
        flat = [str(v) for v in x.astype(np.int64).ravel().tolist()]
    else:
        # the shortest repr in the value's own precision (narrow floats: in f32, which holds them exactly)
        work = x if x.dtype in (np.float16, np.float32, np.float64) else x.astype(np.float32)
        flat = [_float_text(v) for v in work.ravel()]
    return np.array(flat, dtype=object).reshape(x.shape)


def _float_text(v) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    # the shortest round-trip digits for v's own type, positional (like %g) for 1e-4 <= |v| < 1e16
    sci = np.format_float_scientific(v, unique=True, trim="-", exp_digits=2)
    exp = int(sci[sci.index("e") + 1:])
    return np.format_float_positional(v, unique=True, trim="-") if -4 <= exp < 16 else sci


def _parse_strings(x: np.ndarray, to: DType) -> np.ndarray:
    """Strings to f64 (float targets), bool, or int64/uint64 (integer targets, low bits kept later)."""
    flat = [text(s).strip() for s in x.ravel()]
    try:
        if to is DType.bool:
            out = np.array([_parse_bool(s) for s in flat], dtype=np.bool_)
        elif to.is_int:
            ints = [_parse_int(s) for s in flat]
            if to is DType.u64:
                out = np.array([i % (1 << 64) for i in ints], dtype=np.uint64)
            else:
                out = np.array([(i + (1 << 63)) % (1 << 64) - (1 << 63) for i in ints], dtype=np.int64)
        else:
            out = np.array([float(s) for s in flat], dtype=np.float64)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"cannot cast string to {to}: {e}") from None
    return out.reshape(x.shape)


def _parse_int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        return int(float(s))  # "1e3", "100.5" (truncated)


def _parse_bool(s: str) -> bool:
    low = s.lower()
    if low in ("true", "false", ""):
        return low == "true"
    return float(s) != 0


@dataclass(frozen=True, eq=False)
class _CastBase(OpDef):
    """Shared by Cast and CastLike: checks of the ``saturate`` and ``round_mode`` attributes and types."""

    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.ELEMWISE
    since: ClassVar = 25

    def validate(self):
        check_flags(self, "saturate")
        if self.round_mode not in ROUND_MODES:
            raise self.fail(f"round_mode must be one of {', '.join(ROUND_MODES)}, got {self.round_mode!r}")

    def _check(self, src: DType, dst: DType) -> None:
        for what, dt in (("input", src), ("target", dst)):
            if dt not in CAST_TYPES:
                raise self.fail(f"{what} element type {dt} cannot be cast (complex types are not supported)")
            if dt.np is None:
                raise self.fail(f"{what} element type {dt} needs the ml_dtypes package")


@dataclass(frozen=True, eq=False)
class Cast(_CastBase):
    """Convert to element type ``to`` (see ``cast_array`` for the rules)."""

    to: DType = DType.f32
    saturate: int = 1
    round_mode: str = "up"
    inputs: ClassVar = ("input",)

    def infer(self, ins):
        (x,) = ins
        self._check(x.dtype, self.to)
        return [x.type.with_dtype(self.to)]

    def compute(self, x):
        return [cast_array(x, self.to, bool(self.saturate), self.round_mode)]


@dataclass(frozen=True, eq=False)
class CastLike(_CastBase):
    """Cast to the element type of a second input (whose values are not read)."""

    saturate: int = 1
    round_mode: str = "up"
    inputs: ClassVar = ("input", "target_type")

    def infer(self, ins):
        x, like = ins
        self._check(x.dtype, like.dtype)
        return [x.type.with_dtype(like.dtype)]

    def compute(self, x, like):
        return [cast_array(x, DType.from_numpy(like.dtype), bool(self.saturate), self.round_mode)]


OPS = (Abs, Neg, Sign, Ceil, Floor, Round, Reciprocal, Sqrt, Exp, Log, Sin, Cos, Tan, Asin, Acos, Atan,
       Sinh, Cosh, Tanh, Asinh, Acosh, Atanh, Relu, Sigmoid, Softsign, Softplus, Mish, Erf, Not, BitwiseNot,
       IsNaN, IsInf, LeakyRelu, Elu, Celu, Selu, ThresholdedRelu, HardSigmoid, HardSwish, Shrink, Gelu,
       Swish, Add, Sub, Mul, Div, And, Or, Xor, BitwiseAnd, BitwiseOr, BitwiseXor, Equal, Less, LessOrEqual,
       Greater, GreaterOrEqual, PRelu, Pow, Mod, BitShift, Sum, Max, Min, Mean, Where, Clip, Cast, CastLike)
