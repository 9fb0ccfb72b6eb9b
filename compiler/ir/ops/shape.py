"""Shape and data-movement ops: reshapes, transposes, concatenation, splitting, slicing, padding,
broadcasting copies, shape queries and generators.

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
from .base import (STD_FLOATS, Cost, OpDef, Pattern, broadcast_shapes, check_dtype, known_ints, norm_axis,
                   same_dtype)

#: integer element types accepted for shape-like operands (shapes, axes, pads, starts, ...)
INDEX = frozenset({DType.i32, DType.i64})
#: ends at or beyond this mean "to the end of the axis" even when the axis length is not known
_TO_END = 2 ** 31 - 1


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


def _norm_axes(op: OpDef, axes, rank: int, what: str = "axes") -> list[int]:
    out = [norm_axis(op, a, rank, what[:-1] if what.endswith("s") else what) for a in axes]
    if len(set(out)) != len(out):
        raise op.fail(f"{what} {list(axes)} repeat an axis")
    return out


def _ints(a: np.ndarray | None) -> list[int] | None:
    return None if a is None else [int(x) for x in np.asarray(a).ravel()]


def _zero_of(dtype: np.dtype):
    if dtype == object:
        return ""
    return np.zeros((), dtype)[()]


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
        if self.allowzero not in (0, 1):
            raise self.fail(f"allowzero must be 0 or 1, got {self.allowzero}")

    def infer(self, ins):
        x, s = ins
        n = _shape_operand(self, s, "shape")
        entries = shape_dims(s)
        if n is None or entries is None:
            raise self.fail(f"the length of the shape operand ({s.type}) must be static: it is the output rank")
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
        n = _shape_operand(self, axes_v, "axes", allow_scalar=True)
        axes = known_ints(axes_v)
        if axes is None:
            if n is None:
                raise self.fail("the number of axes must be known (it fixes the output rank)")
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
        n = _shape_operand(self, axes_v, "axes", allow_scalar=True)
        axes = known_ints(axes_v)
        if axes is None:
            if n is None:
                raise self.fail("the number of axes must be known (it fixes the output rank)")
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


def _check_mode(op, mode):
    if mode not in ("DCR", "CRD"):
        raise op.fail(f"mode must be 'DCR' or 'CRD', got {mode!r}")


def _check_blocksize(op):
    if op.blocksize is None or op.blocksize < 1:
        raise op.fail(f"blocksize must be a positive integer (it is required), got {op.blocksize}")


@dataclass(frozen=True, eq=False)
class DepthToSpace(_Movement):
    """[N, C, H, W] -> [N, C/b², H*b, W*b]; DCR: channels ordered (block row, block column, depth),
    CRD: (depth, block row, block column)."""

    blocksize: int | None = None
    mode: str = "DCR"
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    since: ClassVar = 11

    def validate(self):
        _check_blocksize(self)
        _check_mode(self, self.mode)

    def infer(self, ins):
        (x,) = ins
        if x.type.rank != 4:
            raise self.fail(f"input must be 4-D [N, C, H, W], got {x.type}")
        n, c, h, w = x.shape
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
class SpaceToDepth(_Movement):
    """[N, C, H, W] -> [N, C*b², H/b, W/b], the inverse of DepthToSpace in the same mode."""

    blocksize: int | None = None
    mode: str = "DCR"
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    since: ClassVar = 28

    def validate(self):
        _check_blocksize(self)
        _check_mode(self, self.mode)

    def infer(self, ins):
        (x,) = ins
        if x.type.rank != 4:
            raise self.fail(f"input must be 4-D [N, C, H, W], got {x.type}")
        n, c, h, w = x.shape
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
        n = _shape_operand(self, s, "shape")
        dims = shape_dims(s)
        if n is None or dims is None:
            raise self.fail(f"the length of the shape operand ({s.type}) must be static: it fixes the output rank")
        if any(isinstance(d, int) and d < 0 for d in dims):
            raise self.fail(f"shape {dims} has a negative entry")
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
        n = _shape_operand(self, s, "input shape")
        dims = shape_dims(s)
        if n is None or dims is None:
            raise self.fail(f"the length of the shape operand ({s.type}) must be static: it is the output rank")
        if any(isinstance(d, int) and d < 0 for d in dims):
            raise self.fail(f"shape {dims} has a negative entry")
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
    since: ClassVar = 14

    def validate(self):
        if self.upper not in (0, 1):
            raise self.fail(f"upper must be 0 or 1, got {self.upper}")

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


OPS = (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Transpose, DepthToSpace, SpaceToDepth, Concat, Split,
       Slice, Pad, CenterCropPad, Expand, Tile, Shape, Size, ConstantOfShape, Range, EyeLike, Trilu)
