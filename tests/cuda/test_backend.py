"""``compile(..., target="cuda")`` end to end in numba's CUDA simulator: models against the CPU
artifact, every convolution path, fallback steps on the host, artifacts saved and loaded, and the
errors (wrong inputs, no GPU, a corrupt artifact)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import compiler
from compiler.driver import FallbackWarning
from compiler.errors import InputError, UnsupportedError
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.runtime.artifact import ArtifactError
from compiler.tools import zoo


def _against_cpu(model, feeds, rtol=1e-4, **kw):
    exe = compiler.compile(model, target="cuda", **kw)
    want = compiler.compile(model, **kw).run(feeds)
    got = exe.run(feeds)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=rtol * max(1.0, float(np.abs(want[k]).max())))
    return exe


@pytest.mark.parametrize("spec", ["zoo:mlp?sizes=32x16x8", "zoo:mlp?batch=3,sizes=20x12x5",
                                  "zoo:bert?seq=4,vocab=20,hidden=8,heads=2,layers=1"])
def test_small_models_match_the_cpu(spec):
    proto, feeds, _ = zoo.load(spec)
    exe = _against_cpu(proto, feeds)
    assert exe.fallback == [] and exe.launch_count >= 2


@pytest.mark.slow
def test_a_tiny_cnn_matches_the_cpu():
    """ResNet blocks: 7x7 stride-2 stem (im2col), max pooling, 1x1 (the image as the column matrix) and 3x3
    convolutions with fused ReLUs, residual adds, global pooling and the classifier."""
    proto, feeds, _ = zoo.load("zoo:resnet?layers=1x1x1x1,resolution=16,width=4,classes=10")
    exe = _against_cpu(proto, feeds)
    notes = " ".join(n for k in exe.kernels for n in k["notes"])
    assert "im2col" in notes and "+ ReLU" in notes


CONV = """graph @g(%x: f32[2,{c},7,6]) -> (y: f32[{shape}]) {{
  %w = const f32[{m},{cg},{kh},{kw}] dense<{w}>
  %b = const f32[{m}] dense<{b}>
  %0 = Conv(%x, %w, %b) {{group={group}, pads=[{p}, 0, {p}, 1], strides=[{s}, 1], dilations=[1, {d}]}} : f32[{shape}]
  %1 = Relu(%0) : f32[{shape}]
  return y=%1
}}"""


@pytest.mark.parametrize("c,m,group,k,p,s,d", [
    (3, 4, 1, 3, 1, 2, 1),    # im2col + GEMM, bias and ReLU inside it
    (4, 5, 1, 1, 0, 1, 1),    # 1x1: still im2col (the padding on the right)
    (4, 4, 4, 3, 1, 1, 2),    # depthwise, dilated: the direct kernel
    (6, 4, 2, 3, 0, 2, 1),    # grouped
])
def test_convolutions(c, m, group, k, p, s, d):
    rng = np.random.default_rng(c + m + group)
    cg = c // group
    oh = (7 + 2 * p - k) // s + 1
    ow = 6 + 1 - (d * (k - 1) + 1) + 1
    text = CONV.format(c=c, m=m, cg=cg, kh=k, kw=k, group=group, p=p, s=s, d=d, shape=f"2,{m},{oh},{ow}",
                       w=np.round(rng.standard_normal((m, cg, k, k)), 3).tolist(),
                       b=np.round(rng.standard_normal(m), 3).tolist())
    g = parse(text)
    x = rng.standard_normal((2, c, 7, 6)).astype(np.float32)
    want = interpret(parse(text), {"x": x})["y"]
    got = compiler.compile(g, target="cuda").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


POINTWISE = """graph @g(%x: f32[2,4,3,5]) -> (y: f32[2,6,3,5]) {
  %w = const f32[6,4,1,1] dense<W>
  %0 = Conv(%x, %w) : f32[2,6,3,5]
  return y=%0
}""".replace("W", str(np.linspace(-1, 1, 24).reshape(6, 4, 1, 1).round(3).tolist()))


def test_a_pointwise_convolution_reads_the_image_itself():
    exe = compiler.compile(parse(POINTWISE), target="cuda")
    assert not any("im2col" in n for k in exe.kernels for n in k["notes"])
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})["y"], interpret(parse(POINTWISE), {"x": x})["y"], rtol=1e-5)


MIXED = """graph @g(%x: f32[2,3]) -> (y: f32[2,3], n: i64[2,?]) {
  %0 = Exp(%x) : f32[2,3]
  %1 = NonZero(%0) : i64[2,?]
  %2 = Relu(%0) : f32[2,3]
  return y=%2, n=%1
}"""


def test_nodes_without_a_gpu_kernel_run_on_the_host_and_are_reported(tmp_path):
    with pytest.warns(FallbackWarning, match="no CUDA kernel"):
        exe = compiler.compile(parse(MIXED), target="cuda", output=str(tmp_path / "m.kiln"))
    assert [f["op"] for f in exe.fallback] == ["NonZero"]
    x = np.array([[1, -2, 3], [0, 5, -1]], np.float32)
    got = exe.run({"x": x})
    want = interpret(parse(MIXED), {"x": x})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
    np.testing.assert_array_equal(got["n"], want["n"])
    with pytest.raises(UnsupportedError, match="NonZero"):
        compiler.compile(parse(MIXED), target="cuda", fallback=False)


def test_artifact_round_trip_and_refusals(tmp_path):
    proto, feeds, _ = zoo.load("zoo:mlp?sizes=32x16x8")
    path = str(tmp_path / "mlp.kiln")
    exe = compiler.compile(proto, target="cuda", output=path)
    assert sorted(os.listdir(path)) == ["cuda.json", "kernels.py", "model.kir", "weights.bin"]
    manifest = json.load(open(os.path.join(path, "cuda.json")))
    assert manifest["target"]["kind"] == "cuda" and manifest["format"] == "kiln-cuda-artifact"
    loaded = compiler.load(path)
    np.testing.assert_array_equal(loaded.run(feeds)["output"], exe.run(feeds)["output"])
    copy = loaded.save(str(tmp_path / "copy.kiln"))
    np.testing.assert_array_equal(compiler.load(copy)(feeds["x"]), exe.run(feeds)["output"])
    # wrong inputs are refused before anything runs
    with pytest.raises(InputError, match="shape"):
        loaded.run({"x": np.zeros((2, 32), np.float32)})
    with pytest.raises(InputError, match="element type"):
        loaded.run({"x": feeds["x"].astype(np.float64)})
    # a manifest that drops a checksum
    m = json.load(open(os.path.join(copy, "cuda.json")))
    digest = m["files"].pop("kernels.py")
    json.dump(m, open(os.path.join(copy, "cuda.json"), "w"))
    with pytest.raises(ArtifactError, match="checksums"):
        compiler.load(copy)
    m["files"]["kernels.py"] = digest
    json.dump(m, open(os.path.join(copy, "cuda.json"), "w"))
    # a tampered kernel file
    with open(os.path.join(copy, "kernels.py"), "a") as f:
        f.write("\nimport os\n")
    with pytest.raises(ArtifactError, match="kernels.py"):
        compiler.load(copy)


def test_a_cuda_artifact_without_a_gpu_says_so(tmp_path, monkeypatch):
    proto, _, _ = zoo.load("zoo:mlp?sizes=32x16x8")
    path = str(tmp_path / "mlp.kiln")
    compiler.compile(proto, target="cuda", output=path)
    from numba import cuda

    monkeypatch.setattr(cuda, "is_available", lambda: False)
    with pytest.raises(ArtifactError, match="no usable CUDA GPU"):
        compiler.load(path)


def test_device_arrays_in_and_out():
    """A caller's device array is read where it is (no copy into Kiln's input buffer, which keeps
    what it held); the results come back as device arrays."""
    from numba import cuda

    proto, feeds, _ = zoo.load("zoo:mlp?sizes=32x16x8")
    exe = compiler.compile(proto, target="cuda")
    want = exe.run(feeds)["output"]
    flat = exe._staging[0][0]
    flat.copy_to_device(np.full(flat.size, np.nan, flat.dtype))  # what a copy would overwrite
    got = exe.run({"x": cuda.to_device(feeds["x"])}, device_outputs=True)["output"]
    assert hasattr(got, "copy_to_host")
    np.testing.assert_array_equal(got.copy_to_host(), want)
    assert np.isnan(flat.copy_to_host()).all()
    np.testing.assert_array_equal(exe.run(feeds)["output"], want)  # host arrays: copied in, as before


POOL = """graph @g(%x: f32[2,3,7,6]) -> (y: f32[{shape}]) {{
  %0 = {op}(%x) {{kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 1]{extra}}} : f32[{shape}]
  return y=%0
}}"""


@pytest.mark.parametrize("op,extra,shape", [("MaxPool", "", "2,3,4,6"), ("AveragePool", "", "2,3,4,6"),
                                            ("AveragePool", ", count_include_pad=1", "2,3,4,6"),
                                            ("MaxPool", ", ceil_mode=1", "2,3,4,6")])
def test_pooling_a_thread_per_output(op, extra, shape):
    text = POOL.format(op=op, extra=extra, shape=shape)
    x = np.random.default_rng(3).standard_normal((2, 3, 7, 6)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan  # MaxPool propagates NaN, as the reference does
    exe = compiler.compile(parse(text), target="cuda")
    assert any("a thread per output element" in n for k in exe.kernels for n in k["notes"])
    np.testing.assert_allclose(exe.run({"x": x})["y"], interpret(parse(text), {"x": x})["y"], rtol=1e-5)


SPLIT = """graph @g(%x: f32[16,2048], %y: f32[2048,6]) -> (g: f32[16,8], m: f32[16,6]) {
  %w = const f32[8,2048] dense<@W@>
  %b = const f32[8] dense<@B@>
  %0 = Gemm(%x, %w, %b) {transB=1, alpha=0.5, beta=2.0} : f32[16,8]
  %1 = Relu(%0) : f32[16,8]
  %2 = MatMul(%x, %y) : f32[16,6]
  return g=%1, m=%2
}"""


@pytest.mark.slow
def test_a_long_k_is_split_across_blocks():
    """Products too small for the GPU in M x N but long in K: slices of K as a batch into scratch, then a
    kernel adding them with the bias (broadcast) and the ReLU."""
    from compiler.codegen.cuda.gemm import GemmCall, split_k

    rng = np.random.default_rng(5)
    text = SPLIT.replace("@W@", str(rng.standard_normal((8, 2048)).round(2).tolist())) \
        .replace("@B@", str(rng.standard_normal(8).round(2).tolist()))
    exe = compiler.compile(parse(text), target="cuda")
    notes = [n for k in exe.kernels for n in k["notes"]]
    assert sum("split K in 8" in n for n in notes) == 2 and "the 8 slices of K added, the bias, ReLU" in notes
    feeds = {"x": rng.standard_normal((16, 2048)).astype(np.float32),
             "y": rng.standard_normal((2048, 6)).astype(np.float32)}
    got, want = exe.run(feeds), interpret(parse(text), feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-3)
    # the decision: only where M x N leaves the GPU idle, K is long and divides evenly
    assert split_k(GemmCall(512, 49, 4608, (4608, 1), (49, 1), (49, 1))) == 8
    assert split_k(GemmCall(4096, 4096, 4096, (4096, 1), (4096, 1), (4096, 1))) == 1
    assert split_k(GemmCall(16, 8, 2047, (2047, 1), (8, 1), (8, 1))) == 1
    assert split_k(GemmCall(2, 8, 4096, (4096, 1), (8, 1), (8, 1))) == 1  # the GEMV kernel's


ROWS = """graph @g(%x: f32[3,5,33], %s: f32[5,33], %b: f32[5,33], %l: f32[33]) -> (sm: f32[3,5,33], ln: f32[3,5,33], lo: f32[3,5,33], m: f32[3,5,33]) {
  %0 = Softmax(%x) : f32[3,5,33]
  %1 = LayerNormalization(%x, %s, %b) {axis=1, epsilon=0.001} : f32[3,5,33]
  %2 = LayerNormalization(%x, %l) {axis=-1} : f32[3,5,33]
  %3 = Softmax(%x) {axis=1} : f32[3,5,33]
  return sm=%0, ln=%1, lo=%2, m=%3
}"""


@pytest.mark.slow
def test_rows_a_block_of_threads_each():
    """Softmax and LayerNormalization over trailing axes run a block per row (rows longer than the block,
    normalized over two axes, without a bias); Softmax along a middle axis keeps the loop-form kernel."""
    exe = compiler.compile(parse(ROWS), target="cuda")
    notes = [n for k in exe.kernels for n in k["notes"]]
    assert sum("threads per row" in n for n in notes) == 3, notes
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((3, 5, 33)).astype(np.float32) * 3,
             "s": rng.standard_normal((5, 33)).astype(np.float32), "b": rng.standard_normal((5, 33)).astype(np.float32),
             "l": rng.standard_normal(33).astype(np.float32)}
    feeds["x"][1, 2, 4] = np.nan  # the rows that hold it are NaN everywhere, as in the reference
    got, want = exe.run(feeds), interpret(parse(ROWS), feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", ["light:resnet50", "light:squeezenet", "light:shufflenet", "light:inception_v1",
                                   "light:densenet121"])
def test_the_suite_models_compile_for_cuda_with_every_node_on_the_gpu(model):
    """(Compiled only: at 224 x 224 the simulator would take hours; benchmarks/gpu_check.py runs models on a GPU.)"""
    exe = compiler.compile(model, target="cuda", fallback=False)
    assert exe.launch_count > 40 and exe.fallback == []
