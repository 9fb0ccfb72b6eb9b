"""Profiling a CUDA artifact (``compiler.profile``, ``kiln profile --target cuda``) in numba's CUDA
simulator: one row per step that launches kernels, its time the sum of its launches' CUDA-event times
(the simulator's events time nothing, so the tests give them times), FLOPs as the CPU artifact counts
them, and the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

import compiler
from compiler.profiling import profile
from compiler.tools import zoo
from compiler.tools.cli import main

#: the first Gemm splits K over two launches and adds the slices in a third
SPEC = "zoo:mlp?batch=5,sizes=512x8x4"
#: (the command's: one launch per step, the simulator's quickest)
SMALL = "zoo:mlp?sizes=32x16x8"


class _Events:
    """CUDA events whose elapsed time is set per launch: the k-th timed launch took ``ms(k)``."""

    def __init__(self, ms):
        self.ms, self.count = ms, 0
        outer = self

        class Event:
            def record(self, stream=0):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                outer.count += 1
                return outer.ms(outer.count - 1)

        self.event = Event


@pytest.fixture(scope="module")
def mlp():
    m = zoo.load(SPEC)
    return m.onnx, m.feeds


def test_each_step_is_timed_by_its_launches(mlp, monkeypatch):
    model, feeds = mlp
    monkeypatch.setattr("compiler.profiling.CUDA_REPEAT", 2)  # (the simulator runs every launch)
    exe = compiler.compile(model, target="cuda")
    steps = {}
    for k in exe.manifest["kernels"]:
        steps.setdefault(k["step"], []).append(k["kernel"])
    assert max(len(v) for v in steps.values()) == 2  # (a step of two launches: their times added)
    # the i-th timed launch of each run takes i + 1 ms over CUDA_REPEAT launches (launches in step order)
    per_run = sum(len(v) for v in steps.values())
    events = _Events(lambda k: float(k % per_run + 1))
    monkeypatch.setattr(exe, "_cuda", type("cuda", (), {"event": events.event})())
    p = profile(exe, feeds, runs=3, warmup=0)
    assert [k.step for k in p.kernels] == sorted(steps)
    assert events.count == 3 * per_run
    first = 1
    for k in p.kernels:
        n = len(steps[k.step])
        assert k.name == "+".join(steps[k.step]) and k.device == "cuda"
        want = sum(first + j for j in range(n)) / 1e3 / 2
        assert k.median_s == pytest.approx(want) and k.min_s == pytest.approx(want)
        first += n
    assert [len(r) for r in p.per_run] == [len(p.kernels)] * 3
    # FLOPs as the CPU artifact counts them (the same op table), GFLOP/s from them
    cpu = compiler.compile(model)
    assert sum(k.flops for k in p.kernels) == sum(k["flops"] for k in cpu.kernels) > 0
    gemm = next(k for k in p.kernels if "Gemm" in k.ops)
    assert gemm.gflops == pytest.approx(gemm.flops / gemm.median_s / 1e9)
    assert p.roofline["gpu"] == "numba's CUDA simulator" and all(k.roofline_pct is None for k in p.kernels)
    text = p.table()
    assert "CUDA events" in text and "no roofline" in text and "thread(s)" not in text
    # the results are still right after the timing (the next run recomputes the arena)
    want = cpu.run(feeds)
    for name, got in exe.run(feeds).items():
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-4)


def test_the_command(tmp_path, capsys):
    model = zoo.load(SMALL).onnx
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["profile", str(path), "--target", "cuda", "--runs", "2", "--json",
                 "--trace", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out[:out.rindex("}") + 1])
    assert doc["roofline"]["gpu"] and {k["device"] for k in doc["kernels"]} == {"cuda"}
    trace = json.loads((tmp_path / "t.json").read_text())
    assert sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 1) == 2 * len(doc["kernels"])
    # a CUDA artifact is profiled as it is; --target is for models, --html for CPU profiles
    art = tmp_path / "m.kiln"
    compiler.compile(model, target="cuda", output=str(art))
    assert main(["profile", str(art), "--runs", "1"]) == 0
    assert "CUDA events" in capsys.readouterr().out
    assert main(["profile", str(art), "--target", "cuda"]) != 0
    assert "--target applies to models" in capsys.readouterr().err
    assert main(["profile", str(art), "--html", str(tmp_path / "r.html")]) != 0
    assert "--html reports CPU profiles only" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()
