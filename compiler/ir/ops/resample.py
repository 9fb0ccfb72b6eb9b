"""Resampling and geometric ops: Resize, GridSample, AffineGrid, RoiAlign, and NonMaxSuppression.

Resize and GridSample interpolate in float32 (float64 for float64 and wide integer inputs) and give the
result back in the input's element type (integers rounded to nearest, saturating). NonMaxSuppression's
result size depends on the data: its first dimension is ``None``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import STD_FLOATS, STD_NUMERIC, Cost, OpDef, check_dtype, known_ints, norm_axis, same_dtype
from .common import check_flags
from .indexing import _I64, _check_same_dims, _known_array


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _is_empty(v) -> bool:
    """An optional input given as an empty 1-D tensor (older exporters' way to leave it out)."""
    return v is not None and v.type.rank == 1 and v.shape[0] == 0


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """The float type interpolation is computed in for a given element type."""
    if dt == np.float64 or (dt.kind in "iu" and dt.itemsize >= 4):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _to_dtype(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """An interpolated result back in the input's element type (integers round to nearest, saturating)."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.rint(y), info.min, info.max).astype(dt)
    return y.astype(dt, copy=False)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient ``a``."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _float_list(v) -> list[float] | None:
    k = _known_array(v)
    return None if k is None else [float(x) for x in k.astype(np.float64).ravel()]


# ---------------------------------------------------------------------------------------------
# Resize
# ---------------------------------------------------------------------------------------------

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_crop_and_resize",
                # opsets 11-12 only (kept so those models import unchanged)
                "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True, eq=False)
class Resize(OpDef):
    """Resample ``X`` to new sizes (from ``scales`` or ``sizes``, over ``axes``) by nearest, N-linear or
    N-cubic interpolation; separable, one axis at a time.

    IR form of opset 19. ``coordinate_transformation_mode`` also accepts ``tf_half_pixel_for_nn`` of
    opsets 11-12 (x_original = (x_resized + 0.5) / scale). An empty ``roi``/``scales``/``sizes`` tensor
    counts as absent (how opsets 11-12 leave them out).
    """

    antialias: int = 0
    axes: tuple[int, ...] | None = None
    coordinate_transformation_mode: str = "half_pixel"
    cubic_coeff_a: float = -0.75
    exclude_outside: int = 0
    extrapolation_value: float = 0.0
    keep_aspect_ratio_policy: str = "stretch"
    mode: str = "nearest"
    nearest_mode: str = "round_prefer_floor"
    inputs: ClassVar = ("X", "roi?", "scales?", "sizes?")
    outputs: ClassVar = ("Y",)
    since: ClassVar = 19

    def validate(self):
        if self.mode not in ("nearest", "linear", "cubic"):
            raise self.fail(f"mode must be nearest, linear or cubic, got {self.mode!r}")
        if self.coordinate_transformation_mode not in _COORD_MODES:
            raise self.fail(f"coordinate_transformation_mode must be one of {', '.join(_COORD_MODES)}, got "
                            f"{self.coordinate_transformation_mode!r}")
        if self.nearest_mode not in _NEAREST_MODES:
            raise self.fail(f"nearest_mode must be one of {', '.join(_NEAREST_MODES)}, got {self.nearest_mode!r}")
        if self.keep_aspect_ratio_policy not in ("stretch", "not_larger", "not_smaller"):
            raise self.fail("keep_aspect_ratio_policy must be stretch, not_larger or not_smaller, got "
                            f"{self.keep_aspect_ratio_policy!r}")
        if self.antialias not in (0, 1) or self.exclude_outside not in (0, 1):
            raise self.fail(f"antialias and exclude_outside must be 0 or 1, got antialias={self.antialias}, "
                            f"exclude_outside={self.exclude_outside}")
        if self.axes is not None and len(set(self.axes)) != len(self.axes):
            raise self.fail(f"axes {list(self.axes)} repeat an axis")

    def _axes(self, rank: int) -> list[int]:
        if self.axes is None:
            return list(range(rank))
        out = [norm_axis(self, a, rank, "axes entry") for a in self.axes]
        if len(set(out)) != len(out):
            raise self.fail(f"axes {list(self.axes)} repeat an axis")
        return out

    # -- sizes and scales ----------------------------------------------------------------------
    def _plan(self, in_shape, axes, scales, sizes):
        """Output dims (None where unknown) and, per axis, the (scale, fractional output length) that
        coordinates use, from known ``scales`` or ``sizes`` (lists) and the input dims. The fractional
        length is input * scale (ONNX's "output_width" before flooring), or the size given."""
        out = list(in_shape)
        eff: list[tuple[float, float] | None] = [(1.0, d) for d in in_shape]
        if sizes is not None:
            if len(sizes) != len(axes):
                raise self.fail(f"sizes has {len(sizes)} entries, expected {len(axes)} (one per resized axis)")
            if any(s < 0 for s in sizes):
                raise self.fail(f"sizes must be >= 0, got {list(sizes)}")
            if self.keep_aspect_ratio_policy == "stretch":
                for a, s in zip(axes, sizes):
                    d = in_shape[a]
                    out[a] = int(s)
                    eff[a] = ((s / d if d else 1.0), float(s)) if isinstance(d, int) else None
            else:
                dims = [in_shape[a] for a in axes]
                if not all(isinstance(d, int) and d > 0 for d in dims):
                    for a in axes:
                        out[a], eff[a] = None, None
                    return out, eff
                ratios = [s / d for s, d in zip(sizes, dims)]
                scale = min(ratios) if self.keep_aspect_ratio_policy == "not_larger" else max(ratios)
                for a, d in zip(axes, dims):
                    out[a] = int(math.floor(scale * d + 0.5))
                    eff[a] = (scale, scale * d)
            return out, eff
        if len(scales) != len(axes):
            raise self.fail(f"scales has {len(scales)} entries, expected {len(axes)} (one per resized axis)")
        if not all(s > 0 for s in scales):
            raise self.fail(f"scales must be > 0, got {list(scales)}")
        for a, s in zip(axes, scales):
            d = in_shape[a]
            eff[a] = (s, d * s) if isinstance(d, int) else None
            if s == 1.0:
                out[a] = d
            else:
                out[a] = int(math.floor(d * s)) if isinstance(d, int) else None
        return out, eff

    def infer(self, ins):
        x, roi, scales, sizes = (list(ins) + [None] * 4)[:4]
        r = x.type.rank
        axes = self._axes(r)
        if self.mode != "nearest":
            check_dtype(self, x, STD_NUMERIC, f"X (mode {self.mode})")
        if roi is not None:
            check_dtype(self, roi, STD_FLOATS, "roi")
        if _is_empty(scales):
            scales = None
        if _is_empty(sizes):
            sizes = None
        if scales is None and sizes is None:
            raise self.fail("needs scales or sizes (neither is given)")
        if scales is not None and sizes is not None:
            # a scales input of unknown length next to sizes: decided at run time
            if isinstance(scales.shape[0] if scales.type.rank == 1 else 0, int):
                raise self.fail("takes scales or sizes, not both")
            return [x.type.with_shape(tuple(x.shape[i] if i not in axes else None for i in range(r)))]
        src = scales if scales is not None else sizes
        if scales is not None:
            check_dtype(self, scales, STD_FLOATS, "scales")
        else:
            check_dtype(self, sizes, _I64, "sizes")
        if src.type.rank != 1:
            raise self.fail(f"{'scales' if scales is not None else 'sizes'} must be 1-D, got {src.type}")
        n = src.shape[0]
        if isinstance(n, int) and n != len(axes):
            raise self.fail(f"{'scales' if scales is not None else 'sizes'} has {n} entries, expected "
                            f"{len(axes)} (one per resized axis)")
        known = _float_list(scales) if scales is not None else known_ints(sizes)
        if known is None:
            return [x.type.with_shape(tuple(None if i in axes else x.shape[i] for i in range(r)))]
        if scales is not None:
            out, _ = self._plan(x.shape, axes, known, None)
        else:
            out, _ = self._plan(x.shape, axes, None, known)
        return [x.type.with_shape(tuple(out))]

    # -- interpolation -------------------------------------------------------------------------
    def _coords(self, out_len: int, in_len: int, scale: float, length: float, start: float,
                end: float) -> np.ndarray:
        """x_original for every output position along one axis (float64); ``length`` is the fractional
        output length (input * scale, as ONNX's reference uses it)."""
        x = np.arange(out_len, dtype=np.float64)
        m = self.coordinate_transformation_mode
        if m == "half_pixel":
            return (x + 0.5) / scale - 0.5
        if m == "half_pixel_symmetric":
            adjustment = out_len / length
            offset = in_len / 2 * (1 - adjustment)
            return offset + (x + 0.5) / scale - 0.5
        if m == "pytorch_half_pixel":
            return (x + 0.5) / scale - 0.5 if length > 1 else np.zeros_like(x)
        if m == "align_corners":
            return x * (in_len - 1) / (length - 1) if length > 1 else np.zeros_like(x)
        if m == "asymmetric":
            return x / scale
        if m == "tf_half_pixel_for_nn":
            return (x + 0.5) / scale
        # tf_crop_and_resize
        if length > 1:
            return start * (in_len - 1) + x * (end - start) * (in_len - 1) / (length - 1)
        return np.full_like(x, 0.5 * (start + end) * (in_len - 1))

    def _taps(self, xo: np.ndarray, in_len: int, scale: float):
        """(indices [out, T], weights [out, T] or None for nearest) sampling one axis at ``xo``."""
        if self.mode == "nearest":
            nm = self.nearest_mode
            if nm == "round_prefer_floor":
                i = np.ceil(xo - 0.5)
            elif nm == "round_prefer_ceil":
                i = np.floor(xo + 0.5)
            elif nm == "floor":
                i = np.floor(xo)
            else:
                i = np.ceil(xo)
            return np.clip(i, 0, in_len - 1).astype(np.int64)[:, None], None
        support = 1.0 if self.mode == "linear" else 2.0
        s = scale if self.antialias and scale < 1 else 1.0
        radius = support / s
        taps = int(math.ceil(2 * radius))
        idx = np.floor(xo - radius).astype(np.int64)[:, None] + 1 + np.arange(taps, dtype=np.int64)[None, :]
        d = (idx - xo[:, None]) * s
        if self.mode == "linear":
            w = np.maximum(0.0, 1.0 - np.abs(d))
        else:
            w = _cubic_kernel(d, self.cubic_coeff_a)
        outside = (idx < 0) | (idx >= in_len)
        if self.exclude_outside:
            w = np.where(outside, 0.0, w)
        if self.exclude_outside or s != 1.0:
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        return np.clip(idx, 0, in_len - 1), w

    def compute(self, x, roi=None, scales=None, sizes=None):
        r = x.ndim
        axes = self._axes(r)
        if scales is not None and scales.size == 0:
            scales = None
        if sizes is not None and sizes.size == 0:
            sizes = None
        if (scales is None) == (sizes is None):
            raise self.fail("needs exactly one of scales and sizes")
        if scales is not None:
            out_shape, eff = self._plan(x.shape, axes, [float(v) for v in np.asarray(scales, np.float64).ravel()],
                                        None)
        else:
            out_shape, eff = self._plan(x.shape, axes, None, [int(v) for v in np.asarray(sizes).ravel()])
        starts, ends = [0.0] * r, [1.0] * r
        if roi is not None and roi.size and self.coordinate_transformation_mode == "tf_crop_and_resize":
            rv = np.asarray(roi, np.float64).ravel()
            if rv.size != 2 * len(axes):
                raise self.fail(f"roi has {rv.size} entries, expected {2 * len(axes)} (starts and ends of "
                                "each resized axis)")
            for i, a in enumerate(axes):
                starts[a], ends[a] = float(rv[i]), float(rv[len(axes) + i])
        nearest = self.mode == "nearest"
        cdt = x.dtype if nearest else _compute_dtype(x.dtype)
        y = x if nearest else x.astype(cdt)
        masks = []
        for a in axes:
            in_len, out_len = x.shape[a], out_shape[a]
            if out_len == 0 or in_len == 0:
                y = np.zeros(y.shape[:a] + (out_len,) + y.shape[a + 1:], y.dtype)
                continue
            scale, length = eff[a]
            xo = self._coords(out_len, in_len, scale, length, starts[a], ends[a])
            if self.coordinate_transformation_mode == "tf_crop_and_resize":
                ok = (xo >= 0) & (xo <= in_len - 1)
                if not ok.all():
                    shape = [1] * r
                    shape[a] = out_len
                    masks.append(ok.reshape(shape))
            if out_len == in_len and (np.array_equal(xo, np.arange(in_len, dtype=np.float64)) or (
                    scale == 1.0 and self.coordinate_transformation_mode == "tf_half_pixel_for_nn")) and \
                    not (self.antialias and scale < 1):
                continue  # identity along this axis (tf_half_pixel_for_nn shifts by half a pixel: not at scale 1)
            idx, w = self._taps(xo, in_len, scale)
            if w is None:
                y = np.take(y, idx[:, 0], axis=a)
                continue
            shape = [1] * r
            shape[a] = out_len
            acc = None
            for t in range(idx.shape[1]):
                wt = w[:, t]
                if not wt.any():
                    continue
                term = np.take(y, idx[:, t], axis=a)
                term *= wt.astype(cdt).reshape(shape)
                if acc is None:
                    acc = term
                else:
                    acc += term
            y = acc if acc is not None else np.zeros(y.shape[:a] + (out_len,) + y.shape[a + 1:], cdt)
        if masks:
            ok = masks[0]
            for mk in masks[1:]:
                ok = ok & mk
            y = np.where(ok, y, np.asarray(self.extrapolation_value).astype(y.dtype) if y.dtype.kind != "O"
                         else self.extrapolation_value)
        if not nearest:
            y = _to_dtype(y, x.dtype)
        return [np.ascontiguousarray(y)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        n = outs[0].numel or 0
        per = {"nearest": 1, "linear": 3, "cubic": 8}[self.mode]
        k = len(self.axes) if self.axes is not None else ins[0].rank
        return Cost(n * (per * k if self.mode != "nearest" else 1), base.bytes)


# ---------------------------------------------------------------------------------------------
# GridSample, AffineGrid, RoiAlign
# ---------------------------------------------------------------------------------------------

def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates into [lo, hi] by the borders, as many times as needed."""
    span = hi - lo
    if span <= 0:
        return np.zeros_like(x) + lo
    d = np.abs(x - lo)
    flips = np.floor(d / span)
    extra = d - flips * span
    return np.where(np.fmod(flips, 2) == 0, lo + extra, hi - extra)


@dataclass(frozen=True, eq=False)
class GridSample(OpDef):
    """Sample X (N, C, D1..Dr) at the normalized positions in grid (N, O1..Or, r), grid[..., 0] being
    the coordinate along the last axis (x = width). Any number r of spatial axes."""

    align_corners: int = 0
    mode: str = "linear"
    padding_mode: str = "zeros"
    inputs: ClassVar = ("X", "grid")
    outputs: ClassVar = ("Y",)
    since: ClassVar = 22

    def validate(self):
        if self.mode not in ("linear", "nearest", "cubic"):
            raise self.fail(f"mode must be linear, nearest or cubic, got {self.mode!r}")
        if self.padding_mode not in ("zeros", "border", "reflection"):
            raise self.fail(f"padding_mode must be zeros, border or reflection, got {self.padding_mode!r}")
        check_flags(self, "align_corners")

    def infer(self, ins):
        x, grid = ins
        check_dtype(self, x, STD_NUMERIC, "X")
        check_dtype(self, grid, STD_FLOATS, "grid")
        r = x.type.rank - 2
        if r < 1:
            raise self.fail(f"X must be (N, C, D1, ..., Dr) with r >= 1 spatial axes, got {x.type}")
        if grid.type.rank != r + 2:
            raise self.fail(f"grid must have rank {r + 2} (N, O1..O{r}, {r}) for X {x.type}, got {grid.type}")
        if isinstance(grid.shape[-1], int) and grid.shape[-1] != r:
            raise self.fail(f"grid's last dimension must be {r} (one coordinate per spatial axis), got {grid.type}")
        _check_same_dims(self, x.shape[:1], grid.shape[:1], "batch sizes of X and grid")
        n = x.shape[0] if isinstance(x.shape[0], int) else grid.shape[0]
        return [TensorType(x.dtype, (n, x.shape[1]) + grid.shape[1:-1])]

    def _pad_coord(self, c: np.ndarray, size: int) -> np.ndarray:
        if self.padding_mode == "border":
            return np.clip(c, 0, size - 1)
        if self.padding_mode == "reflection":
            if self.align_corners:
                c = _reflect(c, 0.0, size - 1.0)
            else:
                c = _reflect(c, -0.5, size - 0.5)
            return np.clip(c, 0, size - 1)
        return c

    def _taps(self, g: np.ndarray, size: int):
        """Per-axis (list of index arrays, list of weight arrays) for normalized coordinates g."""
        if self.align_corners:
            c = (g + 1) / 2 * (size - 1)
        else:
            c = ((g + 1) * size - 1) / 2
        if self.mode == "cubic":
            c0 = np.floor(c)
            t = c - c0
            idx = [c0 + k for k in (-1, 0, 1, 2)]
            ws = [_cubic_kernel(t - k, -0.75) for k in (-1, 0, 1, 2)]
            idx = [self._pad_coord(i, size) for i in idx]
        else:
            c = self._pad_coord(c, size)
            if self.mode == "nearest":
                idx, ws = [np.rint(c)], [np.ones_like(c)]
            else:
                c0 = np.floor(c)
                t = c - c0
                idx, ws = [c0, c0 + 1], [1 - t, t]
        out_i, out_w = [], []
        for i, w in zip(idx, ws):
            inside = (i >= 0) & (i <= size - 1)
            out_i.append(np.clip(i, 0, size - 1).astype(np.int64))
            out_w.append(np.where(inside, w, 0.0))
        return out_i, out_w

    def compute(self, x, grid):
        n, c = x.shape[:2]
        spatial = x.shape[2:]
        r = len(spatial)
        cdt = _compute_dtype(x.dtype)
        g = grid.astype(np.float64)
        taps = [self._taps(g[..., r - 1 - d], spatial[d]) for d in range(r)]
        xt = np.moveaxis(x, 1, -1).astype(cdt, copy=False)  # (N, D1..Dr, C)
        bshape = (n,) + (1,) * (grid.ndim - 2)
        nidx = np.arange(n).reshape(bshape)
        acc = np.zeros(grid.shape[:-1] + (c,), cdt)
        for combo in np.ndindex(*[len(t[0]) for t in taps]):
            w = None
            index = [nidx]
            for d, k in enumerate(combo):
                index.append(taps[d][0][k])
                w = taps[d][1][k] if w is None else w * taps[d][1][k]
            if not w.any():
                continue
            acc += xt[tuple(index)] * w.astype(cdt)[..., None]
        y = np.moveaxis(acc, -1, 1)
        return [np.ascontiguousarray(_to_dtype(y, x.dtype) if self.mode != "nearest" else y.astype(x.dtype))]


@dataclass(frozen=True, eq=False)
class AffineGrid(OpDef):
    """The sampling grid (N, H, W, 2) or (N, D, H, W, 3) of affine matrices theta (N, 2, 3) or (N, 3, 4)
    applied to evenly spaced positions in [-1, 1] (for GridSample)."""

    align_corners: int = 0
    inputs: ClassVar = ("theta", "size")
    outputs: ClassVar = ("grid",)
    since: ClassVar = 20

    def validate(self):
        check_flags(self, "align_corners")

    def infer(self, ins):
        theta, size = ins
        check_dtype(self, theta, STD_FLOATS, "theta")
        check_dtype(self, size, _I64, "size")
        if size.type.rank != 1 or size.shape[0] not in (4, 5):
            raise self.fail(f"size must be a static 1-D tensor of 4 (N, C, H, W) or 5 (N, C, D, H, W) entries, "
                            f"got {size.type}")
        r = size.shape[0] - 2
        if theta.type.rank != 3:
            raise self.fail(f"theta must be (N, {r}, {r + 1}), got {theta.type}")
        _check_same_dims(self, theta.shape[1:], (r, r + 1), f"theta must be (N, {r}, {r + 1})")
        sz = known_ints(size)
        if sz is None:
            return [TensorType(theta.dtype, (theta.shape[0],) + (None,) * r + (r,))]
        _check_same_dims(self, theta.shape[:1], (sz[0],), "theta's batch and size[0]")
        if any(v < 0 for v in sz):
            raise self.fail(f"size must be >= 0, got {sz}")
        return [TensorType(theta.dtype, (sz[0],) + tuple(sz[2:]) + (r,))]

    def compute(self, theta, size):
        sz = [int(v) for v in np.asarray(size).ravel()]
        n, spatial = sz[0], sz[2:]
        r = len(spatial)
        axes = []
        for length in reversed(spatial):  # x (the last axis) first
            if self.align_corners:
                v = np.linspace(-1.0, 1.0, length) if length > 1 else np.zeros(length)
            else:
                v = (2 * np.arange(length, dtype=np.float64) + 1) / length - 1
            axes.append(v)
        mesh = np.meshgrid(*axes[::-1], indexing="ij")  # each shaped like spatial
        base = np.stack([mesh[r - 1 - k] for k in range(r)] + [np.ones(spatial)], axis=-1).reshape(-1, r + 1)
        th = np.asarray(theta, np.float64)
        out = np.einsum("pk,njk->npj", base, th)
        return [out.reshape((n,) + tuple(spatial) + (r,)).astype(theta.dtype)]


@dataclass(frozen=True, eq=False)
class RoiAlign(OpDef):
    """Mask R-CNN RoI Align: each region (x1, y1, x2, y2) of image batch_indices[i] pooled to
    (output_height, output_width) bins by averaging (or max of) bilinear samples."""

    coordinate_transformation_mode: str = "half_pixel"
    mode: str = "avg"
    output_height: int = 1
    output_width: int = 1
    sampling_ratio: int = 0
    spatial_scale: float = 1.0
    inputs: ClassVar = ("X", "rois", "batch_indices")
    outputs: ClassVar = ("Y",)
    since: ClassVar = 22

    def validate(self):
        if self.coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
            raise self.fail("coordinate_transformation_mode must be half_pixel or output_half_pixel, got "
                            f"{self.coordinate_transformation_mode!r}")
        if self.mode not in ("avg", "max"):
            raise self.fail(f"mode must be avg or max, got {self.mode!r}")
        if self.output_height < 1 or self.output_width < 1:
            raise self.fail(f"output_height and output_width must be >= 1, got {self.output_height}, "
                            f"{self.output_width}")
        if self.sampling_ratio < 0:
            raise self.fail(f"sampling_ratio must be >= 0, got {self.sampling_ratio}")

    def infer(self, ins):
        x, rois, bi = ins
        check_dtype(self, x, STD_FLOATS, "X")
        same_dtype(self, [x, rois])
        check_dtype(self, bi, _I64, "batch_indices")
        if x.type.rank != 4:
            raise self.fail(f"X must be 4-D (N, C, H, W), got {x.type}")
        if rois.type.rank != 2 or rois.shape[1] not in (4, None) and not isinstance(rois.shape[1], str):
            raise self.fail(f"rois must be (num_rois, 4), got {rois.type}")
        if bi.type.rank != 1:
            raise self.fail(f"batch_indices must be 1-D (num_rois,), got {bi.type}")
        _check_same_dims(self, rois.shape[:1], bi.shape, "rois and batch_indices counts")
        k = rois.shape[0] if isinstance(rois.shape[0], int) else bi.shape[0]
        return [TensorType(x.dtype, (k, x.shape[1], self.output_height, self.output_width))]

    def _axis_samples(self, start, length, bins: int, grid: int, size: int):
        """Sample positions along one axis: (low index, high index, low weight, high weight, valid),
        each (bins, grid). Positions are computed in the element type of ``start`` (as runtimes do:
        samples that land exactly on the border stay inside)."""
        ft = type(start)
        step = length / ft(bins)
        p = (start + np.arange(bins, dtype=ft)[:, None] * step) + \
            (np.arange(grid, dtype=ft)[None, :] + ft(0.5)) * step / ft(max(grid, 1))
        p = p.astype(np.float64)
        valid = (p >= -1.0) & (p <= size)
        p = np.maximum(p, 0.0)
        low = np.floor(p).astype(np.int64)
        top = low >= size - 1
        low = np.where(top, size - 1, low)
        high = np.where(top, size - 1, low + 1)
        p = np.where(top, low.astype(np.float64), p)
        frac = p - low
        return low, high, 1 - frac, frac, valid

    def compute(self, x, rois, bi):
        n, c, h, w = x.shape
        ph, pw = self.output_height, self.output_width
        k = rois.shape[0]
        out = np.zeros((k, c, ph, pw), np.float64)
        ft = np.float64 if x.dtype == np.float64 else np.float32
        offset = ft(0.5 if self.coordinate_transformation_mode == "half_pixel" else 0.0)
        xd = x.astype(np.float64)
        rv = np.asarray(rois).astype(ft)
        for i in range(k):
            b = int(bi[i])
            if not 0 <= b < n:
                raise self.fail(f"batch_indices[{i}] = {b} is out of range for a batch of {n}")
            x1, y1, x2, y2 = (v * ft(self.spatial_scale) - offset for v in rv[i])
            rw, rh = x2 - x1, y2 - y1
            if not offset:
                rw, rh = max(rw, ft(1.0)), max(rh, ft(1.0))
            gh = self.sampling_ratio or int(math.ceil(rh / ft(ph)))
            gw = self.sampling_ratio or int(math.ceil(rw / ft(pw)))
            ylo, yhi, wyl, wyh, vy = self._axis_samples(y1, rh, ph, max(gh, 0), h)
            xlo, xhi, wxl, wxh, vx = self._axis_samples(x1, rw, pw, max(gw, 0), w)
            img = xd[b]
            if self.mode == "avg":
                count = max(gh * gw, 1)
                ay = np.zeros((ph, h))
                for lo, wt in ((ylo, wyl), (yhi, wyh)):
                    np.add.at(ay, (np.arange(ph)[:, None], lo), wt * vy)
                ax = np.zeros((pw, w))
                for lo, wt in ((xlo, wxl), (xhi, wxh)):
                    np.add.at(ax, (np.arange(pw)[:, None], lo), wt * vx)
                out[i] = np.einsum("ph,chw,qw->cpq", ay, img, ax, optimize=True) / count
            else:
                if gh <= 0 or gw <= 0:
                    continue
                best = None
                for yi, wy in ((ylo, wyl), (yhi, wyh)):
                    for xi, wx in ((xlo, wxl), (xhi, wxh)):
                        # (C, ph, gh, pw, gw)
                        v = img[:, yi[:, :, None, None], xi[None, None, :, :]]
                        wt = (wy * vy)[:, :, None, None] * (wx * vx)[None, None, :, :]
                        term = v * wt
                        best = term if best is None else np.maximum(best, term)
                out[i] = best.max(axis=(2, 4))
        return [out.astype(x.dtype)]


# ---------------------------------------------------------------------------------------------
# NonMaxSuppression
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class NonMaxSuppression(OpDef):
    """Greedy per-(batch, class) selection of boxes by descending score, dropping boxes whose IoU with a
    selected one is > iou_threshold; rows [batch, class, box] of the selected, int64 (num_selected, 3)."""

    center_point_box: int = 0
    inputs: ClassVar = ("boxes", "scores", "max_output_boxes_per_class?", "iou_threshold?", "score_threshold?")
    outputs: ClassVar = ("selected_indices",)
    since: ClassVar = 11

    def validate(self):
        check_flags(self, "center_point_box")

    def infer(self, ins):
        boxes, scores = ins[0], ins[1]
        check_dtype(self, boxes, STD_FLOATS, "boxes")
        check_dtype(self, scores, STD_FLOATS, "scores")
        if boxes.type.rank != 3 or (isinstance(boxes.shape[2], int) and boxes.shape[2] != 4):
            raise self.fail(f"boxes must be (num_batches, num_boxes, 4), got {boxes.type}")
        if scores.type.rank != 3:
            raise self.fail(f"scores must be (num_batches, num_classes, num_boxes), got {scores.type}")
        _check_same_dims(self, (boxes.shape[0], boxes.shape[1]), (scores.shape[0], scores.shape[2]),
                         "boxes (batches, boxes) and scores (batches, _, boxes)")
        names = ("max_output_boxes_per_class", "iou_threshold", "score_threshold")
        for v, what, dts in zip(ins[2:], names, (_I64, STD_FLOATS, STD_FLOATS)):
            if v is not None:
                check_dtype(self, v, dts, what)
                if v.type.numel not in (None, 1) or v.type.rank > 1:
                    raise self.fail(f"{what} must be a scalar, got {v.type}")
        return [TensorType(DType.i64, (None, 3))]

    def compute(self, boxes, scores, max_out=None, iou_thr=None, score_thr=None):
        limit = 0 if max_out is None else int(np.asarray(max_out).ravel()[0])
        iou_t = 0.0 if iou_thr is None else float(np.asarray(iou_thr).ravel()[0])
        b = np.asarray(boxes, np.float64)
        if self.center_point_box:
            xc, yc, bw, bh = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
            y1, y2, x1, x2 = yc - bh / 2, yc + bh / 2, xc - bw / 2, xc + bw / 2
        else:
            y1 = np.minimum(b[..., 0], b[..., 2])
            y2 = np.maximum(b[..., 0], b[..., 2])
            x1 = np.minimum(b[..., 1], b[..., 3])
            x2 = np.maximum(b[..., 1], b[..., 3])
        area = (y2 - y1) * (x2 - x1)
        rows = []
        nb, nc = scores.shape[0], scores.shape[1]
        for bt in range(nb):
            for cl in range(nc):
                if limit <= 0:
                    break
                s = np.asarray(scores[bt, cl], np.float64)
                cand = np.arange(s.size)
                if score_thr is not None:
                    cand = cand[s > float(np.asarray(score_thr).ravel()[0])]
                order = cand[np.argsort(-s[cand], kind="stable")]
                picked = 0
                while order.size and picked < limit:
                    i, rest = order[0], order[1:]
                    rows.append((bt, cl, int(i)))
                    picked += 1
                    if not rest.size:
                        break
                    ih = np.maximum(0.0, np.minimum(y2[bt, i], y2[bt, rest]) - np.maximum(y1[bt, i], y1[bt, rest]))
                    iw = np.maximum(0.0, np.minimum(x2[bt, i], x2[bt, rest]) - np.maximum(x1[bt, i], x1[bt, rest]))
                    inter = ih * iw
                    union = area[bt, i] + area[bt, rest] - inter
                    with np.errstate(divide="ignore", invalid="ignore"):
                        iou = np.where((inter > 0) & (union > 0) & (area[bt, i] > 0) & (area[bt, rest] > 0),
                                       inter / np.where(union > 0, union, 1.0), 0.0)
                    order = rest[~(iou > iou_t)]
        return [np.array(rows, dtype=np.int64).reshape(-1, 3)]


OPS = (Resize, GridSample, AffineGrid, RoiAlign, NonMaxSuppression)
