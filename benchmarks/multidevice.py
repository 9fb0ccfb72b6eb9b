"""Multi-device against one device, in one run: per model, items per second of

* one device: the single-device artifact on all the process's cores, items one after another, and
  the same artifact on one core (the issue's baseline: two one-core devices against one);
* pipeline: the model split over the devices by split-devices, items streamed through the stages
  (``run_many``), and with micro-batches where the batch is symbolic;
* data: a replica per device, each taking its rows of every item's batch (symbolic batch only);

and the latency of one ``run`` against one core's; each mode's outputs are checked against the
single-device artifact's (max abs difference), and the placement's estimate is kept beside the
measurement.

    python benchmarks/multidevice.py [--devices cpu:0,cpu:1] [--items 16] [--only resnet18,gpt2]
        [--ray] [--out results.json]

``--ray`` also runs each multi-device artifact through a local Ray cluster (its parts as actors):
whether the outputs are the local ones, and Ray's time per call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compiler  # noqa: E402
from compiler.profiling import cpu_name  # noqa: E402

#: name -> (the model, batch): archs and zoo models are exported from PyTorch with a symbolic batch;
#: a light: model keeps its fixed batch (pipeline only)
SUITE = {"resnet50": ("zoo:resnet", 4), "bert": ("zoo:bert?seq=128", 4), "squeezenet": ("light:squeezenet", None),
         "resnet18": ("arch:resnet18", 8), "gpt2": ("arch:gpt2", 8), "mlp": ("zoo:mlp", 64)}


def _model(name: str):
    spec, batch = SUITE[name]
    if spec.startswith("arch:"):
        import onnx

        from compiler.tools import archs

        proto = onnx.load_from_string(archs.export_arch(spec[5:])[0])
        _, feeds, _ = archs.build(spec[5:], batch)
        return proto, feeds
    if spec.startswith("zoo:"):
        proto = _zoo_symbolic(spec)
        one = compiler.compile(proto, input_shapes={v.name: (batch, *[d.dim_value for d in
                                                                      v.type.tensor_type.shape.dim[1:]])
                                                    for v in proto.graph.input})
    else:
        proto, one = spec, compiler.compile(spec)
    rng = np.random.default_rng(0)
    feeds = {}
    for n, dtype, shape in one.inputs:
        if dtype.np == np.int64:  # token ids (and an attention mask of ones: ids below 2)
            feeds[n] = rng.integers(0, 2 if "mask" in n else 100, shape).astype(np.int64)
        else:
            feeds[n] = rng.standard_normal(shape).astype(dtype.np)
    return proto, feeds


def _zoo_symbolic(spec: str):
    """A zoo model exported from PyTorch with its batch dimension symbolic (N)."""
    import onnx

    from compiler.tools import zoo

    name, params = zoo.parse_spec(spec)
    params.pop("opset", None)
    return onnx.load_from_string(zoo.export(name, dynamic_batch=True, **params)[0])


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
    ap.add_argument("--ray", action="store_true", help="also run each artifact on a local Ray cluster")
    args = ap.parse_args(argv)
    if args.ray:
        import ray

        ray.init(num_cpus=len(args.devices.split(",")), include_dashboard=False, log_to_driver=False)
    names = [n for n in SUITE if not args.only or n in args.only.split(",")]
    rows = []
    for name in names:
        model, feeds = _model(name)
        shapes = {k: v.shape for k, v in feeds.items()}
        one = compiler.compile(model, input_shapes=shapes)
        core = compiler.load(one.path, nthreads=1)
        want = one.run(feeds)
        items = [feeds] * args.items
        row = {"model": name, "batch": SUITE[name][1],
               "one_device_items_per_s": _rate(lambda: [one.run(f) for f in items], len(items)),
               "one_core_items_per_s": _rate(lambda: [core.run(f) for f in items], len(items)),
               "one_core_latency_ms": 1e3 / _rate(lambda: core.run(feeds), 1, rounds=7)}
        modes = [("pipeline", {"parallel": "pipeline"})]
        if SUITE[name][1]:
            modes += [("pipeline-micro", {"parallel": "pipeline", "microbatch": SUITE[name][1] // 4}),
                      ("data", {"parallel": "data"})]
        for label, kw in modes:
            exe = compiler.compile(model, input_shapes=shapes, devices=args.devices, **kw)
            got = exe.run(feeds)
            err = max(float(np.max(np.abs(got[k] - want[k]), initial=0.0)) for k in want)
            rate = _rate(lambda: exe.run_many(items), len(items))
            latency = 1e3 / _rate(lambda: exe.run(feeds), 1, rounds=7)
            row[label] = {"items_per_s": rate, "vs_one_device": rate / row["one_device_items_per_s"],
                          "vs_one_core": rate / row["one_core_items_per_s"], "latency_ms": latency,
                          "latency_vs_one_core": latency / row["one_core_latency_ms"],
                          "max_abs_diff": err, "parts": len(exe.parts),
                          "estimate": exe.placement.get("explain", exe.placement["why"]).splitlines()[0]}
            if args.ray:  # the same artifact's parts as actors on a local Ray cluster
                with tempfile.TemporaryDirectory() as d:
                    remote = compiler.load(exe.save(os.path.join(d, "m.kiln")), cluster="ray")
                    same = all(np.array_equal(remote.run(feeds)[k], got[k]) for k in got)
                    ray_latency = 1e3 / _rate(lambda: remote.run(feeds), 1, rounds=7)
                    ray_rate = _rate(lambda: remote.run_many(items), len(items))
                    remote.close()
                row[label]["ray"] = {"same_outputs": same, "latency_ms": ray_latency,
                                     "overhead_ms_per_call": ray_latency - latency, "items_per_s": ray_rate}
            exe.close()
        rows.append(row)
        for m, _ in modes:
            if "ray" in row[m]:
                r = row[m]["ray"]
                print(f"{name:<11} {m} on Ray: same outputs {r['same_outputs']}, {r['latency_ms']:.2f} ms a run "
                      f"({r['overhead_ms_per_call']:+.2f} ms against local), {r['items_per_s']:.1f}/s streamed")
        print(f"{name:<11} one device {row['one_device_items_per_s']:8.1f}/s, one core "
              f"{row['one_core_items_per_s']:8.1f}/s  " + "  ".join(
                  f"{m} {row[m]['items_per_s']:8.1f}/s ({row[m]['vs_one_core']:.2f}x one core, latency "
                  f"{row[m]['latency_vs_one_core']:.2f}x, "
                  f"{row[m]['vs_one_device']:.2f}x one device, diff {row[m]['max_abs_diff']:.1e})" for m, _ in modes),
              flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"devices": args.devices, "items": args.items, "rows": rows,
                       "cpu": cpu_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
