"""Quantization: linear (de)quantization, integer and quantized-linear matmul/conv, and BitCast.

Kiln's int8 story starts here. The representation is ONNX's "QDQ" one:

* ``QuantizeLinear``   y = saturate(round(x / scale) + zero_point)   (round half to even)
* ``DequantizeLinear`` y = (x - zero_point) * scale

with one scale (and zero point) per tensor, per slice along ``axis``, or per block of ``block_size``
elements along ``axis`` (the scale then has x's rank, ``ceil(D / block_size)`` along ``axis``). The
quantized type is any of int8/uint8/int16/uint16/int4/uint4/int2/uint2 (saturating to its range) or a
float 8/4 type (rounded to nearest even by a Cast, saturating when ``saturate``).

The fused integer ops compute exactly: products and sums of int8 values are exact in f64 (up to 2**53),
so the references accumulate in f64 and wrap to int32 as an int32 accumulator would.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..graph import Value
from ..types import DType, TensorType
from .base import ANY, STD_FLOATS, Cost, OpDef, OpError, Pattern, broadcast_shapes, check_dtype
from .common import check_flags, is_static
from .elementwise import cast_array

_F8 = frozenset({DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz})
#: the saturating integer ranges of the quantized integer types
INT_RANGES = {DType.i8: (-128, 127), DType.u8: (0, 255), DType.i16: (-32768, 32767), DType.u16: (0, 65535),
              DType.i4: (-8, 7), DType.u4: (0, 15), DType.i2: (-2, 1), DType.u2: (0, 3)}
#: what QuantizeLinear produces (and DequantizeLinear reads, with int32)
QUANT_TYPES = frozenset(INT_RANGES) | _F8 | {DType.f4e2m1}
DEQUANT_INPUTS = QUANT_TYPES | {DType.i32}
QUANT_INPUTS = frozenset({DType.f32, DType.f16, DType.bf16, DType.i32})
QUANT_SCALES = frozenset({DType.f32, DType.f16, DType.bf16, DType.i32, DType.f8e8m0})
DEQUANT_SCALES = frozenset({DType.f32, DType.f16, DType.bf16, DType.f8e8m0})
DEQUANT_OUTPUTS = frozenset({DType.f32, DType.f16, DType.bf16})
INT8 = frozenset({DType.i8, DType.u8})
QLINEAR_TYPES = INT8 | _F8


def _names(dts) -> str:
    return ", ".join(sorted(d.short for d in dts))


def _is_scalar(t: TensorType) -> bool:
    """A per-tensor parameter: a scalar or a one-element vector."""
    return t.rank == 0 or (t.rank == 1 and t.shape[0] == 1)


def _f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


def _saturate_int(v: np.ndarray, dt: DType) -> np.ndarray:
    """Round-half-even already applied: clip to dt's range and convert."""
    lo, hi = INT_RANGES.get(dt) or (np.iinfo(dt.np).min, np.iinfo(dt.np).max)
    with np.errstate(invalid="ignore"):
        return np.clip(v, lo, hi).astype(dt.np)


def _requantize(real: np.ndarray, zero_point: np.ndarray, dt: DType, saturate: bool = True) -> np.ndarray:
    """``real / scale`` (already divided) to the quantized type: round + zero point + saturate for
    integers, a (saturating) cast for float 8/4 types."""
    if dt.is_int:
        return _saturate_int(np.rint(real) + _f64(zero_point), dt)
    return cast_array(real + _f64(zero_point), dt, saturate)


def _div_in(x: np.ndarray, s: np.ndarray, precision: DType) -> np.ndarray:
    """x / s computed in ``precision`` (narrow floats: in f32, then rounded once to ``precision``,
    which is the correctly rounded narrow quotient), returned as f64."""
    if precision in (DType.f32, DType.f64):
        with np.errstate(divide="ignore", invalid="ignore"):
            return _f64(x.astype(precision.np) / s.astype(precision.np))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = x.astype(precision.np).astype(np.float32) / s.astype(precision.np).astype(np.float32)
    return _f64(q.astype(precision.np))


# ---------------------------------------------------------------------------------------------
# Quantization granularity: per tensor, per axis, blocked
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Linear(OpDef):
    """Shared by QuantizeLinear and DequantizeLinear: the scale/zero point layout."""

    pattern: ClassVar = Pattern.ELEMWISE
    since: ClassVar = 25

    def validate(self):
        if self.block_size < 0:
            raise self.fail(f"block_size must be >= 0, got {self.block_size}")

    def _layout(self, x: TensorType, scale: TensorType, zp: TensorType | None) -> tuple[str, int]:
        """('tensor' | 'axis' | 'block', normalized axis), checking the scale (and zero point) shape."""
        if zp is not None and zp.shape != scale.shape and not (_is_scalar(zp) and _is_scalar(scale)):
            raise self.fail(f"the zero point {zp} and the scale {scale} must have the same shape")
        if self.block_size > 0:
            if scale.rank != x.rank or x.rank == 0:
                raise self.fail(f"blocked quantization (block_size={self.block_size}) needs a scale of the "
                                f"input's rank {x.rank}, got {scale}")
            axis = self._axis(x.rank)
            for i, (d, s) in enumerate(zip(x.shape, scale.shape)):
                if not (is_static(d) and is_static(s)):
                    continue
                if i != axis and d != s:
                    raise self.fail(f"blocked scale {scale} must match the input {x} except along axis {axis} "
                                    f"(dimension {i} is {s}, not {d})")
                if i == axis and s != -(-d // self.block_size):
                    raise self.fail(f"blocked scale {scale}: dimension {axis} must be ceil({d} / block_size="
                                    f"{self.block_size}) = {-(-d // self.block_size)}, got {s}")
            return "block", axis
        if _is_scalar(scale):
            return "tensor", 0
        if scale.rank != 1:
            raise self.fail(f"a scale of rank {scale.rank} ({scale}) needs block_size > 0 (blocked "
                            "quantization); per-tensor scales are scalars, per-axis scales 1-D")
        axis = self._axis(x.rank)
        d, s = x.shape[axis], scale.shape[0]
        if is_static(d) and is_static(s) and d != s:
            raise self.fail(f"per-axis scale {scale} must have the length of input dimension {axis} ({d})")
        return "axis", axis

    def _axis(self, rank: int) -> int:
        if rank == 0:
            raise self.fail("a scalar input takes a per-tensor (scalar) scale only")
        if not -rank <= self.axis < rank:
            raise self.fail(f"axis {self.axis} is out of range for an input of rank {rank}")
        return self.axis % rank

    def _expand(self, p: np.ndarray, x_shape: tuple) -> np.ndarray:
        """A scale or zero point broadcastable to x."""
        rank = len(x_shape)
        if self.block_size > 0:
            axis = self.axis % rank
            full = np.repeat(p, self.block_size, axis=axis)
            return np.take(full, np.arange(x_shape[axis]), axis=axis)
        if p.size == 1 and p.ndim <= 1:
            return p.reshape(())
        axis = self.axis % rank
        return p.reshape((1,) * axis + (-1,) + (1,) * (rank - axis - 1))


@dataclass(frozen=True, eq=False)
class QuantizeLinear(_Linear):
    """y = saturate(round(x / y_scale) + y_zero_point); the division in ``precision`` (default: the
    scale's type), rounding half to even. The result type is ``output_dtype``, else the zero point's,
    else uint8. Float 8/4 results are a Cast of x / y_scale + y_zero_point (``saturate`` as in Cast)."""

    axis: int = 1
    block_size: int = 0
    output_dtype: DType | None = None
    precision: DType | None = None
    saturate: int = 1
    inputs: ClassVar = ("x", "y_scale", "y_zero_point?")
    outputs: ClassVar = ("y",)

    def validate(self):
        super().validate()
        check_flags(self, "saturate")
        if self.output_dtype is not None and self.output_dtype not in QUANT_TYPES:
            raise self.fail(f"output_dtype {self.output_dtype} is not a quantized type ({_names(QUANT_TYPES)})")
        if self.precision is not None and self.precision not in STD_FLOATS:
            raise self.fail(f"precision {self.precision} is not supported ({_names(STD_FLOATS)})")

    def result_dtype(self, zp: Value | None) -> DType:
        if zp is not None and self.output_dtype is not None and zp.dtype != self.output_dtype:
            raise self.fail(f"output_dtype {self.output_dtype} differs from the zero point's type {zp.dtype}")
        return self.output_dtype or (zp.dtype if zp is not None else DType.u8)

    def infer(self, ins):
        x, scale, zp = (list(ins) + [None])[:3]
        check_dtype(self, x, QUANT_INPUTS, "x")
        check_dtype(self, scale, QUANT_SCALES, "y_scale")
        if zp is not None:
            check_dtype(self, zp, QUANT_TYPES, "y_zero_point")
        self._layout(x.type, scale.type, None if zp is None else zp.type)
        return [x.type.with_dtype(self.result_dtype(zp))]

    def _precision(self, scale_dt: np.dtype) -> DType:
        if self.precision is not None:
            return self.precision
        sd = DType.from_numpy(scale_dt)
        if sd is DType.i32:
            return DType.f64  # an integer scale: exact division
        return DType.f32 if sd is DType.f8e8m0 else sd

    def compute(self, x, scale, zp=None):
        out = self.output_dtype or (DType.from_numpy(zp.dtype) if zp is not None else DType.u8)
        q = _div_in(x, self._expand(scale, x.shape), self._precision(scale.dtype))
        z = self._expand(zp, x.shape) if zp is not None else np.zeros((), np.float64)
        return [_requantize(q, z, out, bool(self.saturate))]


@dataclass(frozen=True, eq=False)
class DequantizeLinear(_Linear):
    """y = (x - x_zero_point) * x_scale, in the result type: ``output_dtype``, else the scale's."""

    axis: int = 1
    block_size: int = 0
    output_dtype: DType | None = None
    inputs: ClassVar = ("x", "x_scale", "x_zero_point?")
    outputs: ClassVar = ("y",)

    def validate(self):
        super().validate()
        if self.output_dtype is not None and self.output_dtype not in DEQUANT_OUTPUTS:
            raise self.fail(f"output_dtype {self.output_dtype} is not supported ({_names(DEQUANT_OUTPUTS)})")

    def infer(self, ins):
        x, scale, zp = (list(ins) + [None])[:3]
        check_dtype(self, x, DEQUANT_INPUTS, "x")
        check_dtype(self, scale, DEQUANT_SCALES, "x_scale")
        if zp is not None and zp.dtype != x.dtype:
            raise self.fail(f"the zero point ({zp.dtype}) must have x's type ({x.dtype})")
        self._layout(x.type, scale.type, None if zp is None else zp.type)
        out = self.output_dtype or scale.dtype
        if out not in DEQUANT_OUTPUTS:
            raise self.fail(f"a {scale.dtype} scale needs output_dtype (one of {_names(DEQUANT_OUTPUTS)})")
        return [x.type.with_dtype(out)]

    def compute(self, x, scale, zp=None):
        out = self.output_dtype or DType.from_numpy(scale.dtype)
        if x.dtype.kind in "iu" or DType.from_numpy(x.dtype).is_int:
            d = x.astype(np.int64)
            if zp is not None:
                d = d - self._expand(zp, x.shape).astype(np.int64)
        else:  # float 8/4: exact in f32
            d = x.astype(np.float32)
            if zp is not None:
                d = d - self._expand(zp, x.shape).astype(np.float32)
        # the multiplication in the output type (narrow types: an f32 product, rounded once)
        work = np.float32 if out is not DType.f64 else np.float64
        s = self._expand(scale, x.shape).astype(out.np).astype(work)
        y = d.astype(out.np).astype(work) * s
        return [np.asarray(y).astype(out.np)]


@dataclass(frozen=True, eq=False)
class DynamicQuantizeLinear(OpDef):
    """uint8 quantization with a scale and zero point computed from x's range (extended to 0):
    scale = (max(0, max x) - min(0, min x)) / 255 (1 when that is 0), zero_point =
    saturate(round(-min(0, min x) / scale)), y = saturate(round(x / scale) + zero_point)."""

    inputs: ClassVar = ("x",)
    outputs: ClassVar = ("y", "y_scale", "y_zero_point")
    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 11

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, {DType.f32}, "x")
        return [x.type.with_dtype(DType.u8), TensorType(DType.f32, ()), TensorType(DType.u8, ())]

    def compute(self, x):
        f = np.float32
        lo = min(f(0), f(x.min())) if x.size else f(0)
        hi = max(f(0), f(x.max())) if x.size else f(0)
        scale = f((hi - lo) / f(255))
        if scale == 0:  # x is all zeros: scale 1, as ONNX Runtime (any scale dequantizes to 0)
            return [np.zeros(x.shape, np.uint8), np.array(1, f), np.array(0, np.uint8)]
        zp = np.clip(np.rint(f(0) - lo / scale), 0, 255)
        y = np.clip(np.rint(x / scale) + zp, 0, 255)
        return [y.astype(np.uint8), np.array(scale, f), np.array(zp, np.uint8)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(4 * (ins[0].numel or 0), base.bytes)


# ---------------------------------------------------------------------------------------------
# Integer and quantized-linear matmul
# ---------------------------------------------------------------------------------------------

def _matmul_shape(op: OpDef, a: TensorType, b: TensorType) -> tuple:
    """NumPy matmul's result shape (1-D operands promoted, then the promoted axis dropped)."""
    if a.rank == 0 or b.rank == 0:
        raise op.fail(f"matmul operands must have rank >= 1, got {a} and {b}")
    sa = (1,) + a.shape if a.rank == 1 else a.shape
    sb = b.shape + (1,) if b.rank == 1 else b.shape
    if is_static(sa[-1]) and is_static(sb[-2]) and sa[-1] != sb[-2]:
        raise op.fail(f"inner dimensions differ: {a} has K={sa[-1]}, {b} has K={sb[-2]}")
    try:
        batch = broadcast_shapes(sa[:-2], sb[:-2])
    except OpError as e:
        raise op.fail(f"batch dimensions of {a} and {b} do not broadcast: {e}") from None
    return batch + ((sa[-2],) if a.rank > 1 else ()) + ((sb[-1],) if b.rank > 1 else ())


def _row_param(op: OpDef, what: str, p: TensorType, a: TensorType) -> None:
    """A's scale/zero point: per tensor, per row (1-D of length M), or N-D broadcastable ([..., M, 1])."""
    if _is_scalar(p):
        return
    if p.rank == 1:
        if a.rank < 2:
            raise op.fail(f"{what} {p} must be a scalar for a 1-D operand {a}")
        if is_static(p.shape[0]) and is_static(a.shape[-2]) and p.shape[0] != a.shape[-2]:
            raise op.fail(f"per-row {what} {p} must have M={a.shape[-2]} elements (the operand is {a})")
        return
    if p.rank != a.rank or (is_static(p.shape[-1]) and p.shape[-1] != 1):
        raise op.fail(f"{what} {p} must be a scalar, an M-vector, or of shape [..., M, 1] for {a}")


def _col_param(op: OpDef, what: str, p: TensorType, b: TensorType) -> None:
    """B's scale/zero point: per tensor, per column (1-D of length N), or N-D ([..., 1, N])."""
    if _is_scalar(p):
        return
    if p.rank == 1:
        if b.rank < 2:
            raise op.fail(f"{what} {p} must be a scalar for a 1-D operand {b}")
        if is_static(p.shape[0]) and is_static(b.shape[-1]) and p.shape[0] != b.shape[-1]:
            raise op.fail(f"per-column {what} {p} must have N={b.shape[-1]} elements (the operand is {b})")
        return
    if p.rank != b.rank or (is_static(p.shape[-2]) and p.shape[-2] != 1):
        raise op.fail(f"{what} {p} must be a scalar, an N-vector, or of shape [..., 1, N] for {b}")


def _rows(p: np.ndarray | None) -> np.ndarray:
    """A's per-row parameter as f64, broadcastable against A (an M-vector becomes a column)."""
    if p is None:
        return np.zeros((), np.float64)
    p = _f64(p)
    if p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    return p.reshape(-1, 1) if p.ndim == 1 else p


def _cols(p: np.ndarray | None) -> np.ndarray:
    if p is None:
        return np.zeros((), np.float64)
    p = _f64(p)
    return p.reshape(()) if p.size == 1 and p.ndim <= 1 else p


def _int32_wrap(acc: np.ndarray) -> np.ndarray:
    """An exact integer-valued f64 accumulator as int32 (wrapping, as a 32-bit accumulator would)."""
    return np.rint(acc).astype(np.int64).astype(np.int32)


def _matmul_cost(ins, outs) -> Cost:
    k = ins[0].shape[-1]
    n = outs[0].numel
    moved = sum((t.nbytes or 0) for t in list(ins) + list(outs) if t is not None)
    return Cost(2 * n * k if is_static(k) and n is not None else 0, moved)


@dataclass(frozen=True, eq=False)
class MatMulInteger(OpDef):
    """Y = (A - a_zero_point) @ (B - b_zero_point) in int32 (NumPy matmul shapes); a_zero_point is
    per tensor or per row of A, b_zero_point per tensor or per column of B."""

    inputs: ClassVar = ("A", "B", "a_zero_point?", "b_zero_point?")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OUT_ELEMWISE_FUSABLE
    since: ClassVar = 10

    def infer(self, ins):
        a, b, azp, bzp = (list(ins) + [None, None])[:4]
        check_dtype(self, a, INT8, "A")
        check_dtype(self, b, INT8, "B")
        for what, zp, of in (("a_zero_point", azp, a), ("b_zero_point", bzp, b)):
            if zp is not None and zp.dtype != of.dtype:
                raise self.fail(f"{what} ({zp.dtype}) must have its operand's type ({of.dtype})")
        if azp is not None:
            _row_param(self, "a_zero_point", azp.type, a.type)
        if bzp is not None:
            _col_param(self, "b_zero_point", bzp.type, b.type)
        return [TensorType(DType.i32, _matmul_shape(self, a.type, b.type))]

    def compute(self, a, b, azp=None, bzp=None):
        acc = np.matmul(_f64(a) - _rows(azp), _f64(b) - _cols(bzp))
        return [_int32_wrap(np.asarray(acc))]

    def cost(self, ins, outs):
        return _matmul_cost(ins, outs)


@dataclass(frozen=True, eq=False)
class QLinearMatMul(OpDef):
    """Quantized matmul: y = quantize(dequantize(a) @ dequantize(b), y_scale, y_zero_point), the
    accumulation exact; a's parameters per tensor or per row, b's per tensor or per column, y's per
    tensor or per column. int8/uint8 or float 8 operands; the result type is y_zero_point's."""

    inputs: ClassVar = ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale",
                        "y_zero_point")
    outputs: ClassVar = ("y",)
    pattern: ClassVar = Pattern.OUT_ELEMWISE_FUSABLE
    since: ClassVar = 21

    def infer(self, ins):
        a, sa, za, b, sb, zb, sy, zy = ins
        for what, v, allowed in (("a", a, QLINEAR_TYPES), ("b", b, QLINEAR_TYPES),
                                 ("y_zero_point", zy, QLINEAR_TYPES), ("a_scale", sa, STD_FLOATS - {DType.f64}),
                                 ("b_scale", sb, STD_FLOATS - {DType.f64}), ("y_scale", sy, STD_FLOATS - {DType.f64})):
            check_dtype(self, v, allowed, what)
        if len({sa.dtype, sb.dtype, sy.dtype}) != 1:
            raise self.fail(f"the scales must share one type, got {sa.dtype}, {sb.dtype}, {sy.dtype}")
        for what, zp, of in (("a_zero_point", za, a), ("b_zero_point", zb, b)):
            if zp.dtype != of.dtype:
                raise self.fail(f"{what} ({zp.dtype}) must have its operand's type ({of.dtype})")
        shape = _matmul_shape(self, a.type, b.type)
        for what, p in (("a_scale", sa), ("a_zero_point", za)):
            _row_param(self, what, p.type, a.type)
        for what, p in (("b_scale", sb), ("b_zero_point", zb)):
            _col_param(self, what, p.type, b.type)
        out = TensorType(zy.dtype, shape)
        for what, p in (("y_scale", sy), ("y_zero_point", zy)):
            try:
                if broadcast_shapes(p.shape, shape) != shape:
                    raise OpError("")
            except OpError:
                raise self.fail(f"{what} {p.type} must broadcast to the result {out}") from None
        return [out]

    def compute(self, a, sa, za, b, sb, zb, sy, zy):
        # on the promoted operands (a 1-D a is a row, a 1-D b a column), so that per-row and
        # per-column parameters meet their rows and columns; the promoted axes dropped after
        a2, b2 = (a[None, :] if a.ndim == 1 else a), (b[:, None] if b.ndim == 1 else b)
        acc = np.matmul(_f64(a2) - _rows(za), _f64(b2) - _cols(zb))
        # the real result over y_scale: acc * (sa * sb) / sy, in f64
        real = np.asarray(acc) * (_rows(sa) * _cols(sb))
        if b.ndim == 1:
            real = real[..., 0]
        if a.ndim == 1:
            real = real[..., 0, :] if b.ndim > 1 else real[..., 0]
        real = real / _cols(sy)
        return [_requantize(real, zy.reshape(()) if zy.size == 1 and zy.ndim <= 1 else zy,
                            DType.from_numpy(zy.dtype))]

    def cost(self, ins, outs):
        return _matmul_cost([ins[0], ins[3]], outs)


# ---------------------------------------------------------------------------------------------
# Integer and quantized-linear convolution (on top of the float Conv reference)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _ConvBased(OpDef):
    """Conv attributes and shape inference shared by ConvInteger and QLinearConv: both run Kiln's float
    Conv reference on zero-point-shifted f64 operands (exact for 8-bit data)."""

    auto_pad: str = "NOTSET"
    dilations: tuple[int, ...] = ()
    group: int = 1
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    pattern: ClassVar = Pattern.OUT_ELEMWISE_FUSABLE
    since: ClassVar = 10

    def conv(self) -> OpDef:
        try:  # imported when used, so the two families need not know each other's import order
            from .conv import Conv
        except ImportError:
            raise self.fail("needs Kiln's Conv op (compiler/ir/ops/conv.py), which is not available") from None
        try:
            return Conv(auto_pad=self.auto_pad, dilations=self.dilations, group=self.group,
                        kernel_shape=self.kernel_shape, pads=self.pads, strides=self.strides)
        except OpError as e:
            raise self.fail(str(e)) from None

    def validate(self):
        self.conv()

    def conv_shape(self, x: Value, w: Value) -> tuple:
        proxies = [Value(TensorType(DType.f32, v.shape)) for v in (x, w)]
        try:
            (t,) = self.conv().infer(proxies)[:1]
        except OpError as e:
            raise self.fail(str(e)) from None
        return t.shape

    def run_conv(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return np.asarray(self.conv().compute(x, w)[0], dtype=np.float64)

    def cost(self, ins, outs) -> Cost:
        """2 FLOPs per multiply-add: C/group * prod(kernel) per output element."""
        w = ins[self.inputs.index("w")]
        per_out = w.numel // w.shape[0] if w.numel and is_static(w.shape[0]) and w.shape[0] else 0
        return Cost(2 * (outs[0].numel or 0) * per_out, OpDef.cost(self, ins, outs).bytes)


def _channel_param(op: OpDef, what: str, p: TensorType, w: TensorType) -> None:
    """W's scale/zero point: per tensor, or one per output channel (1-D of length M)."""
    if _is_scalar(p):
        return
    if p.rank != 1 or (is_static(p.shape[0]) and is_static(w.shape[0]) and p.shape[0] != w.shape[0]):
        raise op.fail(f"{what} {p} must be a scalar or have one value per output channel (M={w.shape[0]})")


def _per_channel(p: np.ndarray, rank: int) -> np.ndarray:
    """A per-tensor or per-output-channel parameter as f64, broadcastable against a rank-``rank``
    weight tensor (output channels on axis 0)."""
    p = _f64(p)
    return p.reshape(()) if p.size == 1 and p.ndim <= 1 else p.reshape((-1,) + (1,) * (rank - 1))


@dataclass(frozen=True, eq=False)
class ConvInteger(_ConvBased):
    """y = Conv(x - x_zero_point, w - w_zero_point) in int32 (padding contributes 0); x_zero_point is
    per tensor, w_zero_point per tensor or per output channel."""

    inputs: ClassVar = ("x", "w", "x_zero_point?", "w_zero_point?")
    outputs: ClassVar = ("y",)

    def infer(self, ins):
        x, w, xzp, wzp = (list(ins) + [None, None])[:4]
        check_dtype(self, x, INT8, "x")
        check_dtype(self, w, INT8, "w")
        for what, zp, of in (("x_zero_point", xzp, x), ("w_zero_point", wzp, w)):
            if zp is not None and zp.dtype != of.dtype:
                raise self.fail(f"{what} ({zp.dtype}) must have its operand's type ({of.dtype})")
        if xzp is not None and not _is_scalar(xzp.type):
            raise self.fail(f"x_zero_point must be a scalar (per tensor), got {xzp.type}")
        if wzp is not None:
            _channel_param(self, "w_zero_point", wzp.type, w.type)
        return [TensorType(DType.i32, self.conv_shape(x, w))]

    def compute(self, x, w, xzp=None, wzp=None):
        dx = _f64(x) - (_f64(xzp).reshape(()) if xzp is not None else 0.0)
        dw = _f64(w) - (_per_channel(wzp, w.ndim) if wzp is not None else 0.0)
        return [_int32_wrap(self.run_conv(dx, dw))]


@dataclass(frozen=True, eq=False)
class QLinearConv(_ConvBased):
    """Quantized conv: y = quantize((Conv(x - x_zp, w - w_zp) + B) * x_scale * w_scale, y_scale, y_zp);
    w's parameters per tensor or per output channel, the others per tensor; B int32 (scale
    x_scale * w_scale, zero point 0)."""

    inputs: ClassVar = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale",
                        "y_zero_point", "B?")
    outputs: ClassVar = ("y",)

    def infer(self, ins):
        x, sx, zx, w, sw, zw, sy, zy, bias = (list(ins) + [None])[:9]
        check_dtype(self, x, INT8, "x")
        check_dtype(self, w, INT8, "w")
        check_dtype(self, zy, INT8, "y_zero_point")
        for what, s in (("x_scale", sx), ("w_scale", sw), ("y_scale", sy)):
            check_dtype(self, s, {DType.f32}, what)
        for what, zp, of in (("x_zero_point", zx, x), ("w_zero_point", zw, w)):
            if zp.dtype != of.dtype:
                raise self.fail(f"{what} ({zp.dtype}) must have its operand's type ({of.dtype})")
        for what, p in (("x_scale", sx), ("x_zero_point", zx), ("y_scale", sy), ("y_zero_point", zy)):
            if not _is_scalar(p.type):
                raise self.fail(f"{what} must be a scalar (per tensor), got {p.type}")
        for what, p in (("w_scale", sw), ("w_zero_point", zw)):
            _channel_param(self, what, p.type, w.type)
        shape = self.conv_shape(x, w)
        if bias is not None:
            check_dtype(self, bias, {DType.i32}, "B")
            if bias.type.rank != 1 or (is_static(bias.shape[0]) and is_static(w.shape[0])
                                       and bias.shape[0] != w.shape[0]):
                raise self.fail(f"B must be 1-D with one value per output channel (M={w.shape[0]}), "
                                f"got {bias.type}")
        return [TensorType(zy.dtype, shape)]

    def compute(self, x, sx, zx, w, sw, zw, sy, zy, bias=None):
        acc = self.run_conv(_f64(x) - _f64(zx).reshape(()), _f64(w) - _per_channel(zw, w.ndim))
        channel = (1, -1) + (1,) * (acc.ndim - 2)  # per output channel, in the result's layout
        if bias is not None:
            acc = acc + _f64(bias).reshape(channel)
        ws = _f64(sw).reshape(()) if sw.size == 1 else _f64(sw).reshape(channel)
        real = acc * (_f64(sx).reshape(()) * ws) / _f64(sy).reshape(())
        return [_requantize(real, zy.reshape(()), DType.from_numpy(zy.dtype))]


# ---------------------------------------------------------------------------------------------
# BitCast
# ---------------------------------------------------------------------------------------------

def bit_width(dt: DType) -> int:
    """Bits per element (sub-byte types hold their code in the low bits of a byte)."""
    if dt in (DType.i4, DType.u4, DType.f4e2m1):
        return 4
    if dt in (DType.i2, DType.u2):
        return 2
    return 8 * dt.itemsize


@dataclass(frozen=True, eq=False)
class BitCast(OpDef):
    """Reinterpret the bits of each element as type ``to`` of the same bit width (little endian)."""

    to: DType = DType.f32
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.ELEMWISE
    since: ClassVar = 26

    def validate(self):
        if self.to is DType.string:
            raise self.fail("to=string is not supported: strings have no fixed bit width")

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, ANY - {DType.string}, "input")
        if bit_width(x.dtype) != bit_width(self.to):
            raise self.fail(f"{x.dtype} ({bit_width(x.dtype)} bits) and {self.to} ({bit_width(self.to)} bits) "
                            "differ in width; BitCast needs equal widths")
        return [x.type.with_dtype(self.to)]

    def compute(self, x):
        src = x.view(np.uint8) if x.dtype == np.bool_ else x
        if src.dtype.itemsize > 1:
            src = src.astype(src.dtype.newbyteorder("<"))
        if self.to is DType.bool:
            return [src.view(np.uint8) != 0]
        target = self.to.np.newbyteorder("<") if self.to.np.itemsize > 1 else self.to.np
        return [src.copy().view(target).astype(self.to.np)]


OPS = (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger,
       QLinearConv, BitCast)
