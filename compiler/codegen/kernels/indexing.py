"""Ops that address data through indices read at run time, on the loop form, for every element type.

An index is normalized (a negative one counts from the end) and checked: one outside ``[-d, d)`` is
reported (``fail_if``: the run raises an error naming the node and the index, as the interpreter
does) and the element is read at a clamped index instead, so no kernel addresses memory outside its
buffers whatever the data.
"""
from __future__ import annotations

import math

from ...ir.ops import indexing as ix
from ...ir.ops import norm as nm
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import INDEX, STORAGE_TYPES, Const, Expr, cast, compute_type, op, select
from .base import FormLowering, KernelGroup, dtype_reason, par_grain

#: elements of work a parallel task gets at least
PAR_MIN_WORK = 1 << 15


def checked_index(kf: KernelForm, raw: Expr, dim: int) -> Expr:
    """``raw`` (an index read from memory) normalized into ``[0, dim)``; reported when it is outside
    ``[-dim, dim)`` (and then clamped, for the read)."""
    raw = raw if raw.dtype is INDEX else cast(raw, INDEX)
    d = Const(dim, INDEX)
    v = kf.let(op("add", raw, op("mul", cast(op("lt", raw, Const(0, INDEX)), INDEX), d)), name="ix")
    kf.fail_if(op("or", op("lt", v, Const(0, INDEX)), op("ge", v, d)), raw, dim)
    return op("min", op("max", v, Const(0, INDEX)), Const(dim - 1, INDEX))


class GatherElements(FormLowering):
    """``y[i] = data[i with the axis replaced by indices[i]]``: one loop nest over the indices' shape
    (the first axis split among the threads), each index checked."""

    ops = (ix.GatherElements,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        data, idx = n.inputs
        why = dtype_reason([data, n.outputs[0]], allowed=tuple(STORAGE_TYPES)) or \
            dtype_reason([idx], allowed=(DType.i32, DType.i64))
        if why:
            return why
        if int(data.shape[n.op.axis % data.type.rank]) == 0:
            return "the axis is empty: every index is out of range"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        data, idx = n.inputs
        y = n.outputs[0]
        shape = tuple(int(d) for d in idx.shape)
        a = n.op.axis % len(shape)
        kf = KernelForm(name)
        db = kf.buffer("data", data.type.dtype, [int(d) for d in data.shape], value=data)
        ib = kf.buffer("indices", idx.type.dtype, shape, value=idx)
        yb = kf.buffer("y", y.type.dtype, shape, "out", value=y)
        kf.note(f"GatherElements along axis {a} of {int(data.shape[a])}, each index checked")
        grain = par_grain(math.prod(shape[1:]), PAR_MIN_WORK)
        index: list = []

        def nest(axis: int):
            if axis == len(shape):
                j = checked_index(kf, ib[tuple(index)], int(data.shape[a]))
                kf.store(yb, tuple(index), db[tuple(j if k == a else index[k] for k in range(len(shape)))])
                return
            kind = "parallel" if axis == 0 else "vector" if axis == len(shape) - 1 else "serial"
            with kf.loop(shape[axis], kind, grain=grain if axis == 0 else 1) as i:
                index.append(i)
                nest(axis + 1)
                index.pop()

        nest(0)
        return kf.finish()


class NegativeLogLikelihoodLoss(FormLowering):
    """``loss[n, d] = -x[n, t, d] * w[t]`` with ``t = target[n, d]`` (0 where ``t`` is ignore_index;
    a target outside ``[0, C)`` is reported), over ``x`` seen as ``[N, C, D]``; reduced by none (rows
    split among the threads), sum, or mean (divided by the sum of the weights used). Float sums
    accumulate in f64."""

    ops = (nm.NegativeLogLikelihoodLoss,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, t = n.inputs[0], n.inputs[1]
        w = n.inputs[2] if len(n.inputs) > 2 else None
        why = dtype_reason([x, w, n.outputs[0]], allowed=(DType.f32, DType.f64, DType.f16, DType.bf16)) or \
            dtype_reason([t], allowed=(DType.i32, DType.i64))
        if why:
            return why
        if int(x.shape[1]) == 0:
            return "no classes: every target is out of range"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        x, t = n.inputs[0], n.inputs[1]
        w = n.inputs[2] if len(n.inputs) > 2 else None
        y = n.outputs[0]
        shape = [int(d) for d in x.shape]
        rows, classes, inner = shape[0], shape[1], math.prod(shape[2:])
        red, ignore = n.op.reduction, n.op.ignore_index
        ct = compute_type(x.type.dtype)
        acc_t = DType.f64 if red != "none" else ct
        kf = KernelForm(name)
        xb = kf.buffer("x", x.type.dtype, (rows, classes, inner), value=x)
        tb = kf.buffer("target", t.type.dtype, (rows, inner), value=t)
        wb = kf.buffer("weight", w.type.dtype, (classes,), value=w) if w is not None else None
        yb = kf.buffer("loss", y.type.dtype, (rows, inner) if red == "none" else (1,), "out", value=y)
        kf.note(f"NegativeLogLikelihoodLoss over [{rows}, {classes}, {inner}], reduction {red}")
        zero, one = Const(0.0, ct), Const(1.0, ct)

        def point(i, d):
            """(loss, weight) at (i, d), in the compute type."""
            raw = kf.let(_as(tb[i, d], INDEX), name="t")
            valid = op("ne", raw, Const(ignore, INDEX)) if ignore is not None else Const(True, DType.bool)
            bad = op("and", valid, op("or", op("lt", raw, Const(0, INDEX)), op("ge", raw, Const(classes, INDEX))))
            kf.fail_if(bad, raw, classes)
            j = op("min", op("max", raw, Const(0, INDEX)), Const(classes - 1, INDEX))
            weight = kf.let(select(valid, _as(wb[j], ct) if wb is not None else one, zero), name="w")
            return kf.let(op("mul", op("neg", _as(xb[i, j, d], ct)), weight), name="l"), weight

        if red == "none":
            with kf.loop(rows, "parallel", grain=par_grain(inner, PAR_MIN_WORK)) as i, kf.loop(inner) as d:
                loss, _ = point(i, d)
                kf.store(yb, (i, d), _rounded(loss, y.type.dtype))
            return kf.finish()
        total = kf.acc(Const(0.0, acc_t), name="total")
        weights = kf.acc(Const(0.0, acc_t), name="weights")
        with kf.loop(rows) as i, kf.loop(inner) as d:
            loss, weight = point(i, d)
            kf.update(total, "add", _as(loss, acc_t))
            kf.update(weights, "add", _as(weight, acc_t))
        v = total if red == "sum" else op("div", total, weights)
        kf.store(yb, (Const(0, INDEX),), _rounded(_as(v, ct), y.type.dtype))
        return kf.finish()


class GatherND(FormLowering):
    """GatherND: ``y[b, t, s] = data[b, i_0, .., i_{m-1}, s]`` with the index tuple
    ``indices[b, t, :]`` (each component checked), over data seen as ``[batch, dims.., rest]``."""

    ops = (ix.GatherND,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        data, idx = n.inputs
        return dtype_reason([data, n.outputs[0]], allowed=tuple(STORAGE_TYPES)) or \
            dtype_reason([idx], allowed=(DType.i32, DType.i64)) or self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        data, idx = n.inputs
        y = n.outputs[0]
        b, m = n.op.batch_dims, int(idx.shape[-1])
        dshape, ishape = [int(d) for d in data.shape], [int(d) for d in idx.shape]
        nb, k, rest = math.prod(dshape[:b]), math.prod(ishape[b:-1]), math.prod(dshape[b + m:])
        dims = dshape[b:b + m]
        if 0 in dims:
            raise ValueError("an indexed axis is empty: every index is out of range")
        kf = KernelForm(name)
        db = kf.buffer("data", data.type.dtype, (nb, *dims, rest), value=data)
        ib = kf.buffer("indices", idx.type.dtype, (nb, k, m), value=idx)
        yb = kf.buffer("y", y.type.dtype, (nb, k, rest), "out", value=y)
        kf.note(f"GatherND of {k} tuples of {m} per batch of {nb}, slices of {rest}")
        with kf.loop(nb * k, "parallel", grain=par_grain(rest, PAR_MIN_WORK)) as q:
            bi, t = op("div", q, Const(k, INDEX)), op("rem", q, Const(k, INDEX))
            js = [checked_index(kf, ib[bi, t, Const(j, INDEX)], d) for j, d in enumerate(dims)]
            with kf.loop(rest, "vector") as e:
                kf.store(yb, (bi, t, e), db[(bi, *js, e)])
        return kf.finish()


class Scatter(FormLowering):
    """ScatterElements and ScatterND: the result is a copy of data, then each update is written (or
    combined: add, mul, max, min) at its checked index, one after the other in index order (later
    duplicates win, as the reference gives): serial code."""

    ops = (ix.ScatterElements, ix.ScatterND)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        data, idx, upd = n.inputs
        types = tuple(STORAGE_TYPES) if n.op.reduction == "none" else tuple(STORAGE_TYPES - {DType.bool})
        return dtype_reason([data, upd, n.outputs[0]], allowed=types) or \
            dtype_reason([idx], allowed=(DType.i32, DType.i64)) or self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        data, idx, upd = n.inputs
        y = n.outputs[0]
        dshape = [int(d) for d in data.shape]
        kf = KernelForm(name)
        db = kf.buffer("data", data.type.dtype, dshape, value=data)
        yb = kf.buffer("y", y.type.dtype, dshape, "inout", value=y)  # a copy of data, then updated
        _nest(kf, dshape, lambda ix_: kf.store(yb, ix_, db[ix_]))
        red = n.op.reduction

        def write(at, v):
            kf.store(yb, at, v if red == "none" else op(red, yb[at], v))

        ishape = [int(d) for d in idx.shape]
        if isinstance(n.op, ix.ScatterElements):
            a = n.op.axis % len(dshape)
            if dshape[a] == 0:
                raise ValueError("the axis is empty: every index is out of range")
            ib = kf.buffer("indices", idx.type.dtype, ishape, value=idx)
            ub = kf.buffer("updates", upd.type.dtype, ishape, value=upd)
            kf.note(f"ScatterElements along axis {a}, reduction {red}")

            def one(ix_):
                j = checked_index(kf, ib[ix_], dshape[a])
                write(tuple(j if d == a else ix_[d] for d in range(len(ix_))), ub[ix_])
            _nest(kf, ishape, one, inner="serial")  # updates may collide: in order
            return kf.finish()
        m = ishape[-1]
        if 0 in dshape[:m]:
            raise ValueError("an indexed axis is empty: every index is out of range")
        tuples, rest = math.prod(ishape[:-1]), math.prod(dshape[m:])
        ib = kf.buffer("indices", idx.type.dtype, (tuples, m), value=idx)
        ub = kf.buffer("updates", upd.type.dtype, (tuples, rest), value=upd)
        yt = kf.buffer("y_tuples", y.type.dtype, (*dshape[:m], rest), "inout", value=y)
        kf.note(f"ScatterND of {tuples} tuples of {m}, slices of {rest}, reduction {red}")
        with kf.loop(tuples) as t:
            js = [checked_index(kf, ib[t, Const(j, INDEX)], dshape[j]) for j in range(m)]
            with kf.loop(rest) as e:
                at = (*js, e)
                kf.store(yt, at, ub[t, e] if red == "none" else op(red, yt[at], ub[t, e]))
        return kf.finish()


def _nest(kf: KernelForm, shape, body, inner: str = "vector") -> None:
    """``body(index)`` inside serial loops over ``shape``, the innermost of kind ``inner``."""
    index: list = []

    def go(axis: int):
        if axis == len(shape):
            return body(tuple(index))
        with kf.loop(shape[axis], inner if axis == len(shape) - 1 else "serial") as i:
            index.append(i)
            go(axis + 1)
            index.pop()

    go(0)


def _as(v: Expr, dt: DType) -> Expr:
    return v if v.dtype is dt else cast(v, dt)


def _rounded(v: Expr, out: DType) -> Expr:
    return op("to_f16", v) if out is DType.f16 else v


LOWERINGS = (GatherElements(), GatherND(), Scatter(), NegativeLogLikelihoodLoss())

__all__ = ["GatherElements", "GatherND", "LOWERINGS", "NegativeLogLikelihoodLoss", "Scatter", "checked_index"]
