"""A GPU beside a CPU in one multi-device compile (numba's CUDA simulator here, a GPU where there is
one): a pipeline with a CPU stage and a GPU stage (each fused for its own backend after the cut),
and a replica per device; both give the CPU artifact's numbers, save, load and inspect."""
from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler.errors import KilnError
from compiler.passes.options import OptionError
from compiler.tools.cli import main

from ..runtime.test_multidevice import feeds, mlp

DEVICES = "cpu:0,cuda:0"


@pytest.fixture(scope="module")
def single():
    return compiler.compile(mlp(), input_shapes={"x": (8, 64)})


@pytest.mark.parametrize("parallel", ["pipeline", "data"])
def test_a_cpu_and_a_gpu_give_the_cpu_numbers(parallel, single, tmp_path, capsys):
    out = tmp_path / "m.kiln"
    exe = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices=DEVICES, parallel=parallel, output=out)
    assert [p.device for p in exe.parts] == ["cpu:0", "cuda:0"]
    assert [p["kind"] for p in exe.index["parts"]] == ["cpu", "cuda"]
    items = [feeds(8) for _ in range(3)]
    for got, f in zip(exe.run_many(items), items):
        np.testing.assert_allclose(got["y"], single.run(f)["y"], rtol=1e-5, atol=1e-6)
    loaded = compiler.load(out)
    np.testing.assert_allclose(loaded.run(items[0])["y"], single.run(items[0])["y"], rtol=1e-5, atol=1e-6)
    assert main(["inspect", str(out)]) == 0
    assert "on cuda:0" in capsys.readouterr().out
    with pytest.raises(KilnError, match="Ray runs CPU parts only"):
        compiler.load(out, cluster="ray")


def test_a_gpu_numba_does_not_see_is_refused():
    with pytest.raises(OptionError, match=r"cuda:7: numba.cuda sees \d+ GPU"):
        compiler.compile(mlp(batch=4), devices="cpu:0,cuda:7")
