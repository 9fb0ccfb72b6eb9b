"""The IR verifier: checks that a graph is well formed, and shows the IR around each problem.

Checked: SSA (each value defined once, by an input, a constant or a node result; every use after its
definition, so ``graph.nodes`` is a topological order), use-lists (every input is in its value's
use-list and every use-list entry is a real input, graph outputs included), node ownership and the
links of the node order, arity,
types (re-running inference gives exactly the recorded result types), constant data (matches its
type), known values (match their value's type), and the signature (unique input and output names).
Subgraphs (control-flow bodies) are verified recursively, each as a graph of its own; the node's
inputs and results are checked against the body signatures by the op's type inference.

``verify(graph)`` raises ``VerifyError`` listing the first few problems, each with the printed lines
around it (the bad line marked ``>>``); ``check(graph)`` returns all problems.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .graph import Graph, IRError, Node, Return, Uses, Value
from .ops.base import OpDef, check_arity, infer_node
from .printer import Printer, format_type
from .types import DType, TensorType, is_value_type

__all__ = ["VerifyError", "Problem", "check", "verify"]

#: how many problems a VerifyError shows in full
MAX_REPORTED = 5
#: printed lines shown before and after the bad one
CONTEXT_LINES = 2


@dataclass
class Problem:
    """One thing wrong with a graph: ``where`` says what (``node``, ``const``, ``input``, ``return``,
    ``graph``) and ``index`` which one (its position in that list)."""

    message: str
    where: str = "graph"
    index: int = 0
    context: str = field(default="", repr=False)

    def __str__(self) -> str:
        return self.message + ("\n" + self.context if self.context else "")


class VerifyError(IRError, ValueError):
    """A malformed graph; ``problems`` lists everything the verifier found."""

    def __init__(self, message: str, problems: Sequence[Problem]):
        super().__init__(message)
        self.problems = list(problems)

    def __reduce__(self):
        return type(self), (str(self), self.problems)


class _Checker:
    def __init__(self, graph: Graph):
        self.g = graph
        self.p = Printer(graph)
        self.problems: list[Problem] = []
        #: id(result) -> a stand-in with the type inference gives, for results recorded otherwise
        self.corrected: dict[int, Value] = {}

    def add(self, message: str, where: str = "graph", index: int = 0) -> None:
        self.problems.append(Problem(message, where, index))

    # -- naming in messages ------------------------------------------------------------------------
    def node_desc(self, node: Node, index: int) -> str:
        op = getattr(node.op, "name", repr(node.op))
        named = f" {node.name!r}" if node.name else ""
        outs = [self.p.ref(v) for v in node.outputs]
        res = (f"result {outs[0]}" if len(outs) == 1 else
               f"results {', '.join(outs)}" if outs else "no results")
        return f"{op} node{named} (#{index}, {res})"

    # -- the checks --------------------------------------------------------------------------------
    def run(self) -> list[Problem]:
        g = self.g
        defined: dict[int, str] = {}  # id(value) -> what defines it
        owner: dict[int, int] = {}  # id(result) -> node index
        all_values: list[tuple[Value, str, int]] = []

        def define(v, what: str, where: str, index: int) -> None:
            if not isinstance(v, Value):
                self.add(f"{what} is not a Value: {v!r}", where, index)
                return
            if id(v) in defined:
                self.add(f"{what} {self.p.ref(v)} is already defined as {defined[id(v)]} (a value is defined "
                         "once)", where, index)
                return
            defined[id(v)] = what
            all_values.append((v, where, index))
            if not is_value_type(v.type):
                self.add(f"{what} {self.p.ref(v)} has no type (a tensor, sequence or optional type): {v.type!r}",
                         where, index)

        names: dict[str, int] = {}
        for i, v in enumerate(g.inputs):
            define(v, "graph input", "input", i)
            if not isinstance(v, Value):
                continue
            if v.producer is not None or v.const is not None:
                self.add(f"graph input {self.p.ref(v)} is also a {'node result' if v.producer else 'constant'}",
                         "input", i)
            if not v.name:
                self.add(f"graph input #{i} has no name (inputs are passed by name)", "input", i)
            elif v.name in names:
                self.add(f"graph input name {v.name!r} is used twice (inputs #{names[v.name]} and #{i})",
                         "input", i)
            else:
                names[v.name] = i
        for i, c in enumerate(g.constants):
            define(c, "constant", "const", i)
            if isinstance(c, Value):
                self.check_constant(c, i)
        broken = g._links_problem()
        if broken is not None:
            self.add(broken)
        for i, n in enumerate(g.nodes):
            for k, v in enumerate(n.outputs):
                define(v, f"result {k} of {getattr(n.op, 'name', '?')} node #{i}", "node", i)
                if isinstance(v, Value):
                    owner[id(v)] = i
                    if v.producer is not n or v.index != k:
                        self.add(f"{self.node_desc(n, i)}: result {k} ({self.p.ref(v)}) says it is result "
                                 f"{v.index} of {v.producer!r}", "node", i)

        # definitions before uses, arity, types
        available: set[int] = {id(v) for v in g.inputs} | {id(v) for v in g.constants}
        for i, n in enumerate(g.nodes):
            desc = self.node_desc(n, i)
            if n.graph is not g:
                self.add(f"{desc}: node.graph is {'None' if n.graph is None else repr(n.graph)}, not this graph",
                         "node", i)
            if not isinstance(n.op, OpDef):
                self.add(f"{desc}: op is not an OpDef: {n.op!r}", "node", i)
                continue
            structural_ok = True
            for k, v in enumerate(n.inputs):
                if v is None:
                    continue
                if not isinstance(v, Value):
                    self.add(f"{desc}: input {k} is not a Value: {v!r}", "node", i)
                    structural_ok = False
                elif id(v) not in available:
                    structural_ok = False
                    if id(v) in owner:
                        j = owner[id(v)]
                        self.add(f"{desc}: input {k} ({self.p.ref(v)}) is used before its definition by node "
                                 f"#{j} (graph.nodes is not in topological order)", "node", i)
                    else:
                        self.add(f"{desc}: input {k} ({self.p.ref(v)}) is not defined in this graph", "node", i)
            for v in n.outputs:
                available.add(id(v))
            try:
                check_arity(n.op, n.inputs)
            except Exception as e:  # noqa: BLE001
                self.add(f"{desc}: wrong number of inputs: {e}", "node", i)
                continue
            if structural_ok:
                self.check_types(n, i, desc)
            self.check_bodies(n, i, desc)

        # use-lists
        nodes_here = {id(n) for n in g.nodes}
        for v, where, index in all_values:
            self.check_uses(v, where, index, nodes_here)
        for i, n in enumerate(g.nodes):
            for k, v in enumerate(n.inputs):
                if isinstance(v, Value) and (n, k) not in v.uses:
                    self.add(f"{self.node_desc(n, i)}: input {k} ({self.p.ref(v)}) is missing from that value's "
                             "use-list", "node", i)

        # the return
        ret = g.ret
        if ret.graph is not g:
            self.add("graph.ret belongs to another graph", "return")
        if len(g.output_names) != len(ret.inputs):
            self.add(f"the graph has {len(ret.inputs)} outputs but {len(g.output_names)} output names", "return")
        seen_out: dict[str, int] = {}
        for k, name in enumerate(g.output_names):
            if not isinstance(name, str) or not name:
                self.add(f"output #{k} has no name", "return")
            elif name in seen_out:
                self.add(f"output name {name!r} is used twice (outputs #{seen_out[name]} and #{k})", "return")
            else:
                seen_out[name] = k
        for k, v in enumerate(ret.inputs):
            if not isinstance(v, Value):
                self.add(f"output #{k} is not a Value: {v!r}", "return")
                continue
            if id(v) not in defined:
                self.add(f"output #{k} ({self.p.ref(v)}) is not defined in this graph", "return")
            if (ret, k) not in v.uses:
                self.add(f"output #{k} ({self.p.ref(v)}) is missing from that value's use-list", "return")
        return self.problems

    def check_bodies(self, n: Node, i: int, desc: str) -> None:
        """Verify each subgraph attribute as a graph of its own; its problems keep their own context."""
        try:
            attrs = n.op.attributes()
        except Exception:  # noqa: BLE001
            return
        for key, body in attrs.items():
            if not isinstance(body, Graph):
                continue
            for prob in check(body):
                self.problems.append(Problem(f"{desc}: in {key} (graph @{body.name}): {prob.message}", "node", i,
                                             prob.context))

    def check_constant(self, c: Value, i: int) -> None:
        ref = self.p.ref(c)
        if c.producer is not None:
            self.add(f"constant {ref} is also a node result", "const", i)
        if c.const is None:
            self.add(f"constant {ref} has no data", "const", i)
            return
        arr = c.const
        if not isinstance(arr, np.ndarray):
            self.add(f"constant {ref} holds a {type(arr).__name__}, not a numpy array", "const", i)
            return
        try:
            dt = DType.from_numpy(arr.dtype)
        except TypeError:
            dt = None
        if not isinstance(c.type, TensorType):
            self.add(f"constant {ref} has type {format_type(c.type)}; a constant is a tensor", "const", i)
            return
        if dt is not c.type.dtype or tuple(arr.shape) != c.type.shape:
            have = format_type(TensorType(dt, arr.shape)) if dt else f"numpy {arr.dtype}{list(arr.shape)}"
            self.add(f"constant {ref} has type {format_type(c.type)} but its data is {have}", "const", i)

    def check_types(self, n: Node, i: int, desc: str) -> None:
        """Re-run inference. A result type is wrong when it disagrees both with inference on the
        recorded input types and with inference on the input types inference itself would give
        (``self.corrected``), so one wrong result is reported once, not again at each user."""
        count = len(n.outputs)
        recorded = [v.type for v in n.outputs]
        got, err = _infer(n.op, n.inputs, count)
        fixed_ins = [None if v is None else self.corrected.get(id(v), v) for v in n.inputs]
        if any(a is not b for a, b in zip(fixed_ins, n.inputs)):
            fixed, fixed_err = _infer(n.op, fixed_ins, count)
        else:
            fixed, fixed_err = got, err
        ok = err is None and got[0] == recorded
        fixed_ok = fixed_err is None and fixed[0] == recorded
        if not ok and not fixed_ok:
            if err is not None:
                self.add(f"{desc}: type inference fails: {err}", "node", i)
            else:
                for v, t in zip(n.outputs, got[0]):
                    if v.type != t:
                        self.add(f"{desc}: result {self.p.ref(v)} has type {format_type(v.type)}, but type "
                                 f"inference gives {format_type(t)}", "node", i)
        if fixed_err is None:
            for v, t, k in zip(n.outputs, fixed[0], fixed[1]):
                if v.type != t:
                    stand_in = Value(t)
                    stand_in.known = k
                    self.corrected[id(v)] = stand_in
        for v in n.outputs:
            if v.known is not None and isinstance(v.type, TensorType):
                k = np.asarray(v.known)
                try:
                    kdt = DType.from_numpy(k.dtype)
                except TypeError:
                    kdt = None
                shape_ok = not v.type.is_static or tuple(k.shape) == v.type.shape
                if kdt is not v.type.dtype or not shape_ok or k.ndim != v.type.rank:
                    self.add(f"{desc}: the known value of {self.p.ref(v)} is {k.dtype}{list(k.shape)}, its type is "
                             f"{format_type(v.type)}", "node", i)

    def check_uses(self, v: Value, where: str, index: int, nodes_here: set[int]) -> None:
        ref = self.p.ref(v)
        if not isinstance(v.uses, Uses):
            self.add(f"{ref}: its uses are a {type(v.uses).__name__}, not a Uses", where, index)
            return
        for user, k in v.uses:  # (a Uses holds each (user, k) once)
            if isinstance(user, Return):
                if user is not self.g.ret:
                    self.add(f"{ref}: use-list names the return of another graph", where, index)
                elif not (0 <= k < len(user.inputs)) or user.inputs[k] is not v:
                    self.add(f"{ref}: use-list says it is output #{k}, but it is not", where, index)
            elif isinstance(user, Node):
                if id(user) not in nodes_here:
                    self.add(f"{ref}: use-list names {_user_desc(user)}, which is not in this graph (a removed "
                             "node?)", where, index)
                elif not (0 <= k < len(user.inputs)) or user.inputs[k] is not v:
                    actual = self.p.ref(user.inputs[k]) if 0 <= k < len(user.inputs) else "nothing"
                    self.add(f"{ref}: use-list says it is input {k} of {_user_desc(user)}, but that input is "
                             f"{actual}", where, index)
            else:
                self.add(f"{ref}: use-list entry ({user!r}, {k}) is not a node or the return", where, index)


def _infer(op: OpDef, ins, count: int):
    """((types, known), None) or (None, the error message)."""
    try:
        return infer_node(op, ins, count), None
    except Exception as e:  # noqa: BLE001 - any failure of inference is a problem to report
        return None, str(e) or type(e).__name__


def _user_desc(user) -> str:
    if isinstance(user, Node):
        return user.describe()
    return "the return"


def check(graph: Graph) -> list[Problem]:
    """Every problem found in ``graph`` (empty when it is well formed), each with its IR context."""
    checker = _Checker(graph)
    problems = checker.run()
    if problems:
        _add_context(checker.p, graph, problems)
    return problems


def _add_context(p: Printer, graph: Graph, problems: list[Problem]) -> None:
    lines = p.lines()
    n_consts, n_nodes = len(graph.constants), len(graph.nodes)
    for prob in problems:
        if prob.context:  # a subgraph's problem, shown in the subgraph's lines
            continue
        if prob.where == "input":
            at = 0
        elif prob.where == "const":
            at = 1 + prob.index
        elif prob.where == "node":
            at = 1 + n_consts + prob.index
        elif prob.where == "return":
            at = 1 + n_consts + n_nodes
        else:
            at = None
        if at is None:
            continue
        lo, hi = max(0, at - CONTEXT_LINES), min(len(lines), at + CONTEXT_LINES + 1)
        shown = []
        if lo > 0:
            shown.append("     ...")
        for j in range(lo, hi):
            first, *rest = lines[j].split("\n")  # a node with subgraphs prints over several lines
            shown.append(("  >>" if j == at else "    ") + first)
            shown += ["    " + line for line in rest]
        if hi < len(lines):
            shown.append("     ...")
        prob.context = "\n".join(shown)


def verify(graph: Graph, max_reported: int = MAX_REPORTED) -> None:
    """Raise ``VerifyError`` if ``graph`` is malformed; the message names each problem's node and
    shows the IR around it."""
    problems = check(graph)
    if not problems:
        return
    shown = problems[:max_reported]
    head = (f"graph @{graph.name} is malformed: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
            + (f" (the first {len(shown)} shown)" if len(shown) < len(problems) else ""))
    body = []
    for k, prob in enumerate(shown, 1):
        body.append(f"[{k}] {prob.message}")
        if prob.context:
            body.append(prob.context)
    raise VerifyError(head + "\n" + "\n".join(body), problems)
