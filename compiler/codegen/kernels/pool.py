"""Pooling on the loop form: MaxPool and AveragePool over any number of spatial axes (N, C, spatial
layout), GlobalAveragePool and GlobalMaxPool; f32, f64 and f16 (loaded as f32, computed in f32,
rounded once when stored, as the reference does); MaxPool also i8 and u8.

**Windowed pools.** Every shape is static, so the window geometry (``auto_pad``, pads, strides,
dilations, ``ceil_mode``: the op's own ``resolve_geometry``) is worked out when compiling and
compiled into the kernel. The input is viewed as ``x[nc, d1, ..., w]``, the result as
``y[nc, o1, ..., ow]``. Each spatial axis's outputs are cut into **static ranges** within which the
same taps of the window are inside the input (``column_ranges``: typically a short border, the
interior, a short border). The parallel loop runs over the output rows of all planes (``div``/``rem``
of its index), unless some kernel row is inside the input for some output rows only (pads,
ceil_mode) and there are ``PLANES_PARALLEL`` planes or more: then it runs over the planes and each
plane's rows are serial loops over their ranges (loop index + a constant), so every tap is known
inside or not when compiling: no test, and AveragePool's divisor is a constant. Split by rows, a
kernel row inside for some rows only is read at a clamped row and its taps dropped by one ``select``
per row of taps, and the divisor's row count is a sum of ``select``s. The columns of a
row are one vector loop per column range (cut into whole 256-bit vectors plus the last vector's
worth again: computing an output twice stores the same value, and no column is left to a scalar
remainder loop). In the **registers** order every tap of the window is written out in the reference's
order (outer kernel axes, then ``kw``) into one running value per output. MaxPool 3x3, pads 1 on
[1, 192, 28, 28] (``kiln dump --kernels`` prints it), the interior rows::

    parallel for nc0 in 0..192 grain 9 {
      ...
      for o1 in 0..26 {                                  # output rows 1..26: kernel rows 0..2 inside
        let i2 = o1
        let i3 = add(o1, 1:i64)
        let i4 = add(o1, 2:i64)
        vector for j4 in 0..1 { ... }                    # column 0: taps kw = 1, 2
        vector for j5 in 0..24 {                         # columns 1..24: every tap inside
          let t11 = max(max(x[nc0, i2, j5], x[nc0, i2, add(j5, 1:i64)]), x[nc0, i2, add(j5, 2:i64)])
          let t12 = max(max(max(t11, x[nc0, i3, j5]), x[nc0, i3, add(j5, 1:i64)]), x[nc0, i3, add(j5, 2:i64)])
          let t13 = max(max(max(t12, x[nc0, i4, j5]), x[nc0, i4, add(j5, 1:i64)]), x[nc0, i4, add(j5, 2:i64)])
          y[nc0, add(o1, 1:i64), add(j5, 1:i64)] = t13
        }
        vector for j6 in 0..8 { ... }                    # columns 19..26 (19..24 again)
        vector for j7 in 0..1 { ... }                    # column 27: taps kw = 0, 1
      }
      ...
    }

In the **rows** order the result row is the running value (``inout``): set to the identity, then a
serial loop per outer kernel axis over its taps (over the run inside the input where that is static,
else over all with a test as above) runs the column ranges with only the ``kw`` taps written out,
and a last pass divides. It is taken where the written-out taps would pass ``UNROLL_TAPS``, and for
strided windows (``sw > 1``) whose columns overlap (``kw > sw``: 3x3 stride 2) over output rows
wider than ``NARROW_ROWS``, or whose output rows are ``WIDE_ROWS`` or wider (2x2 stride 2 over 224
columns): measured faster there (LLVM leaves scalar remainders for the larger registers-order bodies
over strided loads), the order of the hand-written kernel this replaced. Narrower strided rows (a
3x3 stride-2 pool over 16 output columns: ResNet-18 at 64x64) are faster by registers, whose taps
LLVM loads as wide vectors and shuffles (x86 targets prefer no gathers: ``CODEGEN_FEATURES``). f16 AveragePool cannot take it (an f16 result cannot hold the
f32 running sum) and is refused past ``UNROLL_TAPS``.

A 2-D float MaxPool (both kernel axes wider than 1) takes a third order, **columns then rows**
(``SEPARABLE``), always splitting the planes among the threads: per output row, the maximum down
the kernel rows inside of every input column into a scratch row of the plane's own, then each
output the maximum of its taps along that row (for 3x3, 3 + 3 taps instead of 9). Its values are
the reference's; only a tie of +0 and -0 may keep the other zero than the reference's tap order.

The registers and rows orders apply the taps in the reference's order: AveragePool starts from +0 and divides (not
multiplies by a reciprocal) by the count of taps, so its results are the reference's bits
(``count_include_pad`` either way: the padded extent counts, ceil_mode's extension past the pads
never does; a window with no tap inside gives 0/0 = NaN, as in the reference). MaxPool starts from
-inf (the type's lowest for integers: padding never wins) and propagates NaN like ``np.maximum``
(a window holding a NaN gives NaN, the default quiet NaN: NumPy's is the first NaN's bits); on
floats as a plain running maximum (earlier tap on ties) with the NaN taps tested on the side
(``row_taps``), half the instructions of the form's NaN-propagating ``max`` per tap.

Refused: bf16 (the form does not hold it), MaxPool's Indices output, windows wider than ``MAX_KW``.

**Global pools** reduce each plane (``x[nc, s]``) into an accumulator that the backend may
vectorize (f64 for sums: the mean is, nearly always, the exact one rounded, whatever the order of
the terms; the compute type for max). Planes shorter than
``GLOBAL_SHORT`` are reduced ``GLOBAL_PLANES`` at a time, side by side in one loop over the plane:
a loop long enough that LLVM vectorizes it along the plane (contiguous) rather than unrolling it and
vectorizing across planes with gathers.

**Threads.** Each output is computed as on one thread, so results do not depend on the thread count.
"""
from __future__ import annotations

import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ...ir.ops import pool as P
from ...ir.ops.conv import resolve_geometry
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, Const, Expr, Op, cast, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain

MAX_KW = 64
#: taps written out over all column ranges at most (``registers``); past it, the ``rows`` order
UNROLL_TAPS = 4096
#: a float MaxPool's max as a plain running maximum plus a NaN test per row of taps (else the form's
#: NaN-propagating ``max`` per tap): the same results (a NaN is the default quiet NaN); one thread:
#: SqueezeNet's three 3x3 stride-2 pools 0.40 -> 0.23 ms, Inception-v1's thirteen 1.91 -> 1.22
NAN_APART = True
#: a 2-D float MaxPool by planes as two passes per output row: the maximum down the kernel rows of
#: every input column into a scratch row of the plane's own, then along it (the window's taps
#: 2 x 3 instead of 9 for 3x3); ties of +0 and -0 may keep the other zero than the reference's order.
#: One thread: Inception-v1's thirteen pools 1.26 -> 0.94 ms, ResNet-50's 0.172 -> 0.154, SqueezeNet's
#: three (3x3 stride 2 by rows before) 0.239 -> 0.236
SEPARABLE = True
#: the vector width column ranges are cut to (256-bit: what LLVM uses on AVX2 and AVX-512 hosts)
VECTOR_BYTES = 32
#: strided windows over output rows this wide or wider are computed by rows
WIDE_ROWS = 64
#: strided windows whose columns overlap are computed by rows over output rows wider than this
#: (3x3 stride 2 over 16 output columns: by registers 6.6 us, by rows 20 us; over 28: 36 and 22 us)
NARROW_ROWS = 16
#: windowed pools whose kernel rows are inside for some output rows only split the planes among the
#: threads from this many planes on (else the rows of all planes)
PLANES_PARALLEL = 8
#: global pools over planes shorter than GLOBAL_SHORT reduce GLOBAL_PLANES planes at a time
GLOBAL_SHORT, GLOBAL_PLANES = 256, 8
FLOATS = (DType.f32, DType.f64, DType.f16, DType.bf16)
#: MaxPool also takes the reference's integer types
MAX_TYPES = FLOATS + (DType.i8, DType.u8)


def pool_geometry(node):
    """(H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw, pe_h, pe_w) of a 1-D or 2-D pool (1-D as H = 1)."""
    axes = window_axes(node)
    if len(axes) == 1:
        a = axes[0]
        return (1, a.size, 1, a.out, 1, a.k, 1, a.s, 1, a.d, 0, a.pb, 0, a.pe)
    h, w = axes
    return (h.size, w.size, h.out, w.out, h.k, w.k, h.s, w.s, h.d, w.d, h.pb, w.pb, h.pe, w.pe)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Axis:
    """One spatial axis of a window: input size, output size, kernel size, stride, dilation, pads."""

    size: int
    out: int
    k: int
    s: int
    d: int
    pb: int
    pe: int

    def outputs(self, k: int, lo: int, hi: int) -> tuple[int, int]:
        """[a, b): the outputs whose tap ``k`` lands on input coordinates [lo, hi) (a == b: none)."""
        a = min(self.out, max(0, _ceil(lo + self.pb - k * self.d, self.s)))
        b = min(self.out, max(0, _ceil(hi + self.pb - k * self.d, self.s)))
        return a, max(a, b)

    def inside(self, k: int) -> tuple[int, int]:
        return self.outputs(k, 0, self.size)

    def counted(self, k: int, include_pad: bool) -> tuple[int, int]:
        """The outputs where tap ``k`` counts toward AveragePool's divisor."""
        return self.outputs(k, -self.pb, self.size + self.pe) if include_pad else self.inside(k)


def window_axes(node) -> list[Axis]:
    """The window geometry of a pool node, one ``Axis`` per spatial axis."""
    op_, x = node.op, node.inputs[0]
    sizes = [int(d) for d in x.shape[2:]]
    strides, dilations, pads = op_._attrs(x.type.rank)
    out, pb, pe = resolve_geometry(op_, sizes, op_.kernel_shape, strides, dilations, pads, op_.auto_pad,
                                   bool(op_.ceil_mode))
    return [Axis(sizes[i], int(out[i]), int(op_.kernel_shape[i]), int(strides[i]), int(dilations[i]), int(pb[i]),
                 int(pe[i])) for i in range(len(sizes))]


@dataclass(frozen=True)
class Columns:
    """A range [lo, hi) of output columns: the window columns inside the input there (``kws``) and
    how many count toward AveragePool's divisor (``count``)."""

    lo: int
    hi: int
    kws: tuple[int, ...]
    count: int


def column_ranges(w: Axis, include_pad: bool) -> list[Columns]:
    """The output columns cut where any tap enters or leaves the input (or the counted extent)."""
    cuts = {0, w.out}
    for kw in range(w.k):
        cuts.update(w.inside(kw))
        cuts.update(w.counted(kw, include_pad))
    cuts = sorted(c for c in cuts if 0 <= c <= w.out)
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        kws = tuple(kw for kw in range(w.k) if w.inside(kw)[0] <= lo < w.inside(kw)[1])
        count = sum(1 for kw in range(w.k) if w.counted(kw, include_pad)[0] <= lo < w.counted(kw, include_pad)[1])
        if out and out[-1].kws == kws and out[-1].count == count:
            out[-1] = Columns(out[-1].lo, hi, kws, count)
        else:
            out.append(Columns(lo, hi, kws, count))
    return out


def _affine(i: Expr, scale: int, offset: int) -> Expr:
    """``i * scale + offset`` (without the trivial terms; ``(e + c) * s + o`` as ``e * s + (c * s + o)``)."""
    if isinstance(i, Op) and i.prim == "add" and isinstance(i.args[1], Const):
        return _affine(i.args[0], scale, int(i.args[1].value) * scale + offset)
    e = i if scale == 1 else op("mul", i, Const(scale, INDEX))
    return op("add", e, Const(offset, INDEX)) if offset else e


def _whole_vectors(c: Columns, lanes: int) -> list[Columns]:
    """A column range as loops of whole vectors: ``[lo, lo + n - n % lanes)`` and the last ``lanes``
    columns again (computing an output twice gives it the same value twice), so no column is left to
    a scalar remainder loop."""
    n = c.hi - c.lo
    if n <= lanes or n % lanes == 0:
        return [c]
    return [Columns(c.lo, c.hi - n % lanes, c.kws, c.count), Columns(c.hi - lanes, c.hi, c.kws, c.count)]


def _identity(is_max: bool, dt: DType) -> Const:
    ct = compute_type(dt)
    if not is_max:
        return Const(0.0, ct)
    return Const(-math.inf, ct) if ct.is_float else Const(int(np.iinfo(dt.np).min), ct)


class Pool(FormLowering):
    """MaxPool (Y only) and AveragePool on the loop form (see the module docstring)."""

    ops = (P.MaxPool, P.AveragePool)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        is_max = isinstance(n.op, P.MaxPool)
        why = dtype_reason([n.inputs[0], n.outputs[0]], allowed=MAX_TYPES if is_max else FLOATS)
        if why:
            return why
        if is_max and len(n.outputs) > 1 and n.outputs[1].uses:
            return "MaxPool's Indices output is not computed natively"
        if n.inputs[0].type.rank != len(n.op.kernel_shape) + 2:
            return "the input's rank does not match kernel_shape"
        if n.op.kernel_shape[-1] > MAX_KW:
            return f"pooling windows wider than {MAX_KW} are left to the interpreter"
        if n.inputs[0].type.numel == 0 or n.outputs[0].type.numel == 0:
            return "empty tensors are left to the interpreter"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        dt = x.type.dtype
        is_max = isinstance(n.op, P.MaxPool)
        include_pad = not is_max and bool(n.op.count_include_pad)
        axes = window_axes(n)
        outer, w = axes[:-1], axes[-1]
        NC = int(x.shape[0]) * int(x.shape[1])
        cols = column_ranges(w, include_pad)
        # the rows of all planes split among the threads; where some kernel row is inside the input
        # (or counted) for some output rows only, and there are planes enough, the planes are split
        # instead and each plane's rows cut into static ranges, so that no row tests its taps
        partial = any(0 < hi - lo < a.out for a in outer for k in range(a.k)
                      for lo, hi in (a.inside(k), a.counted(k, include_pad)))
        # 2-D float MaxPool: by planes, a vertical then a horizontal pass per output row (``separable``)
        separable = SEPARABLE and is_max and compute_type(dt).is_float and len(outer) == 1 and \
            outer[0].k > 1 and w.k > 1 and NC >= 2
        by_planes = separable or (partial and NC >= PLANES_PARALLEL)
        ranges = [[(c.lo, c.hi) for c in column_ranges(a, include_pad)] if by_planes else [(0, a.out)]
                  for a in outer]
        blocks = list(itertools.product(*ranges))
        written = sum(math.prod(len(_taps_in(a, lo, hi)) for a, (lo, hi) in zip(outer, b)) for b in blocks) * \
            sum(len(c.kws) for c in cols)
        rows_fit = is_max or dt is compute_type(dt)  # the result can hold the running value
        # by rows past the written-out taps, and for strided windows whose columns overlap (3x3
        # stride 2) or whose rows are wide (2x2 stride 2 over 224 columns): measured faster so
        rows_order = not separable and (written > UNROLL_TAPS or (rows_fit and w.s > 1 and (
            w.k > w.s and w.out > NARROW_ROWS or w.out >= WIDE_ROWS)))
        if rows_order and not rows_fit:
            raise ValueError(f"{dt} AveragePool windows of more than {UNROLL_TAPS} taps are left to the interpreter "
                             "(the result's type could not hold the running sum)")
        kf = KernelForm(name)
        xb = kf.buffer("x", dt, [NC] + [a.size for a in axes], value=x)
        yb = kf.buffer("y", dt, [NC] + [a.out for a in axes], "inout" if rows_order else "out", value=y)
        order = "columns then rows" if separable else "rows" if rows_order else "registers"
        sb = kf.buffer("v", compute_type(dt), [NC, w.size], "scratch") if separable else None
        kf.note(f"{n.op.name} window {'x'.join(str(a.k) for a in axes)} by {order}, "
                f"{'planes' if by_planes or not outer else 'rows'} split among the threads; "
                f"column ranges {', '.join(f'[{c.lo},{c.hi}):{len(c.kws)}' for c in cols)}")
        ident = _identity(is_max, dt)
        work = w.out * (math.prod(n.op.kernel_shape) + 1)

        def body(nc, idx):
            win = _Window(kf, xb, yb, nc, idx, outer, w, is_max, include_pad, ident)
            if separable:
                win.separable(cols, sb)
            elif rows_order:
                win.by_rows(cols)
            else:
                win.by_registers(cols)

        if by_planes or not outer:
            plane = work * math.prod(a.out for a in outer)
            with kf.loop(NC, "parallel", grain=par_grain(plane), name="nc") as nc:
                for b in blocks:
                    self._block(kf, list(b), [], lambda idx: body(nc, idx))
        else:
            nrows = NC * math.prod(a.out for a in outer)
            with kf.loop(nrows, "parallel", grain=par_grain(work), name="r") as r:
                idx = []
                rest = r
                for a in reversed(outer):  # r = ((nc * O1 + o1) * O2 + o2) ...
                    idx.insert(0, (kf.let(op("rem", rest, Const(a.out, INDEX)), name="o"), 0, a.out))
                    rest = op("div", rest, Const(a.out, INDEX))
                body(kf.let(rest, name="nc"), idx)
        return kf.finish()

    @staticmethod
    def _block(kf, spans, idx, fn):
        """Serial loops over the output rows ``spans`` ([lo, hi) per outer axis), calling ``fn(idx)``
        with (index, lo, hi) per axis."""
        if len(idx) == len(spans):
            return fn(idx)
        lo, hi = spans[len(idx)]
        with kf.loop(hi - lo, name="o") as q:
            Pool._block(kf, spans, idx + [(_affine(q, 1, lo), lo, hi)], fn)


def _taps_in(a: Axis, lo: int, hi: int) -> list[int]:
    """The taps of axis ``a`` inside the input for some output in [lo, hi)."""
    return [k for k in range(a.k) if min(a.inside(k)[1], hi) > max(a.inside(k)[0], lo)]


def _within_span(o: Expr, lo: int, hi: int, span: tuple[int, int]) -> Expr | None | bool:
    """Whether ``lo <= o < hi`` for an index ``o`` known to lie in ``span``: None when it always
    holds, False when it never does, else the test."""
    slo, shi = span
    if hi <= slo or lo >= shi or hi <= lo:
        return False
    tests = ([op("ge", o, Const(lo, INDEX))] if lo > slo else []) + ([op("lt", o, Const(hi, INDEX))] if hi < shi else [])
    if not tests:
        return None
    return tests[0] if len(tests) == 1 else op("and", *tests)


class _Window:
    """The kernel body for output rows (``nc``; per outer axis (index, lo, hi): the index and the
    static range it lies in)."""

    def __init__(self, kf, xb, yb, nc, idx, outer, w, is_max, include_pad, ident):
        self.kf, self.xb, self.yb, self.nc = kf, xb, yb, nc
        self.idx = [i for i, _, _ in idx]
        self.spans = [(lo, hi) for _, lo, hi in idx]
        self.outer, self.w, self.is_max, self.include_pad, self.ident = outer, w, is_max, include_pad, ident
        self.ct = ident.dtype
        #: a float max taken apart: a plain running maximum, NaN taps tested on the side (``row_taps``)
        self.nan_apart = is_max and self.ct.is_float and NAN_APART

    def comb(self, acc: Expr, v: Expr) -> Expr:
        return op("max" if self.is_max else "add", acc, v)

    def row_taps(self, col_index, cols: Columns, acc: Expr, rows: list[Expr]) -> Expr:
        """``acc`` combined with the taps ``cols.kws`` of the input row at ``rows`` (in order). The
        max of -inf and a tap is the tap; a sum starts from +0 (0 + -0 is +0, as in the reference).
        A float max is the form's ``max`` (NaN if either is NaN) taken apart: a plain running
        maximum that keeps the earlier value on ties and unordered pairs (one ``maxps``), the row's
        NaN taps tested on the side, NaN if one was (the default quiet NaN) -- about half the
        instructions of a NaN-propagating max per tap (``NAN_APART``)."""
        if self.nan_apart:
            acc, nan = self.max_taps(col_index, cols, acc, rows)
            return self.with_nan(nan, acc)
        w = self.w
        for kw in cols.kws:
            v = self.xb[(self.nc, *rows, col_index(kw * w.d - w.pb))]
            acc = v if self.is_max and acc is self.ident else self.comb(acc, v)
        return acc

    def max_taps(self, col_index, cols: Columns, acc: Expr,
                 rows: list[Expr]) -> tuple[Expr, Expr | None]:
        """``fold_max`` of ``acc`` and the taps ``cols.kws`` of the input row at ``rows``."""
        w = self.w
        return self.fold_max(acc, [self.xb[(self.nc, *rows, col_index(kw * w.d - w.pb))] for kw in cols.kws])

    def fold_max(self, acc: Expr, taps: list[Expr]) -> tuple[Expr, Expr | None]:
        """(the plain running maximum of ``acc`` and ``taps``, the earlier value kept on ties and on
        NaN: one ``maxps`` a tap; whether a tap was NaN, None without taps): ``nan_apart``."""
        nan = None
        for v in taps:
            acc = v if acc is self.ident else select(op("gt", v, acc), v, acc)
            nan = op("isnan", v) if nan is None else op("or", nan, op("isnan", v))
        return acc, nan

    def with_nan(self, nan: Expr | None, acc: Expr) -> Expr:
        """``acc``, or NaN where ``nan`` holds."""
        return acc if nan is None else select(nan, Const(math.nan, self.ct), acc)

    @contextmanager
    def columns(self, cols: Columns):
        """A vector loop over the range's columns; yields (the output column, ``col_index(offset)``:
        the input column ``ow * sw + offset`` as an expression of the loop index)."""
        w = self.w
        with self.kf.loop(cols.hi - cols.lo, "vector", name="j") as j:
            def col_index(off: int) -> Expr:
                return _affine(j, w.s, off + cols.lo * w.s)
            yield _affine(j, 1, cols.lo), col_index

    def outer_tap(self, j: int, k) -> tuple[Expr | None | bool, Expr]:
        """(whether tap ``k`` of outer axis ``j`` is inside the input at this row: None when it always
        is, False when it never is; its input coordinate, clamped in range where it is tested)."""
        a, o, span = self.outer[j], self.idx[j], self.spans[j]
        if isinstance(k, int):
            lo, hi = a.inside(k)
            ok = _within_span(o, lo, hi, span)
            if ok is not None and ok is not False:  # clamped where the tap is outside: dropped there
                o = op("max", o, Const(lo, INDEX)) if lo > span[0] else o
                o = op("min", o, Const(hi - 1, INDEX)) if hi < span[1] else o
            return ok, _affine(o, a.s, k * a.d - a.pb)
        # k a loop index (by rows, taps that are inside for some rows only): test the coordinate
        i = self.kf.let(op("add", _affine(o, a.s, -a.pb), _affine(k, a.d, 0)), name="i")
        ok = op("and", op("ge", i, Const(0, INDEX)), op("lt", i, Const(a.size, INDEX)))
        return ok, op("min", op("max", i, Const(0, INDEX)), Const(a.size - 1, INDEX))

    def row_count(self) -> Expr | None:
        """AveragePool: the taps of the outer axes counted at this row (an i64 constant where every
        tap is known counted or not, else a ``let`` of a sum of ``select``s); None without outer axes."""
        if not self.outer:
            return None
        const, tested = 1, None
        for a, o, span in zip(self.outer, self.idx, self.spans):
            c, tests = 0, []
            for k in range(a.k):
                ok = _within_span(o, *a.counted(k, self.include_pad), span)
                if ok is None:
                    c += 1
                elif ok is not False:
                    tests.append(select(ok, Const(1, INDEX), Const(0, INDEX)))
            if not tests:
                const *= c
                continue
            e = Const(c, INDEX)
            for t in tests:
                e = op("add", e, t)
            tested = e if tested is None else op("mul", tested, e)
        if tested is None:
            return Const(const, INDEX)
        return self.kf.let(tested if const == 1 else op("mul", tested, Const(const, INDEX)), name="cnt")

    def finish(self, acc: Expr, count: Expr | None, cols: Columns) -> Expr:
        if self.is_max:
            return acc
        if count is None:
            d = Const(float(cols.count), self.ct)
        elif isinstance(count, Const):
            d = Const(float(count.value * cols.count), self.ct)
        else:
            d = cast(op("mul", count, Const(cols.count, INDEX)) if cols.count != 1 else count, self.ct)
        return op("div", acc, d)

    def by_registers(self, cols: list[Columns]) -> None:
        """Every tap written out into one running value per output (see the module docstring)."""
        kf = self.kf
        per_axis = []
        for j, a in enumerate(self.outer):
            taps = []
            for k in range(a.k):
                ok, i = self.outer_tap(j, k)
                if ok is not False:
                    taps.append((None if ok is None else kf.let(ok, name="ok"), kf.let(i, name="i")))
            per_axis.append(taps)
        combos = []  # (ok or None, input coordinates) per combination of outer taps, in row-major order
        for combo in itertools.product(*per_axis):
            oks = [ok for ok, _ in combo if ok is not None]
            ok = None
            for c in oks:
                ok = c if ok is None else op("and", ok, c)
            if len(oks) > 1:
                ok = kf.let(ok, name="ok")
            combos.append((ok, [i for _, i in combo]))
        count = None if self.is_max else self.row_count()
        lanes = max(1, VECTOR_BYTES // self.ct.itemsize)
        for c in (piece for c in cols for piece in _whole_vectors(c, lanes)):
            with self.columns(c) as (ow, col_index):
                acc, nan = self.ident, None  # (nan: whether a tap was NaN, for ``nan_apart``)
                if c.kws:
                    for ok, rows in combos:
                        if self.nan_apart:
                            v, isn = self.max_taps(col_index, c, acc, rows)
                            isn = isn if ok is None else op("and", ok, isn)
                            nan = isn if nan is None else op("or", nan, isn)
                        else:
                            v = self.row_taps(col_index, c, acc, rows)
                        acc = kf.let(v if ok is None else select(ok, v, acc))
                kf.store(self.yb, (self.nc, *self.idx, ow), self.finish(self.with_nan(nan, acc), count, c))

    def separable(self, cols: list[Columns], sb) -> None:
        """A 2-D max by planes (``SEPARABLE``): ``v[c]``, the maximum over the kernel rows inside of
        input column c, for every column into the plane's scratch row ``sb[nc]``, then each output
        the maximum over its taps along ``v``; NaN taps apart in both passes."""
        kf, a, w = self.kf, self.outer[0], self.w
        rows = []
        for k in range(a.k):
            ok, i = self.outer_tap(0, k)
            assert ok is None or ok is False, "by planes, a kernel row is inside for every row of a range or none"
            if ok is None:
                rows.append(kf.let(i, name="i"))
        with kf.loop(w.size, "vector", name="c") as c:
            acc, nan = self.fold_max(self.ident, [self.xb[(self.nc, i, c)] for i in rows])
            kf.store(sb, (self.nc, c), self.with_nan(nan, acc))
        lanes = max(1, VECTOR_BYTES // self.ct.itemsize)
        for piece in (p for c in cols for p in _whole_vectors(c, lanes)):
            with self.columns(piece) as (ow, col_index):
                acc, nan = self.fold_max(self.ident, [sb[(self.nc, col_index(kw * w.d - w.pb))] for kw in piece.kws])
                kf.store(self.yb, (self.nc, *self.idx, ow), self.with_nan(nan, acc))

    def by_rows(self, cols: list[Columns]) -> None:
        """The result row as the running value: set to the identity, a pass per row of taps, a
        last pass dividing (see the module docstring)."""
        kf, yb = self.kf, self.yb

        def each_column(fn):
            for c in cols:
                with self.columns(c) as (ow, col_index):
                    fn(c, (self.nc, *self.idx, ow), col_index)

        each_column(lambda c, at, ci: kf.store(yb, at, self.ident))

        def nest(j: int, oks: list, rows: list):
            if j == len(self.outer):
                ok = None
                for c in oks:
                    ok = c if ok is None else op("and", ok, c)
                ok = kf.let(ok, name="ok") if ok is not None else None

                def update(c, at, ci):
                    if c.kws:
                        cur = yb[at]
                        v = self.row_taps(ci, c, cur, rows)
                        kf.store(yb, at, v if ok is None else select(ok, v, cur))
                each_column(update)
                return
            a, span = self.outer[j], self.spans[j]
            taps = _taps_in(a, *span)
            if not taps:
                return
            static = all(_within_span(self.idx[j], *a.inside(k), span) in (None, False) for k in range(a.k))
            if static:  # the same taps inside for every row here: a run of them, no test
                assert taps == list(range(taps[0], taps[-1] + 1)), taps
                with kf.loop(len(taps), name="k") as q:
                    k = _affine(q, 1, taps[0])
                    i = op("add", _affine(self.idx[j], a.s, -a.pb), _affine(k, a.d, 0))
                    nest(j + 1, oks, rows + [kf.let(i, name="i")])
            else:
                with kf.loop(a.k, name="k") as k:
                    ok, i = self.outer_tap(j, k)
                    nest(j + 1, oks + [ok], rows + [kf.let(i, name="i")])

        nest(0, [], [])
        if not self.is_max:
            count = self.row_count()
            each_column(lambda c, at, ci: kf.store(yb, at, self.finish(yb[at], count, c)))


class GlobalPool(FormLowering):
    """GlobalAveragePool and GlobalMaxPool on the loop form, any rank >= 3: a row reduction per plane."""

    ops = (P.GlobalAveragePool, P.GlobalMaxPool)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = dtype_reason([n.inputs[0], n.outputs[0]], allowed=FLOATS)
        if why:
            return why
        if n.inputs[0].type.numel == 0:
            return "empty tensors are left to the interpreter"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        dt = x.type.dtype
        ct = compute_type(dt)
        S = math.prod(int(d) for d in x.shape[2:])
        NC = int(x.shape[0]) * int(x.shape[1])
        avg = isinstance(n.op, P.GlobalAveragePool)
        # short planes: PLANES of them per step, so the loop over the plane is long enough to be a
        # loop (several running values side by side) and every read stays contiguous
        per = max(1, min(GLOBAL_PLANES if S < GLOBAL_SHORT else 1, NC))
        blocks = _ceil(NC, per)
        kf = KernelForm(name)
        xb = kf.buffer("x", dt, (NC, S), value=x)
        yb = kf.buffer("y", dt, (NC,), "out", value=y)
        kf.note(f"{n.op.name} over {S} elements of each of {NC} planes, {per} at a time")
        acc_t = DType.f64 if avg and S >= GLOBAL_SHORT else ct
        with kf.loop(blocks, "parallel", grain=par_grain(per * S), name="b") as b:
            planes = []
            for p in range(per):
                i = _affine(b, per, p)
                if (blocks - 1) * per + p > NC - 1:  # the last block's extra planes: the last one again
                    i = op("min", i, Const(NC - 1, INDEX))
                planes.append(i if i is b else kf.let(i, name="nc"))
            accs = [kf.acc(Const(0.0, acc_t) if avg else Const(-math.inf, acc_t)) for _ in planes]
            with kf.loop(S, name="s") as s:
                for nc, acc in zip(planes, accs):
                    v = xb[nc, s]
                    kf.update(acc, "add" if avg else "max", cast(v, acc_t) if v.dtype is not acc_t else v)
            for nc, acc in zip(planes, accs):
                res = op("div", acc, Const(float(S), acc_t)) if avg else acc
                kf.store(yb, (nc,), cast(res, ct) if res.dtype is not ct else res)
        return kf.finish()


__all__ = ["GlobalPool", "Pool", "pool_geometry"]
