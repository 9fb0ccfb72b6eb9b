"""Every model of the suite through the full pipeline at every -O level, with the verifier after each
pass and the reference interpreter checking that no pass changes the outputs beyond fp32 tolerance."""
from __future__ import annotations

import pytest

from compiler.codegen.fusion import CPU_FUSION
from compiler.tools.cli import random_inputs
from compiler.models import light_models
from compiler.passes.instruments import CheckNumerics
from compiler.passes.manager import PassManager, Verify
from compiler.passes.options import CompileOptions
from compiler.passes.pipeline import pipeline
from frontends.onnx import import_model
from tests.frontends.test_torch_models import CASES
from compiler.tools import zoo

LEVELS = [0, 1, 2, 3]


def load(name: str):
    if name.startswith("light:"):
        from compiler.models import resolve

        return import_model(resolve(name))
    return import_model(zoo.export(name, **dict(CASES[name]))[0])


def run_pipeline(name: str, level: int):
    graph = load(name)
    before = graph.op_counts()
    check = CheckNumerics(random_inputs(graph, {}, seed=0), rtol=1e-4)
    opts = CompileOptions(opt_level=level)
    result = PassManager(pipeline(opts, CPU_FUSION), [Verify(), check], opts).run(graph)
    assert check.report.first_bad is None, check.report.text()
    return graph, before, result


@pytest.mark.slow
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", [f"light:{m}" for m in light_models()] + sorted(CASES))
def test_pipeline_keeps_outputs(name, level):
    graph, before, _ = run_pipeline(name, level)
    if level >= 1:
        left = op_counts(graph)
        assert "Shape" not in left, left
        # a ConstantOfShape stays only where its result is beyond the folding limit (AlexNet's and
        # VGG's fully connected weights, hundreds of MB, in the light models)
        limit = CompileOptions().fold_limit_bytes
        assert all(n.output.type.nbytes > limit for n in graph.nodes if n.op.name == "ConstantOfShape")
        assert "Identity" not in left and "Dropout" not in left, left
    if level >= 2:
        assert "BatchNormalization" not in graph.op_counts()


def op_counts(graph) -> dict[str, int]:
    """Op counts, each fused kernel counted as the ops of its body."""
    counts: dict[str, int] = {}
    for n in graph.nodes:
        for m in (n.op.body.nodes if n.op.name == "Kernel" else [n]):
            counts[m.op.name] = counts.get(m.op.name, 0) + 1
    return counts


def test_resnet50_folds_all_53_batchnorms():
    graph = load("light:resnet50")
    assert graph.op_counts().get("BatchNormalization") == 53
    opts = CompileOptions(opt_level=2)
    PassManager(pipeline(opts, CPU_FUSION), [Verify()], opts).run(graph)
    left = op_counts(graph)
    assert "BatchNormalization" not in left and "Mul" not in left and "Add" in left  # residual adds stay
    assert not {"Shape", "ConstantOfShape", "Gather", "Concat"} & set(left), left


def test_bert_matmul_add_become_gemm():
    graph = load("bert")
    opts = CompileOptions(opt_level=2)
    PassManager(pipeline(opts, CPU_FUSION), [Verify()], opts).run(graph)
    counts = op_counts(graph)
    # 2 layers x (q, k, v, out, ff1, ff2) linear layers: every MatMul by a weight matrix became Gemm;
    # the two attention MatMuls per layer (activations x activations) stay MatMul
    assert counts.get("Gemm") == 12, counts
    assert counts.get("MatMul") == 4, counts
