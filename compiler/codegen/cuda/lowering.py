"""How a kernel group becomes GPU launches: ``cuda_launches(group, low, binder)``.

The group's CPU lowering (``kernels.lowering_for``) decides what the group is; the GPU runs:

* a loop-form lowering's kernel (elementwise chains, reductions, normalization, Softmax, data
  movement, the portable int8 kernels, ...) printed by the numba.cuda printer (``loops/cuda.py``):
  the same kernel the CPU runs, printed for another machine;
* Gemm and MatMul as Kiln's tiled CUDA GEMM (``gemm.py``), batch dimensions broadcast through
  per-batch offset tables, Gemm's C as the GEMM's bias;
* MaxPool and AveragePool (float32) with a thread per output element (``conv.pool_form``);
* Softmax and LayerNormalization (float32, trailing axes) with a block of threads per row
  (``rows.py``; the loop form gives a row to one thread);
* an attention group (``MatMul -> scale, mask -> Softmax -> MatMul``, the head transposes as strides)
  as one launch, a block per query rows of a head with the scores in shared memory (``attention.py``);
* Conv (2-D, float32): one group as the GEMM on the image itself (1x1, stride 1, no padding) or on a
  column matrix (``conv.im2col_form``) in the step's scratch memory, the bias in the GEMM; grouped
  and depthwise convolutions as ``conv.direct_form``;
* an epilogue group (a GEMM or convolution and the elementwise chain after it): the anchor writes
  into the final result's buffer and the chain runs over it in place, a second launch; a chain that
  is one ReLU runs inside the GEMM (``act``), one launch.

Anything else raises ``NoCuda`` with the reason; the program builder then runs the group on the host
in the reference interpreter (the CPU fallback, reported as such).

A launch refers to memory through the step's slots (``StepBinder``): a group value, compile-time
data (weights, offset tables) or the step's scratch memory; the memory plan places each slot.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from ...ir.graph import Value
from ...ir.ops import conv as cv
from ...ir.ops import elementwise as ew
from ...ir.ops import linalg as la
from ...ir.types import DType, TensorType
from ..kernels import EMPTY, KernelGroup
from ..kernels.attention import Attention
from ..kernels.base import Slot
from ..kernels.conv import Conv
from ..kernels.elementwise import Elementwise
from ..kernels.epilogue import Epilogue
from ..kernels.linalg import Gemm, MatMul
from ..kernels.norm import LayerNorm, Softmax
from ..kernels.pool import Pool
from ..loops.cuda import PRELUDE, print_cuda
from ..loops import Kernel, KernelForm
from ..loops.expr import Const, FormError, op
from . import conv as cconv
from .gemm import GemmCall, choose_tile, grid, split_k

#: threads per block of a loop-form kernel, and the most blocks (the parallel loop is grid-stride)
FORM_THREADS = 256
FORM_MAX_BLOCKS = 8192


class NoCuda(Exception):
    """The group has no GPU kernel (the message says why)."""


@dataclass
class Arg:
    """An array argument of a launch: slot ``slot`` of the step seen as ``count`` elements of ``dtype``."""

    slot: int
    dtype: str
    count: int


@dataclass
class Launch:
    """One kernel launch: the kernel's name in the program's module, its array and scalar arguments
    ((type name, value) pairs), the grid, and whether it reports bad input data (a status array
    after its sizes)."""

    kernel: str
    args: list[Arg]
    scalars: list = field(default_factory=list)
    blocks: tuple = (1,)
    threads: tuple = (FORM_THREADS,)
    status: bool = False
    notes: list = field(default_factory=list)


@dataclass(eq=False)
class Scratch:
    """A region of the step's scratch memory that two launches share (bound as a form buffer's value)."""

    nbytes: int
    slot: int = -1


class StepBinder:
    """The slots of one step (``kernels.base.Slot``, placed by ``places.MemoryPlan``) and the kernel
    sources its launches need (name -> source, one per distinct kernel)."""

    def __init__(self, group: KernelGroup, sources: dict[str, str]):
        self.group, self.sources = group, sources
        self.slots: list[Slot] = []
        self.scratch_bytes = 0
        self._index: dict[int, int] = {}
        self._share: dict[int, Value] = {}

    def share(self, value: Value, with_value: Value) -> None:
        """``value`` (computed inside the group) lives in ``with_value``'s buffer."""
        self._share[id(value)] = with_value

    def value(self, v: Value) -> int:
        while id(v) in self._share:
            v = self._share[id(v)]
        v = self.group.outer_of(v)
        if id(v) not in self._index:
            self._index[id(v)] = len(self.slots)
            self.slots.append(Slot("value", value=v))
        return self._index[id(v)]

    def weight(self, array: np.ndarray) -> int:
        if id(array) not in self._index:
            self._index[id(array)] = len(self.slots)
            self.slots.append(Slot("weight", array=np.ascontiguousarray(array)))
        return self._index[id(array)]

    def scratch(self, s: Scratch) -> int:
        if s.slot < 0:
            off = self.scratch_bytes
            self.scratch_bytes += -(-max(s.nbytes, 1) // 64) * 64
            self.slots.append(Slot("scratch", offset=off))
            s.slot = len(self.slots) - 1
        return s.slot

    def arg(self, bound, dtype: DType | np.dtype, count: int | None = None) -> Arg:
        """The argument for what a buffer is bound to (a value, an array, a ``Scratch``)."""
        np_dt = np.dtype(dtype.np if isinstance(dtype, DType) else dtype)
        if isinstance(bound, Scratch):
            return Arg(self.scratch(bound), np_dt.str, count if count is not None else bound.nbytes // np_dt.itemsize)
        if isinstance(bound, np.ndarray):
            return Arg(self.weight(bound), np_dt.str, count if count is not None else bound.nbytes // np_dt.itemsize)
        nbytes = bound.type.nbytes or 0
        return Arg(self.value(bound), np_dt.str, count if count is not None else nbytes // np_dt.itemsize)

    # -- launches --------------------------------------------------------------------------------
    def form(self, kernel) -> Launch:
        """A loop-form kernel as a launch (its source added under a name from its text)."""
        if kernel.sizes:
            raise NoCuda(f"kernel {kernel.name} takes run-time sizes")
        try:
            cu = print_cuda(kernel)
        except FormError as e:
            raise NoCuda(str(e)) from None
        body = cu.source[len(PRELUDE.strip("\n")):].lstrip("\n")
        name = "k_" + hashlib.sha256(body.encode()).hexdigest()[:16]
        self.sources.setdefault(name, body.replace(f"def {cu.name}(", f"def {name}(", 1))
        args = [self.arg(b.value if b.role != "scratch" else Scratch(b.extent * np.dtype(b.dtype.np).itemsize),
                         b.dtype, max(b.extent, 1) if b.role == "scratch" else None) for b in cu.buffers]
        blocks = max(1, min(-(-cu.parallel // FORM_THREADS), FORM_MAX_BLOCKS)) if cu.parallel else 1
        return Launch(name, args, [], (blocks,), (FORM_THREADS if cu.parallel else 1,), cu.checks,
                      list(kernel.notes))

    def gemm(self, call: GemmCall, a, b, c, bias=None) -> list[Launch]:
        """The launches of a GEMM; ``a``, ``b``, ``c``, ``bias``: what each operand is bound to. A
        product with too few blocks for the GPU is split along K (``gemm.split_k``): the slices as a
        batch into scratch, then a loop-form kernel adding them with the bias and activation."""
        slices = split_k(call)
        if slices == 1:
            return [self._gemm(call, a, b, c, bias)]
        M, N, K = call.M, call.N, call.K // slices
        part = Scratch(slices * M * N * 4)
        sliced = GemmCall(M, N, K, call.a_strides, call.b_strides, (N, 1),
                          call.a_offsets + np.arange(slices, dtype=np.int64) * K * call.a_strides[1],
                          call.b_offsets + np.arange(slices, dtype=np.int64) * K * call.b_strides[0],
                          np.arange(slices, dtype=np.int64) * M * N, alpha=call.alpha)
        first = self._gemm(sliced, a, b, part)
        first.notes = [f"split K in {slices}: " + first.notes[0]]
        return [first, self.form(_sum_slices(call, slices, part, c, bias))]

    def rows(self, node) -> Launch:
        """Softmax or LayerNormalization over trailing axes: a block of threads per row (``rows.py``)."""
        from ...ir.ops import norm as nm
        from .rows import THREADS, layernorm_source, softmax_source

        x, y = node.inputs[0], node.outputs[0]
        rank = x.type.rank
        a = node.op.axis % rank
        L = math.prod(int(d) for d in x.shape[a:])
        R = x.type.numel // L
        blocks = (max(1, min(R, 65535)),)
        if isinstance(node.op, nm.Softmax):
            self.sources.setdefault("kiln_softmax_rows", softmax_source())
            return Launch("kiln_softmax_rows", [self.arg(x, DType.f32), self.arg(y, DType.f32)],
                          [("int64", R), ("int64", L)], blocks, (THREADS,), False,
                          [f"Softmax: a block of {THREADS} threads per row ({R} rows of {L})"])
        self.sources.setdefault("kiln_layernorm_rows", layernorm_source())
        scale, bias = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
        args = [self.arg(x, DType.f32), self.arg(scale, DType.f32),
                self.arg(bias if bias is not None else np.zeros(1, np.float32), DType.f32), self.arg(y, DType.f32)]
        return Launch("kiln_layernorm_rows", args, [("int64", R), ("int64", L), ("float32", float(node.op.epsilon)),
                                                    ("int64", int(bias is not None))], blocks, (THREADS,), False,
                      [f"LayerNormalization: a block of {THREADS} threads per row ({R} rows of {L})"])

    def _gemm(self, call: GemmCall, a, b, c, bias=None) -> Launch:
        from .gemm import gemm_source

        tile = choose_tile(call.M, call.N, call.batch)
        name = f"kiln_sgemm_{tile}"
        self.sources.setdefault(name, gemm_source(tile))
        bias_arg = self.arg(bias, DType.f32) if bias is not None else self.arg(np.zeros(1, np.float32), DType.f32)
        args = [self.arg(a, DType.f32), self.arg(b, DType.f32), self.arg(c, DType.f32), bias_arg,
                self.arg(call.a_offsets, np.int64), self.arg(call.b_offsets, np.int64),
                self.arg(call.c_offsets, np.int64)]
        blocks, threads = grid(call, tile)
        scalars = [(type(s).__name__, s.item()) for s in call.scalars()]
        act = " + ReLU" if call.act else ""
        note = f"GEMM kernel {tile} ({call.batch} x {call.M}x{call.N}x{call.K}){act}"
        return Launch(name, args, scalars, blocks, threads, False, [note])


def _rows_reason(node) -> str | None:
    """Why a Softmax or LayerNormalization is not a row kernel's (None: it is): float32, the trailing
    axes, LayerNorm's scale and bias over the whole normalized shape, its other results unused."""
    from ...ir.ops import norm as nm

    x, y = node.inputs[0], node.outputs[0]
    why = _static_f32([x, y])
    if why:
        return why
    rank = x.type.rank
    a = node.op.axis % rank if rank else 0
    if isinstance(node.op, nm.Softmax):
        return None if a == rank - 1 and x.type.numel else "not along the last axis"
    if isinstance(node.op, nm.LayerNormalization):
        if any(v.uses for v in node.outputs[1:]) or getattr(node.op, "stash_type", 1) != 1:
            return "Mean/InvStdDev used, or statistics in float64"
        trailing = tuple(int(d) for d in x.shape[a:])
        params = [v for v in node.inputs[1:] if v is not None]
        if any(_static_f32([v]) or tuple(int(d) for d in v.shape) != trailing for v in params):
            return "a scale or bias that broadcasts"
        return None if x.type.numel else "empty"
    return "not a row op"


def _sum_slices(call: GemmCall, slices: int, part: Scratch, c, bias) -> Kernel:
    """``c[m, n] = act(sum_z part[z, m, n] + beta * bias[m, n])``, a thread per element of C."""
    kf = KernelForm("splitk")
    M, N = call.M, call.N
    pb = kf.buffer("part", DType.f32, (slices, M, N), value=part)
    cb = kf.buffer("c", DType.f32, (M, N), "out", strides=call.c_strides, value=c)
    bb = kf.buffer("bias", DType.f32, (M, N), strides=call.bias_strides, value=bias) \
        if bias is not None and call.beta != 0.0 else None
    kf.note(f"the {slices} slices of K added" + (", the bias" if bb is not None else "") +
            (", ReLU" if call.act else ""))
    with kf.loop(M, "parallel") as m, kf.loop(N) as n:
        acc = kf.acc(Const(0.0, DType.f32))
        with kf.loop(slices) as z:
            kf.update(acc, "add", pb[z, m, n])
        v = acc if bb is None else op("add", acc, op("mul", Const(float(call.beta), DType.f32), bb[m, n]))
        if call.act:
            v = op("max", v, Const(0.0, DType.f32))
        kf.store(cb, (m, n), v)
    return kf.finish()


def _static_f32(values) -> str | None:
    for v in values:
        if v is None:
            continue
        if not isinstance(v.type, TensorType) or not v.type.is_static:
            return f"{v} is not a tensor of static shape"
        if v.type.dtype is not DType.f32:
            return f"{v.type.dtype.name} operands: the CUDA GEMM and convolution take float32"
    return None


def _matmul(node, binder: StepBinder, out: Value, act: int) -> list[Launch]:
    a, b = node.inputs[0], node.inputs[1]
    why = _static_f32([a, b, out])
    if why:
        raise NoCuda(why)
    ash, bsh = [int(d) for d in a.shape], [int(d) for d in b.shape]
    if not ash or not bsh:
        raise NoCuda("MatMul of a scalar")
    if len(ash) == 1:
        ash = [1] + ash
    if len(bsh) == 1:
        bsh = bsh + [1]
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = np.broadcast_shapes(tuple(ash[:-2]), tuple(bsh[:-2]))
    count = math.prod(batch)
    if M * N * count == 0:
        raise NoCuda("an empty product")

    def offsets(shape, size):
        idx = np.arange(math.prod(shape), dtype=np.int64).reshape(shape) if shape else np.zeros((), np.int64)
        return np.ascontiguousarray(np.broadcast_to(idx, batch).reshape(-1) * size)

    call = GemmCall(M, N, K, (K, 1), (N, 1), (N, 1), offsets(tuple(ash[:-2]), M * K),
                    offsets(tuple(bsh[:-2]), K * N), np.arange(count, dtype=np.int64) * (M * N), act=act)
    return binder.gemm(call, a, b, out)


def _gemm(node, binder: StepBinder, out: Value, act: int) -> list[Launch]:
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    why = _static_f32([a, b, c, out])
    if why:
        raise NoCuda(why)
    M, N = (int(d) for d in out.shape)
    ash = [int(d) for d in a.shape]
    K = ash[0] if node.op.transA else ash[1]
    sa = (1, M) if node.op.transA else (K, 1)
    sb = (1, K) if node.op.transB else (N, 1)
    beta, bstr = 0.0, (0, 0)
    if c is not None and node.op.beta != 0.0:
        cs = [int(d) for d in c.shape]
        full = [1] * (2 - len(cs)) + cs
        dense = (full[1], 1)
        bstr = (dense[0] if full[0] != 1 else 0, 1 if full[1] != 1 else 0)
        beta = float(node.op.beta)
    call = GemmCall(M, N, K, sa, sb, (N, 1), alpha=float(node.op.alpha), beta=beta, bias_strides=bstr, act=act)
    return binder.gemm(call, a, b, out, c if beta != 0.0 else None)


def _conv(node, binder: StepBinder, out: Value, act: int) -> list[Launch]:
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    why = _static_f32([x, w, bias, out])
    if why:
        raise NoCuda(why)
    if len(x.shape) != 4:
        raise NoCuda(f"only 2-D convolutions run on the GPU, not {len(x.shape) - 2}-D")
    g = cconv.geometry(node)
    if min(g.N, g.C, g.M, g.OH, g.OW) == 0:
        raise NoCuda("an empty convolution")
    if g.groups != 1:
        if act:
            raise NoCuda("a grouped convolution takes no fused activation")  # (not asked for: see _epilogue)
        return [binder.form(cconv.direct_form(g, "conv", x, w, out, bias))]
    K, P = g.K, g.P
    launches = []
    if g.pointwise:
        src, sb = x, np.arange(g.N, dtype=np.int64) * (g.C * P)
    else:
        src = Scratch(g.N * K * P * 4)
        launches.append(binder.form(cconv.im2col_form(g, "im2col", x, src)))
        sb = np.arange(g.N, dtype=np.int64) * (K * P)
    call = GemmCall(g.M, P, K, (K, 1), (P, 1), (P, 1), np.zeros(g.N, np.int64), sb,
                    np.arange(g.N, dtype=np.int64) * (g.M * P), beta=1.0 if bias is not None else 0.0,
                    bias_strides=(1, 0), act=act)
    launches += binder.gemm(call, w, src, out, bias)
    return launches


_ANCHORS = {la.MatMul: _matmul, la.Gemm: _gemm, cv.Conv: _conv}


def cuda_launches(group: KernelGroup, low, binder: StepBinder) -> list[Launch]:
    """The launches computing ``group`` (lowered on the CPU by ``low``); ``NoCuda`` when there are none."""
    if low is EMPTY:
        return []
    if isinstance(low, (Gemm, MatMul, Conv)):
        n = group.node
        return _ANCHORS[type(n.op)](n, binder, n.outputs[0], 0)
    if isinstance(low, Epilogue):
        return _epilogue(group, low, binder)
    if isinstance(low, Attention):
        from .attention import attention_launch, reason

        why = reason(group)
        if why:
            raise NoCuda(why)
        return [attention_launch(group, binder)]
    if isinstance(low, Pool) and group.node.inputs[0].type.dtype is DType.f32:
        return [binder.form(cconv.pool_form(group.node, "pool"))]
    if isinstance(low, (Softmax, LayerNorm)) and _rows_reason(group.node) is None:
        return [binder.rows(group.node)]
    if hasattr(low, "form"):
        try:
            kernel = low.form(group, "k")
        except (FormError, ValueError) as e:
            raise NoCuda(str(e)) from None
        return [binder.form(kernel)]
    raise NoCuda(f"no CUDA kernel for a {type(low).__name__} group")


def _epilogue(group: KernelGroup, low: Epilogue, binder: StepBinder) -> list[Launch]:
    anchor_low, pro, head, tail, a_out = low._parts(group)
    if pro:
        raise NoCuda("a prologue (the chain before a convolution) is not fused on the GPU")
    anchor = head.node
    make = _ANCHORS.get(type(anchor.op))
    if make is None and hasattr(anchor_low, "form"):  # a loop-form anchor (ConvTranspose) writes its result
        def make(node, binder, out, act):
            if act:
                raise NoCuda("(a loop-form anchor takes no activation)")
            return [binder.form(anchor_low.form(head, "anchor"))]
    if make is None:
        raise NoCuda(f"{anchor.op.name} takes no epilogue on the GPU")
    own = any(v is a_out for v in group.outputs)
    final = group.nodes[-1].outputs[0]
    if tail is not None and len(tail.nodes) == 1 and isinstance(tail.nodes[0].op, ew.Relu) and not own \
            and type(anchor.op) in _ANCHORS and not (isinstance(anchor.op, cv.Conv) and anchor.op.group != 1):
        return make(anchor, binder, final, 1)  # the ReLU inside the GEMM
    if tail is None:
        return make(anchor, binder, a_out, 0)
    chain = Elementwise()
    in_place = {}
    if not own and any(v is final for v in tail.outputs):
        binder.share(a_out, final)
        in_place = {list(tail.outputs).index(final): list(tail.inputs).index(a_out)}
    launches = make(anchor, binder, a_out, 0)
    try:
        kernel = chain.form(tail, "k", in_place)
    except (FormError, ValueError) as e:
        raise NoCuda(str(e)) from None
    return launches + [binder.form(kernel)]


__all__ = ["Arg", "FORM_THREADS", "Launch", "NoCuda", "Scratch", "StepBinder", "cuda_launches"]
