"""A real model with real accuracy: the digits CNN (examples/digits/train.py, trained with PyTorch on
scikit-learn's handwritten digits) on its 360 held-out images, float against int8 for every mode and
calibrator Kiln has: the int8 top-1 accuracy stays within half a point of float."""
from __future__ import annotations

import os

import numpy as np
import pytest

import compiler
from compiler.passes.quantize import QuantizeOptions

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "digits")
MODEL = os.path.join(HERE, "digits_cnn.onnx")
BATCH = 40


@pytest.fixture(scope="module")
def data():
    with np.load(os.path.join(HERE, "digits_data.npz")) as z:
        return z["calib"], z["test_x"], z["test_y"]


def _accuracy(exe, test_x, test_y) -> float:
    hits = 0
    for i in range(0, len(test_x), BATCH):
        hits += int((exe.run({"x": test_x[i:i + BATCH]})["logits"].argmax(1) == test_y[i:i + BATCH]).sum())
    return hits / len(test_x)


@pytest.fixture(scope="module")
def float_accuracy(data):
    _, test_x, test_y = data
    exe = compiler.compile(MODEL, 2, {"x": [BATCH, 1, 8, 8]}, fallback=False)
    return _accuracy(exe, test_x, test_y)


def test_float_accuracy(float_accuracy):
    assert float_accuracy >= 0.95


@pytest.mark.parametrize("options", [QuantizeOptions(), QuantizeOptions(per_channel=True),
                                     QuantizeOptions(symmetric=True), QuantizeOptions(calibrator="percentile"),
                                     QuantizeOptions(calibrator="entropy"),
                                     QuantizeOptions(calibrator="entropy", per_channel=True),
                                     QuantizeOptions(mode="int8-dynamic")],
                         ids=["minmax", "minmax-per-channel", "minmax-symmetric", "percentile", "entropy",
                              "entropy-per-channel", "dynamic"])
def test_int8_accuracy_within_half_a_point(data, float_accuracy, options):
    calib, test_x, test_y = data
    samples = [{"x": calib[i:i + BATCH]} for i in range(0, len(calib), BATCH)]
    exe = compiler.compile(MODEL, 2, {"x": [BATCH, 1, 8, 8]}, fallback=False, quantize=options,
                           calibration=samples if options.needs_calibration else None)
    assert len(exe.quantization["quantized"]) == 5 and not exe.quantization["kept_in_float"]  # 3 convs, 2 Gemms
    assert _accuracy(exe, test_x, test_y) >= float_accuracy - 0.005
