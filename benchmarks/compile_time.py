"""Compile times of the model suite and a DeiT-tiny, cold and warm, optionally against another commit.

    python benchmarks/compile_time.py [--only resnet50,deit] [--runs 3] [--before REV]

Every compile runs in a fresh process that has imported Kiln and its ONNX frontend first, so the
figure is ``compiler.compile``'s wall time (the model read and imported, passes, code generation,
LLVM, link, the artifact written and loaded), not Python's start. **Cold**: an empty object cache (``KILN_CACHE_DIR`` a new
folder holding only the GEMM and thread-pool objects, which are built once per machine and CPU
configuration: their own time is printed once). **Warm**: the same model again with the object
cache the cold compile filled (``codegen/llvm/objects.py``: no LLVM work left, only Kiln's own).
"gc after" is a ``gc.collect()`` right after the compile: garbage the compile left for Python's
cycle collector is paid there, at some later moment of the caller's.

With ``--before REV`` that commit is checked out into a temporary git worktree and each compile is
run at both commits in turn (A, B, A, B, ...), so that the machine's drift hits both alike; the
table then gives both and after/before. Each figure is the fastest of ``--runs`` compiles (this
machine is shared: the fastest is the least noisy statistic). DeiT-tiny (patch 16, width 192, 12
layers, 3 heads, 224x224) is exported with PyTorch (skipped with a note where it is missing).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.ab import worktree  # noqa: E402
from benchmarks.models import SUITE  # noqa: E402

WORKER = r'''
import gc, json, sys, time
import compiler, compiler.driver, frontends.onnx  # (onnx's own import: 0.7 s, a process's start)
from compiler.tools.zoo import model_of
spec = sys.argv[1]
model = model_of(spec) if spec.startswith("zoo:") else spec
if isinstance(model, str) and model.endswith(".onnx"):
    import onnx
    model = onnx.load(model)
timings = {}
t = time.perf_counter()
compiler.compile(model, timings=timings)
wall = time.perf_counter() - t
t = time.perf_counter()
gc.collect()
print(json.dumps({"wall": wall, "gc": time.perf_counter() - t,
                  "phases": {k: v for k, v in timings.items() if isinstance(v, float)}}))
'''


def export_deit(path: str) -> bool:
    """DeiT-tiny exported to ``path``; False without PyTorch."""
    try:
        import torch
    except ImportError:
        return False
    import warnings

    from compiler.tools.archs.vision import VisionTransformer

    torch.manual_seed(0)
    module = VisionTransformer(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3,
                               num_classes=1000).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(1, 3, 224, 224),), path, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"])
    return True


def compile_once(tree: str, spec: str, cache: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, KILN_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", WORKER, spec], env=env, cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{spec} failed to compile at {tree}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def seed_cache(tree: str, where: str) -> tuple[str, float]:
    """A cache folder with the GEMM and pool objects built (by compiling a one-layer MLP), the object
    cache emptied; returns it and the seconds that first compile took."""
    t = time.perf_counter()
    compile_once(tree, "zoo:mlp?sizes=64x64", where)
    took = time.perf_counter() - t
    shutil.rmtree(os.path.join(where, "objects"), ignore_errors=True)
    return where, took


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated model names (substrings)")
    ap.add_argument("--runs", type=int, default=3, help="compiles per model, mode and commit (fastest kept)")
    ap.add_argument("--before", help="a commit to compare with (checked out in a temporary worktree)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kiln-ct-") as tmp:
        models = list(SUITE)
        deit = os.path.join(tmp, "deit_tiny.onnx")
        if export_deit(deit):
            models.append(("deit-tiny", deit))
        else:
            print("deit-tiny: PyTorch is not installed; not measured")
        if args.only:
            models = [m for m in models if any(o in m[0] for o in args.only.split(","))]
        trees = {"before": worktree(args.before, tmp), "after": ROOT} if args.before else {"after": ROOT}
        try:
            rows = measure(trees, models, args.runs, tmp)
        finally:
            if args.before:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", trees["before"]],
                               capture_output=True)
        print_table(rows, list(trees))


def measure(trees: dict, models: list, runs: int, tmp: str) -> list:
    """[(label, {(tree name, "cold" | "warm"): the fastest compile's record})], the trees taking turns."""
    seeds = {}
    for name, tree in trees.items():
        seeds[name], took = seed_cache(tree, os.path.join(tmp, f"seed-{name}"))
        print(f"{name}: GEMM and thread-pool objects built in {took:.1f} s (once per machine)")
    rows = []
    for label, spec in models:
        best: dict = {}
        for _ in range(runs):
            for name, tree in trees.items():
                cache = os.path.join(tmp, f"run-{name}")
                shutil.rmtree(cache, ignore_errors=True)
                shutil.copytree(seeds[name], cache)
                for mode in ("cold", "warm"):
                    got = compile_once(tree, spec, cache)
                    if (name, mode) not in best or got["wall"] < best[name, mode]["wall"]:
                        best[name, mode] = got
        rows.append((label, best))
        print(label, " ".join(f"{n} {m} {r['wall']:.2f}s" for (n, m), r in best.items()), flush=True)
    return rows


def print_table(rows: list, names: list) -> None:
    before = "before" in names
    head = ["model"] + [f"{m} {n} s" for m in ("cold", "warm") for n in names]
    if before:
        head += ["cold after/before", "warm after/before"]
    head += ["warm phases (after)", "gc after (warm)"]
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, best in rows:
        cells = [label] + [f"{best[n, m]['wall']:.2f}" for m in ("cold", "warm") for n in names]
        if before:
            cells += [f"{best['after', m]['wall'] / best['before', m]['wall']:.2f}" for m in ("cold", "warm")]
        warm = best["after", "warm"]
        cells += [", ".join(f"{k} {v:.2f}" for k, v in warm["phases"].items() if k != "total"), f"{warm['gc']:.2f}"]
        print("| " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
