"""``kiln summary MODEL``: a model's parameters, FLOPs, activation memory and op mix, per layer (name
scope) and in all, without running it.

Each node's FLOPs come from its op's ``cost`` (the figures the manifest, ``kiln inspect`` and
``kiln profile`` use: a multiply-add counts 2); its parameters are the elements of the float
constant tensors it reads (each constant counted once, at its first reader); its activations are the bytes of
its results. Nodes computing from constants alone (the ``ConstantOfShape`` weights of the light
models, shape arithmetic) are not layers: their results count as the parameters of the nodes
reading them. A node's scope is its name up to the last ``/`` (``/layer1/layer1.0/conv1/Conv`` is in
``/layer1/layer1.0/conv1``, as PyTorch's exporter names nodes): the tree adds the nodes up per scope
prefix, to ``depth`` levels. The model is read as imported (no pass has run: BatchNormalization
still counts its four vectors).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..ir.graph import Graph
from ..ir.ops.base import graph_fields
from ..ir.types import TensorType


@dataclass
class Layer:
    params: int = 0
    flops: int = 0
    activation_bytes: int = 0
    nodes: int = 0
    ops: dict = field(default_factory=dict)

    def add(self, other: "Layer") -> None:
        self.params += other.params
        self.flops += other.flops
        self.activation_bytes += other.activation_bytes
        self.nodes += other.nodes
        for k, v in other.ops.items():
            self.ops[k] = self.ops.get(k, 0) + v


def _scope(name: str | None) -> list[str]:
    parts = [p for p in (name or "").split("/")[:-1] if p]
    return parts


def summarize_graph(graph: Graph) -> dict:
    """{"total": Layer, "nodes": [(name, op, Layer)], "by_op": {op: Layer}}."""
    seen: set[int] = set()
    fixed: set[int] = set()  # values computed from constants alone (ConstantOfShape weights, folded chains)
    total, by_op, nodes = Layer(), {}, []
    for n in graph.nodes:
        if all(v is None or v.const is not None or id(v) in fixed for v in n.inputs) and \
                not graph_fields(type(n.op)) and n.outputs:
            fixed.update(id(o) for o in n.outputs if o is not None)
            continue
        lay = Layer(nodes=1, ops={n.op.name: 1})
        for v in n.inputs:
            if v is None or id(v) in seen or not isinstance(v.type, TensorType) or not v.type.dtype.is_float:
                continue  # (integer constants are shapes, axes and indices, not parameters)
            if v.const is not None or (id(v) in fixed and v.type.is_static):
                seen.add(id(v))
                lay.params += int(v.const.size) if v.const is not None else int(v.type.numel)
        ins = [v.type if v is not None else None for v in n.inputs]
        outs = [o.type for o in n.outputs]
        if all(isinstance(t, TensorType) and t.is_static for t in outs):
            try:
                lay.flops = int(n.op.cost(ins, outs).flops)
            except Exception:  # a cost that needs what a symbolic shape hides: counted as 0
                lay.flops = 0
            lay.activation_bytes = sum(int(t.nbytes or 0) for t in outs)
        nodes.append((n.name or f"#{len(nodes)}", n.op.name, lay))
        total.add(lay)
        by_op.setdefault(n.op.name, Layer()).add(lay)
    return {"total": total, "nodes": nodes, "by_op": by_op}


def tree(summary: dict, depth: int = 2) -> list[tuple[str, int, Layer]]:
    """(scope, level, Layer) for every scope prefix up to ``depth`` levels, in first-seen order."""
    scopes: dict[tuple, Layer] = {}
    for name, _, lay in summary["nodes"]:
        parts = _scope(name)
        for d in range(1, min(depth, len(parts)) + 1):
            scopes.setdefault(tuple(parts[:d]), Layer()).add(lay)
        if not parts:
            scopes.setdefault(("(top level)",), Layer()).add(lay)
    return [("/" + "/".join(k), len(k), v) for k, v in scopes.items()]


def _n(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def render(summary: dict, depth: int = 2, top_ops: int = 12) -> str:
    t = summary["total"]
    lines = [f"parameters {t.params:,} ({_n(t.params)}), FLOPs {_n(t.flops)} ({_n(t.flops / 2)} multiply-adds), "
             f"activations {t.activation_bytes / 2 ** 20:.1f} MiB over {t.nodes} nodes",
             "", f"{'scope':<44} {'params':>10} {'FLOPs':>10} {'act MiB':>8} {'nodes':>6}"]
    for scope, level, lay in tree(summary, depth):
        label = "  " * (level - 1) + scope.rsplit("/", 1)[-1] if level > 1 else scope
        lines.append(f"{label[:44]:<44} {_n(lay.params):>10} {_n(lay.flops):>10} "
                     f"{lay.activation_bytes / 2 ** 20:8.2f} {lay.nodes:>6}")
    lines += ["", f"{'op':<24} {'nodes':>6} {'params':>10} {'FLOPs':>10} {'% FLOPs':>8}"]
    ops = sorted(summary["by_op"].items(), key=lambda kv: -kv[1].flops)
    for op, lay in ops[:top_ops]:
        lines.append(f"{op:<24} {lay.nodes:>6} {_n(lay.params):>10} {_n(lay.flops):>10} "
                     f"{100 * lay.flops / max(t.flops, 1):8.1f}")
    if len(ops) > top_ops:
        lines.append(f"... {len(ops) - top_ops} more op type(s)")
    return "\n".join(lines)


def to_json(summary: dict, depth: int = 2) -> str:
    from dataclasses import asdict

    return json.dumps({"total": asdict(summary["total"]),
                       "scopes": [{"scope": s, "level": lv, **asdict(lay)} for s, lv, lay in tree(summary, depth)],
                       "by_op": {k: asdict(v) for k, v in summary["by_op"].items()},
                       "nodes": [{"name": nm, "op": op, **asdict(lay)} for nm, op, lay in summary["nodes"]]},
                      indent=1)


__all__ = ["Layer", "render", "summarize_graph", "to_json", "tree"]
