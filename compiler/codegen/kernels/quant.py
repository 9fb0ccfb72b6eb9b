"""QuantizeLinear and DequantizeLinear to and from the integer types (per tensor, per axis, blocked),
and DynamicQuantizeLinear, on the loop form, computed as the reference computes them:

* quantize: ``q = x / scale`` in the precision (f32, or f64 for an integer scale), rounded half to
  even, plus the zero point, clamped to the result type's range;
* dequantize: ``(x - zero_point)`` in i64, converted to the result type, times the scale in that
  type (float16: the product in f32, rounded once).

* dynamic: x's range extended to 0 (one pass: running min and max from 0), the scale and zero
  point from it in f32, then quantize as above (one thread: the form has no grid-wide step between).

Each element finds its scale and zero point from its own index (the same one, the one along the
axis, or the axis index divided by the block size). Float 8/4 types and float16 quotients stay with
the interpreter.
"""
from __future__ import annotations

from contextlib import contextmanager

from ...ir.ops import quant as qn
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, Const, cast, compute_type, op, select
from ..loops.scalar import quantized
from ..loops.llvm import print_llvm
from .base import FormLowering, KernelBuilder, KernelGroup, dtype_reason, par_grain

_INTS = (DType.i8, DType.u8, DType.i16, DType.u16, DType.i32)
_FLOATS = (DType.f32, DType.f16, DType.bf16, DType.f64)
#: elements of work a parallel task gets at least
PAR_MIN_WORK = 1 << 15
#: DynamicQuantizeLinear's running minima/maxima side by side (a block size, not the vector width)
RANGE_LANES = 64


def _params(kf: KernelForm, n, scale, zp, shape):
    """(scale buffer, zero-point buffer or None, index function of x's index) for the op's layout."""
    rank = len(shape)
    op_ = n.op
    if op_.block_size > 0:
        a = op_.axis % rank
        dims = [int(d) for d in scale.shape]

        def at(ix):
            return tuple(op("div", i, Const(op_.block_size, INDEX)) if k == a else i for k, i in enumerate(ix))
    elif scale.type.numel == 1:
        dims = [1]

        def at(ix):
            return (Const(0, INDEX),)
    else:
        a = op_.axis % rank
        dims = [int(scale.shape[0])]

        def at(ix):
            return (ix[a],)
    sb = kf.buffer("scale", scale.type.dtype, dims, value=scale)
    zb = kf.buffer("zero_point", zp.type.dtype, dims, value=zp) if zp is not None else None
    return sb, zb, at


def _loops(kf: KernelForm, shape, body) -> None:
    index: list = []

    def go(axis: int):
        if axis == len(shape):
            return body(tuple(index))
        kind = "parallel" if axis == 0 else "vector" if axis == len(shape) - 1 else "serial"
        inner = 1
        for d in shape[1:]:
            inner *= d
        with kf.loop(shape[axis], kind, grain=par_grain(inner, PAR_MIN_WORK) if axis == 0 else 1) as i:
            index.append(i)
            go(axis + 1)
            index.pop()

    go(0)


def _as(v, dt: DType):
    return v if v.dtype is dt else cast(v, dt)


class QuantizeLinear(FormLowering):
    ops = (qn.QuantizeLinear,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, scale = n.inputs[0], n.inputs[1]
        zp = n.inputs[2] if len(n.inputs) > 2 else None
        why = dtype_reason([x], allowed=_FLOATS + (DType.i32,)) or \
            dtype_reason([scale], allowed=(DType.f32, DType.i32)) or dtype_reason([zp, n.outputs[0]], allowed=_INTS)
        if why:
            return why
        if n.op.precision not in (None, DType.f32, DType.f64):
            return f"precision {n.op.precision}"
        if x.type.rank == 0:
            return "a scalar input"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, scale = n.inputs[0], n.inputs[1]
        zp = n.inputs[2] if len(n.inputs) > 2 else None
        y = n.outputs[0]
        shape = [int(d) for d in x.shape]
        prec = n.op.precision or (DType.f64 if scale.type.dtype is DType.i32 else DType.f32)
        out = y.type.dtype
        bits = 8 * out.itemsize
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, shape, value=x)
        sb, zb, at = _params(kf, n, scale, zp, shape)
        yb = kf.buffer("y", out, shape, "out", value=y)
        kf.note(f"QuantizeLinear to {out}, the quotient in {prec}")

        # rounding, the zero point and the clamp in f32 when the quotient is f32 and the result has
        # at most 16 bits (exact: ``scalar.quantized``), twice the vector width of f64
        work = DType.f32 if prec is DType.f32 and bits <= 16 else DType.f64

        def body(ix):
            q = op("div", _as(xb[ix], prec), _as(sb[at(ix)], prec))
            kf.store(yb, ix, cast(quantized(q, None if zb is None else zb[at(ix)], out, work), out))

        _loops(kf, shape, body)
        return kf.finish()


class DequantizeLinear(FormLowering):
    ops = (qn.DequantizeLinear,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, scale = n.inputs[0], n.inputs[1]
        zp = n.inputs[2] if len(n.inputs) > 2 else None
        why = dtype_reason([x, zp], allowed=_INTS) or dtype_reason([scale, n.outputs[0]], allowed=_FLOATS)
        if why:
            return why
        if x.type.rank == 0:
            return "a scalar input"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, scale = n.inputs[0], n.inputs[1]
        zp = n.inputs[2] if len(n.inputs) > 2 else None
        y = n.outputs[0]
        shape = [int(d) for d in x.shape]
        out = y.type.dtype
        work = compute_type(out)
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, shape, value=x)
        sb, zb, at = _params(kf, n, scale, zp, shape)
        yb = kf.buffer("y", out, shape, "out", value=y)
        kf.note(f"DequantizeLinear to {out}")

        def rounded(v):  # a value of the result type, held in its compute type
            return op("to_f16", v) if out is DType.f16 else v

        def body(ix):
            d = _as(xb[ix], INDEX)
            if zb is not None:
                d = op("sub", d, _as(zb[at(ix)], INDEX))
            s = rounded(_as(sb[at(ix)], work))  # the scale in the result type
            kf.store(yb, ix, rounded(op("mul", rounded(cast(d, work)), s)))

        _loops(kf, shape, body)
        return kf.finish()


class DynamicQuantizeLinear(FormLowering):
    ops = (qn.DynamicQuantizeLinear,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason([n.inputs[0]], allowed=(DType.f32,))
        if why:
            return why
        if n.inputs[0].type.numel == 0:
            return "an empty input (left to the interpreter)"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x = n.inputs[0]
        size = x.type.numel
        f = DType.f32
        kf = KernelForm(name)
        xb = kf.buffer("x", f, (size,), value=x)
        yb = kf.buffer("y", DType.u8, (size,), "out", value=n.outputs[0])
        sb = kf.buffer("y_scale", f, (1,), "inout", value=n.outputs[1])  # read back by the tasks
        zb = kf.buffer("y_zero_point", DType.u8, (1,), "inout", value=n.outputs[2])
        kf.note("DynamicQuantizeLinear: the range in one pass, then the elements quantized")
        # the range: RANGE_LANES running minima and maxima side by side (an elementwise vector loop:
        # NaN-propagating min/max reductions do not vectorize), then those and the tail
        lanes = RANGE_LANES
        blocks = size // lanes
        plo = kf.buffer("lo", f, (lanes,), "scratch")
        phi = kf.buffer("hi", f, (lanes,), "scratch")
        with kf.loop(lanes, "vector", name="l") as l:
            kf.store(plo, (l,), Const(0.0, f))
            kf.store(phi, (l,), Const(0.0, f))
        if blocks:
            with kf.loop(blocks, name="b") as b, kf.loop(lanes, "vector", name="l") as l:
                v = xb[(op("add", op("mul", b, Const(lanes, INDEX)), l),)]
                kf.store(plo, (l,), op("min", plo[(l,)], v))
                kf.store(phi, (l,), op("max", phi[(l,)], v))
        @contextmanager
        def lanes_of_x():
            with kf.loop(lanes, name="l") as l:
                yield plo[(l,)], phi[(l,)]

        _scale_and_zero_point(kf, *_range(kf, lanes_of_x, xb, blocks * lanes, size), sb, zb)
        # one thread: a grid-wide step between the range and the elements is not in the form (a GPU
        # would need two launches; the CPU's ``emit`` makes three kernels); the elements read the
        # scale and zero point back from the results
        with kf.loop(size, "vector", name="j") as j:
            kf.store(yb, (j,), _quantized_u8(xb[j], sb, zb))
        return kf.finish()

    #: elements per block of the parallel range pass (``emit``): inputs of two blocks or more use it
    RANGE_BLOCK = RANGE_LANES * 512

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        """On the CPU, an input of two blocks or more: the range of each whole block in parallel, then
        (one thread) the blocks' ranges, the tail and the scale and zero point, then the elements
        quantized in parallel: the same values as ``form``'s one thread (min and max do not depend on
        the order), with both threads at work."""
        n = group.node
        size = n.inputs[0].type.numel
        blocks = size // self.RANGE_BLOCK
        if blocks < 2:
            return super().emit(k, group)
        f, lanes, bs = DType.f32, RANGE_LANES, self.RANGE_BLOCK
        x, (y, ys, yz) = n.inputs[0], n.outputs
        parts = k.scratch(blocks * 2 * lanes * 4)
        kf = KernelForm(f"{k.name}.ranges")  # each block's running minima and maxima, lanes side by side
        xb = kf.buffer("x", f, (size,), value=x)
        pb = kf.buffer("parts", f, (blocks, 2, lanes), "inout", value=parts)
        with kf.loop(blocks, "parallel", name="blk") as blk:
            with kf.loop(lanes, "vector", name="l") as l:
                kf.store(pb, (blk, Const(0, INDEX), l), Const(0.0, f))
                kf.store(pb, (blk, Const(1, INDEX), l), Const(0.0, f))
            with kf.loop(bs // lanes, name="j") as j, kf.loop(lanes, "vector", name="l") as l:
                v = xb[(op("add", op("mul", blk, Const(bs, INDEX)), op("add", op("mul", j, Const(lanes, INDEX)), l)),)]
                kf.store(pb, (blk, Const(0, INDEX), l), op("min", pb[blk, Const(0, INDEX), l], v))
                kf.store(pb, (blk, Const(1, INDEX), l), op("max", pb[blk, Const(1, INDEX), l], v))
        print_llvm(k, kf.finish())
        kf = KernelForm(f"{k.name}.scale")  # one thread: the blocks' ranges and the tail's
        xb = kf.buffer("x", f, (size,), value=x)
        pb = kf.buffer("parts", f, (blocks, 2, lanes), value=parts)
        sb = kf.buffer("y_scale", f, (1,), "out", value=ys)
        zb = kf.buffer("y_zero_point", DType.u8, (1,), "out", value=yz)
        @contextmanager
        def blocks_of_x():
            with kf.loop(blocks, name="blk") as blk, kf.loop(lanes, name="l") as l:
                yield pb[blk, Const(0, INDEX), l], pb[blk, Const(1, INDEX), l]

        _scale_and_zero_point(kf, *_range(kf, blocks_of_x, xb, blocks * bs, size), sb, zb)
        print_llvm(k, kf.finish())
        kf = KernelForm(f"{k.name}.quantize")  # the elements, in parallel
        xb = kf.buffer("x", f, (size,), value=x)
        yb = kf.buffer("y", DType.u8, (size,), "out", value=y)
        sb = kf.buffer("y_scale", f, (1,), value=ys)
        zb = kf.buffer("y_zero_point", DType.u8, (1,), value=yz)
        with kf.loop(size, "parallel", grain=PAR_MIN_WORK, name="j") as j:
            kf.store(yb, (j,), _quantized_u8(xb[(j,)], sb, zb))
        print_llvm(k, kf.finish())


def _range(kf: KernelForm, partials, xb, start: int, size: int):
    """The accumulators (lo, hi) of x's range extended to 0: over the running minima and maxima that
    ``partials()`` gives inside its loops, then over x's elements ``start..size``."""
    f = DType.f32
    lo, hi = kf.acc(Const(0.0, f), name="lo"), kf.acc(Const(0.0, f), name="hi")
    with partials() as (pmin, pmax):
        kf.update(lo, "min", pmin)
        kf.update(hi, "max", pmax)
    if size > start:
        with kf.loop(size - start, name="i") as i:
            v = xb[(op("add", i, Const(start, INDEX)),)]
            kf.update(lo, "min", v)
            kf.update(hi, "max", v)
    return lo, hi


def _scale_and_zero_point(kf: KernelForm, lo, hi, sb, zb) -> None:
    """DynamicQuantizeLinear's scale and zero point from x's range (extended to 0) into ``sb`` and
    ``zb``: ``(hi - lo) / 255`` and ``round(-lo / scale)`` clamped; an all-zero x: 1 and 0."""
    f = DType.f32
    scale = kf.let(op("div", op("sub", hi, lo), Const(255.0, f)), name="scale")
    zero = kf.let(op("eq", scale, Const(0.0, f)), name="zero")  # x is all 0: scale 1, zero point 0
    safe = kf.let(select(zero, Const(1.0, f), scale), name="s")
    zp = kf.let(select(zero, Const(0.0, f), _clip(op("round", op("sub", Const(0.0, f), op("div", lo, safe))))),
                name="zp")
    zero_ix = (Const(0, INDEX),)
    kf.store(sb, zero_ix, safe)
    kf.store(zb, zero_ix, cast(zp, DType.u8))


def _quantized_u8(x, sb, zb):
    """x quantized by the scale and zero point in ``sb``/``zb``: ``round(x / scale) + zp``, clamped."""
    zero_ix = (Const(0, INDEX),)
    q = op("add", op("round", op("div", x, sb[zero_ix])), cast(zb[zero_ix], DType.f32))
    return cast(_clip(q), DType.u8)


def _clip(v):
    """v clamped to [0, 255] (a uint8's range), in v's float type."""
    return op("min", op("max", v, Const(0.0, v.dtype)), Const(255.0, v.dtype))


LOWERINGS = (QuantizeLinear(), DequantizeLinear(), DynamicQuantizeLinear())

__all__ = ["DequantizeLinear", "DynamicQuantizeLinear", "LOWERINGS", "QuantizeLinear"]
