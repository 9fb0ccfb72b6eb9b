"""Real models over two CPU devices: a model-zoo network and architectures exported from PyTorch with
a symbolic batch, as a pipeline (the single-device artifact's bits) and as replicas sharing the batch
(its numbers, to fp32 rounding: a replica's kernels are compiled for fewer rows), and against
PyTorch."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import compiler
from compiler.errors import LimitError
from compiler.tools import archs

DEVICES = "cpu:0,cpu:1"


def test_squeezenet_as_a_pipeline_gives_the_single_device_bits():
    exe = compiler.compile("light:squeezenet", devices=DEVICES)
    one = compiler.compile("light:squeezenet")
    assert exe.parallel == "pipeline" and len(exe.parts) == 2
    assert "the batch cannot be shared" in exe.placement["why"]
    rng = np.random.default_rng(1)
    name, _, shape = one.inputs[0]
    items = [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(3)]
    for got, f in zip(exe.run_many(items), items):
        want = one.run(f)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("name", ["resnet18", "gpt2"])
def test_pytorch_architectures_on_two_devices(name):
    onnx_bytes, _, module = archs.export_arch(name)
    proto = onnx.load_from_string(onnx_bytes)
    _, feeds, _ = archs.build(name, 4)
    shapes = {k: v.shape for k, v in feeds.items()}
    one = compiler.compile(proto, input_shapes=shapes)
    want = one.run(feeds)
    torch_out = archs.torch_outputs(module, feeds)
    for parallel in ("pipeline", "data"):
        exe = compiler.compile(proto, input_shapes=shapes, devices=DEVICES, parallel=parallel)
        assert exe.parallel == parallel
        got = exe.run(feeds)
        for i, k in enumerate(one.output_names):
            if parallel == "pipeline":
                np.testing.assert_array_equal(got[k], want[k])
            else:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got[k], torch_out[i], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_vgg19_fits_two_devices_of_320_mib_and_not_one(tmp_path):
    # fc6's weights alone are 392 MiB: split-products cuts them in three, split-devices places the rest
    limit = 320 << 20
    with pytest.raises(LimitError, match="392.00 MiB; the memory limit is 320.00 MiB"):
        compiler.compile("light:vgg19", memory_limit=limit)
    exe = compiler.compile("light:vgg19", devices=DEVICES, device_memory={"cpu:0": limit, "cpu:1": limit})
    assert len(exe.parts) == 2 and list(exe.placement["split_products"].values()) == [3]
    for p in exe.parts:
        m = p.exe.manifest.memory
        assert m["weights_bytes"] + m["arena_bytes"] <= limit
    one = compiler.compile("light:vgg19")
    x = {"data_0": np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    got, want = exe.run(x), one.run(x)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7)
