"""Softmax, LogSoftmax, LayerNormalization and LRN in float32.

**Softmax / LogSoftmax** (opset 13: along one ``axis``) view the input as ``[outer, A, inner]``.
Along the last axis (inner = 1) each row is three passes: the max (vector accumulators, see
``reduce_row``), ``e = exp(x - shift)`` written to the output (a plain loop LLVM vectorizes with the
inlined ``exp``), the sum of ``e`` (vector accumulators), then ``y = e / sum`` (LogSoftmax:
``y = (x - shift) - log(sum)``). As in the reference, ``shift`` is the max when it is finite and 0
otherwise (a row holding +inf gives NaN, a row of -inf gives NaN). Along another axis the same passes
run over whole ``inner``-long rows (contiguous) with the running max and sum in scratch vectors.

**LayerNormalization** (``stash_type`` float32) normalizes rows of ``D = prod(shape[axis:])``: the
mean (sum / D), the variance as the mean of squared deviations (two passes, like the reference), then
``y = (x - mean) * inv * scale + bias`` with ``inv = 1 / sqrt(var + epsilon)``, each step rounded as
the reference rounds it. Scale and B must not vary over the leading (row) axes; ones that broadcast
within the normalized axes must be constants (expanded at compile time). Mean and InvStdDev are
written when they are used.

**LRN** sums squares over the ``size`` channels around each channel in the reference's order (a
channel loop outside, a contiguous loop over the spatial positions inside), then
``y = x / (bias + alpha/size * sum) ** beta`` (``beta`` 0.5, 0.75 and 1 by square roots, others as
``exp(beta log b)``).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ...ir.ops import conv as cv
from ...ir.ops import norm as nm
from ..llvm.elementwise import fmax
from .base import KernelBuilder, KernelGroup, Lowering, c64, cf32, dtype_reason, unary_f32_reason
from .reduce import PAR_MIN_WORK, map_row, par_loop, reduce_row, splat, vload, vstore

#: work per element of a softmax row (three passes and an exp), in the units of ``PAR_MIN_WORK``
SOFTMAX_COST = 4
#: the most scratch bytes a softmax along an inner axis uses to split its outer loop among threads
SOFTMAX_SCRATCH = 8 << 20


def _isfinite_or_zero(k: KernelBuilder, m: ir.Value) -> ir.Value:
    b = k.b
    fabs = b.call(k.math.intrinsic("fabs"), [m])
    return b.select(b.fcmp_ordered("<", fabs, cf32(math.inf)), m, cf32(0.0))


# ---------------------------------------------------------------------------------------------
# Softmax, LogSoftmax
# ---------------------------------------------------------------------------------------------

def softmax_row(k: KernelBuilder, xp: ir.Value, yp: ir.Value, A: int, log: bool = False) -> None:
    """(Log)Softmax of the ``A`` floats at ``xp`` into ``yp`` (which may be ``xp`` for Softmax)."""
    b = k.b
    m = reduce_row(k, A, lambda i, w: vload(k, xp, i, w), "max")
    shift = _isfinite_or_zero(k, m)
    map_row(k, A, lambda i: vstore(k, k.math.exp(b, b.fsub(vload(k, xp, i), shift)), yp, i), "e", interleave=2)
    s = reduce_row(k, A, lambda i, w: vload(k, yp, i, w), "sum")
    if log:  # (x - shift) - log(sum): x is read again, so not in place
        ls = k.math.log(b, s)
        map_row(k, A, lambda i: vstore(k, b.fsub(b.fsub(vload(k, xp, i), shift), ls), yp, i), "y")
    else:
        map_row(k, A, lambda i: vstore(k, b.fdiv(vload(k, yp, i), s), yp, i), "y")


class Softmax(Lowering):
    """Softmax and LogSoftmax along any one axis, float32."""

    ops = (nm.Softmax, nm.LogSoftmax)

    def check(self, group: KernelGroup) -> str | None:
        return unary_f32_reason(group)

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        node = group.node
        x, y = node.inputs[0], node.outputs[0]
        shape = [int(d) for d in x.shape]
        a = node.op.axis % len(shape)
        O, A, I = math.prod(shape[:a]), shape[a], math.prod(shape[a + 1:])
        log = isinstance(node.op, nm.LogSoftmax)
        exp = k.math.exp
        if I == 1:
            with par_loop(k, O, SOFTMAX_COST * A, "row") as r:  # rows split among the threads
                base = k.b.mul(r, c64(A))
                softmax_row(k, k.at(k.ptr(x), base), k.at(k.ptr(y), base), A, log)
            return
        # the running max and sum of each outer index (scratch vectors of I floats): one pair per
        # outer index when the outer loop is split among the threads, else one pair for all
        split = O >= 2 and O * A * I * SOFTMAX_COST >= 2 * PAR_MIN_WORK and 8 * O * I <= SOFTMAX_SCRATCH
        nvec = O if split else 1
        with par_loop(k, O, SOFTMAX_COST * A * I, "o", split=split) as o:
            b = k.b
            xp, yp = k.ptr(x), k.ptr(y)
            mp, sp = k.scratch(4 * I * nvec), k.scratch(4 * I * nvec)
            if split:
                mp, sp = k.at(mp, b.mul(o, c64(I))), k.at(sp, b.mul(o, c64(I)))
            base = b.mul(o, c64(A * I))
            map_row(k, I, lambda i: vstore(k, cf32(-math.inf), mp, i), "init")

            def rows(body, name):
                with k.loop(A, name) as j:
                    row = b.add(base, b.mul(j, c64(I)))
                    map_row(k, I, lambda i: body(b.add(row, i), i), name + "i",
                            interleave=2 if name == "e" else None)

            rows(lambda xi, i: vstore(k, fmax(b, vload(k, mp, i), vload(k, xp, xi)), mp, i), "max")

            def shift(i):
                vstore(k, _isfinite_or_zero(k, vload(k, mp, i)), mp, i)
                vstore(k, cf32(0.0), sp, i)
            map_row(k, I, shift, "shift")

            def ex(xi, i):
                e = exp(b, b.fsub(vload(k, xp, xi), vload(k, mp, i)))
                vstore(k, e, yp, xi)
                vstore(k, b.fadd(vload(k, sp, i), e), sp, i)
            rows(ex, "e")
            if log:
                map_row(k, I, lambda i: vstore(k, k.math.log(b, vload(k, sp, i)), sp, i), "log")
                rows(lambda xi, i: vstore(k, b.fsub(b.fsub(vload(k, xp, xi), vload(k, mp, i)), vload(k, sp, i)),
                                          yp, xi), "y")
            else:
                rows(lambda xi, i: vstore(k, b.fdiv(vload(k, yp, xi), vload(k, sp, i)), yp, xi), "y")


# ---------------------------------------------------------------------------------------------
# LayerNormalization
# ---------------------------------------------------------------------------------------------

def _trailing(v, x, a: int):
    """How ``v`` (Scale or B) maps onto the normalized block x.shape[a:]: ("ptr", None) when it is that
    block exactly (leading 1s aside), ("weight", array) for a constant expanded to it, or a reason."""
    xs = [int(d) for d in x.shape]
    vs = [int(d) for d in v.shape]
    lead = len(xs) - len(vs)  # v right-aligned to x
    if any(d != 1 for i, d in enumerate(vs) if lead + i < a):
        return "Scale or B varies over the leading (not normalized) axes"
    tail = vs[max(0, a - lead):]
    block = xs[a:]
    if [1] * (len(block) - len(tail)) + tail == block:
        return ("ptr", None)
    data = v.const if v.const is not None else v.known
    if data is None:
        return "Scale or B broadcasts within the normalized axes and is not a constant"
    arr = np.asarray(data, dtype=np.float32).reshape(tail)
    return ("weight", np.ascontiguousarray(np.broadcast_to(arr, block), dtype=np.float32).reshape(-1))


class LayerNorm(Lowering):
    """LayerNormalization, float32 with float32 statistics."""

    ops = (nm.LayerNormalization,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        used = [v for v in n.outputs[1:] if v.uses]
        why = dtype_reason(list(n.inputs) + [n.outputs[0]] + used)
        if why:
            return why
        if n.op.stash_type != 1:
            return f"stash_type {n.op.stash_type} (only float32 statistics, stash_type=1, are native)"
        x = n.inputs[0]
        if x.type.numel == 0:
            return "empty tensors are left to the interpreter"
        a = n.op.axis % x.type.rank
        for v in n.inputs[1:]:
            if v is not None:
                t = _trailing(v, x, a)
                if isinstance(t, str):
                    return t
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        node = group.node
        x, y = node.inputs[0], node.outputs[0]
        shape = [int(d) for d in x.shape]
        a = node.op.axis % len(shape)
        R, D = math.prod(shape[:a]), math.prod(shape[a:])
        params = ScaleBias(node, a)
        want_mean = len(node.outputs) > 1 and node.outputs[1].uses
        want_inv = len(node.outputs) > 2 and node.outputs[2].uses
        with par_loop(k, R, 3 * D, "row") as r:  # rows split among the threads
            b = k.b
            base = b.mul(r, c64(D))
            mean, inv = layernorm_row(k, k.at(k.ptr(x), base), k.at(k.ptr(y), base), D, *params.pointers(k),
                                      node.op.epsilon)
            if want_mean:
                vstore(k, mean, k.ptr(node.outputs[1]), r)
            if want_inv:
                vstore(k, inv, k.ptr(node.outputs[2]), r)


class ScaleBias:
    """A LayerNormalization's Scale and B over its normalized block (``_trailing``): their own
    buffers, or constants expanded to the block (made once)."""

    def __init__(self, node, a: int):
        x = node.inputs[0]
        self.values = (list(node.inputs[1:]) + [None])[:2]
        self.params = [None if v is None else _trailing(v, x, a) for v in self.values]

    def pointers(self, k: KernelBuilder) -> list:
        """(Scale, B) pointers in the function being built (None for a missing B)."""
        return [None if p is None else k.ptr(v) if p[0] == "ptr" else k.weight(p[1])
                for v, p in zip(self.values, self.params)]


def layernorm_row(k: KernelBuilder, xp: ir.Value, yp: ir.Value, D: int, sp: ir.Value | None, bp: ir.Value | None,
                  epsilon: float) -> tuple[ir.Value, ir.Value]:
    """Normalize the ``D`` floats at ``xp`` into ``yp`` (times ``sp``, plus ``bp``, each ``D`` floats
    or None); returns (mean, 1 / std)."""
    b = k.b
    nD = cf32(float(D))
    mean = b.fdiv(reduce_row(k, D, lambda i, w: vload(k, xp, i, w), "sum"), nD)

    def sq(i, w):
        d = b.fsub(vload(k, xp, i, w), splat(b, mean, w))
        return b.fmul(d, d)
    var = b.fdiv(reduce_row(k, D, sq, "sum"), nD)
    std = b.call(k.math.intrinsic("sqrt"), [b.fadd(var, cf32(epsilon))])
    inv = b.fdiv(cf32(1.0), std)

    def norm(i):
        v = b.fmul(b.fsub(vload(k, xp, i), mean), inv)
        if sp is not None:
            v = b.fmul(v, vload(k, sp, i))
        if bp is not None:
            v = b.fadd(v, vload(k, bp, i))
        vstore(k, v, yp, i)
    map_row(k, D, norm, "y")
    return mean, inv


# ---------------------------------------------------------------------------------------------
# LRN
# ---------------------------------------------------------------------------------------------

def _pow(k: KernelBuilder, base: ir.Value, beta: float) -> ir.Value:
    b = k.b
    sqrt = k.math.intrinsic("sqrt")
    if beta == 1.0:
        return base
    if beta == 0.5:
        return b.call(sqrt, [base])
    if beta == 0.75:
        r = b.call(sqrt, [base])
        return b.fmul(r, b.call(sqrt, [r]))
    return k.math.exp(b, b.fmul(cf32(beta), k.math.log(b, base)))


class Lrn(Lowering):
    """LRN across channels, float32."""

    ops = (cv.LRN,)

    def check(self, group: KernelGroup) -> str | None:
        return unary_f32_reason(group)

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        node = group.node
        op = node.op
        x, y = node.inputs[0], node.outputs[0]
        shape = [int(d) for d in x.shape]
        N, C, S = shape[0], shape[1], math.prod(shape[2:])
        before = (op.size - 1) // 2
        alpha = cf32(float(np.float32(op.alpha / op.size)))
        bias = cf32(float(np.float32(op.bias)))
        beta = float(np.float32(op.beta))
        # planes split among the threads; each plane's sum of squares accumulates in its output plane
        with par_loop(k, N * C, S * (op.size + 2), "nc") as nc:
            b = k.b
            xp, yp = k.ptr(x), k.ptr(y)
            c = b.urem(nc, c64(C))
            plane = b.mul(nc, c64(S))
            tp = k.at(yp, plane)
            map_row(k, S, lambda i: vstore(k, cf32(0.0), tp, i), "zero")
            with k.loop(op.size, "j") as j:
                cc = b.add(b.sub(c, c64(before)), j)
                with k.f.if_(b.icmp_unsigned("<", cc, c64(C)), "valid"):
                    src = b.add(plane, b.mul(b.sub(cc, c), c64(S)))

                    def acc(i):
                        v = vload(k, xp, b.add(src, i))
                        vstore(k, b.fadd(vload(k, tp, i), b.fmul(v, v)), tp, i)
                    map_row(k, S, acc, "sq")

            def out(i):
                d = b.fadd(bias, b.fmul(alpha, vload(k, tp, i)))
                xi = b.add(plane, i)
                vstore(k, b.fdiv(vload(k, xp, xi), _pow(k, d, beta)), yp, xi)
            map_row(k, S, out, "y", interleave=2 if beta not in (0.5, 0.75, 1.0) else None)


__all__ = ["LayerNorm", "Lrn", "Softmax"]
