"""int8 quantization end to end: ``compile(..., quantize=...)`` and ``kiln compile --quantize`` on the
project's MLP, checked against the float model (cosine similarity), native throughout (no node in
the interpreter), with calibration from feed dicts and from a directory, and the errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

import compiler
from compiler.calibration import CalibrationError
from compiler.passes.options import OptionError
from compiler.passes.quantize import QuantizeOptions
from compiler.tools.cli import main
from compiler.tools.zoo import model_of

MLP = "zoo:mlp?batch=8"


def _samples(n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 784)).astype(np.float32)} for _ in range(n)]


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def reference():
    exe = compiler.compile(model_of(MLP), 2, fallback=False)
    test = _samples(3, seed=99)
    return test, [exe.run(f)["output"] for f in test]


@pytest.mark.parametrize("options", [QuantizeOptions(), QuantizeOptions(per_channel=True),
                                     QuantizeOptions(symmetric=True), QuantizeOptions(mode="int8-dynamic")],
                         ids=["static", "per-channel", "symmetric", "dynamic"])
def test_quantized_mlp_matches_float(reference, options):
    test, want = reference
    exe = compiler.compile(model_of(MLP), 2, fallback=False, quantize=options,
                           calibration=_samples(6, seed=1) if options.needs_calibration else None)
    assert exe.quantization == {"quantized": ["/net/net.0/Gemm", "/net/net.2/Gemm", "/net/net.4/Gemm"],
                                "kept_in_float": {}, "uint8_inputs": []}
    for f, w in zip(test, want):
        assert _cosine(exe.run(f)["output"], w) > 0.999


def test_weights_are_a_quarter(reference):
    f32 = compiler.compile(model_of(MLP), 2)
    q = compiler.compile(model_of(MLP), 2, quantize="int8-dynamic")
    ratio = q.manifest.memory["weights_bytes"] / f32.manifest.memory["weights_bytes"]
    assert 0.22 < ratio < 0.3, ratio


def test_the_cli_quantizes_with_a_calibration_directory(tmp_path, capsys, reference):
    for i, s in enumerate(_samples(4, seed=2)):
        np.savez(tmp_path / f"s{i}.npz", **s)
    out = tmp_path / "m.kiln"
    assert main(["compile", MLP, "-o", str(out), "--quantize", "int8", "--calibration", str(tmp_path),
                 "--exclude", "/net/net.4/Gemm", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["quantization"] == {"quantized": ["/net/net.0/Gemm", "/net/net.2/Gemm"],
                                       "kept_in_float": {"/net/net.4/Gemm": "excluded by the options"},
                                       "uint8_inputs": []}
    test, want = reference
    assert _cosine(compiler.load(str(out)).run(test[0])["output"], want[0]) > 0.999


def test_errors(tmp_path):
    with pytest.raises(OptionError, match="needs calibration data"):
        compiler.compile(model_of(MLP), 2, quantize="int8")
    with pytest.raises(OptionError, match="no static int8 quantization"):
        compiler.compile(model_of(MLP), 2, calibration=_samples(1, 0))
    with pytest.raises(CalibrationError, match="lacks input.s. x"):
        compiler.compile(model_of(MLP), 2, quantize="int8", calibration=[{"y": np.zeros(3)}])
    with pytest.raises(CalibrationError, match="holds no .npz or .npy sample"):
        compiler.compile(model_of(MLP), 2, quantize="int8", calibration=str(tmp_path))
    with pytest.raises(CalibrationError, match="calibration sample 0: .*shape"):
        compiler.compile(model_of(MLP), 2, quantize="int8", calibration=[{"x": np.zeros((2, 784), np.float32)}])


def test_percentile_range():
    from compiler.calibration import percentile_range

    hist = np.zeros(100)
    hist[:] = 1.0
    hist[99] = 0.0
    hist[98] = 1.0  # 99 elements in bins 0..98 of [0, 100)
    lo, hi = percentile_range(hist, 0.0, 100.0, 98.0)  # cut about 2 elements from the top alone
    assert lo == 0.0 and 96.0 <= hi <= 98.0
    lo, hi = percentile_range(np.ones(100), -50.0, 50.0, 90.0)  # 5% from each end
    assert -46.0 <= lo <= -44.0 and 45.0 <= hi <= 47.0


def test_entropy_threshold_clips_a_long_tail():
    from compiler.calibration import BINS, entropy_threshold

    rng = np.random.default_rng(0)
    x = np.abs(np.concatenate([rng.standard_normal(100_000), [60.0, -80.0]]))
    t = 80.0 * entropy_threshold(np.histogram(x, BINS, (0, 80))[0], 128) / BINS
    assert 3.0 < t < 8.0  # the outliers are clipped; the body of the distribution is kept
    flat = entropy_threshold(np.ones(BINS), 255)
    assert flat == BINS  # nothing to clip


@pytest.mark.parametrize("calibrator, cosine", [("percentile", 0.999), ("entropy", 0.98)])
def test_other_calibrators_on_the_mlp(reference, calibrator, cosine):
    """Entropy clips the tails of the MLP's Gaussian inputs (37k values a layer here: a sparse
    histogram), which costs more than minmax on this model: the report (quantize-report) is how a
    user finds that out."""
    test, want = reference
    exe = compiler.compile(model_of(MLP), 2, fallback=False, quantize=QuantizeOptions(calibrator=calibrator),
                           calibration=_samples(6, seed=1))
    for f, w in zip(test, want):
        assert _cosine(exe.run(f)["output"], w) > cosine
