"""``torch.compile(model, backend="kiln")`` (compiler/torch_backend.py, frontends/torch): found by name through the entry point,
ATen graphs lowered to Kiln's IR and compiled, unsupported ops left to PyTorch in their own
partitions, graph breaks and new shapes (dynamo's dynamic sizes) compiled per shape, training left to
PyTorch with a warning; every result against the module run eagerly."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import compiler.torch_backend as kt
from compiler.tools import archs


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.fc, self.ln = nn.Linear(4 * 8 * 8, 10), nn.LayerNorm(10)

    def forward(self, x):
        y = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        y = nn.functional.gelu(self.fc(y.flatten(1)))
        return torch.softmax(self.ln(y), -1)


def _close(got, want, tol=1e-5):
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def test_a_cnn_runs_as_one_native_partition():
    m = CNN().eval()
    archs.randomize_norms(m)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        fast = torch.compile(m, backend="kiln")  # by name: the torch_dynamo_backends entry point
        _close(fast(x), m(x))
    (part,) = kt.last_report["partitions"]
    assert {"convolution", "addmm", "gelu", "native_layer_norm", "_softmax"} <= set(part["ops"])
    assert part["interpreted"] == [] and kt.last_report["in_torch"] == {}
    assert kt.last_report["direct"]  # one partition: called straight, not through the FX module


class TwoOut(nn.Module):
    def __init__(self, passthrough: bool):
        super().__init__()
        self.a, self.passthrough = nn.Linear(8, 4), passthrough

    def forward(self, x):
        y = torch.relu(self.a(x))
        return (y, x) if self.passthrough else (torch.tanh(y), y * 2)


@pytest.mark.parametrize("passthrough", [False, True], ids=["two results", "an input returned"])
def test_one_partition_with_several_results(passthrough):
    """Two results of one partition come back in the graph's container, straight from the part; an
    input returned as it is is returned by dynamo's own code (the graph has the one result)."""
    m = TwoOut(passthrough).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        fast = torch.compile(m, backend="kiln")
        _close(fast(x), m(x))
        _close(fast(x + 1), m(x + 1))
    assert kt.last_report["direct"]


class WithCumsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return torch.tanh(self.b(torch.cumsum(torch.relu(self.a(x)), 1)))


def test_ops_without_a_lowering_stay_in_pytorch_between_partitions():
    m = WithCumsum().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        _close(torch.compile(m, backend="kiln")(x), m(x))
    assert len(kt.last_report["partitions"]) == 2 and not kt.last_report["direct"]
    assert "no Kiln lowering for aten.cumsum.default" in kt.last_report["in_torch"]["aten.cumsum.default"]


class Breaks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.a(x))
        if y.sum() > 0:  # data-dependent Python control flow: a graph break
            y = y * 2
        return torch.tanh(self.b(y))


def test_graph_breaks_and_new_shapes():
    m = Breaks().eval()
    with torch.no_grad():
        fast = torch.compile(m, backend="kiln")
        for batch in (2, 3, 5, 1):  # dynamo makes the batch dynamic after the second: symbolic from then on
            x = torch.randn(batch, 8)
            _close(fast(x), m(x))


class Sizes(nn.Module):
    """Sizes read in the model: a reshape by ``x.shape``, arange and a buffer sliced to the sequence
    length, a slice to a floor division of a size, a tensor made of a size (``zeros(b, ...)``)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("pos", torch.randn(1, 64, 8))

    def forward(self, x):
        b, t, c = x.shape
        y = self.proj(x) + self.pos[:, :t]
        y = y + torch.arange(t, dtype=torch.float32).view(1, t, 1) + torch.arange(0.5, t).view(1, t, 1)
        y = y.view(b * t, c)[: (b * t) // 2]
        return torch.softmax(y, -1) + torch.zeros((b * t) // 2, c)


def _counting(monkeypatch, obj, name):
    calls = []
    orig = getattr(obj, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return orig(*args, **kwargs)

    monkeypatch.setattr(obj, name, counted)
    return calls


def test_dynamic_sizes_are_symbolic_in_kilns_ir(monkeypatch):
    """``dynamic=True``: the graph is traced and imported once, with the batch and sequence sizes as
    symbolic dimensions of Kiln's IR; native code is compiled per size on first use, and the
    ``cache`` most recent sizes are kept."""
    from compiler.specialize import PerSize

    sources = []
    init = PerSize.__init__
    monkeypatch.setattr(PerSize, "__init__", lambda self, source, *a, **k: sources.append(source) or
                        init(self, source, *a, **k))
    traces = _counting(monkeypatch, kt, "_trace")
    compiles = _counting(monkeypatch, PerSize, "_compile")
    m = Sizes().eval()
    with torch.no_grad():
        fast = torch.compile(m, backend="kiln", dynamic=True, options={"cache": 2})
        for b, t in ((2, 4), (3, 6), (2, 4), (4, 10), (3, 6)):  # (a size 1 dynamo would specialize)
            x = torch.randn(b, t, 8)
            _close(fast(x), m(x))
    assert len(traces) == 1 and traces[0][2] is True  # traced once, with symbolic sizes
    (dims,) = kt.last_report["symbolic"].values()
    assert len(dims) == 2
    (source,) = sources
    assert [type(d) for d in source.inputs[0].shape] == [str, str, int]  # x: f32[s0, s1, 8]
    # sizes (2, 4), (3, 6), (4, 10), then (3, 6) again: it was dropped from the cache of two
    assert len(compiles) == 4
    assert kt.last_report["partitions"][0]["kernels"] > 0 and kt.last_report["in_torch"] == {}


@pytest.mark.parametrize("model", ["sizes", "cumsum"])
def test_a_size_kiln_fails_to_compile_runs_in_pytorch(model, monkeypatch):
    """A later size whose compile fails (here: made to fail for batch 3) runs in PyTorch, with a
    warning naming the sizes and the reason, once; the failure is remembered (not compiled again),
    and the other sizes stay native. Both ways a symbolic graph is called: straight (Sizes: one
    partition of the graph's inputs) and through the FX module (two partitions around a cumsum)."""
    from compiler.errors import LimitError
    from compiler.specialize import PerSize

    tried = []
    real = PerSize._compile

    def compile_(self, sizes):
        tried.append(dict(sizes))
        if 3 in sizes.values():
            raise LimitError("made to fail for this test")
        return real(self, sizes)

    monkeypatch.setattr(PerSize, "_compile", compile_)
    warned = []
    monkeypatch.setattr(kt.log, "warning", lambda msg, *args: warned.append(msg % args))
    m = (Sizes() if model == "sizes" else WithCumsum()).eval()
    shape = (lambda b: (b, 4, 8)) if model == "sizes" else (lambda b: (b, 8))
    with torch.no_grad():
        fast = torch.compile(m, backend="kiln", dynamic=True)
        for b in (2, 3, 3, 4, 2):
            x = torch.randn(*shape(b))
            _close(fast(x), m(x))
    parts = 1 if model == "sizes" else 2
    assert kt.last_report["direct"] is (parts == 1) and len(kt.last_report["partitions"]) == parts
    assert "per shape" not in kt.last_report["symbolic"]
    # per partition: 2, 3 (failed, tried once), 4
    assert sum(3 in t.values() for t in tried) == parts and len(tried) == 3 * parts
    assert len(warned) == parts and all("runs in PyTorch" in w and "made to fail" in w for w in warned)


def test_upsampling_is_kept_whole_and_native():
    """Nearest and bilinear upsampling, by scale factor and by size: kept whole (the decomposition
    table keeps them; decomposed, nearest was advanced indexing, which left the graph in PyTorch)."""
    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return (nn.functional.interpolate(y, scale_factor=2, mode="nearest")
                    + nn.functional.interpolate(y, size=(8, 8), mode="bilinear") + nn.functional.interpolate(y, size=(8, 8)))

    m = Up().eval()
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        _close(torch.compile(m, backend="kiln")(x), m(x))
    (part,) = kt.last_report["partitions"]
    assert {"upsample_nearest2d", "upsample_bilinear2d"} <= set(part["ops"]) and kt.last_report["in_torch"] == {}


def test_a_batch_marked_dynamic_keeps_every_layer_native():
    """``mark_dynamic`` on the batch of EfficientNet-B0: one native partition (the symbolic trace's
    functionalized in-place ops, ``copy``, lowered), the batch symbolic, right at three sizes."""
    m, feeds, _ = archs.build("efficientnet_b0", 2)
    fast = torch.compile(m, backend="kiln")
    for b in (2, 3, 5):
        x = torch.randn(b, *next(iter(feeds.values())).shape[1:])
        torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad():
            _close(fast(x), m(x), tol=1e-4)
    assert len(kt.last_report["partitions"]) == 1 and kt.last_report["in_torch"] == {}
    (dims,) = kt.last_report["symbolic"].values()
    assert len(dims) == 1  # the batch


def test_a_graph_whose_symbolic_trace_kiln_refuses_compiles_per_shape():
    """Bilinear upsampling traced with symbolic sizes becomes advanced indexing, which Kiln does not
    lower (traced with static sizes it stays one op, which Kiln has): with a dynamic batch the graph
    is compiled per input shape instead, natively, and the report says why."""
    class Up(nn.Module):
        def forward(self, x):
            return nn.functional.interpolate(x, scale_factor=2, mode="bilinear") * 2

    m = Up().eval()
    with torch.no_grad():
        fast = torch.compile(m, backend="kiln", dynamic=True)
        for b in (2, 3):
            x = torch.randn(b, 3, 4, 4)
            _close(fast(x), m(x))
    why = kt.last_report["symbolic"]["per shape"]
    assert why.startswith("partition fused_0: Unsupported: ")
    assert len(kt.last_report["partitions"]) == 1 and kt.last_report["in_torch"] == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "resnet18", "vit", "unet", "swin", "yolo", "convnext", "lstm", "gru",
                                  "rnn"])
def test_real_architectures(name):
    m, feeds, _ = archs.build(name, 2)
    args = [torch.from_numpy(v) for v in feeds.values()]
    with torch.no_grad():
        _close(torch.compile(m, backend="kiln")(*args), m(*args), tol=1e-4)
    assert len(kt.last_report["partitions"]) == 1 and kt.last_report["in_torch"] == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert", "convnext", "lstm"])
def test_real_architectures_with_dynamic_shapes(name, monkeypatch):
    """``dynamic=True``: every size symbolic (GPT-2: arange and the mask sliced to the sequence;
    BERT: attention's folded batch rebuilt from two symbolic sizes; ConvNeXt: a size squared; LSTM:
    initial states of a symbolic batch), one native partition, right at two batch sizes with one trace."""
    traces = _counting(monkeypatch, kt, "_trace")
    m, feeds, _ = archs.build(name, 2)
    fast = torch.compile(m, backend="kiln", dynamic=True)
    for batch in (2, 3):
        _, feeds_b, _ = archs.build(name, batch)
        args = [torch.from_numpy(v) for v in feeds_b.values()]
        with torch.no_grad():
            _close(fast(*args), m(*args), tol=1e-4)
    assert len(kt.last_report["partitions"]) == 1 and kt.last_report["in_torch"] == {}
    assert "per shape" not in kt.last_report["symbolic"] and kt.last_report["symbolic"]
    assert [t[2] for t in traces] == [True]


def test_training_runs_in_pytorch_with_a_warning():
    m = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(m, backend="kiln")(x)
    assert any("compiles inference only, so it runs in PyTorch" in str(w.message) for w in caught)
    assert y.requires_grad
    _close(y.detach(), m(x).detach())


def test_unknown_options_are_refused():
    with pytest.raises(Exception, match="unknown kiln backend option"):
        with torch.no_grad():
            torch.compile(nn.Linear(2, 2), backend="kiln", options={"fast": True})(torch.randn(1, 2))


@pytest.mark.parametrize("kernel_cache", [True, False])
def test_the_kernel_cache_option_reaches_the_compile(kernel_cache, monkeypatch):
    from compiler import driver

    seen = []
    real = driver.compile
    monkeypatch.setattr(driver, "compile", lambda *a, **k: seen.append(k.get("kernel_cache")) or real(*a, **k))
    m = CNN().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        _close(torch.compile(m, backend="kiln", options={"kernel_cache": kernel_cache})(x), m(x))
    assert seen == [kernel_cache]


def test_the_entry_point_in_a_fresh_process():
    import subprocess
    import sys

    code = ("import torch\n"
            "m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()\n"
            "x = torch.randn(2, 4)\n"
            "with torch.no_grad():\n"
            "    y = torch.compile(m, backend='kiln')(x)\n"
            "    assert torch.allclose(y, m(x), atol=1e-6)\n"
            "import sys\n"
            "assert 'compiler.torch_backend' in sys.modules\n"
            # an LSTM with no setting by the user: the backend lets dynamo trace it (allow_rnn)
            "lstm = torch.nn.LSTM(4, 5, num_layers=2).eval()\n"
            "x = torch.randn(7, 2, 4)\n"
            "with torch.no_grad():\n"
            "    (y, (h, c)), (wy, (wh, wc)) = torch.compile(lstm, backend='kiln')(x), lstm(x)\n"
            "    assert torch.allclose(y, wy, atol=1e-5) and torch.allclose(c, wc, atol=1e-5)\n"
            "import compiler.torch_backend as kt\n"
            "assert torch._dynamo.config.allow_rnn\n"
            "assert kt.last_report['in_torch'] == {} and len(kt.last_report['partitions']) == 1, kt.last_report\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_attention_fuses_as_from_onnx():
    """matmul's decomposition folds the heads into bmm's batch and expands the operands to their own
    shapes; lowered unfolded (and the identity expands dropped), BERT's attention is one kernel per
    layer, as from the ONNX export: the same kernel count."""
    import compiler
    from compiler.tools import zoo

    m, inputs, _ = zoo.build("bert", seq=16)
    args = [torch.from_numpy(v) for v in inputs]
    with torch.no_grad():
        _close(torch.compile(m.eval(), backend="kiln")(*args), m(*args), tol=1e-4)
    (part,) = kt.last_report["partitions"]
    onnx_exe = compiler.compile(zoo.export("bert", seq=16)[0], 2)
    assert part["kernels"] == len(onnx_exe.kernels)
    assert any({"MatMul", "Softmax"} <= set(k["ops"]) for k in onnx_exe.kernels)
