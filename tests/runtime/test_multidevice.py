"""Multi-device compiles: pipelines and replicas give the single-device artifact's outputs; the
artifact saves, loads and refuses tampering; options and memory limits are checked; the CLI."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from onnx import helper

import compiler
from compiler.devices import DeviceOptions, cpu_cores, usable_cores
from compiler.errors import InputError, LimitError
from compiler.passes.options import OptionError
from compiler.runtime.artifact import ArtifactError
from compiler.runtime.multidevice import MultiDeviceExecutable
from compiler.tools.cli import main

from ..onnx_build import float_model

rng = np.random.default_rng(0)
SIZES = (64, 128, 128, 10)
INITS = [(f"w{i}", (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32))
         for i, (a, b) in enumerate(zip(SIZES, SIZES[1:]))]
INITS += [(f"b{i}", (rng.standard_normal(b) * 0.1).astype(np.float32)) for i, b in enumerate(SIZES[1:])]
WEIGHT_BYTES = sum(a.nbytes for _, a in INITS)


def mlp(batch="N"):
    """A three-layer MLP whose batch is ``batch`` (a symbolic name, or a number)."""
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["g0"]), helper.make_node("Relu", ["g0"], ["h0"]),
             helper.make_node("Gemm", ["h0", "w1", "b1"], ["g1"]), helper.make_node("Relu", ["g1"], ["h1"]),
             helper.make_node("Gemm", ["h1", "w2", "b2"], ["y"])]
    return float_model(nodes, [("x", [batch, SIZES[0]])], INITS)


def feeds(batch):
    return {"x": rng.standard_normal((batch, SIZES[0])).astype(np.float32)}


@pytest.fixture(scope="module")
def single():
    return compiler.compile(mlp(), input_shapes={"x": (8, 64)})


def test_a_pipeline_gives_the_single_device_bits(single):
    exe = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="pipeline")
    assert isinstance(exe, MultiDeviceExecutable) and exe.parallel == "pipeline"
    assert [p.device for p in exe.parts] == ["cpu:0", "cpu:1"]
    assert exe.parts[1].inputs == ["wire0"] and exe.parts[0].outputs == ["wire0"]
    assert exe.placement["why"] == "pipeline: asked for"
    assert "split-devices: 2 stage(s)" in exe.placement["explain"]
    items = [feeds(8) for _ in range(7)]
    np.testing.assert_array_equal(exe.run(items[0])["y"], single.run(items[0])["y"])
    for got, f in zip(exe.run_many(items), items):  # the stages at once, items streaming
        np.testing.assert_array_equal(got["y"], single.run(f)["y"])
    x = items[0]["x"]
    np.testing.assert_array_equal(exe(x), single(x))
    assert {k["device"] for k in exe.kernels} == {"cpu:0", "cpu:1"}


def test_micro_batches_stream_through_the_stages(single):
    exe = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="pipeline",
                           microbatch=2)
    assert exe.micro == 2 and exe.batch == 8
    assert all(p.exe.inputs[0][2][0] == 2 for p in exe.parts if p.inputs == ["x"])  # stages compiled for 2 rows
    f = feeds(8)  # kernels for 2 rows may sum in another order than those for 8: close, not equal bits
    np.testing.assert_allclose(exe.run(f)["y"], single.run(f)["y"], rtol=1e-5, atol=1e-6)
    items = [feeds(8) for _ in range(3)]
    for got, f in zip(exe.run_many(items), items):
        np.testing.assert_allclose(got["y"], single.run(f)["y"], rtol=1e-5, atol=1e-6)


def test_replicas_share_an_uneven_batch():
    exe = compiler.compile(mlp(), input_shapes={"x": (5, 64)}, devices=["cpu:0", "cpu:1"], parallel="data")
    assert exe.parallel == "data"
    assert [p.rows for p in exe.parts] == [(0, 3), (3, 5)]
    one = compiler.compile(mlp(), input_shapes={"x": (5, 64)})
    f = feeds(5)
    got = exe.run(f)["y"]
    assert got.shape == (5, 10)
    np.testing.assert_allclose(got, one.run(f)["y"], rtol=1e-5, atol=1e-6)
    items = [feeds(5) for _ in range(4)]
    for out, f in zip(exe.run_many(items), items):
        np.testing.assert_allclose(out["y"], one.run(f)["y"], rtol=1e-5, atol=1e-6)


def test_auto_shares_a_symbolic_batch_and_says_why():
    exe = compiler.compile(mlp(), input_shapes={"x": (4, 64)}, devices="cpu:0,cpu:1")
    assert exe.parallel == "data"
    assert exe.placement["why"].startswith("data: the batch of 4 splits over 2 replicas")
    assert {p.name for p in exe.parts} == {"replica-2"}  # two replicas of 2 rows: one artifact,
    assert len({id(p.exe) for p in exe.parts}) == 2  # loaded once per device (its own thread pools)


def test_auto_pipelines_a_fixed_batch_and_says_why():
    exe = compiler.compile(mlp(batch=4), devices="cpu:0,cpu:1")
    assert exe.parallel == "pipeline"
    assert "do not all lead with one symbolic batch dimension" in exe.placement["why"]


def test_auto_pipelines_when_a_replica_does_not_fit(single):
    # each device holds 95% of the weights: no replica fits, two stages do (with room for any packing)
    memory = {"cpu:0": WEIGHT_BYTES * 95 // 100, "cpu:1": WEIGHT_BYTES * 95 // 100}
    exe = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", device_memory=memory)
    assert exe.parallel == "pipeline" and len(exe.parts) == 2
    assert "but a replica of 4 rows needs" in exe.placement["why"]
    for p in exe.parts:
        m = p.exe.manifest.memory
        assert m["weights_bytes"] + m["arena_bytes"] <= memory[p.device]
    f = feeds(8)
    np.testing.assert_array_equal(exe.run(f)["y"], single.run(f)["y"])


def test_data_parallelism_needs_a_symbolic_batch():
    with pytest.raises(OptionError, match="data parallelism needs a batch to share"):
        compiler.compile(mlp(batch=4), devices="cpu:0,cpu:1", parallel="data")
    with pytest.raises(OptionError, match="microbatch needs a model with a symbolic batch"):
        compiler.compile(mlp(batch=4), devices="cpu:0,cpu:1", microbatch=2)
    with pytest.raises(OptionError, match="does not divide the batch 8"):
        compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", microbatch=3)
    with pytest.raises(OptionError, match="needs every input's shape"):
        compiler.compile(mlp(), devices="cpu:0,cpu:1", parallel="pipeline")


def test_too_little_memory_fails_and_leaves_nothing(tmp_path):
    out = tmp_path / "m.kiln"
    with pytest.raises(LimitError, match="more than any device holds"):
        compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="pipeline",
                         device_memory={"cpu:0": 4096, "cpu:1": 4096}, output=out)
    assert not out.exists() and os.listdir(tmp_path) == []
    with pytest.raises(LimitError, match="replica of 4 rows needs"):
        compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="data",
                         device_memory={"cpu:0": 4096, "cpu:1": 4096}, output=out)
    assert os.listdir(tmp_path) == []


def test_inputs_are_checked_before_native_code_runs():
    exe = compiler.compile(mlp(batch=4), devices="cpu:0,cpu:1", parallel="pipeline")
    with pytest.raises(InputError, match=r"has shape \[3, 64\], the model takes f32\[4, 64\]"):
        exe.run(feeds(3))
    with pytest.raises(InputError, match="element type float64"):
        exe.run_many([feeds(4), {"x": np.zeros((4, 64))}])
    with pytest.raises(InputError, match="missing input"):
        exe.run({})


def test_saved_artifacts_load_and_refuse_tampering(tmp_path, single):
    exe = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="pipeline",
                           output=tmp_path / "m.kiln")
    loaded = compiler.load(tmp_path / "m.kiln")
    assert isinstance(loaded, MultiDeviceExecutable) and loaded.parallel == "pipeline"
    f = feeds(8)
    np.testing.assert_array_equal(loaded.run(f)["y"], single.run(f)["y"])
    copy = exe.save(tmp_path / "copy.kiln")
    np.testing.assert_array_equal(compiler.load(copy).run(f)["y"], single.run(f)["y"])

    index_path = tmp_path / "copy.kiln" / "devices.json"
    index = json.loads(index_path.read_text())
    bad = json.loads(json.dumps(index))
    bad["parts"][0]["path"] = "../m.kiln"
    index_path.write_text(json.dumps(bad))
    with pytest.raises(ArtifactError, match="is not a plain name"):
        compiler.load(copy)
    # a part swapped for another artifact
    shutil.rmtree(tmp_path / "copy.kiln" / index["parts"][0]["path"])
    shutil.copytree(tmp_path / "m.kiln" / index["parts"][1]["path"], tmp_path / "copy.kiln" / index["parts"][0]["path"])
    index_path.write_text(json.dumps(index))
    with pytest.raises(ArtifactError, match="not the one this index was written with"):
        compiler.load(copy)
    index_path.write_text("{not json")
    with pytest.raises(ArtifactError, match="cannot read devices.json"):
        compiler.load(copy)
    index["format"], index["kiln_version"] = 99, "9.9.9"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ArtifactError, match=r"format 99 \(Kiln 9.9.9 wrote it\); this Kiln reads format 1"):
        compiler.load(copy)


def test_options_are_checked():
    m = mlp(batch=4)
    with pytest.raises(OptionError, match="at least two devices"):
        compiler.compile(m, devices="cpu:0")
    with pytest.raises(OptionError, match="named twice"):
        compiler.compile(m, devices="cpu:0,cpu:0")
    with pytest.raises(OptionError, match="expected a name like"):
        compiler.compile(m, devices="cpu0,cpu1")
    with pytest.raises(OptionError, match="parallel must be one of"):
        compiler.compile(m, devices="cpu:0,cpu:1", parallel="tensor")
    with pytest.raises(OptionError, match="microbatch applies to pipeline"):
        DeviceOptions(("cpu:0", "cpu:1"), parallel="data", microbatch=2)
    with pytest.raises(OptionError, match="not one of the devices"):
        compiler.compile(m, devices="cpu:0,cpu:1", device_memory={"cpu:2": 1 << 20})
    with pytest.raises(OptionError, match="quantize: not supported with devices yet"):
        compiler.compile(m, devices="cpu:0,cpu:1", quantize="int8-dynamic")
    names = [f"cpu:{i}" for i in range(len(usable_cores()) + 1)]
    with pytest.raises(OptionError, match="at most"):
        cpu_cores(names)


def test_cores_are_dealt_out_evenly():
    cores = usable_cores()
    dealt = cpu_cores(["cpu:0", "cpu:1"][:len(cores)])
    assert sorted(c for cs in dealt.values() for c in cs) == cores[:sum(len(c) for c in dealt.values())]
    assert max(map(len, dealt.values())) - min(map(len, dealt.values())) <= 1


def test_cli_devices_compile_inspect_run_and_dump(tmp_path, capsys):
    assert main(["devices", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in listed if d["kind"] == "cpu"] == [f"cpu:{i}" for i in range(len(usable_cores()))]
    model = tmp_path / "mlp.onnx"
    model.write_bytes(mlp(batch=4).SerializeToString())
    out = tmp_path / "mlp.kiln"
    assert main(["compile", str(model), "-o", str(out), "--devices", "cpu:0,cpu:1", "--parallel", "pipeline"]) == 0
    text = capsys.readouterr().out
    assert "for 2 devices" in text and "pipeline: asked for" in text and "stage1-cpu1 on cpu:1" in text
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "pipeline over 2 devices" in shown and "stage1-cpu1 on cpu:1: " in shown and "kernel(s), weights" in shown
    assert "cut      cpu:0 | cpu:1 after " in shown
    assert main(["inspect", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["device"] for p in doc["parts"]] == ["cpu:0", "cpu:1"] and "arena_bytes" in doc["parts"][0]["memory"]
    assert main(["run", str(out)]) == 0
    assert "y: float32[4, 10]" in capsys.readouterr().out
    assert main(["dump", str(model), "--devices", "cpu:0,cpu:1"]) == 0
    captured = capsys.readouterr()
    assert 'on "cpu:1"' in captured.out and "kiln.Transfer" in captured.out
    assert "split-devices:" in captured.err
    svg = tmp_path / "plan.svg"
    assert main(["dump", str(model), "--devices", "cpu:0,cpu:1", "--partition", str(svg), "--explain-placement"]) == 0
    assert "cpu:0 | cpu:1: balanced after" in capsys.readouterr().out
    import xml.etree.ElementTree as ET

    texts = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert "cpu:0" in texts and "cpu:1" in texts and any(t.startswith("Transfer ") for t in texts)
    assert main(["dump", str(model), "--partition", str(svg)]) != 0
    assert "go with --devices" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compile", str(model), "-o", str(tmp_path / "x.kiln"), "--device-memory", "cpu:0=1x"])
    assert main(["compile", str(model), "-o", str(tmp_path / "y.kiln"), "--microbatch", "2"]) != 0
    assert "go with --devices" in capsys.readouterr().err


class _Stage:
    """A stand-in stage: ``fn`` on its input, recording when items start and finish."""

    def __init__(self, inp, out, fn, log, delay=0.0):
        self.inp, self.out, self.fn, self.log, self.delay = inp, out, fn, log, delay
        self.kernels, self.fallback = [], []

    def run(self, feeds):
        import time

        self.log.append(("start", self.out))
        time.sleep(self.delay)
        r = {self.out: self.fn(feeds[self.inp])}
        self.log.append(("done", self.out))
        return r


def _fake_pipeline(stages):
    from compiler.runtime.multidevice import Part

    index = {"parallel": "pipeline", "model": "fake", "outputs": ["y"],
             "inputs": [{"name": "x", "dtype": "f32", "shape": [1]}],
             "devices": [{"name": f"cpu:{i}", "cores": []} for i in range(len(stages))]}
    parts = [Part(f"stage{i}", f"cpu:{i}", (), [s.inp], [s.out], None, s) for i, s in enumerate(stages)]
    return MultiDeviceExecutable("fake", index, parts)


def test_streaming_keeps_few_items_in_flight_and_surfaces_errors():
    log: list = []

    def second(w):
        if w[0] == 4.0:
            raise ValueError("stage 1 failed on item 3")
        return w * 2

    exe = _fake_pipeline([_Stage("x", "w", lambda x: x + 1, log), _Stage("w", "y", second, log, delay=0.003)])
    items = [{"x": np.array([i], np.float32)} for i in range(12)]
    with pytest.raises(ValueError, match="stage 1 failed on item 3"):
        exe.run_many(items)
    good = [f for f in items if f["x"][0] != 3]
    log.clear()
    outs = exe.run_many(good)  # the device threads still work after an error
    assert [float(o["y"][0]) for o in outs] == [(float(f["x"][0]) + 1) * 2 for f in good]
    ahead = most = 0  # items the first stage started that the last has not finished
    for event, what in log:
        if what == "w" and event == "start":
            ahead += 1
        elif what == "y" and event == "done":
            ahead -= 1
        most = max(most, ahead)
    assert most <= 2 * len(exe.parts)
    exe.close()


def test_a_product_too_large_for_a_device_is_cut_into_pieces(single):
    memory = {"cpu:0": 90_000, "cpu:1": 90_000}  # w1 (64 KiB) is over half of it: two pieces of 64 columns
    exe = compiler.compile(mlp(), input_shapes={"x": (8, 64)}, devices="cpu:0,cpu:1", parallel="pipeline",
                           device_memory=memory)
    assert list(exe.placement["split_products"].values()) == [2]
    for p in exe.parts:
        m = p.exe.manifest.memory
        assert m["weights_bytes"] + m["arena_bytes"] <= memory[p.device]
    f = feeds(8)
    np.testing.assert_allclose(exe.run(f)["y"], single.run(f)["y"], rtol=1e-5, atol=1e-6)


def test_device_threads_stop_with_their_executable():
    import gc

    exe = compiler.compile(mlp(batch=4), devices="cpu:0,cpu:1", parallel="pipeline")
    exe.run(feeds(4))
    threads = [t._thread for t in exe._threads.values()]
    assert all(t.is_alive() for t in threads)
    del exe
    gc.collect()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads)


def _task_cores() -> dict[int, str]:
    """This process's threads (Linux task ids) and the cores each may run on."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(tid)] = line.split(":", 1)[1].strip()
        except OSError:
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or len(usable_cores()) < 2, reason="Linux, 2 cores")
def test_a_parts_pool_threads_start_on_its_devices_cores(tmp_path):
    # two threads per part on one-core devices: each part's own pool threads start on its device's thread
    # and inherit that core (the GEMM's pool included)
    compiler.compile(mlp(), input_shapes={"x": (64, 64)}, devices="cpu:0,cpu:1", parallel="pipeline",
                     output=tmp_path / "m.kiln")
    f = feeds(64)
    want = compiler.compile(mlp(), input_shapes={"x": (64, 64)}, nthreads=1).run(f)["y"]
    before = set(_task_cores())
    exe = compiler.load(tmp_path / "m.kiln", nthreads=2)
    for _ in range(3):
        np.testing.assert_array_equal(exe.run(f)["y"], want)
        for got in exe.run_many([f, f, f]):
            np.testing.assert_array_equal(got["y"], want)
    new = {tid: cores for tid, cores in _task_cores().items() if tid not in before}
    cores = {str(c) for p in exe.parts for c in p.cores}
    # each device's pool threads are pinned to its core (threads of other libraries may come and go:
    # only the pinned ones are Kiln's parts')
    assert {c for c in new.values() if c in cores} == cores, new


@pytest.mark.parametrize("batch", [3, 1, 0])
def test_edge_batches_give_the_single_device_outputs(batch):
    # replicas of 2 and 1 rows (batch 3), one row, and no row at all, natively
    one = compiler.compile(mlp(), input_shapes={"x": (batch, 64)})
    f = feeds(batch)
    want = one.run(f)["y"]
    pipe = compiler.compile(mlp(), input_shapes={"x": (batch, 64)}, devices="cpu:0,cpu:1", parallel="pipeline")
    got = pipe.run(f)["y"]
    assert got.shape == (batch, 10)
    np.testing.assert_array_equal(got, want)
    if batch >= 2:
        data = compiler.compile(mlp(), input_shapes={"x": (batch, 64)}, devices="cpu:0,cpu:1", parallel="data")
        assert [p.rows for p in data.parts] == [(0, 2), (2, 3)]
        np.testing.assert_allclose(data.run(f)["y"], want, rtol=1e-5, atol=1e-6)
