"""int8 post-training quantization of the products with constant weights (MatMul, Gemm, Conv).

Each quantized product becomes integer work and a float rescale, in ONNX ops (so ``kiln dump``
shows it and the reference interpreter checks it):

    static (``int8``):           xq = QuantizeLinear(x, sx, zx)              sx, zx from x's calibrated range
    dynamic (``int8-dynamic``):  xq, sx, zx = DynamicQuantizeLinear(x)        from each run's x
    then                          acc = MatMulInteger(xq, Wq, zx)            int32 sums (the int8 tiles)
                                        (ConvInteger for a Conv, its attributes kept)
                                  y   = Cast(acc, f32) * (sx * sw) [+ bias]  (per output channel for a Conv)

x is asymmetric uint8 (scale ``(hi - lo) / 255`` over the range extended to 0; or symmetric int8
with ``symmetric``); the weights are symmetric int8 in [-127, 127] with one scale per tensor or per
output column (``per_channel``): ``sw = max|W| / 127``. The rescale is exact in the sense that
only x and W are rounded: the int32 sums are exact.

The pass never imports a backend: static quantization needs x's range, which the driver measures
by running the float model on calibration data (a ``Calibrate`` callback: the graph and the values
to observe in, their ``(min, max)`` out). ``refusals`` keeps why each product left in float was
left (excluded, weights not constant, an op without an int8 kernel yet).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import elementwise as ew
from ..ir.ops import quant as qn
from ..ir.ops.base import Pattern
from ..ir.types import DType
from .manager import Pass
from .options import OptionError

MODES = ("int8", "int8-dynamic")
_QDQ = (qn.QuantizeLinear, qn.DequantizeLinear, qn.DynamicQuantizeLinear)
CALIBRATORS = ("minmax", "percentile", "entropy")
#: ops that could be quantized but have no int8 path yet, and why (listed as refusals)
NOT_YET = {"ConvTranspose": "int8 ConvTranspose is not built", "Attention": "int8 attention is not built"}
QUANTIZED_OPS = ("MatMul", "Gemm", "Conv")

#: the driver's measurement: (graph, values to observe) -> {id(value): (min, max)} over the calibration data
Calibrate = Callable[[Graph, Sequence[Value]], Mapping[int, tuple[float, float]]]


@dataclass(frozen=True)
class QuantizeOptions:
    """What ``compile(..., quantize=...)`` and ``kiln compile --quantize`` ask for."""

    #: "int8": activations quantized with ranges measured on calibration data; "int8-dynamic": at
    #: run time from each input's own range (no calibration data; the usual choice for transformers)
    mode: str = "int8"
    #: how a range is measured from the calibration data ("minmax": the extremes seen; "percentile":
    #: all but the outer ``100 - percentile`` percent; "entropy": the KL-closest clipping), see
    #: ``compiler/calibration.py``
    calibrator: str = "minmax"
    #: the percentile calibrator's share of elements kept, in percent
    percentile: float = 99.999
    #: one weight scale per output column instead of one per tensor
    per_channel: bool = False
    #: activations as int8 with zero point 0 (range symmetric about 0) instead of uint8
    symmetric: bool = False
    #: node names or op names (e.g. "Gemm") kept in float
    exclude: tuple[str, ...] = field(default_factory=tuple)
    #: static int8: a value quantized for a product and also read by float elementwise ops (a
    #: residual connection) is read by those ops dequantized from the same uint8 tensor, as ONNX
    #: Runtime's QDQ models do: one more rounding of the residual (half a step of its scale), and
    #: the layer before writes one byte per element instead of a float and a byte
    int8_residuals: bool = True
    #: static int8: a depthwise convolution (no int8 kernel: its products stay float32) reads its
    #: input as uint8 (``DequantizeLinear(QuantizeLinear(x))``, as ONNX Runtime's QDQ models do): one
    #: more rounding of x, and the layer before writes one byte per element instead of four (the
    #: CPU backend computes the conv from the bytes, ``codegen/kernels/qdepthwise.py``)
    int8_depthwise: bool = True
    #: keep the layers whose quantization costs most in float until the model output's error
    #: (1 - cosine similarity with float, over the calibration samples) is at most this
    #: (``compiler/quantize_report.py``); None: quantize every layer it can
    accuracy_budget: float | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise OptionError(f"quantize mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.calibrator not in CALIBRATORS:
            raise OptionError(f"calibrator must be one of {', '.join(CALIBRATORS)}, got {self.calibrator!r}")
        if not 50 < self.percentile <= 100:
            raise OptionError(f"percentile must be in (50, 100], got {self.percentile}")
        if self.mode == "int8-dynamic" and self.symmetric:
            raise OptionError("int8-dynamic quantizes activations as uint8 (DynamicQuantizeLinear); "
                              "symmetric is for int8")
        object.__setattr__(self, "exclude", tuple(self.exclude))
        if self.accuracy_budget is not None and not 0 <= self.accuracy_budget < 1:
            raise OptionError(f"accuracy_budget is 1 - cosine similarity, in [0, 1): got {self.accuracy_budget}")

    @property
    def needs_calibration(self) -> bool:
        return self.mode == "int8"

    @classmethod
    def of(cls, value: "QuantizeOptions | str | None") -> "QuantizeOptions | None":
        """Options from a mode name ("int8", "int8-dynamic") or options; None stays None."""
        if value is None or isinstance(value, QuantizeOptions):
            return value
        if isinstance(value, str):
            return cls(mode=value)
        raise OptionError(f"quantize must be a mode name or QuantizeOptions, got {type(value).__name__}")


@dataclass(frozen=True)
class _Product:
    """A product to quantize: y = alpha * x @ W (+ bias) with W [K, N], or y = Conv(x, W) (+ bias) with
    W [M, C, kh, kw] (``conv``: the Conv op); W constant."""

    node: Node
    x: Value
    w: np.ndarray
    alpha: float
    bias: np.ndarray | None
    conv: object = None

    @property
    def channel_axis(self) -> int:
        """W's axis of output channels (one scale each with per_channel)."""
        return 0 if self.conv is not None else 1


def product_of(node: Node) -> "_Product | str":
    """The product ``node`` computes, or why it is not quantized."""
    name = node.op.name
    if name not in QUANTIZED_OPS:
        return NOT_YET.get(name, f"{name} has no int8 form")
    x, w = node.inputs[0], node.inputs[1]
    if w.const is None:
        return "the weights are not constant"
    if x.dtype is not DType.f32 or w.dtype is not DType.f32:
        return "not float32"
    if not x.type.is_static or x.type.rank < 1:
        return "the activations' shape is not static"
    if name == "Conv":
        if x.type.rank != 4:
            return "only 2-D convolutions are quantized"
        if node.op.group != 1:
            return ("a grouped convolution (no fast int8 kernel for it yet: it stays float; static int8 "
                    "reads a depthwise one's input as uint8)")
        b = node.inputs[2] if len(node.inputs) > 2 else None
        if b is not None and b.const is None:
            return "the bias is not constant"
        return _Product(node, x, w.const, 1.0, None if b is None else b.const.astype(np.float64), conv=node.op)
    if w.type.rank != 2:
        return f"the weights have rank {w.type.rank}, not 2"
    if name == "MatMul":
        if x.type.rank < 2:
            return "the activations are a vector"
        return _Product(node, x, w.const, 1.0, None)
    op = node.op
    if op.transA:
        return "Gemm with transA"
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is not None and c.const is None:
        return "Gemm's C is not constant"
    bias = None if c is None or float(op.beta) == 0.0 else (float(op.beta) * c.const.astype(np.float64))
    return _Product(node, x, w.const.T if op.transB else w.const, float(op.alpha), bias)


def depthwise_inputs(graph: Graph, excluded: Callable[[Node], bool] = lambda n: False) -> list[Node]:
    """The depthwise convolutions whose input static int8 quantizes (``int8_depthwise``): float32 2-D,
    one input channel per group, not ``excluded``, the only reader of an input computed in the graph
    (a model input would be quantized by a kernel of its own: no bytes saved), and whose result
    (through an activation) is read only by products quantized here, so the conv reads and writes
    bytes (a depthwise conv with a float reader, e.g. a SiLU's product, is left alone)."""
    found = []
    for node in graph.nodes:
        if node.op.name != "Conv" or excluded(node):
            continue
        x = node.inputs[0]
        if x.dtype is not DType.f32 or not x.type.is_static or x.type.rank != 4 or x.producer is None:
            continue
        use = x.uses.single()
        if int(node.op.group) > 1 and int(node.op.group) == int(x.shape[1]) and use is not None and use[0] is node \
                and _read_by_products(node.outputs[0], excluded):
            found.append(node)
    return found


def _read_by_products(v: Value, excluded: Callable[[Node], bool]) -> bool:
    """Whether ``v``, through a chain of elementwise ops each read by the next alone, is read only
    as the input of products this pass quantizes."""
    while True:
        readers = [u for u, _ in v.uses]
        if not readers or not all(isinstance(u, Node) for u in readers):
            return False
        if all(u.inputs[0] is v and not excluded(u) and not isinstance(product_of(u), str) for u in readers):
            return True
        u = readers[0]
        if len(readers) != 1 or u.op.pattern > Pattern.BROADCAST or len(u.outputs) != 1 or \
                tuple(u.outputs[0].shape) != tuple(v.shape):
            return False
        v = u.outputs[0]


def weight_scales(w: np.ndarray, per_channel: bool, axis: int = 1) -> np.ndarray:
    """Symmetric int8 scales of W: max|W| / 127 per index of ``axis`` (the output channels: a
    matmul's columns, a Conv's first axis) or for the whole (1 where 0)."""
    a = np.abs(w.astype(np.float64))
    amax = a.max(axis=tuple(i for i in range(w.ndim) if i != axis), initial=0.0) if per_channel else a.max(initial=0.0)
    return np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)


def activation_params(lo: float, hi: float, symmetric: bool) -> tuple[np.float32, np.ndarray]:
    """(scale, zero point) of an activation range (extended to 0): uint8 asymmetric or int8 symmetric."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not np.isfinite(lo) or not np.isfinite(hi):
        raise ValueError(f"the calibrated range [{lo}, {hi}] is not finite")
    if symmetric:
        amax = max(-lo, hi)
        return np.float32(amax / 127.0 if amax > 0 else 1.0), np.array(0, np.int8)
    scale = np.float32((hi - lo) / 255.0 if hi > lo else 1.0)
    return scale, np.array(np.clip(np.rint(-lo / np.float64(scale)), 0, 255), np.uint8)


class Quantize(Pass):
    """MatMul/Gemm with constant weights become QuantizeLinear (or DynamicQuantizeLinear) +
    MatMulInteger + a float rescale; ``refusals`` says why the others stayed in float."""

    name = "quantize"

    def __init__(self, options: QuantizeOptions, calibrate: Calibrate | None = None):
        if options.needs_calibration and calibrate is None:
            raise OptionError("static int8 quantization needs calibration data (or use int8-dynamic)")
        self.options, self.calibrate = options, calibrate
        #: node name -> why it was not quantized
        self.refusals: dict[str, str] = {}
        #: node names quantized
        self.quantized: list[str] = []
        #: node name -> the value that now stands for its result (the float rescale)
        self.results: dict[str, Value] = {}
        #: names of the values whose float elementwise readers now read them dequantized
        self.shared: list[str] = []
        #: names of the depthwise convolutions now reading their input as uint8 (``int8_depthwise``;
        #: also in ``quantized``, not in ``refusals``: their arithmetic stays float)
        self.uint8_inputs: list[str] = []
        #: names of the MaxPool nodes now taking their max on uint8 (``_pool_in_int8``)
        self.pooled_in_int8: list[str] = []
        self._quantized_x: dict[int, Node] = {}  # id(x) -> the QuantizeLinear of it made here
        self._x_scale: dict[int, float] = {}  # id(x) -> its scale

    def excluded(self, node: Node) -> bool:
        return node.name in self.options.exclude or node.op.name in self.options.exclude

    def run(self, graph: Graph) -> bool:
        depthwise = depthwise_inputs(graph, self.excluded) \
            if self.options.needs_calibration and self.options.int8_depthwise else []
        products = []
        for node in graph.nodes:
            if node.op.name not in QUANTIZED_OPS and node.op.name not in NOT_YET:
                continue
            p = "excluded by the options" if self.excluded(node) else product_of(node)
            if isinstance(p, str):
                self.refusals[node.name or node.describe()] = p
            else:
                products.append(p)
        if not products and not depthwise:
            return False
        ranges = {}
        if self.options.needs_calibration:
            xs = list({id(v): v for v in [p.x for p in products] + [d.inputs[0] for d in depthwise]}.values())
            ranges = self.calibrate(graph, xs)
        dw_ranges = [ranges.get(id(d.inputs[0])) for d in depthwise]  # (a product's rewrite replaces its result)
        for p in products:
            self._rewrite(graph, p, ranges.get(id(p.x)))
            self.quantized.append(p.node.name)
        for d, rng in zip(depthwise, dw_ranges):
            self._dequantized_input(graph, d, rng)
        if self.options.needs_calibration:
            self._pool_in_int8(graph)
        if self.options.needs_calibration and self.options.int8_residuals:
            self._share_quantized(graph)
        graph.remove_unused_constants()
        return True

    def _quantization(self, graph: Graph, x: Value, rng: tuple[float, float], name: str, before: Node) -> Node:
        """The QuantizeLinear of ``x`` by its calibrated range ``rng``: one per value, made before
        ``before`` by its first reader."""
        if id(x) not in self._quantized_x:
            sx, zx = activation_params(*rng, symmetric=self.options.symmetric)
            zero = graph.add_constant(zx, name=f"{name}.zero_point")
            scale = graph.add_constant(np.asarray(sx, np.float32), name=f"{name}.scale")
            q = graph.add_node(qn.QuantizeLinear(), [x, scale, zero], name=before.name, before=before)
            self._quantized_x[id(x)] = q
            self._x_scale[id(x)] = sx
        return self._quantized_x[id(x)]

    def _dequantized_input(self, graph: Graph, conv: Node, rng: tuple[float, float]) -> None:
        """Depthwise ``conv`` reads ``DequantizeLinear(QuantizeLinear(x))`` instead of x (``int8_depthwise``)."""
        x = conv.inputs[0]
        q = self._quantization(graph, x, rng, x.name or conv.name, conv)
        dq = graph.add_node(qn.DequantizeLinear(), [q.output, q.inputs[1], q.inputs[2]], name=conv.name, before=conv)
        conv.set_input(0, dq.output)
        self.quantized.append(conv.name)
        self.uint8_inputs.append(conv.name)
        self.refusals.pop(conv.name or conv.describe(), None)
        self.results[conv.name] = conv.outputs[0]

    def _pool_in_int8(self, graph: Graph) -> None:
        """``QuantizeLinear(MaxPool(y))`` becomes ``MaxPool(QuantizeLinear(y))``, the max taken on
        uint8: exact (quantization never reverses an order), and the op before the pool (a product's
        rescale and activation, e.g. ResNet's stem) then writes uint8 in its own kernel, the pool
        reading a quarter of the bytes. Only where the pool's every reader is such a quantization
        (static scales: a dynamic one's range would change) and its indices are unused."""
        for key, q in list(self._quantized_x.items()):
            pool = q.inputs[0].producer
            if pool is None or pool.op.name != "MaxPool" or (len(pool.outputs) > 1 and pool.outputs[1].uses):
                continue
            readers = [u for u, _ in pool.outputs[0].uses]
            if not readers or not all(isinstance(u, Node) and isinstance(u.op, qn.QuantizeLinear) for u in readers):
                continue
            made = []  # (scale, zero point, the pool of that quantization): one per distinct quantization
            for u in readers:
                params = [v.const for v in u.inputs[1:]]
                p2 = next((m for *ps, m in made if len(ps) == len(params)
                           and all(np.array_equal(a, b) for a, b in zip(ps, params))), None)
                if p2 is None:
                    q2 = graph.add_node(u.op, [pool.inputs[0], *u.inputs[1:]], name=u.name, before=pool)
                    p2 = graph.add_node(pool.op, [q2.output], name=pool.name, after=q2)
                    made.append((*params, p2))
                    if u is q:
                        del self._quantized_x[key]
                        self._quantized_x.setdefault(id(pool.inputs[0]), q2)
                u.output.replace_all_uses_with(p2.outputs[0])
                graph.remove(u)
            graph.remove(pool)
            self.pooled_in_int8.append(pool.name or pool.describe())

    def _share_quantized(self, graph: Graph) -> None:
        """Float elementwise readers of a value quantized here read ``DequantizeLinear`` of its
        quantization instead (``int8_residuals``); graph outputs and other readers keep the float."""
        for q in self._quantized_x.values():
            x = q.inputs[0]
            readers = [(u, i) for u, i in x.uses if isinstance(u, Node) and u is not q
                       and u.op.pattern <= Pattern.BROADCAST and not isinstance(u.op, _QDQ)
                       and u.outputs[0].dtype is DType.f32]
            if not readers:
                continue
            # the quantization right after x (it reads x and constants), so it precedes every reader
            if x.producer is not None:
                graph.move_after(q, x.producer)
            else:
                graph.move_before(q, graph.nodes[0])
            dq = graph.add_node(qn.DequantizeLinear(), [q.output, q.inputs[1], q.inputs[2]],
                                name=f"{q.name}.residual", after=q)
            for u, i in readers:
                u.set_input(i, dq.output)
            self.shared.append(x.name or q.name)

    def _rewrite(self, graph: Graph, p: _Product, rng: tuple[float, float] | None) -> None:
        node, o = p.node, self.options
        x_now = node.inputs[0]  # p.x, or what replaced it (an earlier product rewritten just before)
        sw = weight_scales(p.w, o.per_channel, p.channel_axis)
        # the scales along W's channel axis, and along the result's (a Conv's [M, 1, 1])
        along_w = sw.reshape([-1 if i == p.channel_axis else 1 for i in range(p.w.ndim)]) if sw.ndim else sw
        along_y = sw.reshape(-1, 1, 1) if p.conv is not None and sw.ndim else sw
        wq = np.clip(np.rint(p.w.astype(np.float64) / along_w.astype(np.float64)), -127, 127).astype(np.int8)

        def add(op, *inputs):
            return graph.add_node(op, list(inputs), name=node.name, before=node)

        w = node.inputs[1].name or node.name
        x = p.x.name or node.name

        def const(array, what):
            return graph.add_constant(array, name=f"{what}")

        if o.needs_calibration:  # one quantization of x for all the products reading it
            qnode = self._quantization(graph, x_now, rng, x, node)
            sx = self._x_scale[id(x_now)]
            xq, zxv = qnode.output, qnode.inputs[2]
            scale = const((np.float64(sx) * along_y.astype(np.float64) * p.alpha).astype(np.float32), f"{w}.rescale")
        else:
            dq = add(qn.DynamicQuantizeLinear(), x_now)
            xq, sxv, zxv = dq.outputs
            scale = add(ew.Mul(), sxv, const((along_y.astype(np.float64) * p.alpha).astype(np.float32),
                                             f"{w}.scale")).output
        if p.conv is None:
            integer = qn.MatMulInteger()
        else:
            c = p.conv
            integer = qn.ConvInteger(auto_pad=c.auto_pad, dilations=c.dilations, group=c.group,
                                     kernel_shape=c.kernel_shape, pads=c.pads, strides=c.strides)
        acc = add(integer, xq, const(wq, f"{w}.int8"), zxv).output
        y = add(ew.Mul(), add(ew.Cast(to=DType.f32), acc).output, scale).output
        if p.bias is not None:
            bias = node.inputs[2].name if len(node.inputs) > 2 and node.inputs[2] is not None else None
            b = p.bias.reshape(-1, 1, 1) if p.conv is not None else p.bias
            y = add(ew.Add(), y, const(b.astype(np.float32), bias or f"{node.name}.bias")).output
        node.output.replace_all_uses_with(y)
        graph.remove(node)
        self.results[node.name] = y


__all__ = ["CALIBRATORS", "Calibrate", "MODES", "NOT_YET", "QUANTIZED_OPS", "Quantize", "QuantizeOptions", "activation_params",
           "depthwise_inputs", "product_of", "weight_scales"]
