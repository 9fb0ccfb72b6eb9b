"""Element types, shapes and tensor types of the IR.

A shape is a tuple of dimensions; a dimension is an ``int`` (static), a ``str`` (a named symbolic
dimension such as ``"N"``, which the user may specialize with ``input_shapes=``) or ``None`` (unknown,
printed ``?``: the result of shape arithmetic the compiler could not resolve).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import numpy as np

try:  # the narrow float and int types; ml_dtypes comes with onnx
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - the IR itself works without them
    _ml = None


def _ml_type(name: str):
    return np.dtype(getattr(_ml, name)) if _ml is not None and hasattr(_ml, name) else None


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
    bf16 = ("bf16", _ml_type("bfloat16"), 16)
    f8e4m3fn = ("f8e4m3fn", _ml_type("float8_e4m3fn"), 17)
    f8e4m3fnuz = ("f8e4m3fnuz", _ml_type("float8_e4m3fnuz"), 18)
    f8e5m2 = ("f8e5m2", _ml_type("float8_e5m2"), 19)
    f8e5m2fnuz = ("f8e5m2fnuz", _ml_type("float8_e5m2fnuz"), 20)
    u4 = ("u4", _ml_type("uint4"), 21)
    i4 = ("i4", _ml_type("int4"), 22)
    f4e2m1 = ("f4e2m1", _ml_type("float4_e2m1fn"), 23)
    f8e8m0 = ("f8e8m0", _ml_type("float8_e8m0fnu"), 24)
    u2 = ("u2", _ml_type("uint2"), 25)
    i2 = ("i2", _ml_type("int2"), 26)

    def __init__(self, short: str, np_dtype, onnx_code: int):
        self.short = short
        self.np = np_dtype
        self.onnx = onnx_code

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
        return 8 if self is DType.string else (self.np.itemsize if self.np is not None else 1)

    # -- conversion ----------------------------------------------------------------------------
    @staticmethod
    def from_numpy(dtype) -> "DType":
        dt = np.dtype(dtype)
        found = _BY_NP.get(dt)
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
_BY_NP = {d.np: d for d in DType if d.np is not None and d is not DType.string}
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


@dataclass(frozen=True)
class TensorType:
    """The type of a value: an element type and a shape (with possibly symbolic dimensions)."""

    dtype: DType
    shape: Shape

    def __post_init__(self):
        if not isinstance(self.dtype, DType):
            raise TypeError(f"TensorType dtype must be a DType, got {self.dtype!r}")
        shape = tuple(self.shape)
        for d in shape:
            if not (d is None or isinstance(d, str) or (isinstance(d, (int, np.integer)) and d >= 0)):
                raise ValueError(f"bad dimension {d!r} in shape {shape}")
        object.__setattr__(self, "shape", tuple(int(d) if isinstance(d, (int, np.integer)) else d
                                                for d in shape))

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
