"""The benchmark suite's models on two CPU devices: as a pipeline, every one gives the single-device
artifact's bits; as replicas (the zoo models, exported with a symbolic batch), its numbers."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import compiler
from compiler.tools import zoo

DEVICES = "cpu:0,cpu:1"
LIGHT = ["light:resnet50", "light:squeezenet", "light:shufflenet", "light:inception_v1", "light:densenet121"]
#: zoo models as the suite sizes them, and the batch their replicas share
ZOO = {"zoo:bert?seq=128": 2, "zoo:mobilenetv2?resolution=224": 2, "zoo:mlp": 8}


def _feeds(exe, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, dtype, shape in exe.inputs:
        if dtype.np == np.int64:  # token ids, and an attention mask of ones
            out[name] = (np.ones(shape, np.int64) if "mask" in name else rng.integers(0, 100, shape).astype(np.int64))
        else:
            out[name] = rng.standard_normal(shape).astype(dtype.np)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("spec", LIGHT)
def test_light_models_as_a_pipeline_give_the_single_device_bits(spec):
    one = compiler.compile(spec)
    exe = compiler.compile(spec, devices=DEVICES)
    assert exe.parallel == "pipeline"  # their batch is fixed
    f = _feeds(one)
    want = one.run(f)
    for got in exe.run_many([f, f]):
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(ZOO))
def test_zoo_models_as_pipeline_and_replicas(spec):
    name, params = zoo.parse_spec(spec)
    params.pop("opset", None)
    proto = onnx.load_from_string(zoo.export(name, dynamic_batch=True, **params)[0])
    batch = ZOO[spec]
    shapes = {v.name: (batch, *[d.dim_value for d in v.type.tensor_type.shape.dim[1:]]) for v in proto.graph.input}
    one = compiler.compile(proto, input_shapes=shapes)
    f = _feeds(one)
    want = one.run(f)
    for parallel in ("pipeline", "data"):
        exe = compiler.compile(proto, input_shapes=shapes, devices=DEVICES, parallel=parallel)
        got = exe.run(f)
        for k in want:
            if parallel == "pipeline":
                np.testing.assert_array_equal(got[k], want[k])
            else:  # replicas run kernels compiled for fewer rows
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
        exe.close()
