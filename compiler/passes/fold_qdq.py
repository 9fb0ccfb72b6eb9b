"""Fold the QuantizeLinear/DequantizeLinear pairs of a QDQ model (ONNX Runtime's ``quantize_static``
and other quantizers) into integer products, as ONNX Runtime's QDQ transformer does.

A QDQ model computes each quantized product in float between the pairs:

    xd = DequantizeLinear(xq, sx, zx)          xq: the uint8/int8 activations
    wd = DequantizeLinear(Wq, sw, zw)          Wq: constant int8 weights, per tensor or per channel
    [bd = DequantizeLinear(Bq, sx * sw, 0)]    Bq: constant int32 bias
    y  = Conv/MatMul/Gemm(xd, wd [, bd])
    [y = Relu(y) or Clip(y, lo, hi)]
    yq = QuantizeLinear(y, sy, zy)             (when the next layer reads it quantized)

``fold-qdq`` (the first pass at -O1 and above, before constant folding turns ``wd`` into float
weights) rewrites it to the integer ops the int8 tiles run:

* with ``qlinear=True``, followed by a QuantizeLinear that alone reads it: ``yq = QLinearConv(xq, sx, zx, Wq, sw, zw, sy,
  zy, Bq)`` or ``QLinearMatMul`` (no bias). A Relu or Clip between goes when ``yq``'s range already
  clips it (QuantizeLinear is monotone, so ``q(max(y, 0)) = max(q(y), q(0))`` and ``q(0) = zy``: a
  Relu is redundant when ``zy`` is the type's lowest value, as a calibrated range starting at 0
  gives). The bias must be int32 with scale ``sx * sw`` (as QDQ quantizers store it).
* otherwise: ``MatMulInteger``/``ConvInteger`` and the float rescale ``Cast(acc) * (sx * sw) +
  bias`` (then the Relu, the QuantizeLinear, ... as they were), the chain the fuse pass runs as one
  kernel. This is the pipeline's choice today: the tiles finish a QLinear op per element in scalar
  f64 (its exact reference arithmetic), which measured slower than the vectorized rescale and
  QuantizeLinear kernels (ONNX Runtime's QDQ ResNet-50, 224x224, 2 threads on an AMD EPYC: 32 ms
  with QLinearConv, 25 ms with ConvInteger + rescale).

The integer sums are exact; the result differs from the float reference by the float rounding of the
reference's own products and, for the QLinear ops, at most one step of ``y``'s quantization (a
value on a rounding boundary). ``refusals`` says why a product reading a DequantizeLinear stayed in
float (weights not constant, a grouped convolution, parameters per channel along the wrong axis,
...), and ``rescaled`` why one kept a float rescale instead of a QLinear op (no QuantizeLinear after
it, a Relu its quantization does not make redundant, a float bias, ...).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import elementwise as ew
from ..ir.ops import quant as qn
from ..ir.types import DType
from .manager import Pass

_INT8 = (DType.i8, DType.u8)
_RANGE = {DType.u8: (0, 255), DType.i8: (-128, 127)}


def _const(v: Value | None) -> np.ndarray | None:
    return None if v is None else v.const


def _dequantized(v: Value, types=_INT8) -> "tuple[Value, np.ndarray, np.ndarray | None, int] | str":
    """(the integer value, its scale, its zero point or None, the DQ's axis) of ``v`` =
    DequantizeLinear(...) of an integer of ``types``, with constant f32 parameters; or why not."""
    p = v.producer
    if p is None or not isinstance(p.op, qn.DequantizeLinear):
        return "not computed by a DequantizeLinear"
    xq, scale, zp = (list(p.inputs) + [None])[:3]
    if xq.dtype not in types:
        return f"the DequantizeLinear reads {xq.dtype}, not {'/'.join(t.short for t in types)}"
    if p.op.block_size:
        return "blocked quantization"
    if _const(scale) is None or (zp is not None and _const(zp) is None):
        return "the scale or zero point is not constant"
    if scale.dtype is not DType.f32 or v.dtype is not DType.f32:
        return "not float32"
    return xq, scale.const, None if zp is None else zp.const, p.op.axis % max(xq.type.rank, 1)


def _per(params: np.ndarray, axis: int, want_axis: int, length: int) -> "np.ndarray | str":
    """A weight parameter (scale or zero point) per tensor (a scalar) or per channel (1-D of
    ``length`` along ``want_axis``); or why not."""
    if params.size == 1:
        return params.reshape(())
    if params.ndim == 1 and params.size == length and axis == want_axis:
        return params
    return f"weight parameters of shape {list(params.shape)} along axis {axis}: only per tensor or per output channel"


@dataclass
class _Product:
    node: Node
    xq: Value
    sx: np.ndarray      # scalar f32
    zx: np.ndarray      # scalar, x's type
    wq: np.ndarray      # int8/uint8: [K, N] (MatMul, Gemm) or [M, C, kh, kw] (Conv)
    sw: np.ndarray      # f32, scalar or per output channel
    zw: np.ndarray      # w's type, scalar or per output channel
    bias: np.ndarray | None  # the float32 bias (Conv's B, Gemm's C), one per output channel
    bq: np.ndarray | None  # the bias as int32 with scale sx * sw, when it is one

    @property
    def conv(self) -> bool:
        return self.node.op.name == "Conv"


def _product(node: Node) -> "_Product | str":
    """The integer form of ``node`` (Conv/MatMul/Gemm reading DequantizeLinear values), or why not."""
    x = _dequantized(node.inputs[0])
    if isinstance(x, str):
        return f"the activations are {x}"
    w = _dequantized(node.inputs[1])
    if isinstance(w, str):
        return f"the weights are {w}"
    xq, sx, zx, _ = x
    wv, sw, zw, waxis = w
    if sx.size != 1 or (zx is not None and zx.size != 1):
        return "the activations' scale or zero point is not per tensor"
    if wv.const is None:
        return "the weights are not constant"
    wq = wv.const
    op = node.op
    if node.op.name == "Conv":
        if wq.ndim != 4:
            return "only 2-D convolutions are folded"
        if op.group != 1:
            return "a grouped convolution (no fast int8 kernel for it: it stays float)"
        out_axis, length = 0, wq.shape[0]
    elif node.op.name == "MatMul":
        if wq.ndim != 2 or xq.type.rank < 2:
            return "only a matrix of weights and activations of rank 2 or more are folded"
        out_axis, length = 1, wq.shape[1]
    else:  # Gemm
        if op.transA or float(op.alpha) != 1.0 or (len(node.inputs) > 2 and node.inputs[2] is not None
                                                      and float(op.beta) != 1.0):
            return "a Gemm with transA, alpha or beta"
        out_axis, length = (0 if op.transB else 1), wq.shape[0 if op.transB else 1]
    sw_ = _per(sw, waxis, out_axis, length)
    zw_ = _per(zw if zw is not None else np.zeros((), wq.dtype), waxis, out_axis, length)
    for p in (sw_, zw_):
        if isinstance(p, str):
            return p
    if node.op.name == "Gemm" and op.transB:
        wq = wq.T
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    bias_f, bq = None, None
    if bias is not None:
        d = _dequantized(bias, _INT8 + (DType.i32,)) if bias.producer is not None else None
        if bias.const is not None:
            bias_f = bias.const
        elif d is not None and not isinstance(d, str) and d[0].const is not None:
            bp = bias.producer  # DequantizeLinear of constants: its value, as the reference computes it
            bias_f = bp.op.compute(*[v.const if v is not None else None for v in bp.inputs])[0]
            if d[0].dtype is DType.i32 and d[0].type.rank == 1 and (d[2] is None or not d[2].any()) and \
                    np.array_equal(np.broadcast_to(d[1], (length,)),
                                   np.broadcast_to((sx.astype(np.float32) * sw_).astype(np.float32), (length,))):
                bq = d[0].const
        if bias_f is None or bias_f.dtype != np.float32 or bias_f.ndim != 1 or bias_f.size != length:
            return "the bias is not a constant float32 vector, one per output channel"
    zx_ = zx.reshape(()) if zx is not None else np.zeros((), xq.dtype.np)
    return _Product(node, xq, sx.reshape(()).astype(np.float32), zx_, wq, sw_.astype(np.float32), zw_, bias_f, bq)


def _key(node: Node) -> str:
    """The node's name in ``refusals``, ``folded`` and ``rescaled``."""
    return node.name or node.describe()


def _only_user(v: Value) -> Node | None:
    use = v.uses.single()
    return use[0] if use is not None and isinstance(use[0], Node) else None


def per_tensor_int8(q: Node) -> str | None:
    """Why QuantizeLinear ``q`` is not float32 to int8/uint8 by one constant scale and zero point
    (None when it is)."""
    sy, zy = (list(q.inputs) + [None])[1:3]
    if _const(sy) is None or sy.const.size != 1 or (zy is not None and (_const(zy) is None or zy.const.size != 1)):
        return "has parameters that are not one constant"
    if sy.dtype is not DType.f32 or q.outputs[0].dtype not in _INT8 or q.op.block_size:
        return "is not float32 to int8/uint8"
    return None


def clamp_kept(act: Node, q: Node) -> str | None:
    """Why the Relu/Clip ``act`` read by QuantizeLinear ``q`` (one constant scale and zero point,
    to int8/uint8) is not redundant, or None when ``q`` already clips it: QuantizeLinear is
    monotone, so ``q(max(y, lo)) = max(q(y), q(lo))``, which is ``q(y)`` when ``q(lo)`` is the
    type's lowest value (a Relu before a zero point at the bottom of the range, as a calibrated
    range starting at 0 gives); the same at the top for ``hi``. NaN stays NaN through both."""
    lo_q, hi_q = _RANGE[q.outputs[0].dtype]
    sy, zy = (list(q.inputs) + [None])[1:3]
    z = int(zy.const.reshape(())) if zy is not None else 0
    s = float(sy.const.reshape(()))

    def q_of(v: float) -> int:
        return int(np.clip(np.rint(np.float32(v) / np.float32(s)) + z, lo_q, hi_q))
    if isinstance(act.op, ew.Relu):
        lo, hi = 0.0, None
    else:
        mn, mx = (list(act.inputs) + [None, None])[1:3]
        if (mn is not None and _const(mn) is None) or (mx is not None and _const(mx) is None):
            return "a Clip with bounds that are not constant"
        lo = None if mn is None else float(mn.const)
        hi = None if mx is None else float(mx.const)
    if (lo is not None and q_of(lo) > lo_q) or (hi is not None and q_of(hi) < hi_q):
        return f"{act.op.name} is not made redundant by the quantization after it (its bounds map inside " \
               f"[{lo_q}, {hi_q}])"
    return None


def _requantized_by(y: Value) -> "tuple[Node, Node | None] | str":
    """(the QuantizeLinear that alone reads ``y`` (through a Relu/Clip it makes redundant), the
    activation between or None); or why the product keeps a float result."""
    q = _only_user(y)
    act = None
    if q is not None and isinstance(q.op, (ew.Relu, ew.Clip)):
        act, q = q, _only_user(q.outputs[0])
    if q is None or not isinstance(q.op, qn.QuantizeLinear):
        return "its result is not read by one QuantizeLinear alone"
    why = per_tensor_int8(q)
    if why:
        return f"the QuantizeLinear after it {why}"
    if act is not None:
        why = clamp_kept(act, q)
        if why:
            return why
    return q, act


class FoldQDQ(Pass):
    """Conv/MatMul/Gemm between DequantizeLinear inputs (and a QuantizeLinear after) become integer
    products: QLinearConv/QLinearMatMul, or ConvInteger/MatMulInteger and a float rescale."""

    name = "fold-qdq"

    #: why the default makes no QLinear ops (``FoldQDQ.rescaled``)
    NO_QLINEAR = "QLinear ops are off (qlinear=False): the int8 tiles finish a QLinear op per element in scalar " \
                 "f64, slower than the vectorized rescale and QuantizeLinear kernels"

    def __init__(self, qlinear: bool = False):
        #: make QLinearConv/QLinearMatMul where a QuantizeLinear follows (else always the integer
        #: product and the rescale: faster today, see ``NO_QLINEAR``)
        self.qlinear = qlinear
        #: node name -> why a product reading a DequantizeLinear stayed float
        self.refusals: dict[str, str] = {}
        #: node name -> "QLinearConv" / "QLinearMatMul" / "ConvInteger" / "MatMulInteger"
        self.folded: dict[str, str] = {}
        #: node name -> why an integer product kept a float rescale (no QLinear op)
        self.rescaled: dict[str, str] = {}

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if node.op.name not in ("Conv", "MatMul", "Gemm") or node not in graph.nodes:
                continue
            x = node.inputs[0]
            if x is None or x.producer is None or not isinstance(x.producer.op, qn.DequantizeLinear):
                continue  # not a quantized product: nothing to say
            p = _product(node)
            if isinstance(p, str):
                self.refusals[_key(node)] = p
                continue
            dqs = [v.producer for v in node.inputs if v is not None and v.producer is not None
                   and isinstance(v.producer.op, qn.DequantizeLinear)]
            self._rewrite(graph, p)
            for dq in dqs:  # the DequantizeLinears nothing reads now
                if dq in graph.nodes and not dq.outputs[0].uses:
                    graph.remove(dq)
            changed = True
        if changed:
            graph.remove_unused_constants()
        return changed

    def _rewrite(self, graph: Graph, p: _Product) -> None:
        node = p.node
        name = _key(node)
        after = _requantized_by(node.outputs[0]) if self.qlinear else self.NO_QLINEAR
        if not isinstance(after, str) and p.bias is not None and p.bq is None:
            after = "its bias is not int32 at the scale x_scale * w_scale (a QLinear op needs it so)"
        if not isinstance(after, str) and not p.conv and p.bias is not None:
            after = "a Gemm's bias (QLinearMatMul has none)"

        def const(array, what):
            return graph.add_constant(np.asarray(array), name=f"{name}.{what}")

        def add(op, *inputs):
            return graph.add_node(op, list(inputs), name=name, before=node).output

        conv_attrs = {}
        if p.conv:
            c = node.op
            conv_attrs = dict(auto_pad=c.auto_pad, dilations=c.dilations, group=c.group,
                              kernel_shape=c.kernel_shape, pads=c.pads, strides=c.strides)
        sx, zx, wq, sw, zw = (const(p.sx, "x_scale"), const(p.zx, "x_zero_point"), const(p.wq, "w_int8"),
                              const(p.sw, "w_scale"), const(p.zw, "w_zero_point"))
        if not isinstance(after, str):
            q, act = after
            sy, zy = q.inputs[1], (q.inputs[2] if len(q.inputs) > 2 and q.inputs[2] is not None
                                   else const(np.zeros((), q.outputs[0].dtype.np), "y_zero_point"))
            if p.conv:
                bias = [const(p.bq, "bias_int32")] if p.bq is not None else []
                y = add(qn.QLinearConv(**conv_attrs), p.xq, sx, zx, wq, sw, zw, sy, zy, *bias)
            else:
                y = add(qn.QLinearMatMul(), p.xq, sx, zx, wq, sw, zw, sy, zy)
            q.outputs[0].replace_all_uses_with(y)
            for n in (q, act, node):
                if n is not None:
                    graph.remove(n)
            self.folded[name] = y.producer.op.name
            return
        integer = qn.ConvInteger(**conv_attrs) if p.conv else qn.MatMulInteger()
        acc = add(integer, p.xq, wq, zx, zw)
        scale = (np.float64(p.sx) * p.sw.astype(np.float64)).astype(np.float32)
        if p.conv and scale.ndim:
            scale = scale.reshape(-1, 1, 1)
        y = add(ew.Mul(), add(ew.Cast(to=DType.f32), acc), const(scale, "rescale"))
        if p.bias is not None:
            y = add(ew.Add(), y, const(p.bias.reshape(-1, 1, 1) if p.conv else p.bias, "bias"))
        node.output.replace_all_uses_with(y)
        graph.remove(node)
        self.folded[name] = integer.name
        self.rescaled[name] = after


__all__ = ["FoldQDQ"]
