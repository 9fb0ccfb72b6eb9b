"""RNN, GRU and LSTM (float32) as one kernel: the recurrence as a loop of GEMMs and loop-form cells.

For each direction of the layer (the op's semantics: ``ir/ops/recurrent.py``):

1. ``XW = X @ W^T``: the input projection of every time step in one GEMM (``seq * batch`` rows, in X's
   row order, so both layouts read X in place), into scratch;
2. the states (H, and C for LSTM) start as ``initial_h``/``initial_c`` or zeros, in scratch;
3. for each time step t (backwards for the reverse direction):

   * ``gates_t += H @ R^T``: one GEMM accumulating into step t's rows of XW (beta 1); a GRU without
     ``linear_before_reset`` multiplies only its z and r gates here, and its candidate's
     ``(r . H) @ Rh^T`` after the first cell; with it, ``H @ Rh^T`` goes to a scratch row block;
   * the cell, a loop-form kernel over ``batch x hidden``: the biases (W's and R's), the peepholes,
     ``clip``, the activation functions (each the elementwise op's own scalar semantics,
     ``loops/scalar.py``), the new states, and ``Y[t]`` (zero past an entry's ``sequence_lens``, where
     the state is kept);
4. the final states are copied to Y_h (and Y_c); an entry of length 0 gets zeros.

The input projections are one ``kiln_sgemm`` call per direction (split among the threads). A step's
product is tiny (a few rows): for batch up to ``GEMV_MAX_BATCH`` and a constant R it is a loop-form
GEMV over R^T stored at compile time (no call, no packing); otherwise an sgemm with R packed when
compiling. The cells are serial over the batch and vectorized along the hidden axis. A bidirectional
layer runs its two directions as two tasks of the pool. Measured (2-core Xeon, 2 threads, seq 32,
batch 1, input 64, hidden 128): a 2-layer LSTM 0.25 ms, ONNX Runtime 0.27; a bidirectional GRU
0.16 ms, ONNX Runtime 0.18.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


from llvmlite import ir

from ...ir.graph import Value
from ...ir.ops import elementwise as ew
from ...ir.ops import recurrent as rc
from ...ir.types import DType
from ..loops import KernelForm, print_llvm
from ..loops.expr import INDEX, Const, Expr, op, select
from ..loops.scalar import scalar
from .base import KernelBuilder, KernelGroup, Lowering, c64, dtype_reason
from .linalg import TASK_MAX_FLOPS, call_sgemm

F32 = DType.f32
#: the most batch rows whose step product H R^T runs as the loop-form GEMV (more: the GEMM)
GEMV_MAX_BATCH = 4
#: rows of R^T the GEMV adds in per pass over a row of the gates
UNROLL = 8


def _activation(name: str, alpha, beta):
    """The scalar function of one recurrent activation, as loop-form expressions."""
    key = name.lower()
    unary = {"relu": ew.Relu, "tanh": ew.Tanh, "sigmoid": ew.Sigmoid, "softsign": ew.Softsign,
             "softplus": ew.Softplus}
    if key in unary:
        o = unary[key]()
    elif key == "leakyrelu":
        o = ew.LeakyRelu(alpha=alpha)
    elif key == "thresholdedrelu":
        o = ew.ThresholdedRelu(alpha=alpha)
    elif key == "hardsigmoid":
        o = ew.HardSigmoid(alpha=alpha, beta=beta)
    elif key == "elu":
        o = ew.Elu(alpha=alpha)
    elif key == "affine":
        return lambda x: op("add", op("mul", Const(alpha, F32), x), Const(beta, F32))
    elif key == "scaledtanh":
        return lambda x: op("mul", Const(alpha, F32), op("tanh", op("mul", Const(beta, F32), x)))
    else:  # the op's validation lists the same names
        raise ValueError(f"activation {name!r} has no native form")
    return lambda x: scalar(o, [x], F32)


def _activations(o: rc._Recurrent) -> list[list]:
    """Per direction, the activation functions (loop-form builders), as the op binds them."""
    names = o.activations if o.activations is not None else o.default_activations
    k = len(o.default_activations)
    forward = names[:k]
    per_direction = [forward, names[k:] if len(names) == 2 * k else forward]
    return [[_activation(name, a.alpha, a.beta) for name, a in zip(nms, acts)]
            for nms, acts in zip(per_direction, o._bound_activations())]


@dataclass
class _Layer:
    """The sizes and operands of one recurrent node."""

    seq: int
    batch: int
    isz: int
    hid: int
    gates: int
    nd: int
    x: Value
    w: Value
    r: Value
    b: Value | None
    lens: Value | None
    init: list  # initial_h, initial_c (or None each)
    p: Value | None
    outs: list  # Y, Y_h, Y_c (None where not produced)

    @staticmethod
    def of(group: KernelGroup) -> "_Layer":
        n = group.node
        o = n.op
        ins = list(n.inputs) + [None] * (8 - len(n.inputs))
        x, w, r = ins[0], ins[1], ins[2]
        xs = [int(d) for d in x.shape]
        seq, batch = (xs[0], xs[1]) if o.layout == 0 else (xs[1], xs[0])
        nd, rows, isz = (int(d) for d in w.shape)
        hid = int(r.shape[2])
        init = ins[5:5 + o.num_states]
        outs = list(n.outputs) + [None] * (1 + o.num_states - len(n.outputs))
        return _Layer(seq, batch, isz, hid, o.gates, nd, x, w, r, ins[3], ins[4], init,
                      ins[7] if o.num_states == 2 else None, outs)


class Recurrent(Lowering):
    ops = (rc.RNN, rc.GRU, rc.LSTM)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        ins = [v for v in n.inputs if v is not None]
        lens = n.inputs[4] if len(n.inputs) > 4 else None
        why = dtype_reason([v for v in ins + list(n.outputs) if v is not None and v is not lens])
        if why:
            return why
        if lens is not None:
            why = dtype_reason([lens], allowed=(DType.i32, DType.i64))
            if why:
                return f"sequence_lens: {why}"
        lay = _Layer.of(group)
        if min(lay.seq, lay.batch, lay.hid, lay.isz) == 0:
            return "empty sequences, batches or states are left to the interpreter"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        o = group.node.op
        lay = _Layer.of(group)
        k.note(f"{type(o).__name__}: X W^T in one GEMM, per step H R^T (GEMM) and a loop-form cell")
        if lay.lens is not None:
            print_llvm(k, _check_lens(k, lay, o))
        scratch = [_Scratch.of(k, lay, o) for _ in range(lay.nd)]
        acts = _activations(o)
        if lay.nd == 1:
            _direction(k, lay, o, 0, acts[0], scratch[0])
            return
        # the two directions are independent: a task each (on one thread when the pool has one)
        k.note("the two directions as two tasks")
        with k.parallel_for(2) as (lo, hi), k.loop(k.b.sub(hi, lo), "dir") as i:
            which = k.b.add(lo, i)
            for d in range(2):
                with k.b.if_then(k.b.icmp_unsigned("==", which, c64(d))):
                    _direction(k, lay, o, d, acts[d], scratch[d])


@dataclass
class _Scratch:
    """One direction's scratch memory: the input projections and gates (XW), the states, and a GRU's
    ``r . H`` or ``H Rh^T`` rows."""

    xw: object
    states: list
    hr: object

    @staticmethod
    def of(k: KernelBuilder, lay: _Layer, o) -> "_Scratch":
        gh = lay.gates * lay.hid
        return _Scratch(k.scratch(4 * lay.seq * lay.batch * gh),
                        [k.scratch(4 * lay.batch * lay.hid) for _ in range(o.num_states)],
                        k.scratch(4 * lay.batch * lay.hid) if isinstance(o, rc.GRU) else None)


def _direction(k: KernelBuilder, lay: _Layer, o, d: int, acts, sc: _Scratch) -> None:
    """All of direction d: the input projection, the initial states, the time loop, the final states."""
    seq, batch, hid, gh = lay.seq, lay.batch, lay.hid, lay.gates * lay.hid
    b = k.b
    # X's rows in order: (t, b) for layout 0, (b, t) for layout 1; a step's rows of XW are ``ld`` apart
    step_off, ld = (batch * gh, gh) if o.layout == 0 else (gh, seq * gh)
    reverse = o.direction == "reverse" or d == 1
    wp, tw, ldw = _transposed(k, lay.w, d, 0, gh)
    call_sgemm(k, 0, tw, seq * batch, gh, lay.isz, 1.0, k.ptr(lay.x), lay.isz, wp, ldw, 0.0, k.again(sc.xw), gh)
    if lay.r.const is not None and batch <= GEMV_MAX_BATCH:  # R^T's rows, read in place by a loop-form GEMV
        rts = {c0: np.ascontiguousarray(lay.r.const[d, c0:c0 + n].T, np.float32) for c0, n in _recur_blocks(o, hid)}
    else:
        rts = {c0: _transposed(k, lay.r, d, c0, n) for c0, n in _recur_blocks(o, hid)}
    states = [k.again(s) for s in sc.states]
    print_llvm(k, _init_states(k, lay, o, d, states))
    one = ir.Constant(ir.IntType(32), 1)  # a step's small GEMMs gain nothing from the pool
    with k.loop(seq, "step") as s:
        t = b.sub(c64(seq - 1), s) if reverse else s
        gates = k.at(k.again(sc.xw), b.mul(t, c64(step_off)))
        h = k.again(sc.states[0])

        def recur(c0: int, ncols: int, src, dst, beta: float, ldc: int):
            """dst[:, :ncols] (+)= src @ R[c0:c0+ncols]^T"""
            if isinstance(rts[c0], np.ndarray):
                print_llvm(k, _gemv(k, rts[c0], src, dst, batch, ldc, beta))
                return
            rp, tr, ldr = rts[c0]
            call_sgemm(k, 0, tr, batch, ncols, hid, 1.0, src, hid, k.here(rp), ldr, beta, dst, ldc,
                       nthreads=one if 2 * batch * ncols * hid < TASK_MAX_FLOPS else None)

        if isinstance(o, rc.GRU):
            hr = k.again(sc.hr)
            recur(0, 2 * hid, h, gates, 1.0, ld)
            if o.linear_before_reset:
                recur(2 * hid, hid, h, hr, 0.0, hid)
                print_llvm(k, _gru_cell(k, lay, o, d, acts, gates, ld, states, hr, "full"), [t])
            else:
                print_llvm(k, _gru_cell(k, lay, o, d, acts, gates, ld, states, hr, "gates"), [t])
                recur(2 * hid, hid, hr, k.at(gates, 2 * hid), 1.0, ld)
                print_llvm(k, _gru_cell(k, lay, o, d, acts, gates, ld, states, hr, "state"), [t])
        else:
            recur(0, gh, h, gates, 1.0, ld)
            print_llvm(k, _cell(k, lay, o, d, acts, gates, ld, states), [t])
    print_llvm(k, _final_states(k, lay, o, d, states))


def _gemv(k: KernelBuilder, rt: np.ndarray, src, dst, batch: int, ldc: int, beta: float):
    """``dst[b, :] (+)= src[b, :] @ rt`` for a few rows b: each row of the constant ``rt`` scaled
    by one element of ``src`` and added along ``dst``'s row (a vector loop), no call."""
    kk, n = rt.shape
    kf = KernelForm(f"{k.name}.gemv")
    a = kf.buffer("h", F32, (batch, kk), value=src)
    r = kf.buffer("rt", F32, (kk, n), value=rt)
    c = kf.buffer("c", F32, (batch, n), "inout", strides=(ldc, 1), value=dst)
    with kf.loop(batch, name="b") as bi:
        if beta == 0.0:
            with kf.loop(n, "vector", name="j") as j:
                kf.store(c, (bi, j), Const(0.0, F32))
        # UNROLL rows of rt per pass over dst's row: fewer loads and stores of it per product
        for start, count, step in ((0, kk // UNROLL, UNROLL), (kk - kk % UNROLL, kk % UNROLL, 1)):
            if not count:
                continue
            with kf.loop(count, name="k") as kb:
                k0 = kf.let(kb * step + start, name="k0")
                hs = [kf.let(a[bi, k0 + u], name="hk") for u in range(step)]
                with kf.loop(n, "vector", name="j") as j:
                    acc = c[bi, j]
                    for u in range(step):
                        acc = op("fma", hs[u], r[k0 + u, j], acc)
                    kf.store(c, (bi, j), acc)
    return kf.finish()


def _recur_blocks(o, hid: int) -> list[tuple[int, int]]:
    """The (first row, rows) blocks of R each step multiplies by: all gates, or a GRU's z and r
    gates and its candidate's apart."""
    if isinstance(o, rc.GRU):
        return [(0, 2 * hid), (2 * hid, hid)]
    return [(0, o.gates * hid)]


def _transposed(k: KernelBuilder, m: Value, d: int, r0: int, rows: int):
    """(pointer, trans, ld) of ``m[d, r0:r0+rows]^T`` as a GEMM's B: packed once at compile time when
    ``m`` is a constant (a tiny-M GEMM would otherwise pack the transposed matrix at every step), else
    the rows read transposed in place."""
    cols = int(m.shape[2])
    if m.const is not None:
        return k.weight(k.services.pack_b(m.const[d, r0:r0 + rows].T)), 2, rows
    return k.at(k.ptr(m), (d * int(m.shape[1]) + r0) * cols), 1, cols


# -- the loop-form pieces ---------------------------------------------------------------------------

def _state_view(lay: _Layer, o, d: int) -> tuple[int, tuple[int, int]]:
    """(element offset, (batch stride, hidden stride)) of direction d's rows in a state tensor."""
    if o.layout == 0:
        return d * lay.batch * lay.hid, (lay.hid, 1)
    return d * lay.hid, (lay.nd * lay.hid, 1)


def _bias(kf: KernelForm, lay: _Layer, d: int):
    """bias(which, gate, j): W's (which 0) or R's (1) bias of ``gate`` at hidden index j (0 without B)."""
    gh = lay.gates * lay.hid
    bb = kf.buffer("B", F32, (lay.nd, 2 * gh), value=lay.b) if lay.b is not None else None

    def bias(which: int, gate: int, j) -> Expr:
        if bb is None:
            return Const(0.0, F32)
        return bb[Const(d, INDEX), j + (which * gh + gate * lay.hid)]
    return bias


def _live(kf: KernelForm, lay: _Layer, t, bi) -> Expr | None:
    """Whether time step t of batch entry bi is inside the entry's sequence (None: always)."""
    if lay.lens is None:
        return None
    lb = kf.buffer("lens", lay.lens.type.dtype, (lay.batch,), value=lay.lens)
    return op("lt", t, op("cast", lb[bi], to=INDEX))


def _clip(o, x: Expr) -> Expr:
    if o.clip is None:
        return x
    return op("min", op("max", x, Const(-o.clip, F32)), Const(o.clip, F32))


def _step_buffers(kf, k, lay, o, d, gates, ld, states, t):
    """The gates of step t, the state buffers and step t's rows of Y."""
    g = kf.buffer("gates", F32, (lay.batch, lay.gates * lay.hid), "inout", strides=(ld, 1), value=gates)
    st = [kf.buffer(f"s{i}", F32, (lay.batch, lay.hid), "inout", value=s) for i, s in enumerate(states)]
    y = None
    if lay.outs[0] is not None:
        yshape = [int(v) for v in lay.outs[0].shape]
        yb = kf.buffer("Y", F32, yshape, "inout", value=lay.outs[0])
        y = (lambda bi, j: (t, Const(d, INDEX), bi, j)) if o.layout == 0 else \
            (lambda bi, j: (bi, t, Const(d, INDEX), j))
        return g, st, (yb, y)
    return g, st, None


def _store_step(kf, lay, live, st, y, bi, j, new: list[Expr]) -> None:
    """The new states (kept past the entry's length) and Y (zero there)."""
    olds = [s[bi, j] for s in st]
    if live is not None:
        new = [kf.let(select(live, n, old), name="kept") for n, old in zip(new, olds)]
    for s, n in zip(st, new):
        kf.store(s, (bi, j), n)
    if y is not None:
        yb, index = y
        h = new[0] if live is None else select(live, new[0], Const(0.0, F32))
        kf.store(yb, index(bi, j), h)


def _cell(k, lay: _Layer, o, d, acts, gates, ld, states):
    """RNN and LSTM: the new states from step t's gates (X W^T + H R^T)."""
    kf = KernelForm(f"{k.name}.cell{d}")
    t = kf.size("t", lay.seq - 1)
    g, st, y = _step_buffers(kf, k, lay, o, d, gates, ld, states, t)
    bias = _bias(kf, lay, d)
    hid = lay.hid
    pb = kf.buffer("P", F32, (lay.nd, 3 * hid), value=lay.p) if lay.p is not None else None
    with kf.loop(lay.batch, name="b") as bi:
        live = _live(kf, lay, t, bi)
        if live is not None:
            live = kf.let(live, name="live")
        with kf.loop(hid, "vector", name="j") as j:
            def gate(i):
                return op("add", g[bi, j + i * hid], op("add", bias(0, i, j), bias(1, i, j)))
            if isinstance(o, rc.RNN):
                new = [kf.let(acts[0](_clip(o, gate(0))), name="h")]
            else:
                f, gfn, hfn = acts
                c = kf.let(st[1][bi, j], name="c")
                gi, go, gf, gc = (gate(i) for i in range(4))
                if pb is not None:
                    gi = op("add", gi, op("mul", pb[Const(d, INDEX), j], c))
                    gf = op("add", gf, op("mul", pb[Const(d, INDEX), j + 2 * hid], c))
                i_ = kf.let(f(_clip(o, gi)), name="i")
                fg = op("sub", Const(1.0, F32), i_) if o.input_forget else f(_clip(o, gf))
                cn = kf.let(op("add", op("mul", fg, c), op("mul", i_, gfn(_clip(o, gc)))), name="cn")
                if pb is not None:
                    go = op("add", go, op("mul", pb[Const(d, INDEX), j + hid], cn))
                og = f(_clip(o, go))
                new = [kf.let(op("mul", og, hfn(cn)), name="h"), cn]
            _store_step(kf, lay, live, st, y, bi, j, new)
    return kf.finish()


def _gru_cell(k, lay: _Layer, o, d, acts, gates, ld, states, hr, part: str):
    """GRU, in one of three parts: "gates" (z over the z gate's slot, r . H to ``hr``), "state" (after
    ``hr @ Rh^T`` was added to the candidate's gates) or "full" (linear_before_reset: ``hr`` holds
    H Rh^T)."""
    kf = KernelForm(f"{k.name}.gru{part}{d}")
    t = kf.size("t", lay.seq - 1)
    g, st, y = _step_buffers(kf, k, lay, o, d, gates, ld, states, t)
    hb = kf.buffer("hr", F32, (lay.batch, lay.hid), "inout", value=hr)
    bias = _bias(kf, lay, d)
    hid = lay.hid
    f, gfn = acts
    with kf.loop(lay.batch, name="b") as bi:
        live = _live(kf, lay, t, bi) if part != "gates" else None
        if live is not None:
            live = kf.let(live, name="live")
        with kf.loop(hid, "vector", name="j") as j:
            def zr(i):
                pre = op("add", g[bi, j + i * hid], op("add", bias(0, i, j), bias(1, i, j)))
                return f(_clip(o, pre))
            h = kf.let(st[0][bi, j], name="h")
            if part == "gates":
                kf.store(g, (bi, j), zr(0))
                kf.store(hb, (bi, j), op("mul", zr(1), h))
            else:
                if part == "full":
                    z = kf.let(zr(0), name="z")
                    cand = op("add", op("add", g[bi, j + 2 * hid], bias(0, 2, j)),
                              op("mul", zr(1), op("add", hb[bi, j], bias(1, 2, j))))
                else:
                    z = kf.let(g[bi, j], name="z")
                    cand = op("add", g[bi, j + 2 * hid], op("add", bias(0, 2, j), bias(1, 2, j)))
                hh = kf.let(gfn(_clip(o, cand)), name="hh")
                new = [kf.let(op("add", op("mul", op("sub", Const(1.0, F32), z), hh), op("mul", z, h)), name="hn")]
                _store_step(kf, lay, live, st, y, bi, j, new)
    return kf.finish()


def _init_states(k, lay: _Layer, o, d, states):
    kf = KernelForm(f"{k.name}.init{d}")
    off, strides = _state_view(lay, o, d)
    srcs = []
    for i, (s, init) in enumerate(zip(states, lay.init)):
        dst = kf.buffer(f"s{i}", F32, (lay.batch, lay.hid), "inout", value=s)
        src = None
        if init is not None:
            shape = [int(v) for v in init.shape]
            src = (kf.buffer(f"init{i}", F32, shape, value=init), shape)
        srcs.append((dst, src))
    with kf.loop(lay.batch, name="b") as bi, kf.loop(lay.hid, "vector", name="j") as j:
        for dst, src in srcs:
            if src is None:
                kf.store(dst, (bi, j), Const(0.0, F32))
            else:
                buf, _ = src
                index = (Const(d, INDEX), bi, j) if o.layout == 0 else (bi, Const(d, INDEX), j)
                kf.store(dst, (bi, j), buf[index])
    return kf.finish()


def _final_states(k, lay: _Layer, o, d, states):
    kf = KernelForm(f"{k.name}.final{d}")
    pairs = []
    for i, s in enumerate(states):
        out = lay.outs[1 + i]
        if out is None:
            continue
        src = kf.buffer(f"s{i}", F32, (lay.batch, lay.hid), value=s)
        pairs.append((src, kf.buffer(f"Y{i}", F32, [int(v) for v in out.shape], "inout", value=out)))
    lb = kf.buffer("lens", lay.lens.type.dtype, (lay.batch,), value=lay.lens) if lay.lens is not None else None
    with kf.loop(lay.batch, name="b") as bi:
        empty = kf.let(op("le", op("cast", lb[bi], to=INDEX), Const(0, INDEX)), name="empty") if lb else None
        with kf.loop(lay.hid, "vector", name="j") as j:
            for src, dst in pairs:
                v = src[bi, j] if empty is None else select(empty, Const(0.0, F32), src[bi, j])
                index = (Const(d, INDEX), bi, j) if o.layout == 0 else (bi, Const(d, INDEX), j)
                kf.store(dst, index, v)
    return kf.finish()


def _check_lens(k, lay: _Layer, o):
    """Report a sequence length outside [0, seq] (the reference refuses it)."""
    kf = KernelForm(f"{k.name}.lens")
    lb = kf.buffer("lens", lay.lens.type.dtype, (lay.batch,), value=lay.lens)
    with kf.loop(lay.batch, name="b") as bi:
        n = kf.let(op("cast", lb[bi], to=INDEX), name="n")
        kf.fail_if(op("or", op("lt", n, Const(0, INDEX)), op("gt", n, Const(lay.seq, INDEX))), n, lay.seq + 1)
    return kf.finish()


LOWERINGS = (Recurrent(),)

__all__ = ["LOWERINGS", "Recurrent"]
