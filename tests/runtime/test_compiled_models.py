"""Every model of the suite compiled at -O2: fully native (no interpreter fallback), matching the
reference interpreter and ONNX Runtime, and the same again from its artifact in a fresh process."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import compiler
from compiler.codegen.fusion import CPU_FUSION
from compiler.tools import zoo
from compiler.ir.interpreter import interpret
from compiler.models import light_models, load_graph, resolve
from compiler.passes.manager import PassManager
from compiler.passes.options import CompileOptions
from compiler.passes.pipeline import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZOO = {"mlp": {}, "bert": {"layers": 2, "seq": 32}, "mobilenetv2": {"resolution": 96},
       "efficientnet_block": {"resolution": 32}}


def _model(name):
    """(spec for compile, ONNX bytes, feeds)."""
    if name.startswith("light:"):
        path = resolve(name)
        m = onnx.load(path)
        g = load_graph(name)
        rng = np.random.default_rng(0)
        feeds = {v.name: rng.standard_normal([int(d) for d in v.shape]).astype(v.dtype.np) for v in g.inputs}
        return name, m.SerializeToString(), feeds
    data, feeds, _ = zoo.export(name, **ZOO[name])
    return onnx.load_from_string(data), data, feeds


def _scale_err(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))


@pytest.mark.slow
@pytest.mark.parametrize("name", [f"light:{m}" for m in light_models()] + sorted(ZOO))
def test_model_compiles_natively_and_matches(name, tmp_path):
    spec, data, feeds = _model(name)
    art = str(tmp_path / "m.kiln")
    exe = compiler.compile(spec, 2, output=art, fallback=False)
    assert exe.fallback == []
    out = exe.run(feeds)
    g = load_graph(spec)
    PassManager(pipeline(CompileOptions(), CPU_FUSION)).run(g)
    ref = interpret(g, feeds)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    peer = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for k in exe.output_names:
        assert _scale_err(out[k], ref[k]) < 1e-4, f"{name} {k}: vs interpreter"
        assert _scale_err(out[k], peer[k]) < 1e-4, f"{name} {k}: vs ONNX Runtime"
    # the artifact in a fresh process: `kiln run` with the same inputs
    args = []
    for i, (k, v) in enumerate(feeds.items()):
        np.save(tmp_path / f"in{i}.npy", v)
        args += ["--input", f"{k}={tmp_path / f'in{i}.npy'}"]
    subprocess.run([sys.executable, "-m", "compiler.tools.cli", "run", art, *args, "--output", str(tmp_path / "o.npz")],
                   check=True, cwd=ROOT, capture_output=True)
    again = np.load(tmp_path / "o.npz")
    for k in exe.output_names:
        np.testing.assert_array_equal(again[k], out[k])
