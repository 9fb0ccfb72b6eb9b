"""Reductions: the Reduce* family (opset-18 form, axes as an optional input), ArgMax/ArgMin, CumSum/CumProd.

Every ``Reduce*`` op shares one base: it resolves the axes (the optional ``axes`` input; absent or empty
means all axes, or none with ``noop_with_empty_axes=1``), computes a keepdims reduction in a work type
(narrow floats in f32, integers natively or in f64 where the op needs real arithmetic), then drops the
reduced axes if ``keepdims=0`` and casts back. A reduction over no axes still applies the op's
elementwise part (ReduceSumSquare over no axes is a square), as ONNX specifies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from ..types import DType, TensorType
from .base import STD_NUMERIC, Cost, OpDef, Pattern, check_dtype, known_ints, norm_axis
from .common import check_flags, is_narrow_float, widen_narrow

_INDEX_TYPES = frozenset({DType.i32, DType.i64})


def _work(x: np.ndarray, int_as_float: bool) -> np.ndarray:
    """x in the type the arithmetic runs in: f32 for narrow floats, f64 for integers if asked."""
    if is_narrow_float(x.dtype):
        return x.astype(np.float32)
    if int_as_float and x.dtype.kind in "iu":
        return x.astype(np.float64)
    return x


def _lowest(dt: np.dtype):
    if dt.kind == "b":
        return False
    if dt.kind in "iu":
        return np.iinfo(dt).min
    return -np.inf


def _highest(dt: np.dtype):
    if dt.kind == "b":
        return True
    if dt.kind in "iu":
        return np.iinfo(dt).max
    return np.inf


# ---------------------------------------------------------------------------------------------
# Reduce*
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Reduce(OpDef):
    """Reduce ``data`` over ``axes`` (an optional 1-D int64 input; absent/empty: all axes, or none
    when ``noop_with_empty_axes=1``); ``keepdims=1`` keeps reduced axes as size 1."""

    keepdims: int = 1
    noop_with_empty_axes: int = 0
    inputs: ClassVar = ("data", "axes?")
    outputs: ClassVar = ("reduced",)
    pattern: ClassVar = Pattern.REDUCE
    since: ClassVar = 18
    dtypes: ClassVar[frozenset] = STD_NUMERIC
    #: integers are computed in f64 (and the result converted back) rather than natively
    int_as_float: ClassVar[bool] = False
    #: FLOPs per input element (for cost)
    flops: ClassVar[int] = 1

    def fn(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        """The reduction of x over axes, with keepdims=True (axes may be empty)."""
        raise NotImplementedError

    def validate(self):
        check_flags(self, "keepdims", "noop_with_empty_axes")

    def resolve_axes(self, rank: int, axes: Sequence[int]) -> tuple[int, ...]:
        """The sorted, non-negative axes reduced over, for a given axes list."""
        if not axes:
            return () if self.noop_with_empty_axes else tuple(range(rank))
        if rank == 0:  # a scalar reduced over its "axis" 0/-1 is itself
            for a in axes:
                norm_axis(self, a, rank, "axes value")
            return ()
        out = sorted(norm_axis(self, a, rank, "axes value") for a in axes)
        if len(set(out)) != len(out):
            raise self.fail(f"axes {list(axes)} name an axis twice (rank {rank})")
        return tuple(out)

    def _reduced_shape(self, shape: tuple, axes: tuple[int, ...]) -> tuple:
        if self.keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(shape))
        return tuple(d for i, d in enumerate(shape) if i not in axes)

    def infer(self, ins):
        x = ins[0]
        axes = ins[1] if len(ins) > 1 else None
        check_dtype(self, x, self.dtypes)
        rank = x.type.rank
        if axes is None:
            known: list[int] | None = []
        else:
            check_dtype(self, axes, _INDEX_TYPES, "axes")
            if axes.type.rank != 1:
                raise self.fail(f"axes must be a 1-D tensor, got {axes.type}")
            known = known_ints(axes)
            if known is None and axes.shape[0] == 0:
                known = []
        if known is not None:
            return [TensorType(x.dtype, self._reduced_shape(x.shape, self.resolve_axes(rank, known)))]
        # axes computed at run time: the rank is known, the reduced dimensions are not
        if self.keepdims:
            return [TensorType(x.dtype, tuple(1 if d == 1 else None for d in x.shape))]
        count = axes.shape[0]
        if not isinstance(count, int):
            raise self.fail(f"with keepdims=0 and axes computed at run time, the number of axes (the length "
                            f"of the axes input, {axes.type}) must be static to know the result's rank")
        if count > rank:
            raise self.fail(f"{count} axes given for an input of rank {rank} ({x.type})")
        return [TensorType(x.dtype, (None,) * (rank - count))]

    def compute(self, x, axes=None):
        listed = [] if axes is None else [int(a) for a in np.asarray(axes).ravel()]
        ax = self.resolve_axes(x.ndim, listed)
        w = _work(x, self.int_as_float)
        with np.errstate(all="ignore"):
            y = np.asarray(self.fn(w, ax))
            if not self.keepdims:
                y = y.reshape(self._reduced_shape(x.shape, ax))
            return [y.astype(x.dtype, copy=False)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(self.flops * (ins[0].numel or 0), base.bytes)


@dataclass(frozen=True, eq=False)
class ReduceSum(Reduce):
    """Sum; the empty sum is 0."""

    since: ClassVar = 13

    def fn(self, x, axes):
        return np.sum(x, axis=axes, keepdims=True)


@dataclass(frozen=True, eq=False)
class ReduceMean(Reduce):
    """Arithmetic mean (integers: the f64 mean truncated toward zero)."""

    int_as_float: ClassVar = True

    def fn(self, x, axes):
        return np.mean(x, axis=axes, keepdims=True)


@dataclass(frozen=True, eq=False)
class ReduceMax(Reduce):
    """Maximum; the max of nothing is the lowest value of the type (-inf, INT_MIN, False)."""

    since: ClassVar = 20
    dtypes: ClassVar = STD_NUMERIC | {DType.bool}

    def fn(self, x, axes):
        return np.max(x, axis=axes, keepdims=True, initial=_lowest(x.dtype))


@dataclass(frozen=True, eq=False)
class ReduceMin(Reduce):
    """Minimum; the min of nothing is the highest value of the type (inf, INT_MAX, True)."""

    since: ClassVar = 20
    dtypes: ClassVar = STD_NUMERIC | {DType.bool}

    def fn(self, x, axes):
        return np.min(x, axis=axes, keepdims=True, initial=_highest(x.dtype))


@dataclass(frozen=True, eq=False)
class ReduceProd(Reduce):
    """Product; the empty product is 1."""

    def fn(self, x, axes):
        return np.prod(x, axis=axes, keepdims=True)


@dataclass(frozen=True, eq=False)
class ReduceL1(Reduce):
    """Sum of absolute values."""

    flops: ClassVar = 2

    def fn(self, x, axes):
        return np.sum(np.abs(x), axis=axes, keepdims=True)


@dataclass(frozen=True, eq=False)
class ReduceL2(Reduce):
    """Euclidean norm: sqrt of the sum of squares."""

    int_as_float: ClassVar = True
    flops: ClassVar = 2

    def fn(self, x, axes):
        return np.sqrt(np.sum(x * x, axis=axes, keepdims=True))


@dataclass(frozen=True, eq=False)
class ReduceLogSum(Reduce):
    """log of the sum; the empty set gives -inf."""

    int_as_float: ClassVar = True

    def fn(self, x, axes):
        return np.log(np.sum(x, axis=axes, keepdims=True))


@dataclass(frozen=True, eq=False)
class ReduceLogSumExp(Reduce):
    """log(sum(exp(x))), computed stably around the max; the empty set gives -inf."""

    int_as_float: ClassVar = True
    flops: ClassVar = 10

    def fn(self, x, axes):
        m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
        shift = np.where(np.isfinite(m), m, 0).astype(x.dtype)
        return np.log(np.sum(np.exp(x - shift), axis=axes, keepdims=True)) + shift


@dataclass(frozen=True, eq=False)
class ReduceSumSquare(Reduce):
    """Sum of squares."""

    flops: ClassVar = 2

    def fn(self, x, axes):
        return np.sum(x * x, axis=axes, keepdims=True)


# ---------------------------------------------------------------------------------------------
# ArgMax / ArgMin
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ArgReduce(OpDef):
    """The int64 index of the extreme element along ``axis`` (the first one, or the last one with
    ``select_last_index=1``)."""

    axis: int = 0
    keepdims: int = 1
    select_last_index: int = 0
    inputs: ClassVar = ("data",)
    outputs: ClassVar = ("reduced",)
    pattern: ClassVar = Pattern.REDUCE
    since: ClassVar = 13

    def fn(self, x: np.ndarray, axis: int) -> np.ndarray:
        raise NotImplementedError

    def validate(self):
        check_flags(self, "keepdims", "select_last_index")

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, STD_NUMERIC)
        if x.type.rank == 0:
            raise self.fail(f"needs an input of rank >= 1, got {x.type}")
        ax = norm_axis(self, self.axis, x.type.rank)
        if x.shape[ax] == 0:
            raise self.fail(f"axis {self.axis} of {x.type} is empty: there is no element to select")
        if self.keepdims:
            shape = tuple(1 if i == ax else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i != ax)
        return [TensorType(DType.i64, shape)]

    def compute(self, x):
        ax = norm_axis(self, self.axis, x.ndim)
        w = widen_narrow(x)
        if self.select_last_index:
            idx = (x.shape[ax] - 1) - self.fn(np.flip(w, ax), ax)
        else:
            idx = self.fn(w, ax)
        if self.keepdims:
            idx = np.expand_dims(idx, ax)
        return [np.asarray(idx).astype(np.int64)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(ins[0].numel or 0, base.bytes)


@dataclass(frozen=True, eq=False)
class ArgMax(ArgReduce):
    def fn(self, x, axis):
        return np.argmax(x, axis=axis)


@dataclass(frozen=True, eq=False)
class ArgMin(ArgReduce):
    def fn(self, x, axis):
        return np.argmin(x, axis=axis)


# ---------------------------------------------------------------------------------------------
# CumSum / CumProd
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Cumulative(OpDef):
    """Running reduction of x along the axis given by the scalar ``axis`` input; ``exclusive=1``
    leaves out the current element, ``reverse=1`` runs from the end."""

    exclusive: int = 0
    reverse: int = 0
    inputs: ClassVar = ("x", "axis")
    outputs: ClassVar = ("y",)
    pattern: ClassVar = Pattern.OPAQUE
    parameters: ClassVar = ("axis",)
    #: the value an exclusive scan starts from
    identity: ClassVar[int] = 0

    def fn(self, x: np.ndarray, axis: int) -> np.ndarray:
        raise NotImplementedError

    def validate(self):
        check_flags(self, "exclusive", "reverse")

    def infer(self, ins):
        x, axis = ins
        check_dtype(self, x, STD_NUMERIC)
        check_dtype(self, axis, _INDEX_TYPES, "axis")
        if x.type.rank == 0:
            raise self.fail(f"needs an input of rank >= 1, got {x.type}")
        if axis.type.rank > 1 or axis.type.numel not in (1, None):
            raise self.fail(f"axis must be a scalar (one element), got {axis.type}")
        known = known_ints(axis)
        if known is not None:
            norm_axis(self, known[0], x.type.rank)
        return [x.type]

    def compute(self, x, axis):
        ax = norm_axis(self, int(np.asarray(axis).ravel()[0]), x.ndim)
        w = widen_narrow(x)
        if self.reverse:
            w = np.flip(w, ax)
        n = w.shape[ax]
        if self.exclusive and n > 0:
            start = np.full(w.shape[:ax] + (1,) + w.shape[ax + 1:], self.identity, dtype=w.dtype)
            w = np.concatenate([start, np.take(w, np.arange(n - 1), axis=ax)], axis=ax)
        with np.errstate(all="ignore"):
            y = self.fn(w, ax)
        if self.reverse:
            y = np.flip(y, ax)
        return [np.ascontiguousarray(y).astype(x.dtype, copy=False)]


@dataclass(frozen=True, eq=False)
class CumSum(Cumulative):
    since: ClassVar = 14
    identity: ClassVar = 0

    def fn(self, x, axis):
        return np.cumsum(x, axis=axis, dtype=x.dtype)


@dataclass(frozen=True, eq=False)
class CumProd(Cumulative):
    since: ClassVar = 26
    identity: ClassVar = 1

    def fn(self, x, axis):
        return np.cumprod(x, axis=axis, dtype=x.dtype)


OPS = (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceLogSum,
       ReduceLogSumExp, ReduceSumSquare, ArgMax, ArgMin, CumSum, CumProd)
