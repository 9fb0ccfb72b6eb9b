"""The reference interpreter: runs a graph node by node with each op's NumPy ``compute``.

It is Kiln's definition of correct and the oracle for every pass and backend. By default it checks
every result against the type the IR gave it (element type, rank, static and symbolic dimensions), so a
wrong shape inference is caught where it happens, not three passes later.

Values are NumPy arrays; a sequence value is a list of arrays (each checked against the element type,
and the length against a known length), an optional value is its element's value or None.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .graph import Graph, Node, Value
from .types import DType, OptionalType, SequenceType, TensorType


from ..errors import InputError, KilnError  # noqa: E402  (defined there so the runtime need not import the IR)


class InterpreterError(KilnError, RuntimeError):
    """A node failed, or produced a result that does not match its IR type."""


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Validate inputs against the graph signature; returns the bindings of symbolic dimensions."""
    names = [v.name for v in graph.inputs]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"missing input(s) {missing}; the graph takes {_signature(graph)}")
    extra = [n for n in inputs if n not in names]
    if extra:
        raise InputError(f"unknown input(s) {extra}; the graph takes {_signature(graph)}")
    bindings: dict[str, int] = {}
    for v in graph.inputs:
        _check_input(v, inputs[v.name], bindings)
    return bindings


def _check_input(v: Value, arr, bindings: dict[str, int]) -> None:
    if not isinstance(v.type, TensorType):
        problem = _value_mismatch(v.type, arr, bindings)
        if problem:
            raise InputError(f"input {v.name!r} does not match its type {v.type}: {problem}")
        return
    if not isinstance(arr, np.ndarray):
        raise InputError(f"input {v.name!r} must be a numpy array, got {type(arr).__name__}")
    try:
        dt = DType.from_numpy(arr.dtype)
    except TypeError:
        dt = None
    if dt is not v.dtype:
        raise InputError(f"input {v.name!r} has dtype {arr.dtype}, expected {v.dtype} ({v.type})")
    problem = _shape_mismatch(v.type, arr.shape, bindings)
    if problem:
        raise InputError(f"input {v.name!r} has shape {list(arr.shape)}, expected {v.type}: {problem}")


def _signature(graph: Graph) -> str:
    return "(" + ", ".join(f"{v.name}: {v.type}" for v in graph.inputs) + ")"


def _shape_mismatch(t: TensorType, shape: tuple, bindings: dict[str, int]) -> str | None:
    if len(shape) != t.rank:
        return f"rank {len(shape)} instead of {t.rank}"
    for i, (want, got) in enumerate(zip(t.shape, shape)):
        if isinstance(want, int):
            if want != got:
                return f"dimension {i} is {got}, not {want}"
        elif isinstance(want, str):
            bound = bindings.setdefault(want, got)
            if bound != got:
                return f"dimension {i} ({want}) is {got}, but {want} is {bound} elsewhere"
    return None


def _value_mismatch(t, x, bindings: dict[str, int]) -> str | None:
    """Why the run-time value ``x`` does not have type ``t`` (None when it does)."""
    if isinstance(t, OptionalType):
        return None if x is None else _value_mismatch(t.elem, x, bindings)
    if isinstance(t, SequenceType):
        if not isinstance(x, (list, tuple)):
            return f"a sequence is a list of arrays, got {type(x).__name__}"
        if t.length is not None and len(x) != t.length:
            return f"the sequence has {len(x)} element(s), not {t.length}"
        for k, a in enumerate(x):
            if not isinstance(a, np.ndarray):
                return f"element {k} is a {type(a).__name__}, not a numpy array"
            problem = _value_mismatch(TensorType(t.dtype, a.shape) if t.elem_shape is None else t.elem, a, bindings)
            if problem:
                return f"element {k}: {problem}"
        return None
    if not isinstance(x, np.ndarray):
        return f"expected a numpy array, got {type(x).__name__}"
    try:
        dt = DType.from_numpy(x.dtype)
    except TypeError:
        dt = None
    if dt is not t.dtype:
        return f"dtype {x.dtype} instead of {t.dtype}"
    problem = _shape_mismatch(t, x.shape, bindings)
    return None if problem is None else f"shape {list(x.shape)} instead of {t}: {problem}"


def run_node(node: Node, args: list) -> list:
    try:
        outs = node.op.compute(*args)
    except Exception as e:
        raise InterpreterError(f"{node.describe()} failed: {type(e).__name__}: {e}") from e
    outs = list(outs)
    if len(outs) < len(node.outputs):
        raise InterpreterError(f"{node.describe()} computed {len(outs)} results, the IR has {len(node.outputs)}")
    # tensors as arrays; sequence (list) and optional (None or the value) results as computed
    return [np.asarray(o) if isinstance(v.type, TensorType) else o for v, o in zip(node.outputs, outs)]


def interpret(graph: Graph, inputs: Mapping[str, np.ndarray], check_types: bool = True,
              keep: bool = False) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``inputs`` (name -> array); returns output name -> array.

    ``keep=True`` returns every value computed (by Value object, under the key ``"values"``) in
    addition, for differential checks.
    """
    bindings = check_inputs(graph, inputs)
    env: dict[Value, np.ndarray] = {v: inputs[v.name] for v in graph.inputs}
    _execute(graph, env, bindings, check_types, keep)
    result = {name: env[v] for name, v in zip(graph.output_names, graph.outputs)}
    if keep:
        result["values"] = env  # type: ignore[assignment]
    return result


def run_graph(graph: Graph, args: Sequence, check_types: bool = True) -> list:
    """Run ``graph`` on inputs given by position (in ``graph.inputs`` order); returns its outputs in
    order. This is how control-flow ops run their bodies (If's branches, Loop's, Scan's and
    SequenceMap's body): each run checks its inputs against the body's signature and binds the body's
    symbolic dimensions afresh."""
    if len(args) != len(graph.inputs):
        raise InputError(f"graph @{graph.name} takes {len(graph.inputs)} input(s) {_signature(graph)}, "
                         f"got {len(args)}")
    bindings: dict[str, int] = {}
    env: dict[Value, np.ndarray] = {}
    for v, a in zip(graph.inputs, args):
        _check_input(v, a, bindings)
        env[v] = a
    _execute(graph, env, bindings, check_types, False)
    return [env[v] for v in graph.outputs]


def _execute(graph: Graph, env: dict, bindings: dict[str, int], check_types: bool, keep: bool) -> None:
    """Run the nodes of ``graph`` in order, ``env`` holding its inputs; leaves the outputs in ``env``."""
    for c in graph.constants:
        env[c] = c.const
    # last use of each value, so intermediates are freed as soon as they die
    last: dict[Value, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None:
                last[v] = i
    outputs = set(graph.outputs)
    for i, node in enumerate(graph.nodes):
        args = [None if v is None else env[v] for v in node.inputs]
        results = run_node(node, args)
        for v, r in zip(node.outputs, results):
            if check_types:
                _check_result(node, v, r, bindings)
            env[v] = r
        if not keep:
            for v in node.inputs:
                if v is not None and last.get(v) == i and v not in outputs and v.producer is not None:
                    env.pop(v, None)


def _check_result(node: Node, v: Value, r: np.ndarray, bindings: dict[str, int]) -> None:
    if not isinstance(v.type, TensorType):
        problem = _value_mismatch(v.type, r, bindings)
        if problem:
            raise InterpreterError(f"{node.describe()} result {v.index} does not match its IR type {v.type}: "
                                   f"{problem}")
        return
    try:
        dt = DType.from_numpy(r.dtype)
    except TypeError:
        dt = None
    if dt is not v.dtype:
        raise InterpreterError(f"{node.describe()} result {v.index} has dtype {r.dtype}, IR type {v.type}")
    problem = _shape_mismatch(v.type, r.shape, bindings)
    if problem:
        raise InterpreterError(f"{node.describe()} result {v.index} has shape {list(r.shape)}, "
                               f"IR type {v.type}: {problem}")
