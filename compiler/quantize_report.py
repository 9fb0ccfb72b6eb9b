"""Which layer lost the accuracy: float and int8 side by side, layer by layer, and an accuracy budget.

``quantize_report(model, calibration, options)`` prepares the float graph as the pipeline has it
where the quantize pass runs, measures the activation ranges once, and compiles (natively):

* the float model, with every quantizable layer's result as an extra output;
* the int8 model, with every quantized layer's result (its float rescale) as an extra output: each
  layer's SQNR, cosine similarity and largest error against float, with the errors of the layers
  before it included, as they are in the quantized model;
* per layer, the model with **only that layer** quantized: the model output's SQNR and cosine
  similarity, which ranks the layers by what quantizing each costs.

The errors are over all calibration samples together. ``keep_within_budget`` then keeps the most
costly layers in float, one at a time in rank order, until the model output's error
(``1 - cosine similarity``, over the samples together) is within the budget, and says which.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import KilnError


@dataclass
class LayerError:
    name: str
    op: str
    #: the layer's result in the all-int8 model against float (errors of earlier layers included)
    sqnr_db: float
    cosine: float
    max_abs: float
    #: the model's output with only this layer in int8, against float
    alone_sqnr_db: float
    alone_cosine: float


@dataclass
class QuantizeReport:
    mode: str
    samples: int
    #: the model output of the all-int8 model against float
    model_sqnr_db: float
    model_cosine: float
    #: quantized layers, the most costly alone first
    layers: list[LayerError]
    #: layers the quantize pass left in float, and why
    not_quantized: dict[str, str]
    #: with a budget: the layers kept in float to meet it, and the model output's cosine after
    kept_in_float: list[str] = field(default_factory=list)
    budget: float | None = None
    budget_cosine: float | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def text(self) -> str:
        lines = [f"{self.mode} against float over {self.samples} calibration sample(s): model output "
                 f"SQNR {self.model_sqnr_db:.1f} dB, cosine {self.model_cosine:.6f}",
                 "", f"{'layer':<40} {'op':<8} {'SQNR dB':>8} {'cosine':>9} {'max err':>10}   "
                     f"{'alone: out SQNR dB':>18} {'out cosine':>10}"]
        for e in self.layers:
            lines.append(f"{e.name[:40]:<40} {e.op:<8} {e.sqnr_db:8.1f} {e.cosine:9.6f} {e.max_abs:10.4g}   "
                         f"{e.alone_sqnr_db:18.1f} {e.alone_cosine:10.6f}")
        if self.not_quantized:
            lines += ["", "kept in float by the quantize pass:"]
            lines += [f"  {name}: {why}" for name, why in self.not_quantized.items()]
        if self.budget is not None:
            lines += ["", f"accuracy budget {self.budget:g} (1 - cosine of the model output): "
                          + (f"kept {len(self.kept_in_float)} layer(s) in float: {', '.join(self.kept_in_float)}"
                             if self.kept_in_float else "met with every layer in int8")
                          + f"; output cosine {self.budget_cosine:.6f}"]
        return "\n".join(lines)


def _stats(want: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> tuple[float, float, float]:
    """(SQNR in dB, cosine similarity, largest absolute error) over all arrays together."""
    w = np.concatenate([np.ravel(a).astype(np.float64) for a in want])
    g = np.concatenate([np.ravel(a).astype(np.float64) for a in got])
    noise = float(np.sum((w - g) ** 2))
    signal = float(np.sum(w ** 2))
    sqnr = float("inf") if noise == 0 else 10 * np.log10(signal / noise) if signal > 0 else float("-inf")
    norm = float(np.linalg.norm(w) * np.linalg.norm(g))
    cosine = float(w @ g / norm) if norm > 0 else (1.0 if noise == 0 else 0.0)
    return sqnr, cosine, float(np.max(np.abs(w - g))) if w.size else 0.0


class _Session:
    """The float graph at the quantize pass, its ranges, and compiles of variants of it."""

    def __init__(self, model: Any, samples: list, options, opt_level: int, input_shapes, target, nthreads):
        from .calibration import calibrator
        from .codegen.fusion import CPU_FUSION
        from .models import load_graph
        from .passes.manager import PassManager
        from .passes.options import CompileOptions
        from .passes.pipeline import pipeline

        self.options, self.samples, self.target, self.nthreads = options, samples, target, nthreads
        opts = CompileOptions.make(opt_level=opt_level, input_shapes=dict(input_shapes or {}),
                                   quantize=dataclasses.replace(options, mode="int8-dynamic", symmetric=False))
        passes = pipeline(opts, CPU_FUSION)
        at = next(i for i, p in enumerate(passes) if p.name == "quantize")
        self.graph = load_graph(model, opts.input_shapes)
        PassManager(passes[:at]).run(self.graph)
        self.ranges: dict = {}
        if options.needs_calibration:
            from .passes.quantize import depthwise_inputs, product_of

            xs = {}
            for n in self.graph.nodes:
                p = product_of(n)
                if not isinstance(p, str):
                    xs[id(p.x)] = p.x
            if options.int8_depthwise:
                xs.update((id(n.inputs[0]), n.inputs[0]) for n in depthwise_inputs(self.graph))
            measure = calibrator(samples, target, nthreads, method=options.calibrator, percentile=options.percentile)
            measured = measure(self.graph, list(xs.values())) if xs else {}
            self.ranges = {self._key(self.graph, v): r for v_id, r in measured.items() for v in [xs[v_id]]}

    @staticmethod
    def _key(graph, v):
        if v.producer is None:
            return ("input", v.name)
        return (graph.nodes.index(v.producer), v.index)

    def calibrate(self, graph, values):
        return {id(v): self.ranges[self._key(graph, v)] for v in values}

    def run(self, exclude: Sequence[str] = (), observe_float: bool = False):
        """(outputs per sample, {layer: results per sample}, the pass) of the model with the
        layers of ``exclude`` in float (all in float with ``observe_float``: the reference)."""
        from .driver import compile as kiln_compile
        from .ir.clone import clone
        from .passes.quantize import Quantize, depthwise_inputs, product_of

        g, _ = clone(self.graph)
        qpass = None
        if observe_float:
            depthwise = {id(n) for n in depthwise_inputs(g)} if self.options.int8_depthwise else set()
            layers = {n.name: n.outputs[0] for n in g.nodes
                      if not isinstance(product_of(n), str) or id(n) in depthwise}
        else:
            opts = dataclasses.replace(self.options, exclude=tuple(self.options.exclude) + tuple(exclude))
            qpass = Quantize(opts, self.calibrate)
            qpass.run(g)
            layers = dict(qpass.results)
        names, outs = list(g.output_names), list(g.outputs)  # (the pass may have replaced an output)
        g.set_outputs(outs + list(layers.values()), names + [f"layer{i}" for i in range(len(layers))])
        exe = kiln_compile(g, 2, target=self.target, nthreads=self.nthreads)
        from .calibration import feeds_for

        model_out, per_layer = [], {name: [] for name in layers}
        for i, sample in enumerate(self.samples):
            r = exe.run(feeds_for(sample, exe.input_names, i))
            model_out.append([r[n] for n in names])
            for j, name in enumerate(layers):
                per_layer[name].append(r[f"layer{j}"])
        return model_out, per_layer, qpass


def _flat(outs):
    return [a for per_sample in outs for a in per_sample]


def quantize_report(model: Any, calibration: Any, options=None, *, opt_level: int = 2, input_shapes=None,
                    target=None, nthreads: int | None = None, budget: float | None = None) -> QuantizeReport:
    """The per-layer report of quantizing ``model`` with ``options`` (a ``QuantizeOptions`` or mode
    name; default static int8), measured on the ``calibration`` samples; with ``budget``, also the
    layers to keep in float (``keep_within_budget``)."""
    from .calibration import read_samples
    from .passes.quantize import QuantizeOptions

    options = QuantizeOptions.of(options) or QuantizeOptions()
    samples = read_samples(calibration)
    s = _Session(model, samples, options, opt_level, input_shapes, target, nthreads)
    want, float_layers, _ = s.run(observe_float=True)
    got, q_layers, qpass = s.run()
    if not qpass.quantized:
        raise KilnError("nothing to quantize: " + ("; ".join(f"{k}: {v}" for k, v in qpass.refusals.items())
                                                   or "the model has no MatMul or Gemm with constant weights"))
    msqnr, mcos, _ = _stats(_flat(want), _flat(got))
    ops = {n.name: n.op.name for n in s.graph.nodes}
    layers = []
    for name in qpass.quantized:
        sqnr, cos, mx = _stats(float_layers[name], q_layers[name])
        alone, _, _ = s.run(exclude=[n for n in qpass.quantized if n != name])
        asqnr, acos, _ = _stats(_flat(want), _flat(alone))
        layers.append(LayerError(name, ops.get(name, "?"), sqnr, cos, mx, asqnr, acos))
    layers.sort(key=lambda e: e.alone_cosine)
    report = QuantizeReport(options.mode, len(samples), msqnr, mcos, layers, dict(qpass.refusals))
    if budget is not None:
        report.budget = float(budget)
        report.kept_in_float, report.budget_cosine = keep_within_budget(s, want, report, budget)
    return report


def keep_within_budget(session: _Session, want, report: QuantizeReport, budget: float) -> tuple[list[str], float]:
    """The fewest most-costly layers (in the report's order) kept in float for ``1 - cosine`` of the
    model output to be at most ``budget``; and the cosine then."""
    if budget < 0:
        raise KilnError(f"the accuracy budget must be >= 0, got {budget}")
    kept: list[str] = []
    cosine = report.model_cosine
    for layer in report.layers:
        if 1 - cosine <= budget:
            break
        kept.append(layer.name)
        got, _, _ = session.run(exclude=kept)
        cosine = _stats(_flat(want), _flat(got))[1]
    return kept, cosine


__all__ = ["LayerError", "QuantizeReport", "keep_within_budget", "quantize_report"]
