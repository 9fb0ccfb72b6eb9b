"""Tensor construction and combination ops: concatenation and splitting (Concat, Split), slicing and
padding (Slice, Pad, CenterCropPad), broadcasting copies (Expand, Tile), generators (ConstantOfShape,
Range, EyeLike) and Trilu.

Like the ``shape`` family (whose shape-operand helpers these ops use), shape-determining operands are read
with ``known_ints`` / ``shape_dims`` where known at compile time; otherwise the result has the right rank
and unknown (``None``) dimensions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import (STD_FLOATS, Cost, OpDef, Pattern, broadcast_shapes, check_dtype, known_ints, norm_axis,
                   same_dtype)
from .common import check_flags
from .shape import INDEX, _ints, _Movement, _norm_axes, _shape_entries, _shape_operand, merge_dims

#: ends at or beyond this mean "to the end of the axis" even when the axis length is not known
_TO_END = 2 ** 31 - 1


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice's effective (start, end, length) on an axis of length ``dim``."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        n = max(0, -(-(end - start) // step))
    else:
        start = min(max(start, 0), dim - 1)
        end = min(max(end, -1), dim - 1)
        n = max(0, -(-(start - end) // -step))
    return start, end, n


def _py_slice(start: int, end: int, step: int) -> slice:
    return slice(start, end if end >= 0 else None, step)


def _zero_of(dtype: np.dtype):
    if dtype == object:
        return ""
    return np.zeros((), dtype)[()]


# ---------------------------------------------------------------------------------------------
# Concatenation and splitting
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)


class Concat(_Movement):
    """Join inputs of one rank and element type along ``axis``."""

    axis: int | None = None
    inputs: ClassVar = ("inputs_0", "inputs*")
    outputs: ClassVar = ("concat_result",)
    since: ClassVar = 4

    def validate(self):
        if self.axis is None:
            raise self.fail("axis is required")

    def infer(self, ins):
        if any(v is None for v in ins):
            raise self.fail("inputs may not be missing")
        dt = same_dtype(self, ins)
        ranks = {v.type.rank for v in ins}
        if len(ranks) != 1:
            raise self.fail(f"inputs must share one rank, got {', '.join(str(v.type) for v in ins)}")
        (r,) = ranks
        if r == 0:
            raise self.fail("cannot concatenate scalars (rank 0)")
        a = norm_axis(self, self.axis, r)
        out = list(ins[0].shape)
        for v in ins[1:]:
            for i, d in enumerate(v.shape):
                if i != a:
                    try:
                        out[i] = merge_dims(out[i], d)
                    except ValueError:
                        raise self.fail(f"dimension {i} differs between inputs: "
                                        f"{', '.join(str(v.type) for v in ins)}") from None
        sizes = [v.shape[a] for v in ins]
        nonzero = [d for d in sizes if d != 0]
        if all(isinstance(d, int) for d in sizes):
            out[a] = sum(sizes)
        elif len(nonzero) == 1:
            out[a] = nonzero[0]
        else:
            out[a] = None
        return [TensorType(dt, tuple(out))]

    def compute(self, *xs):
        return [np.concatenate(xs, axis=self.axis)]


@dataclass(frozen=True, eq=False)


class Split(_Movement):
    """Split along ``axis`` into parts of the sizes in ``split``, or into ``num_outputs`` equal parts (the
    last one smaller when the length does not divide)."""

    axis: int = 0
    num_outputs: int | None = None
    inputs: ClassVar = ("input", "split?")
    outputs: ClassVar = ("outputs*",)
    since: ClassVar = 18

    def validate(self):
        if self.num_outputs is not None and self.num_outputs < 1:
            raise self.fail(f"num_outputs must be at least 1, got {self.num_outputs}")

    def _equal_sizes(self, d: int) -> list[int]:
        n = self.num_outputs
        chunk = -(-d // n)
        last = d - chunk * (n - 1)
        if last < 0:
            raise self.fail(f"cannot split length {d} into {n} parts of {chunk} with a smaller last part")
        return [chunk] * (n - 1) + [last]

    def infer(self, ins):
        x, split = (list(ins) + [None])[:2]
        a = norm_axis(self, self.axis, x.type.rank)
        d = x.shape[a]
        if split is not None:
            n = _shape_operand(self, split, "split")
            sizes = known_ints(split)
            if sizes is None:
                if n is None:
                    n = self.num_outputs
                if n is None:
                    raise self.fail("the number of parts must be known: the split operand needs a static length")
                sizes = [None] * n
            else:
                if any(s < 0 for s in sizes):
                    raise self.fail(f"split sizes {sizes} must be non-negative")
                if isinstance(d, int) and sum(sizes) != d:
                    raise self.fail(f"split sizes {sizes} sum to {sum(sizes)}, not the axis length {d} of {x.type}")
            if self.num_outputs is not None and self.num_outputs != len(sizes):
                raise self.fail(f"num_outputs={self.num_outputs} disagrees with the {len(sizes)} split sizes")
        elif self.num_outputs is None:
            raise self.fail("needs the split operand or num_outputs")
        elif isinstance(d, int):
            sizes = self._equal_sizes(d)
        else:
            sizes = [d if self.num_outputs == 1 else None] * self.num_outputs
        return [TensorType(x.dtype, x.shape[:a] + (s,) + x.shape[a + 1:]) for s in sizes]

    def compute(self, x, split=None):
        a = self.axis % x.ndim
        sizes = _ints(split) if split is not None else self._equal_sizes(x.shape[a])
        return np.split(x, np.cumsum(sizes)[:-1], axis=a)


# ---------------------------------------------------------------------------------------------
# Slicing and padding
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)


class Slice(_Movement):
    """Strided slices along ``axes`` (all axes by default); starts/ends are clamped, negative values
    count from the end, negative steps go backwards."""

    inputs: ClassVar = ("data", "starts", "ends", "axes?", "steps?")
    outputs: ClassVar = ("output",)
    since: ClassVar = 11

    def _plan(self, rank, starts, ends, axes, steps):
        if len(starts) != len(ends):
            raise self.fail(f"starts {starts} and ends {ends} differ in length")
        if axes is None:
            if len(starts) > rank:
                raise self.fail(f"{len(starts)} starts for an input of rank {rank}")
            axes = list(range(len(starts)))
        if steps is None:
            steps = [1] * len(starts)
        if len(axes) != len(starts) or len(steps) != len(starts):
            raise self.fail(f"starts, ends, axes, steps must have one length, got {len(starts)}, {len(ends)}, "
                            f"{len(axes)}, {len(steps)}")
        if 0 in steps:
            raise self.fail(f"steps {steps} may not contain 0")
        return list(zip(_norm_axes(self, axes, rank), starts, ends, steps))

    def infer(self, ins):
        x, starts_v, ends_v, axes_v, steps_v = (list(ins) + [None] * 3)[:5]
        lens = set()
        for what, v in (("starts", starts_v), ("ends", ends_v), ("axes", axes_v), ("steps", steps_v)):
            if v is not None:
                lens.add(_shape_operand(self, v, what))
        if len(lens - {None}) > 1:
            raise self.fail(f"starts, ends, axes, steps must have one length, got {starts_v.type}, {ends_v.type}"
                            + "".join(f", {v.type}" for v in (axes_v, steps_v) if v is not None))
        starts, ends = known_ints(starts_v), known_ints(ends_v)
        axes = known_ints(axes_v) if axes_v is not None else None
        steps = known_ints(steps_v) if steps_v is not None else None
        r = x.type.rank
        out = list(x.shape)
        if axes_v is not None and axes is None:
            return [TensorType(x.dtype, (None,) * r)]
        if starts is None or ends is None or (steps_v is not None and steps is None):
            n = next(iter(lens - {None}), None)
            if axes is not None:
                touched = _norm_axes(self, axes, r)
            elif n is not None:
                touched = range(min(n, r))
            else:
                touched = range(r)
            for a in touched:
                out[a] = None
            return [TensorType(x.dtype, tuple(out))]
        for a, s, e, st in self._plan(r, starts, ends, axes, steps):
            d = x.shape[a]
            if isinstance(d, int):
                out[a] = _slice_range(d, s, e, st)[2]
            elif ((st == 1 and (s == 0 or s <= -_TO_END - 1) and e >= _TO_END)
                  or (st == -1 and (s == -1 or s >= _TO_END) and e <= -_TO_END - 1)):
                out[a] = d  # the whole axis (reversed for step -1)
            else:
                out[a] = None
        return [TensorType(x.dtype, tuple(out))]

    def compute(self, x, starts, ends, axes=None, steps=None):
        index = [slice(None)] * x.ndim
        for a, s, e, st in self._plan(x.ndim, _ints(starts), _ints(ends), _ints(axes), _ints(steps)):
            s, e, _ = _slice_range(x.shape[a], s, e, st)
            index[a] = _py_slice(s, e, st)
        return [x[tuple(index)]]


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_index(n: int, before: int, after: int, mode: str) -> np.ndarray:
    """Source indices along one axis for edge/reflect/wrap padding (negative pads crop)."""
    idx = np.arange(-before, n + after)
    if mode == "edge":
        return np.clip(idx, 0, n - 1)
    if mode == "wrap":
        return np.mod(idx, n)
    if n == 1:
        return np.zeros_like(idx)
    period = 2 * (n - 1)
    m = np.mod(idx, period)
    return np.where(m >= n, period - m, m)


@dataclass(frozen=True, eq=False)


class Pad(_Movement):
    """Pad (or crop, for negative pads) with a constant, the reflection, the edge values or a wrap-around.
    ``pads`` is [begin_0, ..., begin_k, end_0, ..., end_k] for the ``axes`` (all axes by default)."""

    mode: str = "constant"
    inputs: ClassVar = ("data", "pads", "constant_value?", "axes?")
    outputs: ClassVar = ("output",)
    since: ClassVar = 18

    def validate(self):
        if self.mode not in _PAD_MODES:
            raise self.fail(f"mode must be one of {', '.join(_PAD_MODES)}, got {self.mode!r}")

    def _widths(self, rank, pads, axes):
        axes = list(range(rank)) if axes is None else _norm_axes(self, axes, rank)
        if len(pads) != 2 * len(axes):
            raise self.fail(f"pads {pads} must hold 2 values for each of the {len(axes)} axes")
        widths = [(0, 0)] * rank
        for i, a in enumerate(axes):
            widths[a] = (pads[i], pads[i + len(axes)])
        return widths

    def infer(self, ins):
        x, pads_v, value_v, axes_v = (list(ins) + [None] * 3)[:4]
        _shape_operand(self, pads_v, "pads")
        if value_v is not None:
            if value_v.dtype != x.dtype:
                raise self.fail(f"constant_value has element type {value_v.dtype}, the data {x.dtype}")
            if value_v.type.numel not in (1, None):
                raise self.fail(f"constant_value must be a scalar, got {value_v.type}")
        if axes_v is not None:
            _shape_operand(self, axes_v, "axes")
        r = x.type.rank
        pads = known_ints(pads_v)
        axes = known_ints(axes_v) if axes_v is not None else None
        if axes_v is not None and axes is None:
            return [TensorType(x.dtype, (None,) * r)]
        if pads is None:
            touched = range(r) if axes is None else _norm_axes(self, axes, r)
            return [TensorType(x.dtype, tuple(None if i in touched else d for i, d in enumerate(x.shape)))]
        out = []
        for i, (d, (lo, hi)) in enumerate(zip(x.shape, self._widths(r, pads, axes))):
            if isinstance(d, int):
                if d + lo + hi < 0:
                    raise self.fail(f"pads {pads} crop more than the {d} elements of axis {i} of {x.type}")
                if self.mode != "constant" and (lo > 0 or hi > 0) and d + min(lo, 0) + min(hi, 0) <= 0:
                    raise self.fail(f"{self.mode} padding needs a non-empty axis {i} (of {x.type})")
                out.append(d + lo + hi)
            else:
                out.append(d if lo == hi == 0 else None)
        return [TensorType(x.dtype, tuple(out))]

    def compute(self, x, pads, constant_value=None, axes=None):
        widths = self._widths(x.ndim, _ints(pads), _ints(axes))
        if self.mode == "constant":
            # output position p reads input p - lo; a crop past one end leaves only padding
            value = _zero_of(x.dtype) if constant_value is None else np.asarray(constant_value).ravel()[0]
            out = np.full([d + lo + hi for d, (lo, hi) in zip(x.shape, widths)], value, dtype=x.dtype)
            src, dst = [], []
            for d, (lo, hi) in zip(x.shape, widths):
                a = max(0, -lo)
                b = max(a, min(d, d + hi))
                src.append(slice(a, b))
                dst.append(slice(a + lo, b + lo))
            out[tuple(dst)] = x[tuple(src)]
            return [out]
        # negative pads crop first, then the rest pads from the cropped data
        x = x[tuple(slice(-min(lo, 0), x.shape[i] + min(hi, 0)) for i, (lo, hi) in enumerate(widths))]
        for i, (lo, hi) in enumerate(widths):
            lo, hi = max(lo, 0), max(hi, 0)
            if lo or hi:
                x = np.take(x, _pad_index(x.shape[i], lo, hi, self.mode), axis=i)
        return [x]


@dataclass(frozen=True, eq=False)


class CenterCropPad(_Movement):
    """Crop or zero-pad ``axes`` (all by default) to ``shape``, centered (odd crops start rounded down,
    odd pads put the extra element at the end)."""

    axes: tuple[int, ...] | None = None
    inputs: ClassVar = ("input_data", "shape")
    outputs: ClassVar = ("output_data",)
    since: ClassVar = 18

    def _axes(self, rank):
        return list(range(rank)) if self.axes is None else _norm_axes(self, self.axes, rank)

    def infer(self, ins):
        x, s = ins
        n = _shape_operand(self, s, "shape")
        axes = self._axes(x.type.rank)
        if n is not None and n != len(axes):
            raise self.fail(f"shape {s.type} must have one entry for each of the axes {axes}")
        target = known_ints(s)
        out = list(x.shape)
        for i, a in enumerate(axes):
            if target is None:
                out[a] = None
            elif target[i] < 0:
                raise self.fail(f"shape {target} has a negative size")
            else:
                out[a] = target[i]
        return [TensorType(x.dtype, tuple(out))]

    def compute(self, x, shape):
        target = _ints(shape)
        src = [slice(None)] * x.ndim
        dst = [slice(None)] * x.ndim
        out_shape = list(x.shape)
        for a, t in zip(self._axes(x.ndim), target):
            d = x.shape[a]
            out_shape[a] = t
            if d >= t:
                lo = (d - t) // 2
                src[a] = slice(lo, lo + t)
            else:
                lo = (t - d) // 2
                dst[a] = slice(lo, lo + d)
        out = np.full(out_shape, _zero_of(x.dtype), dtype=x.dtype)
        out[tuple(dst)] = x[tuple(src)]
        return [out]


# ---------------------------------------------------------------------------------------------
# Broadcasting copies
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)


class Expand(_Movement):
    """Broadcast to ``shape`` (two-way: shape entries of 1 keep the input's dimension)."""

    inputs: ClassVar = ("input", "shape")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.BROADCAST
    since: ClassVar = 8

    def infer(self, ins):
        x, s = ins
        dims = _shape_entries(self, s, "shape", "fixes the output rank")
        try:
            out = broadcast_shapes(x.shape, tuple(dims))
        except ValueError as e:
            raise self.fail(f"cannot expand {x.type} to {dims}: {e}") from None
        return [TensorType(x.dtype, out)]

    def compute(self, x, shape):
        out = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
        return [np.array(np.broadcast_to(x, out))]


@dataclass(frozen=True, eq=False)


class Tile(_Movement):
    """Repeat the input ``repeats[i]`` times along each axis i."""

    inputs: ClassVar = ("input", "repeats")
    outputs: ClassVar = ("output",)
    since: ClassVar = 6

    def infer(self, ins):
        x, rep_v = ins
        n = _shape_operand(self, rep_v, "repeats")
        r = x.type.rank
        if n is not None and n != r:
            raise self.fail(f"repeats {rep_v.type} must have one entry for each of the {r} axes of {x.type}")
        reps = known_ints(rep_v)
        if reps is None:
            return [TensorType(x.dtype, (None,) * r)]
        if any(k < 0 for k in reps):
            raise self.fail(f"repeats {reps} must be non-negative")
        out = [d * k if isinstance(d, int) else (d if k == 1 else 0 if k == 0 else None)
               for d, k in zip(x.shape, reps)]
        return [TensorType(x.dtype, tuple(out))]

    def compute(self, x, repeats):
        return [np.tile(x, _ints(repeats))]


# ---------------------------------------------------------------------------------------------
# Generators
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)


class ConstantOfShape(OpDef):
    """A tensor of the given shape filled with ``value`` (a one-element tensor; default float32 0)."""

    value: np.ndarray | None = None
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 9

    def validate(self):
        if self.value is not None:
            if self.value.size != 1:
                raise self.fail(f"value must hold exactly one element, got shape {list(self.value.shape)}")
            try:
                DType.from_numpy(self.value.dtype)
            except TypeError as e:
                raise self.fail(f"value: {e}") from None

    @property
    def fill(self) -> np.ndarray:
        return np.zeros((), np.float32) if self.value is None else self.value.reshape(())

    def infer(self, ins):
        (s,) = ins
        dims = _shape_entries(self, s, "input shape")
        return [TensorType(DType.from_numpy(self.fill.dtype), tuple(dims))]

    def compute(self, shape):
        return [np.full(_ints(shape), self.fill, dtype=self.fill.dtype)]

    def cost(self, ins, outs):
        return Cost(0, outs[0].nbytes or 0)


_RANGE_TYPES = frozenset({DType.f32, DType.f64, DType.i16, DType.i32, DType.i64, DType.f16, DType.bf16})


@dataclass(frozen=True, eq=False)


class Range(OpDef):
    """[start, start + delta, ...) up to ``limit`` (exclusive): max(ceil((limit - start) / delta), 0)
    elements. Half-precision inputs are computed in float32 when ``stash_type`` is 1 (float)."""

    stash_type: int = 1
    inputs: ClassVar = ("start", "limit", "delta")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 27

    def validate(self):
        try:
            DType.from_onnx(self.stash_type)
        except TypeError:
            raise self.fail(f"stash_type {self.stash_type} is not an element type code") from None

    def _work_dtype(self, dt: np.dtype) -> np.dtype:
        if dt.kind in "iu" or dt == np.float64 or dt == np.float32:
            return dt
        return DType.from_onnx(self.stash_type).np if self.stash_type in (1, 11) else dt

    def _count(self, start, limit, delta) -> int:
        if start.dtype.kind in "iu":
            s, l, d = int(start), int(limit), int(delta)
            if d == 0:
                raise self.fail("delta may not be 0")
            return max(0, -((s - l) // d))
        s, l, d = float(start), float(limit), float(delta)
        if d == 0:
            raise self.fail("delta may not be 0")
        return max(0, int(math.ceil((l - s) / d)))

    def infer(self, ins):
        dt = same_dtype(self, ins, _RANGE_TYPES)
        for what, v in zip(self.inputs, ins):
            if v.type.numel not in (1, None) or v.type.rank > 1:
                raise self.fail(f"{what} must be a scalar, got {v.type}")
        if all(v.known is not None for v in ins):
            work = self._work_dtype(dt.np)
            vals = [np.asarray(v.known).reshape(()).astype(work) for v in ins]
            return [TensorType(dt, (self._count(*vals),))]
        return [TensorType(dt, (None,))]

    def compute(self, start, limit, delta):
        out_dt = start.dtype
        work = self._work_dtype(out_dt)
        s, l, d = (np.asarray(a).reshape(()).astype(work) for a in (start, limit, delta))
        n = self._count(s, l, d)
        return [(s + np.arange(n, dtype=work) * d).astype(out_dt)]


@dataclass(frozen=True, eq=False)


class EyeLike(OpDef):
    """A 2-D tensor of the input's shape with ones on diagonal ``k`` (of element type ``dtype``, by
    default the input's)."""

    dtype: DType | None = None
    k: int = 0
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.INJECTIVE
    since: ClassVar = 9

    _TYPES: ClassVar = frozenset(DType) - {DType.string, DType.c64, DType.c128} - \
        {d for d in DType if d.is_float and d not in STD_FLOATS} - {DType.u4, DType.i4, DType.u2, DType.i2}

    def validate(self):
        if self.dtype is not None and self.dtype not in self._TYPES:
            raise self.fail(f"dtype {self.dtype} is not supported (supported: "
                            f"{', '.join(sorted(d.short for d in self._TYPES))})")

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, self._TYPES)
        if x.type.rank != 2:
            raise self.fail(f"input must be 2-D, got {x.type}")
        return [TensorType(self.dtype or x.dtype, x.shape)]

    def compute(self, x):
        dt = (self.dtype.np if self.dtype is not None else x.dtype)
        return [np.eye(x.shape[0], x.shape[1], k=self.k, dtype=dt)]

    def cost(self, ins, outs):
        return Cost(0, outs[0].nbytes or 0)


@dataclass(frozen=True, eq=False)


class Trilu(_Movement):
    """Keep the upper (``upper=1``: j - i >= k) or lower (j - i <= k) triangle of the last two axes,
    zeroing the rest."""

    upper: int = 1
    inputs: ClassVar = ("input", "k?")
    outputs: ClassVar = ("output",)
    parameters: ClassVar = ("k",)
    since: ClassVar = 14

    def validate(self):
        check_flags(self, "upper")

    def infer(self, ins):
        x, k = (list(ins) + [None])[:2]
        if x.type.rank < 2:
            raise self.fail(f"input must have rank 2 or more, got {x.type}")
        if k is not None:
            check_dtype(self, k, INDEX, "k")
            if k.type.numel not in (1, None) or k.type.rank > 1:
                raise self.fail(f"k must be a scalar, got {k.type}")
        return [x.type]

    def compute(self, x, k=None):
        kk = 0 if k is None else int(np.asarray(k).ravel()[0])
        rows, cols = x.shape[-2:]
        diff = np.arange(cols)[None, :] - np.arange(rows)[:, None]
        keep = diff >= kk if self.upper else diff <= kk
        return [np.where(keep, x, np.asarray(_zero_of(x.dtype), dtype=x.dtype))]


OPS = (Concat, Split, Slice, Pad, CenterCropPad, Expand, Tile, ConstantOfShape, Range, EyeLike, Trilu)
