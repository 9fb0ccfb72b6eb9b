"""Fold a QuantizeLinear's division into the linear ops that compute its input.

``QuantizeLinear(y, s, z)`` divides every element of y by the constant s before rounding. An int8
layer's y is linear in constants: the rescale of an integer product ``Cast(acc) * c + b`` (what
``quantize`` and ``fold-qdq`` make), plus a residual ``DequantizeLinear(r, sr, zr)``, through a
Relu or Clip; or a float convolution with constant weights (a depthwise layer between uint8
tensors). The division distributes over all of them, ``(c * a + b) / s = (c / s) * a + b / s``, so
this pass multiplies those constants by ``1 / s`` (in f64, rounded to f32 once) and gives the
QuantizeLinear the scale 1, which the code generator prints as nothing at all (``x / 1.0`` is x).
The kernels that finish int8 layers then do no division per element: a ``vdivps`` of 16 values
takes as long as the rest of their requantization together on a Zen 4 (MobileNetV2 int8 0.96x
with the divisions made multiplications by the reciprocal).

The results are those of one float rounding moved: ``round(a * f32(c / s))`` for ``round(f32(a *
c) / s)``. They differ only where y / s lies within a few float32 ulps of a rounding boundary (one
quantization step, there), as ONNX Runtime's QLinearConv differs from its QDQ model by folding
``x_scale * w_scale / y_scale`` into one multiplier. The reference interpreter runs the graph the pass
leaves, so every kernel is still checked against it exactly.

Every value changed must be read by the chain alone (a value read elsewhere keeps its meaning);
``kept`` says why a QuantizeLinear kept its division.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import elementwise as ew
from ..ir.ops import quant as qn
from ..ir.types import DType
from .manager import Pass


def _const_f32(v: Value | None) -> bool:
    return v is not None and v.const is not None and v.dtype is DType.f32


def _plan(v: Value, reader: Node, edits: list) -> str | None:
    """Add to ``edits`` the (node, input index) constants that dividing ``v`` (read by ``reader``
    alone) by the scale divides; or say why ``v`` cannot be divided so."""
    n = v.producer
    if n is None:
        return "its input is a graph input" if v.const is None else "its input is a constant"
    use = v.uses.single()
    if use is None or use[0] is not reader:
        return f"{n.op.name}'s result is read by other ops too"
    op = n.op
    if isinstance(op, ew.Mul):  # c * a: the constant divided
        k = next((i for i, x in enumerate(n.inputs) if _const_f32(x)), None)
        if k is None:
            return "a Mul without a constant float32 operand"
        edits.append((n, k))
        return None
    if isinstance(op, ew.Add):  # a + b: both divided (a constant, or a value divided in turn)
        for i, x in enumerate(n.inputs):
            if _const_f32(x):
                edits.append((n, i))
            elif (why := _plan(x, n, edits)) is not None:
                return why
        return None
    if isinstance(op, (ew.Relu, ew.Clip)):  # positively homogeneous: the bounds divided too (s > 0)
        for i, x in enumerate(n.inputs[1:], 1):
            if x is None:
                continue
            if not _const_f32(x):
                return "a Clip with bounds that are not constant float32"
            edits.append((n, i))
        return _plan(n.inputs[0], n, edits)
    if isinstance(op, qn.DequantizeLinear):  # (r - zr) * sr: its scale divided
        if not _const_f32(n.inputs[1]) or op.block_size:
            return "a DequantizeLinear whose scale is not a constant float32"
        edits.append((n, 1))
        return None
    if op.name == "Conv":  # linear in its weights and bias
        if not _const_f32(n.inputs[1]) or (len(n.inputs) > 2 and n.inputs[2] is not None
                                           and not _const_f32(n.inputs[2])):
            return "a Conv whose weights or bias are not constant float32"
        edits += [(n, i) for i in range(1, len(n.inputs)) if n.inputs[i] is not None]
        return None
    return f"its input is computed by {op.name}, not a linear op of constants the division can go into"


class FoldQuantizeScale(Pass):
    """QuantizeLinear nodes by one constant scale: the division goes into the constants of the
    linear ops before them, their scale becomes 1."""

    name = "fold-quantize-scale"

    def __init__(self):
        #: names of the QuantizeLinear nodes whose division was folded
        self.folded: list[str] = []
        #: QuantizeLinear name -> why it kept its division
        self.kept: dict[str, str] = {}

    def run(self, graph: Graph) -> bool:
        changed = False
        for q in list(graph.nodes):
            if not isinstance(q.op, qn.QuantizeLinear):
                continue
            name = q.name or q.describe()
            why = self._why_not(q)
            edits: list = []
            if why is None:
                why = _plan(q.inputs[0], q, edits)
            if why is not None:
                self.kept[name] = why
                continue
            s = np.float64(q.inputs[1].const.reshape(()))
            for n, i in edits:
                c = n.inputs[i]
                n.set_input(i, graph.add_constant((c.const.astype(np.float64) / s).astype(np.float32),
                                                  name=f"{c.name or n.name}.over_scale"))
            q.set_input(1, graph.add_constant(np.ones(q.inputs[1].const.shape, np.float32), name=f"{name}.unit_scale"))
            self.folded.append(name)
            changed = True
        if changed:
            graph.remove_unused_constants()
        return changed

    @staticmethod
    def _why_not(q: Node) -> str | None:
        s = q.inputs[1]
        if not _const_f32(s) or s.const.size != 1 or q.op.block_size:
            return "its scale is not one constant float32"
        v = float(s.const.reshape(()))
        if v == 1.0:
            return "its scale is 1 already"
        if not (np.isfinite(v) and v > 0):
            return "its scale is not positive and finite"
        if q.inputs[0].dtype is not DType.f32:
            return "its input is not float32"
        return None


__all__ = ["FoldQuantizeScale"]
