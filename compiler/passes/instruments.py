"""Instruments that write, keep or check each stage: ``DumpIR``, ``KeepIR``, ``CheckNumerics``, and
``Progress`` for a terminal."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..ir.graph import Graph
from .manager import Instrument, Pass


def stage_file(index: int, name: str, ext: str) -> str:
    return f"{index:02d}-{name}.{ext}"


class DumpIR(Instrument):
    """Write the IR before the pipeline (``00-input``) and after every pass (``NN-<pass>``) to ``dir``,
    in the text format (with its weights sidecar), Graphviz DOT, or ONNX. The ONNX exporter is the
    frontend's, which the passes do not import: the caller hands it over (``export_onnx``: a Graph to
    a ModelProto, ``frontends.onnx.export_model``)."""

    def __init__(self, directory: str, fmt: str = "text", export_onnx: Callable[[Graph], Any] | None = None):
        if fmt not in ("text", "dot", "onnx"):
            raise ValueError(f"unknown dump format {fmt!r}; use text, dot or onnx")
        if fmt == "onnx" and export_onnx is None:
            raise ValueError("the onnx dump format needs the exporter: DumpIR(..., export_onnx=export_model)")
        self.directory = directory
        self.fmt = fmt
        self.export_onnx = export_onnx
        self.files: list[str] = []
        os.makedirs(directory, exist_ok=True)

    def write(self, index: int, name: str, graph: Graph) -> None:
        ext = {"text": "kir", "dot": "dot", "onnx": "onnx"}[self.fmt]
        path = os.path.join(self.directory, stage_file(index, name, ext))
        if self.fmt == "text":
            from ..ir.printer import save_text

            save_text(graph, path)
        elif self.fmt == "dot":
            from ..ir.dot import render_svg, to_dot

            with open(path, "w") as f:
                f.write(to_dot(graph, title=f"{index:02d} {name}"))
            render_svg(path)
        else:
            with open(path, "wb") as f:
                f.write(self.export_onnx(graph).SerializeToString())
        self.files.append(path)

    def before_pipeline(self, graph):
        self.write(0, "input", graph)

    def after_pass(self, p, index, graph, changed):
        self.write(index, p.name, graph)


class KeepIR(Instrument):
    """Keep the IR text before the pipeline (``"input"``) and after every pass that changed it, in
    ``stages`` as (index, pass name, text) (the HTML report's stage links). A text past ``max_chars``
    keeps its head and tail."""

    def __init__(self, max_chars: int = 400_000):
        self.max_chars = max_chars
        self.stages: list[tuple[int, str, str]] = []

    def _text(self, graph: Graph) -> str:
        from ..ir.printer import print_graph

        text = print_graph(graph)
        if len(text) <= self.max_chars:
            return text
        half = self.max_chars // 2
        return f"{text[:half]}\n  ... ({len(text) - 2 * half} characters left out)\n{text[-half:]}"

    def before_pipeline(self, graph: Graph) -> None:
        self.stages.append((0, "input", self._text(graph)))

    def after_pass(self, p: Pass, index: int, graph: Graph, changed: bool) -> None:
        if changed:
            self.stages.append((index, p.name, self._text(graph)))


class Progress(Instrument):
    """One line on ``stream`` (a terminal), rewritten in place: the pass running, ``index/total``."""

    def __init__(self, total: int, stream=None):
        import sys

        self.total = total
        self.stream = stream or sys.stderr

    def before_pass(self, p: Pass, index: int, graph: Graph) -> None:
        self.stream.write(f"\r\033[Kpass {index}/{self.total} {p.name} ({len(graph.nodes)} nodes)")
        self.stream.flush()


@dataclass
class StageError:
    """How far one output moved from the input graph's, after one pass."""

    output: str
    max_abs: float
    max_rel: float  # max abs error / max |reference|


@dataclass
class NumericsReport:
    stages: list[tuple[int, str, list[StageError]]] = field(default_factory=list)
    first_bad: tuple[int, str, list[StageError]] | None = None
    rtol: float = 1e-4

    def text(self) -> str:
        lines = [f"numerical check: reference interpreter after every pass, tolerance {self.rtol:g} of each "
                 "output's scale"]
        for index, name, errs in self.stages:
            worst = max(errs, key=lambda e: e.max_rel) if errs else None
            mark = "  <-- first pass beyond tolerance" if self.first_bad and self.first_bad[0] == index else ""
            detail = f"max rel {worst.max_rel:.2e} (max abs {worst.max_abs:.2e}, output {worst.output!r})" \
                if worst else "no outputs"
            lines.append(f"  {index:02d} {name:<32} {detail}{mark}")
        if self.first_bad:
            index, name, errs = self.first_bad
            lines.append(f"FAIL: pass {index:02d} {name!r} changed the outputs beyond tolerance:")
            for e in errs:
                lines.append(f"    {e.output}: max abs error {e.max_abs:.3e}, max relative error {e.max_rel:.3e}")
        else:
            lines.append("OK: no pass changed the outputs beyond tolerance")
        return "\n".join(lines)

    def to_json(self) -> dict:
        conv = lambda errs: [e.__dict__ for e in errs]  # noqa: E731
        return {"rtol": self.rtol, "stages": [dict(index=i, name=n, errors=conv(e)) for i, n, e in self.stages],
                "first_bad": None if not self.first_bad else dict(index=self.first_bad[0], name=self.first_bad[1])}


def compare(out, ref) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|) of a result against its reference; inf when the
    kinds, shapes or (for non-numeric values) contents differ. Sequences compare element-wise;
    an absent optional equals only an absent one."""
    inf = (float("inf"), float("inf"))
    if isinstance(ref, list) or isinstance(out, list):
        if not (isinstance(ref, list) and isinstance(out, list)) or len(out) != len(ref):
            return inf
        pairs = [compare(o, r) for o, r in zip(out, ref)]
        return (max((a for a, _ in pairs), default=0.0), max((b for _, b in pairs), default=0.0))
    if ref is None or out is None:
        return (0.0, 0.0) if ref is None and out is None else inf
    if out.shape != ref.shape:
        return inf
    if ref.dtype.kind not in "fciub":
        return (0.0, 0.0) if np.array_equal(out, ref) else inf
    r = ref.astype(np.float64)
    o = out.astype(np.float64)
    diff = np.where(np.isnan(r) & np.isnan(o), 0.0, np.abs(o - r))
    diff = np.where(np.isnan(diff), np.inf, diff)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.nanmax(np.abs(r))) if r.size and not np.all(np.isnan(r)) else 0.0
    return max_abs, (max_abs / max(scale, 1e-30) if max_abs else 0.0)


class CheckNumerics(Instrument):
    """Run the reference interpreter on fixed inputs before the pipeline and after every pass; record
    each output's error against the input graph's and the first pass beyond tolerance."""

    def __init__(self, inputs: Mapping[str, np.ndarray], rtol: float = 1e-4):
        self.inputs = dict(inputs)
        self.report = NumericsReport(rtol=rtol)
        self.reference: dict[str, np.ndarray] = {}

    def before_pipeline(self, graph):
        from ..errors import InputError
        from ..ir.interpreter import InterpreterError, interpret

        try:
            self.reference = interpret(graph, self.inputs)
        except InterpreterError as e:  # before any pass: the inputs' fault (e.g. an index out of range)
            raise InputError(f"the inputs of the check are not valid for the model (before any pass ran): "
                             f"{e}") from None

    def after_pass(self, p: Pass, index, graph, changed):
        from ..ir.interpreter import interpret

        if not changed and self.report.stages:  # an unchanged graph computes what it computed before
            self.report.stages.append((index, p.name, self.report.stages[-1][2]))
            return
        feeds = {k: v for k, v in self.inputs.items() if k in {i.name for i in graph.inputs}}
        got = interpret(graph, feeds)
        errs = [StageError(name, *compare(got.get(name), ref)) for name, ref in self.reference.items()]
        self.report.stages.append((index, p.name, errs))
        if self.report.first_bad is None and any(e.max_rel > self.report.rtol for e in errs):
            self.report.first_bad = (index, p.name, errs)


def write_summary(directory: str, result, as_json: bool = False) -> str:
    path = os.path.join(directory, "summary.json" if as_json else "summary.txt")
    with open(path, "w") as f:
        if as_json:
            json.dump(result.to_json(), f, indent=2)
        else:
            f.write(result.summary() + "\n")
    return path
