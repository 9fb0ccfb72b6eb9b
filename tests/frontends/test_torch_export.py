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
