"""Attention as one kernel: ``MatMul -> (scale, mask) -> Softmax -> MatMul``, with the head
Transposes around it read and written as strides (no copies).

The fusion pass makes these groups (``kiln.Kernel`` of kind ``attention``, ``fuse.py``)::

    Q' = Transpose(Q)?   K' = Transpose(K)?   V' = Transpose(V)?
    S  = MatMul(Q', K')  ->  elementwise chain on S (Div/Mul by a scale, Add of a mask, ...)
    P  = Softmax(S, axis=-1)
    O  = MatMul(P, V')   ->  Transpose(O)?

For each batch index t of the output (batch x heads) the kernel runs, on one thread when the
indices are enough tasks for the pool (``linalg.gemm_loop``):

1. ``S_t = Q'_t @ K'_t`` into scratch (``m x n`` floats, L2-resident for BERT's 128 x 128), with the
   chain applied to each block of ``S_t`` inside the GEMM (``tile_epilogue``);
2. Softmax over each row of ``S_t``, in place;
3. ``O_t = S_t @ V'_t``, written straight into the result.

An operand computed by a chain of data movements with a repetition in it (grouped-query attention's
key/value heads repeated for their query heads: Reshape, Tile or Expand, Reshape, Transpose) is read
in place too: the movements are run at compile time on the source's element indices (``_moved``),
and each batch index's matrix must lie at one pair of strides, the repetition becoming the offset
table (query head h reads key/value head h // rep).

A Transposed operand is a matrix of its source at strides: its columns contiguous (``lda`` is the
stride of its rows) or its rows contiguous (the GEMM reads it transposed), and each batch index at an
offset from a compile-time table. So the head split (``Transpose(Reshape(x), [0, 2, 1, 3])``) and the
key transpose (``[0, 2, 3, 1]``) read the projections in place, and the head merge after the second
MatMul writes each head's columns of the merged result. Neither S nor P ever reaches the arena.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ...ir.graph import Node, Value
from ...ir.ops import elementwise as ew
from ...ir.ops import linalg as la
from ...ir.ops import norm as nm
from ...ir.ops import shape as sh
from ...ir.ops import tensor as tn
from ...ir.types import DType
from ..loops import Kernel, KernelForm, print_llvm
from ..loops.scalar import reason as scalar_reason
from .base import KernelBuilder, KernelGroup, Lowering, c64, dtype_reason, strides_of, unravel
from .elementwise import Elementwise
from .linalg import TASK_MAX_FLOPS, call_sgemm, const_table, gemm_loop, table_load
from .norm import Row, softmax_row
from .tile_epilogue import TileEpilogue, plan_tile_epilogue

#: the most bytes of scores (all batch indices) the kernel keeps in scratch
SCORES_BUDGET = 32 << 20


@dataclass
class Operand:
    """A matrix operand as strides of the buffer it lives in: ``trans`` (0: columns contiguous, 1: rows
    contiguous), ``ld`` (the stride of the other axis) and one element offset per batch index."""

    value: Value
    trans: int
    ld: int
    offsets: list[int]


def _layout(r: int, c: int, sr: int, sc: int) -> tuple[int, int] | str:
    """(trans, ld) of an ``r x c`` matrix at row and column strides ``sr``, ``sc``, or why not."""
    if sc == 1 or c == 1:
        return 0, (sr if r > 1 else c)
    if sr == 1 or r == 1:
        return 1, (sc if c > 1 else r)
    return "neither of the matrix's axes is contiguous"


def _view(shape: list[int], strides: list[int], batch: tuple[int, ...]) -> tuple[int, int, list[int]] | str:
    """(trans, ld, offsets) of a ``[*batch', r, c]`` matrix stack at element ``strides`` read for each
    index of ``batch`` (its own batch dimensions 1 or equal), or why not."""
    layout = _layout(shape[-2], shape[-1], strides[-2], strides[-1])
    if isinstance(layout, str):
        return layout
    trans, ld = layout
    lead = len(shape) - 2
    if lead != len(batch) or any(d not in (1, o) for d, o in zip(shape[:lead], batch)):
        return f"the batch dimensions {shape[:lead]} do not match the result's {list(batch)}"
    st = [0 if d == 1 else s for d, s in zip(shape[:lead], strides[:lead])]
    idx = np.indices(batch).reshape(lead, -1) if lead else np.zeros((0, 1), np.int64)
    offsets = (np.asarray(st, np.int64).reshape(-1, 1) * idx).sum(axis=0) if lead else np.zeros(1, np.int64)
    return trans, ld, [int(o) for o in offsets]


#: the data movements an operand is read through (the fuse pass's ``_ATTENTION_VIEWS``)
VIEWS = (sh.Transpose, sh.Reshape, tn.Tile, tn.Expand)
#: the most elements of a moved operand's source whose index map is worked out at compile time
MOVED_MAX = 1 << 22


@functools.lru_cache(maxsize=64)  # (the lowering's check and emit both ask, for the same nodes)
def _moved(moves: tuple[Node, ...], v: Value, batch: tuple[int, ...]) -> "Operand | str":
    """``v``, computed from a buffer by the data movements ``moves`` (a Transpose, Reshape, Tile,
    Expand chain: grouped-query attention's key/value heads repeated for their query heads), as a
    matrix per batch index at an offset of that buffer with one pair of strides: found by running the
    movements (their reference semantics) on the buffer's element indices, or why not."""
    src = moves[0].inputs[0]
    n = math.prod(int(d) for d in src.shape)
    if n > MOVED_MAX:
        return f"the operand's source has more than {MOVED_MAX} elements to map"
    idx = np.arange(n, dtype=np.int64).reshape([int(d) for d in src.shape])
    for m in moves:
        idx = m.op.compute(idx, *[None if w is None else w.const for w in m.inputs[1:]])[0]
    r, c = int(v.shape[-2]), int(v.shape[-1])
    lead = idx.shape[:-2]
    if len(lead) != len(batch) or any(d not in (1, o) for d, o in zip(lead, batch)):
        return f"the batch dimensions {list(lead)} do not match the result's {list(batch)}"
    e = np.broadcast_to(idx, tuple(batch) + (r, c)).reshape(-1, r, c)
    sr = int(e[0, 1, 0] - e[0, 0, 0]) if r > 1 else 0
    sc = int(e[0, 0, 1] - e[0, 0, 0]) if c > 1 else 0
    offsets = e[:, 0, 0]
    if not np.array_equal(e, offsets[:, None, None] + np.arange(r)[:, None] * sr + np.arange(c)[None, :] * sc):
        return "the data movements do not leave each matrix at one pair of strides"
    layout = _layout(r, c, sr, sc)
    return layout if isinstance(layout, str) else Operand(src, *layout, [int(o) for o in offsets])


@dataclass
class Parts:
    """The roles of the nodes of an attention group."""

    mm1: Node
    chain: list[Node]
    softmax: Node
    mm2: Node
    out_transpose: Node | None
    views: dict[int, list[Node]]  # id(MatMul operand) -> the data movements computing it, source first

    @staticmethod
    def of(group: KernelGroup) -> "Parts | str":
        nodes = list(group.nodes)
        mms = [n for n in nodes if isinstance(n.op, la.MatMul)]
        sms = [n for n in nodes if type(n.op) is nm.Softmax]
        if len(mms) != 2 or len(sms) != 1:
            return "an attention group has two MatMuls and one Softmax"
        mm1, mm2 = mms
        sm = sms[0]
        if mm2.inputs[0] is not sm.outputs[0]:
            return "the second MatMul does not multiply the Softmax's result"
        chain, cur = [], mm1.outputs[0]
        while cur is not sm.inputs[0]:
            nxt = [n for n in nodes if n not in chain and n is not mm1 and any(v is cur for v in n.inputs)
                   and not isinstance(n.op, (nm.Softmax, sh.Transpose))]
            if len(nxt) != 1:
                return "the MatMul's result does not reach the Softmax through one elementwise chain"
            chain.append(nxt[0])
            cur = nxt[0].outputs[0]
        members = {id(n) for n in nodes}
        views = {}
        for v in (mm1.inputs[0], mm1.inputs[1], mm2.inputs[1]):
            moves, cur = [], v
            while cur.producer is not None and id(cur.producer) in members and type(cur.producer.op) in VIEWS:
                moves.insert(0, cur.producer)
                cur = cur.producer.inputs[0]
            if moves:
                views[id(v)] = moves
        out_t = [n for n in nodes if isinstance(n.op, sh.Transpose) and n.inputs[0] is mm2.outputs[0]]
        if sum(len(m) for m in views.values()) + len(out_t) + len(chain) + 3 != len(nodes):
            return "the group holds nodes that are not part of the attention pattern"
        return Parts(mm1, chain, sm, mm2, out_t[0] if out_t else None, views)

    def operand(self, v: Value, batch: tuple[int, ...]) -> Operand | str:
        """``v`` (an input of a MatMul) as strides of the buffer it is read from."""
        moves = self.views.get(id(v), [])
        if len(moves) > 1 or (moves and not isinstance(moves[0].op, sh.Transpose)):
            return _moved(tuple(moves), v, batch)
        t = moves[0] if moves else None
        src = t.inputs[0] if t is not None else v
        sst = strides_of([int(d) for d in src.shape])
        perm = t.op._perm(len(src.shape)) if t is not None else list(range(len(src.shape)))
        got = _view([int(d) for d in v.shape], [sst[p] for p in perm], batch)
        return got if isinstance(got, str) else Operand(src, *got)

    def result(self, batch: tuple[int, ...]) -> Operand | str:
        """The second MatMul's result as strides of the group's output (through the Transpose)."""
        o = self.mm2.outputs[0]
        shape = [int(d) for d in o.shape]
        if self.out_transpose is None:
            got = _view(shape, strides_of(shape), batch)
            return Operand(o, *got) if not isinstance(got, str) else got
        y = self.out_transpose.outputs[0]
        perm = self.out_transpose.op._perm(len(shape))
        yst = strides_of([int(d) for d in y.shape])
        inv = [perm.index(a) for a in range(len(shape))]
        got = _view(shape, [yst[inv[a]] for a in range(len(shape))], batch)
        if isinstance(got, str):
            return got
        if got[0] != 0:
            return "the head merge after the second MatMul would write the result transposed"
        return Operand(y, *got)


class Attention(Lowering):
    ops = (la.MatMul, nm.Softmax) + VIEWS + Elementwise.ops

    def check(self, group: KernelGroup) -> str | None:
        parts = Parts.of(group)
        if isinstance(parts, str):
            return parts
        values = [v for n in group.nodes for v in (list(n.inputs[:1]) if type(n.op) in VIEWS else list(n.inputs))
                  + list(n.outputs)]
        masks = {id(n.inputs[0]) for n in parts.chain if isinstance(n.op, ew.Where)}
        why = dtype_reason([v for v in values if id(v) not in masks]) or \
            dtype_reason([v for v in values if id(v) in masks], allowed=(DType.bool,))
        if why:
            return why
        for n in parts.chain:
            why = scalar_reason(n.op, [None if v is None else v.type.dtype for v in n.inputs], n.outputs[0].type.dtype)
            if type(n.op) not in Elementwise.ops or why:
                return f"{n.op.name} on the scores: {why or 'not an elementwise op with loop code'}"
        s, o = parts.mm1.outputs[0], parts.mm2.outputs[0]
        if len(s.shape) < 3 or len(parts.mm1.inputs[0].shape) != len(s.shape) or \
                len(parts.mm1.inputs[1].shape) != len(s.shape) or len(parts.mm2.inputs[1].shape) != len(s.shape):
            return "attention takes batched matrices of one rank (batch and heads)"
        if tuple(s.shape[:-2]) != tuple(o.shape[:-2]):
            return "the two MatMuls have different batch shapes"
        if parts.softmax.op.axis % len(s.shape) != len(s.shape) - 1:
            return "the Softmax is not along the last axis"
        batch = tuple(int(d) for d in s.shape[:-2])
        for v in (parts.mm1.inputs[0], parts.mm1.inputs[1], parts.mm2.inputs[1]):
            got = parts.operand(v, batch)
            if isinstance(got, str):
                return f"operand {v}: {got}"
        got = parts.result(batch)
        if isinstance(got, str):
            return got
        if len(group.outputs) != 1 or group.outputs[0] is not group.nodes[-1].outputs[0]:
            return "the scores or probabilities are needed outside the group"
        if parts.chain:
            why = TileEpilogue.reason(s, parts.chain, len(s.shape) - 2)
            if why:
                return why
        if 4 * math.prod(int(d) for d in s.shape) > SCORES_BUDGET:
            return f"the scores take more than {SCORES_BUDGET >> 20} MiB of scratch"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        parts = Parts.of(group)
        s = parts.mm1.outputs[0]
        batch = tuple(int(d) for d in s.shape[:-2])
        nb = math.prod(batch)
        m, n = int(s.shape[-2]), int(s.shape[-1])
        kk = int(parts.mm1.inputs[0].shape[-1])
        n2 = int(parts.mm2.outputs[0].shape[-1])
        q = parts.operand(parts.mm1.inputs[0], batch)
        kt = parts.operand(parts.mm1.inputs[1], batch)
        v = parts.operand(parts.mm2.inputs[1], batch)
        out = parts.result(batch)
        scores = k.scratch(4 * nb * m * n)
        te = None
        if parts.chain:
            final = parts.chain[-1].outputs[0]
            te, _ = plan_tile_epilogue(k, s, (parts.chain, [final], final), None, len(s.shape) - 2)
        tables = {name: const_table(k, name, op.offsets) for name, op in
                  (("q", q), ("k", kt), ("v", v), ("o", out))}
        k.note("scores, softmax and both GEMMs per head in one kernel; head transposes as strides")

        def one(t):
            b = k.b
            sp = k.at(k.again(scores), b.mul(t, c64(m * n)))

            def at(name, op):
                return k.at(k.ptr(op.value), table_load(k, tables[name], t))
            ep = None
            if te is not None:  # the chain reads S_t and writes over it
                ep = te.call_args(unravel(b, t, batch), c64(0), bases={id(s): k.again(scores)})
            call_sgemm(k, q.trans, kt.trans, m, n, kk, 1.0, at("q", q), q.ld, at("k", kt), kt.ld, 0.0, sp, n,
                       epilogue=ep)
            print_llvm(k, _softmax_rows(sp, m, n, k.name))
            call_sgemm(k, 0, v.trans, m, n2, n, 1.0, sp, n, at("v", v), v.ld, 0.0, at("o", out), out.ld)

        gemm_loop(k, nb, nb > 1 and 2 * m * n * kk < TASK_MAX_FLOPS, one, "head")


def _softmax_rows(scores, m: int, n: int, name: str) -> Kernel:
    """Softmax of the ``m`` rows of ``n`` floats at the pointer ``scores``, in place (loop form)."""
    kf = KernelForm(f"{name}.softmax")
    s = kf.buffer("scores", DType.f32, (m, n), "inout", value=scores)
    with kf.loop(m, name="row") as r:
        softmax_row(kf, n, Row.of(s, r, DType.f32), s, r, log=False)
    return kf.finish()


__all__ = ["Attention", "Parts"]
