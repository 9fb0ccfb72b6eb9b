"""Elementwise ops on any element type of ``LLVM_TYPES`` that move or compare values rather than do
float arithmetic: Cast/CastLike, the comparisons, Not/And/Or/Xor and Where (with broadcasting).

Cast follows the reference (``cast_array``: NumPy ``astype`` on x86-64):

* float -> int64/int32: truncation toward zero; NaN, infinities and values out of the target's
  range give the "integer indefinite" value (INT64_MIN / INT32_MIN), as cvttss2si/cvttsd2si do;
* float -> int8/uint8: as float -> int32, then the low 8 bits (what NumPy's C cast compiles to);
* float -> bool: x != 0 (NaN is true); int -> bool: x != 0; bool -> any: 0 or 1;
* int -> int: the low bits when narrowing, sign- (signed sources) or zero-extension (uint8, bool);
* int -> float and f64 <-> f32: rounded to nearest even (infinities where out of f32's range).
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...ir.ops import elementwise as ew
from ...ir.types import DType
from .base import I8, I32, I64, LLVM_TYPES, KernelBuilder, KernelGroup, Lowering, strides_of
from .data import _add, _mul, _val, broadcast_strides, merge_dims, shape_of, split_runs, static_reason

FLOAT_TYPES = (DType.f32, DType.f64)
UNSIGNED = (DType.u8, DType.bool)


def cast_value(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType) -> ir.Value:
    """``v`` (of ``LLVM_TYPES[src]``) converted to ``dst`` as the reference does (module docstring)."""
    st, dt = LLVM_TYPES[src], LLVM_TYPES[dst]
    if src is dst:
        return v
    if dst is DType.bool:
        if src in FLOAT_TYPES:
            nz = b.fcmp_unordered("!=", v, ir.Constant(st, 0.0))
        else:
            nz = b.icmp_unsigned("!=", v, ir.Constant(st, 0))
        return b.zext(nz, I8)
    if src in FLOAT_TYPES and dst in FLOAT_TYPES:
        return b.fpext(v, dt) if dst is DType.f64 else b.fptrunc(v, dt)
    if src in FLOAT_TYPES:
        wide = I64 if dst is DType.i64 else I32
        bits = wide.width
        lo, hi = ir.Constant(st, -float(2 ** (bits - 1))), ir.Constant(st, float(2 ** (bits - 1)))
        ok = b.and_(b.fcmp_ordered(">=", v, lo), b.fcmp_ordered("<", v, hi))
        safe = b.select(ok, v, ir.Constant(st, 0.0))
        r = b.select(ok, b.fptosi(safe, wide), ir.Constant(wide, -(2 ** (bits - 1))))
        return r if wide is dt else b.trunc(r, dt)
    if dst in FLOAT_TYPES:
        return b.uitofp(v, dt) if src in UNSIGNED else b.sitofp(v, dt)
    # integer -> integer
    if st.width == dt.width:
        return v
    if st.width > dt.width:
        return b.trunc(v, dt)
    return b.zext(v, dt) if src in UNSIGNED else b.sext(v, dt)


def emit_map(k: KernelBuilder, out, ins, fn: Callable[[ir.IRBuilder, list], ir.Value]) -> None:
    """out[p] = fn(ins[0][p], ...) over out's shape, each input broadcast to it (NumPy rules)."""
    ysh = shape_of(out)
    if out.type.numel == 0:
        return
    strides = [strides_of(ysh)] + [broadcast_strides(shape_of(x), ysh) for x in ins]
    shp, strides = merge_dims(ysh, strides)
    tys = [LLVM_TYPES[v.type.dtype] for v in [out] + list(ins)]

    def body(ptrs, offs):
        vals = [k.load(p, _val(o), t) for p, o, t in zip(ptrs[1:], offs[1:], tys[1:])]
        k.store(fn(k.b, vals), ptrs[0], _val(offs[0]))

    if not shp:
        body([k.ptr(v) for v in [out] + list(ins)], [0] * (len(ins) + 1))
        return

    def run(offs, n):  # one run of the innermost axis (big maps: split among the threads)
        ptrs = [k.ptr(v) for v in [out] + list(ins)]
        b = k.b
        with k.loop(n, name="e") as i:
            body(ptrs, [_add(b, o, _mul(b, i, s[-1])) for o, s in zip(offs, strides)])

    split_runs(k, shp, strides, [0] * (len(ins) + 1), sum(v.type.dtype.itemsize for v in [out] + list(ins)), run)


class _Map(Lowering):
    """A single elementwise node of static tensors of ``LLVM_TYPES``."""

    #: element types the data inputs may have
    types: tuple = tuple(LLVM_TYPES)

    def operands(self, n):
        return list(n.inputs)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = static_reason(self.operands(n) + list(n.outputs))
        if why:
            return why
        for x in self.operands(n):
            if x.type.dtype not in self.types:
                return f"{n.op.name} on {x.type.dtype.name} is not supported natively"
        return None

    def fn(self, n, b: ir.IRBuilder, vals: list) -> ir.Value:
        raise NotImplementedError

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        n = group.node
        emit_map(k, n.outputs[0], self.operands(n), lambda b, vals: self.fn(n, b, vals))


class Cast(_Map):
    ops = (ew.Cast, ew.CastLike)

    def operands(self, n):
        return [n.inputs[0]]

    def fn(self, n, b, vals):
        return cast_value(b, vals[0], n.inputs[0].type.dtype, n.outputs[0].type.dtype)


_CMP = {ew.Equal: "==", ew.Less: "<", ew.LessOrEqual: "<=", ew.Greater: ">", ew.GreaterOrEqual: ">="}


class Compare(_Map):
    """Equal, Less, LessOrEqual, Greater, GreaterOrEqual: ordered float compares (NaN is false),
    signed integer compares, unsigned for uint8 and bool."""

    ops = tuple(_CMP)

    def fn(self, n, b, vals):
        dt, pred = n.inputs[0].type.dtype, _CMP[type(n.op)]
        if dt in FLOAT_TYPES:
            r = b.fcmp_ordered(pred, vals[0], vals[1])
        elif dt in UNSIGNED:
            r = b.icmp_unsigned(pred, vals[0], vals[1])
        else:
            r = b.icmp_signed(pred, vals[0], vals[1])
        return b.zext(r, I8)


class Logic(_Map):
    """Not, And, Or, Xor on bool (stored as 0/1 bytes)."""

    ops = (ew.Not, ew.And, ew.Or, ew.Xor)
    types = (DType.bool,)

    def fn(self, n, b, vals):
        op = type(n.op)
        if op is ew.Not:
            return b.xor(vals[0], ir.Constant(I8, 1))
        f = {ew.And: b.and_, ew.Or: b.or_, ew.Xor: b.xor}[op]
        return f(vals[0], vals[1])


class Where(_Map):
    ops = (ew.Where,)

    def fn(self, n, b, vals):
        c, x, y = vals
        return b.select(b.icmp_unsigned("!=", c, ir.Constant(I8, 0)), x, y)


LOWERINGS = (Cast(), Compare(), Logic(), Where())

__all__ = ["LOWERINGS", "Cast", "Compare", "Logic", "Where", "cast_value", "emit_map"]
