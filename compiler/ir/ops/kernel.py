"""``kiln.Kernel``: a fused kernel, a node holding the ops one native kernel computes.

The fusion pass (``compiler/passes/fuse.py``) replaces each group of nodes it fuses by one Kernel
node whose ``body`` graph holds them: the body's inputs are the values the group reads (the node's
inputs, in order), its outputs the values the group leaves for others (the node's results, in
order). A value both used inside the group and needed outside is simply both: a body result and
an operand of later body nodes (a multi-output kernel).

``kind`` names the fusion rule that formed it (``elementwise``, ``epilogue``, ...), for dumps.
The code generator lowers the body's nodes as one kernel group; the interpreter runs the body.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..graph import Graph
from ..types import TensorType
from .base import Cost, Pattern
from .control import _ControlFlow, _check_signature, _count, _run, substitute


@dataclass(frozen=True, eq=False)
class Kernel(_ControlFlow):
    """The nodes of ``body``, fused into one kernel (see the module docstring)."""

    body: Graph
    kind: str = "fused"
    domain: ClassVar = "kiln"
    inputs: ClassVar = ("inputs*",)
    outputs: ClassVar = ("outputs*",)

    def validate(self):
        _count(self, self.body, "body", 0, "")
        if not self.body.nodes:
            raise self.fail("attribute body: a kernel computes at least one node")
        if not self.body.outputs:
            raise self.fail("attribute body: returns nothing")
        if not self.kind or not self.kind.replace("-", "").replace("_", "").isalnum():
            raise self.fail(f"kind must be a word, got {self.kind!r}")

    def group_pattern(self) -> Pattern:
        """The pattern of the fused group: the largest of its members' (the op's own ``pattern``
        stays opaque: a kernel does not fuse further)."""
        return max((n.op.pattern for n in self.body.nodes), default=Pattern.OPAQUE)

    def infer(self, ins):
        b = self.body
        if len(ins) != len(b.inputs) or any(v is None for v in ins):
            raise self.fail(f"its body takes {len(b.inputs)} input(s), got {len(ins)}")
        env: dict = {}
        _check_signature(self, b, "body", b.inputs, [v.type for v in ins], env)
        return [substitute(v.type, env) for v in b.outputs]

    def compute(self, *xs):
        return _run(self.body, xs)

    def cost(self, ins, outs) -> Cost:
        """FLOPs of the members; bytes of what the kernel reads and writes (not its intermediates)."""
        flops = 0
        for n in self.body.nodes:
            try:
                flops += n.op.cost([v.type if v is not None else None for v in n.inputs],
                                   [o.type for o in n.outputs]).flops
            except Exception:
                pass
        moved = sum((t.nbytes or 0) for t in list(ins) + list(outs) if isinstance(t, TensorType))
        return Cost(flops, moved)

    def members(self) -> list[str]:
        return [n.op.name for n in self.body.nodes]


OPS = (Kernel,)
