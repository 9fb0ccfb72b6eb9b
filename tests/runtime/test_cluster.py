"""Multi-device artifacts on a local Ray cluster (``ray.init(num_cpus=2)``): the parts as actors give
the local executable's outputs (pipeline, micro-batches, replicas), errors come back as themselves,
a tampered part is refused by its actor, and a missing Ray or an unknown cluster is a clear error."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import compiler
from compiler.errors import KilnError
from compiler.runtime.artifact import ArtifactError
from compiler.runtime.cluster import RayExecutable
from compiler.tools.cli import main

from .test_multidevice import feeds, mlp

ray = pytest.importorskip("ray")  # a test dependency (pyproject's test extra): present in `make test`


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 << 20)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, cluster):
    d = tmp_path_factory.mktemp("ray")
    out = {}
    for name, kw in {"pipeline": {"parallel": "pipeline"}, "micro": {"parallel": "pipeline", "microbatch": 2},
                     "data": {"parallel": "data"}}.items():
        exe = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", output=d / f"{name}.kiln",
                               **kw)
        out[name] = (d / f"{name}.kiln", exe)
    return out


@pytest.mark.parametrize("mode", ["pipeline", "micro", "data"])
def test_ray_actors_give_the_local_outputs(artifacts, mode):
    path, local = artifacts[mode]
    exe = compiler.load(path, cluster="ray")
    try:
        assert isinstance(exe, RayExecutable) and exe.parallel == local.parallel
        nodes = exe.nodes()
        assert [(p, d) for p, d, _ in nodes] == [(p.name, p.device) for p in local.parts]  # an actor per part
        f = feeds(8)
        np.testing.assert_array_equal(exe.run(f)["y"], local.run(f)["y"])
        items = [feeds(8) for _ in range(5)]
        for got, want in zip(exe.run_many(items), local.run_many(items)):
            np.testing.assert_array_equal(got["y"], want["y"])
        with pytest.raises(KilnError, match="has shape"):  # checked here, before any actor runs
            exe.run(feeds(3))
    finally:
        exe.close()


def test_a_tampered_part_is_refused_by_its_actor(artifacts, tmp_path):
    path, local = artifacts["pipeline"]
    copy = local.save(tmp_path / "copy.kiln")
    index = json.loads((tmp_path / "copy.kiln" / "devices.json").read_text())
    index["parts"][1]["manifest_sha256"] = "0" * 64
    (tmp_path / "copy.kiln" / "devices.json").write_text(json.dumps(index))
    with pytest.raises(ArtifactError, match="failed to load on the Ray cluster.*not the one its index was written"):
        compiler.load(copy, cluster="ray")


def test_kiln_run_on_the_cluster(artifacts, capsys):
    path, _ = artifacts["data"]
    assert main(["run", str(path), "--cluster", "ray"]) == 0
    assert "y: float32[8, 10]" in capsys.readouterr().out


def test_clusters_are_named_and_need_ray_and_a_multi_device_artifact(artifacts, tmp_path, monkeypatch):
    path, _ = artifacts["pipeline"]
    with pytest.raises(KilnError, match="expected 'ray' or 'ray://HOST:PORT'"):
        compiler.load(path, cluster="spark://x")
    one = compiler.compile(mlp(batch=2), output=tmp_path / "one.kiln")
    with pytest.raises(KilnError, match="cluster= runs a multi-device artifact"):
        compiler.load(one.path, cluster="ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(KilnError, match=r"pip install 'kiln\[distributed\]'"):
        compiler.load(path, cluster="ray")
