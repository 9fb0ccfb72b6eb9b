"""int8 against float, Kiln and ONNX Runtime, in one run: accuracy (cosine similarity of the outputs
with Kiln's float model on random inputs) and latency.

    python benchmarks/quantize.py [--only mlp,bert] [--threads 2] [--samples 8] [--rounds 9]

Per model: Kiln float; Kiln int8 (static, minmax over ``--samples`` random calibration samples) and
int8-dynamic; ONNX Runtime float, and its own int8 from ``onnxruntime.quantization`` on the same
model file (``quant_pre_process`` then ``quantize_static`` QDQ with the same samples, as ONNX Runtime's
quantization guide says; ``quantize_dynamic``), at the same thread count. Latency: ``--rounds`` (9) rounds of
``compiler.tools.bench.measure`` as ``kiln bench`` times engines (each round every engine in turn,
the order rotating; each engine's untimed calls for 0.1 s, then 3 timed ones), so that the slow
phases of a shared machine hit all engines alike and no engine is timed while the previous one's
threads still spin (a fixed order with no settling put Kiln's float model after ONNX Runtime's
int8-dynamic in every round: Kiln float ResNet-50 47.0 ms there, 36.9 in a process of its own).
Prints a Markdown table; ratios are int8 / float of the same engine, and Kiln / ORT of the same
mode: of the fastest calls, and the median over rounds of the ratio within a round (the steadier
figure on a noisy machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUITE = [("mlp (batch 64)", "zoo:mlp?batch=64"), ("mlp (batch 1)", "zoo:mlp?batch=1"),
         ("bert (seq 128)", "zoo:bert?seq=128"), ("mobilenetv2 (224)", "zoo:mobilenetv2"),
         ("resnet50 (224)", "zoo:resnet")]


def _interleaved(fns: dict, rounds: int = 9) -> dict:
    """{name: seconds of each timed call}, by ``compiler.tools.bench.measure`` (interleaved rounds,
    the order rotating, every engine settled for 0.1 s before its timed calls): the k-th call of
    one engine and of another were timed in the same round."""
    from compiler.tools.bench import Engine, measure

    engines = [Engine(name, fn, None) for name, fn in fns.items()]
    measure(engines, rounds, 2)
    return {e.name: e.times for e in engines}


def _cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def main(argv=None) -> int:
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    import compiler
    from compiler.tools.bench import random_feeds
    from compiler.tools.zoo import model_of

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of every engine (more: steadier medians)")
    a = ap.parse_args(argv)
    rows = []
    for label, spec in SUITE:
        if a.only and not any(s in label or s in spec for s in a.only.split(",")):
            continue
        model = model_of(spec)
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
        f32 = compiler.compile(proto, 2, nthreads=a.threads)
        samples = [random_feeds(f32.inputs, seed=1 + i) for i in range(a.samples)]
        test = random_feeds(f32.inputs, seed=1000)
        want = f32.run(test)
        out = next(iter(want))
        cos, fns = {"kiln float": 1.0}, {"kiln float": lambda: f32.run(test)}
        for mode in ("int8", "int8-dynamic"):
            q = compiler.compile(proto, 2, nthreads=a.threads, quantize=mode,
                                 calibration=samples if mode == "int8" else None)
            cos[f"kiln {mode}"] = _cosine(q.run(test)[out], want[out])
            fns[f"kiln {mode}"] = (lambda q: lambda: q.run(test))(q)
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        with tempfile.TemporaryDirectory() as d:
            src, pre, st, dy = (os.path.join(d, n) for n in ("m.onnx", "pre.onnx", "static.onnx", "dynamic.onnx"))
            onnx.save(proto, src)

            class Reader(CalibrationDataReader):
                def __init__(self):
                    self.it = iter(samples)

                def get_next(self):
                    return next(self.it, None)

            # ONNX Runtime's recommended preparation first (shape inference, its graph optimizations:
            # BatchNorm folded into the convolutions), as its quantization guide does
            quant_pre_process(src, pre)
            quantize_static(pre, st, Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8)
            quantize_dynamic(src, dy, weight_type=QuantType.QInt8)
            for name, path in (("ort float", src), ("ort int8", st), ("ort int8-dynamic", dy)):
                s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
                cos[name] = _cosine(s.run(None, test)[0], want[out])
                fns[name] = (lambda s: lambda: s.run(None, test))(s)
        per = _interleaved(fns, a.rounds)
        res = {k: (cos[k], min(per[k]), per[k]) for k in fns}
        rows.append((label, res))
        print(label, {k: (round(c, 5), round(t * 1e3, 3)) for k, (c, t, _) in res.items()}, flush=True)
    print()
    print("| model | engine | mode | cosine vs Kiln float | ms (fastest call) | int8/float (same engine) | "
          "Kiln/ORT (same mode, fastest) | Kiln/ORT (median of rounds) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, res in rows:
        for key, (c, t, per) in res.items():
            engine, mode = key.split(" ", 1)
            base = res[f"{engine} float"][1]
            peer = res.get("ort " + mode) if engine == "kiln" else None
            vs = f"{t / peer[1]:.2f}" if peer else ""
            med = f"{np.median([x / y for x, y in zip(per, peer[2])]):.2f}" if peer else ""
            print(f"| {label} | {engine} | {mode} | {c:.5f} | {t * 1e3:.3f} | {t / base:.2f} | {vs} | {med} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
