"""Held-out top-1 accuracy of the digits CNN: Kiln float and int8 (every mode), and ONNX Runtime float
and its own int8 (``quantize_static``, QDQ, the same calibration images; and ``quantize_dynamic``).

    python examples/digits/accuracy.py
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
BATCH = 40


def main() -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static

    import compiler
    from compiler.passes.quantize import QuantizeOptions

    model = os.path.join(HERE, "digits_cnn.onnx")
    with np.load(os.path.join(HERE, "digits_data.npz")) as z:
        calib, test_x, test_y = z["calib"], z["test_x"], z["test_y"]
    samples = [{"x": calib[i:i + BATCH]} for i in range(0, len(calib), BATCH)]

    def accuracy(run) -> float:
        return float(np.mean([int(run(test_x[i:i + 1]).argmax()) == int(test_y[i]) for i in range(len(test_x))]))

    rows = []
    for label, q in (("float", None), ("int8 minmax", QuantizeOptions()),
                     ("int8 minmax per-channel", QuantizeOptions(per_channel=True)),
                     ("int8 minmax symmetric", QuantizeOptions(symmetric=True)),
                     ("int8 percentile (99.999)", QuantizeOptions(calibrator="percentile")),
                     ("int8 entropy", QuantizeOptions(calibrator="entropy")),
                     ("int8 entropy per-channel", QuantizeOptions(calibrator="entropy", per_channel=True)),
                     ("int8-dynamic", QuantizeOptions(mode="int8-dynamic"))):
        exe = compiler.compile(model, 2, {"x": [BATCH, 1, 8, 8]}, quantize=q,
                               calibration=samples if q is not None and q.needs_calibration else None)
        hits = sum(int((exe.run({"x": test_x[i:i + BATCH]})["logits"].argmax(1) == test_y[i:i + BATCH]).sum())
                   for i in range(0, len(test_x), BATCH))
        rows.append(("Kiln", label, hits / len(test_x)))
    with tempfile.TemporaryDirectory() as d:
        st, dy = os.path.join(d, "static.onnx"), os.path.join(d, "dynamic.onnx")

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter([{"x": s["x"]} for s in samples])

            def get_next(self):
                return next(self.it, None)

        quantize_static(model, st, Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
        quantize_dynamic(model, dy, weight_type=QuantType.QInt8)
        for label, path in (("float", model), ("int8 quantize_static (QDQ)", st), ("int8 quantize_dynamic", dy)):
            s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            rows.append(("ONNX Runtime", label, accuracy(lambda x: s.run(None, {"x": x})[0])))
    print(f"held-out digits: {len(test_x)} images\n")
    print("| engine | model | top-1 accuracy |\n|---|---|---|")
    for engine, label, acc in rows:
        print(f"| {engine} | {label} | {acc:.4f} ({round(acc * len(test_x))}/{len(test_x)}) |")


if __name__ == "__main__":
    main()
