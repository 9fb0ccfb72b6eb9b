"""im2col straight into the GEMM's packed-B layout, for convolutions of one image and group.

The GEMM (docs/gemm.md) multiplies B in panels of ``NR`` columns (``kc x NR`` floats for a block of
depth kc; padding columns past N may hold anything finite: they are computed, never stored). The
plain im2col matrix would be written once by the conv and then read and packed again by the GEMM.
Here the GEMM calls back for each block of B it multiplies (``kiln_sgemm_cb``) and the conv packs
that block's windows into the thread's buffer, while it is in cache: no col matrix at all.
Measured against making the whole packed matrix first (and multiplying it pre-packed): DenseNet's
3x3 128->32 on 56x56 1.75 -> 1.48 ms, ResNet's 3x3/2 128 -5%, the other ResNet shapes 1-2%.

1. Every input channel is first copied into zero-padded planes split by column phase (``pad_plane``:
   with a width stride ``sw``, phase ``ph`` holds the padded columns ``t*sw + ph``), so that the
   windows read no padding and consecutive output columns read consecutive floats; a margin after
   the last plane. The channels are split among the threads.
2. The packer: panel ``j`` holds the pixels ``n0 = j * NR ...``, which lie in at most
   ``1 + ceil((NR-1)/OW)`` output rows: the first ``L`` in row ``r0`` from column ``q0``, the next
   ones from the start of the following rows. For every row ``k = (c, ki, kj)`` of the panel the
   ``NR`` values are then contiguous runs of the planes at the same offsets (a constant table of
   each row's window offset): each vector of the panel row is one load per row piece and lane
   selects (no per-element index math).

Lanes past the last pixel read the margin or the next plane (finite values, never stored).

Small convs of width stride 1 or 2 skip step 1 (``reads_input``): the calling thread padded their
few planes alone while the other threads waited. Their packer (``_direct_packer``) reads the input
through lane masks instead: per tap, the lanes of a piece whose window column lies inside the input
are an interval; masked-off lanes read nothing and give the padding's zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..gemm.irbuild import _declare
from ..llvm.elementwise import _For
from .base import F32, I1, I32, I64, PTR, VOID, KernelBuilder, c64
from .im2col import _helper_fn, pad_plane_rt
from .linalg import const_table

#: floats of padded planes per parallel task of the padding at least
PAD_MIN_FLOATS = 1 << 14


def packed_cols_applies(n_images: int, groups: int) -> bool:
    """Whether the conv's col matrix is made as packed panels here: one image and group."""
    return n_images * groups == 1


def reads_input(cg, kh, kw, oh, ow, sh, sw, dh, dw, nr) -> bool:
    """Whether the packer reads the input itself (``_direct_packer``), with no padded planes: for
    a width stride of 1 or 2 (a stem 7x7/2, a 3x3/2 and a 1x1/2 conv on 2 threads: 76 -> 67 us),
    maps at least 4 wide (narrower ones make panels of too many pieces) and
    planes small enough that the calling thread would pad them alone while the others wait (on 2
    threads, eight 16-channel 16x16 convs 110 -> 70 us, eight 64-channel 4x4 ones 145 -> 105 us;
    bigger planes measured no better)."""
    g = _planes(kh, kw, oh, ow, sh, sw, dh, dw, nr)
    return sw <= 2 and ow >= 4 and cg * g.chan < PAD_MIN_FLOATS


def _pieces(ow: int, nr: int) -> int:
    """The most output rows one panel of ``nr`` pixels touches."""
    return 1 + -(-(nr - 1) // ow)


@dataclass(frozen=True)
class _Planes:
    """The padded input planes split by column phase (``pad_plane``): channel c, phase ph, row r,
    column t hold ``xpad[c, r, t * sw + ph]``; output pixel (r, q) of tap (ki, kj) reads channel c's
    ``(kj*dw) % sw`` phase at row ``r*sh + ki*dh``, column ``q + (kj*dw) // sw``."""

    hp: int
    wq: int
    sw: int
    margin: int

    @property
    def chan(self) -> int:
        return self.sw * self.hp * self.wq


def _planes(kh, kw, oh, ow, sh, sw, dh, dw, nr) -> _Planes:
    hp = (oh - 1) * sh + (kh - 1) * dh + 1
    wq = -(-((ow - 1) * sw + (kw - 1) * dw + 1) // sw)
    # lanes past the last pixel read up to this far past the last plane
    margin = (_pieces(ow, nr) + 1) * sh * wq + nr + kw * dw
    return _Planes(hp, wq, sw, margin)


def scratch_floats(cg, kh, kw, oh, ow, sh, sw, dh, dw, nr) -> int:
    """Floats of the padded planes with their margin (none when the packer reads the input)."""
    if reads_input(cg, kh, kw, oh, ow, sh, sw, dh, dw, nr):
        return 0
    g = _planes(kh, kw, oh, ow, sh, sw, dh, dw, nr)
    return cg * g.chan + g.margin


def emit_packed_cols(k: KernelBuilder, x, xpad, cg: int, h: int, wd: int, kh: int, kw: int, oh: int, ow: int,
                     sh: int, sw: int, dh: int, dw: int, pt: int, pl: int, nr: int, lanes: int) -> ir.Function:
    """Pad the input of the conv of ``x`` (one image, ``cg`` channels) into the scratch ``xpad``
    (here, by the threads) and return the GEMM's packer ``pb(xpad, p0, kc, j0, nc, dst)``
    (``kiln_sgemm_cb``): the panels of the col matrix's block ``[p0:p0+kc, j0:j0+nc]``. ``nr`` =
    the GEMM's NR, ``lanes`` its vector width (NR a multiple of it)."""
    if reads_input(cg, kh, kw, oh, ow, sh, sw, dh, dw, nr):
        return _direct_packer(k, h, wd, kh, kw, ow, sh, sw, dh, dw, pt, pl, nr, lanes)
    g = _planes(kh, kw, oh, ow, sh, sw, dh, dw, nr)
    pad_planes(k, x, xpad, cg, h, wd, g.hp, g.wq, pt, pl, sw, g.margin)
    rows = _pieces(ow, nr)
    name = f"kiln_pack_cols_{nr}_{lanes}_{rows}"
    fn = k.services.helper(name, lambda mod: _build_pack(mod, name, nr, lanes, rows))
    table = _row_offsets(k, cg, kh, kw, dh, dw, g)
    cb = ir.Function(k.module, ir.FunctionType(VOID, [PTR, I64, I64, I64, I64, PTR]), f"{k.name}.pb")
    cb.linkage = "internal"
    cb.attributes.add("nounwind")
    ctx, p0, kc, j0, nc, dst = cb.args
    b = ir.IRBuilder(cb.append_basic_block("entry"))
    jp0 = b.udiv(j0, c64(nr))
    jp1 = b.udiv(b.add(b.add(j0, nc), c64(nr - 1)), c64(nr))
    b.call(fn, [ctx, dst, table, p0, kc, jp0, jp1, c64(ow), c64(sh * g.wq)])
    b.ret_void()
    return cb


def pad_planes(k: KernelBuilder, x, xpad, cg: int, h: int, wd: int, hp: int, wq: int, pt: int, pl: int, sw: int,
               margin: int) -> None:
    """The ``cg`` channels of ``x`` (one image) zero-padded into ``xpad`` by the threads, each
    channel ``sw * hp * wq`` floats split by column phase (``pad_plane_rt``), then ``margin``
    zeros (finite values for what reads past the last plane)."""
    chan = sw * hp * wq

    def pad_body(b, a):  # channels [c0, c1) into their phase planes (one helper per width stride)
        with _For(b, b.sub(a["c1"], a["c0"]), "padc") as i:
            c = b.add(i, a["c0"])
            pad_plane_rt(b, b.gep(a["x"], [b.mul(c, b.mul(a["h"], a["wd"]))], inbounds=True, source_etype=F32),
                         b.gep(a["xpad"], [b.mul(c, a["chan"])], inbounds=True, source_etype=F32),
                         a["h"], a["wd"], a["hp"], a["wq"], a["pt"], a["pl"], sw)
    pad = _helper_fn(k, f"kiln_pad_planes_s{sw}", [("x", PTR), ("xpad", PTR)] + [
        (nm, I64) for nm in ("c0", "c1", "h", "wd", "chan", "hp", "wq", "pt", "pl")], pad_body)
    # (a few planes are padded by the calling thread: less than a parallel loop costs to start)
    with k.parallel_for(cg, min_per_task=-(-PAD_MIN_FLOATS // chan)) as (lo, hi):
        b = k.b
        xt, pt_ = k.ptr(x), k.again(xpad)
        b.call(pad, [xt, pt_, lo, hi] + [c64(v) for v in (h, wd, chan, hp, wq, pt, pl)])
        last = b.icmp_signed("==", hi, c64(cg))
        with b.if_then(last):  # the margin: finite values for the lanes past the last pixel
            with _For(b, c64(margin), "padm") as i:
                k.store(ir.Constant(F32, 0.0), pt_, b.add(i, c64(cg * chan)))


def _direct_packer(k: KernelBuilder, h, wd, kh, kw, ow, sh, sw, dh, dw, pt, pl, nr: int,
                   lanes: int) -> ir.Function:
    """The packer ``pb(x, p0, kc, j0, nc, dst)`` reading the unpadded input of a conv of width
    stride 1 or 2. A panel's ``nr`` pixels lie in a few output rows (pieces, as in ``_build_pack``);
    for each tap (ki, kj) the lanes of each piece whose window lies inside the input are one
    interval, a mask computed once per panel and tap; every channel's row of the panel is then one
    masked load per piece and vector (masked-off lanes read nothing and give 0, the padding). With
    a width stride of 2, two masked loads of the ``2 * lanes`` floats a vector's windows span, and
    their even elements."""
    taps, rows, nv = kh * kw, _pieces(ow, nr), nr // lanes
    vec, mask_t = ir.VectorType(F32, lanes), ir.VectorType(I1, lanes)
    ivec = ir.VectorType(I32, lanes)
    mload = _declare(k.module, f"llvm.masked.load.v{lanes}f32.p0", vec, [PTR, I32, mask_t, vec])
    zero = ir.Constant(vec, [0.0] * lanes)
    even = ir.Constant(ivec, [2 * t for t in range(lanes)])
    cb = ir.Function(k.module, ir.FunctionType(VOID, [PTR, I64, I64, I64, I64, PTR]), f"{k.name}.pb")
    cb.linkage = "internal"
    cb.attributes.add("nounwind")
    x, p0, kc, j0, nc, dst = cb.args
    b = ir.IRBuilder(cb.append_basic_block("entry"))

    def splat(v):
        sp = b.insert_element(ir.Constant(ivec, ir.Undefined), b.trunc(v, I32), ir.Constant(I32, 0))
        return b.shuffle_vector(sp, ir.Constant(ivec, ir.Undefined), ir.Constant(ivec, [0] * lanes))

    def smin(a_, b_):
        return b.select(b.icmp_signed("<", a_, b_), a_, b_)

    def smax(a_, b_):
        return b.select(b.icmp_signed(">", a_, b_), a_, b_)

    jp0 = b.udiv(j0, c64(nr))
    jp1 = b.udiv(b.add(b.add(j0, nc), c64(nr - 1)), c64(nr))
    p1 = b.add(p0, kc)
    iotas = [ir.Constant(ivec, [v * lanes + t for t in range(lanes)]) for v in range(nv)]
    # (width stride 2: the floats the vector v of a piece spans, in two loads: their index in the run)
    spans = [[ir.Constant(ivec, [2 * v * lanes + h_ * lanes + t for t in range(lanes)]) for h_ in (0, 1)]
             for v in range(nv)]
    with _For(b, b.sub(jp1, jp0), "panel") as jj:
        n0 = b.mul(b.add(jj, jp0), c64(nr))
        r0, q0 = b.udiv(n0, c64(ow)), b.urem(n0, c64(ow))
        # piece i: lanes [starts[i], starts[i+1]) of output row r0 + i, lane t at column t + qbase[i]
        starts, qbase = [c64(0)], [q0]
        for i in range(1, rows):
            s_i = b.sub(c64(ow), q0) if i == 1 else b.add(starts[-1], c64(ow))
            starts.append(smin(s_i, c64(nr)))
            qbase.append(b.sub(c64(0), starts[-1]))
        starts.append(c64(nr))
        pdst = b.gep(dst, [b.mul(jj, b.mul(kc, c64(nr)))], inbounds=True, source_etype=F32)
        with _For(b, c64(taps), "tap") as tap:
            ki, kj = b.udiv(tap, c64(kw)), b.urem(tap, c64(kw))
            shift = b.sub(b.mul(kj, c64(dw)), c64(pl))  # input column = output column * sw + shift
            bases, masks, loads = [], [], []
            for i in range(rows):
                ih = b.add(b.sub(b.mul(b.add(r0, c64(i)), c64(sh)), c64(pt)), b.mul(ki, c64(dh)))
                u = b.add(b.mul(qbase[i], c64(sw)), shift)  # the input column of the piece's lane 0
                # lanes t with 0 <= u + sw * t < wd: [ceil(-u / sw), ceil((wd - u) / sw))
                lo = smax(starts[i], _ceil_div(b, b.sub(c64(0), u), sw))
                hi = smin(starts[i + 1], _ceil_div(b, b.sub(c64(wd), u), sw))
                hi = b.select(b.icmp_unsigned("<", ih, c64(h)), smax(hi, lo), lo)  # a padding row: none
                lo, hi = smin(lo, c64(nr)), smin(hi, c64(nr))
                lo_v, hi_v = splat(lo), splat(hi)
                masks.append([b.and_(b.icmp_signed(">=", io, lo_v), b.icmp_signed("<", io, hi_v)) for io in iotas])
                if sw == 2:  # the floats [2 lo, 2 hi - 1) of the piece's run
                    a_v, z_v = splat(b.mul(lo, c64(2))), splat(b.sub(b.mul(hi, c64(2)), c64(1)))
                    loads.append([[b.and_(b.icmp_signed(">=", io, a_v), b.icmp_signed("<", io, z_v)) for io in sp]
                                  for sp in spans])
                bases.append(b.add(b.mul(ih, c64(wd)), u))
            # the channels c whose row c * taps + tap lies in [p0, p1)
            c_lo = b.udiv(b.add(b.sub(p0, tap), c64(taps - 1)), c64(taps))
            c_hi = b.udiv(b.add(b.sub(p1, tap), c64(taps - 1)), c64(taps))
            with _For(b, b.sub(c_hi, c_lo), "ch") as ci:
                c = b.add(ci, c_lo)
                row = b.sub(b.add(b.mul(c, c64(taps)), tap), p0)
                d = b.gep(pdst, [b.mul(row, c64(nr))], inbounds=True, source_etype=F32)
                plane = b.mul(c, c64(h * wd))
                for v in range(nv):
                    val = zero
                    for i in range(rows):  # (addresses of masked-off lanes may lie outside x: no inbounds)
                        at = b.gep(x, [b.add(plane, b.add(bases[i], c64(sw * v * lanes)))], source_etype=F32)
                        if sw == 1:
                            val = b.call(mload, [at, ir.Constant(I32, 4), masks[i][v], val])
                            continue
                        pair = [b.call(mload, [b.gep(at, [c64(h_ * lanes)], source_etype=F32), ir.Constant(I32, 4),
                                               loads[i][v][h_], zero]) for h_ in (0, 1)]
                        val = b.select(masks[i][v], b.shuffle_vector(pair[0], pair[1], even), val)
                    b.store(val, b.gep(d, [c64(v * lanes)], inbounds=True, source_etype=F32), align=4)
    b.ret_void()
    return cb


def _ceil_div(b: ir.IRBuilder, a, s: int):
    """ceil(a / s) of a signed i64 value, for s of 1 or 2."""
    return a if s == 1 else b.sub(c64(0), b.ashr(b.sub(c64(0), a), c64(1)))


def _row_offsets(k: KernelBuilder, cg, kh, kw, dh, dw, g: _Planes) -> ir.Value:
    """A constant table: for row (c, ki, kj) of the col matrix, the offset of its window in the
    padded phase planes (channel c, kernel row ki, the column phase and shift of kj)."""
    offs = [c * g.chan + ki * dh * g.wq + ((kj * dw) % g.sw) * g.hp * g.wq + (kj * dw) // g.sw
            for c in range(cg) for ki in range(kh) for kj in range(kw)]
    return const_table(k, "koff", offs)[0].bitcast(PTR)


def _build_pack(module: ir.Module, name: str, nr: int, lanes: int, rows: int) -> ir.Function:
    """``pack(xpad, dst, koff, p0, kc, j0, j1, ow, rowstep)``: the rows [p0, p0+kc) of panels
    [j0, j1) (sizes at run time) into dst (panel after panel, ``kc x nr`` each); row r's window
    starts at ``xpad + koff[r]``; each panel touches at most ``rows`` output rows."""
    names = ("p0", "kc", "j0", "j1", "ow", "rowstep")
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, PTR] + [I64] * len(names)), name)
    # one copy per library; LLVM inlines it into each conv's task, specialized for the conv's sizes:
    # 2% faster on DenseNet/ResNet than one shared copy, for about 4 s more compile time on DenseNet
    fn.linkage = "linkonce_odr"
    fn.visibility = "hidden"
    fn.attributes.add("nounwind")
    xpad, col, koff = fn.args[:3]
    xpad.name, col.name, koff.name = "xpad", "dst", "koff"
    for v in (xpad, col, koff):
        v.add_attribute("noalias")
    a = dict(zip(names, fn.args[3:]))
    for nm, v in a.items():
        v.name = nm
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vec = ir.VectorType(F32, lanes)
    ivec = ir.VectorType(I32, lanes)
    ow, step, kc = a["ow"], a["rowstep"], a["kc"]

    def at(ptr, i):
        return b.gep(ptr, [i], inbounds=True, source_etype=F32)

    def splat(v):
        sp = b.insert_element(ir.Constant(ivec, ir.Undefined), v, ir.Constant(I32, 0))
        return b.shuffle_vector(sp, ir.Constant(ivec, ir.Undefined), ir.Constant(ivec, [0] * lanes))

    with _For(b, b.sub(a["j1"], a["j0"]), "panel") as jj:
        j = b.add(jj, a["j0"])
        n0 = b.mul(j, c64(nr))
        r0, q0 = b.udiv(n0, ow), b.urem(n0, ow)
        # piece i: lanes [start_i, start_{i+1}) from output row r0 + i; lane t reads base_i + t
        starts, bases = [c64(0)], [b.add(b.mul(r0, step), q0)]
        for i in range(1, rows):
            s_i = b.sub(ow, q0) if i == 1 else b.add(starts[-1], ow)
            s_i = b.select(b.icmp_signed("<", s_i, c64(nr)), s_i, c64(nr))
            starts.append(s_i)
            bases.append(b.sub(b.mul(b.add(r0, c64(i)), step), s_i))
        # per vector of the panel row, per piece after the first: lanes before its start
        masks = [[b.icmp_signed("<", ir.Constant(ivec, [v * lanes + t for t in range(lanes)]),
                                splat(b.trunc(starts[i], I32))) for i in range(1, rows)]
                 for v in range(nr // lanes)]
        dst0 = at(col, b.mul(jj, b.mul(kc, c64(nr))))
        with _For(b, kc, "row") as r:
            off = b.load(b.gep(koff, [b.add(a["p0"], r)], inbounds=True, source_etype=I64), typ=I64)
            dst = at(dst0, b.mul(r, c64(nr)))
            srcs = [at(xpad, b.add(off, base)) for base in bases]
            for v in range(nr // lanes):
                val = b.load(at(srcs[-1], c64(v * lanes)), typ=vec, align=4)
                for i in range(rows - 2, -1, -1):  # lanes before piece i+1's start: piece i
                    val = b.select(masks[v][i], b.load(at(srcs[i], c64(v * lanes)), typ=vec, align=4), val)
                b.store(val, at(dst, c64(v * lanes)), align=4)
    b.ret_void()
    return fn


__all__ = ["emit_packed_cols", "packed_cols_applies", "reads_input", "scratch_floats"]
