"""Data movement on the loop form, for every element type the form stores: Concat, Split, Slice,
Transpose, Expand, Tile, Pad, Gather, ConstantOfShape and BitCast.

Elements move as their bits: every buffer is seen flat, as unsigned integers of its element's size
(u8, u16, u32, u64), so each copy is exact for every type (NaN payloads, -0.0, f16, bool bytes) and a
constant is its bit pattern.

A copy is a **strided view**: a shape plus, per side, an element offset and one element stride per
axis (0 where a side broadcasts, negative for reversed slices), written as the side's flat index
``offset + sum(i * stride)`` (which the verifier bounds exactly). Axes of length 1 are dropped and
neighbours that stay adjacent on every side merged (``merge_dims``), so e.g. a Concat on axis 1 of
one image is one contiguous run per input. The loops:

* the leading axes (at least the first) are one parallel loop over their flattened index, taken
  until an iteration moves at most ``PIECE_BYTES`` (the last axis cut at a divisor of its length
  where the others are too few), ``PAR_BYTES`` at least per task;
* the innermost axis is a vector loop; where both sides are contiguous it is a load/store run,
  which the LLVM printer makes one ``llvm.memcpy`` (runs of 4 KB or more) and LLVM vectorizes
  otherwise;
* a transpose (the destination contiguous along the last axis, the source along another axis j)
  goes by tiles of T x T elements (T x size = 64 bytes; 32 for 1- and 2-byte elements), which stay
  in L1: the row tiles (and, for few rows, groups of column tiles) in the parallel loop, then static
  loops over the column tiles and the tile's rows and columns. The innermost runs along the
  source's contiguous axis (contiguous loads, strided stores) for 4- and 8-byte elements and along
  the result's (gathers, contiguous stores) for 1 and 2 bytes: each the faster, measured. Every tile
  is full: the last row tile repeats its last row, the last column tile starts at C - T; the
  repeated writes stay within one task.

Concat and Split share one parallel loop among their pieces (outer index x a common cut of the
pieces' runs). Pad computes each output row as up to three runs (before, the source's row, after);
the source index of a padded position follows the mode (constant: a select on "inside"; edge, wrap,
reflect: clamp, remainder, reflection). Gather reads one run per (outer index, index); run-time
indices are normalized, checked (``fail_if``: the run raises an error naming the node and the index)
and clamped, a bad one writing zeros; constant indices are checked when compiling.
"""
from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...ir.graph import Value
from ...ir.ops import indexing as ix
from ...ir.ops import quant as qt
from ...ir.ops import shape as sh
from ...ir.ops import tensor as tn
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, STORAGE_TYPES, Const, Expr, cast, op, select
from ..loops.form import Buffer
from .base import FormLowering, KernelGroup, dtype_reason, strides_of
from .indexing import checked_index

ALL_TYPES = tuple(sorted(STORAGE_TYPES, key=lambda d: d.name))
#: the unsigned type each element size moves as
BITS = {1: DType.u8, 2: DType.u16, 4: DType.u32, 8: DType.u64}

#: bytes a parallel task moves at least (a thread hand-off costs some 10-50 us); copies of less
#: than twice this run on the calling thread
PAR_BYTES = 1 << 18
#: bytes one iteration of the parallel loop moves at most, where the shape allows
PIECE_BYTES = 1 << 16
#: a run cut from the last axis for the parallel loop keeps at least this many bytes
MIN_RUN_BYTES = 1 << 10


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def const_array(v: Value | None) -> np.ndarray | None:
    """The compile-time contents of a value (a constant of any size, or a small known value)."""
    if v is None:
        return None
    if v.const is not None:
        return np.asarray(v.const)
    return None if v.known is None else np.asarray(v.known)


def const_ints(v: Value | None) -> list[int] | None:
    a = const_array(v)
    return None if a is None else [int(x) for x in a.ravel()]


def static_reason(values: Sequence[Value | None]) -> str | None:
    return dtype_reason(values, allowed=ALL_TYPES)


def shape_of(v: Value) -> list[int]:
    return [int(d) for d in v.shape]


def merge_dims(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop axes of length 1 and merge neighbours that are adjacent on every side."""
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for i, d in enumerate(shape):
        d = int(d)
        if d == 1:
            continue
        ss = [int(s[i]) for s in strides]
        if out_shape and all(os_[-1] == s * d for os_, s in zip(out_strides, ss)):
            out_shape[-1] *= d
            for os_, s in zip(out_strides, ss):
                os_[-1] = s
        else:
            out_shape.append(d)
            for os_, s in zip(out_strides, ss):
                os_.append(s)
    return out_shape, out_strides


def broadcast_strides(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of a dense input read broadcast to ``out_shape`` (0 on broadcast axes)."""
    in_shape = [1] * (len(out_shape) - len(in_shape)) + [int(d) for d in in_shape]
    st = strides_of(in_shape)
    return [0 if d == 1 and o != 1 else s for d, o, s in zip(in_shape, out_shape, st)]


def _i(v: int) -> Const:
    return Const(int(v), INDEX)


def _flat(kf: KernelForm, name: str, v: Value, role: str = "in") -> Buffer:
    """``v``'s buffer, flat, as the unsigned integers of its element size."""
    return kf.buffer(name, BITS[v.type.dtype.itemsize], (v.type.numel,), role, value=v)


def _bits(value, dt: DType) -> Const:
    """A value of type ``dt`` as the constant of its bits."""
    a = np.asarray(value).astype(dt.np).reshape(())
    b = BITS[dt.itemsize]
    return Const(int(a.view(b.np)), b)


def _lin(off: int, strides: Sequence[int], idx: Sequence[Expr]) -> Expr:
    """``off + sum(i * s)`` as an index expression (zero terms left out)."""
    e = None
    for i, s in zip(idx, strides):
        if s == 0 or (isinstance(i, Const) and i.value == 0):
            continue
        t = i if s == 1 else op("mul", i, _i(s))
        e = t if e is None else op("add", e, t)
    if e is None:
        return _i(off)
    return e if off == 0 else op("add", e, _i(off))


@dataclass
class _Side:
    """One side of a copy: a flat buffer, the element offset of the first point and a stride per axis."""

    buf: Buffer
    off: int
    strides: list[int]

    def index(self, idx: Sequence[Expr]) -> tuple[Expr]:
        return (_lin(self.off, self.strides, idx),)

    def at(self, idx: Sequence[Expr]) -> Expr:
        return self.buf[self.index(idx)]


def _divisor(d: int, need: int, most: int) -> int:
    """The smallest divisor of ``d`` from ``need`` to ``most``; else the largest below ``need``."""
    small = [f for f in range(1, math.isqrt(d) + 1) if d % f == 0]
    best = 1
    for f in sorted(set(small + [d // f for f in small])):
        if f > most:
            break
        if f >= need:
            return f
        best = f
    return best


def _grain(bytes_per_iteration: int) -> int:
    return -(-PAR_BYTES // max(bytes_per_iteration, 1))


def _unravel(kf: KernelForm, q: Expr, dims: Sequence[int]) -> list[Expr]:
    """The indices (outermost first) of the row-major flat index ``q`` over ``dims`` (0 on axes of 1)."""
    live = [a for a, d in enumerate(dims) if d != 1]
    out: list[Expr] = [_i(0)] * len(dims)
    for n, a in enumerate(live):
        inner = math.prod(dims[b] for b in live[n + 1:])
        e = q if inner == 1 else op("div", q, _i(inner))
        if n > 0:
            e = op("rem", e, _i(dims[a]))
        out[a] = e if e is q else kf.let(e, name="u")
    return out


@contextmanager
def _loops(kf: KernelForm, dims: Sequence[int], k: int, grain: int, vector: bool = True):
    """Loops over ``dims``, yielding their indices: the first ``k`` axes one parallel loop over their
    flattened index, the others serial, the last a vector loop (with ``vector``, when not in the
    parallel loop)."""
    with ExitStack() as stack:
        idx: list[Expr] = []
        if k and math.prod(dims[:k]) > 1:
            q = stack.enter_context(kf.loop(math.prod(dims[:k]), "parallel", grain=grain, name="q"))
            idx += _unravel(kf, q, dims[:k])
        else:
            idx += [_i(0)] * k
        for a in range(k, len(dims)):
            kind = "vector" if vector and a == len(dims) - 1 else "serial"
            idx.append(stack.enter_context(kf.loop(dims[a], kind)))
        yield idx


def _plan(shape: list[int], sides: list[list[int]], size: int) -> tuple[list[int], list[list[int]], int]:
    """Where a copy over ``shape`` (merged, non-empty) goes parallel: (shape, strides of each side, k),
    the first k axes forming the parallel loop: at least the first axis (but not the last), more
    until an iteration moves at most ``PIECE_BYTES``; the last axis is cut at a divisor of its
    length (runs of ``MIN_RUN_BYTES`` at least) where the others are too few."""
    rank = len(shape)
    need = -(-math.prod(shape) * size // PIECE_BYTES)
    k, acc = 0, 1
    while k < rank - 1 and (k == 0 or acc < need):
        acc *= shape[k]
        k += 1
    if acc < need:
        d = shape[-1]
        f = _divisor(d, -(-need // acc), max(1, d * size // MIN_RUN_BYTES))
        if f > 1:
            shape = shape[:-1] + [f, d // f]
            sides = [st[:-1] + [st[-1] * (d // f), st[-1]] for st in sides]
            k = rank
    return shape, sides, k


# ---------------------------------------------------------------------------------------------
# Strided copies
# ---------------------------------------------------------------------------------------------

def copy(kf: KernelForm, shape: Sequence[int], dst: _Side, src: _Side | Expr, size: int) -> None:
    """``dst = src`` over the strided view ``shape``; ``src`` a side or a value (a fill)."""
    if any(int(d) == 0 for d in shape):
        return
    reads = isinstance(src, _Side)
    shp, st = merge_dims(shape, [dst.strides] + ([src.strides] if reads else []))
    dst = _Side(dst.buf, dst.off, st[0])
    if reads:
        src = _Side(src.buf, src.off, st[1])
    if not shp:
        kf.store(dst.buf, dst.index([]), src.at([]) if reads else src)
        return
    if reads and dst.strides[-1] == 1 and src.strides[-1] not in (0, 1):
        j = _tile_axis(shp, dst.strides, src.strides)
        if j is not None:
            _transpose_tiled(kf, shp, dst, src, j, size)
            return
    shp, st, k = _plan(shp, st, size)
    dst = _Side(dst.buf, dst.off, st[0])
    if reads:
        src = _Side(src.buf, src.off, st[1])
        kf.note("contiguous runs" if dst.strides[-1] == 1 and src.strides[-1] == 1 else "strided copy")
    with _loops(kf, shp, k, _grain(math.prod(shp[k:]) * size)) as idx:
        kf.store(dst.buf, dst.index(idx), src.at(idx) if reads else src)


def _tile_axis(shp, ds, ss) -> int | None:
    """An axis (not the last) read contiguously from the source while the destination's last axis
    strides through it: the pair to tile."""
    for j in range(len(shp) - 1):
        if ss[j] == 1 and ds[j] != 1 and shp[j] >= 4 and shp[-1] >= 4:
            return j
    return None


def _transpose_tiled(kf: KernelForm, shp: list[int], dst: _Side, src: _Side, j: int, size: int) -> None:
    """Tiles of (axis j, last axis) (see the module docstring)."""
    t = 32 // size if size <= 2 else 64 // size
    R, C = shp[j], shp[-1]
    tr, tc = min(t, R), min(t, C)
    nrb, ncb = -(-R // tr), -(-C // tc)
    other = [a for a in range(len(shp) - 1) if a != j]
    odims = [shp[a] for a in other]
    need = -(-math.prod(shp) * size // PIECE_BYTES)
    lead = math.prod(odims) * nrb
    groups = 1
    if lead < need:  # few rows: column tiles in groups (the shifted last tile with its neighbour)
        groups = _divisor(ncb, -(-need // lead), ncb if C % tc == 0 else ncb // 2)
    per = ncb // groups
    pdims = odims + [nrb, groups]
    # the inner loop: along the source's contiguous axis (wide elements: contiguous loads, the
    # stores strided), or along the destination's (1 and 2 bytes: gathers, contiguous stores)
    inner_src = size >= 4
    kf.note(f"transpose by {tr}x{tc} tiles, the inner loop along the {'source' if inner_src else 'result'}")
    with _loops(kf, pdims, len(pdims), _grain(per * tr * tc * size)) as u, kf.loop(per, name="cb") as cbl:
        rb, g = u[-2], u[-1]
        cb = cbl if groups == 1 else op("add", op("mul", g, _i(per)), cbl)
        cs = op("mul", cb, _i(tc))
        cs = kf.let(cs if C % tc == 0 else op("min", cs, _i(C - tc)), name="cs")

        def point(rr: Expr, c: Expr) -> None:
            r = op("add", op("mul", rb, _i(tr)), rr)
            idx: list[Expr] = [_i(0)] * len(shp)
            for a, i in zip(other, u):
                idx[a] = i
            idx[j] = r if R % tr == 0 else op("min", r, _i(R - 1))
            idx[-1] = op("add", cs, c)
            kf.store(dst.buf, dst.index(idx), src.at(idx))

        if inner_src:
            with kf.loop(tc, name="c") as c, kf.loop(tr, "vector", name="r") as rr:
                point(rr, c)
        else:
            with kf.loop(tr, name="r") as rr, kf.loop(tc, "vector", name="c") as c:
                point(rr, c)


def _pieces(kf: KernelForm, outer: int, whole: Buffer, total: int, pieces: list[tuple[Buffer, int, int]],
            size: int, into_whole: bool) -> None:
    """Concat (``into_whole``: every piece's rows to ``whole[o, off:off + n]``, ``whole`` seen as
    [outer, total]) or Split (the other way): one parallel loop over the outer index and a cut of
    the runs common to all pieces, a vector loop per piece inside."""
    pieces = [p for p in pieces if p[2] > 0]
    if not pieces or outer == 0:
        return
    need = -(-outer * total * size // PIECE_BYTES)
    cut = 1
    if outer < need:
        g = math.gcd(*(n for _, _, n in pieces))
        cut = _divisor(g, -(-need // outer), max(1, min(n for _, _, n in pieces) * size // MIN_RUN_BYTES))
    kf.note(f"{len(pieces)} runs per outer index" + (f", each cut in {cut}" if cut > 1 else ""))
    with _loops(kf, [outer, cut], 2, _grain(total // cut * size), vector=False) as (o, c):
        for buf, off, n in pieces:
            m = n // cut
            with kf.loop(m, "vector") as e:
                pos = [o, c, e]
                w = _Side(whole, off, [total, m, 1])
                p = _Side(buf, 0, [n, m, 1])
                if into_whole:
                    kf.store(whole, w.index(pos), p.at(pos))
                else:
                    kf.store(buf, p.index(pos), w.at(pos))


# ---------------------------------------------------------------------------------------------
# Lowerings
# ---------------------------------------------------------------------------------------------

class _Copy(FormLowering):
    """Base: a single node whose inputs/outputs are static tensors of the types the form stores; the
    data input and the outputs share one element type."""

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        return static_reason([n.inputs[0]] + list(n.outputs)) or self.check_node(n) or self.form_reason(group)

    def check_node(self, n) -> str | None:
        return None


class Concat(_Copy):
    ops = (tn.Concat,)

    def check(self, group):
        return static_reason(list(group.node.inputs) + list(group.node.outputs)) or self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        y = n.outputs[0]
        ysh = shape_of(y)
        a = n.op.axis % len(ysh)
        outer, inner = math.prod(ysh[:a]), math.prod(ysh[a + 1:])
        kf = KernelForm(name)
        yb = _flat(kf, "y", y, "out")
        pieces, off = [], 0
        for i, x in enumerate(n.inputs):
            run = int(x.shape[a]) * inner
            if run:
                pieces.append((_flat(kf, f"x{i}", x), off, run))
            off += run
        _pieces(kf, outer, yb, off, pieces, y.type.dtype.itemsize, into_whole=True)
        return kf.finish()


class Split(_Copy):
    ops = (tn.Split,)

    def check_node(self, n):
        if len(n.inputs) > 1 and n.inputs[1] is not None and const_ints(n.inputs[1]) is None:
            return "split sizes must be constants"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x = n.inputs[0]
        xsh = shape_of(x)
        a = n.op.axis % len(xsh)
        outer, inner = math.prod(xsh[:a]), math.prod(xsh[a + 1:])
        kf = KernelForm(name)
        xb = _flat(kf, "x", x)
        pieces, off = [], 0
        for i, y in enumerate(n.outputs):
            run = int(y.shape[a]) * inner
            if run and any(y is o for o in group.outputs):
                pieces.append((_flat(kf, f"y{i}", y, "out"), off, run))
            off += run
        _pieces(kf, outer, xb, off, pieces, x.type.dtype.itemsize, into_whole=False)
        return kf.finish()


class Slice(_Copy):
    ops = (tn.Slice,)

    def check_node(self, n):
        for what, v in zip(("starts", "ends", "axes", "steps"), n.inputs[1:]):
            if v is not None and const_ints(v) is None:
                return f"Slice {what} must be constants"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        args = [const_ints(v) for v in (list(n.inputs[1:]) + [None] * 4)[:4]]
        xsh = shape_of(x)
        xs = strides_of(xsh)
        src_st, off = list(xs), 0
        for a, s, e, st in n.op._plan(len(xsh), *args):
            s, _, _ = tn._slice_range(xsh[a], s, e, st)
            off += s * xs[a]
            src_st[a] = xs[a] * st
        ysh = shape_of(y)
        kf = KernelForm(name)
        yb, xb = _flat(kf, "y", y, "out"), _flat(kf, "x", x)
        copy(kf, ysh, _Side(yb, 0, strides_of(ysh)), _Side(xb, off, src_st), x.type.dtype.itemsize)
        return kf.finish()


class Transpose(_Copy):
    ops = (sh.Transpose,)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        perm = n.op._perm(x.type.rank)
        xs = strides_of(shape_of(x))
        ysh = shape_of(y)
        kf = KernelForm(name)
        yb, xb = _flat(kf, "y", y, "out"), _flat(kf, "x", x)
        copy(kf, ysh, _Side(yb, 0, strides_of(ysh)), _Side(xb, 0, [xs[p] for p in perm]), x.type.dtype.itemsize)
        return kf.finish()


class Expand(_Copy):
    ops = (tn.Expand,)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        ysh = shape_of(y)
        kf = KernelForm(name)
        yb, xb = _flat(kf, "y", y, "out"), _flat(kf, "x", x)
        copy(kf, ysh, _Side(yb, 0, strides_of(ysh)), _Side(xb, 0, broadcast_strides(shape_of(x), ysh)),
             x.type.dtype.itemsize)
        return kf.finish()


class Tile(_Copy):
    ops = (tn.Tile,)

    def check_node(self, n):
        if const_ints(n.inputs[1]) is None:
            return "Tile repeats must be constants"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        xsh, ysh = shape_of(x), shape_of(y)
        reps = const_ints(n.inputs[1])
        xs, ys = strides_of(xsh), strides_of(ysh)
        shape, ds, ss = [], [], []
        for d, r, xst, yst in zip(xsh, reps, xs, ys):
            shape += [r, d]
            ds += [d * yst, yst]
            ss += [0, xst]
        kf = KernelForm(name)
        yb, xb = _flat(kf, "y", y, "out"), _flat(kf, "x", x)
        copy(kf, shape, _Side(yb, 0, ds), _Side(xb, 0, ss), x.type.dtype.itemsize)
        return kf.finish()


class ConstantOfShape(FormLowering):
    ops = (tn.ConstantOfShape,)

    def check(self, group):
        return static_reason(list(group.node.outputs)) or self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        y = n.outputs[0]
        dt = y.type.dtype
        kf = KernelForm(name)
        yb = _flat(kf, "y", y, "out")
        copy(kf, [y.type.numel], _Side(yb, 0, [1]), _bits(n.op.fill, dt), dt.itemsize)
        return kf.finish()


@dataclass
class _PadAxis:
    """One axis of a Pad (neighbouring unpadded axes merged): output and input lengths, pads."""

    out: int
    inp: int
    lo: int = 0
    hi: int = 0

    @property
    def plain(self) -> bool:
        return self.lo == 0 and self.hi == 0


def _pad_axes(xsh: Sequence[int], widths) -> list[_PadAxis]:
    axes: list[_PadAxis] = []
    for d, (lo, hi) in zip(xsh, widths):
        ax = _PadAxis(d + lo + hi, d, lo, hi)
        if ax.plain and axes and axes[-1].plain:
            axes[-1] = _PadAxis(axes[-1].out * d, axes[-1].inp * d)
        else:
            axes.append(ax)
    return axes


def _reflected(kf: KernelForm, mode: str, q: Expr, n: int, before: int) -> Expr:
    """The index in [0, n) that position ``q`` (from ``-before``) of an axis of ``n`` reads when
    padded by ``mode`` (edge, wrap or reflect; as ``tensor._pad_index``)."""
    if mode == "edge":
        return op("min", op("max", q, _i(0)), _i(n - 1))
    if mode == "reflect" and n == 1:
        return _i(0)
    period = n if mode == "wrap" else 2 * (n - 1)
    shift = -(-before // period) * period  # makes q non-negative: a remainder is a modulo
    m = op("rem", q if shift == 0 else op("add", q, _i(shift)), _i(period))
    if mode == "wrap":
        return m
    m = kf.let(m, name="m")
    r = select(op("ge", m, _i(n)), op("sub", _i(period), m), m)
    return op("min", op("max", r, _i(0)), _i(n - 1))  # (a no-op: for the verifier's bounds)


class Pad(_Copy):
    ops = (tn.Pad,)

    def check_node(self, n):
        x, pads, value, axes = (list(n.inputs) + [None] * 3)[:4]
        if const_ints(pads) is None:
            return "Pad pads must be constants"
        if axes is not None and const_ints(axes) is None:
            return "Pad axes must be constants"
        if value is not None:
            why = static_reason([value])
            if why:
                return why
        if n.op.mode not in ("constant", "reflect", "edge", "wrap"):
            return f"Pad mode {n.op.mode!r} is not supported natively"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, pads, value, axes = (list(n.inputs) + [None] * 3)[:4]
        y = n.outputs[0]
        dt, mode = x.type.dtype, n.op.mode
        size = dt.itemsize
        xsh = shape_of(x)
        widths = n.op._widths(len(xsh), const_ints(pads), const_ints(axes))
        kf = KernelForm(name)
        yb, xb = _flat(kf, "y", y, "out"), _flat(kf, "x", x)
        fill: Expr | None = None
        if mode == "constant":
            cv = const_array(value)
            if value is None or cv is not None:
                fill = _bits(0 if value is None else cv.reshape(-1)[0], dt)
            else:  # read at run time (inside the loops: a parallel task sees nothing bound outside it)
                fill = _flat(kf, "value", value)[_i(0)]
            if x.type.numel == 0:
                copy(kf, [y.type.numel], _Side(yb, 0, [1]), fill, size)
                return kf.finish()
        pax = _pad_axes(xsh, widths)
        p = max((a for a, ax in enumerate(pax) if not ax.plain), default=None)
        if p is None:  # nothing padded or cropped
            copy(kf, [x.type.numel], _Side(yb, 0, [1]), _Side(xb, 0, [1]), size)
            return kf.finish()
        block = pax[p + 1].inp if p + 1 < len(pax) else 1  # the unpadded axes after the last padded one
        ys, xs = strides_of([ax.out for ax in pax]), strides_of([ax.inp for ax in pax])
        outer = pax[:p]
        dims = [ax.out for ax in outer]
        k, acc = 0, 1
        need = -(-y.type.numel * size // PIECE_BYTES)
        while k < len(dims) and (k == 0 or acc < need):
            acc *= dims[k]
            k += 1
        kf.note(f"Pad ({mode}): rows of {pax[p].out} x {block}")
        row = pax[p]
        with _loops(kf, dims, k, _grain(math.prod(dims[k:]) * row.out * block * size), vector=False) as idx:
            inside: Expr | None = None
            src: list[Expr] = []
            for ax, i in zip(outer, idx):
                if ax.plain:
                    src.append(i)
                elif mode == "constant":
                    s = op("sub", i, _i(ax.lo)) if ax.lo else i
                    ok = op("and", op("ge", s, _i(0)), op("lt", s, _i(ax.inp)))
                    inside = ok if inside is None else op("and", inside, ok)
                    src.append(kf.let(op("min", op("max", s, _i(0)), _i(ax.inp - 1)), name="s"))
                else:
                    c0, lo = max(-ax.lo, 0), max(ax.lo, 0)
                    kept = ax.inp + min(ax.lo, 0) + min(ax.hi, 0)
                    s = _reflected(kf, mode, op("sub", i, _i(lo)) if lo else i, kept, lo)
                    src.append(kf.let(op("add", s, _i(c0)) if c0 else s, name="s"))
            if inside is not None:
                inside = kf.let(inside, name="inside")
            ybase, xbase = list(idx), src

            def run(length: int, at: int, value):
                """y[row start + at + e] = value(e) for e in [0, length)."""
                if length > 0:
                    with kf.loop(length, "vector") as e:
                        kf.store(yb, (_lin(at, ys[:p] + [1], ybase + [e]),), value(e))

            def source(start: int):
                return lambda e: xb[(_lin(start, xs[:p] + [1], xbase + [e]),)]

            if mode == "constant":
                left = min(max(row.lo, 0), row.out)
                mid = max(0, min(row.out, row.lo + row.inp) - max(row.lo, 0))
                start = max(row.lo, 0) - row.lo
                read = source(start * block)
                run(left * block, 0, lambda e: fill)
                run(mid * block, left * block, read if inside is None else lambda e: select(inside, read(e), fill))
                run((row.out - left - mid) * block, (left + mid) * block, lambda e: fill)
            else:
                c0, lo, hi = max(-row.lo, 0), max(row.lo, 0), max(row.hi, 0)
                kept = row.inp + min(row.lo, 0) + min(row.hi, 0)

                def padded(count: int, first: int):
                    """``count`` output positions from ``first`` (relative to the kept data) by the mode."""
                    if count <= 0:
                        return
                    with kf.loop(count, "vector" if block == 1 else "serial") as t:
                        q = op("add", t, _i(first)) if first else t
                        s = _reflected(kf, mode, q, kept, lo)
                        s = kf.let(op("add", s, _i(c0)) if c0 else s, name="s")
                        at = (first + lo) * block
                        if block == 1:
                            kf.store(yb, (_lin(at, ys[:p] + [1], ybase + [t]),),
                                     xb[(_lin(0, xs[:p] + [1], xbase + [s]),)])
                        else:
                            with kf.loop(block, "vector") as e:
                                kf.store(yb, (_lin(at, ys[:p] + [block, 1], ybase + [t, e]),),
                                         xb[(_lin(0, xs[:p] + [block, 1], xbase + [s, e]),)])

                padded(lo, -lo)
                run(kept * block, lo * block, source(c0 * block))
                padded(hi, kept)
        return kf.finish()


class Gather(_Copy):
    """Gather: one run of the axes after ``axis`` per (outer, index) pair. Constant indices are
    checked when compiling; run-time ones per read: an index out of range is reported (``fail_if``:
    the run raises an error naming the node and the index, as the interpreter and ONNX Runtime do),
    never read, and its run is zeros."""

    ops = (ix.Gather,)

    def check_node(self, n):
        data, idx = n.inputs
        why = static_reason([idx])
        if why:
            return why
        d = int(data.shape[n.op.axis % data.type.rank])
        c = const_array(idx)
        if c is not None:
            if c.size and (c.min() < -d or c.max() >= d):
                return "a constant index is out of range"
        elif d == 0:
            return "the axis is empty: every index is out of range"
        return None

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        data, idx = n.inputs
        y = n.outputs[0]
        dt = data.type.dtype
        size = dt.itemsize
        dsh = shape_of(data)
        a = n.op.axis % len(dsh)
        outer, dim, inner = math.prod(dsh[:a]), dsh[a], math.prod(dsh[a + 1:])
        m = idx.type.numel
        kf = KernelForm(name)
        yb, db = _flat(kf, "y", y, "out"), _flat(kf, "data", data)
        c = const_array(idx)
        if c is not None and m:
            norm = c.astype(np.int64).reshape(-1)
            norm = np.where(norm < 0, norm + dim, norm)
            if m == 1 or np.all(np.diff(norm) == 1):  # one slice: a strided copy
                kf.note("constant indices: one slice")
                copy(kf, [outer, m * inner], _Side(yb, 0, [m * inner, 1]),
                     _Side(db, int(norm[0]) * inner, [dim * inner, 1]), size)
                return kf.finish()
        if y.type.numel == 0:
            return kf.finish()
        ib = kf.buffer("indices", idx.type.dtype, (m,), value=idx)
        kf.note(f"Gather of {m} runs of {inner} per outer index" + (", each index checked" if c is None else ""))
        with kf.loop(outer * m, "parallel", grain=_grain(inner * size + 8), name="q") as q:
            o, j = _unravel(kf, q, [outer, m])
            raw = kf.let(ib[j] if ib.dtype is INDEX else cast(ib[j], INDEX), name="raw")
            ok = None
            if c is None:
                row = kf.let(checked_index(kf, raw, dim), name="row")
                ok = kf.let(op("and", op("ge", raw, _i(-dim)), op("lt", raw, _i(dim))), name="ok")
            else:  # checked when compiling
                neg = cast(op("lt", raw, _i(0)), INDEX)
                row = kf.let(op("min", op("max", op("add", raw, op("mul", neg, _i(dim))), _i(0)), _i(dim - 1)),
                             name="row")

            def body(e: Expr) -> None:
                v = db[(_lin(0, [dim * inner, inner, 1], [o, row, e]),)]
                kf.store(yb, (_lin(0, [inner, 1], [q, e]),), v if ok is None else select(ok, v, Const(0, db.dtype)))

            if inner == 1:
                body(_i(0))
            else:
                with kf.loop(inner, "vector") as e:
                    body(e)
        return kf.finish()


class BitCast(_Copy):
    """Each element's bits as type ``to`` of their width: a flat copy of the unsigned integers of that
    size (4- and 2-bit types: their byte); to bool, a byte that is not 0 is true (as the reference)."""

    ops = (qt.BitCast,)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        kf = KernelForm(name)
        xb, size = _flat(kf, "x", x), x.type.dtype.itemsize
        if y.type.dtype is DType.bool:
            yb = kf.buffer("y", DType.bool, (y.type.numel,), "out", value=y)
            if y.type.numel:
                with kf.loop(y.type.numel, "vector") as i:
                    kf.store(yb, (i,), op("ne", xb[i], Const(0, xb.dtype)))
        else:
            copy(kf, [y.type.numel], _Side(_flat(kf, "y", y, "out"), 0, [1]), _Side(xb, 0, [1]), size)
        return kf.finish()


LOWERINGS = (Concat(), Split(), Slice(), Transpose(), Expand(), Tile(), ConstantOfShape(), Pad(), Gather(), BitCast())

__all__ = ["LOWERINGS", "BitCast", "Concat", "ConstantOfShape", "Expand", "Gather", "Pad", "Slice", "Split", "Tile",
           "Transpose", "broadcast_strides", "const_array", "const_ints", "copy", "merge_dims", "shape_of",
           "static_reason"]
