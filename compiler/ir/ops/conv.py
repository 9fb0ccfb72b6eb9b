"""Convolution ops: Conv, ConvTranspose, DeformConv, Col2Im, CausalConvWithState, and LRN.

Conv is the hot op of the reference interpreter, so its ``compute`` is im2col + one big matmul: the
padded input is viewed (``as_strided``, no copy) as ``(N, C, *kernel, *out)``, copied once into the
column matrix and multiplied by the weights in float32/float64 so BLAS does the work. 1x1 convs skip the
im2col (a plain matmul on the input), depthwise convs accumulate one multiply-add per kernel tap.

The window geometry (explicit pads, ``auto_pad``, strides, dilations, ``ceil_mode``) is shared with the
pooling ops (``pool.py`` imports the helpers here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..types import DType, TensorType
from .base import STD_FLOATS, STD_NUMERIC, Cost, OpDef, Pattern, check_dtype, known_ints, same_dtype
from .common import compute_dtype, is_static

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_SAME = ("SAME_UPPER", "SAME_LOWER")
#: im2col column matrices above this many elements are built and multiplied in chunks of output rows
_IM2COL_CHUNK = 1 << 22


# ---------------------------------------------------------------------------------------------
# Window geometry (shared with pool.py)
# ---------------------------------------------------------------------------------------------

def check_window_attrs(op: OpDef, *, auto_pad: str | None = None, strides=(), dilations=(), pads=(),
                       kernel_shape=(), negative_pads: bool = False) -> None:
    """Validate the usual sliding-window attributes (lengths are checked against the rank in infer)."""
    if auto_pad is not None and auto_pad not in AUTO_PADS:
        raise op.fail(f"auto_pad must be one of {', '.join(AUTO_PADS)}, got {auto_pad!r}")
    if any(s < 1 for s in strides):
        raise op.fail(f"strides must be positive, got {list(strides)}")
    if any(d < 1 for d in dilations):
        raise op.fail(f"dilations must be positive, got {list(dilations)}")
    if any(k < 1 for k in kernel_shape):
        raise op.fail(f"kernel_shape must be positive, got {list(kernel_shape)}")
    if len(pads) % 2:
        raise op.fail(f"pads must hold a begin and an end per spatial axis (begins first), got {list(pads)}")
    if not negative_pads and any(p < 0 for p in pads):
        raise op.fail(f"pads must not be negative, got {list(pads)}")


def spatial_attrs(op: OpDef, nd: int, strides=(), dilations=(), pads=()):
    """strides, dilations, pads normalized to ``nd`` spatial axes (defaults 1, 1, 0), lengths checked."""
    for name, v, want in (("strides", strides, nd), ("dilations", dilations, nd), ("pads", pads, 2 * nd)):
        if v and len(v) != want:
            raise op.fail(f"{name} has {len(v)} entries, the input has {nd} spatial axes "
                          f"(so {name} needs {want})")
    return (tuple(strides) or (1,) * nd, tuple(dilations) or (1,) * nd, tuple(pads) or (0,) * (2 * nd))


def axis_geometry(op: OpDef, axis: int, size: int, k: int, s: int, d: int, pb: int, pe: int,
                  auto_pad: str = "NOTSET", ceil_mode: bool = False) -> tuple[int, int, int]:
    """(output size, pad begin, pad end) of one spatial axis of a sliding window over a static size."""
    keff = (k - 1) * d + 1
    if auto_pad in _SAME:
        out = -(-size // s)
        total = max(0, (out - 1) * s + keff - size)
        pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        return out, pb, total - pb
    if auto_pad == "VALID":
        pb = pe = 0
    span = size + pb + pe - keff
    # with ceil_mode a window larger than the padded input still makes one output (ONNX Runtime and
    # PyTorch agree: EfficientNet's last pool), as long as it starts inside
    if span < 0 and not (ceil_mode and -(-span // s) >= 0):
        raise op.fail(f"spatial axis {axis}: the input size {size} (padded: {size + pb + pe}) is smaller "
                      f"than the kernel's extent {keff} (kernel {k}, dilation {d})")
    if ceil_mode:
        out = -(-span // s) + 1
        if (out - 1) * s >= size + pb:  # the last window must start inside the input or the begin pad
            out -= 1
    else:
        out = span // s + 1
    return out, pb, pe


def window_dims(op: OpDef, in_dims: Sequence, kernel: Sequence, strides, dilations, pads,
                auto_pad: str = "NOTSET", ceil_mode: bool = False) -> tuple:
    """Output spatial dims for possibly symbolic input dims (a symbol is kept where the size cannot
    change: stride 1 and a window the padding exactly compensates)."""
    nd = len(in_dims)
    out = []
    for i, size in enumerate(in_dims):
        k = kernel[i]
        if not isinstance(k, int):
            out.append(None)
        elif isinstance(size, int):
            out.append(axis_geometry(op, i, size, k, strides[i], dilations[i], pads[i], pads[nd + i],
                                     auto_pad, ceil_mode)[0])
        else:
            keff = (k - 1) * dilations[i] + 1
            unchanged = strides[i] == 1 and (
                auto_pad in _SAME or (auto_pad == "VALID" and keff == 1)
                or (auto_pad == "NOTSET" and pads[i] + pads[nd + i] == keff - 1))
            out.append(size if unchanged else None)
    return tuple(out)


def resolve_geometry(op: OpDef, in_sizes: Sequence[int], kernel: Sequence[int], strides, dilations, pads,
                     auto_pad: str = "NOTSET", ceil_mode: bool = False):
    """(out sizes, pad begins, pad ends) for static input sizes (used by compute)."""
    geo = [axis_geometry(op, i, size, kernel[i], strides[i], dilations[i], pads[i], pads[len(in_sizes) + i],
                         auto_pad, ceil_mode) for i, size in enumerate(in_sizes)]
    return tuple(g[0] for g in geo), tuple(g[1] for g in geo), tuple(g[2] for g in geo)


def pad_to(x: np.ndarray, begins: Sequence[int], lengths: Sequence[int], fill=0) -> np.ndarray:
    """The spatial axes (2..) of x placed at offset ``begins`` in a buffer of ``lengths`` filled with
    ``fill`` (a negative begin or a short buffer crops). Returns x itself when nothing changes."""
    spatial = x.shape[2:]
    if all(b == 0 for b in begins) and tuple(lengths) == tuple(spatial):
        return x
    buf = np.full(x.shape[:2] + tuple(lengths), fill, dtype=x.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for size, b, n in zip(spatial, begins, lengths):
        lo, hi = max(0, -b), min(size, n - b)
        if hi <= lo:
            return buf
        src.append(slice(lo, hi))
        dst.append(slice(lo + b, hi + b))
    buf[tuple(dst)] = x[tuple(src)]
    return buf


def tap(kk: Sequence[int], strides, dilations, out: Sequence[int]) -> tuple:
    """Index of the strided slice of a padded buffer that kernel tap ``kk`` sees at every output."""
    return (slice(None), slice(None)) + tuple(
        slice(k * d, k * d + (o - 1) * s + 1, s) for k, s, d, o in zip(kk, strides, dilations, out))


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------

def conv_nd(x: np.ndarray, w: np.ndarray, strides, dilations, pads_begin, out: Sequence[int],
            group: int) -> np.ndarray:
    """Y[n, m, *out] of a grouped, strided, dilated convolution (float32/float64 arrays)."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    ks = w.shape[2:]
    nd = len(ks)
    mg = m // group
    p, kn = math.prod(out), math.prod(ks)
    if n * c * m * p * kn == 0:  # an empty tensor: no output, or sums over nothing (0)
        return np.zeros((n, m) + tuple(out), dtype=x.dtype)
    lengths = [(o - 1) * s + (k - 1) * d + 1 for o, s, d, k in zip(out, strides, dilations, ks)]
    xp = pad_to(x, pads_begin, lengths)
    if kn == 1:  # 1x1: a plain matmul on the (strided) input
        xs = xp[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
        y = np.matmul(w.reshape(group, mg, cg), xs.reshape(n, group, cg, p))
    elif cg == 1 and group > 1:  # depthwise: one multiply-add per kernel tap
        wk = w.reshape(group, mg, kn)
        y = np.zeros((n, group, mg) + tuple(out), dtype=x.dtype)
        tmp = np.empty_like(y)
        for i, kk in enumerate(np.ndindex(*ks)):
            np.multiply(xp[tap(kk, strides, dilations, out)][:, :, None],
                        wk[:, :, i].reshape((1, group, mg) + (1,) * nd), out=tmp)
            y += tmp
    else:  # im2col: (N, C, *K, *out) view, one copy, one batched matmul (in row chunks when big)
        st = xp.strides
        view = as_strided(xp, shape=(n, c) + tuple(ks) + tuple(out),
                          strides=st[:2] + tuple(st[2 + i] * dilations[i] for i in range(nd))
                          + tuple(st[2 + i] * strides[i] for i in range(nd)), writeable=False)
        wm = w.reshape(group, mg, cg * kn)
        row = p // out[0]  # output positions per step of the first spatial axis
        step = max(1, _IM2COL_CHUNK // (n * c * kn * row))
        if step >= out[0]:
            y = np.matmul(wm, view.reshape(n, group, cg * kn, p))
        else:
            y = np.empty((n, group, mg, out[0], row), dtype=x.dtype)
            for r in range(0, out[0], step):
                part = view[(Ellipsis, slice(r, r + step)) + (slice(None),) * (nd - 1)]
                rows = part.shape[2 + nd]
                y[:, :, :, r:r + rows] = np.matmul(wm, part.reshape(n, group, cg * kn, rows * row)).reshape(
                    n, group, mg, rows, row)
    return y.reshape((n, m) + tuple(out))


def scatter_taps(cols: np.ndarray, ks: Sequence[int], strides, dilations, pads_begin, out: Sequence[int]):
    """The adjoint of im2col: cols[n, ch, K, *ins] summed into Y[n, ch, *out], the tap ``kk`` of input
    position ``i`` landing at ``i*s + kk*d - pad_begin`` (ConvTranspose, Col2Im)."""
    n, ch = cols.shape[:2]
    ins = cols.shape[3:]
    full = [(i - 1) * s + (k - 1) * d + 1 for i, s, d, k in zip(ins, strides, dilations, ks)]
    lo = [min(0, b) for b in pads_begin]
    hi = [max(f, b + o) for f, b, o in zip(full, pads_begin, out)]
    buf = np.zeros((n, ch) + tuple(h - l for h, l in zip(hi, lo)), dtype=cols.dtype)
    for i, kk in enumerate(np.ndindex(*ks)):
        idx = (slice(None), slice(None)) + tuple(slice(k * d - l, k * d - l + (sz - 1) * s + 1, s)
                                                 for k, d, l, sz, s in zip(kk, dilations, lo, ins, strides))
        buf[idx] += cols[:, :, i]
    crop = (slice(None), slice(None)) + tuple(slice(b - l, b - l + o) for b, l, o in zip(pads_begin, lo, out))
    return np.ascontiguousarray(buf[crop])


def _args(ins) -> list:
    return (list(ins) + [None] * 5)[:5]


def _check_conv_attrs(op: OpDef) -> None:
    """The window attributes and ``group`` of Conv and ConvTranspose."""
    check_window_attrs(op, auto_pad=op.auto_pad, strides=op.strides, dilations=op.dilations, pads=op.pads,
                       kernel_shape=op.kernel_shape)
    if op.group < 1:
        raise op.fail(f"group must be positive, got {op.group}")


def _check_ranks(op: OpDef, x, w, w_layout: str) -> None:
    """X is (N, C, spatial...) and W of X's rank, laid out as (``w_layout``, kernel...)."""
    if x.type.rank < 3:
        raise op.fail(f"X must have rank >= 3 (N, C, spatial...), got {x.type}")
    if w.type.rank != x.type.rank:
        raise op.fail(f"W must have X's rank {x.type.rank} ({w_layout}, kernel...), got {w.type}")


def _check_bias(op: OpDef, b, m) -> None:
    """B, when given, is a vector of the ``m`` output channels."""
    if b is not None and (b.type.rank != 1 or (is_static(m) and is_static(b.shape[0]) and b.shape[0] != m)):
        raise op.fail(f"B must be a vector of the {m} output channels, got {b.type}")


# ---------------------------------------------------------------------------------------------
# Conv
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Conv(OpDef):
    """N-d grouped convolution: Y[n, m] = sum_c W[m, c] * X[n, group(m) c] + B[m] (cross-correlation)."""

    auto_pad: str = "NOTSET"
    dilations: tuple[int, ...] = ()
    group: int = 1
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    inputs: ClassVar = ("X", "W", "B?")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OUT_ELEMWISE_FUSABLE
    since: ClassVar = 11

    def validate(self):
        _check_conv_attrs(self)

    def _kernel(self, w_shape) -> tuple:
        nd = len(w_shape) - 2
        if self.kernel_shape:
            if len(self.kernel_shape) != nd:
                raise self.fail(f"kernel_shape {list(self.kernel_shape)} has {len(self.kernel_shape)} entries, "
                                f"the weights have {nd} spatial axes")
            for k, wd in zip(self.kernel_shape, w_shape[2:]):
                if is_static(wd) and wd != k:
                    raise self.fail(f"kernel_shape {list(self.kernel_shape)} does not match the weights' "
                                    f"spatial shape {list(w_shape[2:])}")
            return tuple(self.kernel_shape)
        return tuple(w_shape[2:])

    def infer(self, ins):
        x, w, b = _args(ins)[:3]
        dt = same_dtype(self, [x, w, b], STD_FLOATS)
        _check_ranks(self, x, w, "M, C/group")
        nd = x.type.rank - 2
        kernel = self._kernel(w.shape)
        strides, dilations, pads = spatial_attrs(self, nd, self.strides, self.dilations, self.pads)
        c, m, cg = x.shape[1], w.shape[0], w.shape[1]
        if is_static(c) and is_static(cg) and cg * self.group != c:
            raise self.fail(f"X has {c} channels but W {w.type} with group={self.group} takes "
                            f"{cg} x {self.group} = {cg * self.group}")
        if is_static(m) and m % self.group:
            raise self.fail(f"the {m} output channels of W {w.type} do not divide into group={self.group}")
        _check_bias(self, b, m)
        dims = window_dims(self, x.shape[2:], kernel, strides, dilations, pads, self.auto_pad)
        return [TensorType(dt, (x.shape[0], m) + dims)]

    def compute(self, x, w, b=None):
        nd = x.ndim - 2
        strides, dilations, pads = spatial_attrs(self, nd, self.strides, self.dilations, self.pads)
        out, pb, _ = resolve_geometry(self, x.shape[2:], w.shape[2:], strides, dilations, pads, self.auto_pad)
        ct = compute_dtype(x.dtype)
        y = conv_nd(x.astype(ct, copy=False), w.astype(ct, copy=False), strides, dilations, pb, out, self.group)
        if b is not None:
            y += b.astype(ct).reshape((1, -1) + (1,) * nd)
        return [y.astype(x.dtype, copy=False)]

    def cost(self, ins, outs):
        w = ins[1]
        per_out = math.prod(w.shape[1:]) if w.is_static else 0
        return Cost(2 * (outs[0].numel or 0) * per_out, super().cost(ins, outs).bytes)


# ---------------------------------------------------------------------------------------------
# ConvTranspose
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ConvTranspose(OpDef):
    """The transpose (gradient) of Conv: each input position scatters W[c] * X[n, c] into the output."""

    auto_pad: str = "NOTSET"
    dilations: tuple[int, ...] = ()
    group: int = 1
    kernel_shape: tuple[int, ...] = ()
    output_padding: tuple[int, ...] = ()
    output_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    inputs: ClassVar = ("X", "W", "B?")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OUT_ELEMWISE_FUSABLE
    since: ClassVar = 11

    def validate(self):
        _check_conv_attrs(self)
        if any(p < 0 for p in self.output_padding):
            raise self.fail(f"output_padding must not be negative, got {list(self.output_padding)}")
        if any(s < 1 for s in self.output_shape):
            raise self.fail(f"output_shape must be positive, got {list(self.output_shape)}")

    _kernel = Conv._kernel

    def _geometry(self, in_dims, kernel):
        """(out dims, pad begins) per spatial axis; None entries where not static."""
        nd = len(in_dims)
        strides, dilations, pads = spatial_attrs(self, nd, self.strides, self.dilations, self.pads)
        opad = tuple(self.output_padding) or (0,) * nd
        if len(opad) != nd:
            raise self.fail(f"output_padding has {len(opad)} entries, the input has {nd} spatial axes")
        for i in range(nd):
            if opad[i] >= max(strides[i], dilations[i]):
                raise self.fail(f"output_padding {list(opad)} must be smaller than the stride or the dilation "
                                f"on each axis (strides {list(strides)}, dilations {list(dilations)})")
        oshape = tuple(self.output_shape)
        if oshape and len(oshape) == nd + 2:
            oshape = oshape[2:]
        if oshape and len(oshape) != nd:
            raise self.fail(f"output_shape {list(self.output_shape)} must give the {nd} spatial sizes")
        outs, begins = [], []
        for i, size in enumerate(in_dims):
            k = kernel[i]
            if not (is_static(k) and is_static(size)):
                outs.append(oshape[i] if oshape else None)
                begins.append(None)
                continue
            full = strides[i] * (size - 1) + opad[i] + (k - 1) * dilations[i] + 1
            if oshape or self.auto_pad in _SAME:
                target = oshape[i] if oshape else size * strides[i]
                total = full - target
                pb = total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2
                outs.append(target)
                begins.append(pb)
            else:
                pb, pe = (0, 0) if self.auto_pad == "VALID" else (pads[i], pads[nd + i])
                if full - pb - pe < 1:
                    raise self.fail(f"spatial axis {i}: pads {list(pads)} remove the whole output "
                                    f"({full} before padding)")
                outs.append(full - pb - pe)
                begins.append(pb)
        return tuple(outs), tuple(begins), strides, dilations

    def infer(self, ins):
        x, w, b = _args(ins)[:3]
        dt = same_dtype(self, [x, w, b], STD_FLOATS)
        _check_ranks(self, x, w, "C, M/group")
        c, mg = x.shape[1], w.shape[1]
        if is_static(c) and is_static(w.shape[0]) and w.shape[0] != c:
            raise self.fail(f"X has {c} channels but W {w.type} takes {w.shape[0]}")
        if is_static(c) and c % self.group:
            raise self.fail(f"the {c} input channels do not divide into group={self.group}")
        m = mg * self.group if is_static(mg) else None
        _check_bias(self, b, m)
        dims, _, _, _ = self._geometry(x.shape[2:], self._kernel(w.shape))
        return [TensorType(dt, (x.shape[0], m) + dims)]

    def compute(self, x, w, b=None):
        n, c = x.shape[:2]
        ks = w.shape[2:]
        nd = len(ks)
        out, begins, strides, dilations = self._geometry(x.shape[2:], ks)
        ct = compute_dtype(x.dtype)
        g = self.group
        cg, mg = c // g, w.shape[1]
        kn, p = math.prod(ks), math.prod(x.shape[2:])
        wt = w.astype(ct, copy=False).reshape(g, cg, mg * kn).transpose(0, 2, 1)
        cols = np.matmul(wt, x.astype(ct, copy=False).reshape(n, g, cg, p))  # (n, g, mg*K, P)
        cols = cols.reshape((n, g * mg, kn) + tuple(x.shape[2:]))
        y = scatter_taps(cols, ks, strides, dilations, begins, out)
        if b is not None:
            y += b.astype(ct).reshape((1, -1) + (1,) * nd)
        return [y.astype(x.dtype, copy=False)]

    def cost(self, ins, outs):
        x, w = ins[0], ins[1]
        macs = (x.numel or 0) * (math.prod(w.shape[1:]) if w.is_static else 0)
        return Cost(2 * macs, super().cost(ins, outs).bytes)


# ---------------------------------------------------------------------------------------------
# DeformConv
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class DeformConv(OpDef):
    """Deformable convolution: every kernel tap samples X (n-linearly) at its position plus a learned
    offset, optionally scaled by a mask, then the samples are convolved with W."""

    dilations: tuple[int, ...] = ()
    group: int = 1
    kernel_shape: tuple[int, ...] = ()
    offset_group: int = 1
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    inputs: ClassVar = ("X", "W", "offset", "B?", "mask?")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 19

    def validate(self):
        check_window_attrs(self, strides=self.strides, dilations=self.dilations, pads=self.pads,
                           kernel_shape=self.kernel_shape)
        if self.group < 1 or self.offset_group < 1:
            raise self.fail(f"group and offset_group must be positive, got {self.group}, {self.offset_group}")

    _kernel = Conv._kernel

    def infer(self, ins):
        x, w, off, b, mask = _args(ins)
        dt = same_dtype(self, [x, w, off, b, mask], STD_FLOATS)
        if x.type.rank < 3 or w.type.rank != x.type.rank:
            raise self.fail(f"X (N, C, spatial...) and W (M, C/group, kernel...) must have one rank >= 3, "
                            f"got {x.type} and {w.type}")
        nd = x.type.rank - 2
        kernel = self._kernel(w.shape)
        strides, dilations, pads = spatial_attrs(self, nd, self.strides, self.dilations, self.pads)
        c, m, cg = x.shape[1], w.shape[0], w.shape[1]
        if is_static(c) and is_static(cg) and cg * self.group != c:
            raise self.fail(f"X has {c} channels but W {w.type} with group={self.group} takes {cg * self.group}")
        if is_static(c) and c % self.offset_group:
            raise self.fail(f"the {c} input channels do not divide into offset_group={self.offset_group}")
        dims = window_dims(self, x.shape[2:], kernel, strides, dilations, pads)
        kn = math.prod(kernel) if all(is_static(k) for k in kernel) else None
        for v, what, per in ((off, "offset", nd), (mask, "mask", 1)):
            if v is None:
                continue
            if v.type.rank != x.type.rank:
                raise self.fail(f"{what} must have rank {x.type.rank}, got {v.type}")
            want = None if kn is None else self.offset_group * kn * per
            if is_static(v.shape[1]) and want is not None and v.shape[1] != want:
                raise self.fail(f"{what} must have offset_group * kernel taps{' * spatial axes' if per > 1 else ''}"
                                f" = {want} channels, got {v.type}")
        _check_bias(self, b, m)
        return [TensorType(dt, (x.shape[0], m) + dims)]

    def compute(self, x, w, off, b=None, mask=None):
        n, c = x.shape[:2]
        spatial = x.shape[2:]
        ks = w.shape[2:]
        nd = len(ks)
        strides, dilations, pads = spatial_attrs(self, nd, self.strides, self.dilations, self.pads)
        out, pb, _ = resolve_geometry(self, spatial, ks, strides, dilations, pads)
        ct = compute_dtype(x.dtype)
        og, kn, p = self.offset_group, math.prod(ks), math.prod(out)
        cpg = c // og
        off = off.astype(ct, copy=False).reshape(n, og, kn, nd, p)
        taps = np.array(list(np.ndindex(*ks)), dtype=np.int64).reshape(kn, nd)
        grid = np.indices(out).reshape(nd, p)
        xg = x.astype(ct, copy=False).reshape(n, og, cpg, -1)
        lo, frac = [], []
        for i in range(nd):
            base = grid[i][None, :] * strides[i] - pb[i] + taps[:, i][:, None] * dilations[i]  # (K, P)
            pos = base + off[:, :, :, i]
            f = np.floor(pos)
            lo.append(f.astype(np.int64))
            frac.append(pos - f)
        cols = np.zeros((n, og, cpg, kn * p), dtype=ct)
        sizes = np.array(spatial)
        flat_strides = [math.prod(spatial[i + 1:]) for i in range(nd)]
        for corner in np.ndindex(*(2,) * nd):
            wgt = np.ones((n, og, kn, p), dtype=ct)
            flat = np.zeros((n, og, kn, p), dtype=np.int64)
            for i in range(nd):
                idx = lo[i] + corner[i]
                wgt *= frac[i] if corner[i] else 1 - frac[i]
                ok = (idx >= 0) & (idx < sizes[i])
                wgt *= ok
                flat += np.clip(idx, 0, sizes[i] - 1) * flat_strides[i]
            vals = np.take_along_axis(xg, flat.reshape(n, og, 1, kn * p), axis=3)
            cols += vals * wgt.reshape(n, og, 1, kn * p)
        if mask is not None:
            cols *= mask.astype(ct, copy=False).reshape(n, og, 1, kn * p)
        g = self.group
        m, cg = w.shape[:2]
        y = np.matmul(w.astype(ct, copy=False).reshape(g, m // g, cg * kn), cols.reshape(n, g, cg * kn, p))
        y = y.reshape((n, m) + tuple(out))
        if b is not None:
            y += b.astype(ct).reshape((1, -1) + (1,) * nd)
        return [y.astype(x.dtype, copy=False)]

    cost = Conv.cost


# ---------------------------------------------------------------------------------------------
# Col2Im
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Col2Im(OpDef):
    """Rearrange column blocks (N, C * prod(block), L) back into an image (N, C, *image_shape), summing
    overlapping blocks (the adjoint of im2col)."""

    dilations: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    inputs: ClassVar = ("input", "image_shape", "block_shape")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 18

    def validate(self):
        check_window_attrs(self, strides=self.strides, dilations=self.dilations, pads=self.pads)

    def _spatial_rank(self, image_shape, block_shape) -> int:
        for v, what in ((image_shape, "image_shape"), (block_shape, "block_shape")):
            check_dtype(self, v, {DType.i64}, what)
            if v.type.rank != 1 or not is_static(v.shape[0]):
                raise self.fail(f"{what} must be a 1-D int64 tensor of static length, got {v.type}")
        if image_shape.shape[0] != block_shape.shape[0]:
            raise self.fail(f"image_shape {image_shape.type} and block_shape {block_shape.type} must have "
                            "one length")
        return image_shape.shape[0]

    def _geometry(self, image, block, nd):
        strides, dilations, pads = spatial_attrs(self, nd, self.strides, self.dilations, self.pads)
        blocks = []
        for i in range(nd):
            blocks.append(axis_geometry(self, i, image[i], block[i], strides[i], dilations[i], pads[i],
                                        pads[nd + i])[0])
        return tuple(blocks), strides, dilations, pads

    def infer(self, ins):
        x, image_shape, block_shape = ins
        dt = check_dtype(self, x, STD_NUMERIC, "input")
        nd = self._spatial_rank(image_shape, block_shape)
        if x.type.rank != 3:
            raise self.fail(f"input must have rank 3 (N, C * prod(block_shape), L), got {x.type}")
        image, block = known_ints(image_shape), known_ints(block_shape)
        if block is not None and any(k < 1 for k in block):
            raise self.fail(f"block_shape must be positive, got {block}")
        if image is not None and any(s < 1 for s in image):
            raise self.fail(f"image_shape must be positive, got {image}")
        c = None
        if block is not None:
            kn = math.prod(block)
            if is_static(x.shape[1]):
                if x.shape[1] % kn:
                    raise self.fail(f"input dim 1 ({x.shape[1]}) is not a multiple of prod(block_shape) = {kn}")
                c = x.shape[1] // kn
            if image is not None:
                blocks, *_ = self._geometry(image, block, nd)
                if is_static(x.shape[2]) and x.shape[2] != math.prod(blocks):
                    raise self.fail(f"input has {x.shape[2]} blocks but image_shape {image} and block_shape "
                                    f"{block} (with pads/strides/dilations) hold {math.prod(blocks)}")
        dims = tuple(image) if image is not None else (None,) * nd
        return [TensorType(dt, (x.shape[0], c) + dims)]

    def compute(self, x, image_shape, block_shape):
        image = [int(v) for v in image_shape]
        block = [int(v) for v in block_shape]
        nd = len(image)
        blocks, strides, dilations, pads = self._geometry(image, block, nd)
        kn = math.prod(block)
        if x.shape[2] != math.prod(blocks):
            raise self.fail(f"input has {x.shape[2]} blocks, the geometry holds {math.prod(blocks)}")
        n = x.shape[0]
        xs = x if x.dtype.kind in "iu" else x.astype(compute_dtype(x.dtype), copy=False)
        cols = xs.reshape((n, x.shape[1] // kn, kn) + blocks)
        y = scatter_taps(cols, block, strides, dilations, pads[:nd], image)
        return [y.astype(x.dtype, copy=False)]


# ---------------------------------------------------------------------------------------------
# CausalConvWithState
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class CausalConvWithState(OpDef):
    """Stateful causal depthwise 1-D conv (Mamba / Gated DeltaNet): the input (B, C, L) is prefixed with
    the carried state (B, C, k-1) (zeros when absent), convolved per channel with weight (C, 1, k) with no
    padding, plus bias, optionally followed by SiLU; the last k-1 positions of the prefixed sequence are
    the new state."""

    activation: str = "none"
    inputs: ClassVar = ("input", "weight", "bias?", "past_state?")
    outputs: ClassVar = ("output", "present_state")
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 27

    def validate(self):
        if self.activation not in ("none", "silu", "swish"):
            raise self.fail(f"activation must be 'none', 'silu' or 'swish', got {self.activation!r}")

    def infer(self, ins):
        x, w, b, past = _args(ins)[:4]
        dt = same_dtype(self, [x, w, b, past], {DType.f16, DType.bf16, DType.f32, DType.f64})
        if x.type.rank != 3:
            raise self.fail(f"input must have rank 3 (batch, channels, length), got {x.type}")
        if w.type.rank != 3 or (is_static(w.shape[1]) and w.shape[1] != 1):
            raise self.fail(f"weight must have shape (channels, 1, k), got {w.type}")
        bt, c, _ = x.shape
        if is_static(c) and is_static(w.shape[0]) and w.shape[0] != c:
            raise self.fail(f"weight {w.type} must have the input's {c} channels")
        k = w.shape[2]
        state = k - 1 if is_static(k) else None
        if b is not None and (b.type.rank != 1 or (is_static(c) and is_static(b.shape[0]) and b.shape[0] != c)):
            raise self.fail(f"bias must be a vector of the {c} channels, got {b.type}")
        if past is not None:
            want = (bt, c, state)
            if past.type.rank != 3 or any(is_static(a) and is_static(e) and a != e for a, e in zip(past.shape, want)):
                raise self.fail(f"past_state must have shape (batch, channels, k - 1) = "
                                f"({', '.join(str(d) for d in want)}), got {past.type}")
        return [x.type, TensorType(dt, (bt, c, state))]

    def compute(self, x, w, b=None, past=None):
        bt, c, length = x.shape
        k = w.shape[2]
        if past is None:
            past = np.zeros((bt, c, k - 1), dtype=x.dtype)
        padded = np.concatenate([past.astype(x.dtype, copy=False), x], axis=2)
        ct = compute_dtype(x.dtype)
        pf = padded.astype(ct, copy=False)
        wf = w.astype(ct, copy=False).reshape(c, k)
        y = np.zeros((bt, c, length), dtype=ct)
        for j in range(k):
            y += pf[:, :, j:j + length] * wf[None, :, j, None]
        if b is not None:
            y += b.astype(ct)[None, :, None]
        if self.activation != "none":
            y = y.astype(x.dtype).astype(np.float32)  # the conv result is rounded to T before SiLU
            y = y / (1.0 + np.exp(-y))
        return [y.astype(x.dtype), np.ascontiguousarray(padded[:, :, padded.shape[2] - (k - 1):])]

    def cost(self, ins, outs):
        w = ins[1]
        k = w.shape[2] if is_static(w.shape[2]) else 1
        return Cost(2 * k * (outs[0].numel or 0), super().cost(ins, outs).bytes)


# ---------------------------------------------------------------------------------------------
# LRN
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class LRN(OpDef):
    """Local response normalization across channels:
    y = x / (bias + alpha / size * sum of x^2 over the ``size`` channels around c) ** beta."""

    size: int = 0
    alpha: float = 0.0001
    beta: float = 0.75
    bias: float = 1.0
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 13

    def validate(self):
        if self.size < 1:
            raise self.fail(f"size (the number of channels to sum over) must be a positive int, got {self.size}")

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, STD_FLOATS, "X")
        if x.type.rank < 3:
            raise self.fail(f"X must have rank >= 3 (N, C, spatial...), got {x.type}")
        return [x.type]

    def compute(self, x):
        ct = compute_dtype(x.dtype)
        xf = x.astype(ct, copy=False)
        c = x.shape[1]
        before, after = (self.size - 1) // 2, self.size // 2  # floor((size-1)/2), ceil((size-1)/2)
        sq = np.zeros((x.shape[0], c + before + after) + x.shape[2:], dtype=ct)
        sq[:, before:before + c] = xf * xf
        total = np.zeros_like(xf)
        for j in range(self.size):
            total += sq[:, j:j + c]
        y = xf / (ct.type(self.bias) + ct.type(self.alpha / self.size) * total) ** ct.type(self.beta)
        return [y.astype(x.dtype, copy=False)]

    def cost(self, ins, outs):
        return Cost((self.size + 6) * (outs[0].numel or 0), super().cost(ins, outs).bytes)


OPS = (Conv, ConvTranspose, DeformConv, Col2Im, CausalConvWithState, LRN)
