"""Shape ops: reshapes (Reshape, Flatten, Squeeze, Unsqueeze, Identity), axis permutations and
rearrangements (Transpose, DepthToSpace, SpaceToDepth) and shape queries (Shape, Size). The ops that build
or combine tensors (Concat, Split, Slice, Pad, Expand, Tile, generators) are in ``tensor``, which uses the
shape-operand helpers defined here.

Shape inference is the point of most of these ops. Shape-determining operands (Reshape's shape,
Slice's starts, Pad's pads, ...) are read with ``known_ints`` where their values are known at compile
time; a 1-D shape operand built from ``Shape`` of a symbolically shaped value (through Concat, Slice,
Gather, Squeeze/Unsqueeze, Cast, Identity) is traced by ``shape_dims`` so that symbolic dimensions
(``"N"``) carry through ``x.reshape(x.shape[0], -1)``-style graphs. When an operand is not known, the
result has the right rank and unknown (``None``) dimensions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..graph import Value
from ..types import DType, TensorType
from .base import Cost, OpDef, Pattern, check_dtype, known_ints, norm_axis
from .common import check_flags

#: integer element types accepted for shape-like operands (shapes, axes, pads, starts, ...)
INDEX = frozenset({DType.i32, DType.i64})


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def dim_product(dims) -> int | str | None:
    """The product of dimensions: an int when all are static, the one symbol when the rest multiply to 1,
    0 when a static dimension is 0, else None."""
    static = 1
    other = []
    for d in dims:
        if isinstance(d, int):
            static *= d
        else:
            other.append(d)
    if not other or static == 0:
        return static
    if len(other) == 1 and static == 1 and isinstance(other[0], str):
        return other[0]
    return None


def merge_dims(a, b):
    """Two dimensions that must be equal: the most precise of them (None if two symbols differ)."""
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ValueError(f"dimensions {a} and {b} differ")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return a if b is None else b if a is None else None


def shape_dims(v: Value | None) -> list | None:
    """The elements of a 0-D/1-D integer value as dimensions: ints where known, a symbol where the element
    is (traced back to) a symbolic dimension of some value's Shape, None where unknown.

    Returns None when even the number of elements is not known.
    """
    if v is None:
        return None
    if v.known is not None:
        return [int(x) for x in np.asarray(v.known).ravel()]
    if v.type.rank > 1 or not v.dtype.is_int:
        return None
    n = 1 if v.type.rank == 0 else v.shape[0]
    if not isinstance(n, int):
        return None
    traced = _trace_dims(v, depth=0)
    return traced if traced is not None and len(traced) == n else [None] * n


def _trace_dims(v: Value, depth: int) -> list | None:
    node = v.producer
    if node is None or depth > 32:
        return None
    # Concat and Slice live in the tensor family, which imports this module's helpers
    from .tensor import Concat, Slice, _py_slice, _slice_range

    op, ins = node.op, node.inputs

    def sub(x):
        if x is None:
            return None
        if x.known is not None:
            return [int(e) for e in np.asarray(x.known).ravel()]
        if x.type.rank > 1 or not x.dtype.is_int:
            return None
        return _trace_dims(x, depth + 1)

    if isinstance(op, Shape):
        lo, hi = op.bounds(ins[0].type.rank)
        return list(ins[0].shape[lo:hi])
    if isinstance(op, Concat):
        parts = []
        for x in ins:
            if x.type.rank != 1 or not isinstance(x.shape[0], int):
                return None
            got = sub(x)
            parts.extend(got if got is not None and len(got) == x.shape[0] else [None] * x.shape[0])
        return parts
    if isinstance(op, (Identity, Squeeze, Unsqueeze, Reshape, Flatten)):
        return sub(ins[0])  # on 0-D/1-D values these keep the elements in order
    if op.name == "Cast" and getattr(op, "to", None) is not None and op.to.is_int:
        return sub(ins[0]) if ins[0].dtype.is_int else None
    if isinstance(op, Slice):
        data = sub(ins[0])
        st, en = known_ints(ins[1]), known_ints(ins[2])
        steps = known_ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(st or ())
        if data is None or st is None or en is None or steps is None or not len(st) == len(en) == len(steps) == 1:
            return None
        if len(ins) > 3 and ins[3] is not None and known_ints(ins[3]) not in ([0], [-1]):
            return None
        s, e, _ = _slice_range(len(data), st[0], en[0], steps[0])
        return data[_py_slice(s, e, steps[0])]
    if op.name == "Gather" and getattr(op, "axis", 0) in (0, -1) and ins[0].type.rank == 1:
        data, idx = sub(ins[0]), known_ints(ins[1])
        if data is None or idx is None or any(not -len(data) <= i < len(data) for i in idx):
            return None
        return [data[i] for i in idx]
    return None


def _shape_operand(op: OpDef, v: Value, what: str, allow_scalar: bool = False) -> int | None:
    """Check a 1-D integer operand; its static length (None when not static)."""
    check_dtype(op, v, INDEX, what)
    if v.type.rank != 1 and not (allow_scalar and v.type.rank == 0):
        raise op.fail(f"{what} must be a 1-D tensor, got {v.type}")
    n = 1 if v.type.rank == 0 else v.shape[0]
    return n if isinstance(n, int) else None


def _shape_entries(op: OpDef, v: Value, what: str, role: str = "is the output rank",
                   allow_negative: bool = False) -> list:
    """The entries of a 1-D shape operand (``shape_dims``: ints, symbols, None). Its length must be
    static (it ``role``); the entries must not be negative unless ``allow_negative`` (Reshape's -1)."""
    n = _shape_operand(op, v, what)
    dims = shape_dims(v)
    if n is None or dims is None:
        raise op.fail(f"the length of the shape operand ({v.type}) must be static: it {role}")
    if not allow_negative and any(isinstance(d, int) and d < 0 for d in dims):
        raise op.fail(f"shape {dims} has a negative entry")
    return dims


def _norm_axes(op: OpDef, axes, rank: int, what: str = "axes") -> list[int]:
    out = [norm_axis(op, a, rank, what[:-1] if what.endswith("s") else what) for a in axes]
    if len(set(out)) != len(out):
        raise op.fail(f"{what} {list(axes)} repeat an axis")
    return out


def _axes_operand(op: OpDef, v: Value) -> tuple[list[int] | None, int | None]:
    """(the known axes or None, their number) of Squeeze's / Unsqueeze's axes operand; the number must
    be known when the axes are not (it fixes the output rank)."""
    n = _shape_operand(op, v, "axes", allow_scalar=True)
    axes = known_ints(v)
    if axes is None and n is None:
        raise op.fail("the number of axes must be known (it fixes the output rank)")
    return axes, n


def _ints(a: np.ndarray | None) -> list[int] | None:
    return None if a is None else [int(x) for x in np.asarray(a).ravel()]


@dataclass(frozen=True, eq=False)


class _Movement(OpDef):
    """Data movement: no arithmetic (zero FLOPs), inputs read and the output written once."""

    pattern: ClassVar = Pattern.INJECTIVE

    def cost(self, ins, outs):
        return Cost(0, super().cost(ins, outs).bytes)


@dataclass(frozen=True, eq=False)


class _View(_Movement):
    """A change of shape only: free where the backend can alias the buffer."""

    def cost(self, ins, outs):
        return Cost(0, 0)


# ---------------------------------------------------------------------------------------------
# Reshapes
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)


class Reshape(_View):
    """Reshape to ``shape``: 0 copies the input dimension at that index (unless ``allowzero``), -1 (once)
    is inferred from the element count."""

    allowzero: int = 0
    inputs: ClassVar = ("data", "shape")
    outputs: ClassVar = ("reshaped",)
    since: ClassVar = 14

    def validate(self):
        check_flags(self, "allowzero")

    def infer(self, ins):
        x, s = ins
        entries = _shape_entries(self, s, "shape", allow_negative=True)
        if self.allowzero and 0 in entries and -1 in entries:
            raise self.fail("shape may not hold both 0 and -1 when allowzero=1")
        if entries.count(-1) > 1:
            raise self.fail(f"shape {entries} has more than one -1")
        out: list = []
        copied: set[int] = set()
        for i, e in enumerate(entries):
            if isinstance(e, int) and e == 0 and not self.allowzero:
                if i >= x.type.rank:
                    raise self.fail(f"shape {entries}: 0 at index {i} copies a dimension the input "
                                    f"{x.type} does not have")
                out.append(x.shape[i])
                copied.add(i)
            elif isinstance(e, int) and e < -1:
                raise self.fail(f"shape {entries} has an invalid entry {e}")
            else:
                out.append(e)
        if -1 in out:
            at = out.index(-1)
            out[at] = self._infer_minus_one(x.shape, out, at, copied)
        elif all(isinstance(d, int) for d in out) and x.type.is_static and math.prod(out) != x.type.numel:
            raise self.fail(f"cannot reshape {x.type} ({x.type.numel} elements) to {out}")
        return [TensorType(x.dtype, tuple(out))]

    def _infer_minus_one(self, in_shape, out, at, copied):
        # numerator: the input dims not copied by a 0; denominator: the other output dims
        num = [d for i, d in enumerate(in_shape) if i not in copied]
        den_static = 1
        for i, d in enumerate(out):
            if i == at or (i < len(in_shape) and i in copied):
                continue
            if isinstance(d, int):
                den_static *= d
            elif isinstance(d, str) and d in num:
                num.remove(d)
            else:
                return None
        num_static = math.prod(d for d in num if isinstance(d, int))
        rest = [d for d in num if not isinstance(d, int)]
        if den_static == 0:
            raise self.fail(f"cannot infer the -1 in shape with a zero dimension (output {out})")
        if not rest:
            if num_static % den_static:
                raise self.fail(f"cannot reshape {list(in_shape)} to {out}: "
                                f"{num_static} elements are not a multiple of {den_static}")
            return num_static // den_static
        if len(rest) == 1 and isinstance(rest[0], str) and num_static == den_static:
            return rest[0]
        return None

    def compute(self, x, shape):
        entries = _ints(shape)
        copied = {i for i, e in enumerate(entries) if e == 0 and not self.allowzero}
        target = [x.shape[i] if i in copied else e for i, e in enumerate(entries)]
        if -1 in target:
            # as in infer: the dims copied by a 0 cancel, so a zero-size copied dim does not hide the -1
            num = math.prod(d for i, d in enumerate(x.shape) if i not in copied)
            den = math.prod(d for i, d in enumerate(target) if i not in copied and d != -1)
            if den == 0 or num % den:
                raise ValueError(f"cannot reshape {list(x.shape)} to {entries}")
            target[target.index(-1)] = num // den
        return [x.reshape(target)]


@dataclass(frozen=True, eq=False)


class Flatten(_View):
    """Reshape to 2-D: [prod(dims[:axis]), prod(dims[axis:])]."""

    axis: int = 1
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    since: ClassVar = 11

    def _axis(self, rank):
        if not -rank <= self.axis <= rank:
            raise self.fail(f"axis {self.axis} is out of range for rank {rank} (accepted: [-{rank}, {rank}])")
        return self.axis if self.axis >= 0 else self.axis + rank

    def infer(self, ins):
        (x,) = ins
        a = self._axis(x.type.rank)
        return [TensorType(x.dtype, (dim_product(x.shape[:a]), dim_product(x.shape[a:])))]

    def compute(self, x):
        a = self._axis(x.ndim)
        return [x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))]


@dataclass(frozen=True, eq=False)


class Squeeze(_View):
    """Remove the given size-1 axes (all size-1 axes when ``axes`` is not given)."""

    inputs: ClassVar = ("data", "axes?")
    outputs: ClassVar = ("squeezed",)
    since: ClassVar = 13

    def infer(self, ins):
        x, axes_v = (list(ins) + [None])[:2]
        r = x.type.rank
        if axes_v is None:
            bad = [(i, d) for i, d in enumerate(x.shape) if not isinstance(d, int)]
            if bad:
                raise self.fail(f"without axes, every dimension must be static to know which are 1; "
                                f"{x.type} has dimension {bad[0][0]} = {bad[0][1] if bad[0][1] else '?'} "
                                "(give the axes, or static input shapes)")
            return [TensorType(x.dtype, tuple(d for d in x.shape if d != 1))]
        axes, n = _axes_operand(self, axes_v)
        if axes is None:
            return [TensorType(x.dtype, (None,) * (r - n))]
        axes = _norm_axes(self, axes, r)
        for a in axes:
            if isinstance(x.shape[a], int) and x.shape[a] != 1:
                raise self.fail(f"cannot squeeze axis {a} of {x.type}: its size is {x.shape[a]}, not 1")
        return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]

    def compute(self, x, axes=None):
        if axes is None:
            return [np.squeeze(x)]
        return [np.squeeze(x, axis=tuple(a % x.ndim for a in _ints(axes)))]


@dataclass(frozen=True, eq=False)


class Unsqueeze(_View):
    """Insert size-1 axes at the given positions of the output."""

    inputs: ClassVar = ("data", "axes")
    outputs: ClassVar = ("expanded",)
    since: ClassVar = 13

    def infer(self, ins):
        x, axes_v = ins
        axes, n = _axes_operand(self, axes_v)
        if axes is None:
            return [TensorType(x.dtype, (None,) * (x.type.rank + n))]
        r = x.type.rank + len(axes)
        axes = set(_norm_axes(self, axes, r))
        rest = iter(x.shape)
        return [TensorType(x.dtype, tuple(1 if i in axes else next(rest) for i in range(r)))]

    def compute(self, x, axes):
        axes = _ints(axes)
        r = x.ndim + len(axes)
        return [np.expand_dims(x, tuple(a % r for a in axes))]


@dataclass(frozen=True, eq=False)


class Identity(_View):
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.ELEMWISE
    tensors_only: ClassVar = False  # also passes sequences and optionals through

    def infer(self, ins):
        return [ins[0].type]

    def compute(self, x):
        return [x]


# ---------------------------------------------------------------------------------------------
# Permutations and rearrangements
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)


class Transpose(_Movement):
    """Permute the axes (reverse them when ``perm`` is not given)."""

    perm: tuple[int, ...] | None = None
    inputs: ClassVar = ("data",)
    outputs: ClassVar = ("transposed",)
    since: ClassVar = 1

    def validate(self):
        if self.perm is not None and sorted(self.perm) != list(range(len(self.perm))):
            raise self.fail(f"perm {list(self.perm)} is not a permutation of 0..{len(self.perm) - 1}")

    def _perm(self, rank):
        if self.perm is None:
            return tuple(reversed(range(rank)))
        if len(self.perm) != rank:
            raise self.fail(f"perm {list(self.perm)} has {len(self.perm)} entries, the input has rank {rank}")
        return self.perm

    def infer(self, ins):
        (x,) = ins
        return [TensorType(x.dtype, tuple(x.shape[p] for p in self._perm(x.type.rank)))]

    def compute(self, x):
        return [np.transpose(x, self._perm(x.ndim))]


@dataclass(frozen=True, eq=False)


class _Blocks(_Movement):
    """Base of DepthToSpace and SpaceToDepth: blocks of ``blocksize`` x ``blocksize`` pixels of a 4-D
    [N, C, H, W] input moved between the channel and the spatial axes."""

    blocksize: int | None = None
    mode: str = "DCR"
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)

    def validate(self):
        if self.blocksize is None or self.blocksize < 1:
            raise self.fail(f"blocksize must be a positive integer (it is required), got {self.blocksize}")
        if self.mode not in ("DCR", "CRD"):
            raise self.fail(f"mode must be 'DCR' or 'CRD', got {self.mode!r}")

    def _dims(self, x) -> tuple:
        """The input's [N, C, H, W] dimensions."""
        if x.type.rank != 4:
            raise self.fail(f"input must be 4-D [N, C, H, W], got {x.type}")
        return x.shape


@dataclass(frozen=True, eq=False)


class DepthToSpace(_Blocks):
    """[N, C, H, W] -> [N, C/b², H*b, W*b]; DCR: channels ordered (block row, block column, depth),
    CRD: (depth, block row, block column)."""

    since: ClassVar = 11

    def infer(self, ins):
        (x,) = ins
        n, c, h, w = self._dims(x)
        b = self.blocksize
        if isinstance(c, int) and c % (b * b):
            raise self.fail(f"channels {c} of {x.type} are not a multiple of blocksize² = {b * b}")
        scale = lambda d: d * b if isinstance(d, int) else (d if b == 1 else None)  # noqa: E731
        return [TensorType(x.dtype, (n, c // (b * b) if isinstance(c, int) else (c if b == 1 else None),
                                     scale(h), scale(w)))]

    def compute(self, x):
        n, c, h, w = x.shape
        b = self.blocksize
        if self.mode == "DCR":
            t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return [t.reshape(n, c // (b * b), h * b, w * b)]


@dataclass(frozen=True, eq=False)


class SpaceToDepth(_Blocks):
    """[N, C, H, W] -> [N, C*b², H/b, W/b], the inverse of DepthToSpace in the same mode."""

    since: ClassVar = 28

    def infer(self, ins):
        (x,) = ins
        n, c, h, w = self._dims(x)
        b = self.blocksize
        for what, d in (("height", h), ("width", w)):
            if isinstance(d, int) and d % b:
                raise self.fail(f"{what} {d} of {x.type} is not a multiple of blocksize {b}")
        shrink = lambda d: d // b if isinstance(d, int) else (d if b == 1 else None)  # noqa: E731
        return [TensorType(x.dtype, (n, c * b * b if isinstance(c, int) else (c if b == 1 else None),
                                     shrink(h), shrink(w)))]

    def compute(self, x):
        n, c, h, w = x.shape
        b = self.blocksize
        t = x.reshape(n, c, h // b, b, w // b, b)
        t = t.transpose(0, 3, 5, 1, 2, 4) if self.mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
        return [t.reshape(n, c * b * b, h // b, w // b)]


# ---------------------------------------------------------------------------------------------
# Shape queries
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)


class Shape(OpDef):
    """The input's shape as a 1-D int64 tensor, optionally the slice [start, end) of it."""

    start: int = 0
    end: int | None = None
    inputs: ClassVar = ("data",)
    outputs: ClassVar = ("shape",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 15

    def bounds(self, rank: int) -> tuple[int, int]:
        def clamp(a):
            return min(max(a + rank if a < 0 else a, 0), rank)
        lo = clamp(self.start)
        hi = clamp(rank if self.end is None else self.end)
        return lo, max(lo, hi)

    def infer(self, ins):
        lo, hi = self.bounds(ins[0].type.rank)
        return [TensorType(DType.i64, (hi - lo,))]

    def propagate(self, ins, types):
        lo, hi = self.bounds(ins[0].type.rank)
        dims = ins[0].shape[lo:hi]
        return [np.array(dims, dtype=np.int64) if all(isinstance(d, int) for d in dims) else None]

    def compute(self, x):
        lo, hi = self.bounds(x.ndim)
        return [np.array(x.shape[lo:hi], dtype=np.int64)]

    def cost(self, ins, outs):
        return Cost(0, outs[0].nbytes or 0)


@dataclass(frozen=True, eq=False)


class Size(OpDef):
    """The input's number of elements as an int64 scalar."""

    inputs: ClassVar = ("data",)
    outputs: ClassVar = ("size",)
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 1

    def infer(self, ins):
        return [TensorType(DType.i64, ())]

    def propagate(self, ins, types):
        n = ins[0].type.numel
        return [None if n is None else np.array(n, dtype=np.int64)]

    def compute(self, x):
        return [np.array(x.size, dtype=np.int64)]

    def cost(self, ins, outs):
        return Cost(0, 8)


OPS = (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Transpose, DepthToSpace, SpaceToDepth, Shape, Size)
