"""Profiling (compiler/profiling.py, ``kiln profile``) and model summaries (compiler/tools/summary.py,
``kiln summary``): per-kernel times that add up to the run, the roofline cache, the Chrome trace's
format (every kernel once per run), refusals; parameters and FLOPs of ResNet-50 and of a small
model counted by hand."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

import compiler
from compiler.errors import KilnError
from compiler.models import load_graph
from compiler.profiling import machine_roofline, profile
from compiler.tools.cli import main
from compiler.tools.summary import summarize_graph, tree
from tests.onnx_build import float_model

ROOF = {"gflops": 100.0, "gbs": 20.0, "cpu": "test", "threads": 2, "kiln_version": compiler.__version__}
RNG = np.random.default_rng(5)


def _model():
    w1 = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((64, 10)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="/block/conv/Conv"),
             helper.make_node("Relu", ["c"], ["r"], name="/block/relu/Relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="/head/Flatten"),
             helper.make_node("MatMul", ["f", "w2"], ["y"], name="/head/fc/MatMul")]
    return float_model(nodes, [("x", [1, 3, 4, 4])], [("w1", w1), ("w2", w2)])


FEEDS = {"x": RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)}


def test_kernel_times_add_up_to_the_run_and_the_trace_has_each_kernel_once_per_run():
    exe = compiler.compile(_model(), profile=True)
    p = profile(exe, FEEDS, runs=7, roofline=ROOF)
    assert len(p.kernels) == len(exe.kernels) > 0 and p.runs == 7
    assert all(0 < k.min_s <= k.median_s <= k.max_s for k in p.kernels)
    assert 0 < p.kernel_sum_s <= p.latency_max_s and p.latency_min_s <= p.latency_median_s
    conv = next(k for k in p.kernels if "Conv" in k.ops)
    assert conv.flops == 2 * 4 * 16 * 27 + 4 * 16 and conv.gflops  # Conv + Relu == pytest.approx(conv.flops / conv.median_s / 1e9)
    assert conv.roofline_pct is not None and conv.roofline_pct > 0
    text = p.table()
    assert "roofline: 100 GFLOP/s" in text and conv.name in text
    doc = json.loads(json.dumps(p.chrome_trace({"passes": 0.01, "codegen": 0.02})))
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in ("M", "X") and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0
    kernels = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == 1]
    runs = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == 0]
    assert len(runs) == 7 and len(kernels) == 7 * len(exe.kernels)
    for i, r in enumerate(runs):  # each run's kernels, each once, one after another from the run's start
        mine = sorted((e for e in kernels if e["args"]["run"] == i), key=lambda e: e["ts"])
        assert sorted(e["name"] for e in mine) == sorted(k["name"] for k in exe.kernels)
        assert mine[0]["ts"] == r["ts"] and all(a["ts"] + a["dur"] == pytest.approx(b["ts"])
                                                for a, b in zip(mine, mine[1:]))
        assert i == 0 or r["ts"] >= runs[i - 1]["ts"] + runs[i - 1]["dur"]
    assert [e["name"] for e in events if e.get("pid") == 2 and e["ph"] == "X"] == ["passes", "codegen"]
    assert p.to_json()["kernel_sum_s"] == pytest.approx(p.kernel_sum_s)


def test_an_artifact_without_timing_is_refused():
    with pytest.raises(KilnError, match=r"compile it with profile=True \(kiln compile --profile\)"):
        profile(compiler.compile(_model()), FEEDS, roofline=ROOF)
    with pytest.raises(KilnError, match="runs must be at least 1"):
        profile(compiler.compile(_model(), profile=True), FEEDS, runs=0, roofline=ROOF)


def test_the_roofline_is_measured_once_and_cached(tmp_path, monkeypatch):
    first = machine_roofline(1, cache_dir=str(tmp_path))
    assert first["gflops"] > 1 and first["gbs"] > 0.5
    import compiler.codegen.gemm.build as build

    monkeypatch.setattr(build, "load_gemm", lambda *a, **k: pytest.fail("measured again"))
    assert machine_roofline(1, cache_dir=str(tmp_path)) == first
    assert json.loads((tmp_path / "roofline.json").read_text())


def test_a_peak_measured_under_load_is_measured_again(tmp_path):
    """A cached compute peak that a profiled kernel beats by over 10% was measured while the cores were
    busy: the profile measures it again and caches the new figures."""
    key = f"{compiler.profiling.cpu_name()}|1|{compiler.__version__}"
    (tmp_path / "roofline.json").write_text(json.dumps({key: dict(ROOF, gflops=1e-6, threads=1)}))
    exe = compiler.compile(_model(), profile=True, nthreads=1)
    prof = profile(exe, FEEDS, runs=3, cache_dir=str(tmp_path))
    assert prof.roofline["gflops"] > 1
    assert json.loads((tmp_path / "roofline.json").read_text())[key]["gflops"] == prof.roofline["gflops"]


def test_kiln_profile_and_compile_profile(tmp_path, monkeypatch, capsys):
    import onnx

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    model = str(tmp_path / "m.onnx")
    onnx.save(_model(), model)
    trace = tmp_path / "t.json"
    assert main(["profile", model, "--runs", "3", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "3 runs" in out and "Conv" in out and "wrote" in out
    assert len(json.loads(trace.read_text())["traceEvents"]) > 5
    art = str(tmp_path / "m.kiln")
    assert main(["compile", model, "-o", art]) == 0
    capsys.readouterr()
    assert main(["profile", art]) != 0
    assert "not built for profiling: compile it with profile=True (kiln compile --profile)" in capsys.readouterr().err
    assert main(["compile", model, "-o", art, "--profile"]) == 0
    capsys.readouterr()
    assert main(["profile", art, "--runs", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 2 and len(doc["kernels"]) >= 2


def test_summary_counts_by_hand():
    s = summarize_graph(load_graph(_model()))
    t = s["total"]
    assert t.params == 4 * 27 + 640 and t.nodes == 4
    assert t.flops == 2 * 4 * 16 * 27 + 4 * 16 + 2 * 10 * 64  # Conv, Relu, MatMul (Flatten moves nothing)
    scopes = {sc: lay for sc, _, lay in tree(s, depth=2)}
    assert scopes["/block"].params == 108 and scopes["/head"].params == 640 and scopes["/head/fc"].nodes == 1


def test_summary_of_resnet50(capsys):
    assert main(["summary", "light:resnet50"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("parameters 25,610,152 (25.61M), FLOPs 8.22G (4.11G multiply-adds)"), head
    assert main(["summary", "light:resnet50", "--json", "--depth", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"]["params"] == 25610152 and sum(n["flops"] for n in doc["nodes"]) == doc["total"]["flops"]


def test_the_trace_has_a_track_per_pool_thread_within_each_kernel():
    """With 2 threads a large product runs chunks on the pool thread: its track holds that kernel, from
    the kernel's start, no longer than the kernel on the calling thread. (The caller never waits for
    a pool thread that has not started, so on a loaded machine a run may have none: any of 10.)"""
    w = RNG.standard_normal((512, 512)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["y"])]
    model = float_model(nodes, [("x", [256, 512])], [("w", w)])
    exe = compiler.compile(model, profile=True, nthreads=2)
    p = profile(exe, {"x": RNG.standard_normal((256, 512)).astype(np.float32)}, runs=10, roofline=ROOF)
    assert len(p.pool_runs) == 10
    assert any(r and sum(r[0]) > 0 for r in p.pool_runs)  # pool thread 1 ran chunks
    events = p.chrome_trace()["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[2].startswith("pool thread 1")
    caller = {(e["args"]["run"], e["name"]): e for e in events if e["ph"] == "X" and e["tid"] == 1}
    pool = [e for e in events if e["ph"] == "X" and e["tid"] == 2]
    assert pool
    for e in pool:
        k = caller[(e["args"]["run"], e["name"])]
        assert e["ts"] == k["ts"] and e["dur"] <= k["dur"] + 1e-6


def test_a_model_with_a_symbolic_batch_profiles(tmp_path, monkeypatch, capsys):
    """Regression: with profile=True, a model whose batch is symbolic compiled a generic program with
    no native code whose manifest still had a profile record, and the artifact was refused ("a
    profile record in an artifact not built for profiling"), from Python and `kiln profile`."""
    import onnx

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    m = _model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    exe = compiler.compile(m, profile=True)
    p = profile(exe, FEEDS, runs=2, roofline=ROOF)
    assert any("Conv" in k["ops"] for k in p.to_json()["kernels"])
    model = str(tmp_path / "m.onnx")
    onnx.save(m, model)
    assert main(["profile", model, "--input-shape", "x=1x3x4x4", "--runs", "2"]) == 0
    assert "2 runs" in capsys.readouterr().out


def test_interpreted_steps_are_timed_too():
    from onnx import TensorProto

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"], name="nonzero1"),
             helper.make_node("Cast", ["nz"], ["y"], to=TensorProto.FLOAT, name="cast1")]
    from compiler.driver import FallbackWarning

    with pytest.warns(FallbackWarning):
        exe = compiler.compile(float_model(nodes, [("x", [4, 8])]), profile=True)
    p = profile(exe, {"x": RNG.standard_normal((4, 8)).astype(np.float32)}, runs=3, roofline=ROOF)
    timed = {f["node"]: f["median_s"] for f in p.fallback}
    assert set(timed) == {"nonzero1", "cast1"} and all(s > 0 for s in timed.values())
    assert sum(timed.values()) + p.kernel_sum_s <= p.latency_max_s
    assert "interpreted: NonZero node 'nonzero1'" in p.table() and " ms (median, in 'other')" in p.table()
    _, t = exe.run_timed({"x": RNG.standard_normal((4, 8)).astype(np.float32)})
    assert set(t.interpreted) == {"nonzero1", "cast1"}
