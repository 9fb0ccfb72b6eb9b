"""Drop a Relu or Clip whose every reader is a QuantizeLinear that already clips what it clips.

An int8 layer's rescale often ends ``Clip(y, 0, 6)`` (ReLU6) or ``Relu(y)``, then the next layer's
``QuantizeLinear(., s, z)``. QuantizeLinear is monotone and saturates at its type's ends, so
``q(clip(y, lo, hi)) = q(y)`` exactly when ``q(lo)`` is the type's lowest value and ``q(hi)`` its
highest (``fold_qdq.clamp_kept``): a Relu before a zero point at the bottom of the range (what a
calibrated range starting at 0 gives), a ReLU6 before a scale whose top is at most 6. Then the
clamp is work for nothing in the kernel that computes the chain (two NaN-propagating min/max per
vector), and this pass removes it; ONNX Runtime's QDQ transformer does the same when it folds an
activation into QLinearConv.

It runs at -O2 after ``quantize`` (and on QDQ models after ``fold-qdq`` kept a float rescale), on
Relu/Clip nodes whose readers are all such QuantizeLinears (one constant scale and zero point, to
int8/uint8); ``kept`` says why the other clamps before a QuantizeLinear stayed.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops import elementwise as ew
from ..ir.ops import quant as qn
from ..ir.types import DType
from .fold_qdq import clamp_kept, per_tensor_int8
from .manager import Pass

class DropSaturatedClamps(Pass):
    """Relu/Clip nodes read only by QuantizeLinears that saturate at their bounds are removed."""

    name = "drop-saturated-clamps"

    def __init__(self):
        #: names of the clamps removed
        self.dropped: list[str] = []
        #: clamp name -> why it stayed (only clamps read by a QuantizeLinear)
        self.kept: dict[str, str] = {}

    def run(self, graph: Graph) -> bool:
        changed = False
        for act in list(graph.nodes):
            if not isinstance(act.op, (ew.Relu, ew.Clip)) or act.outputs[0].dtype is not DType.f32:
                continue
            uses = list(act.outputs[0].uses)
            readers = [u for u, _ in uses if isinstance(u, Node)]
            if not readers or not any(isinstance(u.op, qn.QuantizeLinear) for u in readers):
                continue
            name = act.name or act.describe()
            if len(readers) != len(uses) or not all(isinstance(u.op, qn.QuantizeLinear) and not per_tensor_int8(u)
                                                    and act.outputs[0] is u.inputs[0] for u in readers):
                self.kept[name] = "read by other ops than QuantizeLinears by one constant scale to int8/uint8"
                continue
            why = next((w for u in readers if (w := clamp_kept(act, u))), None)
            if why:
                self.kept[name] = why
                continue
            act.outputs[0].replace_all_uses_with(act.inputs[0])
            graph.remove(act)
            self.dropped.append(name)
            changed = True
        return changed


__all__ = ["DropSaturatedClamps"]
