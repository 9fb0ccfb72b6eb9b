"""Real architectures (``compiler/tools/archs/``) through the whole path: PyTorch export with a
symbolic batch, one compile at -O2 with the batch left symbolic (``compiler.specialize``: native code
per batch size, compiled at its first run), run at batch 1 and batch 8 from that one executable; the
outputs checked against ONNX Runtime on the same bytes and against the PyTorch module.

Which ops still run in the reference interpreter is recorded in ``KNOWN_FALLBACKS``: a model's
fallback ops must stay within it, so native work can only shrink it (remove what became native).
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import compiler
from compiler.driver import FallbackWarning
from compiler.specialize import Specializing
from compiler.tools import archs

# fp32 tolerance, elementwise: |kiln - ref| <= ATOL + RTOL * |ref| (measured today: at most 3e-6
# absolute on outputs of scale 1-5, 9e-5 on YOLO's box coordinates of scale 356)
RTOL, ATOL = 1e-3, 1e-4

#: arch -> ops that run in the interpreter at -O2 for a given batch size, as measured (none since
#: commit 9abf735; LSTM, GRU and RNN fell back before it). A new fallback fails the test; native work that
#: removes one should remove it here.
KNOWN_FALLBACKS: dict[str, set[str]] = {
    "resnet18": set(), "mobilenetv3": set(), "efficientnet_b0": set(), "efficientnet_b0_ceil_pool": set(),
    "convnext": set(), "regnet": set(), "vit": set(), "swin": set(), "gpt2": set(), "llama": set(),
    "bert": set(), "bert_opset11": set(), "unet": set(), "yolo": set(), "lstm": set(), "gru": set(),
    "rnn": set(), "wav2vec2": set(),
}

#: archs whose case takes more than about 5 s on the 2-core development machine (two compiles)
SLOW = {"efficientnet_b0", "swin", "yolo"}

BATCHES = (1, 8)


def _params():
    out = []
    for name in archs.ARCHS:
        marks = [pytest.mark.slow] if name in SLOW else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def _check(name: str, what: str, got: list[np.ndarray], ref: list[np.ndarray]) -> None:
    assert len(got) == len(ref), f"{name}: {len(got)} outputs, {what} has {len(ref)}"
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape and g.dtype == r.dtype, \
            f"{name} output {i}: Kiln {g.dtype}{list(g.shape)}, {what} {r.dtype}{list(r.shape)}"
        err = float(np.max(np.abs(g.astype(np.float64) - r), initial=0.0))
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{name} output {i}: Kiln vs {what}, max abs error {err:.3g}")


@pytest.mark.parametrize("name", _params())
def test_arch_compiles_natively_and_matches_onnxruntime_and_torch(name):
    onnx_bytes, _, module = archs.export_arch(name)
    proto = onnx.load_from_string(onnx_bytes)
    for vi in list(proto.graph.input) + list(proto.graph.output):
        assert vi.type.tensor_type.shape.dim[0].dim_param == "batch", f"{vi.name}: the batch is not symbolic"
    sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # recorded from the executables below
        exe = compiler.compile(proto, 2)
        assert isinstance(exe, Specializing), f"{name}: the symbolic batch was not kept"
        for batch in BATCHES:
            _, feeds, _ = archs.build(name, batch)
            out = exe.run(feeds)
            got = [out[n] for n in exe.output_names]
            assert got[0].shape[0] == batch
            _check(name, f"ONNX Runtime (batch {batch})", got, sess.run(None, feeds))
            _check(name, f"PyTorch (batch {batch})", got, archs.torch_outputs(module, feeds))
    assert sorted(s["batch"] for s, _ in exe.specializations) == sorted(BATCHES)
    fallback = {f["op"] for _, e in exe.specializations for f in e.fallback}
    known = KNOWN_FALLBACKS[name]
    assert fallback <= known, (f"{name}: new interpreter fallbacks {sorted(fallback - known)} "
                               f"(known: {sorted(known)})")


# what each arch is in the suite for: ops its export must contain (and, for bert_opset11, must not)
EXPECTED_OPS = {
    "resnet18": {"Conv", "BatchNormalization", "MaxPool", "GlobalAveragePool", "Gemm"},
    "mobilenetv3": {"HardSwish", "HardSigmoid", "GlobalAveragePool", "Mul"},
    "efficientnet_b0": {"Sigmoid", "Mul", "GlobalAveragePool"},
    "efficientnet_b0_ceil_pool": {"AveragePool"},
    "convnext": {"LayerNormalization", "Transpose", "Erf", "ReduceMean", "Sqrt"},
    "regnet": {"Conv", "Sigmoid", "GlobalAveragePool"},
    "vit": {"Concat", "Expand", "Softmax", "LayerNormalization", "Erf"},
    "swin": {"Gather", "Softmax", "Transpose", "Reshape", "Slice", "Concat"},
    "gpt2": {"Where", "Equal", "Tanh", "Softmax", "Range"},
    "llama": {"Trilu", "Pow", "ReduceMean", "Sqrt", "Sigmoid", "Neg", "Concat"},
    "bert": {"LayerNormalization", "Erf", "Softmax", "Tanh"},
    "bert_opset11": {"ReduceMean", "Pow", "Sqrt", "Erf", "Softmax"},
    "unet": {"ConvTranspose", "Resize", "Concat", "MaxPool"},
    "yolo": {"Sigmoid", "Split", "Reshape", "Transpose", "Concat", "Pow"},
    "lstm": {"LSTM"},
    "gru": {"GRU"},
    "rnn": {"RNN"},
    "wav2vec2": {"InstanceNormalization", "Erf", "Softmax", "ReduceL2"},
}


@pytest.mark.slow
def test_archs_export_the_ops_they_are_in_the_suite_for():
    assert set(EXPECTED_OPS) == set(archs.ARCHS)
    assert set(KNOWN_FALLBACKS) == set(archs.ARCHS)
    for name, want in EXPECTED_OPS.items():
        proto = onnx.load_from_string(archs.export_arch(name)[0])
        ops = {n.op_type for n in proto.graph.node}
        assert want <= ops, f"{name}: the export lacks {sorted(want - ops)}"
        if name == "bert_opset11":  # LayerNormalization is opset 17: below it, it is written out
            assert proto.opset_import[0].version == 11 and "LayerNormalization" not in ops
