"""``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` through ``torch.compile(backend="kiln")``
(``frontends/torch/recurrent.py``): one Kiln recurrent op per layer, not an unrolled trace; numbers
against eager for stacked, bidirectional, batch-first, bias-free layers and given initial states;
refusals (what stays in PyTorch, and why)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_flatten

import compiler.torch_backend as kt
from frontends.torch.recurrent import KINDS, keep_recurrent

from .test_torch_backend import _fresh_dynamo  # noqa: F401 (autouse: dynamo's caches reset around each test)


class Seq(nn.Module):
    """A recurrent layer, then a linear head on its outputs; returns the outputs and the states."""

    def __init__(self, layer: nn.Module, out: int, with_state: bool):
        super().__init__()
        self.layer, self.head, self.with_state = layer, nn.Linear(out, 3), with_state

    def forward(self, x, *state):
        y, h = self.layer(x, *state) if self.with_state else self.layer(x)
        return torch.tanh(self.head(y)), h


def _check(m: nn.Module, *args, tol=1e-5):
    m = m.eval()
    with torch.no_grad():
        want = m(*args)
        got = torch.compile(m, backend="kiln")(*args)
    got, want = tree_flatten(got)[0], tree_flatten(want)[0]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    return kt.last_report


CASES = [
    ("lstm", dict(num_layers=1)),
    ("lstm", dict(num_layers=2, batch_first=True)),
    ("lstm", dict(num_layers=2, bidirectional=True)),
    ("lstm", dict(num_layers=1, bias=False, batch_first=True, bidirectional=True)),
    ("gru", dict(num_layers=2)),
    ("gru", dict(num_layers=1, bidirectional=True, batch_first=True)),
    ("rnn_tanh", dict(num_layers=2, bias=False)),
    ("rnn_relu", dict(num_layers=1, nonlinearity="relu", bidirectional=True)),
]


@pytest.mark.parametrize("kind,kw", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_layers_run_as_kiln_ops(kind, kw, with_state):
    torch.manual_seed(0)
    cls = {"lstm": nn.LSTM, "gru": nn.GRU}.get(kind, nn.RNN)
    layer = cls(6, 8, **kw)
    nd = 2 if kw.get("bidirectional") else 1
    batch, seq = 3, 5
    x = torch.randn(batch, seq, 6) if kw.get("batch_first") else torch.randn(seq, batch, 6)
    h0 = torch.randn(kw["num_layers"] * nd, batch, 8)
    state = (((h0, torch.randn_like(h0)),) if kind == "lstm" else (h0,)) if with_state else ()
    report = _check(Seq(layer, nd * 8, with_state), x, *state)
    assert report["in_torch"] == {} and len(report["partitions"]) == 1, report
    part = report["partitions"][0]
    assert any(op == kind for op in part["ops"]), part["ops"]  # the layer is one node, not a trace
    assert part["interpreted"] == []


def test_gate_orders_and_kinds():
    # PyTorch's LSTM gates i, f, g, o are ONNX's i, o, f, c; GRU's r, z, n are z, r, h
    assert KINDS["lstm"][1] == [0, 3, 1, 2] and KINDS["gru"][1] == [1, 0, 2]
    assert KINDS["gru"][2] == {"linear_before_reset": 1}


def test_keep_recurrent_leaves_other_calls():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.relu, (x,))
    g.output(y)
    gm = torch.fx.GraphModule(nn.Module(), g)
    assert keep_recurrent(gm) == 0


def test_dropout_in_training_mode_stays_in_pytorch():
    from frontends.torch.importer import supported

    g = torch.fx.Graph()
    x, h, c, w = (g.placeholder(n) for n in ("x", "h", "c", "w"))
    node = g.call_function(torch.ops.kiln.lstm.default, (x, [h, c], [w, w], False, 1, 0.5, True, False, False))
    assert supported(node) is None  # (the op has a lowering; the lowering refuses this call)
    from frontends.torch.importer import Lowerer
    from frontends.torch.lowerings import LOWERINGS, Unsupported
    from compiler.ir.graph import Graph

    with pytest.raises(Unsupported, match="dropout in training mode"):
        LOWERINGS[torch.ops.kiln.lstm.default](Lowerer(Graph("t")), node)
