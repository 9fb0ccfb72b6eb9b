"""Sequence and optional ops: values that are not tensors (ONNX ``sequence_type`` / ``optional_type``).

A sequence (``SequenceType``) is an ordered list of tensors of one element type; the IR records the
shape every element has (dims that differ between elements are ``None``; no shape at all when not even
the rank is known) and, when known at compile time, the number of elements. Made by SequenceEmpty,
SequenceConstruct, SequenceInsert, SequenceErase and SplitToSequence; read by SequenceAt,
SequenceLength and ConcatFromSequence.

An optional (``OptionalType``) holds a tensor or a sequence, or nothing: made by Optional, read by
OptionalHasElement and OptionalGetElement (which also accept a plain tensor or sequence, as ONNX
does since opset 18).

``compute`` works on the run-time forms: a sequence is a Python list of arrays, an optional is its
element's value or None. The ops are deterministic, so CSE may merge them (values are never mutated);
sequences have no static size, so constant folding leaves them alone, except where a result is known
from the types (SequenceLength of a sequence of known length, OptionalHasElement of a tensor).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, OptionalType, SequenceType, TensorType, join_shapes
from .base import OpDef, Pattern, check_dtype, known_ints, norm_axis

#: the element types of position and split operands
_POSITION = frozenset({DType.i32, DType.i64})


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _sequence(op: OpDef, v, what: str = "input_sequence") -> SequenceType:
    if not isinstance(v.type, SequenceType):
        raise op.fail(f"{what} must be a sequence, got {v.type}")
    return v.type


def _tensor(op: OpDef, v, what: str) -> TensorType:
    if not isinstance(v.type, TensorType):
        raise op.fail(f"{what} must be a tensor, got a {v.type} value")
    return v.type


def _elem(op: OpDef, s: SequenceType) -> TensorType:
    """The element type of ``s``; refused when the elements' rank is not known."""
    if s.elem_shape is None:
        raise op.fail(f"the elements of the {s} sequence have unknown rank; it must be known here (give a "
                      "sequence graph input its element shape in the model, or with input_shapes=)")
    return s.elem


def _position_type(op: OpDef, v, what: str = "position") -> None:
    """A position operand: an int32/int64 scalar (a one-element 1-D tensor is accepted too)."""
    t = _tensor(op, v, what)
    check_dtype(op, v, _POSITION, what)
    if t.rank > 1 or (t.rank == 1 and isinstance(t.shape[0], int) and t.shape[0] != 1):
        raise op.fail(f"{what} must be a scalar, got {t}")


def _known_position(op: OpDef, v, length: int | None, hi: int, what: str = "position") -> None:
    """Check a position known at compile time against a known sequence length: -n <= p < n + hi."""
    p = known_ints(v)
    if p is None or length is None or len(p) != 1:
        return
    if not -length <= p[0] < length + hi:
        raise op.fail(f"{what} {p[0]} is out of range for a sequence of {length} element(s) "
                      f"(accepted: {-length} to {length + hi - 1})")


def _position(op: OpDef, pos, n: int, hi: int, what: str = "position") -> int:
    """The run-time index of a position in a list of ``n``: -n <= p < n + hi."""
    p = int(np.asarray(pos).ravel()[0])
    if not -n <= p < n + hi:
        raise IndexError(f"{op.name}: {what} {p} is out of range for a sequence of {n} element(s)")
    return p + n if p < 0 else p


def _add(length: int | None, k: int) -> int | None:
    return None if length is None else length + k


class _SequenceOp(OpDef):
    """Base of the sequence and optional ops: they check their own (non-tensor) inputs."""

    pattern: ClassVar = Pattern.OPAQUE
    tensors_only: ClassVar = False


# ---------------------------------------------------------------------------------------------
# Making sequences
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SequenceEmpty(_SequenceOp):
    """An empty sequence of ``dtype`` tensors."""

    dtype: DType = DType.f32
    inputs: ClassVar = ()
    outputs: ClassVar = ("output",)
    since: ClassVar = 11

    def infer(self, ins):
        return [SequenceType(self.dtype, None, 0)]

    def compute(self):
        return [[]]


@dataclass(frozen=True, eq=False)
class SequenceConstruct(_SequenceOp):
    """The sequence of the input tensors (at least one; all of one element type)."""

    inputs: ClassVar = ("inputs*",)
    outputs: ClassVar = ("output_sequence",)
    since: ClassVar = 11

    def infer(self, ins):
        if not ins:
            raise self.fail("needs at least one tensor")
        types = [_tensor(self, v, f"input {i}") for i, v in enumerate(ins)]
        dts = {t.dtype for t in types}
        if len(dts) != 1:
            raise self.fail(f"inputs must share one element type, got {', '.join(sorted(d.short for d in dts))}")
        return [SequenceType(types[0].dtype, join_shapes(*[t.shape for t in types]), len(types))]

    def compute(self, *xs):
        return [list(xs)]


@dataclass(frozen=True, eq=False)
class SequenceInsert(_SequenceOp):
    """The sequence with ``tensor`` inserted before ``position`` (-n..n; default: at the back)."""

    inputs: ClassVar = ("input_sequence", "tensor", "position?")
    outputs: ClassVar = ("output_sequence",)
    since: ClassVar = 11

    def infer(self, ins):
        seq, x, pos = (list(ins) + [None])[:3]
        s = _sequence(self, seq)
        t = _tensor(self, x, "tensor")
        if t.dtype is not s.dtype:
            raise self.fail(f"tensor has element type {t.dtype}, the sequence holds {s.dtype} ({s})")
        if pos is not None:
            _position_type(self, pos)
            _known_position(self, pos, s.length, 1)
        # an empty sequence's element shape says nothing: the new element decides it
        shape = t.shape if s.length == 0 else join_shapes(s.elem_shape, t.shape)
        return [SequenceType(s.dtype, shape, _add(s.length, 1))]

    def compute(self, seq, x, pos=None):
        out = list(seq)
        out.insert(len(out) if pos is None else _position(self, pos, len(out), 1), x)
        return [out]


@dataclass(frozen=True, eq=False)
class SequenceErase(_SequenceOp):
    """The sequence without the element at ``position`` (-n..n-1; default: the last one)."""

    inputs: ClassVar = ("input_sequence", "position?")
    outputs: ClassVar = ("output_sequence",)
    since: ClassVar = 11

    def infer(self, ins):
        seq, pos = (list(ins) + [None])[:2]
        s = _sequence(self, seq)
        if s.length == 0:
            raise self.fail(f"cannot erase from an empty sequence ({s})")
        if pos is not None:
            _position_type(self, pos)
            _known_position(self, pos, s.length, 0)
        return [s.with_length(_add(s.length, -1))]

    def compute(self, seq, pos=None):
        out = list(seq)
        if not out:
            raise IndexError(f"{self.name}: cannot erase from an empty sequence")
        del out[len(out) - 1 if pos is None else _position(self, pos, len(out), 0)]
        return [out]


@dataclass(frozen=True, eq=False)
class SplitToSequence(_SequenceOp):
    """Split ``input`` along ``axis`` into a sequence: into parts of the sizes in a 1-D ``split``
    (non-negative: ONNX says positive, but its own tests and onnxruntime take zeros), into chunks of a
    positive scalar ``split`` (the last one may be smaller), or, without ``split``, into slices of
    length 1 (with the axis removed when ``keepdims`` is 0)."""

    axis: int = 0
    keepdims: int = 1
    inputs: ClassVar = ("input", "split?")
    outputs: ClassVar = ("output_sequence",)
    since: ClassVar = 11

    def validate(self):
        if self.keepdims not in (0, 1):
            raise self.fail(f"keepdims must be 0 or 1, got {self.keepdims}")

    def infer(self, ins):
        x, split = (list(ins) + [None])[:2]
        t = _tensor(self, x, "input")
        if t.rank == 0:
            raise self.fail("cannot split a scalar (input must have rank >= 1)")
        a = norm_axis(self, self.axis, t.rank)
        d = t.shape[a]
        if split is None:
            shape = t.shape[:a] + ((1,) if self.keepdims else ()) + t.shape[a + 1:]
            return [SequenceType(t.dtype, shape, d if isinstance(d, int) else None)]
        st = _tensor(self, split, "split")
        check_dtype(self, split, _POSITION, "split")
        if st.rank > 1:
            raise self.fail(f"split must be a scalar or 1-D, got {st}")
        sizes = known_ints(split)
        if sizes is not None and any(s < (1 if st.rank == 0 else 0) for s in sizes):
            raise self.fail(f"split {sizes[0] if st.rank == 0 else sizes} must be "
                            f"{'positive' if st.rank == 0 else 'non-negative'}")
        if st.rank == 0:  # chunks of one size
            if sizes is None or not isinstance(d, int):
                return [SequenceType(t.dtype, t.shape[:a] + (None,) + t.shape[a + 1:], None)]
            (s,) = sizes
            part = s if d % s == 0 else (d if d < s else None)
            return [SequenceType(t.dtype, t.shape[:a] + (part,) + t.shape[a + 1:], -(-d // s))]
        n = st.shape[0] if isinstance(st.shape[0], int) else None
        part = None
        if sizes is not None:
            if isinstance(d, int) and sum(sizes) != d:
                raise self.fail(f"split sizes {sizes} sum to {sum(sizes)}, not the axis length {d} of {t}")
            part = sizes[0] if len(set(sizes)) == 1 else None
        return [SequenceType(t.dtype, t.shape[:a] + (part,) + t.shape[a + 1:], n)]

    def _sizes(self, d: int, split) -> list[int]:
        if split is None:
            return [1] * d
        sizes = [int(s) for s in np.asarray(split).ravel()]
        if np.ndim(split) == 0:
            (s,) = sizes
            if s <= 0:
                raise ValueError(f"{self.name}: split {s} must be positive")
            return [s] * (d // s) + ([d % s] if d % s else [])
        if any(s < 0 for s in sizes):
            raise ValueError(f"{self.name}: split sizes {sizes} must be non-negative")
        if sum(sizes) != d:
            raise ValueError(f"{self.name}: split sizes {sizes} sum to {sum(sizes)}, not the axis length {d}")
        return sizes

    def compute(self, x, split=None):
        a = self.axis % x.ndim
        sizes = self._sizes(x.shape[a], split)
        parts = np.split(x, np.cumsum(sizes)[:-1], axis=a) if sizes else []
        if split is None and not self.keepdims:
            parts = [np.squeeze(p, axis=a) for p in parts]
        return [parts]


# ---------------------------------------------------------------------------------------------
# Reading sequences
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SequenceAt(_SequenceOp):
    """The element at ``position`` (-n..n-1)."""

    inputs: ClassVar = ("input_sequence", "position")
    outputs: ClassVar = ("tensor",)
    since: ClassVar = 11

    def infer(self, ins):
        seq, pos = ins
        s = _sequence(self, seq)
        _position_type(self, pos)
        if s.length == 0:
            raise self.fail(f"cannot take an element of an empty sequence ({s})")
        _known_position(self, pos, s.length, 0)
        return [_elem(self, s)]

    def compute(self, seq, pos):
        return [seq[_position(self, pos, len(seq), 0)]]


@dataclass(frozen=True, eq=False)
class SequenceLength(_SequenceOp):
    """The number of elements, an int64 scalar (known at compile time when the type knows it)."""

    inputs: ClassVar = ("input_sequence",)
    outputs: ClassVar = ("length",)
    since: ClassVar = 11

    def infer(self, ins):
        _sequence(self, ins[0])
        return [TensorType(DType.i64, ())]

    def propagate(self, ins, types):
        n = ins[0].type.length
        return [None if n is None else np.array(n, dtype=np.int64)]

    def compute(self, seq):
        return [np.array(len(seq), dtype=np.int64)]


@dataclass(frozen=True, eq=False)
class ConcatFromSequence(_SequenceOp):
    """Concatenate the elements along ``axis`` (``new_axis=1``: stack them along a new axis ``axis``)."""

    axis: int
    new_axis: int = 0
    inputs: ClassVar = ("input_sequence",)
    outputs: ClassVar = ("concat_result",)
    since: ClassVar = 11

    def validate(self):
        if self.new_axis not in (0, 1):
            raise self.fail(f"new_axis must be 0 or 1, got {self.new_axis}")

    def infer(self, ins):
        s = _sequence(self, ins[0])
        if s.length == 0:
            raise self.fail(f"cannot concatenate an empty sequence ({s})")
        e = _elem(self, s)
        n = s.length
        if self.new_axis:
            a = norm_axis(self, self.axis, e.rank + 1)
            return [e.with_shape(e.shape[:a] + (n,) + e.shape[a:])]
        if e.rank == 0:
            raise self.fail("cannot concatenate scalars (use new_axis=1 to stack them)")
        a = norm_axis(self, self.axis, e.rank)
        d = e.shape[a]
        total = n * d if isinstance(d, int) and n is not None else (0 if d == 0 else None)
        return [e.with_shape(e.shape[:a] + (total,) + e.shape[a + 1:])]

    def compute(self, seq):
        if not seq:
            raise ValueError(f"{self.name}: cannot concatenate an empty sequence")
        if self.new_axis:
            return [np.stack(seq, axis=self.axis % (seq[0].ndim + 1))]
        return [np.concatenate(seq, axis=self.axis % seq[0].ndim)]


# ---------------------------------------------------------------------------------------------
# Optionals
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Optional(_SequenceOp):
    """An optional holding ``input``, or, without an input, an empty optional of ``type``."""

    type: TensorType | SequenceType | None = None
    inputs: ClassVar = ("input?",)
    outputs: ClassVar = ("output",)
    since: ClassVar = 15

    def infer(self, ins):
        x = ins[0] if ins else None
        if x is None:
            if self.type is None:
                raise self.fail("an empty optional needs the type attribute")
            return [OptionalType(self.type)]
        if isinstance(x.type, OptionalType):
            raise self.fail(f"input is already an optional ({x.type}); optionals do not nest")
        if self.type is not None and (type(self.type) is not type(x.type) or self.type.dtype is not x.type.dtype):
            raise self.fail(f"type attribute {self.type} does not describe the input ({x.type})")
        return [OptionalType(x.type)]

    def compute(self, x=None):
        return [x]


@dataclass(frozen=True, eq=False)
class OptionalHasElement(_SequenceOp):
    """Whether the input holds a value: false for an empty optional or a missing input, true for a
    tensor or a sequence (known at compile time except for an optional input)."""

    inputs: ClassVar = ("input?",)
    outputs: ClassVar = ("output",)
    since: ClassVar = 18

    def infer(self, ins):
        return [TensorType(DType.bool, ())]

    def propagate(self, ins, types):
        x = ins[0] if ins else None
        if x is not None and isinstance(x.type, OptionalType):
            return [None]
        return [np.array(x is not None)]

    def compute(self, x=None):
        return [np.array(x is not None)]


@dataclass(frozen=True, eq=False)
class OptionalGetElement(_SequenceOp):
    """The value an optional holds (an error when it is empty); a tensor or a sequence passes through."""

    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    since: ClassVar = 18

    def infer(self, ins):
        t = ins[0].type
        return [t.elem if isinstance(t, OptionalType) else t]

    def compute(self, x):
        if x is None:
            raise ValueError(f"{self.name}: the optional is empty")
        return [x]


OPS = (SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceErase, SplitToSequence, SequenceAt,
       SequenceLength, ConcatFromSequence, Optional, OptionalHasElement, OptionalGetElement)
