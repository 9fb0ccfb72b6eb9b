"""MatMulInteger and QLinearMatMul on the loop form: int8/uint8 operands, int32 accumulation.

One row of the result at a time (the rows of every batch are the parallel axis): the row's int32
sums start at 0 in scratch, and for each k the row of B, less its zero point, times A's element,
less A's, is added along the row (the vector axis). Then the row is finished:

* MatMulInteger: the int32 sums are the result (wrapping, as a 32-bit accumulator does);
* QLinearMatMul: ``sum * (a_scale * b_scale) / y_scale`` in f64, exactly as the reference computes
  it, rounded half to even, plus y's zero point, saturated to y's type.

Parameters per tensor, per row of A (an M-vector) and per column of B and y (an N-vector); batch
dimensions broadcast as NumPy's matmul does (an operand's buffer reads a broadcast axis with stride
0). This is the portable kernel every printer prints (``form``).

On a CPU with AVX-512 VNNI, AVX-512 BW or AVX2, a constant 2-D B (weights) is packed at compile time
and the int32 sums come from the int8 tile kernel (``gemm/int8.py``: ``vpdpbusd``, else ``vpmaddwd``),
register tiles of rows x vectors of columns as
parallel tasks; each finished row of a tile goes through the same finishing expression as the
portable kernel (``finish_value``, printed per element), so both give the same bits.
"""
from __future__ import annotations

import math

import numpy as np

from ...ir.ops import quant as qn
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, Const, Var, cast, op, select
from ..loops.llvm import MEMORY_TYPES, print_llvm
from .base import I32, KernelBuilder, KernelGroup, c64, dtype_reason, par_grain
from ..gemm.int8 import isa_for
from .int8_tiles import FAST_NOTE, TIE_MARGIN, Fast, Int8Job, Int8Lowering, emit_int8_tiles, param_reader, \
    store_finished

_INT8 = (DType.i8, DType.u8)


def _promoted(shape, left: bool) -> list[int]:
    """A matmul operand's shape with a 1-D operand promoted (A: a row, B: a column)."""
    shape = [int(d) for d in shape]
    if len(shape) == 1:
        return [1] + shape if left else shape + [1]
    return shape


def _broadcast_strides(shape: list[int], batch: list[int]) -> list[int]:
    """Strides of ``shape`` (dense) seen with the result's ``batch`` dimensions in front of its last
    two: 0 along a batch axis it broadcasts along (absent or of size 1)."""
    dense = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    own = len(shape) - 2
    strides = []
    for i, d in enumerate(batch):
        j = i - (len(batch) - own)
        strides.append(dense[j] if j >= 0 and shape[j] == d and d != 1 else 0)
    return strides + dense[-2:]


def _param_layout(p, length: int) -> str | None:
    """"tensor", "vector" (one per row or column) or None (a layout this kernel does not read)."""
    if p is None:
        return "tensor"
    dims = [int(d) for d in p.shape]
    if math.prod(dims) == 1 and len(dims) <= 1:
        return "tensor"
    if len(dims) == 1 and dims[0] == length:
        return "vector"
    return None


class _IntegerMatMul(Int8Lowering):
    """What MatMulInteger and QLinearMatMul share: operands, their layouts, the accumulation."""

    def operands(self, n):
        """(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point); None for
        what the op does not have."""
        raise NotImplementedError

    def param_specs(self, n, rows: int, cols: int) -> list:
        """(name, value, one per row/column?) of the op's scales and zero points (``param_reader``)."""
        a, sa, za, b, sb, zb, sy, zy = self.operands(n)
        return [(what, p, _param_layout(p, length) == "vector")
                for what, p, length in (("a_scale", sa, rows), ("a_zero_point", za, rows), ("b_scale", sb, cols),
                                        ("b_zero_point", zb, cols), ("y_scale", sy, cols), ("y_zero_point", zy, cols))
                if p is not None]

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        a, sa, za, b, sb, zb, sy, zy = self.operands(n)
        why = dtype_reason([a, za, b, zb, zy], allowed=_INT8) or dtype_reason([sa, sb, sy], allowed=(DType.f32, DType.f16))
        if why:
            return why
        sa_ = _promoted(a.shape, True)
        sb_ = _promoted(b.shape, False)
        m, nn = sa_[-2], sb_[-1]
        for what, p, length in (("a_scale", sa, m), ("a_zero_point", za, m), ("b_scale", sb, nn),
                                ("b_zero_point", zb, nn), ("y_scale", sy, nn), ("y_zero_point", zy, nn)):
            if _param_layout(p, length) is None:
                return f"{what} of shape {list(p.shape)}: only per-tensor and 1-D per-row/column parameters " \
                       f"are lowered"
        if n.outputs[0].type.numel == 0:
            return "empty results are left to the Empty lowering"
        return self.form_reason(group)

    def chain_reason(self, node) -> str | None:
        """The chain after the sums is computed on each finished row of a tile (contiguous)."""
        return None

    def finish_groups(self, node) -> list[tuple[int, ...]]:
        """Row (every axis but the last), column."""
        shape = tuple(int(d) for d in node.outputs[0].shape)
        return [shape[:-1], shape[-1:]]

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None, chain=None,
             sums_to=None) -> Kernel:
        """The portable loop; ``sums_to`` (a pointer of the kernel being built): the int32 sums,
        [rows, N], written there and not finished."""
        n = group.node
        a, sa, za, b, sb, zb, sy, zy = self.operands(n)
        y = chain.final if chain is not None else n.outputs[0]
        ash, bsh = _promoted(a.shape, True), _promoted(b.shape, False)
        M, K, N = ash[-2], ash[-1], bsh[-1]
        batch = [int(d) for d in y.shape[:len(y.shape) - (a.type.rank > 1) - (b.type.rank > 1)]]
        T = math.prod(batch)
        kf = KernelForm(name)
        ab = kf.buffer("a", a.type.dtype, batch + [M, K], strides=_broadcast_strides(ash, batch), value=a)
        bb = kf.buffer("b", b.type.dtype, batch + [K, N], strides=_broadcast_strides(bsh, batch), value=b)
        yb = kf.buffer("y", y.type.dtype, batch + [M, N], "out", value=y)
        acc = kf.buffer("acc", DType.i32, (T * M, N), "scratch" if sums_to is None else "inout", value=sums_to)
        param = param_reader(kf, self.param_specs(n, M, N))
        kf.note(f"{n.op.name}: {a.type.dtype} x {b.type.dtype} -> int32 sums over K={K}, then {y.type.dtype}")
        with kf.loop(T * M, "parallel", grain=par_grain(K * N), name="r") as r:
            if T == 1:  # (batch dimensions of 1: index 0 of each)
                t_ix, m = tuple(Const(0, INDEX) for _ in batch), r
            else:
                t = kf.let(op("div", r, Const(M, INDEX)), name="t")
                m = kf.let(op("rem", r, Const(M, INDEX)), name="m")
                t_ix = tuple(kf.let(op("rem", op("div", t, Const(math.prod(batch[i + 1:]), INDEX)),
                                       Const(d, INDEX)), name="bt") for i, d in enumerate(batch))
            with kf.loop(N, "vector", name="n") as j:
                kf.store(acc, (r, j), Const(0, DType.i32))
            za_m = param("a_zero_point", m, DType.i32)
            with kf.loop(K, name="k") as k:
                av = cast(ab[t_ix + (m, k)], DType.i32)
                av = kf.let(av if za_m is None else op("sub", av, za_m), name="av")
                with kf.loop(N, "vector", name="n") as j:
                    bv = cast(bb[t_ix + (k, j)], DType.i32)
                    zb_j = param("b_zero_point", j, DType.i32)
                    bv = bv if zb_j is None else op("sub", bv, zb_j)
                    kf.store(acc, (r, j), op("add", acc[r, j], op("mul", av, bv)))
            if sums_to is None:  # each row finished (with ``sums_to``, the sums are the result)
                with kf.loop(N, "vector", name="n") as j:
                    v = self.finish_value(acc[r, j], m, j, param, n.outputs[0].type.dtype)
                    kf.store(yb, t_ix + (m, j), v if chain is None else chain.expr(kf, v, [r, j]))
        return kf.finish()

    def emit(self, k: KernelBuilder, group: KernelGroup, chain=None) -> None:
        """The tiles where ``packed_reason`` allows; else the portable loop, whose sums are finished
        in float32 where the node has a ``fast_finish`` (B not constant: the attention's products of
        a transformer quantized by ONNX Runtime), as the tiles' are."""
        why = self.packed_reason(k, group)
        n, y = group.node, group.node.outputs[0]
        a, b_ = (self.operands(n)[i] for i in (0, 3))
        if why is None or chain is not None or a.type.rank < 2 or b_.type.rank < 2 or \
                self.fast_params(n, y.type.dtype) is None:
            return super().emit(k, group, chain)
        k.note(f"portable int8 loop ({why})")
        M, N = int(a.shape[-2]), int(y.shape[-1])
        rows = y.type.numel // max(N, 1)
        sums = k.scratch(4 * rows * N)
        print_llvm(k, self.form(group, f"{k.name}.loop", k.in_place, sums_to=sums))
        s_var, m_var, j_var = Var("s", DType.i32), Var("m", INDEX), Var("j", INDEX)
        out_t = MEMORY_TYPES[y.type.dtype]
        with k.parallel_for(rows, min_per_task=max(1, (1 << 14) // max(N, 1))) as (lo, hi):
            b = k.b
            param = param_reader(KernelForm("finish"), self.param_specs(n, M, N), k.ptr)
            exact = self.finish_value(s_var, m_var, j_var, param, y.type.dtype)
            fast = self.fast_finish(n, s_var, j_var, k.weight, y.type.dtype)
            k.note(FAST_NOTE)
            sp, yp = k.again(sums), k.ptr(y)
            with k.loop(b.sub(hi, lo), "row") as i:
                r = b.add(lo, i)
                base = b.mul(r, c64(N))
                m = b.urem(r, c64(M))

                def env_of(c):
                    return {id(s_var): b.load(k.at(sp, b.add(base, c), I32), typ=I32), id(m_var): m, id(j_var): c}
                store_finished(k, c64(N), exact, fast, env_of, lambda c, v: b.store(v, k.at(yp, b.add(base, c), out_t)))

    def finish_value(self, s, m, j, param, out: DType):
        return s

    # -- the packed VNNI path (CPU) ----------------------------------------------------------------
    def packed_reason(self, k: KernelBuilder, group: KernelGroup) -> str | None:
        """Why the int8 tiles do not run this node (None: they do)."""
        a, sa, za, b, sb, zb, sy, zy = self.operands(group.node)
        if isa_for(k.target) is None:
            return "the target has neither AVX-512 BW nor AVX2"
        if b.const is None or b.type.rank != 2:
            return "B is not a constant matrix"
        if zb is not None and zb.const is None:
            return "B's zero point is not a constant"
        if a.type.rank < 2:
            return "A is a vector"
        if a.type.rank > 2 and any(p is not None and _param_layout(p, 1) != "tensor" for p in (sa, za)):
            return "A has batch dimensions and per-row parameters"
        return None

    def emit_packed(self, k: KernelBuilder, group: KernelGroup, chain=None) -> None:
        a, sa, za, b, sb, zb, sy, zy = self.operands(group.node)
        own = group.node.outputs[0].type.dtype
        y = chain.final if chain is not None else group.node.outputs[0]
        K, N = (int(d) for d in b.shape)
        R = a.type.numel // max(K, 1) if K else math.prod(int(d) for d in a.shape[:-1])
        params = self.param_specs(group.node, R, N)
        emit_int8_tiles(k, Int8Job(
            R=R, K=K, N=N, weights=b.const, weights_zero_point=zb.const if zb is not None else 0,
            a_signed=a.type.dtype is DType.i8, rows=lambda: k.ptr(a), a_zero_point=za,
            a_zero_point_per_row=za is not None and _param_layout(za, R) == "vector", params=params,
            finish=lambda s, m, j, param: self.finish_value(s, m, j, param, own) if chain is None else
            chain.expr(KernelForm("chain"), self.finish_value(s, m, j, param, own), [m, j], k.ptr), out=y,
            out_row=lambda b_, m: b_.mul(m, c64(N)),
            fast=lambda s, m, j, weight: self.fast_finish(group.node, s, j, weight, own) if chain is None else None))

    def fast_params(self, n, out: DType) -> tuple | None:
        """(the combined scale per column as float32, the zero point) of ``fast_finish``, or None."""
        return None

    def fast_finish(self, n, s, j, weight, out: DType) -> Fast | None:
        """A float32 way to ``finish_value`` (``int8_tiles.Fast``; ``weight``: the kernel's pointer to
        compile-time data), or None (the integer sums alone)."""
        got = self.fast_params(n, out)
        if got is None:
            return None
        mult, zp = got
        kf = KernelForm("fast")
        return fast_requantized(s, None, kf.buffer("mult", DType.f32, (len(mult),), value=weight(mult))[(j,)], zp, out)


class MatMulInteger(_IntegerMatMul):
    ops = (qn.MatMulInteger,)

    def operands(self, n):
        a, b, za, zb = (list(n.inputs) + [None, None])[:4]
        return a, None, za, b, None, zb, None, None


class QLinearMatMul(_IntegerMatMul):
    ops = (qn.QLinearMatMul,)

    def operands(self, n):
        a, sa, za, b, sb, zb, sy, zy = n.inputs
        return a, sa, za, b, sb, zb, sy, zy

    def fast_params(self, n, out: DType) -> tuple | None:
        """(the combined scale per column, float32, and the zero point) of ``finish_value``'s float32
        way, where A's scale is one constant, B's and y's scales and y's zero point constants (y's
        one per tensor); else None."""
        a, sa, za, b, sb, zb, sy, zy = self.operands(n)
        if out not in _INT8 or sa.const is None or sa.const.size != 1 or sb.const is None:
            return None
        K = int(_promoted(a.shape, True)[-1])
        N = int(_promoted(b.shape, False)[-1])
        scale = float(sa.const.reshape(-1)[0]) * np.broadcast_to(sb.const.astype(np.float64).reshape(-1), (N,))
        got = fast_scales(K * 255 * 255, None, scale, sy, zy)
        return None if got is None else (got[1], got[2])

    def finish_value(self, s, m, j, param, out: DType):
        f = DType.f64
        real = op("div", op("mul", cast(s, f), op("mul", param("a_scale", m, f), param("b_scale", j, f))),
                  param("y_scale", j, f))
        return requantized(real, param("y_zero_point", j, f), out)


def fast_requantized(s, bias, mult, zero_point: float, out: DType) -> Fast:
    """``requantized``'s value from float32 (``Fast``): the int32 sum plus the bias (exact in int32: the
    caller checks the bound) times ``mult`` (the combined scale ``scale / y_scale`` rounded to
    float32), rounded half to even, plus the zero point, clamped. Its relative error against the
    reference's f64 value is under 3 * 2^-24, so below 1024 under 2^-12: a value further than
    ``TIE_MARGIN`` from a tie rounds as the reference's does, and past 1024 both saturate."""
    f = DType.f32
    a = s if bias is None else op("add", s, bias)
    y = op("mul", cast(a, f), mult)
    q = op("round", y)
    v = op("add", q, Const(float(zero_point), f))
    lo, hi = (Const(-128.0, f), Const(127.0, f)) if out is DType.i8 else (Const(0.0, f), Const(255.0, f))
    t = select(op("gt", v, lo), v, lo)
    doubt = op("and", op("gt", op("abs", op("sub", y, q)), Const(0.5 - TIE_MARGIN, f)),
               op("lt", op("abs", y), Const(1024.0, f)))
    return Fast(cast(select(op("lt", t, hi), t, hi), out), doubt)


def fast_scales(sums_bound: int, bias, scale, y_scale, y_zero_point) -> tuple | None:
    """(the bias as int32 or None, the combined scale ``scale / y_scale`` per column as float32, the
    zero point) of a requantization whose sums plus bias stay inside int32 (``sums_bound``: the most
    a sum's magnitude can be), its parameters constant (``scale``: the input scales' product in f64,
    as the reference multiplies, or None), else None: no fast path."""
    if scale is None or y_scale is None or y_scale.const is None or y_scale.const.size != 1 or \
            (y_zero_point is not None and y_zero_point.const is None) or (bias is not None and bias.const is None):
        return None
    ys = float(y_scale.const.reshape(-1)[0])
    if not np.all(np.isfinite(scale)) or not math.isfinite(ys) or ys == 0:
        return None
    b = bias.const.astype(np.int64).reshape(-1) if bias is not None else np.zeros(1, np.int64)
    if sums_bound + int(np.abs(b).max(initial=0)) >= 2 ** 31:
        return None
    zp = float(y_zero_point.const.reshape(-1)[0]) if y_zero_point is not None else 0.0
    return (None if bias is None else b.astype(np.int32)), (scale / ys).astype(np.float32), zp


def requantized(real, zero_point, out: DType):
    """``real`` (f64, already over the result's scale) rounded half to even, plus the zero point (f64),
    saturated to ``out`` (int8 or uint8): the reference's ``_requantize``."""
    f = DType.f64
    v = op("add", op("round", real), zero_point)
    lo, hi = (-128.0, 127.0) if out is DType.i8 else (0.0, 255.0)
    return cast(op("min", op("max", v, Const(lo, f)), Const(hi, f)), out)


LOWERINGS = (MatMulInteger(), QLinearMatMul())

__all__ = ["LOWERINGS", "MatMulInteger", "QLinearMatMul", "fast_requantized", "fast_scales", "requantized"]
