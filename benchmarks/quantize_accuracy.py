"""int8 accuracy on the model suite: cosine similarity of each model's int8 output with its float
output (Kiln both), static minmax with per-channel weights, on 4 held-out random inputs; also the
cosine of both less the float outputs' mean (``_centered``).

    python benchmarks/quantize_accuracy.py [--only resnet50,bert] [--samples 4] [--budget 0.01]

The ONNX model-zoo networks the onnx package ships carry constant weights (ConstantOfShape: light:resnet50
answers 0.001 for every class), so their weights are replaced by seeded random ones first:
He-scaled normals for weights (rank >= 2), identity BatchNorm statistics, zero biases, and a final
Softmax is dropped (random weights saturate it:
the logits are compared instead). With ``--budget`` a model whose ``1 - cosine`` on the
calibration data is over it is recompiled with ``accuracy_budget``, and the layers kept in float are
listed. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUITE = [("resnet50", "light:resnet50"), ("squeezenet", "light:squeezenet"), ("shufflenet", "light:shufflenet"),
         ("inception_v1", "light:inception_v1"), ("densenet121", "light:densenet121"),
         ("bert (seq 128)", "zoo:bert?seq=128"), ("mobilenetv2 (224)", "zoo:mobilenetv2?resolution=224"),
         ("efficientnet block", "zoo:efficientnet_block"), ("mlp (batch 64)", "zoo:mlp?batch=64")]


def randomized(path: str, seed: int = 0):
    """The ONNX model at ``path`` with every float initializer replaced by a seeded random one."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path)
    rng = np.random.default_rng(seed)
    # the light models make their weights with ConstantOfShape (a shape initializer, one value):
    # those become initializers of their own
    shapes = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if t.name.endswith("__SHAPE")}
    nodes = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes:
            zeros = np.zeros([int(d) for d in shapes[n.input[0]]], np.float32)
            m.graph.initializer.append(numpy_helper.from_array(zeros, n.output[0]))
        else:
            nodes.append(n)
    # a final Softmax goes: with random weights (and no trained BatchNorm statistics) the logits are
    # large and the Softmax saturates to one-hot; the logits are what int8 is compared on
    out = m.graph.output[0]
    last = nodes[-1]
    if last.op_type == "Softmax" and last.output[0] == out.name:
        nodes.pop()
        for n in nodes:
            n.output[:] = [out.name if o == last.input[0] else o for o in n.output]
            n.input[:] = [out.name if i == last.input[0] else i for i in n.input]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    # BatchNormalization: identity statistics (scale 1, bias 0, mean 0, variance 1); other vectors
    # (biases): 0, so that the outputs follow the inputs
    bn = {}
    for n in m.graph.node:
        if n.op_type == "BatchNormalization":
            bn.update({name: v for name, v in zip(n.input[1:5], (1.0, 0.0, 0.0, 1.0))})
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype != np.float32 or a.size == 0:
            continue
        if a.ndim >= 2:
            fan_in = int(np.prod(a.shape[1:]))
            new = rng.standard_normal(a.shape) * np.sqrt(2.0 / max(fan_in, 1))
        else:
            new = np.full(a.shape, bn.get(t.name, 0.0))
        t.CopyFrom(numpy_helper.from_array(new.astype(np.float32), t.name))
    return m


def _centered(q: np.ndarray, f: np.ndarray) -> float:
    """The cosine of the int8 and float outputs less the float outputs' mean over the inputs: whether
    int8 keeps what the inputs change (random deep networks map every input to nearly one direction,
    which the plain cosine would reward)."""
    mean = f.mean(axis=0, keepdims=True)
    return _cosine(q - mean, f - mean)


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def main(argv=None) -> int:
    import compiler
    from compiler.models import resolve
    from compiler.passes.quantize import QuantizeOptions
    from compiler.tools.bench import random_feeds
    from compiler.tools.zoo import model_of

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--budget", type=float, default=None)
    a = ap.parse_args(argv)
    rows = []
    for label, spec in SUITE:
        if a.only and not any(s in label or s in spec for s in a.only.split(",")):
            continue
        model = randomized(resolve(spec)) if spec.startswith("light:") else model_of(spec)
        t0 = time.perf_counter()
        f32 = compiler.compile(model, 2)
        samples = [random_feeds(f32.inputs, seed=1 + i) for i in range(a.samples)]
        tests = [random_feeds(f32.inputs, seed=1000 + i) for i in range(4)]
        want = [f32.run(t) for t in tests]
        options = QuantizeOptions(per_channel=True)
        q = compiler.compile(model, 2, quantize=options, calibration=samples)
        got = [q.run(t) for t in tests]
        cos = min(_cosine(g[k], w[k]) for g, w in zip(got, want) for k in w)
        centered = min(_centered(np.stack([g[k] for g in got]), np.stack([w[k] for w in want])) for k in want[0])
        kept = ""
        if a.budget is not None and 1 - cos > a.budget:
            qb = compiler.compile(model, 2, calibration=samples,
                                  quantize=QuantizeOptions(per_channel=True, accuracy_budget=a.budget))
            b = qb.quantization["budget"]
            cosb = min(_cosine(qb.run(t)[k], w[k]) for t, w in zip(tests, want) for k in w)
            kept = f"{len(b['kept_in_float'])} kept in float ({', '.join(b['kept_in_float'])}): cosine {cosb:.5f}"
        n = len(q.quantization["quantized"])
        rows.append((label, n, len(q.quantization["kept_in_float"]), cos, centered, kept, time.perf_counter() - t0))
        print(rows[-1], flush=True)
    print("\n| model | layers in int8 | left in float by the pass | cosine (min over outputs and inputs) | "
          "centered cosine | with the budget | seconds |\n|---|---|---|---|---|---|---|")
    for label, n, left, cos, centered, kept, secs in rows:
        print(f"| {label} | {n} | {left} | {cos:.5f} | {centered:.5f} | {kept} | {secs:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
