"""Random generators: RandomUniform(Like), RandomNormal(Like), Bernoulli, Multinomial.

None is ``foldable``: a random result is never precomputed at compile time (two runs of a graph
draw different numbers unless a ``seed`` is given). With a seed, Kiln's draws are reproducible run
to run but, as ONNX says, not the same numbers as another runtime's.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import ANY, STD_FLOATS, STD_INTS, Cost, OpDef, Pattern, check_dtype

#: the types the generators produce
RANDOM_TYPES = STD_FLOATS
BERNOULLI_TYPES = STD_FLOATS | STD_INTS | {DType.bool}


def rng(seed: float | None) -> np.random.Generator:
    """A generator seeded by the bits of ``seed`` (a float attribute in ONNX), or fresh entropy."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(struct.unpack("<Q", struct.pack("<d", float(seed)))[0])


def _as(values: np.ndarray, dt: DType) -> np.ndarray:
    return values.astype(dt.np)


@dataclass(frozen=True, eq=False)
class _Random(OpDef):
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE
    foldable: ClassVar = False
    since: ClassVar = 22

    def _check_out(self, dt: DType, allowed=RANDOM_TYPES) -> DType:
        if dt not in allowed:
            raise self.fail(f"dtype {dt} is not supported (supported: {', '.join(sorted(d.short for d in allowed))})")
        return dt

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(8 * (outs[0].numel or 0), base.bytes)


class _Uniform:
    def draw(self, shape, dt: DType) -> np.ndarray:
        return _as(rng(self.seed).uniform(self.low, self.high, size=shape), dt)

    def check_params(self):
        if not self.low <= self.high:
            raise self.fail(f"low ({self.low}) must not exceed high ({self.high})")


class _Normal:
    def draw(self, shape, dt: DType) -> np.ndarray:
        return _as(rng(self.seed).normal(self.mean, self.scale, size=shape), dt)

    def check_params(self):
        if not self.scale >= 0:
            raise self.fail(f"scale (the standard deviation) must be >= 0, got {self.scale}")


@dataclass(frozen=True, eq=False)
class _Generator(_Random):
    """A tensor of the static ``shape`` attribute."""

    inputs: ClassVar = ()

    def validate(self):
        if any(d < 0 for d in self.shape):
            raise self.fail(f"shape {list(self.shape)} has a negative dimension")
        self._check_out(self.dtype)
        self.check_params()

    def infer(self, ins):
        return [TensorType(self.dtype, tuple(self.shape))]

    def compute(self):
        return [self.draw(tuple(self.shape), self.dtype)]


@dataclass(frozen=True, eq=False)
class _Like(_Random):
    """A tensor of the input's shape (its values are not read); ``dtype`` defaults to the input's."""

    inputs: ClassVar = ("input",)

    def validate(self):
        if self.dtype is not None:
            self._check_out(self.dtype)
        self.check_params()

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, ANY, "input")
        dt = self._check_out(self.dtype or x.dtype)
        return [x.type.with_dtype(dt)]

    def compute(self, x):
        return [self.draw(x.shape, self.dtype or DType.from_numpy(x.dtype))]


@dataclass(frozen=True, eq=False)
class RandomUniform(_Uniform, _Generator):
    """Uniform draws in [low, high)."""

    shape: tuple[int, ...]
    dtype: DType = DType.f32
    high: float = 1.0
    low: float = 0.0
    seed: float | None = None


@dataclass(frozen=True, eq=False)
class RandomNormal(_Normal, _Generator):
    """Normal draws of mean ``mean`` and standard deviation ``scale``."""

    shape: tuple[int, ...]
    dtype: DType = DType.f32
    mean: float = 0.0
    scale: float = 1.0
    seed: float | None = None


@dataclass(frozen=True, eq=False)
class RandomUniformLike(_Uniform, _Like):
    """Uniform draws in [low, high), of the input's shape."""

    dtype: DType | None = None
    high: float = 1.0
    low: float = 0.0
    seed: float | None = None


@dataclass(frozen=True, eq=False)
class RandomNormalLike(_Normal, _Like):
    """Normal draws of the input's shape."""

    dtype: DType | None = None
    mean: float = 0.0
    scale: float = 1.0
    seed: float | None = None


@dataclass(frozen=True, eq=False)
class Bernoulli(_Random):
    """1 with probability p (each element of the input), else 0; ``dtype`` defaults to the input's."""

    dtype: DType | None = None
    seed: float | None = None
    inputs: ClassVar = ("input",)
    since: ClassVar = 22

    def validate(self):
        if self.dtype is not None:
            self._check_out(self.dtype, BERNOULLI_TYPES)

    def infer(self, ins):
        (p,) = ins
        check_dtype(self, p, RANDOM_TYPES, "input")
        return [p.type.with_dtype(self.dtype or p.dtype)]

    def compute(self, p):
        dt = self.dtype or DType.from_numpy(p.dtype)
        return [_as(rng(self.seed).random(p.shape) < p.astype(np.float64), dt)]


@dataclass(frozen=True, eq=False)
class Multinomial(_Random):
    """``sample_size`` class indices per batch row, drawn from the softmax of the row (the input holds
    unnormalized log-probabilities, [batch_size, class_size]) -> [batch_size, sample_size]."""

    dtype: DType = DType.i32
    sample_size: int = 1
    seed: float | None = None
    inputs: ClassVar = ("input",)

    def validate(self):
        self._check_out(self.dtype, {DType.i32, DType.i64})
        if self.sample_size < 1:
            raise self.fail(f"sample_size must be >= 1, got {self.sample_size}")

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, RANDOM_TYPES, "input")
        if x.type.rank != 2:
            raise self.fail(f"input must be [batch_size, class_size], got {x.type}")
        return [TensorType(self.dtype, (x.shape[0], self.sample_size))]

    def compute(self, x):
        logits = x.astype(np.float64)
        b, c = logits.shape
        if c == 0:
            raise ValueError("Multinomial needs at least one class")
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        cdf = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
        cdf[:, -1] = 1.0
        # one sorted search over all rows: row i's cdf and draws shifted by i stay inside [i, i + 1]
        offset = np.arange(b, dtype=np.float64)[:, None]
        u = rng(self.seed).random((b, self.sample_size))
        idx = np.searchsorted((cdf + offset).ravel(), (u + offset).ravel(), side="right").reshape(b, -1)
        idx = np.minimum(idx - (np.arange(b) * c)[:, None], c - 1)
        return [idx.astype(self.dtype.np)]


OPS = (RandomUniform, RandomNormal, RandomUniformLike, RandomNormalLike, Bernoulli, Multinomial)
