"""Each elementwise op's scalar semantics, and each reduction's pieces, written once as loop-form
expressions.

``scalar(op, args, out)`` is the value of ``op`` at one point, from its operands' values there
(expressions in their compute types: f16/bf16 operands arrive as f32; ``None`` for a missing
optional operand); ``out`` is the element type of the op's result. The result has ``out``'s compute
type and, for f16/bf16, is rounded to that type as the reference interpreter rounds after every op.
Every backend prints these expressions; none has its own per-op code.

``reason(op, in_types, out)`` says why an op cannot be expressed for these element types (None
when it can). The semantics match ``op.compute`` (NumPy): NaN propagates through min/max/Relu;
integer division truncates and gives 0 for division by 0; Mod with fmod=0 takes the divisor's sign;
BitShift past the width gives the sign fill; float to integer conversions truncate.

``REDUCTIONS`` gives each Reduce* op as an identity, a combiner, a map before and a finish after
(``reduction(op, dt)``: for bool, max is "or" and min "and"); the Reduce lowering arranges them in
loops.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ...ir.ops import elementwise as ew
from ...ir.ops import quant as qn
from ...ir.ops import reduce as rd
from ...ir.ops.base import OpDef
from ...ir.ops.shape import Identity
from ...ir.types import DType
from .expr import COMPUTE_TYPES, SMALL_FLOATS, NARROW_INTS, STORAGE_TYPES, Const, Expr, cast, compute_type, op, select

Build = Callable[[OpDef, list, DType], Expr]


def _c(x: Expr, v) -> Const:
    return Const(v, x.dtype)


def _fold(prim: str) -> Build:
    def build(o, xs, out):
        acc = xs[0]
        for x in xs[1:]:
            acc = op(prim, acc, x)
        return acc
    return build


def _where_neg(x: Expr, neg: Expr, pos: Expr) -> Expr:
    return select(op("lt", x, _c(x, 0)), neg, pos)


def _expm1_neg(x: Expr, alpha: float) -> Expr:
    """alpha (e^min(x, 0) - 1), accurate near 0."""
    return op("mul", _c(x, alpha), op("expm1", op("min", x, _c(x, 0))))


def _clip01(x: Expr) -> Expr:
    return op("min", op("max", x, _c(x, 0)), _c(x, 1))


def _sign(o, xs, out):
    (x,) = xs
    if x.dtype.is_int and not x.dtype.is_signed:
        return select(op("gt", x, _c(x, 0)), _c(x, 1), _c(x, 0))
    s = select(op("gt", x, _c(x, 0)), _c(x, 1), select(op("lt", x, _c(x, 0)), _c(x, -1), _c(x, 0)))
    return select(op("isnan", x), x, s) if x.dtype.is_float else s


def _celu(o, xs, out):
    (x,) = xs
    inner = op("mul", _c(x, o.alpha), op("expm1", op("div", x, _c(x, o.alpha))))
    return op("add", op("max", _c(x, 0), x), op("min", _c(x, 0), inner))


def _selu(o, xs, out):
    (x,) = xs
    return op("mul", _c(x, o.gamma), select(op("le", x, _c(x, 0)), _expm1_neg(x, o.alpha), x))


def _shrink(o, xs, out):
    (x,) = xs
    lo, hi = op("lt", x, _c(x, -o.lambd)), op("gt", x, _c(x, o.lambd))
    return select(lo, op("add", x, _c(x, o.bias)), select(hi, op("sub", x, _c(x, o.bias)), _c(x, 0)))


def _gelu(o, xs, out):
    (x,) = xs
    if o.approximate == "tanh":  # x/2 (1 + tanh(z)) = x / (1 + e^(-2z))
        c = math.sqrt(2 / math.pi)
        two_z = op("mul", x, op("fma", op("mul", x, x), _c(x, 2 * c * 0.044715), _c(x, 2 * c)))
        return op("xsigmoid", x, two_z)
    return op("gelu", x)


def _clip(o, xs, out):
    x, lo, hi = (list(xs) + [None, None])[:3]
    if lo is not None:
        x = op("max", x, lo)
    if hi is not None:
        x = op("min", x, hi)
    return x


#: constant exponents Pow computes without a pow call (multiplications, a division, a square root)
POW_EXPONENTS = (1.0, 2.0, 3.0, 0.5, -1.0)


def _pow(o, xs, out):
    """As the reference: a float base to a float exponent of its type in that type (C's pow), any
    other pair in float64, the result converted to the base's type (integers truncate)."""
    x, y = xs
    if isinstance(y, Const) and float(y.value) in POW_EXPONENTS and (x.dtype.is_float or float(y.value) != 0.5):
        e = float(y.value)
        if e == 1:
            return x
        if e == 2:
            return op("mul", x, x)
        if e == 3:
            return op("mul", op("mul", x, x), x)
        if e == -1:
            return op("div", _c(x, 1), x)
        return op("sqrt", x)
    if x.dtype.is_float and (y.dtype is x.dtype or isinstance(y, Const)):
        return op("pow", x, y if y.dtype is x.dtype else Const(float(y.value), x.dtype))
    return cast(op("pow", cast(x, DType.f64), cast(y, DType.f64)), compute_type(out))


def _mod(o, xs, out):
    a, b = xs
    r = op("rem", a, b)
    if o.fmod or (a.dtype.is_int and not a.dtype.is_signed):
        return r
    fix = op("and", op("ne", r, _c(r, 0)), op("ne", op("lt", r, _c(r, 0)), op("lt", b, _c(b, 0))))
    return select(fix, op("add", r, b), r)


def _bitshift(o, xs, out):
    a, b = xs
    bits = a.dtype.itemsize * 8
    ok = op("lt", b, _c(b, bits)) if not a.dtype.is_signed else \
        op("and", op("ge", b, _c(b, 0)), op("lt", b, _c(b, bits)))
    safe = select(ok, b, _c(b, 0))
    if o.direction == "LEFT":
        return select(ok, op("shl", a, safe), _c(a, 0))
    fill = select(op("lt", a, _c(a, 0)), _c(a, -1), _c(a, 0)) if a.dtype.is_signed else _c(a, 0)
    return select(ok, op("shr", a, safe), fill)


def _isinf(o, xs, out):
    (x,) = xs
    pos, neg = op("eq", x, _c(x, math.inf)), op("eq", x, _c(x, -math.inf))
    if o.detect_negative and o.detect_positive:
        return op("or", pos, neg)
    return neg if o.detect_negative else pos if o.detect_positive else Const(False, DType.bool)


#: the floats stored from an f32 value (rounded to nearest even by the store)
_NARROW_FLOATS = frozenset({DType.f16, DType.bf16}) | frozenset(SMALL_FLOATS)
#: the sources an f32 does not hold exactly: a narrow float is rounded from them through ``odd_f32``
_WIDE_SOURCES = frozenset({DType.f64, DType.i32, DType.u32, DType.i64, DType.u64})


def _cast(o, xs, out):
    x, want = xs[0], compute_type(out)
    if out in _NARROW_FLOATS:
        # rounded once: f64 and wide integers reach f32 rounded toward odd, the store rounds to nearest even
        v = cast(op("odd_f32", cast(x, DType.f64)), want) if x.dtype in _WIDE_SOURCES else cast(x, want)
        if out in SMALL_FLOATS and SMALL_FLOATS[out].width == 8:  # (float 4 saturates always, as ml_dtypes)
            return _float8(v, SMALL_FLOATS[out], bool(o.saturate))
        return v
    if out not in NARROW_INTS:
        return cast(x, want)
    bits = NARROW_INTS[out][1]
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if out.is_signed else (0, (1 << bits) - 1)
    if x.dtype.is_float:  # as ml_dtypes: truncated toward zero; out of range, NaN and infinities give 0
        inside = op("and", op("gt", x, _c(x, lo - 1)), op("lt", x, _c(x, hi + 1)))
        return select(inside, cast(select(inside, x, _c(x, 0)), want), Const(0, want))
    return narrow(cast(x, want), out)  # integers: the low bits


def _float8(x: Expr, f, saturate: bool) -> Expr:
    """Cast's ``saturate`` on top of what a float 8 store does (see ``expr.SMALL_FLOATS``): saturating,
    infinities become +-max in E5M2 too; not saturating, what rounds beyond the range becomes +-inf
    (E5M2) or NaN (of the value's sign, as ml_dtypes)."""
    neg = op("lt", x, _c(x, 0))
    if saturate:
        return select(op("isinf", x), select(neg, _c(x, -f.max), _c(x, f.max)), x) if f.has_inf else x
    beyond = select(neg, _c(x, -math.inf if f.has_inf else -math.nan), _c(x, math.inf if f.has_inf else math.nan))
    return select(f.overflows(op("abs", x)), beyond, x)


def narrow(v: Expr, out: DType) -> Expr:
    """``v`` (in ``out``'s compute type) as the ``out`` value its low bits hold: sign-extended for
    int4/int2, masked for uint4/uint2."""
    bits = NARROW_INTS[out][1]
    if out.is_signed:
        shift = Const(8 - bits, v.dtype)
        return op("shr", op("shl", v, shift), shift)
    return op("and", v, Const((1 << bits) - 1, v.dtype))


#: the integer results QuantizeLinear computes in f32 (exact: see ``quantized``)
_QUANT_OUTPUTS = (DType.u8, DType.i8, DType.u16, DType.i16)


def quantized(q: Expr, zero_point: Expr | None, out: DType, work: DType) -> Expr:
    """QuantizeLinear's result from the quotient ``q = x / scale`` (in the op's precision): rounded
    half to even in ``work``, plus the zero point, clamped to ``out``'s range, as ``out``'s compute
    type. In f32 this is exact for results of at most 16 bits: a rounded f32 is an integer, below
    2^24 adding the zero point is exact, and past it both ways clamp to the same end. NaN gives 0,
    as the reference's cast of NaN does on x86-64 (the low bits of its integer indefinite)."""
    bits = 8 * out.itemsize
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if out.is_signed else (0, (1 << bits) - 1)
    v = op("round", q if q.dtype is work else cast(q, work))
    if zero_point is not None:
        v = op("add", v, cast(zero_point, work))
    lo_c, hi_c = Const(float(lo), work), Const(float(hi), work)
    if lo == 0:  # unsigned: NaN must give 0 (the reference's cast of NaN), which is ``lo``: ordered
        # compares send it there, and the clamp is a plain max then min (NumPy's NaN-propagating
        # max/min cost an int8 1x1 conv with its requantize chain 11-16%, int8 MobileNetV2 10%)
        t = select(op("gt", v, lo_c), v, lo_c)
        return cast(select(op("lt", t, hi_c), t, hi_c), compute_type(out))
    return cast(op("min", op("max", v, lo_c), hi_c), compute_type(out))


def _quantize(o, xs, out):
    """QuantizeLinear of a float32 element by one scale (its parameters per tensor: the elementwise
    lowerings check it; per-axis and blocked ones are the QuantizeLinear lowering's)."""
    x, scale, zp = (list(xs) + [None])[:3]
    if x.dtype is not DType.f32 or scale.dtype is not DType.f32 or o.precision not in (None, DType.f32) \
            or out not in _QUANT_OUTPUTS:
        raise ValueError("QuantizeLinear in a fused loop: float32 by a float32 scale to 8/16-bit integers only")
    return quantized(op("div", x, scale), zp, out, DType.f32)


def _dequantize(o, xs, out):
    """DequantizeLinear of an 8/16-bit integer element by one float32 scale: ``(x - zero point)`` is
    exact in i32 and in f32, then one product in f32, as the reference."""
    x, scale, zp = (list(xs) + [None])[:3]
    if x.dtype not in (DType.u8, DType.i8, DType.u16, DType.i16) or scale.dtype is not DType.f32 \
            or out is not DType.f32:
        raise ValueError("DequantizeLinear in a fused loop: 8/16-bit integers by a float32 scale only")
    d = cast(x, DType.i32)
    if zp is not None:
        d = op("sub", d, cast(zp, DType.i32))
    return op("mul", cast(d, DType.f32), scale)


def per_tensor_quantization(node) -> bool:
    """Whether ``node`` is a QuantizeLinear/DequantizeLinear whose scale and zero point are one
    value each (what the scalar semantics above assume), or not such an op at all."""
    if not isinstance(node.op, (qn.QuantizeLinear, qn.DequantizeLinear)):
        return True
    return not node.op.block_size and all(v is None or v.type.numel == 1 for v in node.inputs[1:])


def _unary(prim: str) -> Build:
    return lambda o, xs, out: op(prim, xs[0])


def _binary(prim: str) -> Build:
    return lambda o, xs, out: op(prim, xs[0], xs[1])


#: op class -> its scalar semantics
SCALAR: dict[type, Build] = {
    Identity: lambda o, xs, out: xs[0],
    ew.Add: _binary("add"), ew.Sub: _binary("sub"), ew.Mul: _binary("mul"), ew.Div: _binary("div"),
    ew.Mod: _mod, ew.BitShift: _bitshift,
    ew.And: _binary("and"), ew.Or: _binary("or"), ew.Xor: _binary("xor"), ew.Not: _unary("not"),
    ew.BitwiseAnd: _binary("and"), ew.BitwiseOr: _binary("or"), ew.BitwiseXor: _binary("xor"),
    ew.BitwiseNot: _unary("not"),
    ew.Equal: _binary("eq"), ew.Less: _binary("lt"), ew.LessOrEqual: _binary("le"), ew.Greater: _binary("gt"),
    ew.GreaterOrEqual: _binary("ge"),
    ew.Sum: _fold("add"), ew.Max: _fold("max"), ew.Min: _fold("min"),
    ew.Mean: lambda o, xs, out: op("div", _fold("add")(o, xs, out), _c(xs[0], len(xs))),
    ew.Where: lambda o, xs, out: select(xs[0], xs[1], xs[2]),
    ew.Neg: _unary("neg"), ew.Abs: _unary("abs"), ew.Sign: _sign,
    ew.Sqrt: _unary("sqrt"), ew.Floor: _unary("floor"), ew.Ceil: _unary("ceil"), ew.Round: _unary("round"),
    ew.Reciprocal: lambda o, xs, out: op("div", _c(xs[0], 1), xs[0]),
    ew.Exp: _unary("exp"), ew.Log: _unary("log"), ew.Tanh: _unary("tanh"), ew.Erf: _unary("erf"),
    ew.Sin: _unary("sin"), ew.Cos: _unary("cos"), ew.Tan: _unary("tan"), ew.Asin: _unary("asin"),
    ew.Acos: _unary("acos"), ew.Atan: _unary("atan"), ew.Sinh: _unary("sinh"), ew.Cosh: _unary("cosh"),
    ew.Asinh: _unary("asinh"), ew.Acosh: _unary("acosh"), ew.Atanh: _unary("atanh"),
    ew.Sigmoid: _unary("sigmoid"), ew.Softplus: _unary("softplus"),
    ew.Mish: lambda o, xs, out: op("mul", xs[0], op("tanh", op("softplus", xs[0]))),
    ew.Softsign: lambda o, xs, out: op("div", xs[0], op("add", _c(xs[0], 1), op("abs", xs[0]))),
    ew.Relu: lambda o, xs, out: op("max", xs[0], _c(xs[0], 0)),
    ew.LeakyRelu: lambda o, xs, out: _where_neg(xs[0], op("mul", xs[0], _c(xs[0], o.alpha)), xs[0]),
    ew.PRelu: lambda o, xs, out: _where_neg(xs[0], op("mul", xs[0], xs[1]), xs[0]),
    ew.Elu: lambda o, xs, out: _where_neg(xs[0], _expm1_neg(xs[0], o.alpha), xs[0]),
    ew.Celu: _celu, ew.Selu: _selu,
    ew.ThresholdedRelu: lambda o, xs, out: select(op("gt", xs[0], _c(xs[0], o.alpha)), xs[0], _c(xs[0], 0)),
    ew.HardSigmoid: lambda o, xs, out: _clip01(op("add", op("mul", _c(xs[0], o.alpha), xs[0]), _c(xs[0], o.beta))),
    ew.HardSwish: lambda o, xs, out: op("mul", xs[0], _clip01(op("add", op("div", xs[0], _c(xs[0], 6)),
                                                                  _c(xs[0], 0.5)))),
    ew.Shrink: _shrink,
    ew.Swish: lambda o, xs, out: op("xsigmoid", xs[0], op("mul", _c(xs[0], o.alpha), xs[0])),
    ew.Gelu: _gelu, ew.Clip: _clip, ew.Pow: _pow,
    ew.IsNaN: lambda o, xs, out: op("isnan", xs[0]), ew.IsInf: _isinf,
    ew.Cast: _cast, ew.CastLike: _cast,
    qn.QuantizeLinear: _quantize, qn.DequantizeLinear: _dequantize,
}

#: ops that compute in float32 when given f16/bf16 and round after (the rest are exact on them)
_ROUNDING = {DType.f16: "to_f16", DType.bf16: "to_bf16"}


def reason(o: OpDef, in_types: Sequence[DType | None], out: DType) -> str | None:
    """Why ``o`` has no loop-form semantics for these element types (None when it has)."""
    if type(o) not in SCALAR:
        return f"{o.name} has no scalar semantics in the loop form"
    narrow = [t for t in list(in_types) + [out] if t in NARROW_INTS or t in SMALL_FLOATS]
    if narrow and type(o) not in (ew.Cast, ew.CastLike, Identity):
        return f"{o.name} on {narrow[0]}: the loop form casts and moves 4- and 2-bit integers and float 8/4, " \
               "no arithmetic"
    if in_types and in_types[0] in SMALL_FLOATS and not (out.is_float or out is DType.bool):
        return f"{o.name} from {in_types[0]} to {out}: float 8/4 converts to floats and bool only"
    for t in list(in_types) + [out]:
        if t is not None and t not in STORAGE_TYPES:
            return f"element type {t} (the loop form computes {', '.join(sorted(d.short for d in STORAGE_TYPES))})"
    try:
        xs = [None if t is None else _probe(t) for t in in_types]
        scalar(o, xs, out)
    except (ValueError, Exception) as e:  # an ill-typed combination: FormError, or an op's own refusal
        return str(e)
    return None


def _probe(t: DType) -> Expr:
    from .expr import Var

    return Var("probe", compute_type(t))


def scalar(o: OpDef, xs: Sequence[Expr | None], out: DType) -> Expr:
    """The value of ``o`` at one point (see the module docstring)."""
    build = SCALAR.get(type(o))
    if build is None:
        raise ValueError(f"{o.name} has no scalar semantics in the loop form")
    y = build(o, list(xs), out)
    want = compute_type(out)
    if y.dtype is not want:
        raise ValueError(f"{o.name}: computes {y.dtype}, the result is {out}")
    if out in _ROUNDING and want in COMPUTE_TYPES and not isinstance(o, Identity):
        y = op(_ROUNDING[out], y)
    return y


# -- reductions ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reduction:
    """A Reduce* op in loop-form pieces: ``acc = identity; acc = combiner(acc, pre(x)) for each x;
    result = post(acc, count)``. ``real``: integers are reduced in f64 (the result truncated back),
    as the op's reference does. ``shifted`` (LogSumExp): a first pass finds the maximum m and the
    sum runs over ``exp(x - m)`` (m is 0 where infinite or NaN), then ``m`` is added back."""

    combiner: str
    identity: Callable[[DType], float | int | bool]
    pre: Callable[[Expr], Expr] | None = None
    post: Callable[[Expr, int], Expr] | None = None
    real: bool = False
    shifted: bool = False

    def map(self, x: Expr) -> Expr:
        """What is accumulated for element ``x``."""
        return x if self.pre is None else self.pre(x)

    def finish(self, acc: Expr, count: int) -> Expr:
        """The result from the accumulator after ``count`` elements."""
        return acc if self.post is None else self.post(acc, count)

    def combine(self, acc: Expr, x: Expr) -> Expr:
        """``combiner`` as an expression (for accumulators kept in a buffer)."""
        return op(self.combiner, acc, x)

    def acc_type(self, dt: DType) -> DType:
        """The accumulator's type for elements of ``dt``: f64 for float sums (their error does not
        grow with the count) and for integers of a ``real`` op, else the compute type."""
        ct = compute_type(dt)
        if (self.real and ct.is_int) or (ct.is_float and self.combiner == "add"):
            return DType.f64
        return ct


def _lowest(dt: DType):
    return False if dt is DType.bool else -math.inf if dt.is_float else _int_limits(dt)[0]


def _highest(dt: DType):
    return True if dt is DType.bool else math.inf if dt.is_float else _int_limits(dt)[1]


def _int_limits(dt: DType) -> tuple[int, int]:
    bits = 8 * dt.itemsize
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dt.is_signed else (0, (1 << bits) - 1)


def _square(x: Expr) -> Expr:
    return op("mul", x, x)


def _mean(acc: Expr, n: int) -> Expr:
    return op("div", acc, Const(float(n), acc.dtype))


REDUCTIONS: dict[type, Reduction] = {
    rd.ReduceSum: Reduction("add", lambda dt: 0),
    rd.ReduceMean: Reduction("add", lambda dt: 0, post=_mean, real=True),
    rd.ReduceMax: Reduction("max", _lowest),
    rd.ReduceMin: Reduction("min", _highest),
    rd.ReduceProd: Reduction("mul", lambda dt: 1),
    rd.ReduceL1: Reduction("add", lambda dt: 0, pre=lambda x: op("abs", x)),
    rd.ReduceL2: Reduction("add", lambda dt: 0, pre=_square, post=lambda acc, n: op("sqrt", acc), real=True),
    rd.ReduceLogSum: Reduction("add", lambda dt: 0, post=lambda acc, n: op("log", acc), real=True),
    rd.ReduceLogSumExp: Reduction("add", lambda dt: 0, pre=lambda x: op("exp", x),
                                  post=lambda acc, n: op("log", acc), real=True, shifted=True),
    rd.ReduceSumSquare: Reduction("add", lambda dt: 0, pre=_square),
}
#: bool has no arithmetic: its max is "any", its min "all"
_BOOL_COMBINER = {"max": "or", "min": "and"}


def reduction(o: OpDef, dt: DType) -> Reduction:
    """The pieces of reduction ``o`` over elements of ``dt`` (ValueError when it has none)."""
    r = REDUCTIONS.get(type(o))
    if r is None:
        raise ValueError(f"{o.name} has no loop-form reduction")
    if dt not in STORAGE_TYPES:
        raise ValueError(f"element type {dt} (the loop form computes "
                         f"{', '.join(sorted(d.short for d in STORAGE_TYPES))})")
    if dt is DType.bool:
        if r.combiner not in _BOOL_COMBINER:
            raise ValueError(f"{o.name} of bool")
        return dataclasses.replace(r, combiner=_BOOL_COMBINER[r.combiner])
    return r
