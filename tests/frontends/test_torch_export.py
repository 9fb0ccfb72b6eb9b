"""``torch.export`` programs (frontends/torch/exported.py): a saved .pt2 compiled by ``compiler.compile``
and ``kiln compile`` against the module; an op without a lowering, and a file that is not a program,
refused with the reason."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import compiler
from compiler.errors import ModelError
from compiler.tools import archs
from compiler.tools.cli import main


def _save(module, args, path) -> str:
    ep = torch.export.export(module.eval(), tuple(args))
    torch.export.save(ep, str(path))
    return str(path)


@pytest.mark.parametrize("name", ["resnet18", "gpt2", "lstm", "gru", "rnn"])
def test_exported_programs_compile_natively(name, tmp_path):
    from torch.utils._pytree import tree_flatten

    m, feeds, _ = archs.build(name, 2)
    args = [torch.from_numpy(v) for v in feeds.values()]
    exe = compiler.compile(_save(m, args, tmp_path / "m.pt2"))
    assert exe.fallback == []
    got = exe(*[a.numpy() for a in args])
    with torch.no_grad():
        want = tree_flatten(m(*args))[0]
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)
    if name in ("lstm", "gru", "rnn"):  # the layers kept whole: one recurrent op each, not a trace
        assert {k["ops"][0] for k in exe.kernels if k["ops"]} >= {name.upper()}, exe.kernels


@pytest.mark.parametrize("name", ["bert", "gpt2", "lstm", "unet", "vit"])
def test_a_program_with_a_dynamic_batch_keeps_it_symbolic(name, tmp_path):
    """Exported with ``dynamic_shapes`` (a Dim on the batch of every input): the batch is a
    symbolic dimension of the graph; ``compile`` gives a Specializing executable, right for every
    batch size run (each compiled when first run), saved and loaded as one artifact."""
    from torch.utils._pytree import tree_flatten

    m, feeds, _ = archs.build(name, 2)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(m.eval(), tuple(torch.from_numpy(v) for v in feeds.values()),
                             dynamic_shapes=tuple({0: batch} for _ in feeds))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    exe = compiler.compile(str(tmp_path / "m.pt2"), output=str(tmp_path / "m.kiln"))
    assert type(exe).__name__ == "Specializing" and len(exe.dims) == 1
    (dim,) = exe.dims
    assert all(v.shape[0] == dim and all(isinstance(d, int) for d in v.shape[1:]) for v in exe.source.inputs)
    loaded = compiler.load(str(tmp_path / "m.kiln"))
    for b in (3, 1):
        _, feeds_b, _ = archs.build(name, b)
        with torch.no_grad():
            want = tree_flatten(m(*[torch.from_numpy(v) for v in feeds_b.values()]))[0]
        for e in (exe, loaded):
            got = e(*feeds_b.values())
            got = list(got) if isinstance(got, tuple) else [got]
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)
    assert sorted(s[dim] for s, _ in exe.specializations) == [1, 3]


def test_the_cli_and_refusals(tmp_path, capsys):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5))
    path = _save(m, [torch.randn(1, 3, 8, 8)], tmp_path / "cnn.pt2")
    out = str(tmp_path / "cnn.kiln")
    assert main(["compile", path, "-o", out]) == 0
    assert "0 fallback node(s)" in capsys.readouterr().out
    assert main(["run", out]) == 0

    class Cum(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 1)

    bad = _save(Cum(), [torch.randn(2, 3)], tmp_path / "cum.pt2")
    with pytest.raises(ModelError, match=r"no Kiln lowering for aten.cumsum.default"):
        compiler.compile(bad)
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="not a saved torch.export program"):
        compiler.compile(str(junk))
    with pytest.raises(ModelError, match="--input-shape applies to ONNX models"):
        compiler.compile(path, input_shapes={"x": (1, 3, 8, 8)})
