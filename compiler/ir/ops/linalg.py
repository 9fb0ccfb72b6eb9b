"""Linear algebra: MatMul (NumPy matmul semantics), Gemm, Einsum, Det."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import STD_FLOATS, STD_NUMERIC, Cost, OpDef, OpError, Pattern, broadcast_shapes, same_dtype
from .common import check_flags, precise_dim, widen_narrow

#: the element types MatMul and Gemm take (ONNX's list)
MATMUL_TYPES = STD_FLOATS | {DType.i32, DType.i64, DType.u32, DType.u64}


def _product(dims) -> int | None:
    n = 1
    for d in dims:
        if not isinstance(d, int):
            return None
        n *= d
    return n


# ---------------------------------------------------------------------------------------------
# MatMul
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class MatMul(OpDef):
    """NumPy matmul: 1-D operands are promoted to a row (A) or column (B) vector and that axis dropped
    from the result; batch dimensions broadcast."""

    inputs: ClassVar = ("A", "B")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OUT_ELEMWISE_FUSABLE
    since: ClassVar = 13

    def infer(self, ins):
        a, b = ins
        dt = same_dtype(self, ins, MATMUL_TYPES)
        if a.type.rank == 0 or b.type.rank == 0:
            raise self.fail(f"operands must have rank >= 1, got {a.type} and {b.type}")
        sa = (1,) + a.shape if a.type.rank == 1 else a.shape
        sb = b.shape + (1,) if b.type.rank == 1 else b.shape
        if isinstance(sa[-1], int) and isinstance(sb[-2], int) and sa[-1] != sb[-2]:
            raise self.fail(f"inner dimensions differ: A {a.type} has K={sa[-1]}, B {b.type} has K={sb[-2]}")
        try:
            batch = broadcast_shapes(sa[:-2], sb[:-2])
        except OpError as e:
            raise self.fail(f"batch dimensions of {a.type} and {b.type} do not broadcast: {e}") from None
        shape = batch + ((sa[-2],) if a.type.rank > 1 else ()) + ((sb[-1],) if b.type.rank > 1 else ())
        return [TensorType(dt, shape)]

    def compute(self, a, b):
        return [np.asarray(np.matmul(widen_narrow(a), widen_narrow(b))).astype(a.dtype, copy=False)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        k = ins[0].shape[-1]
        n = outs[0].numel
        return Cost(2 * n * k if isinstance(k, int) and n is not None else 0, base.bytes)


# ---------------------------------------------------------------------------------------------
# Gemm
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Gemm(OpDef):
    """Y = alpha * A' B' + beta * C, A' = A or A^T (transA), B' = B or B^T (transB), both 2-D;
    C (optional) broadcasts one way to (M, N)."""

    alpha: float = 1.0
    beta: float = 1.0
    transA: int = 0
    transB: int = 0
    inputs: ClassVar = ("A", "B", "C?")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OUT_ELEMWISE_FUSABLE
    since: ClassVar = 13

    def validate(self):
        check_flags(self, "transA", "transB")

    def infer(self, ins):
        a, b = ins[0], ins[1]
        c = ins[2] if len(ins) > 2 else None
        dt = same_dtype(self, ins, MATMUL_TYPES)
        if a.type.rank != 2 or b.type.rank != 2:
            raise self.fail(f"A and B must be 2-D matrices, got {a.type} and {b.type}")
        m, k1 = a.shape[::-1] if self.transA else a.shape
        k2, n = b.shape[::-1] if self.transB else b.shape
        if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
            raise self.fail(f"inner dimensions differ: A' is {m}x{k1} (transA={self.transA}), "
                            f"B' is {k2}x{n} (transB={self.transB})")
        out = [m, n]
        if c is not None:
            if c.type.rank > 2:
                raise self.fail(f"C must have rank <= 2, got {c.type}")
            for i, d in zip(range(2 - c.type.rank, 2), c.shape):
                t = out[i]
                if d == 1:
                    continue
                if isinstance(d, int) and isinstance(t, int) and d != t:
                    raise self.fail(f"C {c.type} does not broadcast to the result shape ({m}, {n})")
                if isinstance(d, int) and not isinstance(t, int):
                    out[i] = d  # C pins the dimension (it must equal it)
        return [TensorType(dt, tuple(out))]

    def compute(self, a, b, c=None):
        x = widen_narrow(a.T if self.transA else a)
        y = widen_narrow(b.T if self.transB else b)
        r = np.matmul(x, y)
        exact_int = r.dtype.kind in "iu"
        if self.alpha != 1.0:
            r = (r.astype(np.float64) if exact_int else r) * self.alpha
        if c is not None:
            cw = widen_narrow(c)
            if self.beta != 1.0:
                cw = (cw.astype(np.float64) if exact_int else cw) * self.beta
            r = r + cw
        with np.errstate(all="ignore"):
            return [np.asarray(r).astype(a.dtype, copy=False)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        k = ins[0].shape[0 if self.transA else 1]
        n = outs[0].numel
        if not isinstance(k, int) or n is None:
            return Cost(0, base.bytes)
        extra = (n if self.alpha != 1.0 else 0) + (2 * n if len(ins) > 2 and ins[2] is not None else 0)
        return Cost(2 * n * k + extra, base.bytes)


# ---------------------------------------------------------------------------------------------
# Einsum
# ---------------------------------------------------------------------------------------------

_ELLIPSIS = "..."


def _parse_term(term: str) -> list[str]:
    """A term as a list of labels, "..." standing for the ellipsis; raises ValueError."""
    labels: list[str] = []
    i = 0
    while i < len(term):
        if term.startswith(_ELLIPSIS, i):
            if _ELLIPSIS in labels:
                raise ValueError(f"term {term!r} has more than one ellipsis")
            labels.append(_ELLIPSIS)
            i += 3
            continue
        ch = term[i]
        if not (ch.isascii() and ch.isalpha()):
            raise ValueError(f"term {term!r} has {ch!r}; labels are ASCII letters (and '...')")
        labels.append(ch)
        i += 1
    return labels


@dataclass(frozen=True, eq=False)
class Einsum(OpDef):
    """Einstein summation: ``equation`` like "bij,bjk->bik" (implicit output: the labels used once,
    in ASCII order, after the ellipsis dimensions); ellipsis dimensions broadcast."""

    equation: str = ""
    inputs: ClassVar = ("Inputs*",)
    outputs: ClassVar = ("Output",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 12

    def validate(self):
        self._terms()

    def _terms(self) -> tuple[list[list[str]], list[str] | None]:
        eq = self.equation.replace(" ", "")
        if not eq:
            raise self.fail("equation is empty; give one like 'ij,jk->ik'")
        try:
            if eq.count("->") > 1:
                raise ValueError("more than one '->'")
            lhs, _, rhs = eq.partition("->")
            terms = [_parse_term(t) for t in lhs.split(",")]
            out = _parse_term(rhs) if "->" in eq else None
        except ValueError as e:
            raise self.fail(f"equation {self.equation!r}: {e}") from None
        if out is not None:
            seen = [label for label in out if label != _ELLIPSIS]
            if len(set(seen)) != len(seen):
                raise self.fail(f"equation {self.equation!r}: the output repeats a label")
            used = {label for t in terms for label in t}
            missing = sorted(set(seen) - used)
            if missing:
                raise self.fail(f"equation {self.equation!r}: output label(s) {', '.join(missing)} appear in no input")
        return terms, out

    def resolve(self, shapes: list[tuple]) -> tuple[str, tuple]:
        """The explicit equation (for np.einsum) and the output shape, for operands of these shapes."""
        terms, out = self._terms()
        if len(terms) != len(shapes):
            raise self.fail(f"equation {self.equation!r} has {len(terms)} operand term(s), got {len(shapes)} inputs")
        dims: dict[str, object] = {}
        ell_shapes = []
        for n, (term, shape) in enumerate(zip(terms, shapes)):
            explicit = [label for label in term if label != _ELLIPSIS]
            if _ELLIPSIS in term:
                ell_rank = len(shape) - len(explicit)
                if ell_rank < 0:
                    raise self.fail(f"operand {n} has rank {len(shape)}, fewer than the {len(explicit)} labels "
                                    f"of its term {''.join(term)!r}")
            elif len(shape) != len(explicit):
                raise self.fail(f"operand {n} has rank {len(shape)}, its term {''.join(term)!r} "
                                f"names {len(explicit)} dimensions")
            pos = 0
            for label in term:
                if label == _ELLIPSIS:
                    ell_shapes.append(tuple(shape[pos:pos + ell_rank]))
                    pos += ell_rank
                    continue
                d = shape[pos]
                pos += 1
                old = dims.get(label, 1)
                if old == 1:  # size-1 dimensions broadcast, as in NumPy
                    dims[label] = d
                elif d != 1:
                    if isinstance(old, int) and isinstance(d, int) and old != d:
                        raise self.fail(f"label {label!r} has size {old} and size {d} in different places")
                    dims[label] = precise_dim(old, d)
        try:
            ell = broadcast_shapes(*ell_shapes) if ell_shapes else ()
        except OpError as e:
            raise self.fail(f"the ellipsis dimensions do not broadcast: {e}") from None
        lhs = ",".join("".join(t) for t in terms)
        if out is None:
            counts: dict[str, int] = {}
            for t in terms:
                for label in t:
                    if label != _ELLIPSIS:
                        counts[label] = counts.get(label, 0) + 1
            out = ([_ELLIPSIS] if ell_shapes else []) + sorted(label for label, c in counts.items() if c == 1)
        elif _ELLIPSIS not in out and ell:
            raise self.fail(f"equation {self.equation!r}: the inputs' ellipsis covers {len(ell)} dimension(s) "
                            "but the output has no '...' for them")
        shape = []
        for label in out:
            shape.extend(ell if label == _ELLIPSIS else (dims[label],))
        return f"{lhs}->{''.join(out)}", tuple(shape)

    def infer(self, ins):
        if not ins:
            raise self.fail("needs at least one input")
        dt = same_dtype(self, ins, STD_NUMERIC)
        _, shape = self.resolve([v.shape for v in ins])
        return [TensorType(dt, shape)]

    def compute(self, *xs):
        eq, _ = self.resolve([x.shape for x in xs])
        r = np.einsum(eq, *[widen_narrow(x) for x in xs], optimize=True)
        return [np.asarray(r).astype(xs[0].dtype, copy=False)]

    def cost(self, ins, outs):
        """About 2 FLOPs per point of the full index space (every label and the ellipsis) per operand pair."""
        base = super().cost(ins, outs)
        terms, _ = self._terms()
        sizes: dict[str, object] = {}
        ell = 1
        for term, t in zip(terms, ins):
            explicit = [label for label in term if label != _ELLIPSIS]
            pos = 0
            for label in term:
                if label == _ELLIPSIS:
                    k = t.rank - len(explicit)
                    ell = max(ell, _product(t.shape[pos:pos + k]) or 0)
                    pos += k
                else:
                    if sizes.get(label, 1) == 1:
                        sizes[label] = t.shape[pos]
                    pos += 1
        total = _product(sizes.values())
        return Cost(2 * total * ell * max(1, len(ins) - 1) if total is not None else 0, base.bytes)


# ---------------------------------------------------------------------------------------------
# Det
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Det(OpDef):
    """Determinants of the square matrices in the last two dimensions: [*, M, M] -> [*]."""

    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 11

    def infer(self, ins):
        (x,) = ins
        dt = same_dtype(self, ins, STD_FLOATS)
        if x.type.rank < 2:
            raise self.fail(f"needs a [*, M, M] input of rank >= 2, got {x.type}")
        m1, m2 = x.shape[-2:]
        if isinstance(m1, int) and isinstance(m2, int) and m1 != m2:
            raise self.fail(f"the matrices of {x.type} are not square ({m1}x{m2})")
        return [TensorType(dt, x.shape[:-2])]

    def compute(self, x):
        return [np.asarray(np.linalg.det(widen_narrow(x))).astype(x.dtype, copy=False)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        m = ins[0].shape[-1]
        n = outs[0].numel
        return Cost((2 * m ** 3 // 3) * n if isinstance(m, int) and n is not None else 0, base.bytes)


OPS = (MatMul, Gemm, Einsum, Det)
