"""Signal-processing ops: DFT, STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix.

Complex tensors follow the ONNX convention: a trailing dimension of 2 holds (real, imaginary); a real
signal has a trailing dimension of 1. Transforms run in the input's precision (f32 -> complex64,
f64 -> complex128; f16/bf16 in f32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import STD_FLOATS, STD_NUMERIC, Cost, OpDef, Pattern, check_dtype, known_ints
from .common import check_flags

_INDEX = frozenset({DType.i32, DType.i64})


def _scalar_input(op: OpDef, v, what: str) -> None:
    check_dtype(op, v, _INDEX, what)
    if v.type.rank > 1 or (v.type.rank == 1 and isinstance(v.shape[0], int) and v.shape[0] != 1):
        raise op.fail(f"{what} must be a scalar, got {v.type}")


def _known_scalar(v) -> int | None:
    vals = known_ints(v)
    return vals[0] if vals is not None and len(vals) == 1 else None


def _as_complex(x: np.ndarray) -> np.ndarray:
    """(..., 1) real or (..., 2) complex -> a NumPy complex array in the input's precision."""
    ctype = np.complex128 if x.dtype == np.float64 else np.complex64
    rtype = np.float64 if x.dtype == np.float64 else np.float32
    xr = x.astype(rtype, copy=False)
    if x.shape[-1] == 1:
        return xr[..., 0].astype(ctype)
    out = np.empty(x.shape[:-1], dtype=ctype)
    out.real = xr[..., 0]
    out.imag = xr[..., 1]
    return out


def _from_complex(c: np.ndarray, dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


def _fft_flops(n: int | None, length: int | None) -> int:
    if not n or not length:
        return 0
    return int(5 * n * max(1.0, np.log2(max(length, 2))))


# ---------------------------------------------------------------------------------------------
# DFT
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class DFT(OpDef):
    """Discrete Fourier transform along ``axis`` (an input, default -2) of a real (..., 1) or complex
    (..., 2) signal, zero-padded or truncated to ``dft_length``.

    ``onesided=1`` forward (RFFT: real input) returns bins 0..n/2; ``onesided=1`` inverse (IRFFT:
    one-sided complex input) returns a real signal of length ``dft_length`` (default 2*(bins-1)).
    The inverse transform is scaled by 1/n.
    """

    inverse: int = 0
    onesided: int = 0

    since: ClassVar = 20
    inputs: ClassVar = ("input", "dft_length?", "axis?")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        check_flags(self, "inverse", "onesided")

    def _axis(self, axis: int, rank: int) -> int:
        if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
            raise self.fail(f"axis {axis} is out of range for an input of rank {rank} (accepted: "
                            f"[{-rank}, -2] or [0, {rank - 2}]; the last dimension holds real/imaginary parts)")
        return axis % rank

    def _check_parts(self, parts) -> None:
        if isinstance(parts, int) and parts not in (1, 2):
            raise self.fail(f"the last input dimension must be 1 (real) or 2 (complex), got {parts}")
        if self.onesided and not self.inverse and parts == 2:
            raise self.fail("onesided=1 forward DFT (RFFT) needs a real input (last dimension 1), got a complex one")
        if self.onesided and self.inverse and parts == 1:
            raise self.fail("onesided=1 inverse DFT (IRFFT) needs a one-sided complex input (last dimension 2), "
                            "got a real one")

    def infer(self, ins):
        x, length, axis = (list(ins) + [None, None])[:3]
        t = check_dtype(self, x, STD_FLOATS, "input")
        rank = x.type.rank
        if rank < 2:
            raise self.fail(f"input must have rank >= 2 (signal dims and a last dimension of 1 or 2), got {x.type}")
        self._check_parts(x.shape[-1])
        n = None
        if length is not None:
            _scalar_input(self, length, "dft_length")
            n = _known_scalar(length)
            if n is not None and n <= 0:
                raise self.fail(f"dft_length must be positive, got {n}")
        ax = -2
        if axis is not None:
            check_dtype(self, axis, frozenset({DType.i64}), "axis")
            if axis.type.rank > 1:
                raise self.fail(f"axis must be a scalar, got {axis.type}")
            ax = _known_scalar(axis)
        out_parts = 1 if self.onesided and self.inverse else 2
        if ax is None:
            # the axis is not known: only a full-length, two-sided transform keeps every dim
            if length is None and not self.onesided:
                return [TensorType(t, tuple(x.shape[:-1]) + (out_parts,))]
            return [TensorType(t, (None,) * (rank - 1) + (out_parts,))]
        ax = self._axis(ax, rank)
        dim = x.shape[ax]
        if n is None and length is None:
            if self.onesided and self.inverse:
                n = 2 * (dim - 1) if isinstance(dim, int) else None
            else:
                n = dim if isinstance(dim, int) else None
            keep_symbolic = not self.onesided
        else:
            keep_symbolic = False
        if self.onesided and not self.inverse:
            out_dim = n // 2 + 1 if n is not None else None
        elif keep_symbolic:
            out_dim = dim
        else:
            out_dim = n
        shape = list(x.shape[:-1]) + [out_parts]
        shape[ax] = out_dim
        return [TensorType(t, tuple(shape))]

    def compute(self, x, dft_length=None, axis=None):
        rank = x.ndim
        ax = self._axis(int(np.asarray(axis).ravel()[0]) if axis is not None else -2, rank)
        self._check_parts(x.shape[-1])
        n = int(np.asarray(dft_length).ravel()[0]) if dft_length is not None else None
        if n is not None and n <= 0:
            raise ValueError(f"dft_length must be positive, got {n}")
        c = _as_complex(x)
        if self.onesided and self.inverse:
            if n is None:
                n = 2 * (x.shape[ax] - 1)
            out = np.fft.irfft(c, n=n, axis=ax)
            return [out[..., None].astype(x.dtype)]
        if self.inverse:
            out = np.fft.ifft(c, n=n, axis=ax)
        else:
            out = np.fft.fft(c, n=n, axis=ax)
            if self.onesided:
                bins = out.shape[ax] // 2 + 1
                out = np.take(out, np.arange(bins), axis=ax)
        return [_from_complex(out, x.dtype)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        x = ins[0]
        # the transform length is at most the largest signal dimension; a rough n log n estimate
        dims = [d for d in x.shape[:-1] if isinstance(d, int)]
        return Cost(_fft_flops(outs[0].numel, max(dims, default=None)), base.bytes)


# ---------------------------------------------------------------------------------------------
# STFT
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class STFT(OpDef):
    """Short-time Fourier transform of ``signal`` (B, L, 1 or 2): frames of ``frame_length`` samples
    every ``frame_step``, multiplied by ``window`` (default all ones), each DFT'd. Output
    (B, frames, bins, 2) with frames = (L - frame_length) // frame_step + 1 and bins = frame_length // 2 + 1
    when ``onesided`` (real input only), else frame_length.
    """

    onesided: int = 1

    since: ClassVar = 17
    inputs: ClassVar = ("signal", "frame_step", "window?", "frame_length?")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        check_flags(self, "onesided")

    def infer(self, ins):
        sig, step, window, length = (list(ins) + [None, None])[:4]
        t = check_dtype(self, sig, STD_FLOATS, "signal")
        if sig.type.rank != 3:
            raise self.fail(f"signal must be 3D (batch, length, 1 or 2), got {sig.type}")
        parts = sig.shape[2]
        if isinstance(parts, int) and parts not in (1, 2):
            raise self.fail(f"the signal's last dimension must be 1 (real) or 2 (complex), got {parts}")
        if self.onesided and parts == 2:
            raise self.fail("onesided=1 needs a real signal (last dimension 1); use onesided=0 for a complex one")
        _scalar_input(self, step, "frame_step")
        fl = None
        if window is not None:
            if window.dtype is not t:
                raise self.fail(f"window has element type {window.dtype}, the signal {t}: they must match")
            if window.type.rank != 1:
                raise self.fail(f"window must be 1D, got {window.type}")
            fl = window.shape[0] if isinstance(window.shape[0], int) else None
        if length is not None:
            _scalar_input(self, length, "frame_length")
            given = _known_scalar(length)
            if given is not None:
                if given <= 0:
                    raise self.fail(f"frame_length must be positive, got {given}")
                if fl is not None and given != fl:
                    raise self.fail(f"frame_length {given} differs from the window length {fl}")
                fl = given
            elif window is None:
                fl = None
        elif window is None:
            fl = sig.shape[1] if isinstance(sig.shape[1], int) else None
        s = _known_scalar(step)
        if s is not None and s <= 0:
            raise self.fail(f"frame_step must be positive, got {s}")
        sl = sig.shape[1]
        frames = None
        if s is not None and fl is not None and isinstance(sl, int):
            if fl > sl:
                raise self.fail(f"frame_length {fl} is longer than the signal ({sl})")
            frames = (sl - fl) // s + 1
        bins = (fl // 2 + 1 if self.onesided else fl) if fl is not None else None
        return [TensorType(t, (sig.shape[0], frames, bins, 2))]

    def compute(self, signal, frame_step, window=None, frame_length=None):
        step = int(np.asarray(frame_step).ravel()[0])
        length = signal.shape[1]
        if frame_length is not None:
            fl = int(np.asarray(frame_length).ravel()[0])
            if window is not None and window.shape[0] != fl:
                raise ValueError(f"frame_length {fl} differs from the window length {window.shape[0]}")
        elif window is not None:
            fl = window.shape[0]
        else:
            fl = length
        if step <= 0 or fl <= 0 or fl > length:
            raise ValueError(f"bad frame_step {step} / frame_length {fl} for a signal of length {length}")
        frames = (length - fl) // step + 1
        idx = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
        c = _as_complex(signal)[:, idx]  # (B, frames, fl)
        if window is not None:
            c = c * window.astype(c.real.dtype)
        out = np.fft.fft(c, axis=-1)
        if self.onesided:
            out = out[..., : fl // 2 + 1]
        return [_from_complex(out, signal.dtype)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(_fft_flops(outs[0].numel, outs[0].shape[2] if isinstance(outs[0].shape[2], int) else None),
                    base.bytes)


# ---------------------------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Window(OpDef):
    """A generalized cosine window of length ``size``: sum_k a_k cos(2 pi k n / N), with N = size when
    ``periodic`` else size - 1; the result is cast to ``output_datatype``."""

    output_datatype: DType = DType.f32
    periodic: int = 1

    since: ClassVar = 17
    inputs: ClassVar = ("size",)
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE
    coefficients: ClassVar[tuple[float, ...]] = ()

    def validate(self):
        check_flags(self, "periodic")
        if self.output_datatype not in STD_NUMERIC:
            raise self.fail(f"output_datatype {self.output_datatype} is not supported (supported: "
                            f"{', '.join(sorted(d.short for d in STD_NUMERIC))})")

    def infer(self, ins):
        (size,) = ins
        _scalar_input(self, size, "size")
        n = _known_scalar(size)
        if n is not None and n < 0:
            raise self.fail(f"size must be >= 0, got {n}")
        return [TensorType(self.output_datatype, (n,))]

    def compute(self, size):
        n = int(np.asarray(size).ravel()[0])
        if n < 0:
            raise ValueError(f"size must be >= 0, got {n}")
        denom = n if self.periodic else n - 1
        if denom <= 0:
            w = np.ones(n, dtype=np.float64)
        else:
            phase = 2 * np.pi * np.arange(n, dtype=np.float64) / denom
            w = np.zeros(n, dtype=np.float64)
            for k, a in enumerate(self.coefficients):
                w += a * np.cos(k * phase)
        return [w.astype(self.output_datatype.np)]


@dataclass(frozen=True, eq=False)
class HannWindow(_Window):
    """0.5 - 0.5 cos(2 pi n / N)."""

    coefficients: ClassVar = (0.5, -0.5)


@dataclass(frozen=True, eq=False)
class HammingWindow(_Window):
    """25/46 - 21/46 cos(2 pi n / N)."""

    coefficients: ClassVar = (25 / 46, -(1 - 25 / 46))


@dataclass(frozen=True, eq=False)
class BlackmanWindow(_Window):
    """0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""

    coefficients: ClassVar = (0.42, -0.5, 0.08)


# ---------------------------------------------------------------------------------------------
# MelWeightMatrix
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class MelWeightMatrix(OpDef):
    """Triangular mel filterbank (dft_length // 2 + 1, num_mel_bins) with mel(f) = 2595 log10(1 + f/700).

    The num_mel_bins + 2 band edges are spaced evenly in mel from lower_edge_hertz by
    (mel(upper) - mel(lower)) / (num_mel_bins + 2) (ONNX's definition) and mapped to spectrogram bins
    floor((dft_length + 1) * f / sample_rate); each band rises linearly from its left edge to 1 at its
    centre and falls to 0 at its right edge.
    """

    output_datatype: DType = DType.f32

    since: ClassVar = 17
    inputs: ClassVar = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        if self.output_datatype not in STD_NUMERIC:
            raise self.fail(f"output_datatype {self.output_datatype} is not supported (supported: "
                            f"{', '.join(sorted(d.short for d in STD_NUMERIC))})")

    def infer(self, ins):
        mel, dft, rate, lo, hi = ins
        for v, what in ((mel, "num_mel_bins"), (dft, "dft_length"), (rate, "sample_rate")):
            _scalar_input(self, v, what)
        for v, what in ((lo, "lower_edge_hertz"), (hi, "upper_edge_hertz")):
            check_dtype(self, v, STD_FLOATS, what)
            if v.type.rank > 1:
                raise self.fail(f"{what} must be a scalar, got {v.type}")
        nm, nd = _known_scalar(mel), _known_scalar(dft)
        if nm is not None and nm <= 0:
            raise self.fail(f"num_mel_bins must be positive, got {nm}")
        if nd is not None and nd <= 0:
            raise self.fail(f"dft_length must be positive, got {nd}")
        return [TensorType(self.output_datatype, (nd // 2 + 1 if nd is not None else None, nm))]

    def compute(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        nm = int(np.asarray(num_mel_bins).ravel()[0])
        nd = int(np.asarray(dft_length).ravel()[0])
        rate = int(np.asarray(sample_rate).ravel()[0])
        lo = float(np.asarray(lower_edge_hertz, dtype=np.float64).ravel()[0])
        hi = float(np.asarray(upper_edge_hertz, dtype=np.float64).ravel()[0])
        if nm <= 0 or nd <= 0 or rate <= 0:
            raise ValueError(f"num_mel_bins ({nm}), dft_length ({nd}) and sample_rate ({rate}) must be positive")
        bins = nd // 2 + 1
        lo_mel = 2595.0 * np.log10(1.0 + lo / 700.0)
        hi_mel = 2595.0 * np.log10(1.0 + hi / 700.0)
        step = (hi_mel - lo_mel) / (nm + 2)
        mels = np.arange(nm + 2, dtype=np.float64) * step + lo_mel
        hz = 700.0 * (np.power(10.0, mels / 2595.0) - 1.0)
        edges = np.floor((nd + 1) * hz / rate).astype(np.int64)
        left, centre, right = edges[:-2], edges[1:-1], edges[2:]
        j = np.arange(bins, dtype=np.int64)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = (j - left) / (centre - left)
            fall = (right - j) / (right - centre)
        w = np.zeros((bins, nm), dtype=np.float64)
        w = np.where((j >= left) & (j < centre), rise, w)
        w = np.where((j > centre) & (j < right), fall, w)
        w = np.where(j == centre, 1.0, w)
        return [w.astype(self.output_datatype.np)]


OPS = (DFT, STFT, HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix)
