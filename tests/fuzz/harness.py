"""The differential fuzzer: random valid models (``gen.py``) run by ONNX Runtime and by Kiln at every -O
level, each Kiln run in a worker process (``pool.py``).

Every (model, level) ends in one of these kinds:

    ok         Kiln's outputs match ONNX Runtime's (float: |kiln - ort| <= rtol |ort| + atol max(1, max|ort|))
    refused    compile or run raised UnsupportedError: counted, and listed (ORT runs every such model)
    mismatch   wrong names, shapes, dtypes or values                                     } failures
    rejected   another KilnError for a valid model (e.g. a ModelError)                   }
    exception  any other Python exception (a traceback a user would see)                 }
    crash      the worker died by a signal (segfault, abort)                             }
    hang       no answer within the timeout                                              }

A failing model is minimized (``minimize``: keep one output, cut nodes off the top, shrink input dims,
while the same kind of failure at the same level reproduces) and saved under the output directory as
``TAG/model.onnx`` and ``TAG/feeds.npz`` with a line in ``README.md``. ``python -m tests.fuzz --replay
DIR/TAG`` runs a saved case again.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import tempfile
import time
from typing import Callable

import numpy as np
import onnx
from onnx import helper

from . import gen
from .pool import Outcome, Pool

LEVELS = (0, 1, 2, 3)
FAILURES = ("mismatch", "rejected", "exception", "crash", "hang")
RTOL, ATOL = 1e-3, 1e-4


# -- in the worker ----------------------------------------------------------------------------------
def kiln_task(path: str, feeds: dict, level: int, nthreads: int | None = None) -> dict:
    """Compile the model at ``level`` and run it (in a worker process): its outputs, and the lowering
    of each kernel and the ops run in the interpreter (what the run covered)."""
    import compiler

    exe = compiler.compile(path, opt_level=level, nthreads=nthreads)
    outputs = {k: np.asarray(v) for k, v in exe.run(feeds).items()}
    return {"outputs": outputs, "lowerings": [f"{k['lowering']}({'+'.join(k['ops'])})" if len(k["ops"]) > 1
                                              else k["lowering"] for k in exe.kernels],
            "fallback": [f["op"] for f in exe.fallback]}


# -- judging ----------------------------------------------------------------------------------------
def compare(ref: dict, got: dict, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """None when Kiln's outputs ``got`` match ``ref``, else what differs."""
    if sorted(got) != sorted(ref):
        return f"outputs {sorted(got)}, ONNX Runtime gives {sorted(ref)}"
    for name, r in ref.items():
        k = np.asarray(got[name])
        if k.shape != r.shape:
            return f"{name}: shape {list(k.shape)}, ONNX Runtime gives {list(r.shape)}"
        if k.dtype != r.dtype:
            return f"{name}: dtype {k.dtype}, ONNX Runtime gives {r.dtype}"
        if r.dtype.kind in "fc":
            rr, kk = r.astype(np.float64), k.astype(np.float64)
            finite = np.abs(rr[np.isfinite(rr)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0  # an infinity sets no scale
            with np.errstate(invalid="ignore"):
                near = np.abs(kk - rr) <= atol * scale + rtol * np.abs(rr)
            # an infinity must be matched exactly (inf - inf is NaN; a tolerance of rtol * inf is none)
            bad = np.where(np.isinf(rr), kk != rr, ~near) & ~(np.isnan(kk) & np.isnan(rr))
        else:
            bad = k != r
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            with np.errstate(invalid="ignore"):
                err = float(np.nanmax(np.abs(kk - rr))) if r.dtype.kind in "fc" else None
            return (f"{name}: {int(bad.sum())} of {r.size} elements differ, first at {list(i)}: kiln {k[i]!r}, "
                    f"ORT {r[i]!r}" + (f" (max abs error {err:.3g})" if err is not None else ""))
    return None


def classify(o: Outcome, ref: dict | None) -> tuple[str, str]:
    """(kind, detail) of one Kiln run; ``ref`` None: a correct result is not known."""
    if o.status == "hang":
        return "hang", o.brief()
    if o.status == "crash":
        return "crash", o.brief()
    if o.status == "error":
        if o.unsupported:
            return "refused", o.brief()
        if o.kiln:
            return "rejected", o.brief()
        return "exception", o.brief() + (f" (at {o.where})" if o.where else "")
    if ref is None:
        return "ok", ""
    diff = compare(ref, o.value["outputs"])
    return ("mismatch", diff) if diff else ("ok", "")


# -- the report -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Failure:
    tag: str
    kind: str
    where: str        # -O levels, or the mutation
    detail: str
    about: str        # the recipes, or the mutant's description
    path: str = ""    # the saved (minimized) repro


class Report:
    """Counts and failures of one fuzzing section, printed as a summary."""

    def __init__(self, title: str):
        self.title = title
        self.counts: collections.Counter = collections.Counter()
        self.failures: list[Failure] = []
        self.notes: list[str] = []     # refusals and other things worth a look, not failures
        self.coverage: collections.Counter = collections.Counter()  # lowerings and interpreted ops seen
        self.t0 = time.perf_counter()
        self.seconds = 0.0

    def done(self) -> "Report":
        self.seconds = time.perf_counter() - self.t0
        return self

    @property
    def failed(self) -> int:
        return len(self.failures)

    def text(self, limit: int = 60) -> str:
        lines = [f"== {self.title}: {self.seconds:.0f} s"]
        lines.append("   " + ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items())))
        if self.coverage:
            top = [f"{k} {v}" for k, v in self.coverage.most_common(40)]
            lines.append(f"   coverage (kernels by lowering, fused ones with their ops; interpreted ops): "
                         f"{', '.join(top)}" + (" ..." if len(self.coverage) > 40 else ""))
        if self.failures:
            lines.append(f"   FAILURES ({len(self.failures)}):")
            for f in self.failures[:limit]:
                lines.append(f"   - {f.tag} [{f.where}] {f.kind}: {f.detail[:400]}")
                lines.append(f"       {f.about[:300]}" + (f"\n       repro: {f.path}" if f.path else ""))
            if len(self.failures) > limit:
                lines.append(f"   ... and {len(self.failures) - limit} more")
        if self.notes:
            lines.append(f"   notes ({len(self.notes)}):")
            lines += [f"   - {n[:400]}" for n in self.notes[:limit]]
        return "\n".join(lines)


# -- minimizing -------------------------------------------------------------------------------------
def _types(model: onnx.ModelProto) -> dict:
    m = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    out = {vi.name: vi.type for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)}
    return out


def prune(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Without the nodes, initializers and inputs that no output needs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    need = {o.name for o in g.output}
    keep = []
    for n in reversed(list(g.node)):
        if any(o in need for o in n.output):
            keep.append(n)
            need.update(i for i in n.input if i)
    keep.reverse()
    g.ClearField("node")
    g.node.extend(keep)
    inits = [t for t in g.initializer if t.name in need]
    g.ClearField("initializer")
    g.initializer.extend(inits)
    ins = [i for i in g.input if i.name in need]
    g.ClearField("input")
    g.input.extend(ins)
    g.ClearField("value_info")
    return m, {k: v for k, v in feeds.items() if k in need}


def _with_outputs(model: onnx.ModelProto, names, types: dict) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.ClearField("output")
    for n in names:
        m.graph.output.append(helper.make_value_info(n, types[n]))
    return m


def _candidates(model: onnx.ModelProto, feeds: dict):
    """Smaller variants of the model (each with its feeds), the most promising first."""
    types = _types(model)
    values = [o for n in model.graph.node for o in n.output if o in types]
    outputs = [o.name for o in model.graph.output]
    if len(outputs) > 1:  # one output only
        for o in outputs:
            yield prune(_with_outputs(model, [o], types), feeds)
    for v in values:  # an earlier value as the output
        if v not in outputs:
            yield prune(_with_outputs(model, [v], types), feeds)
    try:  # a node's results as graph inputs (fed ORT's values): the graph above it is dropped
        inner = gen.reference(_with_outputs(model, values, types), feeds)
    except Exception:
        inner = {}
    for k, n in enumerate(model.graph.node):
        if not all(o in inner for o in n.output):
            continue
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.graph.ClearField("node")
        m.graph.node.extend(x for j, x in enumerate(model.graph.node) if j != k)
        for o in n.output:
            m.graph.input.append(helper.make_value_info(o, types[o]))
        yield prune(m, dict(feeds, **{o: inner[o] for o in n.output}))
    for name, arr in feeds.items():  # smaller input dims
        for axis, d in enumerate(arr.shape):
            for new in sorted({1, d // 2, d - 1}):
                if not 1 <= new < d:  # smaller, not empty (an empty axis has nothing to cut)
                    continue
                m = onnx.ModelProto()
                m.CopyFrom(model)
                m.graph.ClearField("value_info")
                for vi in m.graph.input:
                    if vi.name == name:
                        vi.type.tensor_type.shape.dim[axis].dim_value = new
                for vi in m.graph.output:  # (the checker wants a shape: of unknown dims)
                    for k, dim in enumerate(vi.type.tensor_type.shape.dim):
                        dim.dim_param = f"d{k}"
                yield m, dict(feeds, **{name: np.take(arr, range(new), axis=axis)})


def minimize(model: onnx.ModelProto, feeds: dict, fails: Callable[[onnx.ModelProto, dict, dict], bool],
             budget_s: float = 180.0) -> tuple[onnx.ModelProto, dict]:
    """A smaller model that ``fails(model, feeds, reference)`` still (greedy delta debugging)."""
    t0 = time.perf_counter()
    progress = True
    while progress and time.perf_counter() - t0 < budget_s:
        progress = False
        size = (len(model.graph.node), sum(int(np.prod(a.shape)) for a in feeds.values()))
        for cand, cfeeds in _candidates(model, feeds):
            if time.perf_counter() - t0 > budget_s:
                break
            csize = (len(cand.graph.node), sum(int(np.prod(a.shape)) for a in cfeeds.values()))
            if csize >= size or not cand.graph.node:
                continue
            try:
                ref = gen.validate(cand, cfeeds)
            except Exception:
                continue
            if fails(cand, cfeeds, ref):
                model, feeds, progress = cand, cfeeds, True
                break
    return model, feeds


def save(out: str, tag: str, model: onnx.ModelProto, feeds: dict, line: str) -> str:
    d = os.path.join(out, tag)
    os.makedirs(d, exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    np.savez(os.path.join(d, "feeds.npz"), **feeds)
    with open(os.path.join(d, "info.txt"), "w", encoding="utf-8") as f:
        f.write(line + "\n\n" + onnx.printer.to_text(model.graph)[:20000] + "\n")
    with open(os.path.join(out, "README.md"), "a", encoding="utf-8") as f:
        f.write(f"- `{tag}`: {line}\n")
    return d


def ops_of(model: onnx.ModelProto) -> str:
    return " ".join(n.op_type for n in model.graph.node)


# -- the differential run ---------------------------------------------------------------------------
class Diff:
    def __init__(self, pool: Pool, out: str | None, levels=LEVELS, timeout: float = 60.0,
                 minimize: bool = True, max_minimized: int = 12, log: Callable = print):
        self.pool, self.out, self.levels, self.timeout = pool, out, tuple(levels), timeout
        self.do_minimize, self.max_minimized, self.log = minimize, max_minimized, log
        self.work = tempfile.TemporaryDirectory(prefix="kiln-fuzz-")
        self.minimized: set = set()

    def run_model(self, tag: str, model: onnx.ModelProto, feeds: dict, ref: dict, levels=None,
                  timeout: float | None = None) -> dict:
        """{level: (kind, detail, outcome)} for one model."""
        path = os.path.join(self.work.name, f"{tag}-{time.monotonic_ns()}.onnx")
        onnx.save(model, path)
        res = {}
        for lvl in levels if levels is not None else self.levels:
            o = self.pool.run("tests.fuzz.harness:kiln_task", path, feeds, lvl, timeout=timeout or self.timeout)
            res[lvl] = classify(o, ref) + (o,)
        os.unlink(path)
        return res

    def check(self, case: gen.Case, report: Report) -> None:
        res = self.run_model(case.tag, case.model, case.feeds, case.reference)
        report.counts["graphs"] += 1
        by_kind: dict = collections.defaultdict(list)
        for lvl, (kind, detail, o) in res.items():
            report.counts[kind] += 1
            if o.status == "ok":
                report.coverage.update(o.value["lowerings"])
                report.coverage.update(f"interpreted {op}" for op in o.value["fallback"])
            by_kind[(kind, detail if kind != "mismatch" else "")].append(lvl)
        for (kind, detail), lvls in by_kind.items():
            where = ",".join(f"-O{lvl}" for lvl in lvls)
            if kind == "refused":
                report.notes.append(f"{case.tag} [{where}] refused a model ONNX Runtime runs: {detail} "
                                    f"({case.describe()})")
            elif kind in FAILURES:
                detail = detail or res[lvls[0]][1]
                f = Failure(case.tag, kind, where, detail, case.describe())
                f.path = self.keep(case, f, lvls[0], res[lvls[0]][2])
                report.failures.append(f)
                self.log(f"  FAIL {f.tag} [{f.where}] {f.kind}: {f.detail[:200]}")

    def keep(self, case: gen.Case, f: Failure, level: int, outcome: Outcome) -> str:
        """Minimize (the first of each kind of failure) and save; the saved directory."""
        if not self.out:
            return ""
        model, feeds = case.model, case.feeds
        # the first failure of each kind, exception and place; every mismatch (up to max_minimized)
        sig = (f.kind, outcome.error, outcome.where, level, case.tag if f.kind == "mismatch" else "")
        if self.do_minimize and f.kind != "hang" and sig not in self.minimized and \
                len(self.minimized) < self.max_minimized:
            self.minimized.add(sig)

            def fails(m, fd, ref):
                kind, _, o = self.run_model(case.tag + "-min", m, fd, ref, [level])[level]
                return kind == f.kind and (o.error, o.where) == (outcome.error, outcome.where)

            t0 = time.perf_counter()
            n0 = len(model.graph.node)
            try:
                model, feeds = minimize(model, feeds, fails)
            except Exception as e:  # a bug of the minimizer must not end the run: save the case as found
                self.log(f"    could not minimize {case.tag}: {type(e).__name__}: {e}")
                model, feeds = case.model, case.feeds
            self.log(f"    minimized {case.tag}: {n0} -> {len(model.graph.node)} nodes "
                     f"in {time.perf_counter() - t0:.0f} s")
        detail = f.detail
        if model is not case.model:  # what the minimized model does
            ref = gen.validate(model, feeds)
            detail = self.run_model(case.tag, model, feeds, ref, [level])[level][1] or detail
        line = (f"-O{level} {f.kind}: {detail[:300]} | ops: {ops_of(model)} | shapes: "
                f"{ {k: list(v.shape) for k, v in feeds.items()} } | from: {case.describe()[:300]}")
        return save(self.out, case.tag, model, feeds, line)

    def check_batch(self, cases: list[gen.Case], report: Report) -> None:
        """Check several cases compiled as one model (``gen.merge``); when any level gives anything but
        a match, each case is checked alone, so that what is reported and saved is one case's."""
        if len(cases) == 1:
            return self.check(cases[0], report)
        model, feeds, ref = gen.merge(cases)
        res = self.run_model(f"{cases[0].tag}-batch{len(cases)}", model, feeds, ref,
                             timeout=self.timeout * (1 + len(cases) / 4))
        if any(kind != "ok" for kind, _, _ in res.values()):
            report.counts["batches checked case by case"] += 1
            for case in cases:
                self.check(case, report)
            return
        report.counts["graphs"] += len(cases)
        report.counts["ok"] += len(cases) * len(res)
        for _, _, o in res.values():
            report.coverage.update(o.value["lowerings"])
            report.coverage.update(f"interpreted {op}" for op in o.value["fallback"])

    def run(self, n: int, seed: int, report: Report | None = None, batch: int = 1, first: int = 0) -> Report:
        """Graphs first..n-1 of the stream ``seed``, ``batch`` of them compiled as one model."""
        report = report or Report(f"differential: {n} graphs, seed {seed}, -O{','.join(map(str, self.levels))}"
                                  + (f", {batch} per compiled model" if batch > 1 else ""))
        done = [0]

        def some(first: int) -> None:
            cases = [gen.generate(seed, i) for i in range(first, min(n, first + batch))]
            self.check_batch(cases, report)
            before, done[0] = done[0], done[0] + len(cases)
            if done[0] // 100 != before // 100:
                self.log(f"  {done[0]}/{n} graphs, {time.perf_counter() - report.t0:.0f} s")

        self.pool.map(some, range(first, n, batch))
        report.counts["discarded by the generator"] = sum(v for k, v in gen.STATS.items()
                                                          if k.startswith("invalid"))
        return report.done()


def replay(pool: Pool, path: str, levels=LEVELS) -> str:
    """Run a saved case (a directory with model.onnx and feeds.npz) again; the results as text."""
    model = onnx.load(os.path.join(path, "model.onnx"))
    feeds = dict(np.load(os.path.join(path, "feeds.npz")))
    ref = gen.validate(model, feeds)
    d = Diff(pool, None, levels)
    res = d.run_model("replay", model, feeds, ref)
    return "\n".join(f"-O{lvl}: {kind} {detail}" for lvl, (kind, detail, _) in res.items())
