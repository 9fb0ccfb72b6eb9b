"""Float32 math functions written in LLVM IR, so that loops calling them vectorize.

A call to libm's ``expf`` inside a loop keeps LLVM's loop vectorizer from vectorizing it (there is
no vector ``expf`` it may call); these functions are straight-line code (no branches: special cases
are ``select`` s) over operations that have vector forms, emitted as ``internal alwaysinline``
functions so that the inliner puts them into the loop before the vectorizer runs.

exp, expm1, log, tanh and erf are within 1 ulp of the exact result over all float32 inputs,
sigmoid and softplus within 2, erfc and gelu within 6; all handle infinities, NaN, overflow,
underflow and denormals (the tests measure the errors; docs/codegen.md quotes them).
The methods:

* ``exp``: ``x = k ln2 + r`` with ``|r| <= ln2/2`` (Cody–Waite: ``ln2`` split in a 15-bit head and a
  tail, so ``k * head`` is exact even where no FMA fuses it), ``e^r = 1 + r + r^2 P(r)``, and
  ``2^k`` applied as two factors ``2^(k/2)`` so that results that are denormal, or that overflow,
  round once and correctly.
* ``log``: ``x = 2^k m`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` (read off the bits; denormal inputs are
  scaled by ``2^23`` first), ``log(1 + f) = f + f^2 Q(f)``, ``log x = k ln2 + log(1 + f)``.
* ``log1p`` (for ``t`` in ``[0, 1]``): ``log(u) - ((u - 1) - t) / u`` with ``u = 1 + t``.
* ``expm1``: the same reduction, ``2^k (e^r - 1) + (2^k - 1)`` in one multiply-add.
* ``tanh``: ``x + x^3 P(x^2)`` for ``|x| < 1``, else ``1 - 2 / (e^(2|x|) + 1)`` with the sign of x.
* ``erfc``: ``t e^(-a^2) H(t)`` with ``a = |x|``, ``t = 2 / (2 + a)`` for ``a >= 1/2`` (``a^2`` carried
  with its rounding error, from an FMA, into ``e^(-a^2)``); ``erf``: ``x + x R(x^2)`` for ``|x| < 1``,
  else ``1 - erfc(|x|)`` with the sign of x; ``gelu``: ``x/2 erfc(-x / sqrt 2)``, accurate on the
  negative tail where ``1 + erf`` would cancel.
* ``sigmoid`` and ``scaled_sigmoid`` (Swish, tanh-GELU) use ``e^-|x|`` only, so they neither
  overflow nor flush the negative tail to 0 early.

``P``, ``Q``, ``R`` and ``H`` are minimax polynomials fitted by ``mathfit.py``; every multiply-add is
``llvm.fmuladd`` (an FMA where the target has one).
"""
from __future__ import annotations

from typing import Callable, Sequence

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)

LOG2E = 1.4426950408889634
LN2_HI = 0.693145751953125  # ln 2 to 15 significant bits: k * LN2_HI is exact for |k| < 512
LN2_LO = 1.4286067653302306e-06  # ln 2 - LN2_HI

#: e^r = 1 + r + r^2 P(r), |r| <= ln2/2 (coefficients of r^0..r^4 of P)
EXP_P = (0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368710055947304,
         0.001381461275741458)
#: log(1 + f) = f + f^2 Q(f), f in [sqrt(1/2) - 1, sqrt(2) - 1]
LOG_Q = (-0.49999988079071045, 0.33333325386047363, -0.25001582503318787, 0.2000197470188141,
         -0.16609081625938416, 0.14181822538375854, -0.13242986798286438, 0.12904445827007294,
         -0.07621793448925018)
#: tanh(x) = x + x^3 P(x^2), |x| <= 1
TANH_P = (-0.33333295583724976, 0.13332344591617584, -0.05387980118393898, 0.021486656740307808,
          -0.007946106605231762, 0.0023013646714389324, -0.00035845203092321754)
TANH_SMALL = 1.0
TANH_SATURATE = 9.1  # tanh(x) rounds to 1 for x > 9.01
#: erf(x) = x + x R(x^2), |x| <= 1 (R = P - 1 where erf(x) = x P(x^2): the constant term 2/sqrt(pi) - 1
#: keeps its precision this way)
ERF_R = (0.12837916612625122, -0.3761262595653534, 0.1128358542919159, -0.026853812858462334,
         0.005188328679651022, -0.0008010200690478086, 7.853883289499208e-05)
ERF_SMALL = 1.0
ERF_SATURATE = 4.0  # erf(x) rounds to 1 for x > 3.92
#: erfc(a) = t e^(-a^2) H(t) with t = 2 / (2 + a), a in [ERFC_SMALL, ERFC_ZERO]
ERFC_H = (0.2820863723754883, 0.2823212444782257, 0.24423041939735413, 0.19300194084644318,
          0.01859280653297901, 0.152079775929451, -0.2717941403388977, 0.06297361105680466,
          0.06682966649532318, -0.030349843204021454)
ERFC_SMALL = 0.5  # below: erfc(a) = 1 - erf(a)
ERFC_ZERO = 10.1  # erfc(a) rounds to 0 for a > 10.06
SQRT1_2 = 0.7071067811865476

ROUND_MAGIC = 12582912.0  # 1.5 * 2^23
EXP_MAX = 88.8  # above: e^x overflows (e^88.7228 is the largest float32)
EXP_MIN = -104.0  # below: e^x rounds to 0
EXPM1_MAX = 80.0  # above: e^x - 1 = e^x in float32
EXPM1_MIN = -30.0  # below: e^x - 1 rounds to -1


def f32(v: float) -> ir.Constant:
    return ir.Constant(F32, float(v))


def i32(v: int) -> ir.Constant:
    return ir.Constant(I32, int(v))


class MathLib:
    """The float32 math functions of one LLVM module; each is defined the first time it is used.

    ``math.exp(builder, x)`` (and ``log``, ``log1p``, ``tanh``, ``erf``, ``sigmoid``, ``softplus``)
    emits a call; ``intrinsic(name)`` returns an LLVM float intrinsic (``"fabs"``, ``"sqrt"``, ...).
    """

    PREFIX = "kiln.math."

    def __init__(self, module: ir.Module):
        self.module = module

    # -- plumbing ------------------------------------------------------------------------------
    def intrinsic(self, name: str, nargs: int = 1) -> ir.Function:
        """``llvm.<name>.f32``: fabs, sqrt, floor, ceil, roundeven, rint, copysign (2), fmuladd (3)..."""
        full = f"llvm.{name}.f32"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(F32, [F32] * nargs), name=full)
        return fn

    def _function(self, name: str, nargs: int, body: Callable[[ir.IRBuilder, Sequence[ir.Value]], ir.Value]):
        full = self.PREFIX + name
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(F32, [F32] * nargs), name=full)
            fn.linkage = "internal"
            fn.attributes.add("alwaysinline")
            fn.attributes.add("nounwind")
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            b.ret(body(b, fn.args))
        return fn

    def _call(self, b: ir.IRBuilder, name: str, body, *args: ir.Value) -> ir.Value:
        return b.call(self._function(name, len(args), body), list(args))

    def fma(self, b: ir.IRBuilder, x, y, z) -> ir.Value:
        """x * y + z, fused where the target has FMA (``llvm.fmuladd``)."""
        return b.call(self.intrinsic("fmuladd", 3), [x, y, z])

    def poly(self, b: ir.IRBuilder, t: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """c0 + c1 t + c2 t^2 + ... by Horner's rule."""
        acc = f32(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(b, acc, t, f32(c))
        return acc

    def _round(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """x rounded to an integer (ties to even) for |x| < 2^22, by adding and taking away 1.5 * 2^23
        (every x86-64 has this; ``llvm.rint`` without SSE4.1 is a libm call)."""
        return b.fsub(b.fadd(x, f32(ROUND_MAGIC)), f32(ROUND_MAGIC))

    def select_lt(self, b, x, limit: float, then) -> ir.Value:
        return b.select(b.fcmp_ordered("<", x, f32(limit)), then, x)

    # -- the functions ---------------------------------------------------------------------------
    def exp(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        return self._call(b, "exp", self._exp, x)

    def expm1(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """e^x - 1, accurate near 0 (where exp(x) - 1 cancels)."""
        return self._call(b, "expm1", self._expm1, x)

    def log(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        return self._call(b, "log", self._log, x)

    def log1p(self, b: ir.IRBuilder, t: ir.Value) -> ir.Value:
        """log(1 + t) for t in [0, 1] (as softplus needs it)."""
        return self._call(b, "log1p01", self._log1p, t)

    def tanh(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        return self._call(b, "tanh", self._tanh, x)

    def erf(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        return self._call(b, "erf", self._erf, x)

    def erfc(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """1 - erf(x), accurate where it is tiny (to 1e-45 at x = 10)."""
        return self._call(b, "erfc", self._erfc, x)

    def gelu(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """x/2 (1 + erf(x / sqrt 2)), accurate on the negative tail too."""
        return self._call(b, "gelu", self._gelu, x)

    def sigmoid(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 (no underflow to 0 before x = -103)."""
        return self._call(b, "sigmoid", self._sigmoid, x)

    def scaled_sigmoid(self, b: ir.IRBuilder, x: ir.Value, t: ir.Value) -> ir.Value:
        """x / (1 + e^-t) (Swish, tanh-GELU), as x e^t / (1 + e^t) for t < 0: no underflow to 0 on
        the negative tail while the result is representable."""
        a = b.call(self.intrinsic("fabs"), [t])
        e = self.exp(b, b.fneg(a))
        ac = b.select(b.fcmp_unordered(">", a, f32(-EXP_MIN)), f32(-EXP_MIN), a)  # NaN too: selected away
        xe = self._exp_core(b, b.fneg(ac), scale=x)  # x e^-|t|, rounded once
        xe = b.select(b.fcmp_unordered(">", a, f32(-EXP_MIN)), b.fmul(x, e), xe)  # e = 0 there
        num = b.select(b.fcmp_ordered("<", t, f32(0.0)), xe, x)
        return b.fdiv(num, b.fadd(f32(1.0), e))

    def softplus(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """log(1 + e^x) = max(x, 0) + log1p(e^-|x|) (NumPy's logaddexp(0, x))."""
        return self._call(b, "softplus", self._softplus, x)

    # -- bodies ----------------------------------------------------------------------------------
    def _exp_core(self, b: ir.IRBuilder, x: ir.Value, scale: ir.Value | None = None) -> ir.Value:
        """e^x for x in [EXP_MIN, EXP_MAX] (not NaN); ``scale * e^x`` rounded once at the end when a
        scale is given (so a normal product of a denormal e^x keeps its precision)."""
        k = self._round(b, b.fmul(x, f32(LOG2E)))
        r = self.fma(b, k, f32(-LN2_HI), x)
        r = self.fma(b, k, f32(-LN2_LO), r)
        p = self.fma(b, b.fmul(r, r), self.poly(b, r, EXP_P), r)
        p = b.fadd(p, f32(1.0))
        if scale is not None:
            p = b.fmul(p, scale)
        ki = b.fptosi(k, I32)
        k1 = b.ashr(ki, i32(1))
        k2 = b.sub(ki, k1)
        s1 = b.bitcast(b.shl(b.add(k1, i32(127)), i32(23)), F32)
        s2 = b.bitcast(b.shl(b.add(k2, i32(127)), i32(23)), F32)
        return b.fmul(b.fmul(p, s1), s2)

    def _expm1(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        xc = b.select(b.fcmp_unordered(">", x, f32(EXPM1_MAX)), f32(EXPM1_MAX), x)  # NaN too
        xc = self.select_lt(b, xc, EXPM1_MIN, f32(EXPM1_MIN))
        k = self._round(b, b.fmul(xc, f32(LOG2E)))
        r = self.fma(b, k, f32(-LN2_HI), xc)
        r = self.fma(b, k, f32(-LN2_LO), r)
        p = self.fma(b, b.fmul(r, r), self.poly(b, r, EXP_P), r)  # e^r - 1
        s = b.bitcast(b.shl(b.add(b.fptosi(k, I32), i32(127)), i32(23)), F32)  # 2^k, |k| <= 116
        y = self.fma(b, s, p, b.fsub(s, f32(1.0)))  # 2^k (e^r - 1) + 2^k - 1
        y = b.select(b.fcmp_ordered(">", x, f32(EXPM1_MAX)), self.exp(b, x), y)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def _exp(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        xc = b.select(b.fcmp_unordered(">", x, f32(EXP_MAX)), f32(EXP_MAX), x)  # NaN too
        xc = self.select_lt(b, xc, EXP_MIN, f32(EXP_MIN))
        y = self._exp_core(b, xc)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def _log_core(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """log x for finite positive x (denormals included)."""
        tiny = b.fcmp_ordered("<", x, f32(2.0 ** -126))
        xs = b.select(tiny, b.fmul(x, f32(2.0 ** 23)), x)
        ix = b.bitcast(xs, I32)
        k = b.ashr(b.sub(ix, i32(0x3F3504F3)), i32(23))  # 0x3f3504f3: sqrt(1/2)
        m = b.bitcast(b.sub(ix, b.shl(k, i32(23))), F32)
        f = b.fsub(m, f32(1.0))
        y = self.fma(b, b.fmul(f, f), self.poly(b, f, LOG_Q), f)
        kf = b.fsub(b.sitofp(k, F32), b.select(tiny, f32(23.0), f32(0.0)))
        return self.fma(b, kf, f32(LN2_HI), self.fma(b, kf, f32(LN2_LO), y))

    def _log(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        y = self._log_core(b, x)
        y = b.select(b.fcmp_ordered("==", x, f32(float("inf"))), f32(float("inf")), y)
        y = b.select(b.fcmp_ordered("==", x, f32(0.0)), f32(float("-inf")), y)
        return b.select(b.fcmp_unordered("<", x, f32(0.0)), f32(float("nan")), y)  # x < 0 or NaN

    def _log1p(self, b: ir.IRBuilder, args) -> ir.Value:
        (t,) = args
        u = b.fadd(f32(1.0), t)
        err = b.fsub(b.fsub(u, f32(1.0)), t)  # the rounding error of u, exactly
        return b.fsub(self._log_core(b, u), b.fdiv(err, u))

    def _tanh(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        a = b.call(self.intrinsic("fabs"), [x])
        x2 = b.fmul(x, x)
        small = self.fma(b, b.fmul(x, x2), self.poly(b, x2, TANH_P), x)
        ac = b.select(b.fcmp_unordered(">", a, f32(TANH_SATURATE)), f32(TANH_SATURATE), a)
        e = self._exp_core(b, b.fmul(ac, f32(2.0)))
        large = b.fsub(f32(1.0), b.fdiv(f32(2.0), b.fadd(e, f32(1.0))))
        large = b.call(self.intrinsic("copysign", 2), [large, x])
        y = b.select(b.fcmp_ordered("<", a, f32(TANH_SMALL)), small, large)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def _square(self, b: ir.IRBuilder, a: ir.Value) -> tuple[ir.Value, ir.Value]:
        """a*a as a rounded product and its rounding error (exact with FMA, 0 without)."""
        a2 = b.fmul(a, a)
        return a2, self.fma(b, a, a, b.fneg(a2))

    def _erfc_tail(self, b: ir.IRBuilder, a: ir.Value, a2: ir.Value, a2_err: ir.Value) -> ir.Value:
        """erfc(a) for a in [ERFC_SMALL, ERFC_ZERO], given a^2 = a2 + a2_err."""
        t = b.fdiv(f32(2.0), b.fadd(f32(2.0), a))
        e = self._exp_core(b, b.fneg(a2))
        e = self.fma(b, e, b.fneg(a2_err), e)  # e^-(a2 + err) = e^-a2 (1 - err)
        th = b.fmul(t, self.poly(b, t, ERFC_H))
        return b.fmul(th, e)

    def _erf_small(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        return self.fma(b, x, self.poly(b, b.fmul(x, x), ERF_R), x)

    def _erf(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        a = b.call(self.intrinsic("fabs"), [x])
        ac = b.select(b.fcmp_unordered(">", a, f32(ERF_SATURATE)), f32(ERF_SATURATE), a)
        ac = b.select(b.fcmp_ordered("<", ac, f32(ERF_SMALL)), f32(ERF_SMALL), ac)
        large = b.fsub(f32(1.0), self._erfc_tail(b, ac, *self._square(b, ac)))
        large = b.call(self.intrinsic("copysign", 2), [large, x])
        y = b.select(b.fcmp_ordered("<", a, f32(ERF_SMALL)), self._erf_small(b, x), large)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def _erfc_of(self, b: ir.IRBuilder, x: ir.Value, a: ir.Value, a2: ir.Value, a2_err: ir.Value) -> ir.Value:
        """erfc(x) from a = |x| (clamped to ERFC_ZERO) and a^2 = a2 + a2_err."""
        ac = b.select(b.fcmp_ordered("<", a, f32(ERFC_SMALL)), f32(ERFC_SMALL), a)
        tail = self._erfc_tail(b, ac, a2, a2_err)  # erfc(|x|) for |x| >= ERFC_SMALL
        big = b.select(b.fcmp_ordered("<", x, f32(0.0)), b.fsub(f32(2.0), tail), tail)
        small = b.fsub(f32(1.0), self._erf_small(b, x))
        return b.select(b.fcmp_ordered("<", a, f32(ERFC_SMALL)), small, big)

    def _erfc(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        a = b.call(self.intrinsic("fabs"), [x])
        ac = b.select(b.fcmp_unordered(">", a, f32(ERFC_ZERO)), f32(ERFC_ZERO), a)
        ac2, err = self._square(b, b.select(b.fcmp_ordered("<", ac, f32(ERFC_SMALL)), f32(ERFC_SMALL), ac))
        y = self._erfc_of(b, x, ac, ac2, err)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def _gelu(self, b: ir.IRBuilder, args) -> ir.Value:
        """x/2 erfc(-x / sqrt 2), with (x / sqrt 2)^2 = x^2 / 2 carried in extra precision: the
        negative tail stays accurate (1 + erf(x / sqrt 2) would cancel to 0)."""
        (x,) = args
        limit = ERFC_ZERO / SQRT1_2
        xa = b.call(self.intrinsic("fabs"), [x])
        xc = b.select(b.fcmp_unordered(">", xa, f32(limit)), f32(limit), xa)
        xc = b.select(b.fcmp_ordered("<", xc, f32(ERFC_SMALL / SQRT1_2)), f32(ERFC_SMALL / SQRT1_2), xc)
        x2, x2_err = self._square(b, xc)
        a2, a2_err = b.fmul(x2, f32(0.5)), b.fmul(x2_err, f32(0.5))
        a = b.fmul(xa, f32(SQRT1_2))
        ac = b.select(b.fcmp_unordered(">", a, f32(ERFC_ZERO)), f32(ERFC_ZERO), a)
        phi2 = self._erfc_of(b, b.fneg(b.fmul(x, f32(SQRT1_2))), ac, a2, a2_err)  # 1 + erf(x / sqrt 2)
        return b.fmul(b.fmul(f32(0.5), x), phi2)

    def _sigmoid(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        e = self.exp(b, b.fneg(b.call(self.intrinsic("fabs"), [x])))
        num = b.select(b.fcmp_ordered("<", x, f32(0.0)), e, f32(1.0))
        return b.fdiv(num, b.fadd(f32(1.0), e))

    def _softplus(self, b: ir.IRBuilder, args) -> ir.Value:
        (x,) = args
        a = b.call(self.intrinsic("fabs"), [x])
        pos = b.select(b.fcmp_ordered(">", x, f32(0.0)), x, f32(0.0))
        y = b.fadd(pos, self.log1p(b, self.exp(b, b.fneg(a))))
        return b.select(b.fcmp_unordered("uno", x, x), x, y)


__all__ = ["MathLib", "f32", "i32", "F32", "I32"]
