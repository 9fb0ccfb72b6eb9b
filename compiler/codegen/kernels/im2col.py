"""im2col and zero-padded input planes for the convolution lowerings (``conv.py``,
``packed_cols.py``): module-level helpers taking the sizes at run time (one per width stride), so
that one copy serves every convolution of a module and compile time stays flat.

* ``im2col``: the windows of one image and group as the columns of
  ``col[(c*KH + ki)*KW + kj, oh*OW + ow] = x[c, oh*sh - pt + ki*dh, ow*sw - pl + kj*dw]`` (0 outside),
  each row a run of contiguous copies over the output width;
* ``im2col_phased``: the same for a width stride > 1, from the padded input split by column phase
  (``pad_plane_rt``), so every row copy is contiguous again;
* ``im2col_table``: the same as one gather through a compile-time index table, for outputs a few
  pixels wide (a 2x2 map), where the run-by-run copies cost far more per element than they move;
  ``im2col_table_packed_a``: that gather written as ``col^T`` in the GEMM's packed-A panels (the
  transposed conv's A operand, so the GEMM packs nothing);
* ``pad_plane`` (compile-time sizes) and ``pad_plane_rt`` (run-time sizes): a zero-padded plane
  split by column phase, ``plane[ph, r, t] = xpad[r, t*sw + ph]``.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from llvmlite import ir

from ..llvm.elementwise import _For
from .base import F32, I32, I64, PTR, VOID, KernelBuilder, c64, cf32

#: im2col by index table (``im2col_table``) for outputs narrower than this, when the table has at
#: most ``TABLE_MAX`` entries (int32: 256 KiB)
TABLE_WIDTH, TABLE_MAX = 8, 1 << 16

#: ``pad_plane`` of width stride 2 splits each row into both phases in one pass (``_pad_plane_pairs``)
PAD_PAIRS = True


def _ranges(size: int, out: int, k: int, s: int, d: int, pb: int) -> list[tuple[int, int]]:
    """Per kernel tap j: the output range [lo, hi) whose input index o*s - pb + j*d is inside."""
    res = []
    for j in range(k):
        off = j * d - pb
        lo = max(0, -(off // s) if off < 0 else 0)  # ceil(-off / s) for off < 0
        hi = min(out, (size - 1 - off) // s + 1) if size - 1 - off >= 0 else 0
        res.append((lo, max(lo, hi)))
    return res


def pad_plane_rt(b: ir.IRBuilder, xin, plane, h, wd, hp, wq, pt, pl, sw: int, cond=None) -> None:
    """``pad_plane`` with run-time sizes (i64 values; ``sw`` an int), only when ``cond`` (an i1) holds."""
    def emit():
        for ph in range(sw):
            # t in [lo, hi): 0 <= t*sw + ph - pl < wd
            lo, hi = _valid(b, b.sub(c64(ph), pl), wd, wq, c64(sw))
            base = _gep(b, plane, b.mul(c64(ph), b.mul(hp, wq)))
            with _For(b, hp, f"pr{ph}") as r:
                ih = b.sub(r, pt)
                dst = _gep(b, base, b.mul(r, wq))
                inside = b.icmp_unsigned("<", ih, h)
                with b.if_else(inside) as (then, other):
                    with then:  # (the row's few padding columns: stores, not memset calls)
                        _zero(b, dst, c64(0), lo, f"pza{ph}", few=True)
                        src = _gep(b, xin, b.add(b.mul(ih, wd), b.sub(b.add(b.mul(lo, c64(sw)), c64(ph)), pl)))
                        dlo = _gep(b, dst, lo)
                        with _For(b, b.sub(hi, lo), f"pcp{ph}") as q:
                            b.store(b.load(_gep(b, src, b.mul(q, c64(sw)) if sw > 1 else q), typ=F32),
                                    _gep(b, dlo, q))
                        _zero(b, dst, hi, wq, f"pzb{ph}", few=True)
                    with other:
                        _zero(b, dst, c64(0), wq, f"pz{ph}")
    if cond is None:
        emit()
    else:
        with b.if_then(cond):
            emit()


def _helper_fn(k: KernelBuilder, name: str, args: list[tuple[str, ir.Type]], body) -> ir.Function:
    """A module-level function (sizes as run-time arguments, so one copy serves every kernel of the
    module and LLVM compiles it once); ``body(b, args_by_name)`` emits its code."""
    def build(mod):
        fn = ir.Function(mod, ir.FunctionType(VOID, [t for _, t in args]), name)
        # not internal: LLVM would otherwise specialize it for the constants its few call sites
        # pass (unrolling the loops again); linkonce_odr + hidden: one copy per library
        fn.linkage = "linkonce_odr"
        fn.visibility = "hidden"
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")
        for a, (nm, t) in zip(fn.args, args):
            a.name = nm
            if t == PTR:
                a.add_attribute("noalias")  # every pointer argument is a buffer of its own
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        body(b, {nm: a for a, (nm, _) in zip(fn.args, args)})
        b.ret_void()
        return fn
    return k.services.helper(name, build)


def _gep(b: ir.IRBuilder, ptr, i):
    return b.gep(ptr, [i], inbounds=True, source_etype=F32)


def _fill_zero(k: KernelBuilder, ptr, start, stop, name: str) -> None:
    """``ptr[start:stop] = 0`` (compile-time bounds; short ranges as straight stores)."""
    if stop <= start:
        return
    if stop - start <= 4:
        for i in range(start, stop):
            k.store(cf32(0.0), ptr, i)
        return
    base = k.at(ptr, start) if start else ptr
    with k.loop(stop - start, name) as q:
        k.store(cf32(0.0), base, q)


def _copy(k: KernelBuilder, dst, src, count: int, stride: int, name: str) -> None:
    """``dst[q] = src[q * stride]`` for q < count."""
    b = k.b
    with k.loop(count, name) as q:
        k.store(k.load(src, b.mul(q, c64(stride)) if stride != 1 else q), dst, q)


def _in_range(k: KernelBuilder, idx, size: int):
    """0 <= idx < size (one unsigned compare)."""
    return k.b.icmp_unsigned("<", idx, c64(size))


def im2col(k: KernelBuilder, xp, xbase, col, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
           cstride=None) -> None:
    """``col[(c*KH + ki)*KW + kj, oh*OW + ow] = x[c, oh*sh - pt + ki*dh, ow*sw - pl + kj*dw]`` (0 outside),
    by a module-level helper shared by every conv of the same width stride (compile time stays flat).
    Sizes are ints or i64 values; ``cstride``: the channel stride of x (default ``h * wd``)."""
    fn = k.services.helper(f"kiln_im2col_s{sw}", lambda mod: _build_im2col(mod, sw))
    if cstride is None:
        cstride = h * wd
    vals = (cstride, cg, h, wd, kh, kw, oh, ow, sh, dh, dw, pt, pl)
    args = [k.at(xp, xbase), col] + [v if isinstance(v, ir.Value) else c64(v) for v in vals]
    k.b.call(fn, args)


def im2col_phased(k: KernelBuilder, xp, xbase, planes, col, cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw,
                  pt, pl, hp, wq) -> None:
    """im2col for a width stride > 1: each channel is first padded and split by column phase
    (``pad_plane``), after which every (tap, output row) is one contiguous copy of ``OW`` floats."""
    names = ("c0", "c1", "h", "wd", "kh", "kw", "oh", "ow", "sh", "dh", "dw", "pt", "pl", "hp", "wq")

    def body(b, a):
        hp, wq, oh, ow, kh, kw = a["hp"], a["wq"], a["oh"], a["ow"], a["kh"], a["kw"]
        chan = b.mul(c64(sw), b.mul(hp, wq))
        plane = b.mul(a["h"], a["wd"])
        p = b.mul(oh, ow)
        with _span(b, a["c0"], a["c1"], "pc") as ci:
            pad_plane_rt(b, _gep(b, a["x"], b.mul(ci, plane)), _gep(b, a["planes"], b.mul(ci, chan)),
                         a["h"], a["wd"], hp, wq, a["pt"], a["pl"], sw)
        taps = b.mul(kh, kw)
        with _span(b, b.mul(a["c0"], taps), b.mul(a["c1"], taps), "prow") as row:
            ci = b.udiv(row, taps)
            tap = b.urem(row, taps)
            ki, kj = b.udiv(tap, kw), b.urem(tap, kw)
            cj = b.mul(kj, a["dw"])
            off = b.add(b.add(b.mul(ci, chan), b.mul(b.urem(cj, c64(sw)), b.mul(hp, wq))),
                        b.add(b.mul(b.mul(ki, a["dh"]), wq), b.udiv(cj, c64(sw))))
            src = _gep(b, a["planes"], off)
            dst = _gep(b, a["col"], b.mul(row, p))
            step = b.mul(a["sh"], wq)
            with _For(b, oh, "por") as r:
                s_row = _gep(b, src, b.mul(r, step))
                d_row = _gep(b, dst, b.mul(r, ow))
                with _For(b, ow, "poc") as q:
                    b.store(b.load(_gep(b, s_row, q), typ=F32), _gep(b, d_row, q))

    fn = _helper_fn(k, f"kiln_im2col_phased_s{sw}", [("x", PTR), ("planes", PTR), ("col", PTR)]
                    + [(nm, I64) for nm in names], body)
    vals = (0, cg, h, wd, kh, kw, oh, ow, sh, dh, dw, pt, pl, hp, wq)
    k.b.call(fn, [k.at(xp, xbase), planes, col] + [v if isinstance(v, ir.Value) else c64(v) for v in vals])


def window_table(cg, h, wd, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl) -> np.ndarray:
    """``table[(c*KH + ki)*KW + kj, oh*OW + ow]``: the index in the group's input (``c*H*W + ih*W + iw``)
    of that col element, -1 where it is padding."""
    c, ki, kj, r, q = np.ix_(np.arange(cg), np.arange(kh), np.arange(kw), np.arange(oh), np.arange(ow))
    ih, iw = r * sh - pt + ki * dh, q * sw - pl + kj * dw
    inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < wd)
    return np.where(inside, (c * h + ih) * wd + iw, -1).reshape(cg * kh * kw, oh * ow).astype(np.int32)


def table_applies(kk: int, ow: int, p: int) -> bool:
    """Whether ``im2col_table`` makes the col matrix of ``kk`` rows of ``p`` pixels, ``ow`` wide."""
    return ow < TABLE_WIDTH and kk * p <= TABLE_MAX


def im2col_table(k: KernelBuilder, xp, xbase, col, table: np.ndarray) -> None:
    """``col[i] = x[xbase + table[i]]``, 0 where the table holds -1: one branch-free gather."""
    b = k.b
    tp, xg = k.weight(table), k.at(xp, xbase)
    with k.loop(table.size, "tg") as i:
        j = b.sext(k.load(tp, i, I32), I64)
        inside = b.icmp_signed(">=", j, c64(0))
        v = k.load(xg, b.select(inside, j, c64(0)))
        k.store(b.select(inside, v, cf32(0.0)), col, i)


def packed_a_tables(table: np.ndarray, mr: int) -> list[tuple[int, np.ndarray]]:
    """``table`` ([K, P]) as ``col^T``'s rows in the GEMM's packed-A order (``ta = 2``: panels of
    ``mr`` pixels, each ``K x mr`` with pixel i of its panel at ``k*mr + i``): per panel, the pixels
    in it and its table ``[K, rows]``. Padding rows of the last panel get no entry: the GEMM's
    microkernels for a short panel read its rows only."""
    kk, p = table.shape
    return [(min(mr, p - p0), np.ascontiguousarray(table[:, p0:p0 + mr])) for p0 in range(0, p, mr)]


def im2col_table_packed_a(k: KernelBuilder, xp, xbase, dst, table: np.ndarray, mr: int, span=None) -> None:
    """``col^T`` of ``table`` into packed-A panels at ``dst`` (see ``packed_a_tables``): per panel a
    loop over K whose body gathers the panel's pixels, 0 where the table holds -1. ``span``: (lo,
    hi), i64 values: only the rows [lo, hi) of K (a thread's part)."""
    b = k.b
    xg = k.at(xp, xbase)
    kk = table.shape[0]
    lo, hi = span if span is not None else (c64(0), c64(kk))
    for i, (rows, t) in enumerate(packed_a_tables(table, mr)):
        tp, base = k.weight(t), i * kk * mr
        with _span(b, lo, hi, f"pa{i}") as q:
            for r in range(rows):
                j = b.sext(k.load(tp, b.add(b.mul(q, c64(rows)), c64(r)), I32), I64)
                inside = b.icmp_signed(">=", j, c64(0))
                v = k.load(xg, b.select(inside, j, c64(0)))
                k.store(b.select(inside, v, cf32(0.0)), dst, b.add(b.mul(q, c64(mr)), c64(base + r)))


@contextmanager
def _span(b: ir.IRBuilder, start, stop, name: str):
    """``for (i = start; i < stop; ++i)`` with i64 values (nothing when stop <= start)."""
    with _For(b, b.sub(stop, start), name) as i:
        yield b.add(i, start)


def _zero(b: ir.IRBuilder, ptr, start, stop, name: str, few: bool = False) -> None:
    """Zeros into ``ptr[start:stop]``. ``few``: a run of a few elements whose length is known only
    at run time, stored one by one. (As monotonic atomic stores, which are plain moves on x86 but
    which LLVM does not turn into a call of memset, as it does a loop of plain stores: a call costs
    more than the stores; a 16-channel 16x16 conv's padding made 576 of them, 5% of a
    ResNet-18@64.)"""
    with _span(b, start, stop, name) as i:
        at = b.gep(ptr, [i], inbounds=True, source_etype=F32)
        if few:  # (llvmlite's store_atomic wants a typed pointer)
            b._insert(ir.instructions.StoreAtomicInstr(b.block, cf32(0.0), at, "monotonic", 4))
        else:
            b.store(cf32(0.0), at)


def _valid(b: ir.IRBuilder, off, size, out, stride):
    """[lo, hi): the outputs o < out with 0 <= o*stride + off < size (lo <= hi)."""
    zero = c64(0)
    neg = b.icmp_signed("<", off, zero)
    lo = b.select(neg, b.sdiv(b.add(b.sub(zero, off), b.sub(stride, c64(1))), stride), zero)
    last = b.sub(b.sub(size, c64(1)), off)
    hi = b.select(b.icmp_signed("<", last, zero), zero, b.add(b.sdiv(last, stride), c64(1)))
    lo = b.select(b.icmp_signed("<", lo, out), lo, out)
    hi = b.select(b.icmp_signed("<", hi, out), hi, out)
    hi = b.select(b.icmp_signed("<", hi, lo), lo, hi)
    return lo, hi


def _build_im2col(module: ir.Module, sw: int) -> ir.Function:
    names = ("cs", "cg", "h", "wd", "kh", "kw", "oh", "ow", "sh", "dh", "dw", "pt", "pl")
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR] + [I64] * len(names)), f"kiln_im2col_s{sw}")
    fn.linkage = "linkonce_odr"  # not specialized for its call sites (see _helper_fn)
    fn.attributes.add("nounwind")
    for a, nm in zip(fn.args, ("x", "col") + names):
        a.name = nm
    x, col = fn.args[:2]
    v = dict(zip(names, fn.args[2:]))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    gep = lambda ptr, i: b.gep(ptr, [i], inbounds=True, source_etype=F32)  # noqa: E731
    oh, ow, wd = v["oh"], v["ow"], v["wd"]
    p = b.mul(oh, ow)
    # one output row per input row, full width: the valid window of a tap is one run of the plane
    contiguous = b.and_(b.icmp_signed("==", ow, wd), b.icmp_signed("==", v["sh"], c64(1))) if sw == 1 else None
    swc = c64(sw)
    with _For(b, v["cg"], "ic") as ci:
        xc = gep(x, b.mul(ci, v["cs"]))
        with _For(b, v["kh"], "ki") as ki:
            a = b.sub(b.mul(ki, v["dh"]), v["pt"])
            rlo, rhi = _valid(b, a, v["h"], oh, v["sh"])
            with _For(b, v["kw"], "kj") as kj:
                bc = b.sub(b.mul(kj, v["dw"]), v["pl"])
                lo, hi = _valid(b, bc, wd, ow, swc)
                row = b.add(b.mul(b.add(b.mul(ci, v["kh"]), ki), v["kw"]), kj)
                dst = gep(col, b.mul(row, p))
                empty = b.or_(b.icmp_signed(">=", rlo, rhi), b.icmp_signed(">=", lo, hi))
                with b.if_else(empty) as (then, otherwise):
                    with then:
                        _zero(b, dst, c64(0), p, "z")
                    with otherwise:
                        def strided():
                            _zero(b, dst, c64(0), b.mul(rlo, ow), "za")
                            _zero(b, dst, b.mul(rhi, ow), p, "zb")
                            with _span(b, rlo, rhi, "r") as r:
                                drow = gep(dst, b.mul(r, ow))
                                ih = b.add(b.mul(r, v["sh"]), a)
                                src = gep(xc, b.add(b.mul(ih, wd), b.add(b.mul(lo, swc), bc)))
                                _zero(b, drow, c64(0), lo, "rza")
                                dlo = gep(drow, lo)
                                with _For(b, b.sub(hi, lo), "cp") as q:
                                    val = b.load(gep(src, b.mul(q, swc) if sw != 1 else q), typ=F32)
                                    b.store(val, gep(dlo, q))
                                _zero(b, drow, hi, ow, "rzb")

                        if contiguous is None:
                            strided()
                        else:
                            with b.if_else(contiguous) as (cont, other):
                                with cont:
                                    # the valid rows are one run of the plane: copy it whole, then
                                    # zero the columns that wrapped into the neighbouring rows
                                    p0 = b.add(b.mul(rlo, ow), lo)
                                    p1 = b.add(b.mul(b.sub(rhi, c64(1)), ow), hi)
                                    _zero(b, dst, c64(0), p0, "cza")
                                    _zero(b, dst, p1, p, "czb")
                                    src = gep(xc, b.add(b.mul(a, wd), bc))
                                    with _span(b, p0, p1, "ccp") as q:
                                        b.store(b.load(gep(src, q), typ=F32), gep(dst, q))
                                    edges = b.or_(b.icmp_signed(">", lo, c64(0)), b.icmp_signed("<", hi, ow))
                                    with b.if_then(edges):
                                        with _span(b, rlo, rhi, "cr") as r:
                                            drow = gep(dst, b.mul(r, ow))
                                            _zero(b, drow, c64(0), lo, "crza")
                                            _zero(b, drow, hi, ow, "crzb")
                                with other:
                                    strided()
    b.ret_void()
    return fn


def pad_plane(k: KernelBuilder, xin, plane, h, wd, hp, wq, pt, pl, sw, sh=1, load=None, xt=F32,
              row0=None, rows=None, convert=None) -> None:
    """The ``hp`` rows of the zero-padded input plane ``xpad[r, s] = x[r - pt, s - pl]`` split by
    column phase: ``plane[ph, r, t] = xpad[r, t*sw + ph]`` (``wq`` columns per phase), so that a
    strided window reads contiguous columns. With ``sh > 1`` the rows are split by phase too:
    ``plane[rph, ph, r, t] = xpad[r*sh + rph, t*sw + ph]``, ``hq = ceil(hp / sh)`` rows per phase (a
    strided window then reads consecutive rows as well). ``load``: a row function ``f(x elements,
    float32 out, n)`` reading every ``sw``-th element of ``x`` (of type ``xt``) and computing the
    row's values from them (a dequantization) instead of copying them; ``convert(b, vector)``: the
    same on a vector of elements (``_pad_plane_pairs``), or None.

    A strip of the padded plane (``sh == 1``): ``row0`` (an i64 value) its first row, ``rows`` (an
    int or i64 value, at most ``hp``) how many: ``plane[ph, r, t] = xpad[row0 + r, t*sw + ph]``."""
    b = k.b
    hq = -(-hp // sh)
    assert row0 is None or sh == 1
    row0 = c64(0) if row0 is None else row0
    rows = hq if rows is None else rows
    if sw == 2 and PAD_PAIRS and (convert is not None or load is None and xt == F32):
        _pad_plane_pairs(k, xin, plane, h, wd, hq, wq, pt, pl, sh, row0, rows, xt, load, convert)
        return
    for rph in range(sh):
        for ph in range(sw):
            # t in [lo, hi): 0 <= t*sw + ph - pl < wd
            (lo, hi), = _ranges(wd, wq, 1, sw, 1, pl - ph)
            base = k.at(plane, (rph * sw + ph) * hq * wq)
            tag = f"{rph}_{ph}" if sh > 1 else f"{ph}"
            with k.loop(rows, f"pr{tag}") as r:
                ih = b.sub(b.mul(r, c64(sh)), c64(pt - rph)) if sh > 1 else b.sub(b.add(r, row0), c64(pt))
                dst = k.at(base, b.mul(r, c64(wq)))
                with k.f.if_else(_in_range(k, ih, h), f"prow{tag}") as (inside, outside):
                    with inside:
                        _fill_zero(k, dst, 0, lo, f"pza{tag}")
                        if hi > lo:
                            src = k.at(xin, b.add(b.mul(ih, c64(wd)), c64(lo * sw + ph - pl)), xt)
                            if load is not None:
                                b.call(load, [src, k.at(dst, lo), c64(hi - lo)])
                            else:
                                _copy(k, k.at(dst, lo), src, hi - lo, sw, f"pcp{tag}")
                        _fill_zero(k, dst, hi, wq, f"pzb{tag}")
                    with outside:
                        _fill_zero(k, dst, 0, wq, f"pz{tag}")


def _pad_plane_pairs(k: KernelBuilder, xin, plane, h, wd, hq, wq, pt, pl, sh, row0, rows, xt=F32, load=None,
                     convert=None) -> None:
    """``pad_plane`` of width stride 2: each input row split into both column phases in one pass,
    vectors of ``2 * lanes`` elements loaded whole and their even and odd elements stored to the two
    phases (two shuffles per pair of vectors; where the columns both phases have are not a multiple
    of the lanes, the last vector overlaps the one before it: its first values are written twice,
    the same), the few columns by the row's ends one by one. Per phase the loop form of
    ``pad_plane`` loaded both vectors again, through a lane mask (the vectorizer cannot know that
    the odd element past a row's last even one is readable). Measured on Zen 4, a 3x3/2 depthwise
    over 112x112 planes: 2.39 -> 2.29 us a plane; most of what its padding cost was L2 traffic,
    which the strips of ``conv.py`` (``DW_STRIP_BYTES``) removed.

    Elements of another type than float32 (``xt``, uint8 to dequantize): ``convert(b, vector)``
    computes each phase's vector of floats from its vector of elements (the row function's
    semantics on explicit vectors, ``RowChain.vector``), ``load`` (the row function of
    ``pad_plane``) the ends. With the loop form's row function each phase's 56 columns of a
    112-wide row were 48 in vectors of 8 and 8 one by one."""
    b = k.b
    lanes = k.services.gemm_cfg.W
    vec2 = ir.VectorType(xt, 2 * lanes)
    evens = ir.Constant(ir.VectorType(I32, lanes), [2 * i for i in range(lanes)])
    odds = ir.Constant(ir.VectorType(I32, lanes), [2 * i + 1 for i in range(lanes)])
    # phase ph's column t holds input column 2t + ph - pl, inside for t in [lo[ph], hi[ph])
    spans = _ranges(wd, wq, 2, 2, 1, pl)
    # the vectors: t in [t0, t1), both phases inside (2t - pl >= 0, 2t + 1 - pl < wd), by nv
    # vectors starting at t0, t0 + lanes, ..., the last at t1 - lanes
    t0 = max(spans[0][0], spans[1][0])
    t1 = max(t0, min(spans[0][1], spans[1][1]))
    nv = -(-(t1 - t0) // lanes) if t1 - t0 >= lanes else 0
    t1 = t1 if nv else t0
    for rph in range(sh):
        bases = [k.at(plane, (rph * 2 + ph) * hq * wq) for ph in range(2)]
        with k.loop(rows, f"pp{rph}") as r:
            ih = b.sub(b.mul(r, c64(sh)), c64(pt - rph)) if sh > 1 else b.sub(b.add(r, row0), c64(pt))
            dsts = [k.at(base, b.mul(r, c64(wq))) for base in bases]
            with k.f.if_else(_in_range(k, ih, h), f"pprow{rph}") as (inside, outside):
                with inside:
                    row = k.at(xin, b.mul(ih, c64(wd)), xt)
                    for ph, (lo, hi) in enumerate(spans):
                        _fill_zero(k, dsts[ph], 0, lo, f"ppza{rph}{ph}")
                        for a, z in ((lo, min(hi, t0)), (max(lo, t1), hi)):
                            if z > a:  # dst[t] = row[2t + ph - pl]
                                src = k.at(row, c64(2 * a + ph - pl), xt)
                                if load is not None:
                                    b.call(load, [src, k.at(dsts[ph], c64(a)), c64(z - a)])
                                    continue
                                with k.loop(z - a, f"ppe{rph}{ph}") as q:
                                    k.store(k.load(src, b.mul(q, c64(2))), k.at(dsts[ph], c64(a)), q)
                        _fill_zero(k, dsts[ph], hi, wq, f"ppzb{rph}{ph}")
                    if nv:
                        with k.loop(nv, f"ppv{rph}") as v:
                            t = k.f.min(b.add(b.mul(v, c64(lanes)), c64(t0)), c64(t1 - lanes))
                            pair = b.load(k.at(row, b.sub(b.mul(t, c64(2)), c64(pl)), xt), typ=vec2, align=1)
                            for ph, sel in enumerate((evens, odds)):
                                half = b.shuffle_vector(pair, ir.Constant(vec2, ir.Undefined), sel)
                                b.store(half if convert is None else convert(b, half), k.at(dsts[ph], t), align=4)
                with outside:
                    for ph in range(2):
                        _fill_zero(k, dsts[ph], 0, wq, f"ppz{rph}{ph}")


__all__ = ["im2col", "im2col_phased", "pad_plane", "pad_plane_rt"]
