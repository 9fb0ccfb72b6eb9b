"""ConvInteger and QLinearConv (2-D, NCHW, any pads/strides/dilations/groups): int8/uint8 operands,
int32 sums.

The portable kernel (``form``, every printer): per image and output channel (the parallel axis), each
output row's int32 sums in scratch; for each input channel of the group and each tap, the row of
inputs under the tap (outside the image: the input's zero point, so it adds 0) less the zero point,
times the weight less its own, added along the row (the vector axis). Then each row is finished:

* ConvInteger: the int32 sums;
* QLinearConv: ``(sum + B) * (x_scale * w_scale) / y_scale`` in f64 as the reference, ties to even,
  plus y's zero point, saturated; on the int8 tiles with constant parameters, from float32 with the
  rows holding a value near a rounding tie finished again in f64 (``fast_finish``,
  ``int8_tiles.Fast``): the same bits.

On a CPU with AVX-512 VNNI, AVX-512 BW or AVX2, a convolution of one group with constant weights is
either the transposed product W x cols (``emit_transposed``): the input packed at run time (a 1x1
convolution's into the tiles' panels, any other's per tap and word of channels, in pixel order),
the weights as the tiles' rows, each tile's vectors NCHW runs of pixels, stored whole with the
elementwise chain after the convolution computed on them; or an im2col into scratch (one row of
K = C * kh * kw bytes per output pixel, the loop form, split among the threads) and the int8 GEMM's
tiles (``int8_tiles.py``) against the weights packed at compile time, each finished value written
to its NCHW place. The first where the image's pixels fill the tiles' 64-pixel panels
(``TRANSPOSED_MIN_FILL``; a 1x1 convolution: ``POINTWISE_MIN_PIXELS``), the second on small images
(14x14, 7x7), whose pixel count fills the tiles' rows of 6 better.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...ir.ops import conv as cv
from ...ir.ops import quant as qn
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..gemm.int8 import INT8_CHUNKS_PER_THREAD, Int8Emitter, Int8Tiling
from ..loops.expr import INDEX, Const, Var, cast, op, select
from ..loops.llvm import MEMORY_TYPES, print_llvm
from .base import I8, I32, KernelBuilder, KernelGroup, c64, dtype_reason, par_grain
from ..gemm.int8 import isa_for
from .int8_tiles import FAST_NOTE, Fast, Int8Job, Int8Lowering, emit_int8_tiles, param_reader, store_finished
from .qmatmul import fast_requantized, fast_scales, requantized

_INT8 = (DType.i8, DType.u8)
#: a 1x1 convolution takes the W x X path (``emit_transposed``) with this many pixels or more, or
#: fewer output channels than ``POINTWISE_MAX_CHANNELS``; else the im2col path, whose tiles waste
#: nothing on a small image. Measured one against the other on an AMD EPYC (Zen 4, VNNI), 2 threads:
#: 56x56 images 1.5-2.2x faster, 28x28 1.12x, 7x7 with 160 channels 1.35x; since VNNI reads the
#: input as the unsigned operand (no column sums), 14x14 with 1024 -> 256 channels 0.215 -> 0.200 ms
#: and 256 -> 1024 0.328 -> 0.274 (both lowerings in one process, interleaved), while 7x7 with
#: 512-2048 channels measured even (0.19-0.20 ms) or 5% slower (2048 -> 512). Also with fewer input
#: channels than ``POINTWISE_MAX_DEPTH`` (a short K, where the im2col path's separate pass over the
#: sums for the chain costs most): int8 MobileNetV2, whose 7x7 layers are 160 -> 960 and 320 -> 1280,
#: 4% faster (artifacts in one process, interleaved: median ratio of rounds 0.958 and 0.960)
POINTWISE_MIN_PIXELS, POINTWISE_MAX_CHANNELS, POINTWISE_MAX_DEPTH = 196, 256, 512
#: any other convolution takes the W x cols path when its pixels fill this much of 64-pixel panels
#: (the widest tile's), else the im2col path. Measured on the same machine, 2 threads, single
#: QLinearConv nodes, im2col -> W x cols: 3x3 on 56x56 with 64 channels 0.68 -> 0.38 ms, on 28x28
#: with 128 0.48 -> 0.39, stride 2 from 56x56 with 128 0.48 -> 0.39, ResNet's 7x7 stem 1.64 -> 0.73;
#: on 14x14 (196 pixels in 256 places) 0.37 -> 0.51
TRANSPOSED_MIN_FILL = 0.9
#: the im2col path reads an NHWC copy in place (``_emit_nhwc_taps``) for kernels of 2 to this many
#: taps (one tile loop per tap in the code) and channels a multiple of 4; measured against the im2col
#: (one process, interleaved): 3x3 on 14x14 with 256 channels 0.407 -> 0.374 ms, on 7x7 with 512
#: 0.358 -> 0.335, stride 2 from 28x28 even. A 1x1 keeps its im2col: of stride 2 it copies only the
#: pixels it reads (from 28x28 with 512 channels 0.46 ms, against 0.55 through a whole NHWC copy)
NHWC_MAX_TAPS = 9


def _geometry(n):
    """(N, C, H, W), (M, C/group, kh, kw), (OH, OW), strides, dilations, pad begins."""
    conv = n.op.conv()
    x, w = n.inputs[0], n.inputs[3] if isinstance(n.op, qn.QLinearConv) else n.inputs[1]
    strides, dilations, pads = cv.spatial_attrs(conv, 2, conv.strides, conv.dilations, conv.pads)
    out, pb, _ = cv.resolve_geometry(conv, [int(d) for d in x.shape[2:]], [int(d) for d in w.shape[2:]],
                                     strides, dilations, pads, conv.auto_pad)
    return ([int(d) for d in x.shape], [int(d) for d in w.shape], [int(d) for d in out], strides, dilations,
            [int(p) for p in pb])


def _padded_extent(n) -> tuple[int, int]:
    """The rows and columns of the input (its padding included) that the outputs read under every tap."""
    _, (_, _, KH, KW), (OH, OW), (sh, sw_), (dh, dw), _ = _geometry(n)
    return (OH - 1) * sh + (KH - 1) * dh + 1, (OW - 1) * sw_ + (KW - 1) * dw + 1


def _padding_reader(kf: KernelForm, x, zx, H: int, W: int, ph: int, pw: int):
    """(x's buffer in ``kf``, ``row(i)``: whether padded row i is inside x and its row there, let-bound,
    ``read(img, c, row, j)``: the input at padded (row, column j), x's zero point (0 without one) in
    the padding)."""
    xb = kf.buffer("x", x.type.dtype, (int(x.shape[0]), int(x.shape[1]), H, W), value=x)
    zb = kf.buffer("x_zero_point", zx.type.dtype, (1,), value=zx) if zx is not None else None
    pad = zb[(Const(0, INDEX),)] if zb is not None else Const(0, x.type.dtype)

    def row(i):
        ok_h, ihc = _inside(op("add", i, Const(-ph, INDEX)), 0, H)
        return kf.let(ok_h, name="okh"), kf.let(ihc, name="ih")

    def read(img, c, rw, j):
        ok_w, iwc = _inside(op("add", j, Const(-pw, INDEX)), 0, W)
        return select(op("and", rw[0], ok_w), xb[img, c, rw[1], iwc], pad)

    return xb, row, read


def _padded_copy(k, n, x, zx, nhwc: bool) -> ir.Value:
    """x with its padding (``_padded_extent``) written as its zero point, in scratch: NCHW, or NHWC
    (a pixel's channels adjacent)."""
    (N, C, H, W), _, _, _, _, (ph, pw) = _geometry(n)
    Hp, Wp = _padded_extent(n)
    dst = k.scratch(N * C * Hp * Wp)
    kf = KernelForm(f"{k.name}.{'nhwc' if nhwc else 'border'}")
    _, row, read = _padding_reader(kf, x, zx, H, W, ph, pw)
    out = kf.buffer("xp", x.type.dtype, (N, Hp, Wp, C) if nhwc else (N, C, Hp, Wp), "out", value=dst)
    outer, inner = (Hp, C) if nhwc else (C, Hp)  # the parallel loop: (image, row) or (image, channel)
    with kf.loop(N * outer, "parallel", grain=par_grain(Hp * Wp * C // max(outer, 1), 1 << 14), name="t") as t:
        img = kf.let(op("div", t, Const(outer, INDEX)), name="img")
        o = kf.let(op("rem", t, Const(outer, INDEX)), name="o")
        if nhwc:
            rw = row(o)
            with kf.loop(Wp, name="j") as j, kf.loop(C, "vector", name="c") as c:
                kf.store(out, (img, o, j, c), read(img, c, rw, j))
        else:
            with kf.loop(Hp, name="i") as i:
                rw = row(i)
                with kf.loop(Wp, "vector", name="j") as j:
                    kf.store(out, (img, o, i, j), read(img, o, rw, j))
    print_llvm(k, kf.finish())
    return dst


def _inside(i, lo: int, hi: int):
    """(i within [lo, hi), i clamped into it): reads stay in bounds, the select drops them."""
    ok = op("and", op("ge", i, Const(lo, INDEX)), op("lt", i, Const(hi, INDEX)))
    return ok, op("min", op("max", i, Const(lo, INDEX)), Const(hi - 1, INDEX))


class _IntegerConv(Int8Lowering):
    def operands(self, n):
        """(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B)."""
        raise NotImplementedError

    def finish_value(self, s, co, param, out: DType):
        return s

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        why = dtype_reason([x, zx, w, zw, zy], allowed=_INT8) or dtype_reason([sx, sw, sy], allowed=(DType.f32,)) \
            or dtype_reason([bias], allowed=(DType.i32,))
        if why:
            return why
        if x.type.rank != 4:
            return "only 2-D convolutions are lowered"
        if n.outputs[0].type.numel == 0:
            return "empty results are left to the Empty lowering"
        return self.form_reason(group)

    def param_specs(self, n, M: int) -> list:
        """(name, value, one per output channel?) of the op's scales, zero points and bias
        (``param_reader``): the weights' and the bias per channel, the others per tensor."""
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        return [(what, p, what in ("w_scale", "w_zero_point", "B") and p.type.rank == 1 and int(p.type.numel) == M)
                for what, p in (("x_scale", sx), ("x_zero_point", zx), ("w_scale", sw), ("w_zero_point", zw),
                                ("y_scale", sy), ("y_zero_point", zy), ("B", bias)) if p is not None]

    def finish_groups(self, node) -> list[tuple[int, ...]]:
        """Image, channel, pixel."""
        n_, m, oh, ow = (int(d) for d in node.outputs[0].shape)
        return [(n_,), (m,), (oh, ow)]

    def fast_finish(self, n, s, co, weight, out: DType) -> Fast | None:
        """A float32 way to ``finish_value`` (``int8_tiles.Fast``; ``weight``: the kernel's pointer to
        compile-time data), or None (the integer sums alone)."""
        return None

    def chain_reason(self, node) -> str | None:
        """Why the chain after this convolution's sums runs better as its own pass (None: computed
        on each finished sum): on the im2col path the tiles' rows are pixels, written to their NCHW
        places column by column, where the chain per element measured 1.1-2x slower than a
        separate vectorized pass over the sums (and, computed a tile row at a time into a buffer
        then copied column by column, as fast as the pass: int8 ResNet-50 14.2 vs 14.1 ms); on the
        W x X / W x cols path (a tile row is a run of pixels of one channel) 3-10% faster."""
        if node.op.group != 1 and self.depthwise_reason(node) is None:
            return "a depthwise convolution's output planes are finished alone: the chain is a pass of its own"
        if self._transposed(node):
            return None
        return "on the im2col path the sums are written column by column: the chain is a pass of its own"

    @staticmethod
    def _transposed(node) -> bool:
        """Whether the int8 tiles compute this convolution as W x cols (``emit_transposed``), not as
        an im2col and cols x W (``emit_im2col``)."""
        (_, C, H, W), (M, _, KH, KW), (OH, OW), (sh, sw_), _, (ph, pw) = _geometry(node)
        if (KH, KW, sh, sw_, ph, pw) == (1, 1, 1, 1, 0, 0):
            return H * W >= POINTWISE_MIN_PIXELS or M < POINTWISE_MAX_CHANNELS or C < POINTWISE_MAX_DEPTH
        P = OH * OW
        return P >= TRANSPOSED_MIN_FILL * -(-P // 64) * 64

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None, chain=None) -> Kernel:
        n = group.node
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        y = chain.final if chain is not None else n.outputs[0]
        (N, C, H, W), (M, CG, KH, KW), (OH, OW), (sh, sw_), (dh, dw), (ph, pw) = _geometry(n)
        groups = n.op.group  # (not C // CG: C may be 0)
        MG = M // groups
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, (N, C, H, W), value=x)
        wb = kf.buffer("w", w.type.dtype, (M, CG, KH, KW), value=w)
        yb = kf.buffer("y", y.type.dtype, (N, M, OH, OW), "out", value=y)
        acc = kf.buffer("acc", DType.i32, (N * M, OW), "scratch")
        param = param_reader(kf, self.param_specs(n, M))
        kf.note(f"{n.op.name} {KH}x{KW}, {groups} group(s): int32 sums per output row, then {y.type.dtype}")
        with kf.loop(N * M, "parallel", grain=par_grain(OH * OW * CG * KH * KW), name="nm") as nm:
            img = kf.let(op("div", nm, Const(M, INDEX)), name="img")
            co = kf.let(op("rem", nm, Const(M, INDEX)), name="co")
            c0 = kf.let(op("mul", op("div", co, Const(MG, INDEX)), Const(CG, INDEX)), name="c0")
            zx_ = param("x_zero_point", None, DType.i32)
            zw_ = param("w_zero_point", co, DType.i32)
            with kf.loop(OH, name="oh") as oh:
                with kf.loop(OW, "vector", name="ow") as ow:
                    kf.store(acc, (nm, ow), Const(0, DType.i32))
                with kf.loop(CG, name="ci") as ci, kf.loop(KH, name="r") as r:
                    ih = op("add", op("mul", oh, Const(sh, INDEX)), Const(-ph, INDEX))
                    ok_h, ihc = _inside(op("add", ih, op("mul", r, Const(dh, INDEX))), 0, H)
                    ok_h, ihc = kf.let(ok_h, name="okh"), kf.let(ihc, name="ih")
                    with kf.loop(KW, name="s") as s_:
                        wv = cast(wb[co, ci, r, s_], DType.i32)
                        wv = kf.let(wv if zw_ is None else op("sub", wv, zw_), name="wv")
                        with kf.loop(OW, "vector", name="ow") as ow:
                            iw = op("add", op("add", op("mul", ow, Const(sw_, INDEX)), Const(-pw, INDEX)),
                                    op("mul", s_, Const(dw, INDEX)))
                            ok_w, iwc = _inside(iw, 0, W)
                            xv = cast(xb[img, op("add", c0, ci), ihc, iwc], DType.i32)
                            xv = xv if zx_ is None else op("sub", xv, zx_)
                            xv = select(op("and", ok_h, ok_w), xv, Const(0, DType.i32))
                            kf.store(acc, (nm, ow), op("add", acc[nm, ow], op("mul", xv, wv)))
                with kf.loop(OW, "vector", name="ow") as ow:
                    v = self.finish_value(acc[nm, ow], co, param, n.outputs[0].type.dtype)
                    if chain is not None:
                        v = chain.expr(kf, v, [img, co, op("add", op("mul", oh, Const(OW, INDEX)), ow)])
                    kf.store(yb, (img, co, oh, ow), v)
        return kf.finish()

    # -- the int8 tiles (CPU) ---------------------------------------------------------------------
    def packed_reason(self, k: KernelBuilder, group: KernelGroup) -> str | None:
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(group.node)
        if isa_for(k.target) is None:
            return "the target has neither AVX-512 BW nor AVX2"
        if w.const is None or (zw is not None and zw.const is None):
            return "the weights or their zero point are not constant"
        if group.node.op.group != 1:
            why = self.depthwise_reason(group.node)
            return f"a grouped convolution ({why})" if why else None
        return None

    def depthwise_reason(self, n) -> str | None:
        """Why a grouped convolution does not take the float32 depthwise kernel on its integers
        (``emit_depthwise``), or None."""
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        if len(x.shape) != 4:
            return "not 2-D"
        (_, C, _, _), (M, CG, KH, KW), *_ = _geometry(n)
        if n.op.group != C or CG != 1 or C == 0 or M % C:
            return "not depthwise"
        if zx is not None and (zx.const is None or zx.const.size != 1):
            return "x's zero point is not one constant"
        if KH * KW * 255 * 255 >= 2 ** 24:
            return f"{KH}x{KW} taps: the sums could pass float32's exact integers"
        return None

    def emit_depthwise(self, k: KernelBuilder, group: KernelGroup) -> None:
        """A depthwise convolution by the float32 depthwise kernel (``Conv._depthwise``) on its
        integers: the input less its zero point and the weights less theirs are small integers in
        float32, and a sum of at most 258 of their products (each under 2^16) stays below 2^24, so
        every sum is exact whatever the order of the multiply-adds. Each output plane's sums are then
        finished as on the tiles (``finish_value``, its float32 way ``fast_finish``)."""
        from ...ir.graph import Graph
        from ...ir.types import TensorType
        from .conv import Conv
        from .qdepthwise import _row_function

        n = group.node
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        (N, C, H, W), (M, _, KH, KW), (OH, OW), (sh, sw_), (dh, dw), (ph, pw) = _geometry(n)
        y = n.outputs[0]
        zwv = zw.const.astype(np.float32).reshape(-1, 1) if zw is not None else np.float32(0)
        weights = np.ascontiguousarray((w.const.astype(np.float32).reshape(M, KH * KW) - zwv), np.float32)
        # the input less its zero point, as DequantizeLinear by a scale of 1 (exact) on a scratch graph
        g = Graph("dw_input")
        xi = g.add_input("x", TensorType(x.type.dtype, tuple(int(d) for d in x.shape)))
        d = g.add(qn.DequantizeLinear(), xi, g.add_constant(np.float32(1.0)),
                  g.add_constant(zx.const.reshape(()).copy() if zx is not None else np.zeros((), x.type.dtype.np)))
        loads: dict = {}

        def load(stride: int):
            if stride not in loads:
                loads[stride] = _row_function(k, f"{k.name}.x{stride}", [d.producer], xi, d, stride)
            return loads[stride]

        s_var, m_var = Var("s", DType.i32), Var("m", INDEX)
        out_t = MEMORY_TYPES[y.type.dtype]

        def store(plane, yrow, count, channel):  # the plane's sums finished into y
            b = k.b
            param = param_reader(KernelForm("finish"), self.param_specs(n, M), k.ptr)
            exact = self.finish_value(s_var, m_var, param, y.type.dtype)
            fast = self.fast_finish(n, s_var, m_var, k.weight, y.type.dtype)
            if fast is not None:
                k.note(FAST_NOTE)

            def env_of(c):
                s_ = b.fptosi(b.load(k.at(plane, c), typ=ir.FloatType()), I32)
                return {id(s_var): s_, id(m_var): channel}
            store_finished(k, count, exact, fast, env_of, lambda c, v: b.store(v, k.at(yrow, c, out_t)))

        k.note("depthwise in float32 on the integers (exact sums), each output plane finished as on the tiles")
        Conv()._depthwise(k, x, w, None, y, N, C, H, W, M // C, KH, KW, OH, OW, sh, sw_, dh, dw, ph, pw,
                          load=load, store=store, weights=weights)

    def emit_packed(self, k: KernelBuilder, group: KernelGroup, chain=None) -> None:
        k.chunks_per_thread = INT8_CHUNKS_PER_THREAD  # (the input's packing or copy too)
        if group.node.op.group != 1:
            return self.emit_depthwise(k, group)  # (no chain: ``chain_reason``)
        if self._transposed(group.node):
            return self.emit_transposed(k, group, chain)
        return self.emit_im2col(k, group)  # (no chain on this path: ``chain_reason``)

    def emit_transposed(self, k: KernelBuilder, group: KernelGroup, chain=None) -> None:
        """The convolution as the transposed product: per image ``Y[m, p] = W[m, :] . cols[:, p]``, the
        weights as A (rows: the output channels, read in place from a compile-time copy) and the
        input as B, packed at run time (``KPW`` values of k per word), so a tile's vectors are runs of
        pixels of one channel: NCHW rows, stored whole (no im2col transposing the input).

        A 1x1 convolution of stride 1 without padding packs the input itself into the tiles' panels
        (``NR`` pixels per word row, ``_pack_pointwise``). Any other shape packs, per word of k, the
        input under its taps for every output pixel, in pixel order (``_pack_taps``:
        [image, word, pixel, KPW], the tiles reading a panel's words a row of pixels apart); k runs
        over (r, s, channel) flattened, padded to whole words with weights equal to their zero point
        (a product of 0), the padding of the image written as x's zero point.

        With VNNI the dot products take the input (B) as their unsigned operand and the weights (A,
        broadcast) as the signed one (``swap``): the packer writes ``x' = x + 128`` for an int8 x (a
        uint8 x as is), the weights are ``w' = w - 128`` for uint8 weights (int8 as they are), and
        ``sum (x - zx)(w - zw) = sum x'w' - zw' colsum(x') - zx' (rowsum(w') - K zw')`` with ``zx' =
        zx + 128 [int8 x]``, ``zw' = zw - 128 [uint8 w]``: symmetric int8 weights (zw' = 0) need no
        column sums, and ``rowsum(w') - K zw'`` is a constant per channel. With ``vpmaddwd`` (16-bit
        values, the broadcast word widened unsigned) a signed W is read with its sign bit flipped
        (``a' = w + 128``) and the packer writes ``b' = x - 128`` for a uint8 x; with ``cw = -128
        [signed w] - zw[m]`` and ``cx = 128 [uint8 x] - zx``: ``sum (x - zx)(w - zw) = sum a'b' + cw
        colsum(b') + cx (rowsum(a') + K cw)``, the column sums from one more dot product per word
        (against ones). Either way ``cx`` comes from x's zero point, read at run time (int8-dynamic
        computes it per call)."""
        n = group.node
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        y = chain.final if chain is not None else n.outputs[0]
        (N, C, H, W), (M, _, KH, KW), (OH, OW), (sh, sw_), (dh, dw), (ph, pw) = _geometry(n)
        P = OH * OW
        isa = isa_for(k.target)
        tiling = Int8Tiling.for_shape(M, P, isa, narrow_last=True)
        MR, NR, kpw, lanes = tiling.MR, tiling.NR, tiling.KPW, isa.lanes
        panels = -(-P // NR)
        x_signed, w_signed = x.type.dtype is DType.i8, w.type.dtype is DType.i8
        elem = DType.i8 if kpw == 4 else DType.i16
        # VNNI: the activations are the dot products' unsigned operand, the weights the signed one
        # (``swap``): symmetric int8 weights need no column sums. Else both are shifted (see above).
        swap = kpw == 4
        shift = (-128 if x_signed else 0) if swap else (0 if x_signed else 128)
        zw_v = np.broadcast_to(zw.const.reshape(-1) if zw is not None else np.zeros(1), (M,)).astype(np.int64)
        one_by_one = (KH, KW, sh, sw_, ph, pw) == (1, 1, 1, 1, 0, 0)
        if one_by_one:  # A: the weights, [M, K] bytes; B: the input in the tiles' panels
            K = C
            KWD = -(-K // kpw)
            wm = np.ascontiguousarray(w.const.reshape(M, K))
            cols = k.scratch(N * panels * KWD * NR * 4)
            if KWD:
                self._pack_pointwise(k, x, cols, elem, (N, C, P), (panels, KWD, NR, kpw), shift)
            stride, per_image, per_panel = None, panels * KWD * NR, KWD * NR
        else:  # k over (tap, channel) flattened, padded to whole words with w = zw (adds 0)
            KC = KH * KW * C
            K = -(-KC // kpw) * kpw
            KWD = K // kpw
            wt = np.broadcast_to(zw_v.reshape(M, 1), (M, K)).astype(w.const.dtype)
            wt[:, :KC] = w.const.transpose(0, 2, 3, 1).reshape(M, KC)
            wm = np.ascontiguousarray(wt)
            Pp = panels * NR
            cols = k.scratch(N * KWD * Pp * 4)
            if KWD:
                self._pack_taps(k, n, x, zx, cols, elem, kpw, Pp, shift)
            stride, per_image, per_panel = Pp, KWD * Pp, NR
        if swap:  # cw = -zw', per channel rowsum(w') - K zw', cx = -zx' (see the docstring)
            wq = wm.astype(np.int64) - (0 if w_signed else 128)
            zwq = zw_v - (0 if w_signed else 128)
            cw, per_cx, wm = -zwq, wq.sum(axis=1) - K * zwq, wq.astype(np.int8)
        else:
            cw = (-128 if w_signed else 0) - zw_v
            # cx (x's zero point: known at run time with int8-dynamic) times a constant per channel
            per_cx = (wm.astype(np.int64) + (128 if w_signed else 0)).sum(axis=1) + K * cw
        colsum = not swap or bool(np.any(cw != 0))
        cw32, per_cx32 = cw.astype(np.int32), per_cx.astype(np.int32)  # |.| < 2^9 * K: far inside int32
        params = self.param_specs(n, M)
        k.note(f"{isa.describe} of {MR}x{NR}, " + ("1x1 as W x X" if one_by_one else f"{KH}x{KW} as W x cols")
               + f": {-(-M // MR)} channel blocks x {panels} panels x {N} image(s), K={K}, the input packed "
               "at run time")
        emitter = Int8Emitter(k.module, tiling)
        # the last panel, where its pixels need fewer vectors than a tile has (14x14: 196 = 3 x 64 + 4
        # pixels, the last panel one vector of 16 instead of 4), by a tile of that many
        nv_last = -(-(P - (panels - 1) * NR) // lanes)
        last = Int8Emitter(k.module, Int8Tiling(MR=MR, NV=nv_last, isa=isa)) if nv_last < tiling.NV else None
        vec = emitter.vec
        out_t = MEMORY_TYPES[y.type.dtype]
        s_var, m_var, j_var, img_var = Var("s", DType.i32), Var("m", INDEX), Var("j", INDEX), Var("img", INDEX)
        blocks = -(-M // MR)
        with k.parallel_for(N * panels * blocks, min_per_task=par_grain(2 * MR * NR * max(K, 1), 1 << 17)) as (lo, hi):
            b = k.b
            tile = k.f.alloca(I32, MR * NR, name="tile")
            finish = self.finish_value(s_var, m_var, param_reader(KernelForm("finish"), params, k.ptr),
                                       n.outputs[0].type.dtype)
            fast = self.fast_finish(n, s_var, m_var, k.weight, y.type.dtype) if chain is None else None
            if fast is not None:
                k.note(FAST_NOTE)
            if chain is not None:
                finish = chain.expr(KernelForm("chain"), finish, [img_var, m_var, j_var], k.ptr)
            ap, yp, panel = k.weight(wm), k.ptr(y), k.again(cols)
            cwp, cp = k.weight(cw32), k.weight(per_cx32)
            cx = ir.Constant(I32, (-128 if x_signed else 0) if swap else (0 if x_signed else 128))
            if zx is not None:  # cx = 128 [uint8 x] - zx; swapped: -zx' = -128 [int8 x] - zx
                z = b.load(k.at(k.ptr(zx), c64(0), I8), typ=I8)
                cx = b.sub(cx, b.sext(z, I32) if x_signed else b.zext(z, I32))
            cxv = emitter.splat(b, cx)
            with k.loop(b.sub(hi, lo), "t") as i:
                t = b.add(lo, i)
                mb, rest = b.urem(t, c64(blocks)), b.udiv(t, c64(blocks))
                pb, img = b.urem(rest, c64(panels)), b.udiv(rest, c64(panels))
                m0 = b.mul(mb, c64(MR))
                ms = [k.f.min(b.add(m0, c64(r)), c64(M - 1)) for r in range(MR)]
                rows = [k.at(ap, b.mul(m, c64(K)), I8) for m in ms]
                words = k.at(panel, b.add(b.mul(img, c64(per_image)), b.mul(pb, c64(per_panel))), I32)
                cwvs = [emitter.splat(b, b.load(k.at(cwp, m, I32), typ=I32)) for m in ms]
                cvs = [b.mul(cxv, emitter.splat(b, b.load(k.at(cp, m, I32), typ=I32))) for m in ms]

                def sums(em):  # the tile's corrected sums into ``tile``, by ``em``'s vectors
                    grid, _, colsums = em.tile(k.f, rows, K, w_signed and not swap, words, False,
                                               colsum=colsum, word_stride=stride or NR, swap=swap)
                    for r in range(MR):
                        for v in range(em.t.NV):
                            val = b.add(grid[r][v], cvs[r])
                            if colsum:
                                val = b.add(val, b.mul(cwvs[r], colsums[v]))
                            b.store(val, b.bitcast(k.at(tile, c64(r * NR + v * lanes), I32), vec.as_pointer()), align=4)

                if last is None:
                    sums(emitter)
                else:  # the last panel's pixels by as few vectors as they need
                    with k.f.if_else(b.icmp_unsigned("==", pb, c64(panels - 1)), "lastpanel") as (then, other):
                        with then:
                            sums(last)
                        with other:
                            sums(emitter)
                p0 = b.mul(pb, c64(NR))
                ncols = k.f.min(b.sub(c64(P), p0), c64(NR))
                for r in range(MR):
                    base = b.add(b.mul(b.add(b.mul(img, c64(M)), ms[r]), c64(P)), p0)

                    def env_of(cc, r=r):
                        s_ = b.load(k.at(tile, b.add(c64(r * NR), cc), I32), typ=I32)
                        return {id(s_var): s_, id(m_var): ms[r], id(img_var): img, id(j_var): b.add(p0, cc)}
                    with k.f.if_(b.icmp_signed("<", b.add(m0, c64(r)), c64(M))):
                        store_finished(k, ncols, finish, fast, env_of,
                                       lambda cc, v, base=base: b.store(v, k.at(yp, b.add(base, cc), out_t)))

    @staticmethod
    def _pack_taps(k, n, x, zx, cols, elem, kpw, Pp, shift):
        """The input under each tap into ``cols`` [N, words, Pp pixels, kpw values] less ``shift``:
        value j of word t is k = t * kpw + j of (tap, channel) flattened, ``KH * KW * C`` of them
        padded to whole words with 0 (their weights are their zero point). Words span taps where C
        is not a multiple of kpw: a stem's 3 channels under a 7x7 window make 148 values (37 words),
        not 49 taps of a word each (196). With padding, the image is first copied into scratch with
        a border of x's zero point, so that the pixels of an output row read a contiguous (stride
        1) or strided run of the input under every tap: vector loads, no selects."""
        (N, C, H, W), (_, _, KH, KW), (OH, OW), (sh, sw_), (dh, dw), (ph, pw) = _geometry(n)
        Hp, Wp = _padded_extent(n)
        KC = KH * KW * C
        words = -(-KC // kpw)
        src = x
        if (ph, pw) != (0, 0) or Hp > H or Wp > W:
            src, H, W = _padded_copy(k, n, x, zx, nhwc=False), Hp, Wp
        shift = Const(shift, DType.i32)
        kf = KernelForm(f"{k.name}.pack")
        xb = kf.buffer("x", x.type.dtype, (N, C, H, W), value=src)
        cb = kf.buffer("cols", elem, (N, words, Pp, kpw), "out", value=cols)
        with kf.loop(N * words, "parallel", grain=par_grain(OH * OW * kpw, 1 << 14), name="word") as t:
            img = kf.let(op("div", t, Const(words, INDEX)), name="img")
            wd = kf.let(op("rem", t, Const(words, INDEX)), name="wd")
            ks = [op("add", op("mul", wd, Const(kpw, INDEX)), Const(j, INDEX)) for j in range(kpw)]
            # (tap, channel) of each value; past KC (the last word's padding) clamped, then zeroed
            kc = [kf.let(kj if KC % kpw == 0 else op("min", kj, Const(KC - 1, INDEX)), name="k") for kj in ks]
            tap = [kf.let(op("div", x_, Const(C, INDEX)), name="tap") for x_ in kc]
            chans = [kf.let(op("rem", x_, Const(C, INDEX)), name="c") for x_ in kc]
            rs = [kf.let(op("div", tp, Const(KW, INDEX)), name="r") for tp in tap]
            ss = [kf.let(op("rem", tp, Const(KW, INDEX)), name="s") for tp in tap]
            with kf.loop(OH, name="oh") as oh:
                ihs = [kf.let(op("add", op("mul", oh, Const(sh, INDEX)), op("mul", r, Const(dh, INDEX))), name="ih")
                       for r in rs]
                with kf.loop(OW, "vector", name="ow") as ow:
                    p = op("add", op("mul", oh, Const(OW, INDEX)), ow)
                    for j in range(kpw):
                        iw = op("add", op("mul", ow, Const(sw_, INDEX)), op("mul", ss[j], Const(dw, INDEX)))
                        v = op("sub", cast(xb[img, chans[j], ihs[j], iw], DType.i32), shift)
                        if KC % kpw:
                            v = select(op("lt", ks[j], Const(KC, INDEX)), v, Const(0, DType.i32))
                        kf.store(cb, (img, wd, p, Const(j, INDEX)), cast(v, elem))
        print_llvm(k, kf.finish())

    @staticmethod
    def _pack_pointwise(k, x, cols, elem, xshape, layout, shift):
        """The input [N, C, P] into the panels [N, panels, words, NR pixels, kpw channels] less
        ``shift``, 0 past the last channel and pixel. Whole panels read runs of NR pixels
        (the vector loop, the word's kpw channels unrolled in it: an interleaved store); the last,
        partial panel of each image clamps its reads."""
        N, C, P = xshape
        panels, KWD, NR, kpw = layout
        whole = P // NR
        shift = Const(shift, DType.i32)

        def words(kf, img, pb, pn, tail):
            xb = kf.buffer("x", x.type.dtype, (N, C, P), value=x)
            cb = kf.buffer("cols", elem, (N * panels, KWD, NR, kpw), "out", value=cols)
            with kf.loop(KWD, name="kw") as kw:
                chans = [kf.let(op("add", op("mul", kw, Const(kpw, INDEX)), Const(j, INDEX)), name="c")
                         for j in range(kpw)]
                with kf.loop(NR, "vector", name="pi") as pi:
                    p = op("add", op("mul", pb, Const(NR, INDEX)), pi)
                    if tail:
                        p = kf.let(p, name="p")
                    for j, c in enumerate(chans):
                        cc = c if C % kpw == 0 else op("min", c, Const(C - 1, INDEX))
                        v = op("sub", cast(xb[img, cc, op("min", p, Const(P - 1, INDEX)) if tail else p],
                                           DType.i32), shift)
                        ok = None if C % kpw == 0 else op("lt", c, Const(C, INDEX))
                        if tail:
                            inside = op("lt", p, Const(P, INDEX))
                            ok = inside if ok is None else op("and", ok, inside)
                        kf.store(cb, (pn, kw, pi, Const(j, INDEX)),
                                 cast(v if ok is None else select(ok, v, Const(0, DType.i32)), elem))

        if whole:
            kf = KernelForm(f"{k.name}.pack")
            with kf.loop(N * whole, "parallel", grain=par_grain(KWD * NR * kpw, 1 << 15), name="panel") as t:
                img = kf.let(op("div", t, Const(whole, INDEX)), name="img")
                pb = kf.let(op("rem", t, Const(whole, INDEX)), name="pb")
                words(kf, img, pb, kf.let(op("add", op("mul", img, Const(panels, INDEX)), pb), name="pn"), False)
            print_llvm(k, kf.finish())
        if P % NR:
            kf = KernelForm(f"{k.name}.pack_tail")
            with kf.loop(N, "parallel", name="img") as img:
                pb = Const(whole, INDEX)
                words(kf, img, pb, kf.let(op("add", op("mul", img, Const(panels, INDEX)), pb), name="pn"), True)
            print_llvm(k, kf.finish())

    def emit_im2col(self, k: KernelBuilder, group: KernelGroup) -> None:
        n = group.node
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        (N, C, H, W), (M, _, KH, KW), (OH, OW), (sh, sw_), (dh, dw), (ph, pw) = _geometry(n)
        P, K = OH * OW, C * KH * KW
        y = n.outputs[0]
        job = dict(R=N * P, K=K, N=M, weights_zero_point=zw.const if zw is not None else 0,
                   a_signed=x.type.dtype is DType.i8, a_zero_point=zx, a_zero_point_per_row=False,
                   params=self.param_specs(n, M), out=y,
                   finish=lambda s, m, j, param: self.finish_value(s, j, param, y.type.dtype),
                   fast=lambda s, m, j, weight: self.fast_finish(n, s, j, weight, y.type.dtype),
                   # row m is (image, pixel): its NCHW place, the channels P apart
                   out_row=lambda b, m: b.add(b.mul(b.udiv(m, c64(P)), c64(M * P)), b.urem(m, c64(P))),
                   col_stride=P)
        if C and C % 4 == 0 and 1 < KH * KW <= NHWC_MAX_TAPS:
            return self._emit_nhwc_taps(k, n, x, zx, w, job)
        cols = k.scratch(N * P * K)
        # im2col: row (image, pixel), column (channel, tap); outside the image: x's zero point
        kf = KernelForm(f"{k.name}.im2col")
        xb = kf.buffer("x", x.type.dtype, (N, C, H, W), value=x)
        cb = kf.buffer("cols", x.type.dtype, (N * OH, OW, C, KH, KW), "out", value=cols)
        zb = kf.buffer("x_zero_point", zx.type.dtype, (1,), value=zx) if zx is not None else None
        with kf.loop(N * OH, "parallel", grain=par_grain(OW * K, 1 << 15), name="row") as row:
            img = kf.let(op("div", row, Const(OH, INDEX)), name="img")
            oh = kf.let(op("rem", row, Const(OH, INDEX)), name="oh")
            with kf.loop(OW, name="ow") as ow, kf.loop(C, name="c") as c, kf.loop(KH, name="r") as r:
                ok_h, ihc = _inside(op("add", op("add", op("mul", oh, Const(sh, INDEX)), Const(-ph, INDEX)),
                                       op("mul", r, Const(dh, INDEX))), 0, H)
                with kf.loop(KW, "vector", name="s") as s_:
                    ok_w, iwc = _inside(op("add", op("add", op("mul", ow, Const(sw_, INDEX)), Const(-pw, INDEX)),
                                           op("mul", s_, Const(dw, INDEX))), 0, W)
                    pad = zb[(Const(0, INDEX),)] if zb is not None else Const(0, x.type.dtype)
                    kf.store(cb, (row, ow, c, r, s_), select(op("and", ok_h, ok_w), xb[img, c, ihc, iwc], pad))
        print_llvm(k, kf.finish())
        emit_int8_tiles(k, Int8Job(weights=w.const.reshape(M, K).T, rows=lambda: k.here(cols), **job))

    @staticmethod
    def _emit_nhwc_taps(k, n, x, zx, w, job) -> None:
        """The im2col path without the im2col: the input copied once into scratch as NHWC with a
        border of its zero point (C bytes per pixel, not C * kh * kw), k ordered (tap, channel), and
        each tap's rows of the tiles read in place there (a pixel's C channels under the tap are
        contiguous), the taps' tile loops adding into the same sums."""
        (N, C, H, W), (M, _, KH, KW), (OH, OW), (sh, sw_), (dh, dw), (ph, pw) = _geometry(n)
        Hp, Wp = _padded_extent(n)
        P = OH * OW
        nhwc = _padded_copy(k, n, x, zx, nhwc=True)
        k.note(f"NHWC copy, {KH * KW} tap(s) read in place (no im2col)")

        def tap_rows(b, base, m, tap):  # row m = (image, pixel) under tap (r, s)
            img, p = b.udiv(m, c64(P)), b.urem(m, c64(P))
            oh, ow = b.udiv(p, c64(OW)), b.urem(p, c64(OW))
            r, s_ = divmod(tap, KW)
            ih = b.add(b.mul(oh, c64(sh)), c64(r * dh))
            iw = b.add(b.mul(ow, c64(sw_)), c64(s_ * dw))
            at = b.add(b.mul(b.add(b.mul(img, c64(Hp)), ih), c64(Wp)), iw)
            return k.at(base, b.mul(at, c64(C)), I8)

        emit_int8_tiles(k, Int8Job(weights=np.ascontiguousarray(w.const.transpose(2, 3, 1, 0).reshape(KH * KW * C, M)),
                                   rows=lambda: k.here(nhwc), taps=KH * KW, tap_rows=tap_rows, **job))


class ConvInteger(_IntegerConv):
    ops = (qn.ConvInteger,)

    def operands(self, n):
        x, w, zx, zw = (list(n.inputs) + [None, None])[:4]
        return x, None, zx, w, None, zw, None, None, None


class QLinearConv(_IntegerConv):
    ops = (qn.QLinearConv,)

    def operands(self, n):
        x, sx, zx, w, sw, zw, sy, zy, bias = (list(n.inputs) + [None])[:9]
        return x, sx, zx, w, sw, zw, sy, zy, bias

    def finish_value(self, s, co, param, out: DType):
        f = DType.f64
        acc = cast(s, f)
        b = param("B", co, f)
        if b is not None:
            acc = op("add", acc, b)
        real = op("div", op("mul", acc, op("mul", param("x_scale", None, f), param("w_scale", co, f))),
                  param("y_scale", None, f))
        return requantized(real, param("y_zero_point", None, f), out)

    def fast_finish(self, n, s, co, weight, out: DType) -> Fast | None:
        """``finish_value``'s values from float32 (``Fast``), where the scales, zero point and bias are
        constants and the sums plus the bias stay inside int32; else None."""
        x, sx, zx, w, sw, zw, sy, zy, bias = self.operands(n)
        if out not in _INT8 or sx.const is None or sw.const is None:
            return None
        M, CG, KH, KW = (int(d) for d in w.shape)
        scale = float(sx.const.reshape(-1)[0]) * np.broadcast_to(sw.const.astype(np.float64).reshape(-1), (M,))
        got = fast_scales(CG * KH * KW * 255 * 255, bias, scale, sy, zy)
        if got is None:
            return None
        b, mult, zp = got
        kf = KernelForm("fast")
        mb = kf.buffer("mult", DType.f32, (M,), value=weight(mult))
        bb = kf.buffer("bias", DType.i32, (M,), value=weight(b)) if b is not None else None
        return fast_requantized(s, bb[(co,)] if bb is not None else None, mb[(co,)], zp, out)


LOWERINGS = (ConvInteger(), QLinearConv())

__all__ = ["ConvInteger", "LOWERINGS", "QLinearConv"]
