"""Multi-device against one device, in one run: per model, items per second of

* one device: the single-device artifact on all the process's cores, items one after another;
* pipeline: the model split over the devices by split-devices, items streamed through the stages
  (``run_many``), and with micro-batches where the batch is symbolic;
* data: a replica per device, each taking its rows of every item's batch (symbolic batch only);

with each mode's outputs checked against the single-device artifact's (max abs difference) and the
placement's estimate beside the measurement.

    python benchmarks/multidevice.py [--devices cpu:0,cpu:1] [--items 16] [--only resnet18,gpt2]
        [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compiler  # noqa: E402
from compiler.profiling import cpu_name  # noqa: E402

#: name -> (how to get the model, batch); archs are exported from PyTorch with a symbolic batch
SUITE = {"squeezenet": ("light:squeezenet", None), "resnet18": ("arch", 8), "gpt2": ("arch", 8),
         "bert": ("arch", 8), "mlp": ("mlp", 64)}


def _model(name: str, batch):
    if SUITE[name][0] == "arch":
        import onnx

        from compiler.tools import archs

        proto = onnx.load_from_string(archs.export_arch(name)[0])
        _, feeds, _ = archs.build(name, batch)
        return proto, feeds
    if SUITE[name][0] == "mlp":
        from compiler.tools.zoo import model_of

        proto = model_of("zoo:mlp?batch=1")
        for v in list(proto.graph.input) + list(proto.graph.output):
            v.type.tensor_type.shape.dim[0].dim_param = "N"
        x = np.random.default_rng(0).standard_normal((batch, 784)).astype(np.float32)
        return proto, {"x": x}
    one = compiler.compile(SUITE[name][0])
    rng = np.random.default_rng(0)
    return SUITE[name][0], {n: rng.standard_normal(s).astype(np.float32) for n, _, s in one.inputs}


def _rate(fn, items: int, rounds: int = 5) -> float:
    """Items per second: the best of ``rounds`` runs of ``fn`` (which does ``items`` items)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return items / best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="cpu:0,cpu:1")
    ap.add_argument("--items", type=int, default=16)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    names = [n for n in SUITE if not args.only or n in args.only.split(",")]
    rows = []
    for name in names:
        model, feeds = _model(name, SUITE[name][1])
        shapes = {k: v.shape for k, v in feeds.items()}
        one = compiler.compile(model, input_shapes=shapes)
        want = one.run(feeds)
        items = [feeds] * args.items
        row = {"model": name, "batch": SUITE[name][1],
               "one_device_items_per_s": _rate(lambda: [one.run(f) for f in items], len(items))}
        modes = [("pipeline", {"parallel": "pipeline"})]
        if SUITE[name][1]:
            modes += [("pipeline-micro", {"parallel": "pipeline", "microbatch": SUITE[name][1] // 4}),
                      ("data", {"parallel": "data"})]
        for label, kw in modes:
            exe = compiler.compile(model, input_shapes=shapes, devices=args.devices, **kw)
            got = exe.run(feeds)
            err = max(float(np.max(np.abs(got[k] - want[k]), initial=0.0)) for k in want)
            rate = _rate(lambda: exe.run_many(items), len(items))
            row[label] = {"items_per_s": rate, "vs_one_device": rate / row["one_device_items_per_s"],
                          "max_abs_diff": err, "parts": len(exe.parts),
                          "estimate": exe.placement.get("explain", exe.placement["why"]).splitlines()[0]}
            exe.close()
        rows.append(row)
        print(f"{name:<11} one device {row['one_device_items_per_s']:8.1f}/s  " + "  ".join(
            f"{m} {row[m]['items_per_s']:8.1f}/s ({row[m]['vs_one_device']:.2f}x, diff {row[m]['max_abs_diff']:.1e})"
            for m, _ in modes), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"devices": args.devices, "items": args.items, "rows": rows,
                       "cpu": cpu_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
