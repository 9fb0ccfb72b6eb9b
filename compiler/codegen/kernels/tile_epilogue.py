"""Epilogues inside the GEMM: a bias and an elementwise chain applied to each block of C as soon as
the GEMM has finished it, while the block is still in cache (``kiln_sgemm_ep``, docs/fusion.md).

A lowering whose result is one GEMM per *call index* (a convolution: one per image and group) sees
its output tensor ``S`` as C matrices: axis ``row_axis`` of ``S`` gives C's rows, the axes after it,
flattened, C's columns, and the axes before it (with a first row) pick the call. Every operand of
the epilogue (the bias, the chain's other inputs, the chain's outputs) is then addressed in a block
``C[i0:i1, j0:j1]`` as ``base + i * row + j * col`` with ``col`` 0 (constant along a row, e.g. a
per-channel scale) or 1 (laid out like ``S``, e.g. a residual). Operands that do not fit this form
(broadcast over some columns' axes only) make ``TileEpilogue.reason`` refuse; the lowering then
keeps its separate passes.

Code: the chain is rebuilt on 1-D values (``[L]`` for a ``col = 1`` operand, ``[1]`` for ``col =
0``) and printed from the loop form as a row function over a run-time length (``RowChain``); the epilogue function
``ep(ctx, i0, i1, j0, j1)`` calls it once per row of the block, with each operand's pointer
computed from the base pointers in ``ctx``, which the kernel fills before each GEMM call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from llvmlite import ir

from ...ir import ops
from ...ir.graph import Graph, Node, Value
from ...ir.types import TensorType
from ..llvm.elementwise import _For, no_vectorize_metadata
from ..loops import KernelForm, print_llvm
from ..loops.expr import FormError, Var, compute_type
from ..loops.llvm import MEMORY_TYPES, expr_llvm, vector_reason
from ..loops.scalar import scalar
from .base import I64, PTR, VOID, KernelBuilder, c64, strides_of
from .elementwise import chain_lets, inline_const, inlined

#: the length of the synthetic rows (any size > 1: the row function takes its length at run time)
_L = 16
#: the bound of a row function's run-time length (the caller's row: a GEMM block or panel row)
ROW_BOUND = 1 << 40


def _broadcast_strides(shape: Sequence[int], out: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a row-major tensor of ``shape`` read at the index of ``out`` (broadcast
    dimensions, and those where ``out`` has size 1 so the index is always 0: stride 0)."""
    shape = (1,) * (len(out) - len(shape)) + tuple(int(d) for d in shape)
    return tuple(0 if d == 1 or o == 1 else s for d, o, s in zip(shape, out, strides_of(shape)))


def dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a row-major tensor of ``shape`` read at its own index, as ``_broadcast_strides``
    gives them (size-1 axes: 0), for comparing an operand's layout with it."""
    return _broadcast_strides(shape, shape)


class TileEpilogue:
    """The epilogue of one GEMM-based kernel (see the module docstring).

    ``nodes``: the chain (elementwise ops, in order) reading ``c`` (the GEMM's result, a value of
    shape ``S``); ``bias``: a 1-D value added to each row of C first (or, with ``bias_strides``, a
    value read at those strides over ``S``: a Gemm's C), or None. ``outputs``: the
    chain's values needed outside, each written to its own buffer, except ``in_place``, which is
    written over C: the kernel's final result when C is its buffer, or ``c`` itself (C + bias) when
    the GEMM's result is needed outside too, or when the bias is the whole epilogue.
    """

    def __init__(self, k: KernelBuilder, c: Value, nodes: Sequence[Node], outputs: Sequence[Value],
                 in_place: Value | None, bias: Value | None, row_axis: int, bias_strides: tuple | None = None,
                 rows_from: int | None = None):
        self.k, self.c, self.row_axis = k, c, row_axis
        self.rows_from = row_axis if rows_from is None else rows_from
        if in_place is None and bias is not None:
            in_place = c  # C + bias is the GEMM's result: written over C
        shape = tuple(int(d) for d in c.shape)
        self.shape = shape
        row = RowChain(lambda st: self._col(st))
        full = tuple(strides_of(shape))
        cv = cv_in = row.operand(c, full)
        if bias is not None:
            per_row = tuple(1 if a == row_axis else 0 for a in range(len(shape)))
            cv = row.g.add(ops.elementwise.Add(), cv, row.operand(bias, bias_strides or per_row))
        row.synth[id(c)] = cv
        row.add_chain(nodes, shape)
        # what the row function writes: first the value written over C (if any), then the others
        outs = ([in_place] if in_place is not None else []) + [v for v in outputs if v is not in_place]
        in_place_map = {0: [sv for _, _, sv in row.operands].index(cv_in)} if in_place is not None else {}
        row_fn, self.kern, args = row.emit(k, f"{k.name}.eprow", outs, in_place_map)
        self.args: list[tuple[Value, tuple[int, ...]]] = args + [(outs[o], full) for o in self.kern.pointer_outputs]
        self.fn = self._emit_callback(row_fn)

    def _col(self, strides: tuple[int, ...]) -> int:
        """0: the operand holds one value per row of C (the same for all its columns); 1: it moves
        with C's columns (laid out like the result along them)."""
        return 1 if any(strides[self.row_axis + 1:]) else 0

    def _row(self, strides: tuple[int, ...]) -> int:
        """The operand's stride from one row of C to the next. C's rows are the axes
        ``rows_from..row_axis`` folded; ``reason`` allowed only operands laid out like the result over
        them (or constant over them), so the stride is that of the innermost of them longer than 1
        (size-1 axes have stride 0: with a [B, 1, D] result it is B's, not the 1's)."""
        long = [a for a in range(self.rows_from, self.row_axis + 1) if self.shape[a] > 1]
        return strides[long[-1]] if long else 0

    @staticmethod
    def reason(c: Value, nodes: Sequence[Node], row_axis: int, extra: Sequence[Value] = (),
               rows_from: int | None = None) -> str | None:
        """Why the chain cannot run as a tile epilogue of a GEMM whose C rows are ``row_axis`` of
        ``c`` (None if it can). ``extra``: other operands the chain reads (checked like its inputs).
        ``rows_from``: C's rows are the axes ``rows_from..row_axis`` folded (a linear layer on a
        batch of sequences): each operand must then be laid out like the result over them, or be
        constant over them all."""
        shape = tuple(int(d) for d in c.shape)
        tail = dense_strides(shape)[row_axis + 1:]
        full = dense_strides(shape)
        lo = row_axis if rows_from is None else rows_from
        produced = {id(c)} | {id(o) for n in nodes for o in n.outputs}
        for v in [v for n in nodes for v in n.inputs] + list(extra):
            if v is None or id(v) in produced or inlined(v):
                continue
            if tuple(int(d) for d in v.shape) == shape:
                continue
            if len(v.shape) > len(shape):
                return f"{v} does not broadcast to the result"
            st = _broadcast_strides(v.shape, shape)
            cols = st[row_axis + 1:]
            if any(cols) and tuple(cols) != tuple(tail):
                return f"{v} is broadcast over some of the columns' axes only"
            rows = st[lo:row_axis + 1]
            if lo < row_axis and any(rows) and tuple(rows) != tuple(full[lo:row_axis + 1]):
                return f"{v} is broadcast over some of the rows' axes only"
        return None

    def _emit_callback(self, row_fn: ir.Function) -> ir.Function:
        k = self.k
        fn = ir.Function(k.module, ir.FunctionType(VOID, [PTR, I64, I64, I64, I64]), f"{k.name}.ep")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        ctx, i0, i1, j0, j1 = fn.args
        nr = k.services.gemm_cfg.NR
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        bases = [b.load(b.gep(ctx, [c64(j)], source_etype=PTR), typ=PTR) for j in range(len(self.args))]
        # (the row loop is not vectorized: its body, whole vectors along the row, would be
        # gathered across rows)
        with _For(b, b.sub(i1, i0), "eprow", no_vectorize_metadata(k.module)) as r:
            i = b.add(i0, r)
            ptrs = []
            for base, (v, st) in zip(bases, self.args):
                off = b.add(b.mul(i, c64(self._row(st))), b.mul(j0, c64(self._col(st))))
                ptrs.append(b.gep(base, [off], inbounds=True, source_etype=MEMORY_TYPES[v.type.dtype]))
            # the GEMM's blocks are NR columns wide but at C's right edge: with the width a
            # constant the inlined row is a few whole vectors (no remainder loops; measured 2x
            # faster on 24-wide rows, which are 25% of a K=64 1x1 conv's time otherwise)
            n = b.sub(j1, j0)
            with b.if_else(b.icmp_signed("==", n, c64(nr))) as (full, edge):
                with full:
                    b.call(row_fn, ptrs + [c64(nr)])
                with edge:
                    b.call(row_fn, ptrs + [n])
        b.ret_void()
        return fn

    def context(self, lead: Sequence[ir.Value], row0: ir.Value, bases: dict | None = None) -> ir.Value:
        """Fill the epilogue's context for one GEMM call (in the kernel being built): the call's
        indices over the axes before ``row_axis`` and its first row. ``bases``: id(value) -> the
        buffer holding it (laid out like the value) for values that have none of their own (C in a
        kernel's scratch). Returns the context pointer."""
        k = self.k
        b = k.b
        table = k.f.alloca(PTR, len(self.args), name="epctx")
        for j, (v, st) in enumerate(self.args):
            off = b.mul(row0, c64(self._row(st)))
            for a, idx in enumerate(lead):
                if st[a]:
                    off = b.add(off, b.mul(idx, c64(st[a])))
            base = (bases or {}).get(id(v))
            b.store(k.at(k.ptr(v) if base is None else base, off, MEMORY_TYPES[v.type.dtype]),
                    b.gep(table, [c64(j)], source_etype=PTR))
        return table

    def call_args(self, lead: Sequence[ir.Value], row0: ir.Value,
                  bases: dict | None = None) -> tuple[ir.Value, ir.Value]:
        """``(function, context)`` for ``call_sgemm(..., epilogue=...)`` (``bases`` as for ``context``)."""
        return self.fn, self.context(lead, row0, bases)


@dataclass(frozen=True)
class RowFunction:
    """What ``RowChain.emit`` made: ``void name(inputs..., pointer outputs..., int64 n)``."""

    fn: ir.Function
    #: the synthetic inputs, in argument order
    inputs: tuple
    #: the indices of the outputs that have a pointer argument (all but those written in place)
    pointer_outputs: tuple


class RowChain:
    """An elementwise chain rebuilt on one row, for a row function (``emit``): each operand of the
    chain is a 1-D input, ``[_L]`` when it moves along the row (``col(strides)``: its strides over
    the chain's shape) or ``[1]`` when it is constant along it; scalar constants are inlined. Used by
    the tile epilogue (rows of a GEMM's C) and the conv prologue (rows of a panel of B)."""

    def __init__(self, col):
        self.col = col
        self.g = Graph("row")
        self.synth: dict[int, Value] = {}  # id(a value of the group) -> its value in ``g``
        self.operands: list[tuple[Value, tuple[int, ...], Value]] = []  # (value, strides, synthetic input)

    def operand(self, v: Value, strides: tuple[int, ...]) -> Value:
        key = id(v)
        if key not in self.synth:
            if inlined(v):
                self.synth[key] = self.g.add_constant(v.const.reshape([1]).astype(v.type.dtype.np))
            else:
                ty = TensorType(v.type.dtype, [_L] if self.col(strides) else [1])
                self.synth[key] = self.g.add_input(f"in{len(self.operands)}", ty)
                self.operands.append((v, strides, self.synth[key]))
        return self.synth[key]

    def add_chain(self, nodes: Sequence[Node], shape: tuple) -> None:
        """The chain's nodes, their outside operands read broadcast over ``shape``."""
        for n in nodes:
            ins = [None if v is None else self.synth[id(v)] if id(v) in self.synth else
                   self.operand(v, _broadcast_strides(v.shape, shape)) for v in n.inputs]
            self.synth[id(n.outputs[0])] = self.g.add(n.op, *ins)

    def emit(self, k: KernelBuilder, name: str, outputs: Sequence[Value], in_place: dict | None = None,
             stride: int = 1):
        """(the internal row function ``name(inputs..., pointer outputs..., n)`` writing ``outputs``,
        a ``RowFunction``, its inputs in argument order as (value, strides)). The inputs are the
        operands in the order they were added; ``in_place``: {output index: input index} written
        through that input's pointer. The row is a loop-form kernel over the run-time size ``n``
        (its operands ``[_L]`` read at ``i * stride``, ``[1]`` broadcast), printed into the function."""
        in_place = dict(in_place or {})
        ins = [sv for _, _, sv in self.operands]
        pointer_outputs = tuple(o for o in range(len(outputs)) if o not in in_place)
        fn = ir.Function(k.module, ir.FunctionType(VOID, [PTR] * (len(ins) + len(pointer_outputs)) + [I64]), name)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        for a in fn.args[:-1]:
            a.add_attribute("noalias")
        kf = KernelForm(name)
        n = kf.size("n", ROW_BOUND)
        bufs = {id(sv): kf.buffer(f"in{j}", sv.type.dtype, (ROW_BOUND,), "inout" if j in in_place.values() else "in",
                                  strides=(stride if int(sv.shape[0]) > 1 else 0,), value=fn.args[j])
                for j, sv in enumerate(ins)}
        outs = [bufs[id(ins[in_place[o]])] if o in in_place else
                kf.buffer(f"out{o}", outputs[o].type.dtype, (ROW_BOUND,), "out", value=fn.args[len(ins) + pointer_outputs.index(o)])
                for o in range(len(outputs))]
        # operands constant along the row are read once, before the loop
        fixed = {id(sv): kf.let(bufs[id(sv)][0], "fixed") for sv in ins if int(sv.shape[0]) == 1}
        with kf.loop(n, "vector") as i:
            env = {id(c): inline_const(c) for c in self.g.constants}
            env.update({key: fixed.get(key) or buf[i] for key, buf in bufs.items()})
            chain_lets(kf, self.g.nodes, env)
            for v, buf in zip(outputs, outs):
                kf.store(buf, i, env[id(self.synth[id(v)])])
        entry, body = fn.append_basic_block("entry"), fn.append_basic_block("row")
        ir.IRBuilder(entry).branch(body)  # the accumulators' allocas go to the entry block
        b = ir.IRBuilder(body)
        print_llvm(_RowBuilder(b, fn, k), kf.finish(), sizes=[fn.args[-1]])
        b.ret_void()
        by_synth = {id(sv): (v, st) for v, st, sv in self.operands}
        return fn, RowFunction(fn, tuple(ins), pointer_outputs), [by_synth[id(s)] for s in ins]

    def _vector_exprs(self, outputs: Sequence[Value]):
        """(the expressions of ``outputs`` over one variable per operand, the variables), or why the
        chain has no vector form."""
        if any(int(sv.shape[0]) == 1 for _, _, sv in self.operands):
            return "an operand is constant along the row"
        env = {id(c): inline_const(c) for c in self.g.constants}
        xs = []
        for _, _, sv in self.operands:
            xs.append(Var(sv.name, compute_type(sv.type.dtype)))
            env[id(sv)] = xs[-1]
        for n in self.g.nodes:
            env[id(n.outputs[0])] = scalar(n.op, [None if v is None else env[id(v)] for v in n.inputs],
                                           n.outputs[0].type.dtype)
        es = [env[id(self.synth[id(v)])] for v in outputs]
        return next((why for why in map(vector_reason, es) if why), None) or (es, xs)

    def vector_reason(self, outputs: Sequence[Value]) -> str | None:
        """Why ``vector`` cannot compute ``outputs``, or None."""
        got = self._vector_exprs(outputs)
        return got if isinstance(got, str) else None

    def vector(self, b: ir.IRBuilder, math, values: Sequence[ir.Value], outputs: Sequence[Value]) -> list[ir.Value]:
        """The chain on explicit vectors at ``b``'s position (where ``vector_reason`` is None):
        ``values`` one vector per operand (in the order added, in its compute type), the vector of
        each of ``outputs``: lane by lane what the row function computes (the same scalar semantics
        printed on vectors, ``expr_llvm``)."""
        got = self._vector_exprs(outputs)
        if isinstance(got, str):
            raise FormError(f"the chain has no vector form: {got}")
        es, xs = got
        bound = {id(x): v for x, v in zip(xs, values, strict=True)}
        return [expr_llvm(b, math, e, bound, values[0].type.count) for e in es]


class _RowBuilder:
    """What the LLVM printer needs to print a row kernel into a function of its own (its buffers
    bound to the function's arguments: no slots, scratch or parallel loops)."""

    def __init__(self, b: ir.IRBuilder, fn: ir.Function, k: KernelBuilder):
        self.b, self.fn, self.module, self.math = b, fn, k.module, k.math

    def note(self, text: str) -> None:
        pass


def plan_tile_epilogue(k: KernelBuilder, y: Value, epilogue, bias: Value | None, row_axis: int,
                       rows_from: int | None = None, broadcast_bias: bool = False
                       ) -> tuple[TileEpilogue | None, bool]:
    """(the ``TileEpilogue`` of a GEMM writing ``y``, or None; whether it takes the fused chain).

    ``epilogue``: (chain nodes, their values needed outside, the value written over the result's
    buffer or None) from ``Epilogue``, or None; ``bias``: a value added first, per row of C (a conv's
    bias) or, with ``broadcast_bias``, read broadcast to ``y`` (a Gemm's C); ``row_axis`` and
    ``rows_from`` as for ``TileEpilogue.reason``. A chain an operand refuses is left to the caller
    (False), the bias alone still runs inside the GEMM when it can."""
    if epilogue is None and bias is None:
        return None, False
    nodes, outputs, over = epilogue or ((), (), None)
    extra = [bias] if bias is not None and broadcast_bias else []
    fused = epilogue is not None and TileEpilogue.reason(y, nodes, row_axis, extra, rows_from) is None
    if not fused:
        if bias is None or (extra and TileEpilogue.reason(y, (), row_axis, extra, rows_from) is not None):
            return None, False
        nodes, outputs, over = (), (), None
    strides = _broadcast_strides(bias.shape, y.shape) if extra else None
    return TileEpilogue(k, y, nodes, outputs, over, bias, row_axis, bias_strides=strides, rows_from=rows_from), fused


__all__ = ["RowChain", "TileEpilogue", "plan_tile_epilogue"]
