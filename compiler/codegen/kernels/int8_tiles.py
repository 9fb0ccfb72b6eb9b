"""The int8 GEMM's tiles as a kernel's parallel tasks (``gemm/int8.py`` emits the tile itself):
rows of uint8/int8 activations against constant int8 weights packed at compile time, the zero points
paid back, and each finished row of a tile written through the lowering's finishing expression.

MatMulInteger/QLinearMatMul (``qmatmul.py``) read A in place; the integer convolutions (``qconv.py``)
read the columns their im2col wrote into scratch, and write the result transposed (NCHW).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from llvmlite import ir

from ...ir.graph import Value
from ...ir.types import DType
from ..gemm.int8 import INT8_CHUNKS_PER_THREAD, Int8Emitter, Int8Tiling, isa_for, pack_b
from ..loops import KernelForm
from ..loops.expr import INDEX, Const, Expr, Var, cast
from ..loops.llvm import MEMORY_TYPES, expr_llvm, print_llvm
from .base import I8, I32, FormLowering, KernelBuilder, KernelGroup, c64, par_grain


class Int8Lowering(FormLowering):
    """An integer lowering with a portable loop form (``form``) and, where ``packed_reason`` says
    nothing against it, the int8 tiles on the CPU (``emit_packed``: VNNI, or ``vpmaddwd`` on AVX-512 BW
    or AVX2)."""

    def packed_reason(self, k: KernelBuilder, group: KernelGroup) -> str | None:
        raise NotImplementedError

    def emit_packed(self, k: KernelBuilder, group: KernelGroup, chain=None) -> None:
        raise NotImplementedError

    def chain_reason(self, node) -> str | None:
        """Why the elementwise chain after ``node``'s sums is better left to a pass of its own (None:
        computed in the finishing expression, ``requantize.py``)."""
        raise NotImplementedError

    def finish_groups(self, node) -> list[tuple[int, ...]]:
        """The result's axes grouped as the finishing expression indexes them (``requantize.py``)."""
        raise NotImplementedError

    def emit(self, k: KernelBuilder, group: KernelGroup, chain=None) -> None:
        """The product; with ``chain`` (a ``requantize.FinishChain``) each finished sum goes through
        it and the chain's result is written (the product's own never is)."""
        why = self.packed_reason(k, group)
        if why is None:
            self.emit_packed(k, group, chain)
        else:
            k.note(f"portable int8 loop ({why})")
            print_llvm(k, self.form(group, f"{k.name}.loop", k.in_place, chain=chain))


@dataclass
class Int8Job:
    """``out[row(m) + n * col_stride] = finish(sum_k (A[m, k] - za) (W[k, n] - zw[n]), m, n)`` for
    m < R, n < N."""

    R: int
    K: int
    N: int
    weights: Any                      # the constant [K, N] int8/uint8 weights
    weights_zero_point: Any           # their zero point: a scalar or one per column
    a_signed: bool                    # A is int8 (else uint8)
    rows: Callable[[], ir.Value]      # A's pointer (R rows of K bytes), asked for inside the task
    a_zero_point: Value | None        # A's zero point (None: 0)
    a_zero_point_per_row: bool
    params: list                      # (name, value, per row/column?) for the finishing expression
    finish: Callable                  # (s: Var i32, m: Var, n: Var, param) -> the result's Expr
    out: Value
    out_row: Callable                 # (builder, m) -> the index in ``out`` of row m's column 0
    col_stride: int = 1               # elements between a row's columns in ``out`` (NCHW: the pixels)
    #: with ``tap_rows``, k runs over (tap, K / taps bytes) and ``tap_rows(b, base, m, tap)`` gives row
    #: m's bytes under each tap (``base``: what ``rows`` gave): a convolution reading an NHWC copy of
    #: its input in place, one tile loop per tap into the same sums
    taps: int = 1
    tap_rows: Callable | None = None
    #: (s, m, n, weight: the kernel's pointer to compile-time data) -> a ``Fast`` way to ``finish``'s
    #: values, or None
    fast: Callable | None = None


#: the values a ``Fast`` finishing computes before it looks at their doubt (a tile's row of 64; a
#: depthwise plane in runs of this many)
FAST_RUN = 64
#: the note of a kernel whose finishing takes a ``Fast`` way
FAST_NOTE = "requantized in float32; a row with a value near a rounding tie again in float64 (the reference's bits)"
#: how near a rounding tie (in units of the result) a fast finishing value may be before the exact
#: expression runs over its row (``Fast``)
TIE_MARGIN = 2.0 ** -11


@dataclass
class Fast:
    """A float32 way to a requantizing finishing expression's values (``value``), and when one may
    differ from the exact expression's (``doubt``, a bool: near a rounding tie, where float32's
    error could tip the rounding). ``store_finished`` stores the fast values, then the exact ones
    over a run of them where any is in doubt: the exact expression's bits at float32's cost."""

    value: Expr
    doubt: Expr


def store_finished(k: KernelBuilder, n, exact: Expr, fast: Fast | None, env_of, store) -> None:
    """``store(c, value)`` for ``c < n`` (an i64), the value ``exact``'s on the variables ``env_of(c)``
    binds; with ``fast``, its values, and ``exact``'s again over each run of ``FAST_RUN`` values
    where any is in doubt."""
    b = k.b
    if fast is None:
        with k.loop(n, "c") as c:
            store(c, expr_llvm(b, k.math, exact, env_of(c)))
        return
    doubt = k.f.alloca(I8, name="doubt")
    with k.loop(b.udiv(b.add(n, c64(FAST_RUN - 1)), c64(FAST_RUN)), "run") as r:
        c0 = b.mul(r, c64(FAST_RUN))
        m = k.f.min(b.sub(n, c0), c64(FAST_RUN))
        b.store(ir.Constant(I8, 0), doubt)
        with k.loop(m, "c") as i:
            c = b.add(c0, i)
            env = env_of(c)
            store(c, expr_llvm(b, k.math, fast.value, env))
            b.store(b.or_(b.load(doubt), b.zext(expr_llvm(b, k.math, fast.doubt, env), I8)), doubt)
        with k.f.if_(b.icmp_unsigned("!=", b.load(doubt), ir.Constant(I8, 0))):
            with k.loop(m, "c") as i:
                c = b.add(c0, i)
                store(c, expr_llvm(b, k.math, exact, env_of(c)))


def param_reader(kf: KernelForm, specs, bind=lambda p: p):
    """``param(name, i, dtype)``: the expression reading the parameter ``name`` of ``specs`` ((name,
    value, one per row/column?) triples; buffers of ``kf`` bound to ``bind(value)``) at row/column
    ``i`` (its only element when per tensor) as ``dtype``; None for a parameter the op lacks."""
    bufs = {what: (kf.buffer(what, p.type.dtype, (int(p.type.numel),), value=bind(p)), vector)
            for what, p, vector in specs}

    def param(what, i, dt):
        if what not in bufs:
            return None
        buf, vector = bufs[what]
        return cast(buf[(i if vector else Const(0, INDEX),)], dt)

    return param


def emit_int8_tiles(k: KernelBuilder, job: Int8Job) -> None:
    R, K, N = job.R, job.K, job.N
    tiling = Int8Tiling.for_shape(R, N, isa_for(k.target))
    packed = pack_b(job.weights, job.weights_zero_point, tiling)
    MR, NR = tiling.MR, tiling.NR
    panels, K4 = packed.words.shape[:2]
    blocks = -(-R // MR)
    k.note(f"{tiling.isa.describe} of {MR}x{NR}: {blocks} row blocks x {panels} panels, K={K}"
           + (", rows summed for the weights' zero point" if packed.needs_rowsum else ""))
    emitter = Int8Emitter(k.module, tiling)
    lanes, vec = tiling.isa.lanes, emitter.vec
    out_t = MEMORY_TYPES[job.out.type.dtype]
    s_var, m_var, j_var = Var("s", DType.i32), Var("m", INDEX), Var("j", INDEX)
    k.chunks_per_thread = INT8_CHUNKS_PER_THREAD
    with k.parallel_for(blocks * panels, min_per_task=par_grain(2 * MR * NR * max(K, 1), 1 << 17)) as (lo, hi):
        b = k.b
        tile = k.f.alloca(I32, MR * NR, name="tile")  # the finished tile, row by row
        # the finishing expression, on this task's pointers
        param = param_reader(KernelForm("finish"), job.params, k.ptr)
        finish = job.finish(s_var, m_var, j_var, param)
        fast = job.fast(s_var, m_var, j_var, k.weight) if job.fast is not None else None
        if fast is not None:
            k.note(FAST_NOTE)
        ap, yp = job.rows(), k.ptr(job.out)
        words, colsum, zbp = k.weight(packed.words), k.weight(packed.colsum), k.weight(packed.zb)
        zap = k.ptr(job.a_zero_point) if job.a_zero_point is not None else None

        def za_of(m):  # A's zero point for row m, as i32, plus 128 for int8 A (its sign bit is flipped)
            base = ir.Constant(I32, 128 if job.a_signed else 0)
            if zap is None:
                return base
            z = b.load(k.at(zap, m if job.a_zero_point_per_row else c64(0), I8), typ=I8)
            return b.add(b.sext(z, I32) if job.a_signed else b.zext(z, I32), base)

        with k.loop(b.sub(hi, lo), "t") as i:
            t = b.add(lo, i)
            rb, pn = b.udiv(t, c64(panels)), b.urem(t, c64(panels))
            m0 = b.mul(rb, c64(MR))
            ms = [k.f.min(b.add(m0, c64(r)), c64(R - 1)) for r in range(MR)]  # rows past R: the last again
            panel = k.at(words, b.mul(pn, c64(K4 * NR)), I32)
            if job.tap_rows is None:
                rows = [k.at(ap, b.mul(m, c64(K)), I8) for m in ms]
                grid, rowsums, _ = emitter.tile(k.f, rows, K, job.a_signed, panel, packed.needs_rowsum)
            else:  # one tile loop per tap, each going on from the sums of the one before (K / taps is
                # a whole number of words; the sums stay in registers from tap to tap)
                kt = K // job.taps
                sums = None
                for tap in range(job.taps):
                    grid, rowsums, _ = sums = emitter.tile(
                        k.f, [job.tap_rows(b, ap, m, tap) for m in ms], kt, job.a_signed,
                        k.at(panel, c64(tap * (kt // tiling.KPW) * NR), I32), packed.needs_rowsum, start=sums)
            n0 = b.mul(pn, c64(NR))
            cols = k.f.min(b.sub(c64(N), n0), c64(NR))

            def vload(p, v):
                return b.load(b.bitcast(k.at(p, b.add(n0, c64(v * lanes)), I32), vec.as_pointer()), typ=vec, align=4)

            for r in range(MR):
                zsplat = emitter.splat(b, za_of(ms[r]))
                for v in range(tiling.NV):  # sum a'b' - za' colsum(b') [- zb' rowsum(a') + K za' zb']
                    val = b.sub(grid[r][v], b.mul(zsplat, vload(colsum, v)))
                    if rowsums is not None:
                        zbv = vload(zbp, v)
                        rs = emitter.splat(b, b.extract_element(rowsums[r], ir.Constant(I32, 0)))
                        val = b.add(b.sub(val, b.mul(zbv, rs)), b.mul(b.mul(zsplat, ir.Constant(vec, [K] * lanes)), zbv))
                    b.store(val, b.bitcast(k.at(tile, c64(r * NR + v * lanes), I32), vec.as_pointer()), align=4)

            bases = [job.out_row(b, m) for m in ms]
            live = [b.icmp_signed("<", b.add(m0, c64(r)), c64(R)) for r in range(MR)]

            def finished(r, store):  # the finished values of the tile's row r: store(c, value)
                def env_of(c):
                    s_ = b.load(k.at(tile, b.add(c64(r * NR), c), I32), typ=I32)
                    return {id(s_var): s_, id(m_var): ms[r], id(j_var): b.add(n0, c)}
                store_finished(k, cols, finish, fast, env_of, store)

            if job.col_stride == 1:  # a row's columns are adjacent in out: row by row
                for r in range(MR):
                    with k.f.if_(live[r]):
                        finished(r, lambda c, v, r=r: b.store(v, k.at(yp, b.add(bases[r], b.add(n0, c)), out_t)))
            else:  # the rows of a column are (mostly) adjacent: finished row by row (a vector loop over
                # the columns, the per-column operands contiguous), then copied column by column (the
                # sums themselves straight from the tile)
                done = tile
                if finish is not s_var:
                    done = k.f.alloca(out_t, MR * NR, name="done")
                    for r in range(MR):
                        finished(r, lambda c, v, r=r: b.store(v, k.at(done, b.add(c64(r * NR), c), out_t)))

                def put(r, c):
                    v = b.load(k.at(done, b.add(c64(r * NR), c), out_t), typ=out_t)
                    b.store(v, k.at(yp, b.add(bases[r], b.mul(b.add(n0, c), c64(job.col_stride))), out_t))

                full = b.icmp_signed("<=", b.add(m0, c64(MR)), c64(R))
                with k.f.if_else(full, "rows") as (then, otherwise):
                    with then, k.loop(cols, "c") as c:
                        for r in range(MR):
                            put(r, c)
                    with otherwise:
                        for r in range(MR):
                            with k.f.if_(live[r]), k.loop(cols, "c") as c:
                                put(r, c)

__all__ = ["FAST_NOTE", "Fast", "Int8Job", "Int8Lowering", "TIE_MARGIN", "emit_int8_tiles", "param_reader", "store_finished"]
