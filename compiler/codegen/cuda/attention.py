"""Attention on the GPU: one kernel per block of query rows of one head, the scores in shared memory.

The fuse pass makes the same attention groups as for the CPU (``kernels/attention.py``: ``MatMul ->
(scale, mask) -> Softmax -> MatMul`` with the head Transposes read as strides); ``attention_launch``
runs such a group as one launch. Block ``b`` takes batch index ``h = b // RB`` (batch x heads) and the
query rows ``i0 .. i0 + ROWS`` of it (``RB`` blocks per head), with ``THREADS`` threads:

1. the block's rows of Q into shared memory;
2. each thread computes scores ``S[r, j] = Q[r, :] . K'[:, j]`` (the elements ``t, t + THREADS, ...``
   of the ``ROWS x n`` block), applies the chain on the scores (``Div``/``Mul`` by the scale,
   ``Add`` of a mask, ``Where`` of a boolean mask, read at their broadcast strides) and stores the
   result in shared memory;
3. Softmax of each row in shared memory: the block reduces the row's maximum and the sum of the
   exponentials (a tree, as ``rows.py``), NaN propagating as in the row kernel;
4. each thread computes elements of ``O = P @ V'`` and writes them (through the head merge's
   strides) to the result.

Neither the scores nor the probabilities reach device memory. The shapes, strides and the chain are
constants of the generated kernel (its name is a hash of its source). Limits, checked by ``reason``
before the fuse pass forms the group (it stays separate kernels otherwise): float32, a scores row of
at most ``SCORES_FLOATS`` and a head size of at most ``Q_FLOATS`` floats, a chain of ``CHAIN_OPS``.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from ...ir.graph import Value
from ...ir.ops import elementwise as ew
from ...ir.types import DType
from ..kernels import KernelGroup
from ..kernels.attention import Parts
from ..kernels.tile_epilogue import _broadcast_strides
from .rows import reduce_lines

#: threads per block
THREADS = 128
#: the most query rows a block takes
ROWS_MAX = 16
#: shared memory (in floats) for a block's scores and for its rows of Q: 24 KiB + 16 KiB
SCORES_FLOATS = 6144
Q_FLOATS = 4096

#: the chain's ops on the scores: op type -> a format of its operands
CHAIN_OPS = {ew.Add: "({0} + {1})", ew.Sub: "({0} - {1})", ew.Mul: "({0} * {1})", ew.Div: "({0} / {1})",
             ew.Where: "({1} if {0} else {2})"}


def _dims(parts: Parts) -> tuple[tuple[int, ...], int, int, int, int]:
    """(batch, m, n, head size, n2): the scores are ``batch x m x n``, the result ``batch x m x n2``."""
    s = parts.mm1.outputs[0]
    return (tuple(int(d) for d in s.shape[:-2]), int(s.shape[-2]), int(s.shape[-1]),
            int(parts.mm1.inputs[0].shape[-1]), int(parts.mm2.outputs[0].shape[-1]))


def reason(group: KernelGroup) -> str | None:
    """Why the GPU's attention kernel cannot run ``group`` (which the CPU's attention lowering
    accepts); None when it can."""
    parts = Parts.of(group)
    if isinstance(parts, str):
        return parts
    for v in (parts.mm1.inputs[0], parts.mm1.inputs[1], parts.mm2.inputs[1], parts.mm2.outputs[0]):
        if v.type.dtype is not DType.f32:
            return f"{v.type.dtype.name} operands: the GPU's attention kernel takes float32"
    for n in parts.chain:
        if type(n.op) not in CHAIN_OPS:
            return f"{n.op.name} on the scores has no form in the GPU's attention kernel"
        if isinstance(n.op, ew.Where) and n.inputs[0].type.dtype is not DType.bool:
            return "a Where on the scores whose condition is not boolean"
    _, m, n, d, n2 = _dims(parts)
    if min(m, n, d, n2) == 0:
        return "an empty attention (an axis of size 0)"
    if n > SCORES_FLOATS:
        return f"a row of {n} scores is over the {SCORES_FLOATS} floats of shared memory a block keeps"
    if d > Q_FLOATS:
        return f"a head size of {d} is over the {Q_FLOATS} floats of shared memory a block keeps"
    return None


def _literal(a: np.ndarray) -> str:
    """A one-element constant as numba source."""
    x = a.reshape(-1)[0].item()
    if isinstance(x, bool):
        return str(x)
    if math.isnan(x):
        return "float32(math.nan)"
    if math.isinf(x):
        return "float32(-math.inf)" if x < 0 else "float32(math.inf)"
    return f"float32({float(x)!r})"


def _broadcast(v: Value, shape: tuple[int, ...]) -> tuple[list[int], int, int]:
    """(one element offset per batch index, the row stride, the column stride) of ``v`` read as
    broadcast to ``shape`` (batch..., m, n)."""
    st = _broadcast_strides(v.shape, shape)
    batch = shape[:-2]
    if batch:
        idx = np.indices(batch).reshape(len(batch), -1)
        offsets = (np.asarray(st[:-2], np.int64).reshape(-1, 1) * idx).sum(axis=0)
    else:
        offsets = np.zeros(1, np.int64)
    return [int(o) for o in offsets], st[-2], st[-1]


def _strides(op) -> tuple[int, int]:
    """(row stride, column stride) of an ``Operand``."""
    return (op.ld, 1) if op.trans == 0 else (1, op.ld)


def attention_launch(group: KernelGroup, binder):
    """The one launch of an attention group (``lowering.Launch``); the group passed ``reason``."""
    from .lowering import Launch

    parts = Parts.of(group)
    batch, m, n, d, n2 = _dims(parts)
    nb = math.prod(batch)
    shape = batch + (m, n)
    q, kt, v = (parts.operand(x, batch) for x in (parts.mm1.inputs[0], parts.mm1.inputs[1], parts.mm2.inputs[1]))
    out = parts.result(batch)
    rows = max(1, min(ROWS_MAX, m, SCORES_FLOATS // n, Q_FLOATS // d))
    rb = -(-m // rows)
    (qr, qc), (kr, kc), (vr, vc) = _strides(q), _strides(kt), _strides(v)

    args = [binder.arg(q.value, DType.f32), binder.arg(kt.value, DType.f32), binder.arg(v.value, DType.f32),
            binder.arg(out.value, DType.f32)]
    params = ["q", "kt", "v", "out"]
    for name, o in (("qo", q), ("ko", kt), ("vo", v), ("oo", out)):
        args.append(binder.arg(np.asarray(o.offsets, np.int64), np.int64))
        params.append(name)
    # the chain: each step's expression of the current scores ``x`` and its other operands
    chain, cur = [], parts.mm1.outputs[0]
    for step, node in enumerate(parts.chain):
        terms = []
        for pos, w in enumerate(node.inputs):
            if w is cur:
                terms.append("x")
            elif w.const is not None and w.const.size == 1:
                terms.append(_literal(w.const))
            else:
                offsets, si, sj = _broadcast(w, shape)
                a, ao = f"c{step}_{pos}", f"c{step}_{pos}o"
                args += [binder.arg(w, w.type.dtype), binder.arg(np.asarray(offsets, np.int64), np.int64)]
                params += [a, ao]
                terms.append(f"{a}[{ao}[h] + i * {si} + j * {sj}]")
        chain.append(f"x = {CHAIN_OPS[type(node.op)].format(*terms)}")
        cur = node.outputs[0]

    i1, i2, i3 = "    ", "        ", "            "
    lines = ["@cuda.jit", f"def NAME({', '.join(params)}):",
             f"{i1}sc = cuda.shared.array({rows * n}, float32)", f"{i1}qs = cuda.shared.array({rows * d}, float32)",
             f"{i1}sh = cuda.shared.array({THREADS}, float32)", f"{i1}t = cuda.threadIdx.x",
             f"{i1}h = cuda.blockIdx.x // {rb}", f"{i1}i0 = (cuda.blockIdx.x % {rb}) * {rows}",
             f"{i1}nr = min({rows}, {m} - i0)",
             f"{i1}for e in range(t, nr * {d}, {THREADS}):",
             f"{i2}qs[e] = q[qo[h] + (i0 + e // {d}) * {qr} + (e % {d}) * {qc}]",
             f"{i1}cuda.syncthreads()",
             f"{i1}for e in range(t, nr * {n}, {THREADS}):",
             f"{i2}r = e // {n}", f"{i2}j = e % {n}", f"{i2}i = i0 + r", f"{i2}x = float32(0.0)",
             f"{i2}for c in range({d}):", f"{i3}x += qs[r * {d} + c] * kt[ko[h] + c * {kr} + j * {kc}]"]
    lines += [i2 + s for s in chain]
    lines += [f"{i2}sc[e] = x", f"{i1}cuda.syncthreads()",
              f"{i1}for r in range(nr):", f"{i2}mx = float32(-math.inf)",
              f"{i2}for j in range(t, {n}, {THREADS}):", f"{i3}y = sc[r * {n} + j]",
              f"{i3}if y > mx or y != y:", f"{i3}    mx = y"]
    lines += reduce_lines("mx", "_fmax({0}, {1})", i2)
    lines += [f"{i2}s = float32(0.0)", f"{i2}for j in range(t, {n}, {THREADS}):",
              f"{i3}y = float32(math.exp(sc[r * {n} + j] - mx))", f"{i3}sc[r * {n} + j] = y", f"{i3}s += y"]
    lines += reduce_lines("s", "{0} + {1}", i2)
    lines += [f"{i2}inv = float32(1.0) / s", f"{i2}for j in range(t, {n}, {THREADS}):",
              f"{i3}sc[r * {n} + j] *= inv", f"{i2}cuda.syncthreads()",
              f"{i1}for e in range(t, nr * {n2}, {THREADS}):",
              f"{i2}r = e // {n2}", f"{i2}c = e % {n2}", f"{i2}x = float32(0.0)",
              f"{i2}for j in range({n}):", f"{i3}x += sc[r * {n} + j] * v[vo[h] + j * {vr} + c * {vc}]",
              f"{i2}out[oo[h] + (i0 + r) * {out.ld} + c] = x"]
    body = "\n".join(lines) + "\n"
    name = "kiln_attention_" + hashlib.sha256(body.encode()).hexdigest()[:16]
    binder.sources.setdefault(name, body.replace("def NAME(", f"def {name}(", 1))
    note = (f"attention: a block of {THREADS} threads per {rows} query rows of a head ({nb} heads x {rb} blocks), "
            f"scores ({rows}x{n}) in shared memory" + (f", {len(chain)} ops on them" if chain else ""))
    return Launch(name, args, [], (nb * rb,), (THREADS,), False, [note])


__all__ = ["CHAIN_OPS", "Q_FLOATS", "ROWS_MAX", "SCORES_FLOATS", "THREADS", "attention_launch", "reason"]
