"""Normalizations, softmax and losses: batch/instance/layer/group/RMS/Lp/mean-variance normalization,
Softmax, LogSoftmax, Hardmax, Dropout, SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

Most of these reduce over some axes, then map every element with the reduced statistics (pattern
REDUCE). Statistics of narrow floats are computed in float32 (``stash_type`` says the precision where
the op has it); the result is rounded to the output's element type once at the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..graph import Value
from ..types import DType, TensorType
from .base import FLOATS, STD_FLOATS, Cost, OpDef, Pattern, check_dtype, norm_axis, same_dtype
from .common import check_flags, dims_agree, precise_dim

_INDEX_TYPES = frozenset({DType.i32, DType.i64})


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _work(dt: np.dtype) -> type:
    """The NumPy type statistics are computed in: float64 for float64, float32 otherwise."""
    return np.float64 if np.dtype(dt) == np.float64 else np.float32


def _stash_dtype(op: OpDef, code: int) -> DType:
    try:
        dt = DType.from_onnx(code)
    except TypeError:
        dt = None
    if dt not in STD_FLOATS:
        raise op.fail(f"stash_type {code} is not supported (supported: 1 = float32, 10 = float16, "
                      "11 = float64, 16 = bfloat16)")
    return dt


def _check_epsilon(op: OpDef) -> None:
    if not op.epsilon >= 0:
        raise op.fail(f"epsilon must be >= 0, got {op.epsilon}")


def _check_rank(op: OpDef, v: Value, least: int, what: str) -> None:
    if v.type.rank < least:
        raise op.fail(f"{what} must have rank >= {least}, got {v.type}")


def _check_channel_vector(op: OpDef, v: Value, channels, what: str) -> None:
    """``v`` is a 1-D tensor of ``channels`` elements."""
    if v.type.rank != 1 or not dims_agree(v.shape[0], channels):
        raise op.fail(f"{what} must be a 1-D tensor of {channels if channels is not None else 'C'} "
                      f"elements (one per channel), got {v.type}")


def _check_unidirectional(op: OpDef, x: Value, v: Value, what: str) -> None:
    """``v`` broadcasts to ``x``'s shape without changing it (ONNX unidirectional broadcasting)."""
    ok = v.type.rank <= x.type.rank
    if ok:
        for dx, dv in zip(reversed(x.shape), reversed(v.shape)):
            if dv != 1 and not dims_agree(dx, dv):
                ok = False
                break
    if not ok:
        raise op.fail(f"{what} {v.type} does not broadcast to the input's shape {x.type}")


def _numel(t: TensorType | None) -> int:
    return (t.numel or 0) if t is not None else 0


def _bytes(ins, outs) -> int:
    return sum((t.nbytes or 0) for t in list(ins) + list(outs) if t is not None)


@dataclass(frozen=True, eq=False)
class _Norm(OpDef):
    """Base of the normalizations: FLOPs are ``flops_per_element`` times the input's elements."""

    pattern: ClassVar = Pattern.REDUCE
    flops_per_element: ClassVar[int] = 6

    def cost(self, ins, outs):
        return Cost(self.flops_per_element * _numel(ins[0]), _bytes(ins, outs))


def _standardize(xu: np.ndarray, axes: tuple, epsilon: float):
    """(x - mean) / sqrt(var + eps) over ``axes`` (population variance), with mean and 1/std."""
    mean = xu.mean(axis=axes, keepdims=True)
    dev = xu - mean
    var = (dev * dev).mean(axis=axes, keepdims=True)
    inv = (1.0 / np.sqrt(var + epsilon)).astype(xu.dtype, copy=False)
    return dev * inv, mean, inv


def _affine(normalized: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None,
            out_dtype) -> np.ndarray:
    """normalized * scale + bias, computed in float32 (float64 for float64), rounded to out_dtype."""
    w = _work(out_dtype)
    y = normalized.astype(w, copy=False)
    if scale is not None:
        y = y * scale.astype(w, copy=False)
    if bias is not None:
        y = y + bias.astype(w, copy=False)
    return y.astype(out_dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# Batch, instance, group normalization (channel axis 1)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class BatchNormalization(_Norm):
    """y = (x - mean) / sqrt(var + epsilon) * scale + B, per channel (axis 1).

    Inference (training_mode=0): mean and var are the inputs; the extra outputs are not defined by
    ONNX (Kiln passes the inputs through). Training (training_mode=1): mean and var are the batch
    statistics (population variance over every axis but 1), and the outputs running_mean/running_var
    are ``input * momentum + batch * (1 - momentum)``. Inference mode is a per-channel affine map
    (pattern BROADCAST on the instance); training mode reduces (REDUCE).
    """

    epsilon: float = 1e-5
    momentum: float = 0.9
    training_mode: int = 0
    inputs: ClassVar = ("X", "scale", "B", "input_mean", "input_var")
    outputs: ClassVar = ("Y", "running_mean", "running_var")
    since: ClassVar = 15

    def validate(self):
        check_flags(self, "training_mode")
        _check_epsilon(self)
        # inference is a per-channel affine map: it fuses like a broadcast
        object.__setattr__(self, "pattern", Pattern.REDUCE if self.training_mode else Pattern.BROADCAST)

    def infer(self, ins):
        x, scale, b, mean, var = ins
        check_dtype(self, x, STD_FLOATS, "X")
        _check_rank(self, x, 2, "X (N x C x D1 ...)")
        c = x.shape[1]
        if scale.dtype != b.dtype or scale.dtype not in STD_FLOATS:
            raise self.fail(f"scale and B must share one float element type, got {scale.dtype} and {b.dtype}")
        if mean.dtype != var.dtype or mean.dtype not in STD_FLOATS:
            raise self.fail(f"input_mean and input_var must share one float element type, got "
                            f"{mean.dtype} and {var.dtype}")
        for v, what in ((scale, "scale"), (b, "B"), (mean, "input_mean"), (var, "input_var")):
            _check_channel_vector(self, v, c, what)
        stats = TensorType(mean.dtype, (c,))
        return [x.type, stats, stats]

    def compute(self, x, scale, b, mean, var):
        w = _work(x.dtype)
        xu = x.astype(w, copy=False)
        bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        if self.training_mode:
            axes = (0,) + tuple(range(2, x.ndim))
            cur_mean = xu.mean(axis=axes)
            cur_var = ((xu - cur_mean.reshape(bshape)) ** 2).mean(axis=axes)
            m = self.momentum
            run_mean = mean.astype(w) * m + cur_mean * (1 - m)
            run_var = var.astype(w) * m + cur_var * (1 - m)
            use_mean, use_var = cur_mean, cur_var
        else:
            use_mean, use_var = mean.astype(w), var.astype(w)
            run_mean, run_var = mean, var
        inv = 1.0 / np.sqrt(use_var + self.epsilon)
        y = (xu - use_mean.reshape(bshape)) * (inv * scale.astype(w)).reshape(bshape) + b.astype(w).reshape(bshape)
        return [y.astype(x.dtype, copy=False), np.asarray(run_mean).astype(mean.dtype),
                np.asarray(run_var).astype(var.dtype)]

    def cost(self, ins, outs):
        per = 7 if self.training_mode else 2
        return Cost(per * _numel(ins[0]), _bytes(ins, outs))


@dataclass(frozen=True, eq=False)
class InstanceNormalization(_Norm):
    """y = scale * (x - mean) / sqrt(var + epsilon) + B, statistics per instance and channel."""

    epsilon: float = 1e-5
    inputs: ClassVar = ("input", "scale", "B")
    outputs: ClassVar = ("output",)
    since: ClassVar = 22

    def validate(self):
        _check_epsilon(self)

    def infer(self, ins):
        x, scale, b = ins
        same_dtype(self, ins, STD_FLOATS)
        _check_rank(self, x, 2, "input (N x C x D1 ...)")
        _check_channel_vector(self, scale, x.shape[1], "scale")
        _check_channel_vector(self, b, x.shape[1], "B")
        return [x.type]

    def compute(self, x, scale, b):
        xu = x.astype(_work(x.dtype), copy=False)
        normalized, _, _ = _standardize(xu, tuple(range(2, x.ndim)), self.epsilon)
        bshape = (x.shape[1],) + (1,) * (x.ndim - 2)
        return [_affine(normalized, scale.reshape(bshape), b.reshape(bshape), x.dtype)]


@dataclass(frozen=True, eq=False)
class GroupNormalization(_Norm):
    """Normalize each group of ``C / num_groups`` channels per instance, then scale and shift per
    channel (the opset-21 form; opset 18's per-group scale/bias are expanded on import).

    Statistics are computed in the precision ``stash_type`` names; the normalized values are rounded to
    X's type before the per-channel affine map.
    """

    num_groups: int | None = None
    epsilon: float = 1e-5
    stash_type: int = 1
    inputs: ClassVar = ("X", "scale", "bias")
    outputs: ClassVar = ("Y",)
    since: ClassVar = 21

    def validate(self):
        if self.num_groups is None:
            raise self.fail("attribute num_groups is required")
        if self.num_groups < 1:
            raise self.fail(f"num_groups must be >= 1, got {self.num_groups}")
        _check_epsilon(self)
        _stash_dtype(self, self.stash_type)

    def infer(self, ins):
        x, scale, bias = ins
        same_dtype(self, ins, STD_FLOATS)
        _check_rank(self, x, 2, "X (N x C x D1 ...)")
        c = x.shape[1]
        if isinstance(c, int) and c % self.num_groups:
            raise self.fail(f"the {c} channels do not split into num_groups={self.num_groups} equal groups")
        _check_channel_vector(self, scale, c, "scale")
        _check_channel_vector(self, bias, c, "bias")
        return [x.type]

    def compute(self, x, scale, bias):
        n, c = x.shape[:2]
        g = self.num_groups
        if c % g:
            raise ValueError(f"{c} channels do not split into {g} groups")
        rest = int(np.prod(x.shape[2:], dtype=np.int64))
        w = _work(_stash_dtype(self, self.stash_type).np)
        xu = x.astype(w, copy=False).reshape(n, g, (c // g) * rest)
        normalized, _, _ = _standardize(xu, (2,), self.epsilon)
        normalized = normalized.reshape(x.shape).astype(x.dtype)
        bshape = (c,) + (1,) * (x.ndim - 2)
        return [_affine(normalized, scale.reshape(bshape), bias.reshape(bshape), x.dtype)]


# ---------------------------------------------------------------------------------------------
# Layer and RMS normalization (over the trailing axes from ``axis``)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _TrailingNorm(_Norm):
    """Base of LayerNormalization and RMSNormalization: statistics over the axes [axis, rank), in
    ``stash_type`` precision."""

    axis: int = -1
    epsilon: float = 1e-5
    stash_type: int = 1

    def validate(self):
        _check_epsilon(self)
        _stash_dtype(self, self.stash_type)


@dataclass(frozen=True, eq=False)
class LayerNormalization(_TrailingNorm):
    """Standardize over axes [axis, rank), in ``stash_type`` precision; round to X's type; then
    ``* Scale + B`` (both unidirectionally broadcast to X). Outputs Mean and InvStdDev have X's
    leading dims and 1 for the normalized axes, element type ``stash_type``."""

    inputs: ClassVar = ("X", "Scale", "B?")
    outputs: ClassVar = ("Y", "Mean", "InvStdDev")
    since: ClassVar = 17
    flops_per_element: ClassVar = 8

    def infer(self, ins):
        x, scale, b = (list(ins) + [None])[:3]
        same_dtype(self, ins, STD_FLOATS)
        _check_rank(self, x, 1, "X")
        a = norm_axis(self, self.axis, x.type.rank)
        _check_unidirectional(self, x, scale, "Scale")
        if b is not None:
            _check_unidirectional(self, x, b, "B")
        stats = TensorType(_stash_dtype(self, self.stash_type), x.shape[:a] + (1,) * (x.type.rank - a))
        return [x.type, stats, stats]

    def compute(self, x, scale, b=None):
        a = self.axis % x.ndim
        stash = _stash_dtype(self, self.stash_type).np
        xu = x.astype(_work(stash), copy=False)
        normalized, mean, inv = _standardize(xu, tuple(range(a, x.ndim)), self.epsilon)
        y = _affine(normalized.astype(x.dtype), scale, b, x.dtype)
        return [y, mean.astype(stash), inv.astype(stash)]


@dataclass(frozen=True, eq=False)
class RMSNormalization(_TrailingNorm):
    """y = x / sqrt(mean(x^2 over axes [axis, rank)) + epsilon) * scale; the result has scale's
    element type (X and scale may differ). Statistics in ``stash_type`` precision."""

    inputs: ClassVar = ("X", "scale")
    outputs: ClassVar = ("Y",)
    since: ClassVar = 23
    flops_per_element: ClassVar = 4

    def infer(self, ins):
        x, scale = ins
        check_dtype(self, x, STD_FLOATS, "X")
        check_dtype(self, scale, STD_FLOATS, "scale")
        _check_rank(self, x, 1, "X")
        norm_axis(self, self.axis, x.type.rank)
        _check_unidirectional(self, x, scale, "scale")
        return [TensorType(scale.dtype, x.shape)]

    def compute(self, x, scale):
        a = self.axis % x.ndim
        xu = x.astype(_work(_stash_dtype(self, self.stash_type).np), copy=False)
        ms = (xu * xu).mean(axis=tuple(range(a, x.ndim)), keepdims=True)
        normalized = (xu / np.sqrt(ms + self.epsilon)).astype(x.dtype)
        return [_affine(normalized, scale, None, scale.dtype)]


# ---------------------------------------------------------------------------------------------
# Lp and mean-variance normalization
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _AxisOp(_Norm):
    """Base of the ops along one ``axis`` of a float input, LpNormalization and the softmax family;
    ``compute`` applies ``fn`` in the work type (LpNormalization has its own)."""

    axis: int = -1
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    since: ClassVar = 13

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, STD_FLOATS)
        _check_rank(self, x, 1, "input")
        norm_axis(self, self.axis, x.type.rank)
        return [x.type]

    def fn(self, xu: np.ndarray, axis: int) -> np.ndarray:
        raise NotImplementedError

    def compute(self, x):
        a = self.axis % x.ndim
        if x.shape[a] == 0:
            return [x.copy()]
        xu = x.astype(_work(x.dtype), copy=False)
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            return [self.fn(xu, a).astype(x.dtype)]


@dataclass(frozen=True, eq=False)
class LpNormalization(_AxisOp):
    """y = x / ||x||_p along ``axis`` (p = 1 or 2); 0 where the norm is 0."""

    p: int = 2
    since: ClassVar = 22
    flops_per_element: ClassVar = 3

    def validate(self):
        if self.p not in (1, 2):
            raise self.fail(f"p must be 1 or 2, got {self.p}")

    def compute(self, x):
        a = self.axis % x.ndim
        xu = x.astype(_work(x.dtype), copy=False)
        if self.p == 1:
            norm = np.abs(xu).sum(axis=a, keepdims=True)
        else:
            norm = np.sqrt((xu * xu).sum(axis=a, keepdims=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(norm == 0, 0, xu / norm)
        return [y.astype(x.dtype)]


@dataclass(frozen=True, eq=False)
class MeanVarianceNormalization(_Norm):
    """y = (x - mean) / (std + 1e-9), mean and (population) std over ``axes``."""

    axes: tuple[int, ...] = (0, 2, 3)
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    since: ClassVar = 13
    #: added to the standard deviation (fixed by the ONNX definition)
    EPS: ClassVar[float] = 1e-9

    def _axes(self, rank: int) -> tuple[int, ...]:
        axes = tuple(norm_axis(self, a, rank, "axes entry") for a in self.axes)
        if len(set(axes)) != len(axes):
            raise self.fail(f"axes {list(self.axes)} repeat an axis")
        return axes

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, STD_FLOATS)
        self._axes(x.type.rank)
        return [x.type]

    def compute(self, x):
        axes = self._axes(x.ndim)
        xu = x.astype(_work(x.dtype), copy=False)
        mean = xu.mean(axis=axes, keepdims=True)
        dev = xu - mean
        std = np.sqrt((dev * dev).mean(axis=axes, keepdims=True))
        return [(dev / (std + self.EPS)).astype(x.dtype)]


# ---------------------------------------------------------------------------------------------
# Softmax family (the opset-13 per-axis form; older forms are converted on import)
# ---------------------------------------------------------------------------------------------

def _shifted(xu: np.ndarray, axis: int) -> np.ndarray:
    m = xu.max(axis=axis, keepdims=True)
    return xu - np.where(np.isfinite(m), m, 0)


@dataclass(frozen=True, eq=False)
class Softmax(_AxisOp):
    """exp(x) / sum(exp(x)) along ``axis`` (computed stably, shifted by the max)."""

    flops_per_element: ClassVar = 12

    def fn(self, xu, axis):
        e = np.exp(_shifted(xu, axis))
        return e / e.sum(axis=axis, keepdims=True)


@dataclass(frozen=True, eq=False)
class LogSoftmax(_AxisOp):
    """x - log(sum(exp(x))) along ``axis`` (computed stably, shifted by the max)."""

    flops_per_element: ClassVar = 12

    def fn(self, xu, axis):
        s = _shifted(xu, axis)
        return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@dataclass(frozen=True, eq=False)
class Hardmax(_AxisOp):
    """1 at the first maximum along ``axis``, 0 elsewhere."""

    flops_per_element: ClassVar = 2

    def fn(self, xu, axis):
        first = np.expand_dims(np.argmax(xu, axis=axis), axis)
        positions = np.arange(xu.shape[axis]).reshape((-1,) + (1,) * (xu.ndim - 1 - axis))
        return (positions == first).astype(xu.dtype)


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------

def _scalar_input(op: OpDef, v: Value | None, allowed, what: str) -> None:
    if v is None:
        return
    check_dtype(op, v, allowed, what)
    if v.type.rank > 1 or v.type.numel not in (1, None):
        raise op.fail(f"{what} must be a scalar, got {v.type}")


@dataclass(frozen=True, eq=False)
class Dropout(OpDef):
    """Inference (training_mode absent or false, or ratio 0): output = data, mask all true.

    Training: mask = uniform[0, 1) >= ratio (NumPy's RandomState seeded with ``seed``, or a fresh
    random seed when it is not set), output = data * mask / (1 - ratio). Never folded at compile time
    unless training_mode is known to be false.
    """

    seed: int | None = None
    inputs: ClassVar = ("data", "ratio?", "training_mode?")
    outputs: ClassVar = ("output", "mask")
    pattern: ClassVar = Pattern.ELEMWISE
    since: ClassVar = 22

    def infer(self, ins):
        x, ratio, training = (list(ins) + [None, None])[:3]
        check_dtype(self, x, FLOATS, "data")
        _scalar_input(self, ratio, STD_FLOATS, "ratio")
        _scalar_input(self, training, {DType.bool}, "training_mode")
        if ratio is not None and ratio.known is not None:
            r = float(np.asarray(ratio.known).ravel()[0])
            if not 0 <= r < 1:
                raise self.fail(f"ratio must be in [0, 1), got {r}")
        return [x.type, x.type.with_dtype(DType.bool)]

    def propagate(self, ins, types):
        training = ins[2] if len(ins) > 2 else None
        if training is not None and (training.known is None or bool(np.asarray(training.known).ravel()[0])):
            return [None] * len(types)
        return super().propagate(ins, types)

    def compute(self, x, ratio=None, training=None):
        r = 0.5 if ratio is None else float(np.asarray(ratio).ravel()[0])
        train = training is not None and bool(np.asarray(training).ravel()[0])
        if not train or r == 0:
            return [x.copy(), np.ones(x.shape, dtype=bool)]
        if not 0 <= r < 1:
            raise ValueError(f"ratio must be in [0, 1), got {r}")
        rng = (np.random.RandomState(self.seed % (1 << 32)) if self.seed is not None
               else np.random.RandomState())
        mask = rng.uniform(0.0, 1.0, x.shape) >= r
        w = _work(x.dtype)
        y = x.astype(w) * mask * w(1.0 / (1.0 - r))
        return [y.astype(x.dtype), mask]


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------

_REDUCTIONS = ("none", "sum", "mean")


def _nll(logp: np.ndarray, target: np.ndarray, weight: np.ndarray | None, ignore_index: int | None,
         reduction: str) -> np.ndarray:
    """The (weighted) negative log likelihood of class ``target`` along axis 1 of ``logp``."""
    c = logp.shape[1]
    t = target.astype(np.int64)
    valid = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    bad = valid & ((t < 0) | (t >= c))
    if bad.any():
        raise ValueError(f"target value {int(t[bad][0])} is out of range [0, {c}) (and is not ignore_index)")
    safe = np.where(valid, t, 0)
    picked = np.take_along_axis(logp, np.expand_dims(safe, 1), axis=1)[:, 0]
    w = weight.astype(logp.dtype)[safe] if weight is not None else np.ones(t.shape, logp.dtype)
    w = np.where(valid, w, 0).astype(logp.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        return loss.sum() / w.sum()


@dataclass(frozen=True, eq=False)
class _Loss(OpDef):
    ignore_index: int | None = None
    reduction: str = "mean"
    pattern: ClassVar = Pattern.REDUCE
    flops_per_element: ClassVar[int] = 2

    def validate(self):
        if self.reduction not in _REDUCTIONS:
            raise self.fail(f"reduction must be one of {', '.join(_REDUCTIONS)}, got {self.reduction!r}")

    def _infer_loss(self, x: Value, target: Value, weight: Value | None, xname: str, tname: str,
                    wname: str) -> TensorType:
        check_dtype(self, x, STD_FLOATS, xname)
        check_dtype(self, target, _INDEX_TYPES, tname)
        _check_rank(self, x, 2, f"{xname} (N x C x D1 ...)")
        expect = (x.shape[0],) + x.shape[2:]
        if target.type.rank != len(expect) or not all(dims_agree(a, b) for a, b in zip(target.shape, expect)):
            raise self.fail(f"{tname} {target.type} must have {xname}'s shape without the class axis 1 "
                            f"({xname} is {x.type})")
        if weight is not None:
            if weight.dtype != x.dtype:
                raise self.fail(f"{wname} has element type {weight.dtype}, {xname} {x.dtype}: they must match")
            _check_channel_vector(self, weight, x.shape[1], wname)
        shape = tuple(precise_dim(a, b) for a, b in zip(target.shape, expect))
        return TensorType(x.dtype, shape if self.reduction == "none" else ())

    def cost(self, ins, outs):
        return Cost(self.flops_per_element * _numel(ins[0]), _bytes(ins, outs))


@dataclass(frozen=True, eq=False)
class NegativeLogLikelihoodLoss(_Loss):
    """loss[n, d...] = -input[n, target[n, d...], d...] * weight[target] (0 where target ==
    ignore_index); reduced by none / sum / mean (mean divides by the sum of the weights used)."""

    inputs: ClassVar = ("input", "target", "weight?")
    outputs: ClassVar = ("loss",)
    since: ClassVar = 22

    def infer(self, ins):
        x, target, weight = (list(ins) + [None])[:3]
        return [self._infer_loss(x, target, weight, "input", "target", "weight")]

    def compute(self, x, target, weight=None):
        w = _work(x.dtype)
        loss = _nll(x.astype(w, copy=False), target, weight, self.ignore_index, self.reduction)
        return [np.asarray(loss).astype(x.dtype)]


@dataclass(frozen=True, eq=False)
class SoftmaxCrossEntropyLoss(_Loss):
    """NegativeLogLikelihoodLoss of LogSoftmax(scores, axis=1); the optional second output is that
    log-probability tensor."""

    inputs: ClassVar = ("scores", "labels", "weights?")
    outputs: ClassVar = ("output", "log_prob")
    since: ClassVar = 13
    flops_per_element: ClassVar = 14

    def infer(self, ins):
        x, labels, weights = (list(ins) + [None])[:3]
        return [self._infer_loss(x, labels, weights, "scores", "labels", "weights"), x.type]

    def compute(self, x, labels, weights=None):
        w = _work(x.dtype)
        xu = x.astype(w, copy=False)
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            s = _shifted(xu, 1)
            logp = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
        loss = _nll(logp, labels, weights, self.ignore_index, self.reduction)
        return [np.asarray(loss).astype(x.dtype), logp.astype(x.dtype)]


OPS = (BatchNormalization, InstanceNormalization, GroupNormalization, LayerNormalization, RMSNormalization,
       LpNormalization, MeanVarianceNormalization, Softmax, LogSoftmax, Hardmax, Dropout,
       NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)
