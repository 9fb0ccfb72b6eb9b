"""How the polynomial coefficients of ``mathlib`` were made (a development tool, not imported by Kiln).

Each approximation is a weighted minimax polynomial, fitted with Lawson's algorithm (iteratively
reweighted least squares, which converges to the minimax solution) on a dense Chebyshev grid in
float64, then rounded to float32. Run ``python -m compiler.codegen.llvm.mathfit`` to print them all
with their fitted error (the error of the float32 code itself is measured by the tests and quoted in
docs/codegen.md).
"""
from __future__ import annotations

import math

import numpy as np


def lawson(target: np.ndarray, basis: np.ndarray, weight: np.ndarray, iters: int = 400) -> tuple[np.ndarray, float]:
    """Coefficients c minimizing max |weight * (basis @ c - target)|; returns (c, that max)."""
    a = basis * weight[:, None]
    y = target * weight
    w = np.full(len(y), 1.0 / len(y))
    c = np.zeros(basis.shape[1])
    for _ in range(iters):
        sw = np.sqrt(w)
        c = np.linalg.lstsq(a * sw[:, None], y * sw, rcond=None)[0]
        err = np.abs(a @ c - y)
        w = w * (err + 1e-300)
        w /= w.sum()
    return c, float(np.max(np.abs(a @ c - y)))


def grid(lo: float, hi: float, n: int = 6000) -> np.ndarray:
    k = np.arange(n)
    return 0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos(np.pi * (k + 0.5) / n)[::-1]


def _poly_basis(t: np.ndarray, degree: int) -> np.ndarray:
    return np.stack([t ** j for j in range(degree + 1)], axis=1)


def fit_exp(degree: int = 5):
    """e^r = 1 + r + r^2 P(r) on |r| <= ln2/2; relative error."""
    r = grid(-math.log(2) / 2, math.log(2) / 2)
    target = (np.exp(r) - 1 - r) / r ** 2
    return lawson(target, _poly_basis(r, degree - 2), r ** 2 / np.exp(r))


def fit_log(degree: int = 8):
    """log(1 + f) = f + f^2 Q(f) on [sqrt(1/2) - 1, sqrt(2) - 1]; relative error."""
    f = grid(math.sqrt(0.5) - 1, math.sqrt(2) - 1)
    f = f[np.abs(f) > 1e-6]
    target = (np.log1p(f) - f) / f ** 2
    return lawson(target, _poly_basis(f, degree), f ** 2 / np.abs(np.log1p(f)))


def fit_tanh(limit: float = 1.0, degree: int = 6):
    """tanh(x) = x + x^3 P(x^2) on |x| <= limit; relative error."""
    x = grid(1e-4, limit)
    target = (np.tanh(x) - x) / x ** 3
    return lawson(target, _poly_basis(x * x, degree), x ** 3 / np.tanh(x))


def fit_erf_small(limit: float = 1.0, degree: int = 6):
    """erf(x) = x P(x^2) on |x| <= limit; relative error."""
    x = grid(1e-4, limit)
    target = np.array([math.erf(v) for v in x]) / x
    return lawson(target, _poly_basis(x * x, degree), x / np.array([math.erf(v) for v in x]))


def fit_erfc(lo: float = 0.5, hi: float = 10.1, degree: int = 9):
    """erfc(a) = t exp(-a^2) H(t) with t = 2 / (2 + a), a in [lo, hi]; relative error."""
    t = grid(2 / (2 + hi), 2 / (2 + lo))
    a = 2 / t - 2
    target = np.array([math.erfc(v) * math.exp(v * v) for v in a]) / t
    return lawson(target, _poly_basis(t, degree), 1 / target)


def main() -> None:
    np.set_printoptions(precision=10)
    erf_c, erf_err = fit_erf_small(1.0, 6)
    erf_c[0] -= 1  # mathlib evaluates erf(x) = x + x R(x^2), R = P - 1, in float32
    for name, (c, err) in [("EXP_P", fit_exp(6)), ("LOG_Q", fit_log(8)), ("TANH_P", fit_tanh(1.0, 6)),
                           ("ERF_R", (erf_c, erf_err)), ("ERFC_H", fit_erfc())]:
        print(f"{name}: max weighted error {err:.3g}")
        print("   ", ", ".join(repr(float(np.float32(v))) for v in c))


if __name__ == "__main__":
    main()
