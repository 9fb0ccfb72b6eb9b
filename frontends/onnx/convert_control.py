"""Import of the control-flow ops (If, Loop, Scan, SequenceMap): their bodies, closure-converted.

Each body imports as a graph of its own (``NodeContext.subgraph``) with input types taken from the
node's inputs (ONNX bodies often declare no shapes, or none at all); every outer value the body reads
becomes a *capture*: an extra body input after the ONNX ones and an extra node input after the ONNX
ones (``num_captures`` on Loop, Scan and SequenceMap; If's two branches both take the union of what
either reads). Loop-carried values and Scan states take the join of their initial type and what the
body returns, found by importing the body again until the types no longer change.

Opset 8's Scan (a batch axis and ``sequence_lens``) becomes a Loop over the batch whose body runs the
opset 9 form on one batch entry; ``sequence_lens`` is accepted when it is absent or known to give every
sequence its full length.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from compiler.errors import ModelError, UnsupportedError
from compiler.ir import ops
from compiler.ir.graph import Graph, Value
from compiler.ir.ops.control import bind, inline_graph, join_types, relax
from compiler.ir.types import DType, SequenceType, TensorType

if TYPE_CHECKING:
    from .importer import NodeContext as Ctx

#: how many times a Loop or Scan body is imported again to find the loop-carried types
MAX_ROUNDS = 4

_SCALAR_I64 = TensorType(DType.i64, ())
_SCALAR_BOOL = TensorType(DType.bool, ())


def _align(body: Graph, onnx_inputs: int, own: list[tuple[str, Value]], union: list[tuple[str, Value]]) -> None:
    """Make ``body``'s capture inputs follow ``union`` (adding inputs for values it does not read)."""
    inner = dict(zip([id(v) for _, v in own], body.inputs[onnx_inputs:]))
    taken = {v.name for v in body.inputs}
    caps = []
    for name, outer in union:
        v = inner.get(id(outer))
        if v is None:
            n, k = name, 1
            while n in taken:
                n, k = f"{name}_{k}", k + 1
            taken.add(n)
            v = Value(outer.type, name=n)  # a branch input for a value only the other branch reads
        caps.append(v)
    body.inputs[onnx_inputs:] = caps


def _union(*lists: list[tuple[str, Value]]) -> list[tuple[str, Value]]:
    out: list[tuple[str, Value]] = []
    seen: set[int] = set()
    for lst in lists:
        for name, v in lst:
            if id(v) not in seen:
                seen.add(id(v))
                out.append((name, v))
    return out


def convert_if(ctx: Ctx) -> list[Value]:
    if not ctx.inputs or ctx.inputs[0] is None:
        raise ModelError(ctx.where("input cond is missing"))
    cond = ctx.inputs[0]
    if cond.known is not None and np.asarray(cond.known).size == 1:
        # the condition is known: only the taken branch is imported, inline (the other one need not even
        # be valid for these inputs: ONNX's function expansions switch on an input's rank this way)
        attr = "then_branch" if bool(np.asarray(cond.known).ravel()[0]) else "else_branch"
        branch, caps = ctx.subgraph(attr, [])
        outs = inline_graph(branch, [v for _, v in caps], ctx.graph)
        if ctx.num_outputs > len(outs):
            raise ModelError(ctx.where(f"has {ctx.num_outputs} outputs, its {attr} returns {len(outs)}"))
        return outs
    then_g, then_caps = ctx.subgraph("then_branch", [])
    else_g, else_caps = ctx.subgraph("else_branch", [])
    caps = _union(then_caps, else_caps)
    _align(then_g, 0, then_caps, caps)
    _align(else_g, 0, else_caps, caps)
    op = ops.lookup("If")(then_branch=then_g, else_branch=else_g)
    return ctx.emit(op, [ctx.inputs[0]] + [v for _, v in caps], num_outputs=ctx.num_outputs)


def _carried_body(ctx: Ctx, attr: str, fixed_before: list, carried: list, fixed_after: list,
                  out_offset: int) -> tuple[Graph, list[tuple[str, Value]]]:
    """Import a Loop/Scan body whose inputs are ``fixed_before + carried + fixed_after`` (types);
    the carried value k comes back as body result ``out_offset + k``. The carried types are widened
    (joined with what the body returns) until the body returns what it takes.

    The types found are remembered (``importer.carried_types``): when the enclosing body is imported
    again (an outer loop widening its own types), this search starts from them, so nested loops cost one
    import per level and round, not rounds ** depth."""
    imp = ctx.importer
    key = (imp.path, imp.index, attr, tuple(fixed_before), tuple(carried), tuple(fixed_after))
    types = list(imp.carried_types.get(key, carried))
    error: Exception | None = None
    for round_ in range(MAX_ROUNDS + 1):
        try:
            body, caps = ctx.subgraph(attr, fixed_before + types + fixed_after)
        except (ModelError, UnsupportedError) as e:
            # the precise initial types may not hold in every iteration (a value that grows): widen
            relaxed = [relax(t) for t in types]
            if relaxed == types:
                raise
            error, types = e, relaxed
            continue
        outs = body.outputs[out_offset:out_offset + len(types)]
        if len(outs) < len(types):
            return body, caps  # the op's validation says what is wrong
        env: dict = {}
        if all(bind(t, o.type, env, strict=True) is None for t, o in zip(types, outs)):
            imp.carried_types[key] = tuple(types)
            return body, caps
        new = []
        for t, o in zip(types, outs):
            j = join_types(t, o.type)
            if j is None:
                raise ModelError(ctx.where(f"attribute {attr!r}: a loop-carried value is taken as {t} and returned as "
                                           f"{o.type}; its element type or rank must not change between iterations"))
            new.append(j if round_ < MAX_ROUNDS - 1 else relax(j))
        types = new
    raise ModelError(ctx.where(f"attribute {attr!r}: cannot find types for its loop-carried values"
                               + (f" ({error})" if error else "")))


def convert_loop(ctx: Ctx) -> list[Value]:
    ins = list(ctx.inputs) + [None] * max(0, 2 - len(ctx.inputs))
    m, cond, carried = ins[0], ins[1], ins[2:]
    if any(v is None for v in carried):
        raise ModelError(ctx.where("a loop-carried input is missing"))
    body, caps = _carried_body(ctx, "body", [_SCALAR_I64, _SCALAR_BOOL], [v.type for v in carried], [], 1)
    op = ops.lookup("Loop")(body=body, num_captures=len(caps))
    return ctx.emit(op, [m, cond] + carried + [v for _, v in caps], num_outputs=ctx.num_outputs)


def _scan_attrs(ctx: Ctx, m: int) -> dict:
    attrs = {k: v for k, v in ctx.attrs.items() if k != "body"}
    attrs["num_scan_inputs"] = m
    return attrs


def _slice_type(ctx: Ctx, t, axis: int, j: int) -> TensorType:
    if not isinstance(t, TensorType) or t.rank < 1:
        raise ModelError(ctx.where(f"scan input {j} must be a tensor of rank >= 1, got {t}"))
    if not -t.rank <= axis < t.rank:
        raise ModelError(ctx.where(f"scan_input_axes[{j}] = {axis} is out of range for rank {t.rank}"))
    axis %= t.rank
    return TensorType(t.dtype, t.shape[:axis] + t.shape[axis + 1:])


def convert_scan(ctx: Ctx) -> list[Value]:
    if ctx.opset < 9:
        return _convert_scan8(ctx)
    m = ctx.attrs.get("num_scan_inputs")
    if not isinstance(m, int) or m < 1:
        raise ModelError(ctx.where(f"attribute num_scan_inputs must be a positive int, got {m!r}"))
    ins = list(ctx.inputs)
    if any(v is None for v in ins) or len(ins) < m:
        raise ModelError(ctx.where(f"takes initial states and {m} scan input(s), got {len(ins)} input(s)"))
    n = len(ins) - m
    axes = list(ctx.attrs.get("scan_input_axes") or [0] * m)
    if len(axes) != m:
        raise ModelError(ctx.where(f"scan_input_axes has {len(axes)} entries, expected {m}"))
    slices = [_slice_type(ctx, v.type, a, j) for j, (v, a) in enumerate(zip(ins[n:], axes))]
    body, caps = _carried_body(ctx, "body", [], [v.type for v in ins[:n]], slices, 0)
    op = ctx.make(ops.lookup("Scan"), dict(_scan_attrs(ctx, m), body=body, num_captures=len(caps)))
    return ctx.emit(op, ins + [v for _, v in caps], num_outputs=ctx.num_outputs)


def _convert_scan8(ctx: Ctx) -> list[Value]:
    """Opset 8: inputs (sequence_lens?, states [B, ...], scan inputs [B, T, ...]); ``directions``.
    Becomes Loop(M=B) { Scan (opset 9 form) of batch entry i }, whose stacked results are the
    batched final states and scan outputs."""
    m = ctx.attrs.get("num_scan_inputs")
    if not isinstance(m, int) or m < 1:
        raise ModelError(ctx.where(f"attribute num_scan_inputs must be a positive int, got {m!r}"))
    ins = list(ctx.inputs)
    seq_lens, rest = (ins[0] if ins else None), ins[1:]
    if len(rest) < m or any(v is None for v in rest):
        raise ModelError(ctx.where(f"takes sequence_lens, initial states and {m} scan input(s)"))
    n = len(rest) - m
    states, scans = rest[:n], rest[n:]
    for j, v in enumerate(rest):
        if not isinstance(v.type, TensorType) or v.type.rank < 1 + (j >= n):
            raise ModelError(ctx.where(f"input {j + 1} must be a batched tensor, got {v.type}"))
    length = scans[0].type.shape[1]
    if seq_lens is not None:
        known = seq_lens.known
        if known is None or not isinstance(length, int) or not np.all(np.asarray(known) == length):
            raise UnsupportedError(ctx.where(
                "sequence_lens shorter than the scan inputs' sequence axis is not supported; omit it, or give "
                "every sequence its full length as a constant"))
    directions = ctx.attrs.get("directions")
    unknown = sorted(set(ctx.attrs) - {"body", "num_scan_inputs", "directions"})
    if unknown:
        raise UnsupportedError(ctx.where(f"attribute(s) {', '.join(unknown)} not supported"))
    state_types = [TensorType(v.dtype, v.type.shape[1:]) for v in states]
    slice_types = [TensorType(v.dtype, v.type.shape[2:]) for v in scans]
    body, caps = _carried_body(ctx, "body", [], state_types, slice_types, 0)
    scan = ops.lookup("Scan")(body=body, num_scan_inputs=m, num_captures=len(caps),
                              scan_input_directions=None if directions is None else tuple(directions))
    # the Loop body: (i, cond, states..., scans..., captures...) -> (cond, Scan of entry i...)
    lb = Graph(f"{body.name}_batch")
    i = lb.add_input("i", _SCALAR_I64)
    cond = lb.add_input("cond", _SCALAR_BOOL)
    outer = states + scans + [v for _, v in caps]
    names = [v.name or f"in{k}" for k, v in enumerate(states + scans)] + [name for name, _ in caps]
    taken = {"i", "cond"}
    inner = []
    for name, v in zip(names, outer):
        nm, k = name, 1
        while nm in taken:
            nm, k = f"{name}_{k}", k + 1
        taken.add(nm)
        inner.append(lb.add_input(nm, v.type))
    gather = ops.lookup("Gather")(axis=0)
    entries = [lb.add(gather, x, i) for x in inner[:n + m]]
    res = lb.add_node(scan, entries + inner[n + m:], name=ctx.name).outputs
    lb.set_outputs([cond] + list(res), ["cond"] + [f"out{k}" for k in range(len(res))])
    if isinstance(states[0].type.shape[0] if states else scans[0].type.shape[0], int):
        trip = ctx.const(np.array((states or scans)[0].type.shape[0], dtype=np.int64))
    else:
        trip = ctx.emit(ops.lookup("Shape")(start=0, end=1), [(states or scans)[0]])[0]
    loop = ops.lookup("Loop")(body=lb, num_captures=len(outer))
    return ctx.emit(loop, [trip, None] + outer, num_outputs=ctx.num_outputs)


def convert_sequence_map(ctx: Ctx) -> list[Value]:
    ins = list(ctx.inputs)
    if not ins or any(v is None for v in ins):
        raise ModelError(ctx.where("inputs are missing"))
    types = []
    for k, v in enumerate(ins):
        t = v.type
        if isinstance(t, SequenceType):
            if t.elem_shape is None:
                raise UnsupportedError(ctx.where(
                    f"input {k} is a sequence whose elements have unknown rank ({t}); the body needs their rank "
                    "(give the sequence input its element shape, with input_shapes=)"))
            t = t.elem
        types.append(t)
    body, caps = ctx.subgraph("body", types)
    op = ops.lookup("SequenceMap")(body=body, num_captures=len(caps))
    return ctx.emit(op, ins + [v for _, v in caps], num_outputs=ctx.num_outputs)


CONVERTERS: dict[tuple[str, str], Callable[[Ctx], list[Value]]] = {
    ("", "If"): convert_if,
    ("", "Loop"): convert_loop,
    ("", "Scan"): convert_scan,
    ("", "SequenceMap"): convert_sequence_map,
}
