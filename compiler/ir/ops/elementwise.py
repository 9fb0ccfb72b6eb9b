"""Elementwise and broadcasting ops: unary math, activations, binary arithmetic, comparisons, logic."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from ..graph import Value
from ..types import DType, TensorType
from .base import (ANY, FLOATS, NUMERIC, STD_FLOATS, STD_INTS, STD_NUMERIC, Cost, OpDef, Pattern,
                   broadcast_shapes, check_dtype, same_dtype)

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
        return 0.5 * x * (1 + _erf(x))


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
    """Remainder: sign of the divisor (fmod=0, integers only) or of the dividend (fmod=1)."""

    fmod: int = 0

    def validate(self):
        if self.fmod not in (0, 1):
            raise self.fail(f"fmod must be 0 or 1, got {self.fmod}")

    def infer(self, ins):
        out = super().infer(ins)
        if ins[0].dtype.is_float and not self.fmod:
            raise self.fail("fmod=0 is only defined for integer inputs; floats need fmod=1")
        return out

    def fn(self, a, b):
        return np.fmod(a, b) if self.fmod else np.mod(a, b)


@dataclass(frozen=True, eq=False)
class BitShift(Binary):
    direction: str = "LEFT"
    dtypes: ClassVar = frozenset({DType.u8, DType.u16, DType.u32, DType.u64})

    def validate(self):
        if self.direction not in ("LEFT", "RIGHT"):
            raise self.fail(f"direction must be LEFT or RIGHT, got {self.direction!r}")

    def fn(self, a, b):
        return np.left_shift(a, b) if self.direction == "LEFT" else np.right_shift(a, b)


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

def cast_array(x: np.ndarray, to: DType, saturate: bool = True) -> np.ndarray:
    """ONNX Cast semantics for the types NumPy (and ml_dtypes) hold."""
    if to is DType.string:
        if x.dtype == object:
            return x.copy()
        if x.dtype.kind == "f" or x.dtype.itemsize <= 2 and x.dtype.kind not in "iub":
            return np.array([_float_str(v) for v in x.astype(np.float32).ravel()], dtype=object).reshape(x.shape)
        return x.astype(str).astype(object)
    if x.dtype == object:
        return np.array([_parse_number(s, to) for s in x.ravel()], dtype=to.np).reshape(x.shape)
    if to.np.itemsize == 1 and to.is_float and saturate and x.dtype.kind == "f":
        info = _finfo(to)
        if info is not None:
            x = np.where(np.isinf(x) | np.isnan(x), x, np.clip(x, -info, info))
    with np.errstate(all="ignore"):
        return x.astype(to.np)


def _finfo(to: DType):
    try:
        import ml_dtypes
        return float(ml_dtypes.finfo(to.np).max)
    except Exception:
        return None


def _float_str(v) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    return repr(float(v)) if float(v) != int(v) or abs(v) >= 1e16 else str(float(v))


def _parse_number(s, to: DType):
    s = s.decode() if isinstance(s, bytes) else str(s)
    if to.is_float:
        return float(s)
    if to is DType.bool:
        return s.strip().lower() not in ("0", "false", "")
    return int(float(s)) if "." in s or "e" in s.lower() else int(s)


@dataclass(frozen=True, eq=False)
class Cast(OpDef):
    to: DType = DType.f32
    saturate: int = 1
    round_mode: str = "up"
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.ELEMWISE

    def infer(self, ins):
        return [ins[0].type.with_dtype(self.to)]

    def compute(self, x):
        return [cast_array(x, self.to, bool(self.saturate))]


@dataclass(frozen=True, eq=False)
class CastLike(OpDef):
    """Cast to the element type of a second input."""

    saturate: int = 1
    round_mode: str = "up"
    inputs: ClassVar = ("input", "target_type")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.ELEMWISE

    def infer(self, ins):
        return [ins[0].type.with_dtype(ins[1].dtype)]

    def compute(self, x, like):
        return [cast_array(x, DType.from_numpy(like.dtype), bool(self.saturate))]


OPS = (Abs, Neg, Sign, Ceil, Floor, Round, Reciprocal, Sqrt, Exp, Log, Sin, Cos, Tan, Asin, Acos, Atan,
       Sinh, Cosh, Tanh, Asinh, Acosh, Atanh, Relu, Sigmoid, Softsign, Softplus, Mish, Erf, Not, BitwiseNot,
       IsNaN, IsInf, LeakyRelu, Elu, Celu, Selu, ThresholdedRelu, HardSigmoid, HardSwish, Shrink, Gelu,
       Swish, Add, Sub, Mul, Div, And, Or, Xor, BitwiseAnd, BitwiseOr, BitwiseXor, Equal, Less, LessOrEqual,
       Greater, GreaterOrEqual, PRelu, Pow, Mod, BitShift, Sum, Max, Min, Mean, Where, Clip, Cast, CastLike)
