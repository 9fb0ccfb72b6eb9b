"""Control flow: If, Loop, Scan and SequenceMap, whose bodies are subgraphs held as attributes.

A body is a ``Graph`` (an attribute annotated ``Graph``), a function of its own inputs only: the ONNX
importer *closure-converts* every value a body reads from an enclosing graph into an explicit extra
input of the node (after its ONNX inputs) and a matching extra input of the body (after the ONNX body
inputs), so no value is used across graph boundaries and use-lists stay per graph (see docs/ir.md,
"Control flow"). ``num_captures`` counts those trailing inputs on Loop, Scan and SequenceMap; If's
branches both take every input after ``cond`` (the union of what either branch reads).

Type inference reads the bodies' recorded signatures: each node input is *bound* to the body input it
feeds (element types must agree, a static body dim must match; a body's symbolic dims are its own,
bound afresh by each run), and the body's result types, with its symbols replaced by what they were
bound to, give the node's. A loop-carried value's type is the join of its initial type and what the
body returns (a dim that changes between iterations becomes unknown), iterated to a fixed point.

``compute`` runs the bodies with the reference interpreter (``run_graph``). The ops are deterministic
when their bodies are, so constant folding may run them on known inputs, and CSE may merge two nodes
only with the very same body objects (subgraph attributes compare by identity).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from ..graph import Graph, Node, Value
from ..types import DType, OptionalType, SequenceType, TensorType, join_dims, join_shapes
from .base import OpDef, Pattern, known_ints

#: a Loop whose trip count is known runs at compile time (for known values) only up to this many times
FOLD_TRIP_LIMIT = 1 << 12


# ---------------------------------------------------------------------------------------------
# Types across a body boundary
# ---------------------------------------------------------------------------------------------

def _bind_dim(formal, actual, env: dict, strict: bool) -> bool:
    """Bind one body dim to the dim given to it; False when they contradict."""
    if formal is None:
        return True
    if isinstance(formal, int):
        if isinstance(actual, int):
            return actual == formal
        return not strict  # an unknown or symbolic size may be right (the interpreter checks at run time)
    if formal in env:
        bound = env[formal]
        if bound != actual:
            if isinstance(bound, int) and isinstance(actual, int):
                return False
            env[formal] = bound if isinstance(bound, int) else actual if isinstance(actual, int) else None
        return True
    env[formal] = actual
    return True


def bind(formal, actual, env: dict, strict: bool = False) -> str | None:
    """Bind the body input type ``formal`` to the type ``actual`` of the value given to it, recording
    what its symbolic dims stand for in ``env``; returns why they do not fit (None when they do).
    ``strict``: an unknown dim or length does not fit a static one (used for loop-carried values)."""
    if isinstance(formal, OptionalType):
        if isinstance(actual, OptionalType):
            actual = actual.elem
        return bind(formal.elem, actual, env, strict)
    if isinstance(actual, OptionalType):
        return f"an optional ({actual}) is given where the body takes {formal}"
    if isinstance(formal, SequenceType):
        if not isinstance(actual, SequenceType):
            return f"a {actual} value is given where the body takes a sequence ({formal})"
        if actual.dtype is not formal.dtype:
            return f"element type {actual.dtype} is given where the body takes {formal.dtype} ({formal})"
        if formal.length is not None and formal.length != actual.length and (strict or actual.length is not None):
            return f"a sequence of {actual.length if actual.length is not None else 'unknown'} element(s) is " \
                   f"given where the body takes {formal.length}"
        if formal.elem_shape is None:
            return None
        if actual.elem_shape is None:
            return None if not strict else f"elements of unknown rank are given where the body takes {formal}"
        return _bind_shape(formal.elem_shape, actual.elem_shape, env, strict, formal, actual)
    if isinstance(formal, TensorType):
        if not isinstance(actual, TensorType):
            return f"a {actual} value is given where the body takes a tensor ({formal})"
        if actual.dtype is not formal.dtype:
            return f"element type {actual.dtype} is given where the body takes {formal.dtype} ({formal})"
        return _bind_shape(formal.shape, actual.shape, env, strict, formal, actual)
    return f"the body input has no type: {formal!r}"


def _bind_shape(fs, as_, env, strict, formal, actual) -> str | None:
    if len(fs) != len(as_):
        return f"{actual} (rank {len(as_)}) is given where the body takes {formal} (rank {len(fs)})"
    for i, (f, a) in enumerate(zip(fs, as_)):
        if not _bind_dim(f, a, env, strict):
            return f"{actual} is given where the body takes {formal} (dimension {i})"
    return None


def substitute(t, env: dict):
    """``t`` (a body type) with its symbolic dims replaced by what ``env`` binds them to (unbound
    symbols become unknown)."""
    if isinstance(t, OptionalType):
        return OptionalType(substitute(t.elem, env))
    if isinstance(t, SequenceType):
        if t.elem_shape is None:
            return t
        return SequenceType(t.dtype, _subst_shape(t.elem_shape, env), t.length)
    if isinstance(t, TensorType):
        return TensorType(t.dtype, _subst_shape(t.shape, env))
    return t


def _subst_shape(shape, env):
    return tuple(env.get(d) if isinstance(d, str) else d for d in shape)


def join_types(a, b):
    """The type that describes both ``a`` and ``b`` (dims that differ become unknown); None when no
    type does (different element types, kinds, or tensor ranks)."""
    if a == b:
        return a
    if isinstance(a, OptionalType) or isinstance(b, OptionalType):
        ea = a.elem if isinstance(a, OptionalType) else a
        eb = b.elem if isinstance(b, OptionalType) else b
        j = join_types(ea, eb)
        return None if j is None else OptionalType(j)
    if a.dtype is not b.dtype:
        return None
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.rank != b.rank:
            return None
        return TensorType(a.dtype, tuple(join_dims(x, y) for x, y in zip(a.shape, b.shape)))
    if isinstance(a, SequenceType) and isinstance(b, SequenceType):
        return SequenceType(a.dtype, join_shapes(a.elem_shape, b.elem_shape),
                            a.length if a.length == b.length else None)
    return None


def relax(t):
    """``t`` with every dim unknown (and a sequence's element rank and length unknown)."""
    if isinstance(t, OptionalType):
        return OptionalType(relax(t.elem))
    if isinstance(t, SequenceType):
        return SequenceType(t.dtype)
    return TensorType(t.dtype, (None,) * t.rank)


def _carried_fixpoint(formals: Sequence[Value], initial: Sequence, outs: Sequence[Value],
                      fixed: Sequence[tuple[Value, object]]):
    """(env, final types) for loop-carried values: the body inputs ``formals`` start as ``initial``
    types and take each iteration's ``outs``; ``fixed`` are the other (formal, actual) pairs. Types
    only lose information from round to round, so this ends."""
    current = list(initial)
    for _ in range(64):
        env: dict = {}
        for f, a in fixed:
            bind(f.type, a, env)
        for f, a in zip(formals, current):
            bind(f.type, a, env)
        new = []
        for a, o in zip(current, outs):
            j = join_types(a, substitute(o.type, env))
            new.append(j if j is not None else a)
        if new == current:
            return env, current
        current = new
    return {}, [relax(t) for t in current]


def _one_element(op: OpDef, v: Value, what: str, dtypes) -> None:
    t = v.type
    if not isinstance(t, TensorType) or t.dtype not in dtypes:
        raise op.fail(f"{what} must be a {'/'.join(sorted(d.short for d in dtypes))} tensor, got {t}")
    if t.is_static and t.numel != 1:
        raise op.fail(f"{what} must have one element, got {t}")


def _check_signature(op: OpDef, body: Graph, what: str, formals: Sequence[Value], actuals: Sequence,
                     env: dict) -> None:
    for k, (f, a) in enumerate(zip(formals, actuals)):
        problem = bind(f.type, a, env)
        if problem:
            raise op.fail(f"{what} input {k} ({f.name}): {problem}")


def _count(op: OpDef, body: Graph, field: str, at_least: int, what: str) -> None:
    if not isinstance(body, Graph):
        raise op.fail(f"attribute {field} must be a graph")
    if len(body.inputs) < at_least:
        raise op.fail(f"attribute {field}: the body takes {len(body.inputs)} input(s), {what}")


def body_foldable(*bodies: Graph) -> bool:
    """Whether every node of the bodies (and of the bodies within) is deterministic."""
    return all(n.op.foldable for b in bodies for n in b.nodes)


class _ControlFlow(OpDef):
    """Base of the ops with subgraph attributes: opaque, and deterministic when their bodies are."""

    pattern: ClassVar = Pattern.OPAQUE
    tensors_only: ClassVar = False

    def bodies(self) -> dict[str, Graph]:
        """The subgraph attributes, by attribute name."""
        return {k: v for k, v in self.attributes().items() if isinstance(v, Graph)}

    @property
    def foldable(self) -> bool:  # type: ignore[override]
        return body_foldable(*self.bodies().values())

    def captures(self) -> int:
        """How many trailing node inputs are captured outer values (the last body inputs)."""
        return getattr(self, "num_captures", 0)

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}=<graph @{v.name}>" if isinstance(v, Graph) else f"{k}={v!r}"
                          for k, v in self.non_default_attributes().items())
        return f"{self.name}({attrs})"


def _run(body: Graph, args: Sequence) -> list:
    from ..interpreter import run_graph  # local: the interpreter imports the op table

    return run_graph(body, list(args))


def _stack(op: OpDef, k: int, values: list, axis: int = 0) -> np.ndarray:
    """The values one scan output took in every iteration, stacked (they must have one shape)."""
    shapes = [np.shape(v) for v in values]
    for i, sh in enumerate(shapes):
        if sh != shapes[0]:
            raise ValueError(f"{op.name}: scan output {k} has shape {list(shapes[0])} in iteration 0 and {list(sh)} in "
                             f"iteration {i}; the values of a scan output are stacked, so they need one shape")
    return np.stack(values, axis=axis)


def _empty_stack(t, axis: int = 0) -> np.ndarray:
    """The result of stacking no values of type ``t`` (a tensor type) along ``axis``."""
    shape = [d if isinstance(d, int) else 0 for d in t.shape]
    shape.insert(axis, 0)
    return np.zeros(shape, dtype=t.dtype.np)


def inline_graph(body: Graph, args: Sequence[Value], graph: Graph, before: Node | None = None) -> list[Value]:
    """Copy ``body``'s constants and nodes into ``graph`` (before ``before``), its inputs replaced by
    ``args``; returns the values standing for its outputs. Result types are inferred again, from the
    types of ``args`` (which may say more than the body's inputs did)."""
    if len(args) != len(body.inputs):
        raise ValueError(f"graph @{body.name} takes {len(body.inputs)} input(s), {len(args)} given")
    env: dict[int, Value] = {id(f): a for f, a in zip(body.inputs, args)}
    for c in body.constants:
        env[id(c)] = graph.add_constant(c.const, name=c.name)
    for n in body.nodes:
        ins = [None if v is None else env[id(v)] for v in n.inputs]
        new = graph.add_node(n.op, ins, name=n.name, num_outputs=len(n.outputs), before=before)
        new.device = n.device
        for old, v in zip(n.outputs, new.outputs):
            if v.name is None:
                v.name = old.name
            env[id(old)] = v
    return [env[id(v)] for v in body.outputs]


# ---------------------------------------------------------------------------------------------
# If
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class If(_ControlFlow):
    """``then_branch`` when ``cond`` (a one-element bool tensor) is true, else ``else_branch``.

    Both branches take every input after ``cond`` (the captured outer values, in the same order) and
    return as many results; a result's type is what both branches give (dims where they disagree are
    unknown; with ``cond`` known, the taken branch's). Branches giving tensors of different ranks need
    a known ``cond``."""

    then_branch: Graph
    else_branch: Graph
    inputs: ClassVar = ("cond", "captures*")
    outputs: ClassVar = ("outputs*",)
    since: ClassVar = 16

    def validate(self):
        _count(self, self.then_branch, "then_branch", 0, "")
        _count(self, self.else_branch, "else_branch", 0, "")
        t, e = self.then_branch, self.else_branch
        if len(t.inputs) != len(e.inputs):
            raise self.fail(f"the branches take different numbers of inputs (then_branch {len(t.inputs)}, "
                            f"else_branch {len(e.inputs)}); both take every captured value")
        if len(t.outputs) != len(e.outputs):
            raise self.fail(f"then_branch returns {len(t.outputs)} value(s), else_branch {len(e.outputs)}")
        for k, (a, b) in enumerate(zip(t.inputs, e.inputs)):
            if a.type.dtype is not b.type.dtype:
                raise self.fail(f"input {k + 1}: then_branch takes {a.type}, else_branch {b.type}")

    def captures(self) -> int:
        return len(self.then_branch.inputs)

    def infer(self, ins):
        if not ins or ins[0] is None:
            raise self.fail("input cond is missing")
        cond, caps = ins[0], list(ins[1:])
        _one_element(self, cond, "cond", {DType.bool})
        n = len(self.then_branch.inputs)
        if len(caps) != n or any(v is None for v in caps):
            raise self.fail(f"takes cond and the {n} captured value(s) its branches read, got {len(caps)} "
                            "value(s) after cond")
        results = []
        for field, body in (("then_branch", self.then_branch), ("else_branch", self.else_branch)):
            env: dict = {}
            _check_signature(self, body, field, body.inputs, [v.type for v in caps], env)
            results.append([substitute(v.type, env) for v in body.outputs])
        c = known_ints(cond)
        if c is not None and len(c) == 1:
            return results[0] if c[0] else results[1]
        out = []
        for k, (a, b) in enumerate(zip(*results)):
            j = join_types(a, b)
            if j is None:
                raise self.fail(f"result {k}: then_branch gives {a}, else_branch {b}; with cond not known at "
                                "compile time the result needs one element type and rank")
            out.append(j)
        return out

    def compute(self, cond, *caps):
        body = self.then_branch if bool(np.asarray(cond).ravel()[0]) else self.else_branch
        return _run(body, caps)


# ---------------------------------------------------------------------------------------------
# Loop
# ---------------------------------------------------------------------------------------------

def _passes_cond_through(body: Graph) -> bool:
    """Whether the body's condition result is its condition input (so only M ends the loop)."""
    out = body.outputs[0] if body.outputs else None
    cin = body.inputs[1] if len(body.inputs) > 1 else None
    if out is None or cin is None:
        return False
    if out is cin:
        return True
    p = out.producer
    return p is not None and p.op.name == "Identity" and p.inputs and p.inputs[0] is cin


@dataclass(frozen=True, eq=False)
class Loop(_ControlFlow):
    """Run ``body`` while the iteration count is below ``M`` (when given) and the condition holds.

    Inputs: ``M`` (an int64 trip count; optional), ``cond`` (the initial condition; optional), the
    initial loop-carried values, then ``num_captures`` captured outer values. The body takes
    (iteration number i64[], condition bool[], carried..., captured...) and returns (condition,
    carried..., scan outputs...). Results: the final carried values, then each scan output of every
    iteration stacked along a new first axis."""

    body: Graph
    num_captures: int = 0
    inputs: ClassVar = ("M?", "cond?", "v_initial*")
    outputs: ClassVar = ("v_final_and_scan_outputs*",)
    since: ClassVar = 16

    def validate(self):
        if self.num_captures < 0:
            raise self.fail(f"num_captures must be >= 0, got {self.num_captures}")
        b = self.body
        _count(self, b, "body", 2 + self.num_captures,
               f"it needs the iteration number, the condition and the {self.num_captures} captured value(s)")
        it, c = b.inputs[0].type, b.inputs[1].type
        if not (isinstance(it, TensorType) and it.dtype is DType.i64 and it.rank == 0):
            raise self.fail(f"attribute body: input 0 (the iteration number) must be i64[], got {it}")
        if not (isinstance(c, TensorType) and c.dtype is DType.bool and c.rank == 0):
            raise self.fail(f"attribute body: input 1 (the condition) must be bool[], got {c}")
        n = self.num_carried()
        if len(b.outputs) < 1 + n:
            raise self.fail(f"attribute body: returns {len(b.outputs)} value(s); it must return the condition and "
                            f"the {n} loop-carried value(s) it takes, then its scan outputs")
        co = b.outputs[0].type
        if not (isinstance(co, TensorType) and co.dtype is DType.bool and (not co.is_static or co.numel == 1)):
            raise self.fail(f"attribute body: result 0 (the condition) must be a one-element bool tensor, got {co}")
        env: dict = {}
        for k in range(n):
            f, o = b.inputs[2 + k], b.outputs[1 + k]
            problem = bind(f.type, o.type, env, strict=True)
            if problem:
                raise self.fail(f"attribute body: loop-carried value {k} ({f.name}) is taken as {f.type} but "
                                f"returned as {o.type}, which the next iteration does not accept: {problem}")
        for k, o in enumerate(b.outputs[1 + n:]):
            if not isinstance(o.type, TensorType):
                raise self.fail(f"attribute body: scan output {k} must be a tensor, got {o.type}")

    def num_carried(self) -> int:
        return len(self.body.inputs) - 2 - self.num_captures

    def _split(self, ins):
        ins = list(ins) + [None] * max(0, 2 - len(ins))
        n = self.num_carried()
        want = 2 + n + self.num_captures
        if len(ins) != want:
            raise self.fail(f"takes M, cond, {n} loop-carried value(s) and {self.num_captures} captured value(s) "
                            f"({want} inputs), got {len(ins)}")
        return ins[0], ins[1], ins[2:2 + n], ins[2 + n:]

    def infer(self, ins):
        m, cond, carried, caps = self._split(ins)
        if m is None and cond is None:
            raise self.fail("has neither a trip count M nor a condition: it would never end")
        if m is not None:
            _one_element(self, m, "M", {DType.i64})
        if cond is not None:
            _one_element(self, cond, "cond", {DType.bool})
        for k, v in enumerate(carried + caps):
            if v is None:
                raise self.fail(f"input {2 + k} is missing (loop-carried and captured values are required)")
        b, n = self.body, self.num_carried()
        env: dict = {}
        _check_signature(self, b, "body", b.inputs[2:], [v.type for v in carried + caps], env)
        env, finals = _carried_fixpoint(b.inputs[2:2 + n], [v.type for v in carried], b.outputs[1:1 + n],
                                        list(zip(b.inputs[2 + n:], [v.type for v in caps])))
        trip = self._trip(m, cond)
        scans = []
        for o in b.outputs[1 + n:]:
            t = substitute(o.type, env)
            scans.append(TensorType(t.dtype, (trip,) + t.shape))
        return finals + scans

    def _trip(self, m, cond) -> int | None:
        """The number of iterations when it is known at compile time."""
        mk = known_ints(m)
        if mk is None or len(mk) != 1:
            return None
        c = known_ints(cond) if cond is not None else [1]
        if c is None or len(c) != 1:
            return None
        if not c[0]:
            return 0
        return max(mk[0], 0) if _passes_cond_through(self.body) else None

    def propagate(self, ins, types):
        m = ins[0] if ins else None
        mk = known_ints(m)
        if mk is None or mk[0] > FOLD_TRIP_LIMIT:
            return [None] * len(types)  # unbounded, or too long to run at compile time
        return super().propagate(ins, types)

    def compute(self, M=None, cond=None, *rest):
        n = self.num_carried()
        carried, caps = list(rest[:n]), list(rest[n:])
        trip = None if M is None else int(np.asarray(M).ravel()[0])
        go = True if cond is None else bool(np.asarray(cond).ravel()[0])
        k_scan = len(self.body.outputs) - 1 - n
        scans: list[list] = [[] for _ in range(k_scan)]
        i = 0
        while go and (trip is None or i < trip):
            outs = _run(self.body, [np.array(i, dtype=np.int64), np.array(go)] + carried + caps)
            go = bool(np.asarray(outs[0]).ravel()[0])
            carried = list(outs[1:1 + n])
            for k in range(k_scan):
                scans[k].append(outs[1 + n + k])
            i += 1
        stacked = []
        for k, o in enumerate(self.body.outputs[1 + n:]):
            stacked.append(_stack(self, k, scans[k]) if scans[k] else _empty_stack(o.type))
        return carried + stacked


# ---------------------------------------------------------------------------------------------
# Scan
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Scan(_ControlFlow):
    """Run ``body`` once per slice of the scan inputs, threading state values through.

    Inputs: the initial states, then ``num_scan_inputs`` scan inputs (sliced along
    ``scan_input_axes``, default 0, backwards where ``scan_input_directions`` is 1), then
    ``num_captures`` captured outer values. The body takes (states..., one slice of each scan
    input..., captured...) and returns (states..., scan outputs...). Results: the final states, then
    each scan output stacked along ``scan_output_axes`` (default 0; prepended where
    ``scan_output_directions`` is 1). The IR form is opset 9's and later (opset 8's batched form with
    ``sequence_lens`` is converted on import)."""

    body: Graph
    num_scan_inputs: int
    scan_input_axes: tuple[int, ...] | None = None
    scan_input_directions: tuple[int, ...] | None = None
    scan_output_axes: tuple[int, ...] | None = None
    scan_output_directions: tuple[int, ...] | None = None
    num_captures: int = 0
    inputs: ClassVar = ("initial_state_and_scan_inputs*",)
    outputs: ClassVar = ("final_state_and_scan_outputs*",)
    since: ClassVar = 16

    def validate(self):
        m, c = self.num_scan_inputs, self.num_captures
        if m < 1:
            raise self.fail(f"num_scan_inputs must be >= 1, got {m}")
        if c < 0:
            raise self.fail(f"num_captures must be >= 0, got {c}")
        b = self.body
        _count(self, b, "body", m + c, f"it needs num_scan_inputs={m} slices and {c} captured value(s)")
        n = self.num_states()
        if len(b.outputs) < n:
            raise self.fail(f"attribute body: returns {len(b.outputs)} value(s), fewer than its {n} state(s)")
        k = len(b.outputs) - n
        for field, vals, count in (("scan_input_axes", self.scan_input_axes, m),
                                   ("scan_input_directions", self.scan_input_directions, m),
                                   ("scan_output_axes", self.scan_output_axes, k),
                                   ("scan_output_directions", self.scan_output_directions, k)):
            if vals is not None and len(vals) != count:
                raise self.fail(f"{field} has {len(vals)} entries, expected {count}")
            if vals is not None and field.endswith("directions") and any(d not in (0, 1) for d in vals):
                raise self.fail(f"{field} must hold 0 (forward) or 1 (reverse), got {list(vals)}")
        env: dict = {}
        for j in range(n):
            f, o = b.inputs[j], b.outputs[j]
            problem = bind(f.type, o.type, env, strict=True)
            if problem:
                raise self.fail(f"attribute body: state {j} ({f.name}) is taken as {f.type} but returned as "
                                f"{o.type}, which the next iteration does not accept: {problem}")
        for j, v in enumerate(list(b.inputs[n:n + m]) + list(b.outputs[n:])):
            if not isinstance(v.type, TensorType):
                raise self.fail(f"attribute body: scan inputs and outputs are tensors, got {v.type}")

    def num_states(self) -> int:
        return len(self.body.inputs) - self.num_scan_inputs - self.num_captures

    def _axes(self, vals, count):
        return list(vals) if vals is not None else [0] * count

    def infer(self, ins):
        n, m, c = self.num_states(), self.num_scan_inputs, self.num_captures
        if len(ins) != n + m + c or any(v is None for v in ins):
            raise self.fail(f"takes {n} initial state(s), {m} scan input(s) and {c} captured value(s) "
                            f"({n + m + c} inputs), got {len(ins)}")
        states, scans, caps = ins[:n], ins[n:n + m], ins[n + m:]
        length = None
        slices = []
        for j, (v, ax) in enumerate(zip(scans, self._axes(self.scan_input_axes, m))):
            if not isinstance(v.type, TensorType) or v.type.rank < 1:
                raise self.fail(f"scan input {j} must be a tensor of rank >= 1, got {v.type}")
            r = v.type.rank
            if not -r <= ax < r:
                raise self.fail(f"scan_input_axes[{j}] = {ax} is out of range for rank {r}")
            ax %= r
            d = v.type.shape[ax]
            if j == 0:
                length = d
            elif isinstance(d, int) and isinstance(length, int):
                if d != length:
                    raise self.fail(f"scan inputs have different lengths ({length} and {d} along their scan axes)")
            elif isinstance(d, int):
                length = d
            elif not isinstance(length, int):
                length = join_dims(length, d)
            slices.append(TensorType(v.dtype, v.type.shape[:ax] + v.type.shape[ax + 1:]))
        b = self.body
        env: dict = {}
        _check_signature(self, b, "body", b.inputs, [v.type for v in states] + slices + [v.type for v in caps],
                         env)
        fixed = list(zip(b.inputs[n:], slices + [v.type for v in caps]))
        env, finals = _carried_fixpoint(b.inputs[:n], [v.type for v in states], b.outputs[:n], fixed)
        outs = []
        for k, (o, ax) in enumerate(zip(b.outputs[n:], self._axes(self.scan_output_axes, len(b.outputs) - n))):
            t = substitute(o.type, env)
            r = t.rank + 1
            if not -r <= ax < r:
                raise self.fail(f"scan_output_axes[{k}] = {ax} is out of range for rank {r}")
            ax %= r
            outs.append(TensorType(t.dtype, t.shape[:ax] + (length,) + t.shape[ax:]))
        return finals + outs

    def compute(self, *xs):
        n, m = self.num_states(), self.num_scan_inputs
        states, scans, caps = list(xs[:n]), xs[n:n + m], list(xs[n + m:])
        in_axes = [a % x.ndim for a, x in zip(self._axes(self.scan_input_axes, m), scans)]
        in_dirs = self._axes(self.scan_input_directions, m)
        lengths = {x.shape[a] for x, a in zip(scans, in_axes)}
        if len(lengths) != 1:
            raise ValueError(f"Scan: scan inputs have different lengths along their scan axes: {sorted(lengths)}")
        (length,) = lengths
        k_out = len(self.body.outputs) - n
        collected: list[list] = [[] for _ in range(k_out)]
        for t in range(length):
            sl = [np.asarray(np.take(x, length - 1 - t if d else t, axis=a))
                  for x, a, d in zip(scans, in_axes, in_dirs)]
            outs = _run(self.body, states + sl + caps)
            states = list(outs[:n])
            for k in range(k_out):
                collected[k].append(outs[n + k])
        results = []
        out_axes = self._axes(self.scan_output_axes, k_out)
        out_dirs = self._axes(self.scan_output_directions, k_out)
        for k, o in enumerate(self.body.outputs[n:]):
            r = o.type.rank + 1
            ax = out_axes[k] % r
            vals = collected[k][::-1] if out_dirs[k] else collected[k]
            results.append(_stack(self, k, vals, ax) if vals else _empty_stack(o.type, ax))
        return states + results


# ---------------------------------------------------------------------------------------------
# SequenceMap
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SequenceMap(_ControlFlow):
    """Apply ``body`` to each position of the input sequences: the body takes one element of every
    sequence input (and every tensor input whole), then the ``num_captures`` captured values, and
    returns tensors; result k is the sequence of the body's k-th results."""

    body: Graph
    num_captures: int = 0
    inputs: ClassVar = ("input_sequence", "additional_inputs*")
    outputs: ClassVar = ("out_sequence*",)
    since: ClassVar = 17

    def validate(self):
        if self.num_captures < 0:
            raise self.fail(f"num_captures must be >= 0, got {self.num_captures}")
        _count(self, self.body, "body", 1 + self.num_captures,
               f"it needs an element of input_sequence and {self.num_captures} captured value(s)")
        for k, o in enumerate(self.body.outputs):
            if not isinstance(o.type, TensorType):
                raise self.fail(f"attribute body: result {k} must be a tensor, got {o.type}")
        if not self.body.outputs:
            raise self.fail("attribute body: returns nothing")

    def infer(self, ins):
        b, c = self.body, self.num_captures
        if len(ins) != len(b.inputs) or any(v is None for v in ins):
            raise self.fail(f"takes {len(b.inputs) - c} input(s) and {c} captured value(s), got {len(ins)}")
        mapped = ins[:len(ins) - c]
        if not isinstance(mapped[0].type, SequenceType):
            raise self.fail(f"input_sequence must be a sequence, got {mapped[0].type}")
        length = mapped[0].type.length
        env: dict = {}
        for k, (f, v) in enumerate(zip(b.inputs, ins)):
            t = v.type
            if k < len(mapped) and isinstance(t, SequenceType):
                if t.length is not None and length is not None and t.length != length:
                    raise self.fail(f"input {k} has {t.length} element(s), input_sequence {length}")
                if t.elem_shape is None:
                    continue  # elements of unknown rank: checked by each run of the body
                t = t.elem
            problem = bind(f.type, t, env)
            if problem:
                raise self.fail(f"body input {k} ({f.name}): {problem}")
        return [SequenceType(o.type.dtype, substitute(o.type, env).shape, length) for o in b.outputs]

    def compute(self, *xs):
        c = self.num_captures
        mapped, caps = xs[:len(xs) - c], list(xs[len(xs) - c:])
        seqs = [k for k, x in enumerate(mapped) if isinstance(x, list)]
        lengths = {len(mapped[k]) for k in seqs}
        if len(lengths) > 1:
            raise ValueError(f"SequenceMap: the input sequences have different lengths: {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        outs: list[list] = [[] for _ in self.body.outputs]
        for i in range(n):
            args = [x[i] if isinstance(x, list) else x for x in mapped] + caps
            for k, r in enumerate(_run(self.body, args)):
                outs[k].append(np.asarray(r))
        return outs


OPS = (If, Loop, Scan, SequenceMap)
