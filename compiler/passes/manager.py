"""The pass infrastructure: ``Pass``, ``PassManager`` and instruments.

A pass is a small class with a ``name`` and a ``run(graph) -> bool`` that returns honestly whether it
changed the graph. The manager runs a list of passes; instruments watch each one (before/after hooks):
``Verify`` runs the IR verifier, ``Timing`` records times, ``PrintAfter`` prints stages, ``DumpIR``
writes each stage to a directory, ``CheckNumerics`` runs the reference interpreter after every pass
to find the first pass that changes the outputs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, TextIO

from ..errors import DataError, LimitError
from ..ir.graph import Graph
from .options import CompileOptions


class Pass:
    """Base of all passes: a name, what it requires and preserves, and ``run`` returning ``changed``."""

    name: str = ""
    #: analyses/properties this pass needs before it runs (documentation, checked by tests)
    requires: tuple[str, ...] = ()
    #: properties it keeps true
    preserves: tuple[str, ...] = ()

    def run(self, graph: Graph) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


class PassError(RuntimeError):
    """A pass raised, or left IR that does not verify."""

    def __init__(self, pass_name: str, ran_before: Sequence[str], ir_text: str, cause: BaseException | str):
        self.pass_name = pass_name
        self.ran_before = list(ran_before)
        self.ir_text = ir_text
        self.cause = cause
        before = ", ".join(ran_before) if ran_before else "none"
        what = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        shown = ir_text if len(ir_text) < 6000 else ir_text[:3000] + "\n  ...\n" + ir_text[-2000:]
        super().__init__(f"pass {pass_name!r} failed: {what}\n  passes run before it: {before}\n"
                         f"  the IR it was given:\n{shown}")


@dataclass
class PassRecord:
    index: int
    name: str
    changed: bool
    seconds: float
    nodes_before: int
    nodes_after: int


@dataclass
class PipelineResult:
    records: list[PassRecord] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    def summary(self) -> str:
        w = max([len(r.name) for r in self.records] + [20])
        lines = [f"{'#':>3}  {'pass':<{w}} {'changed':>7} {'ms':>9}  {'nodes before → after'}"]
        for r in self.records:
            lines.append(f"{r.index:3d}  {r.name:<{w}} {'yes' if r.changed else 'no':>7} {r.seconds * 1e3:9.2f}  "
                         f"{r.nodes_before:6d} → {r.nodes_after}")
        lines.append(f"     {'total':<{w}} {'':>7} {self.seconds * 1e3:9.2f}")
        return "\n".join(lines)

    def to_json(self) -> list[dict]:
        return [dict(index=r.index, name=r.name, changed=r.changed, seconds=r.seconds,
                     nodes_before=r.nodes_before, nodes_after=r.nodes_after) for r in self.records]


class Instrument:
    """Hooks around each pass. ``after_pass`` may raise to stop the pipeline."""

    def before_pipeline(self, graph: Graph) -> None:
        pass

    def before_pass(self, p: Pass, index: int, graph: Graph) -> None:
        pass

    def after_pass(self, p: Pass, index: int, graph: Graph, changed: bool) -> None:
        pass


class Verify(Instrument):
    """The IR verifier on the input and after every pass."""

    def before_pipeline(self, graph: Graph) -> None:
        from ..ir.verify import verify

        verify(graph)

    def after_pass(self, p, index, graph, changed):
        from ..ir.verify import verify

        verify(graph)


class Timing(Instrument):
    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._t0 = 0.0

    def before_pass(self, p, index, graph):
        self._t0 = time.perf_counter()

    def after_pass(self, p, index, graph, changed):
        self.seconds[p.name] = self.seconds.get(p.name, 0.0) + time.perf_counter() - self._t0


class PrintAfter(Instrument):
    """Print the IR after the named passes (``"all"`` for every pass)."""

    def __init__(self, names: Iterable[str] | str = "all", only_if_changed: bool = False,
                 stream: TextIO | None = None, printer: Callable[[Graph], str] | None = None):
        self.names = "all" if names == "all" else set(names)
        self.only_if_changed = only_if_changed
        self.stream = stream
        self.printer = printer

    def after_pass(self, p, index, graph, changed):
        import sys

        if (self.names == "all" or p.name in self.names) and (changed or not self.only_if_changed):
            from ..ir.printer import print_graph

            out = self.stream or sys.stdout
            out.write(f"// ----- IR after pass {index:02d} {p.name} ({'changed' if changed else 'unchanged'}) -----\n")
            out.write((self.printer or print_graph)(graph))


class PassManager:
    """Runs passes in order under options, with instruments; failures become ``PassError``."""

    def __init__(self, passes: Sequence[Pass], instruments: Sequence[Instrument] = (),
                 options: CompileOptions | None = None):
        self.options = options or CompileOptions()
        self.options.check_pass_names([p.name for p in passes])
        self.passes = [p for p in passes if p.name not in self.options.disabled_passes]
        self.instruments = list(instruments)
        if self.options.verify and not any(isinstance(i, Verify) for i in self.instruments):
            self.instruments.insert(0, Verify())

    def run(self, graph: Graph) -> PipelineResult:
        from ..ir.printer import external_weights, print_graph

        result = PipelineResult()
        for ins in self.instruments:
            ins.before_pipeline(graph)
        ran: list[str] = []
        # With instruments, a failing pass is reported with the IR it was given: the pipeline's input is
        # kept as text (once, not before every pass) and the passes before the failing one are replayed
        # on a copy parsed from it (passes are deterministic).
        start = (print_graph(graph), external_weights(graph)) if self.instruments else None

        def given_ir(i: int) -> str:
            if start is None:
                return print_graph(graph)
            try:
                from ..ir.parser import parse

                copy = parse(*start)
                for q in self.passes[:i - 1]:
                    q.run(copy)
                return print_graph(copy)
            except Exception as e:  # pragma: no cover - the report must not fail in turn
                return f"(the IR before this pass could not be rebuilt: {type(e).__name__}: {e})"

        for i, p in enumerate(self.passes, start=1):
            before = len(graph.nodes)
            t0 = time.perf_counter()
            for ins in self.instruments:
                ins.before_pass(p, i, graph)
            try:
                changed = bool(p.run(graph))
            except (DataError, LimitError):  # the input's fault (data, a limit), reported as is
                raise
            except Exception as e:
                raise PassError(p.name, ran, given_ir(i), e) from e
            seconds = time.perf_counter() - t0
            try:
                for ins in self.instruments:
                    ins.after_pass(p, i, graph, changed)
            except Exception as e:
                raise PassError(p.name, ran, given_ir(i), e) from e
            result.records.append(PassRecord(i, p.name, changed, seconds, before, len(graph.nodes)))
            ran.append(p.name)
        return result
