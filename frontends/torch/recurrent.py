"""``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` as Kiln's recurrent layers (one op per layer, its time loop
native: ``codegen/kernels/recurrent.py``), not the hundreds of per-step ATen ops a trace makes of them.

Dynamo traces these modules (with ``torch._dynamo.config.allow_rnn``, which the ``kiln`` backend
turns on) into one call of ``torch.lstm`` / ``torch.gru`` / ``torch.rnn_tanh`` / ``torch.rnn_relu``.
``keep_recurrent(gm)`` replaces those calls by the ops ``kiln::lstm`` etc. defined here (their
PyTorch implementation calls the original; a fake one gives the shapes), which ``make_fx`` keeps
whole (a ``torch.export`` program keeps ``aten.lstm.input`` etc. instead, left out of its
decompositions); ``LOWERINGS`` lowers each to one Kiln ``LSTM``/``GRU``/``RNN`` per layer, in the ONNX
conventions: the gates reordered (PyTorch's LSTM i, f, g, o to i, o, f, c; GRU r, z, n to z, r, h,
with ``linear_before_reset``), both biases in B, a bidirectional layer as one op of two directions,
and the states sliced per layer from PyTorch's ``[layers * directions, batch, hidden]``.
"""
from __future__ import annotations

import numpy as np
import torch

from .lowerings import Unsupported

#: gate blocks of PyTorch's weight rows in ONNX's order, and the Kiln op, per kind
KINDS = {
    "lstm": ("LSTM", [0, 3, 1, 2], {}),
    "gru": ("GRU", [1, 0, 2], {"linear_before_reset": 1}),
    "rnn_tanh": ("RNN", [0], {"activations": ("Tanh", "Tanh")}),
    "rnn_relu": ("RNN", [0], {"activations": ("Relu", "Relu")}),
}


def _out_shapes(input, hx, params, num_layers, bidirectional, batch_first):
    hidden = hx[0].shape[-1]
    seq, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
    y = (batch, seq, (2 if bidirectional else 1) * hidden) if batch_first else (seq, batch,
                                                                               (2 if bidirectional else 1) * hidden)
    return y, [tuple(h.shape) for h in hx]


@torch.library.custom_op("kiln::lstm", mutates_args=())
def lstm(input: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor], has_biases: bool,
         num_layers: int, dropout: float, train: bool, bidirectional: bool,
         batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, h, c = torch.lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return y.clone(), h.clone(), c.clone()


@lstm.register_fake
def _(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    y, states = _out_shapes(input, hx, params, num_layers, bidirectional, batch_first)
    return input.new_empty(y), input.new_empty(states[0]), input.new_empty(states[1])


def _one_state(name: str, fn):
    """``kiln::gru`` / ``kiln::rnn_tanh`` / ``kiln::rnn_relu``: (output, h_n) of ``fn``."""
    @torch.library.custom_op(f"kiln::{name}", mutates_args=())
    def layer(input: torch.Tensor, hx: torch.Tensor, params: list[torch.Tensor], has_biases: bool,
              num_layers: int, dropout: float, train: bool, bidirectional: bool,
              batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        y, h = fn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        return y.clone(), h.clone()

    @layer.register_fake
    def _(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        y, states = _out_shapes(input, [hx], params, num_layers, bidirectional, batch_first)
        return input.new_empty(y), input.new_empty(states[0])
    return layer


gru = _one_state("gru", torch.gru)
rnn_tanh = _one_state("rnn_tanh", torch.rnn_tanh)
rnn_relu = _one_state("rnn_relu", torch.rnn_relu)

#: what dynamo's graph calls -> the op that stands for it
_ORIGINALS = {torch.lstm: ("lstm", lstm), torch.gru: ("gru", gru), torch.rnn_tanh: ("rnn_tanh", rnn_tanh),
              torch.rnn_relu: ("rnn_relu", rnn_relu)}


def keep_recurrent(gm: torch.fx.GraphModule) -> int:
    """Replace dynamo's ``torch.lstm``/``gru``/``rnn_*`` calls on a padded (tensor) input by the
    ``kiln::`` ops, in place; the number replaced (packed sequences keep the original call)."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _ORIGINALS or len(node.args) != 9:
            continue
        x, hx, params = node.args[:3]
        name, _ = _ORIGINALS[node.target]
        if not isinstance(x, torch.fx.Node) or not isinstance(params, (list, tuple)):
            continue
        if name == "lstm" and not isinstance(hx, (list, tuple)):
            continue
        node.target = getattr(torch.ops.kiln, name).default
        node.args = (x, list(hx) if name == "lstm" else hx, list(params), *node.args[3:])
        count += 1
    if count:
        gm.recompile()
    return count


def _lower(kind: str):
    name, order, attrs = KINDS[kind]

    def lower(ctx, n):
        x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = n.args
        if train and dropout:
            raise Unsupported(f"{kind} with dropout in training mode")
        states = list(hx) if kind == "lstm" else [hx]
        nd = 2 if bidirectional else 1
        per = 4 if has_biases else 2
        if len(params) != num_layers * nd * per:
            raise Unsupported(f"{kind} with {len(params)} parameters for {num_layers} layer(s) of {nd} "
                              f"direction(s) (projections are not lowered)")
        hidden = ctx.meta_shape(states[0])[-1]
        cur = ctx.value(x)
        if batch_first:  # the layers run sequence first (ONNX layout 0)
            cur = ctx.add("Transpose", [cur], perm=(1, 0, 2))
        finals = [[] for _ in states]
        for layer in range(num_layers):
            w, r, b = [], [], []
            for d in range(nd):
                ps = [_constant(ctx, p) for p in params[(layer * nd + d) * per:(layer * nd + d + 1) * per]]
                w.append(_gates(ps[0], order))
                r.append(_gates(ps[1], order))
                biases = ps[2:] if has_biases else [np.zeros(len(order) * hidden, ps[0].dtype)] * 2
                b.append(np.concatenate([_gates(v, order) for v in biases]))
            inits = [ctx.add("Slice", [ctx.value(s), ctx.const(np.array([layer * nd], np.int64)),
                                       ctx.const(np.array([(layer + 1) * nd], np.int64)),
                                       ctx.const(np.array([0], np.int64))]) for s in states]
            ins = [cur, ctx.const(np.stack(w)), ctx.const(np.stack(r)), ctx.const(np.stack(b)), None, *inits]
            outs = ctx.add_multi(name, ins, 1 + len(states), hidden_size=hidden,
                                 direction="bidirectional" if nd == 2 else "forward", **attrs)
            # Y [seq, directions, batch, hidden] -> [seq, batch, directions * hidden]
            y = ctx.add("Transpose", [outs[0]], perm=(0, 2, 1, 3))
            # (0: the sequence and batch sizes as they are, which may be known only at run time)
            cur = ctx.add("Reshape", [y, ctx.const(np.array([0, 0, nd * hidden], np.int64))])
            for f, v in zip(finals, outs[1:]):
                f.append(v)
        if batch_first:
            cur = ctx.add("Transpose", [cur], perm=(1, 0, 2))
        out = [cur] + [f[0] if len(f) == 1 else ctx.add("Concat", f, axis=0) for f in finals]
        return out
    return lower


def _constant(ctx, p) -> np.ndarray:
    v = ctx.value(p)
    if v.const is None:
        raise Unsupported("a recurrent layer whose weights are not constants (frozen parameters)")
    return np.asarray(v.const)


def _gates(a: np.ndarray, order: list[int]) -> np.ndarray:
    """The gate blocks of ``a`` (rows, or a bias vector) in ``order``."""
    blocks = np.split(a, len(order), axis=0)
    return np.concatenate([blocks[i] for i in order], axis=0)


#: the ATen ops of the layers, which a ``torch.export`` program keeps when they are left out of the
#: decomposition table (``exported.py``); their arguments are those of the ``kiln::`` ops
ATEN_OPS = {"lstm": torch.ops.aten.lstm.input, "gru": torch.ops.aten.gru.input,
            "rnn_tanh": torch.ops.aten.rnn_tanh.input, "rnn_relu": torch.ops.aten.rnn_relu.input}

LOWERINGS = {**{getattr(torch.ops.kiln, kind).default: _lower(kind) for kind in KINDS},
             **{ATEN_OPS[kind]: _lower(kind) for kind in KINDS}}

__all__ = ["ATEN_OPS", "LOWERINGS", "keep_recurrent"]
