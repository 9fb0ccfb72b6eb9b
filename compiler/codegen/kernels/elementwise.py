"""Elementwise and broadcast ops of every element type as one loop nest in the loop form, and view
ops (Reshape & co) as aliases."""
from __future__ import annotations

import math

import numpy as np

from ...ir.ops import shape as sh
from ..loops import KernelForm, Kernel
from ..loops.broadcast import merge_axes
from ..loops.expr import STORAGE_TYPES, Const, compute_type
from ..loops.scalar import SCALAR, per_tensor_quantization, scalar
from ..loops.scalar import reason as scalar_reason
from .base import FormLowering, KernelGroup, Lowering, dtype_reason


def inlined(v) -> bool:
    """A constant of one element: compiled into the code (not read through a pointer)."""
    return v.const is not None and v.const.size == 1


def inline_const(v) -> Const:
    """A one-element constant (``inlined``) as the expression compiled in."""
    dt = compute_type(v.type.dtype)
    x = np.asarray(v.const).reshape(())
    return Const(bool(x) if dt.short == "bool" else float(x) if dt.is_float else int(x), dt)


def chain_lets(kf: KernelForm, nodes, env: dict) -> dict:
    """Each node's result of an elementwise chain as a ``let`` of ``kf``; ``env`` (id(value) ->
    expression) holds the chain's operands and receives the results."""
    for n in nodes:
        y = scalar(n.op, [None if v is None else env[id(v)] for v in n.inputs], n.outputs[0].type.dtype)
        env[id(n.outputs[0])] = kf.let(y)
    return env


class Elementwise(FormLowering):
    """Any chain of elementwise/broadcast ops (``loops.scalar.SCALAR``) on any element type the loop
    form holds: one loop nest over the result's shape (axes merged where every operand moves
    alike), operands broadcast with compiled-in strides, one-element constants compiled in, the
    outermost loop split among the threads."""

    ops = tuple(c for c in SCALAR if c is not sh.Identity)

    #: elements per parallel task at least (smaller kernels run on the calling thread)
    PARALLEL_MIN = 1 << 15

    def check(self, group: KernelGroup) -> str | None:
        for n in group.nodes:
            if type(n.op) not in SCALAR:
                return f"{n.op.name} is not an elementwise op"
            if not per_tensor_quantization(n):
                return f"{n.op.name} with parameters per axis or per block (the {n.op.name} lowering's)"
            if len(n.outputs) != 1:
                return f"{n.op.name} has {len(n.outputs)} results"
            why = dtype_reason([v for v in list(n.inputs) + list(n.outputs) if v is not None],
                               allowed=tuple(STORAGE_TYPES)) or \
                scalar_reason(n.op, [None if v is None else v.type.dtype for v in n.inputs], n.outputs[0].type.dtype)
            if why:
                return why
        if any(tuple(o.shape) != tuple(group.outputs[0].shape) for o in group.outputs):
            return "outputs of different shapes"
        return self.form_reason(group)

    def in_place(self, group: KernelGroup) -> list[tuple[int, int]]:
        """Any output may overwrite an input of its shape and type (each point reads all its inputs
        before it writes), in order of preference; the program builder picks at most one input per
        output and one output per input."""
        return [(k, j) for k, o in enumerate(group.outputs) for j, v in enumerate(group.inputs)
                if v.const is None and tuple(v.shape) == tuple(o.shape) and v.type.dtype is o.type.dtype]

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        in_place = dict(in_place or {})
        shape = tuple(group.outputs[0].shape)
        reads = [v for v in group.inputs if not inlined(v)]
        sizes, strides = merge_axes(shape, [v.shape for v in reads] + [n.outputs[0].shape for n in group.nodes])
        kf = KernelForm(name)
        bufs = {}
        for j, v in enumerate(group.inputs):
            if not inlined(v):
                role = "inout" if j in in_place.values() else "in"
                bufs[id(v)] = kf.buffer(f"in{j}", v.type.dtype, sizes, role, strides[reads.index(v)], value=v)
        outs = []
        for k, o in enumerate(group.outputs):
            outs.append(bufs[id(group.inputs[in_place[k]])] if k in in_place else
                        kf.buffer(f"out{k}", o.type.dtype, sizes, "out", value=o))
        inner = math.prod(sizes[1:])
        grain = -(-self.PARALLEL_MIN // max(inner, 1))
        with kf.loop(sizes[0], "parallel", grain=grain) as i0:
            index = [i0]

            def body():
                env = {id(v): inline_const(v) if inlined(v) else bufs[id(v)][tuple(index)] for v in group.inputs}
                chain_lets(kf, group.nodes, env)
                for o, buf in zip(group.outputs, outs):
                    kf.store(buf, tuple(index), env[id(o)])

            def nest(axis: int):
                if axis == len(sizes):
                    return body()
                kind = "vector" if axis == len(sizes) - 1 else "serial"
                with kf.loop(sizes[axis], kind) as i:
                    index.append(i)
                    nest(axis + 1)

            nest(1)
        return kf.finish()


class View(Lowering):
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity: the result is the input's buffer (no code), for
    every element type a buffer holds (the bytes are not looked at)."""

    ops = (sh.Reshape, sh.Flatten, sh.Squeeze, sh.Unsqueeze, sh.Identity)
    alias = True

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        why = dtype_reason([x, y], allowed=tuple(STORAGE_TYPES))
        if why:
            return why
        if x.type.dtype is not y.type.dtype or x.type.numel != y.type.numel:
            return "not a view"
        return None

