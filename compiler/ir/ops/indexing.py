"""Indexing ops: gather/scatter, selection (Compress, NonZero, TopK, Unique), OneHot and ReverseSequence.
The resampling ops (Resize, GridSample, AffineGrid, RoiAlign) and NonMaxSuppression are in ``resample``.

Indices may be negative wherever ONNX allows it (they count from the end of their axis); an index out
of range is an error at run time. Ops whose result size depends on the data (NonZero, Compress, Unique)
have ``None`` dimensions of the right rank, unless the deciding input is known.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import STD_NUMERIC, Cost, OpDef, Pattern, check_dtype, known_ints, norm_axis, same_dtype
from .common import check_flags

_INDEX = frozenset({DType.i32, DType.i64})
_I64 = frozenset({DType.i64})
_BOOL = frozenset({DType.bool})
_REDUCTIONS = ("none", "add", "mul", "max", "min")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _norm_index(op: OpDef, idx: np.ndarray, dim, what: str = "index") -> np.ndarray:
    """Indices as int64 with negative ones counted from the end; ``dim`` is a size or an array of sizes
    broadcast against ``idx``. An index out of [-dim, dim) fails."""
    idx = np.asarray(idx).astype(np.int64, copy=False)
    dim = np.asarray(dim, dtype=np.int64)
    if idx.size:
        bad = (idx < -dim) | (idx >= dim)
        if bad.any():
            pos = tuple(int(p[0]) for p in np.nonzero(bad))
            size = int(np.broadcast_to(dim, idx.shape)[pos])
            raise op.fail(f"{what} {int(idx[pos])} is out of range for an axis of size {size}")
    return np.where(idx < 0, idx + dim, idx)


def _check_same_dims(op: OpDef, a, b, what: str) -> None:
    """Static dimensions of shapes a and b agree (symbolic/unknown ones are not checked)."""
    if len(a) != len(b):
        raise op.fail(f"{what}: ranks {len(a)} and {len(b)} differ")
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, int) and isinstance(y, int) and x != y:
            raise op.fail(f"{what}: dimension {i} is {x} and {y}")


def _known_array(v) -> np.ndarray | None:
    return None if v is None or v.known is None else np.asarray(v.known)


def _scatter_into(out: np.ndarray, index: tuple, updates: np.ndarray, reduction: str) -> None:
    if reduction == "none":
        out[index] = updates
    elif reduction == "add":
        np.add.at(out, index, updates)
    elif reduction == "mul":
        np.multiply.at(out, index, updates)
    elif reduction == "max":
        np.maximum.at(out, index, updates)
    else:
        np.minimum.at(out, index, updates)


# ---------------------------------------------------------------------------------------------
# Gather
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _GatherAxis(OpDef):
    """Base of Gather and GatherElements, which pick entries of ``data`` along ``axis``."""

    axis: int = 0
    inputs: ClassVar = ("data", "indices")
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.INJECTIVE
    since: ClassVar = 13

    def _operands(self, ins):
        """(data, indices): integer indices into data of rank >= 1."""
        data, idx = ins
        check_dtype(self, idx, _INDEX, "indices")
        if data.type.rank == 0:
            raise self.fail("data must have rank >= 1, got a scalar")
        return data, idx


@dataclass(frozen=True, eq=False)
class Gather(_GatherAxis):
    """Slices of ``data`` along ``axis`` picked by ``indices``: output shape
    data.shape[:axis] + indices.shape + data.shape[axis+1:]."""

    def infer(self, ins):
        data, idx = self._operands(ins)
        a = norm_axis(self, self.axis, data.type.rank)
        return [TensorType(data.dtype, data.shape[:a] + idx.shape + data.shape[a + 1:])]

    def compute(self, data, idx):
        a = self.axis % data.ndim
        return [np.take(data, _norm_index(self, idx, data.shape[a]), axis=a)]


@dataclass(frozen=True, eq=False)
class GatherElements(_GatherAxis):
    """out[i][j][k] = data[indices[i][j][k]][j][k] (for axis 0); the output has indices' shape."""

    def infer(self, ins):
        data, idx = self._operands(ins)
        r = data.type.rank
        if idx.type.rank != r:
            raise self.fail(f"indices must have the rank of data ({data.type}), got {idx.type}")
        a = norm_axis(self, self.axis, r)
        for i, (d, k) in enumerate(zip(data.shape, idx.shape)):
            if i != a and isinstance(d, int) and isinstance(k, int) and k > d:
                raise self.fail(f"indices dimension {i} ({k}) exceeds data's ({d})")
        return [TensorType(data.dtype, idx.shape)]

    def compute(self, data, idx):
        a = self.axis % data.ndim
        i = _norm_index(self, idx, data.shape[a])
        if i.shape != data.shape:  # take_along_axis broadcasts; GatherElements reads a sub-box
            data = data[tuple(slice(0, n) if d != a else slice(None) for d, n in enumerate(i.shape))]
        return [np.take_along_axis(data, i, axis=a)]


@dataclass(frozen=True, eq=False)
class GatherND(OpDef):
    """Gather slices of ``data`` addressed by the index tuples in the last axis of ``indices``,
    with ``batch_dims`` leading batch dimensions shared by both."""

    batch_dims: int = 0
    inputs: ClassVar = ("data", "indices")
    outputs: ClassVar = ("output",)
    since: ClassVar = 13

    def validate(self):
        if self.batch_dims < 0:
            raise self.fail(f"batch_dims must be >= 0, got {self.batch_dims}")

    def infer(self, ins):
        data, idx = ins
        check_dtype(self, idx, _INDEX, "indices")
        r, q, b = data.type.rank, idx.type.rank, self.batch_dims
        if r < 1 or q < 1:
            raise self.fail(f"data and indices must have rank >= 1, got {data.type} and {idx.type}")
        if b >= min(r, q):
            raise self.fail(f"batch_dims={b} must be less than the ranks of data ({r}) and indices ({q})")
        m = idx.shape[-1]
        if not isinstance(m, int):
            raise self.fail(f"the last dimension of indices ({idx.type}) must be static: it sets the output rank")
        if b + m > r:
            raise self.fail(f"index tuples of length {m} with batch_dims={b} exceed data's rank {r}")
        _check_same_dims(self, data.shape[:b], idx.shape[:b], "batch dimensions of data and indices")
        return [TensorType(data.dtype, idx.shape[:-1] + data.shape[b + m:])]

    def compute(self, data, idx):
        b, m = self.batch_dims, idx.shape[-1]
        nb = int(np.prod(data.shape[:b], dtype=np.int64))
        k = int(np.prod(idx.shape[b:-1], dtype=np.int64))
        d = data.reshape((nb,) + data.shape[b:])
        i = _norm_index(self, idx.reshape(nb, k, m), np.array(data.shape[b:b + m], dtype=np.int64))
        bi = np.broadcast_to(np.arange(nb)[:, None], (nb, k))
        out = d[(bi,) + tuple(i[..., j] for j in range(m))]
        return [out.reshape(idx.shape[:-1] + data.shape[b + m:])]


# ---------------------------------------------------------------------------------------------
# Scatter
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Scatter(OpDef):
    """Base of ScatterElements and ScatterND (whose ``reduction`` attribute says how updates are written)."""

    inputs: ClassVar = ("data", "indices", "updates")
    outputs: ClassVar = ("output",)
    since: ClassVar = 18

    def validate(self):
        if self.reduction not in _REDUCTIONS:
            raise self.fail(f"reduction must be one of {', '.join(_REDUCTIONS)}, got {self.reduction!r}")

    def _operands(self, ins):
        """(data, indices, updates), their element types checked."""
        data, idx, upd = ins
        check_dtype(self, idx, _INDEX, "indices")
        same_dtype(self, [data, upd])
        return data, idx, upd


@dataclass(frozen=True, eq=False)
class ScatterElements(_Scatter):
    """A copy of ``data`` with ``updates`` written (or reduced) at the positions that ``indices``
    gives along ``axis`` (the other coordinates are the update's own)."""

    axis: int = 0
    reduction: str = "none"

    def infer(self, ins):
        data, idx, upd = self._operands(ins)
        r = data.type.rank
        if r == 0:
            raise self.fail("data must have rank >= 1, got a scalar")
        if idx.type.rank != r or upd.type.rank != r:
            raise self.fail(f"data, indices and updates must have one rank, got {data.type}, {idx.type}, "
                            f"{upd.type}")
        _check_same_dims(self, idx.shape, upd.shape, "indices and updates shapes")
        norm_axis(self, self.axis, r)
        return [data.type]

    def compute(self, data, idx, upd):
        a = self.axis % data.ndim
        coords = list(np.indices(idx.shape, sparse=True))
        coords[a] = _norm_index(self, idx, data.shape[a])
        out = data.copy()
        _scatter_into(out, tuple(coords), upd, self.reduction)
        return [out]


@dataclass(frozen=True, eq=False)
class ScatterND(_Scatter):
    """A copy of ``data`` with slices ``updates`` written (or reduced) at the index tuples in the last
    axis of ``indices``; updates.shape == indices.shape[:-1] + data.shape[k:]."""

    reduction: str = "none"

    def infer(self, ins):
        data, idx, upd = self._operands(ins)
        if idx.type.rank < 1:
            raise self.fail(f"indices must have rank >= 1, got {idx.type}")
        k = idx.shape[-1]
        if isinstance(k, int):
            if k > data.type.rank:
                raise self.fail(f"index tuples of length {k} exceed data's rank {data.type.rank}")
            _check_same_dims(self, upd.shape, idx.shape[:-1] + data.shape[k:],
                             "updates must have shape indices.shape[:-1] + data.shape[k:]")
        return [data.type]

    def compute(self, data, idx, upd):
        k = idx.shape[-1]
        flat = _norm_index(self, idx.reshape(-1, k), np.array(data.shape[:k], dtype=np.int64))
        u = upd.reshape((flat.shape[0],) + data.shape[k:])
        out = data.copy()
        if k == 0:  # every update addresses the whole tensor
            for j in range(u.shape[0]):
                _scatter_into(out, (Ellipsis,), u[j], self.reduction)
            return [out]
        _scatter_into(out, tuple(flat[:, j] for j in range(k)), u, self.reduction)
        return [out]


@dataclass(frozen=True, eq=False)
class TensorScatter(OpDef):
    """KV-cache update: ``update`` written into a copy of ``past_cache`` along the sequence ``axis`` at
    ``write_indices[batch]`` (zero when absent); ``circular`` mode wraps around the cache length."""

    axis: int = -2
    mode: str = "linear"
    inputs: ClassVar = ("past_cache", "update", "write_indices?")
    outputs: ClassVar = ("present_cache",)
    since: ClassVar = 24

    def validate(self):
        if self.mode not in ("linear", "circular"):
            raise self.fail(f"mode must be 'linear' or 'circular', got {self.mode!r}")

    def infer(self, ins):
        past, upd, widx = (list(ins) + [None])[:3]
        same_dtype(self, [past, upd])
        r = past.type.rank
        if r < 2 or upd.type.rank != r:
            raise self.fail(f"past_cache and update must have one rank >= 2, got {past.type} and {upd.type}")
        a = norm_axis(self, self.axis, r)
        if a == 0:
            raise self.fail("axis cannot be 0 (the batch dimension)")
        _check_same_dims(self, past.shape[:a] + past.shape[a + 1:], upd.shape[:a] + upd.shape[a + 1:],
                         "past_cache and update must agree outside the sequence axis")
        s, m = upd.shape[a], past.shape[a]
        if isinstance(s, int) and isinstance(m, int) and s > m:
            raise self.fail(f"update's sequence length {s} exceeds the cache's {m}")
        if widx is not None:
            check_dtype(self, widx, _I64, "write_indices")
            if widx.type.rank != 1:
                raise self.fail(f"write_indices must be 1-D (batch_size,), got {widx.type}")
        return [past.type]

    def compute(self, past, upd, widx=None):
        a = self.axis % past.ndim
        nb, m, s = past.shape[0], past.shape[a], upd.shape[a]
        w = np.zeros(nb, np.int64) if widx is None else widx.astype(np.int64).reshape(nb)
        pos = w[:, None] + np.arange(s, dtype=np.int64)[None, :]
        if self.mode == "circular":
            pos = pos % m if m else pos
        elif pos.size and (pos.min() < 0 or pos.max() >= m):
            raise self.fail(f"linear mode writes past the cache end: write index + sequence length must be "
                            f"<= {m} (write_indices {w.tolist()}, sequence length {s})")
        shape = [1] * past.ndim
        shape[0], shape[a] = nb, s
        index = np.broadcast_to(pos.reshape(shape), upd.shape)
        out = past.copy()
        np.put_along_axis(out, index, upd, axis=a)
        return [out]


# ---------------------------------------------------------------------------------------------
# OneHot, Compress, NonZero, ReverseSequence
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class OneHot(OpDef):
    """A one-hot axis of size ``depth`` inserted at ``axis``: values[1] where the index matches (negative
    indices count from depth), values[0] elsewhere (and everywhere for out-of-range indices)."""

    axis: int = -1
    inputs: ClassVar = ("indices", "depth", "values")
    outputs: ClassVar = ("output",)
    since: ClassVar = 11

    def infer(self, ins):
        idx, depth, values = ins
        check_dtype(self, idx, STD_NUMERIC, "indices")
        check_dtype(self, depth, STD_NUMERIC, "depth")
        r = idx.type.rank
        if not -r - 1 <= self.axis <= r:
            raise self.fail(f"axis {self.axis} is out of range for an output of rank {r + 1}")
        a = self.axis % (r + 1)
        if depth.type.numel not in (None, 1) or depth.type.rank > 1:
            raise self.fail(f"depth must be a scalar (or a 1-element tensor), got {depth.type}")
        if values.type.rank != 1 or values.shape[0] not in (2, None) and not isinstance(values.shape[0], str):
            raise self.fail(f"values must be a 1-D tensor [off_value, on_value], got {values.type}")
        d = None
        kd = _known_array(depth)
        if kd is not None:
            d = int(kd.ravel()[0])
            if d < 1:
                raise self.fail(f"depth must be >= 1, got {d}")
        return [TensorType(values.dtype, idx.shape[:a] + (d,) + idx.shape[a:])]

    def compute(self, idx, depth, values):
        d = int(np.asarray(depth).ravel()[0])
        a = self.axis % (idx.ndim + 1)
        i = np.asarray(idx).astype(np.int64)
        i = np.where(i < 0, i + d, i)
        hot = np.moveaxis(i[..., None] == np.arange(d, dtype=np.int64), -1, a)
        return [np.where(hot, values[1], values[0]).astype(values.dtype, copy=False)]


@dataclass(frozen=True, eq=False)
class Compress(OpDef):
    """The slices along ``axis`` (of the flattened input when axis is absent) where ``condition`` is true
    (numpy.compress; a shorter condition is false past its end)."""

    axis: int | None = None
    inputs: ClassVar = ("input", "condition")
    outputs: ClassVar = ("output",)
    since: ClassVar = 11

    def infer(self, ins):
        x, cond = ins
        check_dtype(self, cond, _BOOL, "condition")
        if cond.type.rank != 1:
            raise self.fail(f"condition must be 1-D, got {cond.type}")
        n = None
        kc = _known_array(cond)
        if self.axis is None:
            length = x.type.numel
            if kc is not None:
                n = int(np.count_nonzero(kc[:length] if length is not None else kc))
            return [TensorType(x.dtype, (n,))]
        a = norm_axis(self, self.axis, x.type.rank)
        dim = x.shape[a]
        if isinstance(dim, int) and isinstance(cond.shape[0], int) and cond.shape[0] > dim:
            raise self.fail(f"condition has {cond.shape[0]} entries, axis {self.axis} only {dim}")
        if kc is not None:
            n = int(np.count_nonzero(kc))
        return [TensorType(x.dtype, x.shape[:a] + (n,) + x.shape[a + 1:])]

    def compute(self, x, cond):
        c = np.asarray(cond, dtype=bool).ravel()
        if self.axis is None:
            flat = x.ravel()
            return [np.compress(c[:flat.size], flat)]
        a = self.axis % x.ndim
        if c.size > x.shape[a]:
            raise self.fail(f"condition has {c.size} entries, axis {self.axis} only {x.shape[a]}")
        return [np.compress(c, x, axis=a)]


@dataclass(frozen=True, eq=False)
class NonZero(OpDef):
    """The indices of the non-zero elements, one row per input axis: int64 [rank, count]."""

    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    since: ClassVar = 13

    def infer(self, ins):
        (x,) = ins
        n = None
        kx = _known_array(x)
        if kx is not None:
            n = int(np.count_nonzero(kx))
        return [TensorType(DType.i64, (x.type.rank, n))]

    def compute(self, x):
        if x.ndim == 0:
            return [np.zeros((0, int(bool(x))), np.int64)]
        nz = np.nonzero(x)
        return [np.stack(nz).astype(np.int64, copy=False) if nz else np.zeros((0, 0), np.int64)]


@dataclass(frozen=True, eq=False)
class ReverseSequence(OpDef):
    """For each batch entry i, reverse the first sequence_lens[i] elements along the time axis."""

    batch_axis: int = 1
    time_axis: int = 0
    inputs: ClassVar = ("input", "sequence_lens")
    outputs: ClassVar = ("Y",)
    since: ClassVar = 10

    def validate(self):
        if self.batch_axis not in (0, 1) or self.time_axis not in (0, 1) or self.batch_axis == self.time_axis:
            raise self.fail(f"batch_axis and time_axis must be 0 and 1 (in either order), got "
                            f"batch_axis={self.batch_axis}, time_axis={self.time_axis}")

    def infer(self, ins):
        x, lens = ins
        check_dtype(self, lens, _INDEX, "sequence_lens")
        if x.type.rank < 2:
            raise self.fail(f"input must have rank >= 2, got {x.type}")
        if lens.type.rank != 1:
            raise self.fail(f"sequence_lens must be 1-D (batch_size,), got {lens.type}")
        _check_same_dims(self, lens.shape, (x.shape[self.batch_axis],), "sequence_lens and the batch axis")
        return [x.type]

    def compute(self, x, lens):
        t_len = x.shape[self.time_axis]
        ln = lens.astype(np.int64).reshape(-1, 1)
        if (ln < 0).any() or (ln > t_len).any():
            raise self.fail(f"sequence_lens must lie in [0, {t_len}], got {lens.tolist()}")
        t = np.arange(t_len, dtype=np.int64)[None, :]
        src = np.where(t < ln, ln - 1 - t, t)  # (batch, time)
        if self.time_axis == 0:
            src = src.T
        src = src.reshape(src.shape + (1,) * (x.ndim - 2))
        return [np.take_along_axis(x, np.broadcast_to(src, x.shape), axis=self.time_axis)]


# ---------------------------------------------------------------------------------------------
# TopK, Unique
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class TopK(OpDef):
    """The k largest (or smallest) elements along ``axis`` and their indices; equal values keep index
    order (the lower index first). Results are always sorted (sorted=0 leaves the order unspecified)."""

    axis: int = -1
    largest: int = 1
    sorted: int = 1
    inputs: ClassVar = ("X", "K")
    outputs: ClassVar = ("Values", "Indices")
    since: ClassVar = 11

    def validate(self):
        if self.largest not in (0, 1) or self.sorted not in (0, 1):
            raise self.fail(f"largest and sorted must be 0 or 1, got largest={self.largest}, sorted={self.sorted}")

    def infer(self, ins):
        x, k = ins
        check_dtype(self, x, STD_NUMERIC, "X")
        check_dtype(self, k, _I64, "K")
        if k.type.rank > 1 or k.type.numel not in (None, 1):
            raise self.fail(f"K must be a 1-element 1-D tensor, got {k.type}")
        r = x.type.rank
        if r == 0:
            raise self.fail("X must have rank >= 1, got a scalar")
        a = norm_axis(self, self.axis, r)
        kk = known_ints(k)
        dim = None
        if kk is not None:
            dim = kk[0]
            n = x.shape[a]
            if dim < 0 or (isinstance(n, int) and dim > n):
                raise self.fail(f"K={dim} is out of range for axis {self.axis} of size {n}")
        shape = x.shape[:a] + (dim,) + x.shape[a + 1:]
        return [TensorType(x.dtype, shape), TensorType(DType.i64, shape)]

    def compute(self, x, k):
        a = self.axis % x.ndim
        kk = int(np.asarray(k).ravel()[0])
        if kk < 0 or kk > x.shape[a]:
            raise self.fail(f"K={kk} is out of range for axis {self.axis} of size {x.shape[a]}")
        if self.largest:
            # an order-reversing key that keeps ties in index order under a stable sort
            key = np.invert(x) if x.dtype.kind in "iu" else -x
        else:
            key = x
        order = np.argsort(key, axis=a, kind="stable")
        idx = np.take(order, np.arange(kk), axis=a)
        return [np.take_along_axis(x, idx, axis=a), idx.astype(np.int64, copy=False)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        n = ins[0].numel or 0
        dim = ins[0].shape[self.axis % max(ins[0].rank, 1)] if ins[0].rank else 1
        logn = math.log2(dim) if isinstance(dim, int) and dim > 1 else 1
        return Cost(int(n * logn), base.bytes)


@dataclass(frozen=True, eq=False)
class Unique(OpDef):
    """The unique elements (or, with ``axis``, unique slices along it), sorted or in order of first
    occurrence, with the index of each one's first occurrence, the inverse mapping and the counts."""

    axis: int | None = None
    sorted: int = 1
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y", "indices", "inverse_indices", "counts")
    since: ClassVar = 11

    def validate(self):
        check_flags(self, "sorted")

    def infer(self, ins):
        (x,) = ins
        if self.axis is None:
            y_shape, inv = (None,), (x.type.numel,)
        else:
            a = norm_axis(self, self.axis, x.type.rank)
            y_shape, inv = x.shape[:a] + (None,) + x.shape[a + 1:], (x.shape[a],)
        kx = _known_array(x)
        if kx is not None:  # a known input: the exact result sizes
            y, first, _, _ = self.compute(kx)
            n = first.shape[0]
            y_shape = y.shape
        else:
            n = None
        return [TensorType(x.dtype, y_shape), TensorType(DType.i64, (n,)), TensorType(DType.i64, inv),
                TensorType(DType.i64, (n,))]

    def compute(self, x):
        if self.axis is None:
            rows, a = x.reshape(-1, 1), None
        else:
            a = self.axis % x.ndim
            moved = np.moveaxis(x, a, 0)
            rows = moved.reshape(moved.shape[0], -1)
        n, m = rows.shape
        if m == 0 or n == 0:
            order = np.arange(n)
        else:
            order = np.lexsort(tuple(rows[:, j] for j in reversed(range(m))))  # stable: ties by index
        srt = rows[order]
        starts = np.ones(n, dtype=bool)
        if n > 1 and m > 0:
            starts[1:] = np.any(srt[1:] != srt[:-1], axis=1)
        elif n > 1:
            starts[1:] = False
        group = np.cumsum(starts) - 1
        first = order[starts]
        pos = np.flatnonzero(starts)
        counts = np.diff(np.append(pos, n))
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = group
        uniq = srt[starts]
        if not self.sorted:
            perm = np.argsort(first, kind="stable")
            uniq, first, counts = uniq[perm], first[perm], counts[perm]
            rank = np.empty_like(perm)
            rank[perm] = np.arange(perm.size)
            inverse = rank[inverse]
        if a is None:
            y = uniq.reshape(-1)
        else:
            y = np.moveaxis(uniq.reshape((uniq.shape[0],) + moved.shape[1:]), 0, a)
        i64 = np.int64
        return [y.astype(x.dtype, copy=False), first.astype(i64), inverse.astype(i64), counts.astype(i64)]


OPS = (Gather, GatherElements, GatherND, ScatterElements, ScatterND, TensorScatter, OneHot, Compress, NonZero,
       ReverseSequence, TopK, Unique)
