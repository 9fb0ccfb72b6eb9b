"""Optimizer steps of the ``ai.onnx.preview.training`` domain: Adagrad, Adam, Momentum.

Each takes the learning rate R (a float scalar), the update count T (an int64 scalar) and then, for n
optimized tensors, groups of n tensors (the values X_1..X_n, their gradients, then the optimizer's state
tensors), and returns the new values and the new states, grouped the same way. Every tensor of a group
entry i has X_i's shape and one float element type. The arithmetic is done in f64 and rounded to the
tensors' element type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType
from .base import Cost, OpDef, Pattern, check_dtype

TRAINING: str = "ai.onnx.preview.training"
_FLOATS = frozenset({DType.f32, DType.f64})


@dataclass(frozen=True, eq=False)
class _Optimizer(OpDef):
    domain: ClassVar = TRAINING
    since: ClassVar = 1
    inputs: ClassVar = ("R", "T", "inputs*")
    outputs: ClassVar = ("outputs*",)
    pattern: ClassVar = Pattern.OPAQUE
    #: the input groups (values, gradients, states...) and the output groups
    in_groups: ClassVar[tuple[str, ...]] = ()
    out_groups: ClassVar[int] = 2
    #: FLOPs per optimized element
    flops: ClassVar[int] = 8

    def _count(self, num_tensors: int) -> int:
        k = len(self.in_groups)
        if num_tensors == 0 or num_tensors % k:
            raise self.fail(f"takes R, T and {k} groups of n tensors ({', '.join(self.in_groups)}), got "
                            f"{num_tensors} tensors after R and T")
        return num_tensors // k

    def infer(self, ins):
        if len(ins) < 3:
            raise self.fail(f"takes R, T and {len(self.in_groups)} groups of tensors "
                            f"({', '.join(self.in_groups)}), got {len(ins)} inputs")
        r, t, *rest = ins
        if any(v is None for v in ins):
            raise self.fail("no input may be missing")
        check_dtype(self, r, _FLOATS, "R (the learning rate)")
        check_dtype(self, t, {DType.i64}, "T (the update count)")
        for v, name in ((r, "R"), (t, "T")):
            if v.type.numel not in (1, None) or v.type.rank > 1:
                raise self.fail(f"{name} must be a scalar, got {v.type}")
        n = self._count(len(rest))
        dts = {v.dtype for v in rest}
        if len(dts) != 1:
            raise self.fail(f"the optimized tensors and their gradients and states must share one element type, "
                            f"got {', '.join(sorted(d.short for d in dts))}")
        check_dtype(self, rest[0], _FLOATS, "the optimized tensors")
        for i in range(n):
            x = rest[i]
            for g in range(1, len(self.in_groups)):
                v = rest[g * n + i]
                if v.type.rank != x.type.rank or any(
                        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(v.shape, x.shape)):
                    raise self.fail(f"{self.in_groups[g]} {i + 1} has type {v.type}, its tensor X_{i + 1} is "
                                    f"{x.type} (they must have one shape)")
        return [v.type for v in rest[:n]] + [v.type for g in range(2, 2 + self.out_groups - 1)
                                             for v in rest[g * n:(g + 1) * n]]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        n = sum(t.numel or 0 for t in outs[: len(outs) // self.out_groups])
        return Cost(self.flops * n, base.bytes)

    def step(self, r: float, t: int, x: np.ndarray, g: np.ndarray, *states: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def compute(self, r, t, *tensors):
        n = self._count(len(tensors))
        rate = float(np.asarray(r, dtype=np.float64).ravel()[0])
        count = int(np.asarray(t).ravel()[0])
        groups = [tensors[g * n:(g + 1) * n] for g in range(len(self.in_groups))]
        results = []
        for i in range(n):
            args = [grp[i].astype(np.float64) for grp in groups]
            results.append([o.astype(tensors[i].dtype) for o in self.step(rate, count, *args)])
        return [res[k] for k in range(self.out_groups) for res in results]


@dataclass(frozen=True, eq=False)
class Adagrad(_Optimizer):
    """r = R / (1 + T decay_factor); G' = norm_coefficient X + G; H_new = H + G'^2;
    X_new = X - r G' / (sqrt(H_new) + epsilon). Inputs R, T, X..., G..., H...; outputs X_new..., H_new...."""

    decay_factor: float = 0.0
    epsilon: float = 1e-6
    norm_coefficient: float = 0.0

    in_groups: ClassVar = ("X", "gradient", "accumulated squared gradient")
    out_groups: ClassVar = 2

    def step(self, r, t, x, g, h):
        rate = r / (1 + t * self.decay_factor)
        gr = self.norm_coefficient * x + g
        h_new = h + gr * gr
        return [x - rate * gr / (np.sqrt(h_new) + self.epsilon), h_new]


@dataclass(frozen=True, eq=False)
class Adam(_Optimizer):
    """G' = norm_coefficient X + G; V_new = alpha V + (1 - alpha) G'; H_new = beta H + (1 - beta) G'^2;
    R' = R sqrt(1 - beta^T) / (1 - alpha^T) when T > 0, else R;
    X_new = (1 - norm_coefficient_post) (X - R' V_new / (sqrt(H_new) + epsilon)).
    Inputs R, T, X..., G..., V..., H...; outputs X_new..., V_new..., H_new...."""

    alpha: float = 0.9
    beta: float = 0.999
    epsilon: float = 1e-6
    norm_coefficient: float = 0.0
    norm_coefficient_post: float = 0.0

    in_groups: ClassVar = ("X", "gradient", "accumulated gradient", "accumulated squared gradient")
    out_groups: ClassVar = 3
    flops: ClassVar = 12

    def step(self, r, t, x, g, v, h):
        gr = self.norm_coefficient * x + g
        v_new = self.alpha * v + (1 - self.alpha) * gr
        h_new = self.beta * h + (1 - self.beta) * gr * gr
        rate = r * np.sqrt(1 - self.beta ** t) / (1 - self.alpha ** t) if t > 0 else r
        x_new = x - rate * v_new / (np.sqrt(h_new) + self.epsilon)
        return [(1 - self.norm_coefficient_post) * x_new, v_new, h_new]


@dataclass(frozen=True, eq=False)
class Momentum(_Optimizer):
    """G' = norm_coefficient X + G; V_new = alpha V + beta' G' (beta' = beta when T > 0, else 1);
    X_new = X - R V_new ("standard") or X - R (G' + alpha V_new) ("nesterov").
    Inputs R, T, X..., G..., V...; outputs X_new..., V_new.... All four attributes are required."""

    alpha: float | None = None
    beta: float | None = None
    mode: str | None = None
    norm_coefficient: float | None = None

    in_groups: ClassVar = ("X", "gradient", "momentum")
    out_groups: ClassVar = 2

    def validate(self):
        for name in ("alpha", "beta", "mode", "norm_coefficient"):
            if getattr(self, name) is None:
                raise self.fail(f"attribute {name} is required")
        if self.mode not in ("standard", "nesterov"):
            raise self.fail(f"mode must be 'standard' or 'nesterov', got {self.mode!r}")

    def step(self, r, t, x, g, v):
        gr = self.norm_coefficient * x + g
        v_new = self.alpha * v + (self.beta if t > 0 else 1.0) * gr
        if self.mode == "nesterov":
            return [x - r * (gr + self.alpha * v_new), v_new]
        return [x - r * v_new, v_new]


OPS = (Adagrad, Adam, Momentum)
