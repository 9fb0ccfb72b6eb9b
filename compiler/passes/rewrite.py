"""Declarative rewrite rules and the one driver that applies them.

A rule names the op classes it roots at, ``check(node)`` says why it does not apply (``None``: it
applies) and ``rewrite(graph, node)`` replaces the root's uses. The driver runs all rules over the graph
until none fires (a fixed point), with a loop guard, and erases roots left dead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..ir import ops
from ..ir.graph import Graph, Node, Value


def op(name: str, **attrs):
    """A new op of the table's class ``name`` (attributes validated at construction)."""
    cls = ops.lookup(name)
    if cls is None:  # pragma: no cover - every op rules make is in the table
        raise RuntimeError(f"op {name} is missing from the op table")
    return cls(**attrs)


def only_use_is(v: Value, node: Node) -> bool:
    """Whether ``node`` is the one use of ``v``."""
    use = v.uses.single()
    return use is not None and use[0] is node


class Rule:
    name: str = ""
    #: names of the ops this rule roots at (op names, not classes: the rule set is shared by
    #: families defined in different modules)
    roots: tuple[str, ...] = ()

    def check(self, node: Node) -> str | None:
        """None when the rule applies at ``node``, else the reason it does not."""
        raise NotImplementedError

    def rewrite(self, graph: Graph, node: Node) -> None:
        raise NotImplementedError


class RewriteLoopError(RuntimeError):
    pass


@dataclass
class Refusal:
    rule: str
    node: Node
    reason: str


def erase_dead_upward(graph: Graph, node: Node) -> None:
    """Erase ``node`` if its results are unused, then producers that become dead."""
    work = [node]
    while work:
        n = work.pop()
        if n.graph is not graph or any(v.uses for v in n.outputs):
            continue
        producers = [v.producer for v in n.inputs if v is not None and v.producer is not None]
        graph.remove(n)
        work.extend(producers)


def apply_rules(graph: Graph, rules: Sequence[Rule], max_rounds: int = 50) -> dict[str, int]:
    """Apply ``rules`` to a fixed point; returns how often each fired. Raises RewriteLoopError when
    the rules still fire after ``max_rounds`` rounds (two rules undoing each other, say)."""
    by_root: dict[str, list[Rule]] = {}
    for r in rules:
        for name in r.roots:
            by_root.setdefault(name, []).append(r)
    fired: dict[str, int] = {}
    for _round in range(max_rounds):
        # dead nodes must not block rules (a result "used" only by a dead node is unused)
        for node in reversed(list(graph.nodes)):
            if node.graph is graph and not any(v.uses for v in node.outputs):
                erase_dead_upward(graph, node)
                fired["erase-dead"] = fired.get("erase-dead", 0) + 1
        fired_now = []
        for node in list(graph.nodes):
            for rule in by_root.get(node.op.name, ()):
                if node.graph is not graph:
                    break
                if rule.check(node) is None:
                    rule.rewrite(graph, node)
                    fired[rule.name] = fired.get(rule.name, 0) + 1
                    fired_now.append(rule.name)
                    erase_dead_upward(graph, node)
        if not fired_now:
            return fired
    raise RewriteLoopError(f"rewrite rules still firing after {max_rounds} rounds (last round: "
                           f"{', '.join(sorted(set(fired_now)))}): a rule set that undoes itself?")


def explain(graph: Graph, rules: Sequence[Rule]) -> list[Refusal]:
    """Why each rule does not fire at each node it roots at."""
    out = []
    for node in graph.nodes:
        for rule in rules:
            if node.op.name in rule.roots:
                reason = rule.check(node)
                if reason is not None:
                    out.append(Refusal(rule.name, node, reason))
    return out
