"""The LLVM printer: a loop-form ``Kernel`` as LLVM IR inside a CPU kernel function.

``print_llvm(k, kernel)`` emits ``kernel`` into the ``KernelBuilder`` ``k`` (``kernels/base.py``):
buffers bound to IR values become ``k.ptr(value)`` (``noalias`` slot pointers), buffers bound to
NumPy arrays ``k.weight(array)`` (compile-time data), buffers bound to LLVM pointers those pointers
(a loop-form piece inside a hand-written lowering, e.g. the attention kernel's softmax rows),
scratch buffers ``k.scratch``; the top-level parallel loop becomes ``k.parallel_for`` (pool tasks over [begin, end));
other loops are guarded, rotated counted loops, and a vector loop is left to LLVM's loop vectorizer
(with two vector iterations in flight when its body calls a math function), which the noalias
pointers and the contiguous innermost strides make possible. Accumulators live in ``alloca``s that
LLVM promotes to registers; ``add``/``mul`` updates of float accumulators may be reassociated
(``reassoc``) and ``min``/``max`` updates are ``llvm.minimum``/``llvm.maximum`` (NaN-propagating as
NumPy's; of two zeros either may win, as in NumPy's own vector loops), so reductions vectorize.

Every primitive (``expr.PRIMS``) is printed here for each compute type, with the meaning written
there: float32 math through Kiln's ``MathLib`` (vectorizable, about one ulp), float64 math through
libm; integer division and remainder guarded (0 for division by 0; MIN / -1 wraps); float to
narrow integer conversions through i64 (wrapping as NumPy's do).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ...ir.types import DType
from .expr import SMALL_FLOATS, NARROW_INTS, Const, SmallFloat, Expr, FormError, Load, Op, Var
from .form import Acc, Buffer, Check, Kernel, Let, Loop, Store, Update

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
I16 = ir.IntType(16)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()

#: compute type -> LLVM type of a value
VALUE_TYPES = {DType.f32: F32, DType.f64: F64, DType.bool: I1, DType.i8: I8, DType.u8: I8,
               DType.i16: ir.IntType(16), DType.u16: ir.IntType(16), DType.i32: I32, DType.u32: I32,
               DType.i64: I64, DType.u64: I64}
#: storage type -> LLVM type in memory (bfloat16 as its 16 bits: llvmlite has no bfloat type; loads
#: widen them to f32 exactly, stores round to nearest even in integer arithmetic, ``bf16_bits``)
MEMORY_TYPES = {**VALUE_TYPES, DType.bool: I8, DType.f16: F16, DType.bf16: I16,
                **{t: I8 for t in NARROW_INTS}, **{t: I8 for t in SMALL_FLOATS}}


def bf16_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The bfloat16 nearest the f32 ``x`` (ties to even; overflow to infinity) as its 16 bits: the
    high half of x's bits after adding 0x7FFF plus the lowest kept bit; a NaN becomes the quiet NaN
    of its sign (0x7FC0 or 0xFFC0), as ml_dtypes and ONNX's reference give."""
    bits = b.bitcast(x, I32)
    high = b.lshr(bits, ir.Constant(I32, 16))
    keep = b.and_(high, ir.Constant(I32, 1))
    rounded = b.lshr(b.add(bits, b.add(keep, ir.Constant(I32, 0x7FFF))), ir.Constant(I32, 16))
    nan = b.or_(b.and_(high, ir.Constant(I32, 0x8000)), ir.Constant(I32, 0x7FC0))
    return b.trunc(b.select(b.fcmp_unordered("uno", x, x), nan, rounded), I16)


def bf16_value(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The f32 of bfloat16 ``bits`` (exact: they are its high half)."""
    return b.bitcast(b.shl(b.zext(bits, I32), ir.Constant(I32, 16)), F32)

def small_float_value(b: ir.IRBuilder, code: ir.Value, f: SmallFloat) -> ir.Value:
    """The f32 of the float 8/4 byte ``code`` (exact). E5M2 is the high byte of a float16; the others:
    normal magnitudes moved into f32's fields, subnormals ``m * 2**(1 - bias - man)``, the NaN codes
    a quiet NaN; the sign bit last."""
    k = lambda v: ir.Constant(I32, v)  # noqa: E731
    c = b.and_(b.zext(code, I32), k((1 << f.width) - 1))
    top = 1 << (f.width - 1)
    mag, sign = b.and_(c, k(top - 1)), b.shl(b.and_(c, k(top)), k(32 - f.width))
    if f.has_inf:  # its NaNs become the quiet NaN of their sign, as ml_dtypes reads them
        v = b.fpext(b.bitcast(b.trunc(b.shl(c, k(8)), I16), F16), F32)
        return b.select(b.fcmp_unordered("uno", v, v), b.bitcast(b.or_(sign, k(0x7FC00000)), F32), v)
    normal = b.add(b.shl(mag, k(23 - f.man)), k((127 - f.bias) << 23))
    sub = b.fmul(b.uitofp(b.and_(mag, k((1 << f.man) - 1)), F32), ir.Constant(F32, 2.0 ** (1 - f.bias - f.man)))
    bits = b.select(b.icmp_unsigned("<", mag, k(1 << f.man)), b.bitcast(sub, I32), normal)
    if f.width == 8:
        nan = b.icmp_unsigned("==", c, k(0x80)) if f.fnuz else b.icmp_unsigned("==", mag, k(0x7F))
        bits = b.select(nan, k(0x7FC00000), bits)
    return b.bitcast(b.or_(bits, sign), F32)


def small_float_bits(b: ir.IRBuilder, x: ir.Value, f: SmallFloat) -> ir.Value:
    """The float 8/4 byte nearest the f32 ``x``, ties to even, in integer arithmetic on x's bits:
    normal results by rounding the mantissa at its last kept bit (a carry moves the exponent),
    subnormal ones by adding (in f32) the power of two whose ulp is the format's smallest step.
    Finite magnitudes beyond the range become ``max_code``, infinities that too (E5M2: its infinity),
    NaN ``nan_code``; the sign last, by exclusive or (FNUZ: not on zero and NaN)."""
    k = lambda v: ir.Constant(I32, v)  # noqa: E731
    u = b.bitcast(x, I32)
    top = 1 << (f.width - 1)
    sign, a = b.and_(b.lshr(u, k(32 - f.width)), k(top)), b.and_(u, k(0x7FFFFFFF))
    shift = 23 - f.man
    keep = b.and_(b.lshr(a, k(shift)), k(1))
    normal = b.sub(b.lshr(b.add(a, b.add(keep, k((1 << (shift - 1)) - 1))), k(shift)), k((127 - f.bias) << f.man))
    step = 2.0 ** (1 - f.bias - f.man + 23)  # f32 values near it are spaced by the format's subnormal step
    sub = b.sub(b.bitcast(b.fadd(b.bitcast(a, F32), ir.Constant(F32, step)), I32), k(int(np.float32(step).view(np.int32))))
    code = b.select(b.icmp_unsigned("<", a, k((1 - f.bias + 127) << 23)), sub, normal)
    code = b.select(b.icmp_signed(">", code, k(f.max_code)), k(f.max_code), code)
    if f.has_inf:
        code = b.select(b.icmp_unsigned("==", a, k(0x7F800000)), k(0x7C), code)
    code = b.select(b.icmp_unsigned(">", a, k(0x7F800000)), k(f.nan_code), code)
    signed = b.xor(code, sign)
    if f.fnuz:
        signed = b.select(b.icmp_unsigned("==", b.and_(code, k(top - 1)), k(0)), code, signed)
    return b.trunc(signed, I8)


def odd_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The f64 ``x`` rounded to f32 toward odd (see the ``odd_f32`` primitive): rounded to nearest,
    moved one step toward zero where that went away from zero, the last bit set where inexact."""
    y = b.fptrunc(x, F32)
    back = b.fpext(y, F64)
    fabs = b.module.declare_intrinsic("llvm.fabs", [F64])
    away = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [x]))
    bits = b.sub(b.bitcast(y, I32), b.zext(away, I32))
    bits = b.select(b.fcmp_ordered("!=", back, x), b.or_(bits, ir.Constant(I32, 1)), bits)
    return b.bitcast(bits, F32)


#: float32 math from MathLib (name -> method); the rest call libm
_MATHLIB = {"exp": "exp", "expm1": "expm1", "log": "log", "tanh": "tanh", "erf": "erf", "sigmoid": "sigmoid",
            "softplus": "softplus", "gelu": "gelu"}
#: LLVM intrinsics (llvm.<name>.f32 / .f64)
_INTRINSIC = {"sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "round": "roundeven", "trunc": "trunc",
              "abs": "fabs"}
_LIBM = ("exp", "expm1", "log", "log1p", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
         "cosh", "asinh", "acosh", "atanh", "pow")
_HEAVY = frozenset(_MATHLIB) | frozenset(_LIBM) | {"xsigmoid"}
_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _splat(v: ir.Value):
    """The element of a constant (a scalar, or a vector of one value repeated: ``_Printer.konst``),
    else None."""
    if not isinstance(v, ir.Constant):
        return None
    c = v.constant
    if isinstance(v.type, ir.VectorType):
        if not isinstance(c, list) or not c or any(x is not c[0] for x in c):
            return None
        c, ty = c[0].constant, v.type.element
    else:
        ty = v.type
    return c if isinstance(ty, (ir.FloatType, ir.DoubleType, ir.HalfType)) and isinstance(c, (int, float)) else None


def _not_nan_constant(v: ir.Value) -> bool:
    """Whether ``v`` is a float constant that is not NaN (an inlined scalar: Relu's 0, Clip's bounds),
    or a vector of one such repeated."""
    c = _splat(v)
    return c is not None and c == c


def clamped(v: ir.Value) -> tuple[float, float] | None:
    """Bounds ``(lo, hi)`` (either may be -inf/inf) that the float ``v`` provably lies within,
    never NaN, when ``v`` is a clamp as printed for an ordered compare against a constant:
    ``select(x > c, x, c)`` (at least ``c``) or ``select(x < c, x, c)`` (at most ``c``), NaN
    taking ``c``, of another such clamp for the other bound (QuantizeLinear's to unsigned types,
    ``scalar.quantized``); None otherwise."""
    if not isinstance(v, ir.instructions.SelectInstr):
        return None
    cond, x, c = v.operands
    if not (isinstance(cond, ir.instructions.FCMPInstr) and _not_nan_constant(c)
            and list(cond.operands) == [x, c] and cond.op in ("ogt", "oge", "olt", "ole")):
        return None
    lo, hi = clamped(x) or (-math.inf, math.inf)
    k = float(_splat(c))
    return (k, max(hi, k)) if cond.op in ("ogt", "oge") else (min(lo, k), k)


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, int(v))


def _signed(dt: DType) -> bool:
    return dt.is_int and dt.is_signed


#: the float and integer primitives printed on vectors (``expr_llvm(..., lanes=n)``); the others
#: (math functions, small-float roundings, ``not``) only on scalars
_VECTOR_FLOAT = frozenset({"add", "sub", "mul", "div", "min", "max", "neg", "fma", "ne", "isnan", "isinf"}
                          | set(_FCMP) | set(_INTRINSIC))
_VECTOR_INT = frozenset({"add", "sub", "mul", "div", "rem", "min", "max", "neg", "abs", "and", "or", "xor",
                         "shl", "shr"} | set(_ICMP))


def _no_vector_form(e: Op) -> str | None:
    """Why the primitive of ``e`` is printed on scalars only, or None."""
    if e.prim in ("select", "cast") or e.prim in (_VECTOR_FLOAT if e.args[0].dtype.is_float else _VECTOR_INT):
        return None
    return f"{e.prim} of {e.args[0].dtype} has no vector form here"


class _Printer:
    #: more than 1: every value a vector of this many lanes (one expression, ``expr_llvm``)
    lanes = 1

    def __init__(self, k, kernel: Kernel):
        self.k, self.kernel = k, kernel
        self.scopes: list[dict] = [{}]    # id(expr or var) -> ir value, innermost last
        self.accs: dict[int, ir.Value] = {}
        self.scratch: dict[int, ir.Value] = {}
        self.deps: dict[int, frozenset] = {}  # id(expr) -> ids of the buffers and accumulators it reads

    @property
    def b(self) -> ir.IRBuilder:
        return self.k.b

    # -- buffers ---------------------------------------------------------------------------------
    def pointer(self, buf: Buffer) -> ir.Value:
        if buf.role == "scratch":
            if id(buf) not in self.scratch:
                raise FormError(f"scratch buffer {buf.name} is used before it is allocated")
            return self.k.again(self.scratch[id(buf)])
        if buf.value is None:
            raise FormError(f"buffer {buf.name} is bound to no value")
        if isinstance(buf.value, np.ndarray):  # compile-time data, stored with the kernel
            return self.k.weight(buf.value)
        if isinstance(buf.value, ir.Value):  # a pointer of the function being built (a form inside a lowering's code)
            here = getattr(self.k, "here", None)  # (a slot pointer is asked for again inside a parallel task)
            return here(buf.value) if here is not None else buf.value
        return self.k.ptr(buf.value)

    def address(self, buf: Buffer, index) -> ir.Value:
        off = None
        for i, s in zip(index, buf.strides):
            if s == 0:
                continue
            term = self.expr(i)
            if s != 1:
                term = self.b.mul(term, c64(s), flags=["nsw"])
            off = term if off is None else self.b.add(off, term, flags=["nsw"])
        return self.b.gep(self.pointer(buf), [off if off is not None else c64(0)], inbounds=True,
                          source_etype=MEMORY_TYPES[buf.dtype])

    # -- expressions -------------------------------------------------------------------------------
    def lookup(self, key: int):
        for s in reversed(self.scopes):
            if key in s:
                return s[key]
        return None

    def expr(self, e: Expr) -> ir.Value:
        got = self.lookup(id(e))
        if got is not None:
            return got
        if isinstance(e, Var):
            if id(e) in self.accs:
                return self.b.load(self.accs[id(e)], typ=VALUE_TYPES[e.dtype])
            raise FormError(f"{e.name} is not bound here")
        if isinstance(e, Const):
            v = self.const(e)
        elif isinstance(e, Load):
            v = self.load(e)
            self.deps[id(e)] = frozenset({id(e.buf)})
        else:
            v = self.op(e)
            deps = frozenset().union(*(self.deps.get(id(a), frozenset()) for a in e.args))
            deps |= {id(a) for a in e.args if isinstance(a, Var) and id(a) in self.accs}
            if deps:
                self.deps[id(e)] = deps
        self.scopes[-1][id(e)] = v
        return v

    def forget(self, key: int) -> None:
        """A store to a buffer or an update of an accumulator (by id): expressions that read it are
        evaluated again where they are used next."""
        for scope in self.scopes:
            for e in [e for e in scope if key in self.deps.get(e, ())]:
                del scope[e]

    def typ(self, ty: ir.Type) -> ir.Type:
        """The type of a value whose elements are ``ty``."""
        return ir.VectorType(ty, self.lanes) if self.lanes > 1 else ty

    def konst(self, ty: ir.Type, v) -> ir.Constant:
        """The constant ``v`` of element type ``ty`` (repeated in every lane of a vector)."""
        c = ir.Constant(ty, v)
        return c if self.lanes == 1 else ir.Constant(ir.VectorType(ty, self.lanes), [c] * self.lanes)

    def const(self, e: Const) -> ir.Value:
        ty = VALUE_TYPES[e.dtype]
        if e.dtype is DType.bool:
            return self.konst(I1, int(e.value))
        if e.dtype.is_int:
            return self.konst(ty, int(e.value) & ((1 << ty.width) - 1))
        return self.konst(ty, float(e.value))

    def load(self, e: Load) -> ir.Value:
        buf = e.buf
        if self.lanes > 1:
            raise FormError(f"a vector expression reads no buffer (it reads {buf.name})")
        raw = self.b.load(self.address(buf, e.index), typ=MEMORY_TYPES[buf.dtype])
        if buf.dtype is DType.bool:
            return self.b.icmp_unsigned("!=", raw, ir.Constant(I8, 0))
        if buf.dtype is DType.f16:
            return self.b.fpext(raw, F32)
        if buf.dtype is DType.bf16:
            return bf16_value(self.b, raw)
        if buf.dtype in SMALL_FLOATS:
            return small_float_value(self.b, raw, SMALL_FLOATS[buf.dtype])
        if buf.dtype in NARROW_INTS:  # the low bits, sign- or zero-extended
            bits = NARROW_INTS[buf.dtype][1]
            if buf.dtype.is_signed:
                shift = ir.Constant(I8, 8 - bits)
                return self.b.ashr(self.b.shl(raw, shift), shift)
            return self.b.and_(raw, ir.Constant(I8, (1 << bits) - 1))
        return raw

    def op(self, e: Op) -> ir.Value:
        b, p, dt = self.b, e.prim, e.args[0].dtype
        if p == "select":
            return b.select(self.expr(e.args[0]), self.expr(e.args[1]), self.expr(e.args[2]))
        if p == "cast":
            return self.cast(self.expr(e.args[0]), dt, e.dtype)
        if self.lanes > 1 and _no_vector_form(e):
            raise FormError(_no_vector_form(e))
        xs = [self.expr(a) for a in e.args]
        if dt.is_float:
            return self.float_op(p, xs, dt)
        return self.int_op(p, xs, dt)

    def float_op(self, p: str, xs, dt: DType) -> ir.Value:
        b, ty = self.b, VALUE_TYPES[dt]
        one, zero = ir.Constant(ty, 1.0), ir.Constant(ty, 0.0)
        if p in ("add", "sub", "mul", "div", "rem"):
            return getattr(b, {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv", "rem": "frem"}[p])(*xs)
        if p in ("min", "max"):  # NumPy's: NaN if either is NaN, else the smaller/larger (x on ties)
            x, y = xs
            if _not_nan_constant(y):  # y only where it is strictly beyond x (one minps/maxps on x86)
                return b.select(b.fcmp_ordered("<" if p == "min" else ">", y, x), y, x)
            keep = b.or_(b.fcmp_ordered("<=" if p == "min" else ">=", x, y), b.fcmp_unordered("uno", x, x))
            return b.select(keep, x, y)
        if p == "neg":
            return b.fneg(xs[0])
        if p == "fma":
            return b.call(self.intrinsic("fmuladd", dt, 3), xs)
        if p in _FCMP:
            return b.fcmp_ordered(_FCMP[p], *xs)
        if p == "ne":
            return b.fcmp_unordered("!=", *xs)
        if p == "isnan":
            return b.fcmp_unordered("uno", xs[0], xs[0])
        if p == "isinf":
            return b.fcmp_ordered("==", b.call(self.intrinsic("fabs", dt), xs), self.konst(ty, float("inf")))
        if p in _INTRINSIC:
            return b.call(self.intrinsic(_INTRINSIC[p], dt), xs)
        if p == "to_f16":
            return b.fpext(b.fptrunc(xs[0], F16), ty)
        if p == "to_bf16":
            x = xs[0] if dt is DType.f32 else odd_f32(b, xs[0])  # (f64: rounded once, through odd)
            y = bf16_value(b, bf16_bits(b, x))
            return y if dt is DType.f32 else b.fpext(y, ty)
        if p == "odd_f32":
            return xs[0] if dt is DType.f32 else b.fpext(odd_f32(b, xs[0]), ty)
        math = self.k.math
        if dt is DType.f32 and p in _MATHLIB:
            return getattr(math, _MATHLIB[p])(b, xs[0])
        if dt is DType.f32 and p == "xsigmoid":
            return math.scaled_sigmoid(b, xs[0], xs[1])
        if p == "sigmoid":  # f64: as the reference computes it
            return b.fdiv(one, b.fadd(one, self.libm("exp", dt, [b.fneg(xs[0])])))
        if p == "xsigmoid":
            return b.fdiv(xs[0], b.fadd(one, self.libm("exp", dt, [b.fneg(xs[1])])))
        if p == "softplus":  # max(x, 0) + log1p(e^-|x|)
            x = xs[0]
            a = b.call(self.intrinsic("fabs", dt), [x])
            pos = b.select(b.fcmp_ordered(">", x, zero), x, zero)
            y = b.fadd(pos, self.libm("log1p", dt, [self.libm("exp", dt, [b.fneg(a)])]))
            return b.select(b.fcmp_unordered("uno", x, x), x, y)
        if p == "gelu":
            x = xs[0]
            phi = b.fadd(one, self.libm("erf", dt, [b.fmul(x, ir.Constant(ty, 0.7071067811865476))]))
            return b.fmul(b.fmul(ir.Constant(ty, 0.5), x), phi)
        if p in _LIBM:
            return self.libm(p, dt, xs)
        raise FormError(f"the LLVM printer has no {p} for {dt}")

    def int_op(self, p: str, xs, dt: DType) -> ir.Value:
        b, ty = self.b, VALUE_TYPES[dt]
        signed = _signed(dt)
        zero = self.konst(ty, 0)
        if p in ("add", "sub", "mul"):
            return getattr(b, p)(*xs)
        if p in ("div", "rem"):
            x, y = xs
            by_zero = b.icmp_unsigned("==", y, zero)
            if signed:
                minus_one = b.icmp_signed("==", y, self.konst(ty, -1 & ((1 << ty.width) - 1)))
                safe = b.select(b.or_(by_zero, minus_one), self.konst(ty, 1), y)
                r = b.sdiv(x, safe) if p == "div" else b.srem(x, safe)
                special = b.sub(zero, x) if p == "div" else zero      # x / -1 wraps; x % -1 is 0
                return b.select(by_zero, zero, b.select(minus_one, special, r))
            safe = b.select(by_zero, self.konst(ty, 1), y)
            r = b.udiv(x, safe) if p == "div" else b.urem(x, safe)
            return b.select(by_zero, zero, r)
        if p in ("min", "max"):
            x, y = xs
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp("<=" if p == "min" else ">=", x, y), x, y)
        if p == "neg":
            return b.sub(zero, xs[0])
        if p == "abs":
            return b.select(b.icmp_signed("<", xs[0], zero), b.sub(zero, xs[0]), xs[0]) if signed else xs[0]
        if p in _ICMP:
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return cmp(_ICMP[p], *xs)
        if p in ("and", "or", "xor"):
            return getattr(b, p + "_" if p in ("and", "or") else p)(*xs)
        if p == "not":
            return b.not_(xs[0])
        if p == "shl":
            return b.shl(*xs)
        if p == "shr":
            return b.ashr(*xs) if signed else b.lshr(*xs)
        raise FormError(f"the LLVM printer has no {p} for {dt}")

    def cast(self, x: ir.Value, src: DType, dst: DType) -> ir.Value:
        b = self.b
        if src is dst:
            return x
        sty, dty = VALUE_TYPES[src], VALUE_TYPES[dst]
        to = self.typ(dty)
        if dst is DType.bool:
            if src.is_float:
                return b.fcmp_unordered("!=", x, self.konst(sty, 0.0))
            return b.icmp_unsigned("!=", x, self.konst(sty, 0))
        if src is DType.bool:
            return b.uitofp(x, to) if dst.is_float else b.zext(x, to)
        if src.is_float and dst.is_float:
            return b.fpext(x, to) if dty is F64 else b.fptrunc(x, to)
        if src.is_float:  # as NumPy on x86-64 (cvttss2si): see _float_to_int
            return self.float_to_int(x, sty, dst)
        if dst.is_float:
            return b.sitofp(x, to) if _signed(src) else b.uitofp(x, to)
        if dty.width == sty.width:
            return x
        if dty.width < sty.width:
            return b.trunc(x, to)
        return b.sext(x, to) if _signed(src) else b.zext(x, to)

    def float_to_int(self, x: ir.Value, sty: ir.Type, dst: DType) -> ir.Value:
        """Truncation toward zero; NaN, infinities and values out of range give the "integer
        indefinite" value (INT64_MIN or INT32_MIN), as cvttss2si/cvttsd2si do: to i64 and u64 through
        i64, to u32 through i64, to the narrower types through i32, keeping the low bits (what
        NumPy's C casts compile to on x86-64)."""
        b = self.b
        wide = I64 if dst in (DType.i64, DType.u64, DType.u32) else I32
        half = float(2 ** (wide.width - 1))
        dty = VALUE_TYPES[dst]
        bounds = clamped(x)
        if bounds is not None and -half <= bounds[0] and bounds[1] < half:  # in range, not NaN: no check
            r = b.fptosi(x, self.typ(wide))  # (a clamped QuantizeLinear: two compares and a masked move less)
            return r if dty.width == wide.width else b.trunc(r, self.typ(dty))
        ok = b.and_(b.fcmp_ordered(">=", x, self.konst(sty, -half)), b.fcmp_ordered("<", x, self.konst(sty, half)))
        r = b.select(ok, b.fptosi(b.select(ok, x, self.konst(sty, 0.0)), self.typ(wide)),
                     self.konst(wide, 1 << (wide.width - 1)))
        return r if dty.width == wide.width else b.trunc(r, self.typ(dty))

    def intrinsic(self, name: str, dt: DType, nargs: int = 1) -> ir.Function:
        ty = self.typ(VALUE_TYPES[dt])
        full = f"llvm.{name}.{'v%d' % self.lanes if self.lanes > 1 else ''}{'f32' if dt is DType.f32 else 'f64'}"
        fn = self.k.module.globals.get(full)
        return fn if fn is not None else ir.Function(self.k.module, ir.FunctionType(ty, [ty] * nargs), full)

    def libm(self, name: str, dt: DType, xs) -> ir.Value:
        ty = VALUE_TYPES[dt]
        full = name + ("f" if dt is DType.f32 else "")
        fn = self.k.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.k.module, ir.FunctionType(ty, [ty] * len(xs)), full)
            fn.attributes.add("nounwind")
        return self.b.call(fn, list(xs))

    # -- statements --------------------------------------------------------------------------------
    def block(self, stmts) -> None:
        for s in stmts:
            if isinstance(s, Loop):
                self.loop(s)
            elif isinstance(s, Let):
                self.scopes[-1][id(s.var)] = self.expr(s.value)
            elif isinstance(s, Acc):
                entry = self.k.fn.entry_basic_block
                eb = ir.IRBuilder(entry)
                eb.position_at_start(entry)
                slot = eb.alloca(VALUE_TYPES[s.var.dtype], name=s.var.name)
                self.b.store(self.expr(s.init), slot)
                self.accs[id(s.var)] = slot
            elif isinstance(s, Update):
                self.update(s)
            elif isinstance(s, Store):
                self.store(s)
            elif isinstance(s, Check):
                self.k.fail_if(self.expr(s.bad), self.expr(s.value), s.limit)
            else:
                raise FormError(f"not a statement: {s!r}")

    def update(self, s: Update) -> None:
        b, dt = self.b, s.var.dtype
        slot = self.accs[id(s.var)]
        cur = b.load(slot, typ=VALUE_TYPES[dt])
        val = self.expr(s.value)
        if dt.is_float and s.combiner in ("add", "mul"):
            new = (b.fadd if s.combiner == "add" else b.fmul)(cur, val, flags=["reassoc", "nsz"])
        elif dt.is_float and s.combiner in ("min", "max"):
            # NaN-propagating, as NumPy's; LLVM vectorizes these reductions (a select chain it does not)
            new = b.call(self.intrinsic("minimum" if s.combiner == "min" else "maximum", dt, 2), [cur, val])
        elif dt.is_float:
            new = self.float_op(s.combiner, [cur, val], dt)
        else:
            new = self.int_op(s.combiner, [cur, val], dt)
        b.store(new, slot)
        self.forget(id(s.var))

    def store(self, s: Store) -> None:
        b, buf = self.b, s.buf
        v = self.expr(s.value)
        if buf.dtype is DType.bool:
            v = b.zext(v, I8)
        elif buf.dtype is DType.f16:
            v = b.fptrunc(v, F16)
        elif buf.dtype is DType.bf16:
            v = bf16_bits(b, v)
        elif buf.dtype in SMALL_FLOATS:
            v = small_float_bits(b, v, SMALL_FLOATS[buf.dtype])
        elif buf.dtype in NARROW_INTS:  # as ml_dtypes stores them: the value's low bits only
            v = b.and_(v, ir.Constant(I8, (1 << NARROW_INTS[buf.dtype][1]) - 1))
        b.store(v, self.address(buf, s.index))
        self.forget(id(buf))

    def loop(self, lp: Loop) -> None:
        if self.copy_run(lp):
            return
        heavy = any(isinstance(x, Op) and x.prim in _HEAVY for x in _exprs(lp.body))
        if lp.kind == "parallel":
            with self.k.parallel_for(lp.extent, min_per_task=lp.grain) as (begin, end):
                saved, self.scopes = self.scopes, [{}]  # a new function: nothing outside it is visible
                saved_accs, self.accs = self.accs, {}
                count = self.b.sub(end, begin)
                self.counted(lp, count, begin, heavy)
                self.scopes, self.accs = saved, saved_accs
            return
        count = self.expr(lp.extent) if isinstance(lp.extent, Var) else c64(lp.extent)
        self.counted(lp, count, None, heavy)

    def counted(self, lp: Loop, count: ir.Value, start: ir.Value | None, heavy: bool) -> None:
        from ..llvm.elementwise import _For, loop_metadata, no_vectorize_metadata

        inner = not any(isinstance(s, Loop) for s in lp.body)
        # a loop around loops is not vectorized (LLVM would unroll the inner loops and gather across
        # the outer one's iterations); an innermost loop is, with two vector iterations in flight
        # when it calls a math function
        short_sum = isinstance(lp.extent, int) and lp.extent < SHORT_REDUCTION and \
            any(isinstance(s, Update) for s in lp.body)
        md = no_vectorize_metadata(self.k.module) if not inner else \
            loop_metadata(self.k.module, 2) if heavy else \
            loop_metadata(self.k.module, 1) if short_sum else None
        with _For(self.b, count, f"{self.kernel.name}.{lp.var.name}", md) as i:
            self.scopes.append({id(lp.var): i if start is None else self.b.add(start, i, flags=["nsw"])})
            self.block(lp.body)
            self.scopes.pop()


    def copy_run(self, lp: Loop) -> bool:
        """A vector loop that only copies a contiguous run of ``MEMCPY_BYTES`` or more from one buffer
        to another (``dst[.. a + i ..] = src[.. b + i ..]``, one storage type, unit stride) is one
        ``llvm.memcpy``: LLVM's loop-idiom pass does not find it once the kernel body is inlined (the
        noalias arguments become alias scopes, which it does not read), and the C library's copy
        writes whole cache lines without reading them first (a 3 MB Concat: 12% faster, measured)."""
        body = lp.body
        if lp.kind != "vector" or len(body) != 1 or not isinstance(body[0], Store) or \
                not isinstance(body[0].value, Load):
            return False
        dst, src = body[0].buf, body[0].value.buf
        if src.dtype is not dst.dtype or dst.dtype in (DType.bool, DType.f16, DType.bf16) or dst.dtype in NARROW_INTS or \
                src.value is dst.value or not isinstance(lp.extent, int) or \
                lp.extent * dst.dtype.itemsize < MEMCPY_BYTES or \
                not _unit_step(body[0].index, dst.strides, lp.var) or \
                not _unit_step(body[0].value.index, src.strides, lp.var):
            return False
        self.scopes.append({id(lp.var): c64(0)})  # the run's first element
        to, frm = self.address(dst, body[0].index), self.address(src, body[0].value.index)
        self.scopes.pop()
        name = "llvm.memcpy.p0.p0.i64"
        fn = self.k.module.globals.get(name) or \
            ir.Function(self.k.module, ir.FunctionType(ir.VoidType(), [to.type, frm.type, I64, I1]), name)
        self.b.call(fn, [to, frm, c64(lp.extent * dst.dtype.itemsize), ir.Constant(I1, 0)])
        self.forget(id(dst))
        return True


#: innermost loops updating an accumulator over fewer iterations than this are vectorized without
#: interleaving: LLVM's default (4 vector accumulators) leaves a 169-element row (a 13x13 plane)
#: two vector iterations and 41 scalar ones
SHORT_REDUCTION = 256

#: the fewest bytes a copy loop moves to be printed as ``llvm.memcpy`` (shorter runs are faster as
#: the vectorized loop: 1 KB runs 20% slower through memcpy, measured)
MEMCPY_BYTES = 4096


def _unit_step(index, strides, var: Var) -> bool:
    """Whether the address of ``index`` moves by one element with ``var``: one axis (of stride 1)
    indexed by ``var`` plus or minus terms free of it."""
    from .expr import walk

    def uses(e) -> bool:
        return any(x is var for x in walk(e))

    def plus(e) -> bool:
        if e is var:
            return True
        if isinstance(e, Op) and e.prim in ("add", "sub"):
            a, b = e.args
            return plus(a) and not uses(b) if uses(a) else e.prim == "add" and plus(b)
        return False

    axes = [k for k, e in enumerate(index) if uses(e)]
    return len(axes) == 1 and strides[axes[0]] == 1 and plus(index[axes[0]])


def _exprs(stmts):
    from .expr import walk

    for s in stmts:
        if isinstance(s, Loop):
            yield from _exprs(s.body)
        else:
            for e in (getattr(s, "value", None), getattr(s, "init", None)):
                if e is not None:
                    yield from walk(e)


def print_llvm(k, kernel: Kernel, sizes=()) -> None:
    """Emit ``kernel`` into the KernelBuilder ``k`` (see the module docstring); ``sizes``: the i64
    values of its run-time sizes (``kernel.sizes``), in order, computed where the kernel is printed."""
    if len(sizes) != len(kernel.sizes):
        raise FormError(f"kernel {kernel.name} takes {len(kernel.sizes)} sizes, got {len(sizes)}")
    p = _Printer(k, kernel)
    p.scopes[0].update({id(v): x for (v, _), x in zip(kernel.sizes, sizes)})
    for buf in kernel.buffers:
        if buf.role == "scratch":
            p.scratch[id(buf)] = k.scratch(max(buf.extent, 1) * buf.dtype.itemsize)
    for note in kernel.notes:
        k.note(note)
    p.block(kernel.body)


class _ExprOnly:
    """The members of a KernelBuilder that printing one expression needs."""

    def __init__(self, b: ir.IRBuilder, math):
        self.b, self.math, self.module = b, math, b.module


def vector_reason(e: Expr) -> str | None:
    """Why ``e`` cannot be printed on vectors (``expr_llvm(..., lanes=n)``), or None."""
    from .expr import walk

    for x in walk(e):
        if isinstance(x, Load):
            return f"it reads {x.buf.name}"
        if isinstance(x, Op) and _no_vector_form(x):
            return _no_vector_form(x)
    return None


def expr_llvm(b: ir.IRBuilder, math, e: Expr, env: dict, lanes: int = 1) -> ir.Value:
    """One expression at the builder's position, its variables bound by ``env`` (id(Var) -> value):
    for lowerings that print scalar semantics inside loops of their own. ``lanes`` > 1: the
    variables are vectors of that many lanes, and so is the result, each lane the scalar
    expression's value on the variables' lanes (``FormError`` where a primitive has no vector form
    here, ``_VECTOR_FLOAT``/``_VECTOR_INT``: the caller prints its scalar loop instead)."""
    p = _Printer(_ExprOnly(b, math), Kernel("expr", [], []))
    p.lanes = lanes
    p.scopes = [dict(env)]
    return p.expr(e)


__all__ = ["print_llvm", "expr_llvm", "vector_reason", "VALUE_TYPES", "MEMORY_TYPES"]
