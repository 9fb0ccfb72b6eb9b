"""Element types, shapes and tensor types of the IR.

A shape is a tuple of dimensions; a dimension is an ``int`` (static), a ``str`` (a named symbolic
dimension such as ``"N"``, which the user may specialize with ``input_shapes=``) or ``None`` (unknown,
printed ``?``: the result of shape arithmetic the compiler could not resolve).

Most values are tensors (``TensorType``); the sequence and optional ops also make and take
``SequenceType`` and ``OptionalType`` values (ONNX ``sequence_type`` / ``optional_type``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import numpy as np

def _ml_type(name: str):
    """The NumPy dtype ``ml_dtypes`` names ``name`` (the narrow float and int types; ml_dtypes comes
    with onnx), or None without it. Imported on first use: the import takes 0.5 to 1 s, and most
    programs (every float32 model) never need it."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - the IR itself works without them
        return None
    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else None


class DType(enum.Enum):
    """An element type: its short name in the text format, NumPy dtype and ONNX TensorProto code."""

    f32 = ("f32", np.dtype(np.float32), 1)
    u8 = ("u8", np.dtype(np.uint8), 2)
    i8 = ("i8", np.dtype(np.int8), 3)
    u16 = ("u16", np.dtype(np.uint16), 4)
    i16 = ("i16", np.dtype(np.int16), 5)
    i32 = ("i32", np.dtype(np.int32), 6)
    i64 = ("i64", np.dtype(np.int64), 7)
    string = ("string", np.dtype(object), 8)
    bool = ("bool", np.dtype(np.bool_), 9)
    f16 = ("f16", np.dtype(np.float16), 10)
    f64 = ("f64", np.dtype(np.float64), 11)
    u32 = ("u32", np.dtype(np.uint32), 12)
    u64 = ("u64", np.dtype(np.uint64), 13)
    c64 = ("c64", np.dtype(np.complex64), 14)
    c128 = ("c128", np.dtype(np.complex128), 15)
    bf16 = ("bf16", "bfloat16", 16)
    f8e4m3fn = ("f8e4m3fn", "float8_e4m3fn", 17)
    f8e4m3fnuz = ("f8e4m3fnuz", "float8_e4m3fnuz", 18)
    f8e5m2 = ("f8e5m2", "float8_e5m2", 19)
    f8e5m2fnuz = ("f8e5m2fnuz", "float8_e5m2fnuz", 20)
    u4 = ("u4", "uint4", 21)
    i4 = ("i4", "int4", 22)
    f4e2m1 = ("f4e2m1", "float4_e2m1fn", 23)
    f8e8m0 = ("f8e8m0", "float8_e8m0fnu", 24)
    u2 = ("u2", "uint2", 25)
    i2 = ("i2", "int2", 26)

    def __init__(self, short: str, np_dtype, onnx_code: int):
        self.short = short
        self._np = np_dtype  # a NumPy dtype, or the name of an ml_dtypes type (loaded on first use)
        self.onnx = onnx_code

    @property
    def np(self):
        """The NumPy dtype (None for an ml_dtypes type when that package is missing)."""
        d = self._np
        if isinstance(d, str):
            d = self._np = _ml_type(d)
        return d

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    def __str__(self) -> str:
        return self.short

    # -- classification ------------------------------------------------------------------------
    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_signed(self) -> bool:
        return self in _SIGNED

    @property
    def itemsize(self) -> int:
        """Bytes per element (sub-byte types round up to one byte, as NumPy stores them)."""
        if self is DType.string:
            return 8
        if isinstance(self._np, str):  # an ml_dtypes type not loaded yet: bfloat16 is 2 bytes, the rest 1
            return 2 if self is DType.bf16 else 1
        return self.np.itemsize if self.np is not None else 1

    # -- conversion ----------------------------------------------------------------------------
    @staticmethod
    def from_numpy(dtype) -> "DType":
        dt = np.dtype(dtype)
        found = _BY_NP.get(dt)
        if found is None and dt.type.__module__.startswith("ml_dtypes"):  # (so ml_dtypes is loaded)
            found = next((d for d in _LAZY if d.np == dt), None)
        if found is None:
            if dt.kind in "OUS":
                return DType.string
            raise TypeError(f"no Kiln element type for NumPy dtype {dt}")
        return found

    @staticmethod
    def from_onnx(code: int) -> "DType":
        found = _BY_ONNX.get(code)
        if found is None:
            raise TypeError(f"no Kiln element type for ONNX element type {code}")
        return found

    @staticmethod
    def parse(text: str) -> "DType":
        found = _BY_SHORT.get(text)
        if found is None:
            raise ValueError(f"unknown element type {text!r}; known: {', '.join(_BY_SHORT)}")
        return found


_FLOATS = frozenset({DType.f16, DType.bf16, DType.f32, DType.f64, DType.f8e4m3fn, DType.f8e4m3fnuz,
                     DType.f8e5m2, DType.f8e5m2fnuz, DType.f4e2m1, DType.f8e8m0})
_SIGNED_INTS = frozenset({DType.i8, DType.i16, DType.i32, DType.i64, DType.i4, DType.i2})
_INTS = _SIGNED_INTS | {DType.u8, DType.u16, DType.u32, DType.u64, DType.u4, DType.u2}
_SIGNED = _SIGNED_INTS | _FLOATS
_LAZY = [d for d in DType if isinstance(d._np, str)]  # the ml_dtypes types
_BY_NP = {d.np: d for d in DType if d not in _LAZY and d is not DType.string}
_BY_ONNX = {d.onnx: d for d in DType}
_BY_SHORT = {d.short: d for d in DType}

Dim = Union[int, str, None]
Shape = tuple  # tuple[Dim, ...]


def is_static(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def num_elements(shape: Shape) -> int | None:
    """The number of elements, or None when a dimension is not static."""
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        n *= d
    return n


def format_dim(d: Dim) -> str:
    return "?" if d is None else str(d)


def _check_shape(shape, what: str = "shape") -> tuple:
    """A shape normalized to a tuple of int / str / None dims (NumPy ints become ints)."""
    shape = tuple(shape)
    for d in shape:
        if not (d is None or isinstance(d, str) or (isinstance(d, (int, np.integer)) and d >= 0)):
            raise ValueError(f"bad dimension {d!r} in {what} {shape}")
    return tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in shape)


@dataclass(frozen=True)
class TensorType:
    """The type of a value: an element type and a shape (with possibly symbolic dimensions)."""

    dtype: DType
    shape: Shape

    def __post_init__(self):
        if not isinstance(self.dtype, DType):
            raise TypeError(f"TensorType dtype must be a DType, got {self.dtype!r}")
        object.__setattr__(self, "shape", _check_shape(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return is_static(self.shape)

    @property
    def numel(self) -> int | None:
        return num_elements(self.shape)

    @property
    def nbytes(self) -> int | None:
        n = self.numel
        return None if n is None else n * self.dtype.itemsize

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(format_dim(d) for d in self.shape)}]"

    @staticmethod
    def of(array: np.ndarray) -> "TensorType":
        return TensorType(DType.from_numpy(array.dtype), array.shape)


# ---------------------------------------------------------------------------------------------
# Non-tensor values: sequences and optionals (ONNX sequence_type and optional_type)
# ---------------------------------------------------------------------------------------------
#
# They answer what generic code asks of any value type: ``dtype`` (the element type), ``is_static``
# (False: folding and known values are for tensors), ``numel`` and ``nbytes`` (None: not a buffer of
# known size). They have no ``shape`` or ``rank``: only the sequence and optional ops (and Identity)
# take them, and ``infer_node`` refuses them as inputs of any other op.

class _NotABuffer:
    """What a sequence or optional type answers to generic questions about buffers."""

    is_static = False
    numel = None
    nbytes = None


@dataclass(frozen=True)
class SequenceType(_NotABuffer):
    """A sequence of tensors of one element type (ONNX ``sequence_type``); at run time a Python list
    of arrays.

    ``elem_shape`` is the shape every element has (dims may be symbolic or None, where elements
    differ or the size is unknown), or None when not even the elements' rank is known. ``length``
    is the number of elements when known at compile time (a ``SequenceConstruct`` of three tensors;
    an empty ``SequenceEmpty``), else None. Printed ``seq<f32[?,3]>``, ``seq<3 x f32[2,3]>`` (a
    known length), ``seq<f32>`` (elements of any rank).
    """

    dtype: DType
    elem_shape: Shape | None = None
    length: int | None = None

    def __post_init__(self):
        if not isinstance(self.dtype, DType):
            raise TypeError(f"SequenceType dtype must be a DType, got {self.dtype!r}")
        if self.elem_shape is not None:
            object.__setattr__(self, "elem_shape", _check_shape(self.elem_shape, "element shape"))
        if self.length is not None:
            if isinstance(self.length, bool) or not isinstance(self.length, (int, np.integer)) or self.length < 0:
                raise ValueError(f"bad sequence length {self.length!r}")
            object.__setattr__(self, "length", int(self.length))

    @property
    def elem(self) -> TensorType | None:
        """The type of every element, or None when their rank is not known."""
        return None if self.elem_shape is None else TensorType(self.dtype, self.elem_shape)

    def with_length(self, length: int | None) -> "SequenceType":
        return SequenceType(self.dtype, self.elem_shape, length)

    def __str__(self) -> str:
        n = "" if self.length is None else f"{self.length} x "
        e = self.dtype.short if self.elem_shape is None else str(self.elem)
        return f"seq<{n}{e}>"



@dataclass(frozen=True)
class OptionalType(_NotABuffer):
    """A value that may be absent (ONNX ``optional_type``): a tensor or a sequence, or nothing; at
    run time the element's value or None. Printed ``opt<f32[4]>``, ``opt<seq<i32[?]>>``."""

    elem: "TensorType | SequenceType"

    def __post_init__(self):
        if not isinstance(self.elem, (TensorType, SequenceType)):
            raise TypeError(f"an optional holds a tensor or a sequence, not {self.elem!r}")

    @property
    def dtype(self) -> DType:
        return self.elem.dtype

    def __str__(self) -> str:
        return f"opt<{self.elem}>"


#: every type a value can have
ValueType = Union[TensorType, SequenceType, OptionalType]


def is_value_type(t) -> bool:
    return isinstance(t, (TensorType, SequenceType, OptionalType))


def join_dims(a: Dim, b: Dim) -> Dim:
    """The dim that describes both a and b: equal ones stay, different ones become unknown."""
    return a if a == b else None


def join_shapes(*shapes):
    """The shape that describes all of ``shapes`` (None entries: any rank): dims that differ become
    None; a different rank (or any None) gives None. With no shapes: None."""
    if not shapes or any(s is None for s in shapes):
        return None
    first = tuple(shapes[0])
    out = list(first)
    for s in shapes[1:]:
        s = tuple(s)
        if len(s) != len(out):
            return None
        out = [join_dims(x, y) for x, y in zip(out, s)]
    return tuple(out)
