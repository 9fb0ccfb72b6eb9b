"""parse(print(g)) prints identically for every model of the test suite, imported and after the
-O2 pipeline (the stages `kiln dump` writes must parse back)."""
from __future__ import annotations

import pytest

from compiler.codegen.fusion import CPU_FUSION
from compiler.ir.parser import parse
from compiler.ir.printer import external_weights, print_graph
from compiler.ir.verify import verify
from compiler.models import light_models, resolve
from compiler.passes.manager import PassManager
from compiler.passes.options import CompileOptions
from compiler.passes.pipeline import pipeline
from frontends.onnx import import_model
from tests.frontends.test_torch_models import CASES
from compiler.tools import zoo

MODELS = [f"light:{m}" for m in light_models()] + sorted(CASES)


def load(name):
    if name.startswith("light:"):
        return import_model(resolve(name))
    return import_model(zoo.export(name, **dict(CASES[name]))[0])


@pytest.mark.parametrize("name", MODELS)
def test_model_round_trips_imported_and_optimized(name):
    g = load(name)
    for stage in ("imported", "optimized"):
        if stage == "optimized":
            PassManager(pipeline(CompileOptions(opt_level=2), CPU_FUSION)).run(g)
        text = print_graph(g)
        again = parse(text, external_weights(g))
        verify(again)
        assert print_graph(again) == text, f"{name} ({stage}) does not round-trip"
