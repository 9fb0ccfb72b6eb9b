"""Pooling ops: MaxPool, AveragePool, LpPool, their Global forms, MaxUnpool and MaxRoiPool.

Windowed pools run one vectorized step per kernel tap over a padded buffer (a strided slice per tap),
so the work is K whole-tensor operations, never a Python loop over outputs. The window geometry
(pads, ``auto_pad``, strides, dilations, ``ceil_mode``) is the one Conv uses (``conv.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import STD_FLOATS, Cost, OpDef, Pattern, check_dtype, known_ints
from .common import check_flags, compute_dtype, is_static
from .conv import check_window_attrs, pad_to, resolve_geometry, spatial_attrs, tap, window_dims

_MAXPOOL_DTYPES = STD_FLOATS | {DType.i8, DType.u8}


def _tap_counts(sizes, pads_begin, pads_end, out, ks, strides, dilations, include_pad: bool) -> np.ndarray:
    """Number of kernel taps of each output window that fall inside the input (or, with
    ``include_pad``, inside the explicitly padded input); separable, so an outer product of 1-D counts."""
    counts = np.ones((1,) * len(out), dtype=np.int64)
    for i, (size, pb, pe, o, k, s, d) in enumerate(zip(sizes, pads_begin, pads_end, out, ks, strides, dilations)):
        pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - pb  # input coordinate of each tap
        lo, hi = (-pb, size + pe) if include_pad else (0, size)
        c = ((pos >= lo) & (pos < hi)).sum(axis=1)
        shape = [1] * len(out)
        shape[i] = o
        counts = counts * c.reshape(shape)
    return counts


@dataclass(frozen=True, eq=False)
class _Pool(OpDef):
    """Base of the windowed pools: the attributes and shape inference they share."""

    auto_pad: str = "NOTSET"
    ceil_mode: int = 0
    dilations: tuple[int, ...] = ()
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE
    dtypes: ClassVar[frozenset] = STD_FLOATS

    def validate(self):
        if not self.kernel_shape:
            raise self.fail("kernel_shape is required (the pooling window's size per spatial axis)")
        check_window_attrs(self, auto_pad=self.auto_pad, strides=self.strides, dilations=self.dilations,
                           pads=self.pads, kernel_shape=self.kernel_shape)
        nd = len(self.kernel_shape)
        dil = self.dilations if len(self.dilations) == nd else (1,) * nd
        extent = [(k - 1) * d + 1 for k, d in zip(self.kernel_shape, dil)]
        if len(self.pads) == 2 * nd and any(p >= extent[i % nd] for i, p in enumerate(self.pads)):
            raise self.fail(f"pads {list(self.pads)} must each be smaller than the window's extent along their "
                            f"axis ((kernel_shape - 1) * dilations + 1 = {extent}): else a window lies wholly in "
                            f"the padding")
        check_flags(self, "ceil_mode")

    def _attrs(self, rank: int):
        nd = len(self.kernel_shape)
        if rank != nd + 2:
            raise self.fail(f"kernel_shape {list(self.kernel_shape)} has {nd} spatial axes, so X must have rank "
                            f"{nd + 2} (N, C, spatial...), got rank {rank}")
        return spatial_attrs(self, nd, self.strides, self.dilations, self.pads)

    def _out_type(self, x) -> TensorType:
        check_dtype(self, x, self.dtypes, "X")
        strides, dilations, pads = self._attrs(x.type.rank)
        dims = window_dims(self, x.shape[2:], self.kernel_shape, strides, dilations, pads, self.auto_pad,
                           bool(self.ceil_mode))
        return x.type.with_shape(x.shape[:2] + dims)

    def infer(self, ins):
        return [self._out_type(ins[0])]

    def _window(self, x):
        """(padded buffer, geometry) for compute: the buffer holds exactly the windows' extent."""
        strides, dilations, pads = self._attrs(x.ndim)
        ks = self.kernel_shape
        out, pb, pe = resolve_geometry(self, x.shape[2:], ks, strides, dilations, pads, self.auto_pad,
                                       bool(self.ceil_mode))
        lengths = [(o - 1) * s + (k - 1) * d + 1 for o, s, d, k in zip(out, strides, dilations, ks)]
        return lengths, out, pb, pe, strides, dilations

    def _sum_taps(self, xp, out, strides, dilations) -> np.ndarray:
        """The sum over each window of the padded buffer ``xp`` (in its element type)."""
        acc = np.zeros(xp.shape[:2] + tuple(out), dtype=xp.dtype)
        for kk in np.ndindex(*self.kernel_shape):
            acc += xp[tap(kk, strides, dilations, out)]
        return acc

    def cost(self, ins, outs):
        return Cost(math.prod(self.kernel_shape) * (outs[0].numel or 0), super().cost(ins, outs).bytes)


@dataclass(frozen=True, eq=False)
class MaxPool(_Pool):
    """The max of each window (padding never wins); Indices: the flat index of each max in X (row-major,
    or column-major over the spatial axes with storage_order=1)."""

    storage_order: int = 0
    outputs: ClassVar = ("Y", "Indices")
    dtypes: ClassVar = _MAXPOOL_DTYPES
    since: ClassVar = 12

    def validate(self):
        super().validate()
        if self.storage_order not in (0, 1):
            raise self.fail(f"storage_order must be 0 (row-major) or 1 (column-major), got {self.storage_order}")

    def infer(self, ins):
        y = self._out_type(ins[0])
        return [y, y.with_dtype(DType.i64)]

    def compute(self, x):
        lengths, out, pb, _, strides, dilations = self._window(x)
        nd = len(out)
        fill = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf  # never wins: `valid` masks it
        xp = pad_to(x, pb, lengths, fill)
        sizes = x.shape[2:]
        taps = list(np.ndindex(*self.kernel_shape))
        y = None
        for kk in taps:
            v = xp[tap(kk, strides, dilations, out)]
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        # Indices: the first tap (in row-major kernel order) inside the input that holds the max
        if self.storage_order:
            sp_strides = [math.prod(sizes[:i]) for i in range(nd)]
        else:
            sp_strides = [math.prod(sizes[i + 1:]) for i in range(nd)]
        arg = np.zeros(y.shape, dtype=np.int64)
        hit = np.empty(y.shape, dtype=bool)
        for kk in reversed(taps):
            valid = np.ones((1,) * nd, dtype=bool)
            flat = np.zeros((1,) * nd, dtype=np.int64)
            for i in range(nd):
                shape = [1] * nd
                shape[i] = out[i]
                c = (np.arange(out[i]) * strides[i] + kk[i] * dilations[i] - pb[i]).reshape(shape)
                valid = valid & (c >= 0) & (c < sizes[i])
                flat = flat + c * sp_strides[i]
            np.equal(xp[tap(kk, strides, dilations, out)], y, out=hit)
            if not valid.all():
                hit &= valid
            np.copyto(arg, flat, where=hit)
        plane = math.prod(sizes)
        base = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2] + (1,) * nd) * plane
        return [y, arg + base]


@dataclass(frozen=True, eq=False)
class AveragePool(_Pool):
    """The mean of each window; padding counts toward the divisor only with count_include_pad=1 (the
    extension ceil_mode adds past the pads never does)."""

    count_include_pad: int = 0
    since: ClassVar = 19

    def validate(self):
        super().validate()
        check_flags(self, "count_include_pad")

    def compute(self, x):
        lengths, out, pb, pe, strides, dilations = self._window(x)
        ct = compute_dtype(x.dtype)
        acc = self._sum_taps(pad_to(x.astype(ct, copy=False), pb, lengths, 0), out, strides, dilations)
        counts = _tap_counts(x.shape[2:], pb, pe, out, self.kernel_shape, strides, dilations,
                             bool(self.count_include_pad))
        with np.errstate(invalid="ignore", divide="ignore"):
            acc /= counts.astype(ct)
        return [acc.astype(x.dtype, copy=False)]


@dataclass(frozen=True, eq=False)
class LpPool(_Pool):
    """(sum of |x|^p over each window) ^ (1/p); padding adds zeros."""

    p: int = 2
    since: ClassVar = 18

    def validate(self):
        super().validate()
        if self.p < 1:
            raise self.fail(f"p must be a positive int, got {self.p}")

    def compute(self, x):
        lengths, out, pb, _, strides, dilations = self._window(x)
        ct = compute_dtype(x.dtype)
        a = np.abs(x.astype(ct, copy=False))
        a = a if self.p == 1 else a * a if self.p == 2 else a ** self.p
        acc = self._sum_taps(pad_to(a, pb, lengths, 0), out, strides, dilations)
        y = acc if self.p == 1 else np.sqrt(acc) if self.p == 2 else acc ** (1.0 / self.p)
        return [y.astype(x.dtype, copy=False)]


# ---------------------------------------------------------------------------------------------
# Global pools
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _GlobalPool(OpDef):
    """Pool over all spatial axes: (N, C, D1, ...) -> (N, C, 1, ...)."""

    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.REDUCE
    dtypes: ClassVar[frozenset] = STD_FLOATS

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, self.dtypes, "X")
        if x.type.rank < 3:
            raise self.fail(f"X must have rank >= 3 (N, C, spatial...), got {x.type}")
        return [x.type.with_shape(x.shape[:2] + (1,) * (x.type.rank - 2))]

    def reduce(self, xf: np.ndarray, axes: tuple) -> np.ndarray:
        raise NotImplementedError

    def compute(self, x):
        axes = tuple(range(2, x.ndim))
        y = self.reduce(x.astype(compute_dtype(x.dtype), copy=False), axes)
        return [np.asarray(y).astype(x.dtype, copy=False)]

    def cost(self, ins, outs):
        return Cost(ins[0].numel or 0, super().cost(ins, outs).bytes)


@dataclass(frozen=True, eq=False)
class GlobalAveragePool(_GlobalPool):
    def reduce(self, xf, axes):
        return xf.mean(axis=axes, keepdims=True)


@dataclass(frozen=True, eq=False)
class GlobalMaxPool(_GlobalPool):
    def reduce(self, xf, axes):
        return xf.max(axis=axes, keepdims=True)


@dataclass(frozen=True, eq=False)
class GlobalLpPool(_GlobalPool):
    p: int = 2
    since: ClassVar = 2

    def validate(self):
        if self.p < 1:
            raise self.fail(f"p must be a positive int, got {self.p}")

    def reduce(self, xf, axes):
        a = np.abs(xf)
        return (a ** self.p).sum(axis=axes, keepdims=True) ** (1.0 / self.p)


# ---------------------------------------------------------------------------------------------
# MaxUnpool
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class MaxUnpool(OpDef):
    """The partial inverse of MaxPool: X scattered to the flat positions I (MaxPool's Indices) of a
    zero tensor of the default unpooled size ((in - 1) * stride + kernel - pads); with ``output_shape``
    that tensor is then zero-extended at the end of each axis to that shape, as ONNX's reference and
    conformance case read it (a smaller ``output_shape`` is refused, as they refuse it)."""

    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    inputs: ClassVar = ("X", "I", "output_shape?")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 11

    def validate(self):
        if not self.kernel_shape:
            raise self.fail("kernel_shape is required (the pooling window's size per spatial axis)")
        check_window_attrs(self, strides=self.strides, pads=self.pads, kernel_shape=self.kernel_shape)

    def _default_dims(self, in_dims):
        nd = len(self.kernel_shape)
        strides, _, pads = spatial_attrs(self, nd, self.strides, (), self.pads)
        return tuple((d - 1) * strides[i] + self.kernel_shape[i] - pads[i] - pads[nd + i] if is_static(d) else None
                     for i, d in enumerate(in_dims))

    def infer(self, ins):
        x, idx, shape = (list(ins) + [None])[:3]
        check_dtype(self, x, STD_FLOATS, "X")
        check_dtype(self, idx, {DType.i64}, "I")
        nd = len(self.kernel_shape)
        if x.type.rank != nd + 2:
            raise self.fail(f"kernel_shape {list(self.kernel_shape)} has {nd} spatial axes, so X must have rank "
                            f"{nd + 2}, got {x.type}")
        if idx.type.rank != x.type.rank or any(is_static(a) and is_static(b) and a != b
                                              for a, b in zip(idx.shape, x.shape)):
            raise self.fail(f"I must have X's shape {x.type}, got {idx.type}")
        if shape is None:
            return [x.type.with_shape(x.shape[:2] + self._default_dims(x.shape[2:]))]
        check_dtype(self, shape, {DType.i64}, "output_shape")
        if shape.type.rank != 1 or (is_static(shape.shape[0]) and shape.shape[0] != x.type.rank):
            raise self.fail(f"output_shape must be a 1-D int64 tensor of X's rank {x.type.rank}, got {shape.type}")
        dims = known_ints(shape)
        if dims is None:
            return [x.type.with_shape(x.shape[:2] + (None,) * nd)]
        self._check_output_shape(dims, x.shape[:2] + self._default_dims(x.shape[2:]))
        return [x.type.with_shape(tuple(dims))]

    def _check_output_shape(self, dims, base) -> None:
        """output_shape may add zeros at the end of an axis, not cut the unpooled values off (ONNX
        Runtime and ONNX's reference refuse it too)."""
        if any(is_static(b) and d < b for d, b in zip(dims, base)):
            raise self.fail(f"output_shape {list(dims)} is smaller than the unpooled shape "
                            f"{[b if is_static(b) else '?' for b in base]}")

    def compute(self, x, idx, shape=None):
        base = x.shape[:2] + self._default_dims(x.shape[2:])
        y = np.zeros(base, dtype=x.dtype)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= y.size):
            raise self.fail(f"index out of range [0, {y.size}) of the unpooled shape {list(base)}")
        y.reshape(-1)[flat] = x.reshape(-1)
        if shape is None:
            return [y]
        # ONNX's reading: indices address the default unpooled shape; output_shape pads (or crops) its end
        dims = tuple(int(v) for v in shape)
        self._check_output_shape(dims, base)
        out = np.zeros(dims, dtype=x.dtype)
        common = tuple(slice(0, min(a, b)) for a, b in zip(dims, base))
        out[common] = y[common]
        return [out]


# ---------------------------------------------------------------------------------------------
# MaxRoiPool
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class MaxRoiPool(OpDef):
    """ROI max pooling (Fast R-CNN): each ROI (batch_index, x1, y1, x2, y2), scaled by spatial_scale and
    rounded, is split into pooled_shape bins; each bin's max (0 for an empty bin)."""

    pooled_shape: tuple[int, ...] = ()
    spatial_scale: float = 1.0
    inputs: ClassVar = ("X", "rois")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        if len(self.pooled_shape) != 2 or any(s < 1 for s in self.pooled_shape):
            raise self.fail(f"pooled_shape must be two positive ints (height, width), got {list(self.pooled_shape)}")

    def infer(self, ins):
        x, rois = ins
        check_dtype(self, x, STD_FLOATS, "X")
        if rois.dtype != x.dtype:
            raise self.fail(f"rois must have X's element type {x.dtype}, got {rois.dtype}")
        if x.type.rank != 4:
            raise self.fail(f"X must have rank 4 (N, C, H, W), got {x.type}")
        if rois.type.rank != 2 or (is_static(rois.shape[1]) and rois.shape[1] != 5):
            raise self.fail(f"rois must have shape (num_rois, 5): batch_index, x1, y1, x2, y2; got {rois.type}")
        return [x.type.with_shape((rois.shape[0], x.shape[1]) + tuple(self.pooled_shape))]

    def compute(self, x, rois):
        n, c, h, w = x.shape
        ph, pw = self.pooled_shape
        y = np.zeros((rois.shape[0], c, ph, pw), dtype=x.dtype)
        dt = compute_dtype(rois.dtype)
        scaled = rois[:, 1:].astype(dt) * dt.type(self.spatial_scale)  # in the rois' precision, as ORT does
        # rounded half away from zero (C's round, as Caffe and ONNX Runtime do)
        corners = (np.sign(scaled) * np.floor(np.abs(scaled) + dt.type(0.5))).astype(np.int64)
        for r, roi in enumerate(rois):
            b = int(roi[0])
            if not 0 <= b < n:
                raise self.fail(f"roi {r} has batch index {b}, X has {n} images")
            x1, y1, x2, y2 = (int(v) for v in corners[r])
            rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
            hs = np.clip(np.floor(np.arange(ph) * rh / ph).astype(int) + y1, 0, h)
            he = np.clip(np.ceil(np.arange(1, ph + 1) * rh / ph).astype(int) + y1, 0, h)
            ws = np.clip(np.floor(np.arange(pw) * rw / pw).astype(int) + x1, 0, w)
            we = np.clip(np.ceil(np.arange(1, pw + 1) * rw / pw).astype(int) + x1, 0, w)
            if ws.min() >= we.max():
                continue
            w0, w1 = ws.min(), we.max()
            img = x[b][:, :, w0:w1]
            # max is separable over a box: first over each bin's rows, then over its columns
            rows = np.zeros((c, ph, w1 - w0), dtype=x.dtype)
            row_ok = np.zeros(ph, dtype=bool)
            for i in range(ph):
                if he[i] > hs[i]:
                    rows[:, i] = img[:, hs[i]:he[i]].max(axis=1)
                    row_ok[i] = True
            for j in range(pw):
                if we[j] > ws[j]:
                    y[r, :, :, j] = np.where(row_ok, rows[:, :, ws[j] - w0:we[j] - w0].max(axis=2), 0)
        return [y]


OPS = (MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, GlobalLpPool, MaxUnpool, MaxRoiPool)
