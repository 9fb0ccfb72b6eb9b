"""Data movement for any element type of ``LLVM_TYPES``: Concat, Split, Slice, Transpose, Expand,
Tile, Pad, Gather and ConstantOfShape as strided copies (merged dimensions, innermost runs copied
with ``llvm.memcpy`` where both sides are contiguous, Transpose tiled).

Every copy is described as a **strided view**: a shape plus, per side, an element offset and one
element stride per axis (0 where a side broadcasts, negative for reversed slices). Adjacent axes
that stay adjacent on every side are merged and axes of length 1 dropped before the loops are
emitted, so e.g. a Concat on axis 1 copies one contiguous run per outer index.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from llvmlite import ir

from ...ir.graph import Value
from ...ir.ops import indexing as ix
from ...ir.ops import shape as sh
from ...ir.ops import tensor as tn
from ..llvm.elementwise import _For
from .base import (I1, I8, I64, LLVM_TYPES, PTR, VOID, KernelBuilder, KernelGroup, Lowering, c64, dtype_reason,
                   strides_of)

ALL_TYPES = tuple(LLVM_TYPES)


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


def _add(b: ir.IRBuilder, base, delta):
    if isinstance(base, int) and isinstance(delta, int):
        return base + delta
    if isinstance(delta, int):
        return base if delta == 0 else b.add(base, c64(delta))
    if isinstance(base, int):
        return delta if base == 0 else b.add(delta, c64(base))
    return b.add(base, delta)


def _mul(b: ir.IRBuilder, i: ir.Value, s: int):
    if s == 0:
        return 0
    return i if s == 1 else b.mul(i, c64(s))


def _val(x):
    return c64(x) if isinstance(x, int) else x


def memcpy(k: KernelBuilder, dst: ir.Value, src: ir.Value, nbytes) -> None:
    fn = _intrinsic(k, "llvm.memcpy.p0.p0.i64", [PTR, PTR, I64, I1])
    k.b.call(fn, [dst, src, _val(nbytes), ir.Constant(I1, 0)])


def memset(k: KernelBuilder, dst: ir.Value, byte: int, nbytes) -> None:
    fn = _intrinsic(k, "llvm.memset.p0.i64", [PTR, I8, I64, I1])
    k.b.call(fn, [dst, ir.Constant(I8, byte & 0xFF), _val(nbytes), ir.Constant(I1, 0)])


def _intrinsic(k: KernelBuilder, name: str, args) -> ir.Function:
    if name in k.module.globals:
        return k.module.globals[name]
    return ir.Function(k.module, ir.FunctionType(VOID, args), name)


def nest(k: KernelBuilder, shape: Sequence[int], strides: Sequence[Sequence[int]], bases: Sequence,
         body: Callable[[list], None], depth: int | None = None) -> None:
    """Loops over ``shape[:depth]`` (all axes by default), calling ``body(offsets)`` with each side's
    element offset (an int or an i64 value) = base + sum(i * stride)."""
    depth = len(shape) if depth is None else depth

    def rec(level: int, offs: list) -> None:
        if level == depth:
            body(offs)
            return
        with k.loop(int(shape[level]), name=f"d{level}") as i:
            rec(level + 1, [_add(k.b, o, _mul(k.b, i, int(s[level]))) for o, s in zip(offs, strides)])

    rec(0, list(bases))


# ---------------------------------------------------------------------------------------------
# Strided copies
# ---------------------------------------------------------------------------------------------

#: bytes of data a parallel task moves at least (a thread hand-off costs some 10-50 us); copies of
#: less than twice this run on the calling thread
PAR_BYTES = 1 << 18
#: elements of a piece of a long run (runs are cut so that a big copy of few runs still splits)
PIECE_BYTES = 1 << 16


def _p(k: KernelBuilder, v):
    """The buffer of a graph value (asked for where the code runs: inside a parallel task too), or
    ``v`` itself when it already is a pointer."""
    return k.ptr(v) if isinstance(v, Value) else v


def unflatten(b: ir.IRBuilder, flat: ir.Value, dims: Sequence[int]) -> list:
    """The indices (outermost first) of the row-major flat index ``flat`` over ``dims``."""
    idx = []
    for j, d in enumerate(reversed(list(dims))):
        if j == len(dims) - 1:
            idx.append(flat)
        else:
            idx.append(b.urem(flat, c64(d)))
            flat = b.udiv(flat, c64(d))
    return list(reversed(idx))


def split_runs(k: KernelBuilder, shp: Sequence[int], strides: Sequence[Sequence[int]], bases: Sequence,
               bytes_per_elem: int, body: Callable[[list, object], None], split: bool = True) -> None:
    """``body(offsets, n)`` for every run of the last axis of the nest ``shp`` (offsets: each side's
    element offset of the run's first element; n: its length, an int or an i64 value). When the nest
    moves at least 2 * ``PAR_BYTES``, runs are cut into pieces (of about ``PIECE_BYTES``) and the
    pieces split among the kernel's threads; ``body`` must then take its pointers inside (``_p``)."""
    shp = [int(d) for d in shp]
    run, outer = shp[-1], int(np.prod(shp[:-1], dtype=np.int64))
    if not split or outer * run * bytes_per_elem < 2 * PAR_BYTES:
        nest(k, shp, strides, bases, lambda offs: body(offs, run), depth=len(shp) - 1)
        return
    piece = min(run, max(1, PIECE_BYTES // max(bytes_per_elem, 1)))
    nch = -(-run // piece)
    per = max(1, -(-PAR_BYTES // (piece * bytes_per_elem)))
    with k.parallel_for(outer * nch, per) as (lo, hi):
        b = k.b
        with k.loop(b.sub(hi, lo), "item") as t:
            item = b.add(lo, t)
            o, c = (item, None) if nch == 1 else (b.udiv(item, c64(nch)), b.urem(item, c64(nch)))
            idx = unflatten(b, o, shp[:-1]) if shp[:-1] else []
            offs = list(bases)
            for i, d in zip(idx, range(len(shp) - 1)):
                offs = [_add(b, off, _mul(b, i, int(st[d]))) for off, st in zip(offs, strides)]
            n = run
            if c is not None:
                start = b.mul(c, c64(piece))
                offs = [_add(b, off, _mul(b, start, int(st[-1]))) for off, st in zip(offs, strides)]
                n = b.select(b.icmp_signed("<", c64(run - piece), start), b.sub(c64(run), start), c64(piece))
            body(offs, n)


# ---------------------------------------------------------------------------------------------
# Strided copies
# ---------------------------------------------------------------------------------------------

def copy(k: KernelBuilder, ety: ir.Type, size: int, shape: Sequence[int], dst, dst_strides,
         dst_off, src, src_strides, src_off, split: bool = True) -> None:
    """dst[dst_off + sum(i*dst_strides)] = src[src_off + sum(i*src_strides)] over ``shape``; dst and
    src are graph values (or pointers, with ``split=False``). Big copies are split among the threads."""
    if any(int(d) == 0 for d in shape):
        return
    shp, (ds, ss) = merge_dims(shape, [dst_strides, src_strides])
    if not shp:
        k.store(k.load(_p(k, src), _val(src_off), ety), _p(k, dst), _val(dst_off))
        return
    if ds[-1] == 1 and ss[-1] == 1:  # contiguous runs
        def body(offs, n):
            memcpy(k, k.at(_p(k, dst), _val(offs[0]), ety), k.at(_p(k, src), _val(offs[1]), ety),
                   n * size if isinstance(n, int) else k.b.mul(n, c64(size)))

        split_runs(k, shp, [ds, ss], [dst_off, src_off], size, body, split)
        return
    if ds[-1] == 1 and ss[-1] != 0:
        j = _tile_axis(shp, ds, ss)
        if j is not None:
            _transpose_tiled(k, ety, size, shp, ds, ss, dst, dst_off, src, src_off, j, split)
            return

    def body(offs, n):
        d, s_ = _p(k, dst), _p(k, src)
        with k.loop(n, name="e") as i:
            k.store(k.load(s_, _val(_add(k.b, offs[1], _mul(k.b, i, ss[-1]))), ety), d,
                    _val(_add(k.b, offs[0], _mul(k.b, i, ds[-1]))))

    split_runs(k, shp, [ds, ss], [dst_off, src_off], 2 * size, body, split)


def _tile_axis(shp, ds, ss) -> int | None:
    """An axis (not the last) read contiguously from the source while the destination's last axis
    strides through it: the pair to tile."""
    for j in range(len(shp) - 1):
        if ss[j] == 1 and ds[j] != 1 and shp[j] >= 4 and shp[-1] >= 4:
            return j
    return None


def _transpose_tiled(k, ety, size, shp, ds, ss, dst, dst_off, src, src_off, j, split=True) -> None:
    """Loops over the other axes outside, then T x T tiles of (axis j, last axis): reads of a tile
    touch T source lines, writes T destination lines, both stay in L1. Big transposes split the
    (other axes, tile row, tile column) triples among the threads."""
    t = max(8, 64 // size)
    outer = [a for a in range(len(shp) - 1) if a != j]
    R, C = shp[j], shp[-1]

    def tile(d0, s0, rb, cb):
        b = k.b
        dp, sp = _p(k, dst), _p(k, src)
        rn = k.f.min(c64(t), b.sub(c64(R), rb))
        cn = k.f.min(c64(t), b.sub(c64(C), cb))
        with _For(b, rn, "r", loop_md(k, ("llvm.loop.unroll.disable",))) as r:
            rr = b.add(rb, r)
            drow = _add(b, d0, b.mul(rr, c64(ds[j])))
            srow = _add(b, s0, b.mul(rr, c64(ss[j])))
            with _For(b, cn, "c", loop_md(k, ("llvm.loop.vectorize.enable", False))) as c:
                cc = b.add(cb, c)
                v = k.load(sp, b.add(_val(srow), b.mul(cc, c64(ss[-1]))), ety)
                k.store(v, dp, b.add(_val(drow), cc))

    odims = [shp[a] for a in outer]
    nrb, ncb = -(-R // t), -(-C // t)
    total = int(np.prod(shp, dtype=np.int64))
    if split and total * size >= 2 * PAR_BYTES:
        per = max(1, -(-PAR_BYTES // (t * t * size)))
        with k.parallel_for(int(np.prod(odims, dtype=np.int64)) * nrb * ncb, per) as (lo, hi):
            b = k.b
            with k.loop(b.sub(hi, lo), "tile") as q:
                idx = unflatten(b, b.add(lo, q), odims + [nrb, ncb])
                d0, s0 = dst_off, src_off
                for i, a in zip(idx, outer):
                    d0, s0 = _add(b, d0, _mul(b, i, ds[a])), _add(b, s0, _mul(b, i, ss[a]))
                tile(d0, s0, b.mul(idx[-2], c64(t)), b.mul(idx[-1], c64(t)))
        return

    def tiles(offs):
        d0, s0 = offs
        f = k.f
        with f.loop(0, c64(R), t, name="rb") as rb:
            with f.loop(0, c64(C), t, name="cb") as cb:
                tile(d0, s0, rb, cb)

    nest(k, odims, [[ds[a] for a in outer], [ss[a] for a in outer]], [dst_off, src_off], tiles)


def loop_md(k: KernelBuilder, *options: tuple) -> ir.MDValue:
    """A loop ID with the given options, e.g. ``("llvm.loop.unroll.disable",)`` or
    ``("llvm.loop.vectorize.enable", False)``."""
    ops = []
    for opt in options:
        args = [ir.MetaDataString(k.module, opt[0])]
        for a in opt[1:]:
            args.append(ir.Constant(I1, int(a)) if isinstance(a, bool) else ir.Constant(ir.IntType(32), a))
        ops.append(k.module.add_metadata(args))
    loop_id = ir.values.MDValue(k.module, [], name=str(len(k.module.metadata)))
    loop_id.operands = (loop_id, *ops)
    return loop_id


def fill(k: KernelBuilder, ety: ir.Type, dst, n: int, value: ir.Value | np.ndarray) -> None:
    """dst[0:n] = value (a NumPy scalar of the element type, or a loaded value); dst a graph value
    (or a pointer). A big fill with a constant whose bytes are all alike is split among the threads."""
    if n <= 0:
        return
    if isinstance(value, np.ndarray | np.generic):
        raw = np.asarray(value).reshape(()).tobytes()
        if len(set(raw)) == 1:
            size = len(raw)
            split_runs(k, [n], [[1]], [0], size,
                       lambda offs, m: memset(k, k.at(_p(k, dst), _val(offs[0]), ety), raw[0],
                                              m * size if isinstance(m, int) else k.b.mul(m, c64(size))),
                       split=isinstance(dst, Value))
            return
        value = llvm_const(ety, value)
    ptr = _p(k, dst)
    with k.loop(n, name="fill") as i:
        k.store(value, ptr, i)


def llvm_const(ety: ir.Type, value) -> ir.Constant:
    a = np.asarray(value).reshape(())
    if isinstance(ety, ir.IntType):
        return ir.Constant(ety, int(a.astype(np.int64)) if a.dtype.kind != "b" else int(bool(a)))
    return ir.Constant(ety, float(a))


# ---------------------------------------------------------------------------------------------
# Lowerings
# ---------------------------------------------------------------------------------------------

class _Copy(Lowering):
    """Base: a single node whose inputs/outputs are static tensors of ``LLVM_TYPES``; the data input
    and outputs share one element type."""

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        why = static_reason([n.inputs[0]] + list(n.outputs))
        if why:
            return why
        return self.check_node(n)

    def check_node(self, n) -> str | None:
        return None


class Concat(_Copy):
    ops = (tn.Concat,)

    def check(self, group):
        return static_reason(list(group.node.inputs) + list(group.node.outputs))

    def emit(self, k, group):
        n = group.node
        y = n.outputs[0]
        ety, size = LLVM_TYPES[y.type.dtype], y.type.dtype.itemsize
        a = n.op.axis % y.type.rank
        ys = strides_of(shape_of(y))
        off = 0
        for x in n.inputs:
            xs = shape_of(x)
            if 0 not in xs:
                copy(k, ety, size, xs, y, ys, off * ys[a], x, strides_of(xs), 0)
            off += xs[a]


class Split(_Copy):
    ops = (tn.Split,)

    def check_node(self, n):
        if len(n.inputs) > 1 and n.inputs[1] is not None and const_ints(n.inputs[1]) is None:
            return "split sizes must be constants"
        return None

    def emit(self, k, group):
        n = group.node
        x = n.inputs[0]
        ety, size = LLVM_TYPES[x.type.dtype], x.type.dtype.itemsize
        a = n.op.axis % x.type.rank
        xs = strides_of(shape_of(x))
        off = 0
        for y in n.outputs:
            ysh = shape_of(y)
            if any(y is o for o in group.outputs):
                copy(k, ety, size, ysh, y, strides_of(ysh), 0, x, xs, off * xs[a])
            off += ysh[a]


class Slice(_Copy):
    ops = (tn.Slice,)

    def check_node(self, n):
        for what, v in zip(("starts", "ends", "axes", "steps"), n.inputs[1:]):
            if v is not None and const_ints(v) is None:
                return f"Slice {what} must be constants"
        return None

    def emit(self, k, group):
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        ety, size = LLVM_TYPES[x.type.dtype], x.type.dtype.itemsize
        args = [const_ints(v) for v in (list(n.inputs[1:]) + [None] * 4)[:4]]
        xsh = shape_of(x)
        xs = strides_of(xsh)
        src_st, off = list(xs), 0
        for a, s, e, st in n.op._plan(len(xsh), *args):
            s, _, _ = tn._slice_range(xsh[a], s, e, st)
            off += s * xs[a]
            src_st[a] = xs[a] * st
        ysh = shape_of(y)
        copy(k, ety, size, ysh, y, strides_of(ysh), 0, x, src_st, off)


class Transpose(_Copy):
    ops = (sh.Transpose,)

    def emit(self, k, group):
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        ety, size = LLVM_TYPES[x.type.dtype], x.type.dtype.itemsize
        perm = n.op._perm(x.type.rank)
        xs = strides_of(shape_of(x))
        ysh = shape_of(y)
        copy(k, ety, size, ysh, y, strides_of(ysh), 0, x, [xs[p] for p in perm], 0)


class Expand(_Copy):
    ops = (tn.Expand,)

    def emit(self, k, group):
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        ety, size = LLVM_TYPES[x.type.dtype], x.type.dtype.itemsize
        ysh = shape_of(y)
        copy(k, ety, size, ysh, y, strides_of(ysh), 0, x, broadcast_strides(shape_of(x), ysh), 0)


class Tile(_Copy):
    ops = (tn.Tile,)

    def check_node(self, n):
        if const_ints(n.inputs[1]) is None:
            return "Tile repeats must be constants"
        return None

    def emit(self, k, group):
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        ety, size = LLVM_TYPES[x.type.dtype], x.type.dtype.itemsize
        xsh, ysh = shape_of(x), shape_of(y)
        reps = const_ints(n.inputs[1])
        xs, ys = strides_of(xsh), strides_of(ysh)
        shape, ds, ss = [], [], []
        for d, r, xst, yst in zip(xsh, reps, xs, ys):
            shape += [r, d]
            ds += [d * yst, yst]
            ss += [0, xst]
        copy(k, ety, size, shape, y, ds, 0, x, ss, 0)


class ConstantOfShape(Lowering):
    ops = (tn.ConstantOfShape,)

    def check(self, group):
        return static_reason(list(group.node.outputs))

    def emit(self, k, group):
        n = group.node
        y = n.outputs[0]
        fill(k, LLVM_TYPES[y.type.dtype], y, y.type.numel, n.op.fill.astype(y.type.dtype.np))


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

    def emit(self, k, group):
        n = group.node
        x, pads, value, axes = (list(n.inputs) + [None] * 3)[:4]
        y = n.outputs[0]
        ety, size = LLVM_TYPES[x.type.dtype], x.type.dtype.itemsize
        xsh, ysh = shape_of(x), shape_of(y)
        widths = n.op._widths(len(xsh), const_ints(pads), const_ints(axes))
        xs, ys = strides_of(xsh), strides_of(ysh)
        if n.op.mode == "constant":
            cv = const_array(value)
            if value is None:
                fv = np.zeros((), x.type.dtype.np)
            elif cv is not None:
                fv = cv.reshape(-1)[:1].reshape(()).astype(x.type.dtype.np)
            else:
                fv = k.load(k.ptr(value), 0, ety)
            src_off = dst_off = 0
            shape = []
            interior = True
            for d, (lo, hi), xst, yst in zip(xsh, widths, xs, ys):
                a = max(0, -lo)
                bb = max(a, min(d, d + hi))
                shape.append(bb - a)
                src_off += a * xst
                dst_off += (a + lo) * yst
                interior = interior and lo <= 0 and hi <= 0
            if not interior:  # some padding: fill everything, then copy the kept part
                fill(k, ety, y, y.type.numel, fv)
            copy(k, ety, size, shape, y, ys, dst_off, x, xs, src_off)
            return
        # reflect / edge / wrap: a source index table per padded axis
        if y.type.numel == 0:
            return
        if not ysh:  # a scalar: nothing to pad
            copy(k, ety, size, [], y, [], 0, x, [], 0)
            return
        tables, offs = [], []
        for i, (d, (lo, hi)) in enumerate(zip(xsh, widths)):
            clo, n_ = -min(lo, 0), d + min(lo, 0) + min(hi, 0)
            if lo > 0 or hi > 0:
                idx = tn._pad_index(n_, max(lo, 0), max(hi, 0), n.op.mode) + clo
                tables.append((idx * xs[i]).astype(np.int64))
                offs.append(None)
            else:
                tables.append(None)
                offs.append(clo * xs[i])
        last_plain = tables[-1] is None
        r = len(ysh)
        table_ptrs = [k.weight(t) if t is not None else None for t in tables]
        b = k.b
        depth = r - 1 if last_plain else r

        def rec(level, d_off, s_off):
            if level == depth:
                if last_plain:
                    memcpy(k, k.at(k.ptr(y), _val(d_off), ety), k.at(k.ptr(x), _val(s_off), ety),
                           ysh[-1] * size)
                else:
                    k.store(k.load(k.ptr(x), _val(s_off), ety), k.ptr(y), _val(d_off))
                return
            with k.loop(ysh[level], name=f"p{level}") as i:
                if tables[level] is None:
                    s2 = _add(b, _add(b, s_off, offs[level]), _mul(b, i, xs[level]))
                else:
                    s2 = _add(b, s_off, k.load(table_ptrs[level], i, I64))
                rec(level + 1, _add(b, d_off, _mul(b, i, ys[level])), s2)

        rec(0, 0, offs[-1] if last_plain else 0)


class Gather(_Copy):
    """Gather: one contiguous run of the axes after ``axis`` per (outer, index) pair. Constant
    indices are checked and normalized at compile time; run-time ones are checked per element: an
    index out of range is reported (``fail_if``: the run raises an error naming the node and the
    index, as the interpreter and ONNX Runtime do) and never read."""

    ops = (ix.Gather,)

    def check_node(self, n):
        data, idx = n.inputs
        why = static_reason([idx])
        if why:
            return why
        c = const_array(idx)
        if c is not None:
            d = int(data.shape[n.op.axis % data.type.rank])
            if c.size and (c.min() < -d or c.max() >= d):
                return "a constant index is out of range"
        return None

    def emit(self, k, group):
        n = group.node
        data, idx = n.inputs
        y = n.outputs[0]
        ety, size = LLVM_TYPES[data.type.dtype], data.type.dtype.itemsize
        dsh = shape_of(data)
        a = n.op.axis % len(dsh)
        outer, dim, inner = int(np.prod(dsh[:a], dtype=np.int64)), dsh[a], int(np.prod(dsh[a + 1:], dtype=np.int64))
        m = idx.type.numel
        if y.type.numel == 0:
            return
        c = const_array(idx)
        norm = None
        if c is not None:
            norm = c.astype(np.int64).reshape(-1)
            norm = np.where(norm < 0, norm + dim, norm)
            if m == 1 or (m > 1 and np.all(np.diff(norm) == 1)):  # one slice: a strided copy
                copy(k, ety, size, [outer, m * inner], y, [m * inner, 1], 0, data, [dim * inner, 1],
                     int(norm[0]) * inner)
                return
        # one run of ``inner`` elements per (outer, index) pair: the pairs split among the threads
        with k.parallel_for(outer * m, max(1, -(-PAR_BYTES // (inner * size + 8)))) as (lo, hi):
            b = k.b
            dptr, yptr = k.ptr(data), k.ptr(y)
            iptr, ity = (k.weight(norm), I64) if c is not None else (k.ptr(idx), LLVM_TYPES[idx.type.dtype])
            with k.loop(b.sub(hi, lo), name="q") as t:
                q = b.add(lo, t)
                o, j = b.udiv(q, c64(m)), b.urem(q, c64(m))
                obase = b.mul(o, c64(dim * inner))
                raw = k.load(iptr, j, ity)
                v = raw = raw if ity == I64 else b.sext(raw, I64)
                if c is None:
                    v = b.select(b.icmp_signed("<", v, c64(0)), b.add(v, c64(dim)), v)
                    ok = b.icmp_unsigned("<", v, c64(dim))
                    k.fail_if(b.not_(ok), raw, dim)
                    v = b.select(ok, v, c64(0))
                dst = b.mul(q, c64(inner))
                src = b.add(obase, b.mul(v, c64(inner)))
                if inner == 1:
                    val = k.load(dptr, src, ety)
                    if c is None:
                        val = b.select(ok, val, ir.Constant(ety, 0))
                    k.store(val, yptr, dst)
                elif c is None:
                    with k.f.if_else(ok) as (then, other):
                        with then:
                            memcpy(k, k.at(yptr, dst, ety), k.at(dptr, src, ety), inner * size)
                        with other:
                            memset(k, k.at(yptr, dst, ety), 0, inner * size)
                else:
                    memcpy(k, k.at(yptr, dst, ety), k.at(dptr, src, ety), inner * size)


LOWERINGS = (Concat(), Split(), Slice(), Transpose(), Expand(), Tile(), ConstantOfShape(), Pad(), Gather())

__all__ = ["LOWERINGS", "Concat", "ConstantOfShape", "Expand", "Gather", "Pad", "Slice", "Split", "Tile",
           "Transpose", "broadcast_strides", "const_array", "const_ints", "copy", "fill", "merge_dims", "nest"]
