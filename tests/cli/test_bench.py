"""`kiln bench` and compiler.tools.bench: one small MLP benchmarked for real (few rounds), the JSON output,
the numerics check, and clear errors. Nothing here asserts speed."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pytest

from compiler.tools import bench, zoo
from compiler.errors import ModelError

SPEC = "zoo:mlp?sizes=64x32x10,batch=2"


@pytest.fixture(scope="module")
def result():
    return bench.bench_model(SPEC, compare="onnxruntime,openvino,torch", nthreads=1, runs=3, warmup=1,
                             sgemm_size=128)


def _parser():
    p = argparse.ArgumentParser(prog="kiln bench")
    bench.add_arguments(p)
    return p


def test_bench_model_fields_are_sane(result):
    assert result["model"] == "zoo:mlp?batch=2,sizes=64x32x10"
    assert result["threads"] == 1 and result["runs"] == 3 and result["opt_level"] == 2
    assert result["inputs"] == {"x": "float32[2, 64]"}
    assert set(result["engines"]) == {"kiln", "onnxruntime", "openvino", "torch"}
    for st in result["engines"].values():
        assert st["runs"] == 3 * bench.BLOCK  # each round: BLOCK timed calls per engine
        assert 0 < st["min_ms"] <= st["median_ms"] <= st["max_ms"]
    for peer in ("onnxruntime", "openvino", "torch"):
        ratio = result["engines"]["kiln"]["median_ms"] / result["engines"][peer]["median_ms"]
        assert result["ratios"][peer] == pytest.approx(ratio)
        assert result["check"][peer]["ok"] and result["check"][peer]["max_rel"] < 1e-3
    k = result["kiln"]
    assert 0 <= k["native_flops"] <= k["flops"]
    assert k["flops"] >= 2 * 2 * (64 * 32 + 32 * 10)  # the two Gemms, at least
    assert k["compile_seconds"] > 0 and k["artifact_bytes"] > 4 * (64 * 32 + 32 * 10)
    assert k["kernels"] + k["fallback_nodes"] >= 2
    assert result["gflops"] == pytest.approx(k["flops"] / (result["engines"]["kiln"]["median_ms"] * 1e-3) / 1e9)
    peak = result["machine"]["sgemm"]
    assert peak["size"] == 128 and peak["peak_gflops"] > 0 and peak["openblas_gflops"] > 0
    assert result["peak_fraction"] == pytest.approx(result["gflops"] / peak["peak_gflops"])
    assert result["machine"]["isa"].split(" ")[0] in ("AVX-512", "AVX2+FMA", "AVX2", "AVX", "SSE")
    assert result["openvino_compile_seconds"] > 0
    json.dumps(result)  # JSON-able


def test_table_names_every_engine(result):
    text = bench.format_result(result)
    for word in ("kiln", "onnxruntime", "openvino", "torch", "median ms", "kiln/engine", "% peak", "sgemm 128^3",
                 f"machine: {result['machine']['cpu']}, {result['machine']['isa']}"):
        assert word in text
    assert f"{result['ratios']['torch']:.2f}x" in text


def test_cli_json_output_parses(result, monkeypatch, capsys):
    seen = {}

    def fake(spec, **kw):
        seen.update(kw, spec=spec)
        return result

    monkeypatch.setattr(bench, "bench_model", fake)
    args = _parser().parse_args([SPEC, "--compare", "ort", "--threads", "1", "--runs", "4", "--warmup", "0",
                                 "-O", "1", "--json"])
    assert bench.run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == result["model"] and doc["ratios"] == result["ratios"]
    assert seen["spec"] == SPEC and seen["compare"] == "ort" and seen["nthreads"] == 1
    assert seen["runs"] == 4 and seen["warmup"] == 0 and seen["opt_level"] == 1 and seen["input_shapes"] is None


def test_cli_human_output(result, monkeypatch, capsys):
    monkeypatch.setattr(bench, "bench_model", lambda spec, **kw: result)
    assert bench.run(_parser().parse_args([SPEC])) == 0
    assert "median ms" in capsys.readouterr().out


def test_cli_rejects_bad_numbers(capsys):
    for argv in ([SPEC, "--threads", "0"], [SPEC, "--runs", "x"], [SPEC, "-O", "7"]):
        with pytest.raises(SystemExit):
            _parser().parse_args(argv)


def test_unknown_engine_is_a_clear_error():
    with pytest.raises(bench.BenchError, match=r"unknown engine 'tensorflow'.*onnxruntime, openvino, torch"):
        bench.bench_model(SPEC, compare="onnxruntime,tensorflow")
    assert bench.parse_engines("ORT, pytorch,kiln") == ["onnxruntime", "torch"]
    assert bench.parse_engines("ov,openvino") == ["openvino"]
    assert bench.parse_engines("none") == [] and bench.parse_engines("") == []


@pytest.mark.parametrize("spec, message", [
    ("zoo:vgg", r"no zoo model 'vgg'; zoo models: mlp, bert"),
    ("zoo:mlp?depth=3", r"zoo:mlp has no size 'depth'; it takes batch"),
    ("zoo:mlp?batch=big", r"batch='big' is not a number"),
    ("light:nosuchnet", r"no light model 'nosuchnet'"),
    ("missing/model.onnx", r"no such model file"),
])
def test_unknown_model_is_a_clear_error(spec, message):
    with pytest.raises(ModelError, match=message):
        bench.bench_model(spec)


def test_zoo_takes_sizes_in_the_spec():
    with pytest.raises(bench.BenchError, match=r"sizes in the spec"):
        bench.bench_model("zoo:mlp", input_shapes={"x": (4, 784)})


def test_mismatch_fails_loudly():
    ref = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    ok = bench.compare_outputs({"y": ref["y"] + 1e-6}, ref, "peer", rtol=1e-3, atol=1e-5)
    assert ok["ok"] and ok["max_abs"] < 1e-5
    with pytest.raises(bench.BenchError, match=r"Kiln and peer disagree on output 'y': max abs error 0.5"):
        bench.compare_outputs({"y": ref["y"] + np.float32(0.5)}, ref, "peer", rtol=1e-3, atol=1e-5)
    with pytest.raises(bench.BenchError, match=r"shape"):
        bench.compare_outputs({"y": ref["y"][:2]}, ref, "peer", rtol=1e-3, atol=1e-5)
    with pytest.raises(bench.BenchError, match=r"inf/NaN"):
        bench.compare_outputs({"y": np.array([1, np.nan, 3], np.float32)}, ref, "peer", rtol=1e-3, atol=1e-5)


def test_missing_onnxruntime_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    notes: list[str] = []
    assert bench._ort_engine(b"", {}, 1, notes) is None
    assert "onnxruntime: not installed" in notes[0]


def test_missing_openvino_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    notes: list[str] = []
    assert bench._openvino_engine(b"", {}, 1, notes) is None
    assert "openvino: not installed" in notes[0]


def test_openvino_names_a_model_it_cannot_read():
    notes: list[str] = []
    assert bench._openvino_engine(b"not a model", {}, 1, notes) is None
    assert notes[0].startswith("openvino: cannot load the model (")


def test_openvino_runs_a_symbolic_batch_at_the_feeds_shape():
    """A model with a symbolic batch is fixed to the feeds' shapes (static, as Kiln compiles it);
    its outputs are named as the model names them and agree with ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    proto, feeds, _ = zoo.load("zoo:mlp?sizes=8x4,batch=3")
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    notes: list[str] = []
    e = bench._openvino_engine(proto.SerializeToString(), feeds, 1, notes)
    assert e is not None and notes == []
    out, name = e.outputs(), proto.graph.output[0].name
    assert list(out) == [name] and out[name].shape == (3, 4)
    ref = ReferenceEvaluator(proto).run(None, feeds)[0]
    np.testing.assert_allclose(out[name], ref, rtol=1e-5, atol=1e-6)


def test_a_peer_that_disagrees_alone_is_left_out(monkeypatch):
    """A peer whose outputs differ while another peer agrees with Kiln is not timed (a note says
    why); when no peer agrees, the benchmark fails."""
    name = zoo.load(SPEC)[0].graph.output[0].name

    def wrong(model, feeds, nthreads, notes):
        out = {name: np.zeros((2, 10), np.float32) + 7}
        return bench.Engine("openvino", lambda: None, lambda: out)

    monkeypatch.setattr(bench, "_openvino_engine", wrong)
    r = bench.bench_model(SPEC, compare="ort,openvino", nthreads=1, runs=1, warmup=0, sgemm_size=0)
    assert set(r["engines"]) == {"kiln", "onnxruntime"} and set(r["check"]) == {"onnxruntime"}
    assert any(n.startswith("openvino disagrees with Kiln and with onnxruntime, which agree: not timed")
               for n in r["notes"])
    with pytest.raises(bench.BenchError, match=f"Kiln and openvino disagree on output '{name}'"):
        bench.bench_model(SPEC, compare="openvino", nthreads=1, runs=1, warmup=0, sgemm_size=0)


def test_zoo_without_torch_says_so(monkeypatch):
    monkeypatch.setattr(zoo, "torch", None)
    with pytest.raises(ModelError, match="PyTorch, which is not installed"):
        zoo.load("zoo:mlp")


def test_zoo_spec_syntax():
    assert zoo.parse_spec("zoo:bert?seq=64&layers=2") == ("bert", {"seq": 64, "layers": 2})
    assert zoo.parse_spec("zoo:mobilenetv2?width=0.5") == ("mobilenetv2", {"width": 0.5})
    assert zoo.canonical("zoo:mlp?batch=1,opset=17") == "zoo:mlp"
    proto, feeds, module = zoo.load("zoo:mlp?sizes=8x4,batch=3")
    assert feeds["x"].shape == (3, 8) and proto.graph.input[0].name == "x"
