"""Recurrent layers: RNN, GRU, LSTM (one layer, ONNX semantics).

Shared conventions (ONNX): ``num_directions`` is 2 for ``direction="bidirectional"``, else 1. With
``layout=0``, X is ``[seq, batch, input]``, Y ``[seq, num_directions, batch, hidden]`` and the final states
(Y_h, Y_c, and initial_h/initial_c) ``[num_directions, batch, hidden]``; with ``layout=1`` batch comes first:
X ``[batch, seq, input]``, Y ``[batch, seq, num_directions, hidden]``, states ``[batch, num_directions,
hidden]``. W is ``[num_directions, gates*hidden, input]``, R ``[num_directions, gates*hidden, hidden]``, B
``[num_directions, 2*gates*hidden]`` (W biases then R biases). ``sequence_lens`` ``[batch]`` gives each
batch entry's length: steps past it produce zeros in Y and leave the state unchanged, so Y_h is the state
after the entry's last step (the first step, for the reverse direction, which starts at its last element);
an entry of length 0 has zero final states (as ONNX Runtime).

``activations`` names the gate functions (case-insensitive ONNX names: Relu, Tanh, Sigmoid, Affine,
LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus): ``k`` of them (1 for RNN, 2
for GRU, 3 for LSTM) per direction, for "bidirectional" the forward ones then the reverse ones (k alone are
used by both; a one-direction layer also takes 2k when both halves are the same, as RNN's default).
``activation_alpha``/``activation_beta`` are consumed in order by the functions that take the parameter
(the others consume none; as ONNX Runtime), defaults as the ONNX op of that name. ``clip`` bounds every
gate's pre-activation to ``[-clip, clip]``. Narrow floats are computed in f32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import STD_FLOATS, Cost, OpDef, Pattern, check_dtype, same_dtype
from .common import check_flags, dims_agree, precise_dim

# name -> (fn(x, alpha, beta), default alpha or None if it takes none, default beta or None)
_ACTIVATIONS: dict[str, tuple[Callable, float | None, float | None]] = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: 0.5 * (np.tanh(0.5 * x) + 1), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(np.minimum(x, 0)) - 1)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}
_CANONICAL = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "affine": "Affine", "leakyrelu": "LeakyRelu",
              "thresholdedrelu": "ThresholdedRelu", "scaledtanh": "ScaledTanh", "hardsigmoid": "HardSigmoid",
              "elu": "Elu", "softsign": "Softsign", "softplus": "Softplus"}

_DIRECTIONS = ("forward", "reverse", "bidirectional")


class _Act:
    """One bound activation function (with its alpha and beta)."""

    __slots__ = ("fn", "alpha", "beta")

    def __init__(self, fn, alpha, beta):
        self.fn, self.alpha, self.beta = fn, alpha, beta

    def __call__(self, x):
        return self.fn(x, self.alpha, self.beta)


def _work(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    return a.astype(np.float32) if a.dtype.itemsize <= 2 else a


@dataclass(frozen=True, eq=False)
class _Recurrent(OpDef):
    """The attributes, checks, shape inference and time loop the three layers share."""

    activation_alpha: tuple[float, ...] = ()
    activation_beta: tuple[float, ...] = ()
    activations: tuple[str, ...] | None = None
    clip: float | None = None
    direction: str = "forward"
    hidden_size: int | None = None
    layout: int = 0

    pattern: ClassVar = Pattern.OPAQUE
    since: ClassVar = 22
    #: gates per direction (rows of W are gates*hidden)
    gates: ClassVar[int] = 1
    #: the activation functions of one direction when ``activations`` is not given
    default_activations: ClassVar[tuple[str, ...]] = ("Tanh",)
    #: the states (Y_h, and Y_c for LSTM)
    num_states: ClassVar[int] = 1

    # -- attributes -----------------------------------------------------------------------------
    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def validate(self):
        if self.direction not in _DIRECTIONS:
            raise self.fail(f"direction must be one of {', '.join(_DIRECTIONS)}, got {self.direction!r}")
        if self.layout not in (0, 1):
            raise self.fail(f"layout must be 0 (sequence first) or 1 (batch first), got {self.layout}")
        if self.hidden_size is not None and self.hidden_size <= 0:
            raise self.fail(f"hidden_size must be positive, got {self.hidden_size}")
        if self.clip is not None and not self.clip > 0:
            raise self.fail(f"clip must be a positive threshold, got {self.clip}")
        self._bound_activations()

    def _bound_activations(self) -> list[list[_Act]]:
        """The activation functions of each direction, with their alpha and beta."""
        k = len(self.default_activations)
        names = self.activations if self.activations is not None else self.default_activations
        if len(names) not in (k, 2 * k):
            raise self.fail(f"activations must list {k} function(s) (or {2 * k}: forward then reverse), got "
                            f"{len(names)}: {list(names)}")
        alphas, betas = list(self.activation_alpha), list(self.activation_beta)
        bound = []
        for name in names:
            entry = _ACTIVATIONS.get(name.lower())
            if entry is None:
                raise self.fail(f"activation {name!r} is not supported; supported: {', '.join(_CANONICAL.values())}")
            fn, da, db = entry
            a = alphas.pop(0) if da is not None and alphas else da
            b = betas.pop(0) if db is not None and betas else db
            bound.append(_Act(fn, a, b))
        if alphas:
            raise self.fail(f"activation_alpha has {len(self.activation_alpha)} value(s), more than the "
                            f"activations {list(names)} take")
        if betas:
            raise self.fail(f"activation_beta has {len(self.activation_beta)} value(s), more than the "
                            f"activations {list(names)} take")
        forward = bound[:k]
        backward = bound[k:] if len(bound) == 2 * k else forward
        if self.direction == "bidirectional":
            return [forward, backward]
        if len(bound) == 2 * k and [(n.lower(), a.alpha, a.beta) for n, a in zip(names[:k], forward)] != [
                (n.lower(), a.alpha, a.beta) for n, a in zip(names[k:], backward)]:
            raise self.fail(f"activations lists {2 * k} functions {list(names)}, but direction={self.direction} "
                            f"takes {k}")
        return [forward]

    # -- inference ------------------------------------------------------------------------------
    def _state_inputs(self) -> tuple[str, ...]:
        return ("initial_h",) if self.num_states == 1 else ("initial_h", "initial_c")

    def infer(self, ins):
        ins = list(ins) + [None] * (len(self.inputs) - len(ins))
        x, w, r, b, lens = ins[:5]
        states = ins[5:5 + self.num_states]
        p = ins[7] if self.num_states == 2 else None
        floats = [v for v in [x, w, r, b, *states, p] if v is not None]
        dt = same_dtype(self, floats, STD_FLOATS)
        for v, name, rank in [(x, "X", 3), (w, "W", 3), (r, "R", 3), (b, "B", 2), (lens, "sequence_lens", 1),
                              (p, "P", 2)] + [(s, n, 3) for s, n in zip(states, self._state_inputs())]:
            if v is not None and v.type.rank != rank:
                raise self.fail(f"{name} must have rank {rank}, got {v.type}")
        if lens is not None:
            check_dtype(self, lens, {DType.i32, DType.i64}, "sequence_lens")
        nd, g = self.num_directions, self.gates
        if self.layout == 0:
            seq, batch, isz = x.shape
        else:
            batch, seq, isz = x.shape
        rows = w.shape[1]
        hid = self.hidden_size
        if hid is None:
            hid = precise_dim(r.shape[2], rows // g if isinstance(rows, int) and rows % g == 0 else None)
        checks = [("W", w.shape, (nd, g * hid if isinstance(hid, int) else None, isz)),
                  ("R", r.shape, (nd, g * hid if isinstance(hid, int) else None, hid))]
        if b is not None:
            checks.append(("B", b.shape, (nd, 2 * g * hid if isinstance(hid, int) else None)))
        if lens is not None:
            checks.append(("sequence_lens", lens.shape, (batch,)))
        state_shape = (nd, batch, hid) if self.layout == 0 else (batch, nd, hid)
        for s, name in zip(states, self._state_inputs()):
            if s is not None:
                checks.append((name, s.shape, state_shape))
        if p is not None:
            checks.append(("P", p.shape, (nd, 3 * hid if isinstance(hid, int) else None)))
        for name, got, want in checks:
            if not all(dims_agree(a, c) for a, c in zip(got, want)):
                dims = ", ".join("?" if d is None else str(d) for d in want)
                raise self.fail(f"{name} has shape {list(got)}, expected [{dims}] (direction={self.direction}, "
                                f"layout={self.layout}, {g} gate(s), hidden_size={hid})")
        if isinstance(rows, int) and rows % g:
            raise self.fail(f"W has {rows} rows, not a multiple of the {g} gates")
        hid = precise_dim(hid, r.shape[2])
        batch = precise_dim(batch, *(s.shape[1 if self.layout == 0 else 0] for s in states if s is not None),
                             lens.shape[0] if lens is not None else None)
        y = (seq, nd, batch, hid) if self.layout == 0 else (batch, seq, nd, hid)
        state = (nd, batch, hid) if self.layout == 0 else (batch, nd, hid)
        return [TensorType(dt, y)] + [TensorType(dt, state)] * self.num_states

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        x, w = ins[0], ins[1]
        if not (x.is_static and w.is_static):
            return Cost(0, base.bytes)
        seq, batch = (x.shape[0], x.shape[1]) if self.layout == 0 else (x.shape[1], x.shape[0])
        nd, rows, isz = w.shape
        hid = rows // self.gates
        matmul = 2 * seq * batch * nd * rows * (isz + hid)
        return Cost(matmul + 10 * seq * batch * nd * rows, base.bytes)

    # -- computation ----------------------------------------------------------------------------
    def _step(self, acts: list[_Act], xw: np.ndarray, rt: np.ndarray, rb: np.ndarray, p: np.ndarray | None,
              states: list[np.ndarray]) -> list[np.ndarray]:
        """One time step of one direction: the new states from the input projection ``xw`` (X W^T + Wb,
        [batch, gates*hidden]), R^T ``rt``, the R bias ``rb``, peepholes ``p`` and the old states."""
        raise NotImplementedError

    def _clip(self, v: np.ndarray) -> np.ndarray:
        return v if self.clip is None else np.clip(v, -self.clip, self.clip)

    def compute(self, *arrays):
        arrays = list(arrays) + [None] * (len(self.inputs) - len(arrays))
        dtype = arrays[0].dtype
        x, w, r, b = (_work(a) for a in arrays[:4])
        lens = arrays[4]
        states0 = [_work(s) for s in arrays[5:5 + self.num_states]]
        p = _work(arrays[7]) if self.num_states == 2 else None
        if self.layout == 1:
            x = x.transpose(1, 0, 2)
            states0 = [None if s is None else s.transpose(1, 0, 2) for s in states0]
        seq, batch, _ = x.shape
        nd, rows, _ = w.shape
        hid = r.shape[2]
        work = x.dtype
        if lens is not None:
            lens = lens.astype(np.int64)
            if lens.size and (lens.min() < 0 or lens.max() > seq):
                raise ValueError(f"sequence_lens {lens.tolist()} must lie in [0, {seq}] (the sequence length)")
        y = np.zeros((seq, nd, batch, hid), work)
        finals = [np.zeros((nd, batch, hid), work) for _ in range(self.num_states)]
        for d, acts in enumerate(self._bound_activations()):
            reverse = self.direction == "reverse" or d == 1
            wb = b[d, :rows] if b is not None else 0
            rb = b[d, rows:] if b is not None else np.zeros(rows, work)
            xw = x @ w[d].T + wb
            rt = np.ascontiguousarray(r[d].T)
            pd = p[d] if p is not None else None
            states = [np.zeros((batch, hid), work) if s is None else s[d] for s in states0]
            for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
                new = self._step(acts, xw[t], rt, rb, pd, states)
                if lens is not None:
                    live = (t < lens)[:, None]
                    new = [np.where(live, n, s) for n, s in zip(new, states)]
                    y[t, d] = np.where(live, new[0], 0)
                else:
                    y[t, d] = new[0]
                states = new
            for f, s in zip(finals, states):
                f[d] = s if lens is None else np.where((lens > 0)[:, None], s, 0)
        if self.layout == 1:
            y = y.transpose(2, 0, 1, 3)
            finals = [f.transpose(1, 0, 2) for f in finals]
        return [np.ascontiguousarray(a).astype(dtype, copy=False) for a in [y, *finals]]


@dataclass(frozen=True, eq=False)
class RNN(_Recurrent):
    """A simple RNN layer: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb) (f = Tanh by default).
    Outputs Y (all hidden states), Y_h (the last)."""

    activations: tuple[str, ...] | None = ("Tanh", "Tanh")

    inputs: ClassVar = ("X", "W", "R", "B?", "sequence_lens?", "initial_h?")
    outputs: ClassVar = ("Y", "Y_h")
    gates: ClassVar = 1
    default_activations: ClassVar = ("Tanh",)

    def _step(self, acts, xw, rt, rb, p, states):
        (h,) = states
        return [acts[0](self._clip(xw + h @ rt + rb))]


@dataclass(frozen=True, eq=False)
class GRU(_Recurrent):
    """A GRU layer, gates in the order z (update), r (reset), h (hidden); f = Sigmoid, g = Tanh by default:
    z = f(X Wz^T + H Rz^T + Wbz + Rbz), r likewise, h = g(X Wh^T + (r . H) Rh^T + Rbh + Wbh) or, with
    ``linear_before_reset``, g(X Wh^T + r . (H Rh^T + Rbh) + Wbh); H' = (1 - z) . h + z . H."""

    linear_before_reset: int = 0

    inputs: ClassVar = ("X", "W", "R", "B?", "sequence_lens?", "initial_h?")
    outputs: ClassVar = ("Y", "Y_h")
    gates: ClassVar = 3
    default_activations: ClassVar = ("Sigmoid", "Tanh")

    def validate(self):
        check_flags(self, "linear_before_reset")
        super().validate()

    def _step(self, acts, xw, rt, rb, p, states):
        (h,) = states
        f, g = acts
        n = h.shape[1]
        zr = xw[:, :2 * n] + h @ rt[:, :2 * n] + rb[:2 * n]
        z = f(self._clip(zr[:, :n]))
        r = f(self._clip(zr[:, n:]))
        if self.linear_before_reset:
            cand = xw[:, 2 * n:] + r * (h @ rt[:, 2 * n:] + rb[2 * n:])
        else:
            cand = xw[:, 2 * n:] + (r * h) @ rt[:, 2 * n:] + rb[2 * n:]
        hh = g(self._clip(cand))
        return [(1 - z) * hh + z * h]


@dataclass(frozen=True, eq=False)
class LSTM(_Recurrent):
    """An LSTM layer, gates in the order i, o, f, c; f = Sigmoid, g = Tanh, h = Tanh by default. Peepholes P
    ([num_directions, 3*hidden], order i, o, f) add P . C_{t-1} to i and f and P . C_t to o;
    ``input_forget`` couples the forget gate to the input gate (f = 1 - i). Outputs Y, Y_h, Y_c."""

    input_forget: int = 0

    inputs: ClassVar = ("X", "W", "R", "B?", "sequence_lens?", "initial_h?", "initial_c?", "P?")
    outputs: ClassVar = ("Y", "Y_h", "Y_c")
    gates: ClassVar = 4
    default_activations: ClassVar = ("Sigmoid", "Tanh", "Tanh")
    num_states: ClassVar = 2

    def validate(self):
        check_flags(self, "input_forget")
        super().validate()

    def _step(self, acts, xw, rt, rb, p, states):
        h, c = states
        f, g, hf = acts
        n = h.shape[1]
        gates = xw + h @ rt + rb
        gi, go, gf, gc = gates[:, :n], gates[:, n:2 * n], gates[:, 2 * n:3 * n], gates[:, 3 * n:]
        if p is not None:
            gi = gi + p[:n] * c
            gf = gf + p[2 * n:] * c
        i = f(self._clip(gi))
        forget = 1 - i if self.input_forget else f(self._clip(gf))
        c_new = forget * c + i * g(self._clip(gc))
        if p is not None:
            go = go + p[n:2 * n] * c_new
        o = f(self._clip(go))
        return [o * hf(c_new), c_new]


OPS = (RNN, GRU, LSTM)
