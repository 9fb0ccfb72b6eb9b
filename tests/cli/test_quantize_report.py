"""The per-layer quantization report and the accuracy budget (compiler/quantize_report.py): the
numbers it prints are the measured ones, the ranking follows them, the budget keeps the costliest
layers in float and is met, and the CLI and compile() read it."""
from __future__ import annotations

import json

import numpy as np
import pytest

import compiler
from compiler.errors import KilnError
from compiler.passes.options import OptionError
from compiler.passes.quantize import QuantizeOptions
from compiler.quantize_report import _stats, quantize_report
from compiler.tools.cli import main
from compiler.tools.zoo import model_of

MLP = "zoo:mlp?batch=4"
LAYERS = {"/net/net.0/Gemm", "/net/net.2/Gemm", "/net/net.4/Gemm"}


def _samples(n=4, seed=3):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 784)).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def report():
    return quantize_report(model_of(MLP), _samples(), QuantizeOptions(per_channel=True))


def test_the_report_ranks_every_quantized_layer(report):
    assert {e.name for e in report.layers} == LAYERS and report.not_quantized == {}
    assert all(e.op == "Gemm" for e in report.layers)
    alone = [e.alone_cosine for e in report.layers]
    assert alone == sorted(alone)  # the most costly alone first
    assert 0.999 < report.model_cosine < 1.0 and report.model_sqnr_db > 30
    for e in report.layers:
        assert 0.999 < e.cosine < 1.0 and e.sqnr_db > 30 and e.max_abs > 0
        # one layer alone costs less than all of them together
        assert e.alone_cosine >= report.model_cosine - 1e-9
    text = report.text()
    assert "/net/net.0/Gemm" in text and "SQNR" in text


def test_error_statistics():
    w = [np.array([3.0, 4.0]), np.array([0.0])]
    sqnr, cos, mx = _stats(w, [np.array([3.0, 4.0]), np.array([0.0])])
    assert sqnr == float("inf") and cos == 1.0 and mx == 0.0
    sqnr, cos, mx = _stats(w, [np.array([3.0, 3.0]), np.array([0.0])])
    assert sqnr == pytest.approx(10 * np.log10(25.0)) and mx == 1.0
    assert cos == pytest.approx(21 / (5 * np.sqrt(18)))


@pytest.mark.parametrize("budget, kept", [(0.5, 0), (0.0, 3)])
def test_the_budget_keeps_the_costliest_layers_first(budget, kept):
    r = quantize_report(model_of(MLP), _samples(), QuantizeOptions(), budget=budget)
    assert r.kept_in_float == [e.name for e in r.layers[:kept]]
    assert 1 - r.budget_cosine <= budget + 1e-12


def test_compile_with_a_budget(report):
    budget = (1 - report.model_cosine) / 2  # all-int8 misses it: at least one layer stays float
    exe = compiler.compile(model_of(MLP), 2, quantize=QuantizeOptions(per_channel=True, accuracy_budget=budget),
                           calibration=_samples())
    b = exe.quantization["budget"]
    assert b["kept_in_float"] and b["kept_in_float"] == [e.name for e in report.layers[:len(b["kept_in_float"])]]
    assert 1 - b["output_cosine"] <= budget
    assert set(exe.quantization["kept_in_float"]) == set(b["kept_in_float"])
    with pytest.raises(OptionError, match="needs calibration data"):
        compiler.compile(model_of(MLP), 2, quantize=QuantizeOptions(mode="int8-dynamic", accuracy_budget=0.1))
    with pytest.raises(OptionError, match="in .0, 1."):
        QuantizeOptions(accuracy_budget=2.0)


def test_the_cli_report(tmp_path, capsys):
    for i, s in enumerate(_samples(3)):
        np.save(tmp_path / f"{i}.npy", s["x"])
    assert main(["quantize-report", MLP, "--calibration", str(tmp_path), "--json", "--accuracy-budget", "0.5"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert {e["name"] for e in r["layers"]} == LAYERS and r["kept_in_float"] == [] and r["budget"] == 0.5


def test_nothing_to_quantize_is_an_error():
    from compiler.ir.graph import Graph
    from compiler.ir.ops import elementwise as ew
    from compiler.ir.types import DType, TensorType

    g = Graph("relu")
    g.set_outputs([g.add(ew.Relu(), g.add_input("x", TensorType(DType.f32, (2, 3))))], ["y"])
    with pytest.raises(KilnError, match="nothing to quantize"):
        quantize_report(g, [{"x": np.zeros((2, 3), np.float32)}])
