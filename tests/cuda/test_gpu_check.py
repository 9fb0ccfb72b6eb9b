"""The GPU check's reduced version (``benchmarks/gpu_check.py --sim``) in numba's CUDA simulator: it
runs, compiles the small suite models for cuda and finds each equal to the CPU artifact."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_gpu_check_in_the_simulator(tmp_path, capsys):
    import numba

    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("on a GPU the check itself runs this directory; its --sim mode needs the simulator")
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(ROOT, "benchmarks", "gpu_check.py"))
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main(["--sim", "--out", str(tmp_path), "--only", "mlp,bert,resnet"]) == 0
    report = json.load(open(tmp_path / "gpu_check.json"))
    assert report["simulator"] and report["gemm"]["max_error"] < 1e-4
    assert [m["model"] for m in report["models"]] == ["mlp_b1", "mlp_b64", "bert", "resnet50"]
    assert all(m["matches_cpu"] and m["fallback"] == [] for m in report["models"])
    assert "OK" in capsys.readouterr().out
