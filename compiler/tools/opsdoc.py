"""docs/ops.md: the op table with, per op, the element types that run as native code.

    python -m compiler.tools.opsdoc > docs/ops.md

The op table is ``compiler.ir.ops.catalog``'s; the "native dtypes" column is measured, not declared:
every case of ONNX's own backend node suite (the models the ``onnx`` package ships) is imported with
its first data set's shapes (and the values of inputs that decide shapes, as the ONNX backend binds
them), run through the -O2 pipeline with the CPU's fusion, and its kernel groups given their
lowerings as ``compile`` would (no LLVM: ``codegen.program.choose_lowerings``). An op is native for
an element type (its first tensor input's, or its first result's when it has no tensor input) when
a case using the op with that type has native code for every group; it is listed as run in the
interpreter for the types of the nodes of the groups that had none. tests/cli/test_opsdoc.py checks
that docs/ops.md is up to date.
"""
from __future__ import annotations

import collections
import dataclasses
import sys
import warnings

import numpy as np

from ..ir.ops import catalog
from ..ir.types import DType, OptionalType, SequenceType, TensorType


@dataclasses.dataclass
class Survey:
    """What the node cases showed: per op class, the dtypes with a fully native case and those of its
    nodes that ran in the interpreter; and the case counts."""

    native: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(set))
    interpreted: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(set))
    cases: int = 0
    fully_native: int = 0
    not_compiled: int = 0

    def column(self, op: type) -> str:
        """The cell of ``op``'s row: its native dtypes, then those seen only with the interpreter."""
        native = _ordered(self.native.get(op, ()))
        rest = _ordered(self.interpreted.get(op, set()) - set(self.native.get(op, ())))
        if not native and not rest:
            return "—"
        cell = ", ".join(native) or "none"
        return cell + (f"; interpreter: {', '.join(rest)}" if rest else "")


def _ordered(dtypes) -> list[str]:
    order = {d.short: i for i, d in enumerate(DType)}
    return sorted(dtypes, key=lambda s: order.get(s, len(order)))


def _dtype_of(node) -> str | None:
    def elem(t):
        t = t.elem if isinstance(t, OptionalType) else t
        if isinstance(t, SequenceType):
            return t.dtype.short
        return t.dtype.short if isinstance(t, TensorType) else None

    for v in [*node.inputs, *node.outputs]:
        if v is not None and elem(v.type) is not None:
            return elem(v.type)
    return None


def survey_case(model, inputs) -> tuple[list[tuple[type, str | None]], list[tuple[type, str | None]]]:
    """(the (op class, dtype) pairs of the case's top-level nodes as imported, those of the nodes
    left in groups without native code after the pipeline: none when the case is fully native).
    Raises what importing or the passes raise."""
    from frontends.onnx import import_model

    from ..codegen.fusion import CPU_FUSION
    from ..codegen.program import choose_lowerings
    from ..passes.manager import PassManager
    from ..passes.options import CompileOptions
    from ..passes.pipeline import pipeline
    from ..passes.simplify.infer_shapes import shape_determining_inputs
    from .onnx_backend import _feed

    graph = import_model(model)
    types = {v.name: v.type for v in graph.inputs}
    feeds = {v.name: _feed(x, v.type) for v, x in zip(graph.inputs, inputs)}
    shapes = {k: tuple(v.shape) for k, v in feeds.items()
              if isinstance(types.get(k), TensorType) and isinstance(v, np.ndarray)}
    values = {k: feeds[k] for k in shape_determining_inputs(graph, feeds)}
    ops = [(type(n.op), _dtype_of(n)) for n in graph.nodes]
    opts = CompileOptions.make(opt_level=2, input_shapes=shapes, input_values=values)
    graph = import_model(model, shapes)
    PassManager(pipeline(opts, CPU_FUSION)).run(graph)
    steps, _ = choose_lowerings(graph)
    return ops, [(type(n.op), _dtype_of(n)) for s in steps if not s.native for n in s.group.nodes]


def survey() -> Survey:
    """Every node case of the installed ``onnx`` package (see the module docstring)."""
    import onnx.backend.test.loader as loader
    from onnx.backend.test.runner import _normalize_tensor

    from ..errors import KilnError

    out = Survey()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in loader.load_model_tests(kind="node"):
            out.cases += 1
            try:
                model, inputs = ((case.model, case.data_sets[0][0] if case.data_sets else [])
                                 if case.model is not None else _load(case.model_dir))
                ops, interpreted = survey_case(model, [_normalize_tensor(x) for x in inputs])
            except (KilnError, ValueError, TypeError, KeyError, IndexError, NotImplementedError):
                out.not_compiled += 1  # not imported or refused by a pass: counts for no op
                continue
            out.fully_native += not interpreted
            for op, dtype in ops if not interpreted else ():
                out.native[op].add(dtype or "—")
            for op, dtype in interpreted:
                out.interpreted[op].add(dtype or "—")
    return out


def _load(model_dir: str):
    """A case directory's model and its first data set's inputs (onnx versions that load lazily)."""
    import glob
    import os

    import onnx
    from onnx import numpy_helper

    def read(path):
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        return numpy_helper.to_array(t)

    model = onnx.load(os.path.join(model_dir, "model.onnx"))
    first = sorted(glob.glob(os.path.join(model_dir, "test_data_set*")))[:1]
    paths = sorted(glob.glob(os.path.join(first[0], "input_*.pb")) if first else [],
                   key=lambda p: int(p[:-3].rsplit("_", 1)[1]))
    return model, [read(p) for p in paths]


def render(found: Survey | None = None) -> str:
    """docs/ops.md's text (``found``: a survey already made)."""
    import onnx

    found = found or survey()
    note = ("The **native dtypes** column is measured on ONNX's own backend node cases (onnx "
            f"{onnx.__version__}: {found.cases} cases, {found.fully_native} with native code for every kernel "
            "group at -O2; `compiler/tools/opsdoc.py` says how): the element types of the op's first input "
            "in a fully native case, then, after *interpreter:*, those of its nodes that still ran in the "
            "reference interpreter. — means no node case shows either (the op is not in the suite, or only "
            "beside a node that ran in the interpreter); a — in a list is an op without tensor operands.")
    return catalog.render({op: found.column(op) for op in set(found.interpreted) | set(found.native)}, note)


if __name__ == "__main__":
    sys.stdout.write(render())
