"""Profiling a multi-device artifact (``compile(devices=..., profile=True)``, ``kiln profile``): every
part's kernels timed on its device, against that device's roofline, with a trace track per part; a
micro-batched pipeline and a part built without timing are refused with the reason."""
from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler.errors import KilnError
from compiler.profiling import profile
from compiler.tools.cli import main

from .test_multidevice import feeds, mlp


@pytest.mark.parametrize("parallel,shape", [("pipeline", (8, 64)), ("data", (6, 64))])
def test_each_part_is_timed_on_its_device(parallel, shape):
    exe = compiler.compile(mlp(), input_shapes={"x": shape}, devices="cpu:0,cpu:1", parallel=parallel, profile=True)
    plain = compiler.compile(mlp(), input_shapes={"x": shape})
    f = feeds(shape[0])
    out, timed = exe.run_timed(f)
    np.testing.assert_allclose(out["y"], plain.run(f)["y"], rtol=1e-5, atol=1e-6)
    assert [p.device for p, _, _ in timed] == ["cpu:0", "cpu:1"]
    assert all(all(s > 0 for s in t.steps) for _, _, t in timed)
    p = profile(exe, f, runs=4)
    assert {k.device for k in p.kernels} == {"cpu:0", "cpu:1"}
    assert len(p.kernels) == sum(len(q.exe.kernels) for q in exe.parts)
    assert [q["device"] for q in p.parts] == ["cpu:0", "cpu:1"] and len(p.part_starts) == 4
    assert all(k.roofline_pct is not None for k in p.kernels if k.flops)
    if parallel == "pipeline":  # the second stage starts after the first one's kernels
        assert all(s[1] >= sum(r[:len(exe.parts[0].exe.kernels)]) for s, r in zip(p.part_starts, p.per_run))
    assert "cpu:0 " in p.table() and "cpu:1 " in p.table()
    events = p.chrome_trace()["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tracks[1].startswith("cpu:0: ") and tracks[2].startswith("cpu:1: ")
    for tid, device in ((1, "cpu:0"), (2, "cpu:1")):
        mine = [e for e in events if e["ph"] == "X" and e["tid"] == tid]
        assert mine and all(e["args"]["device"] == device for e in mine)
        assert len(mine) == 4 * len(exe.parts[tid - 1].exe.kernels)  # every kernel once per run


def test_refusals_say_why(tmp_path):
    untimed = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="pipeline")
    with pytest.raises(KilnError, match="not built for profiling"):
        profile(untimed, feeds(8), runs=1)
    micro = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="pipeline",
                             microbatch=2, profile=True)
    with pytest.raises(KilnError, match="micro-batched pipeline"):
        profile(micro, feeds(8), runs=1)


def test_kiln_profile_of_a_multidevice_artifact(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(mlp(batch=8), str(path))
    art = tmp_path / "m.kiln"
    assert main(["compile", str(path), "-o", str(art), "--devices", "cpu:0,cpu:1", "--parallel", "pipeline",
                 "--profile"]) == 0
    capsys.readouterr()
    assert main(["profile", str(art), "--runs", "3", "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "cpu:0 " in out and "cpu:1 " in out
    assert 'id="kernels"' in (tmp_path / "r.html").read_text()
