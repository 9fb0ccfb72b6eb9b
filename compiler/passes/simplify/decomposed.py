"""Canonicalization rules for decomposed patterns: normalizations and activations as exporters write
them for older opsets (or as PyTorch modules spell them), each brought back to its op so that it
becomes one row kernel or one elementwise op. Each rule has ``match`` (the pieces, or the reason it
is not the pattern) and ``unrelated``: the reasons that mean a root was no attempt at the pattern at
all; the others are near misses, which ``kiln dump --explain-fusion`` lists (``Canonicalize``).

* ``decomposed-layernorm``: ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` over trailing axes;
* ``decomposed-rmsnorm``: ``x / sqrt(mean(x^2) + eps)`` or ``x * (1 / sqrt(mean(x^2) + eps))``
  (``Reciprocal`` too) over trailing axes: Llama's and T5's RMSNorm as PyTorch exports it;
* ``norm-affine``: LayerNormalization's result times or plus a constant, RMSNormalization's times
  one: absorbed into Scale and B;
* ``decomposed-gelu``: the erf form and GPT-2's tanh form;
* ``decomposed-rotary``: ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = concat(-x2, x1)``
  (Llama's rotary embedding as PyTorch exports it), cos and sin constants or ``cos/sin(cat(f, f))``
  → ``RotaryEmbedding``.
"""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node, Value
from ...ir.ops.base import known_ints
from ...ir.ops.tensor import _slice_range
from ...ir.types import DType
from ..rewrite import Rule, only_use_is, op


def _producer(v: Value, *names: str) -> Node | None:
    """``v``'s producer when it is one of the ops ``names``."""
    p = v.producer if v is not None else None
    return p if p is not None and p.op.name in names else None


def _scalar(v: Value) -> float | None:
    """The value of a constant holding one number (any shape of one element), else None."""
    if v is None or v.const is None or np.asarray(v.const).size != 1:
        return None
    return float(np.asarray(v.const).reshape(()))


def _reduced_axes(node: Node) -> tuple[int, ...] | None:
    """A ReduceMean's (keepdims) axes, non-negative and sorted, when they are known; else None."""
    if node.op.keepdims != 1 or len(node.inputs) < 2 or node.inputs[1] is None or node.inputs[1].const is None:
        return None
    rank = node.inputs[0].type.rank
    return tuple(sorted(int(a) % rank for a in np.asarray(node.inputs[1].const).reshape(-1)))


def _trailing_axes(mean: Node, rank: int) -> tuple[int, ...] | None:
    """A ReduceMean's axes when they are known and the trailing axes of a tensor of ``rank``."""
    axes = _reduced_axes(mean)
    return axes if axes and axes == tuple(range(axes[0], rank)) else None


def _root_mean_square(sq: Node, v: Value, what: str):
    """(eps, the ReduceMean, [the Add, the ReduceMean, the square]) when ``sq`` is
    ``Sqrt(ReduceMean(v^2) + eps)`` with a constant eps (``v^2`` as ``Pow(v, 2)`` or ``v * v``), else
    the reason it is not (``what`` names v)."""
    add = _producer(sq.inputs[0], "Add")
    (m, e) = (add.inputs if _scalar(add.inputs[1]) is not None else add.inputs[::-1]) if add else (None, None)
    eps, mean = _scalar(e), _producer(m, "ReduceMean")
    if eps is None or mean is None:
        return "the square root is not of mean(...) + eps with a constant eps"
    sqr = _producer(mean.inputs[0], "Pow", "Mul")
    if sqr is None or sqr.inputs[0] is not v or (
            sqr.inputs[1] is not v if sqr.op.name == "Mul" else _scalar(sqr.inputs[1]) != 2.0):
        return f"the mean is not of {what}^2"
    return eps, mean, [add, mean, sqr]


def _used_outside(root: Node, inner) -> str | None:
    """Why the pattern cannot be replaced: a node of ``inner`` (its nodes but the root) used outside it."""
    users = {id(n) for n in inner} | {id(root)}
    for n in inner:
        if any(u[0] is not None and id(u[0]) not in users for u in n.outputs[0].uses):
            return f"{n.op.name} {n.name or ''} is used outside the pattern".replace("  ", " ")
    return None


class _DecomposedNorm(Rule):
    """A normalization over trailing axes written out: ``match(node)`` gives (x, axes, eps) or the
    reason it is not the pattern; the rewrite is ``op_name(x, ones, axis, epsilon=eps)``."""

    op_name = ""

    @staticmethod
    def match(node: Node):
        raise NotImplementedError

    @staticmethod
    def found(root: Node, x: Value, axes, eps: float, inner):
        """(x, axes, eps) when x is a static float32 tensor and the pattern's nodes have no other use."""
        if x.dtype != DType.f32 or not x.type.is_static:
            return f"x is {x.type}: the rule takes static float32 tensors"
        return _used_outside(root, inner) or (x, axes, eps)

    def check(self, node):
        found = self.match(node)
        return found if isinstance(found, str) else None

    def rewrite(self, graph, node):
        x, axes, eps = self.match(node)
        ones = graph.add_constant(np.ones([int(d) for d in x.shape[axes[0]:]], np.float32))
        norm = graph.add_node(op(self.op_name, axis=axes[0], epsilon=eps), [x, ones], name=node.name, before=node)
        node.output.replace_all_uses_with(norm.outputs[0])


class DecomposedLayerNorm(_DecomposedNorm):
    """``Div(Sub(x, m), Sqrt(Add(ReduceMean(Pow(Sub(x, m), 2)), eps)))`` with ``m = ReduceMean(x)``
    over the same trailing axes → ``LayerNormalization(x, ones, axis, epsilon=eps)`` (float32: the
    decomposed form rounds each step to x's type; the op's stash type is float32)."""

    name = "decomposed-layernorm"
    op_name = "LayerNormalization"
    roots = ("Div",)
    #: the reason a root is no attempt at the pattern at all (others are near misses, reported)
    unrelated = ("the numerator is not x - mean(x)",)

    @staticmethod
    def match(node: Node):
        """(x, axes, eps, the nodes replaced) or the reason it is not the pattern."""
        d, s = node.inputs
        sub = _producer(d, "Sub")
        if sub is None:
            return "the numerator is not x - mean(x)"
        x, m = sub.inputs
        mean = _producer(m, "ReduceMean")
        if mean is None or mean.inputs[0] is not x:
            return "the numerator is not x - mean(x)"
        sq = _producer(s, "Sqrt")
        if sq is None:
            return "the denominator is not sqrt(variance + eps)"
        rms = _root_mean_square(sq, d, "(x - mean(x))")
        if isinstance(rms, str):
            return rms
        eps, var, inner = rms
        axes = _trailing_axes(mean, x.type.rank)
        if axes is None or axes != _reduced_axes(var):
            return "the means are not over the same trailing axes (constant, keepdims)"
        return DecomposedLayerNorm.found(node, x, axes, eps, [mean, sub, sq] + inner)


class NormAffine(Rule):
    """``LayerNormalization(x, scale, b) * c`` or ``+ c``, ``RMSNormalization(x, scale) * c``, with
    constants (``c`` of the normalized shape, or broadcast to it) → the normalization with ``scale *
    c`` (and ``b * c``, or ``b + c``): the affine step of a decomposed layer or RMS norm."""

    name = "norm-affine"
    roots = ("Mul", "Add")

    @staticmethod
    def split(node):
        for n, c in (node.inputs, node.inputs[::-1]):
            norm = _producer(n, "LayerNormalization", "RMSNormalization")
            if norm is not None and c is not None and c.const is not None and \
                    (node.op.name == "Mul" or norm.op.name == "LayerNormalization"):
                return norm, c
        return None, None

    def check(self, node):
        norm, c = self.split(node)
        if norm is None:
            return "no operand is a normalization's result and the other a constant (RMS: a product)"
        if not only_use_is(norm.outputs[0], node) or any(o.uses for o in norm.outputs[1:]):
            return f"the {norm.op.name}'s results have other uses"
        consts = [v for v in norm.inputs[1:] if v is not None]
        if any(v.const is None for v in consts):
            return f"the {norm.op.name}'s scale or bias is not constant"
        if any(v.dtype != DType.f32 for v in consts + [norm.outputs[0]]):
            return f"the {norm.op.name} is not float32 throughout"
        x = norm.inputs[0]
        shape = tuple(int(d) for d in x.shape[norm.op.axis % x.type.rank:])
        cs = tuple(int(d) for d in c.shape)
        if len(cs) > len(shape) or any(d not in (1, n) for d, n in zip(cs[::-1], shape[::-1])) or c.dtype != DType.f32:
            return f"the constant's shape {list(cs)} does not broadcast over the normalized axes {list(shape)}"
        if node.output.shape != norm.outputs[0].shape:
            return "the result broadcasts beyond the normalized tensor"
        return None

    def rewrite(self, graph, node):
        norm, c = self.split(node)
        x, scale = norm.inputs[0], norm.inputs[1]
        shape = [int(d) for d in x.shape[norm.op.axis % x.type.rank:]]
        cv = np.broadcast_to(np.asarray(c.const, np.float32), shape)
        s = np.broadcast_to(np.asarray(scale.const, np.float32), shape)
        if norm.op.name == "RMSNormalization":
            ins = [x, graph.add_constant(np.ascontiguousarray(s * cv, np.float32))]
        else:
            b = np.broadcast_to(np.asarray(norm.inputs[2].const, np.float32), shape) if len(norm.inputs) > 2 and \
                norm.inputs[2] is not None else np.zeros(shape, np.float32)
            s, b = (s * cv, b * cv) if node.op.name == "Mul" else (s, b + cv)
            ins = [x, graph.add_constant(np.ascontiguousarray(s, np.float32)),
                   graph.add_constant(np.ascontiguousarray(b, np.float32))]
        new = graph.add_node(norm.op, ins, name=norm.name, before=node)
        node.output.replace_all_uses_with(new.outputs[0])


class DecomposedRMSNorm(_DecomposedNorm):
    """``x / sqrt(mean(x^2) + eps)``, or ``x * (1 / sqrt(...))`` (``Div(1, ·)`` or ``Reciprocal``),
    the mean over trailing axes (``x^2`` as ``Pow(x, 2)`` or ``x * x``) →
    ``RMSNormalization(x, ones, axis, epsilon=eps)`` (float32, statistics in float32). Llama's and
    T5's RMSNorm as PyTorch exports it; its ``* weight`` is then absorbed (``norm-affine``)."""

    name = "decomposed-rmsnorm"
    op_name = "RMSNormalization"
    roots = ("Div", "Mul")
    unrelated = ("no sqrt(mean(...) + eps) divides x",)

    @staticmethod
    def match(node: Node):
        """(x, axes, eps) or the reason it is not the pattern."""
        inner: list[Node] = []
        found = None
        if node.op.name == "Div":  # (1 / sqrt(...) is the Mul form's reciprocal, matched from the Mul)
            if _scalar(node.inputs[0]) != 1.0:
                found = (node.inputs[0], _producer(node.inputs[1], "Sqrt"))
        else:
            for x, r in (node.inputs, node.inputs[::-1]):
                rec = _producer(r, "Div", "Reciprocal")
                if rec is None or (rec.op.name == "Div" and _scalar(rec.inputs[0]) != 1.0):
                    continue
                sq = _producer(rec.inputs[-1], "Sqrt")
                if sq is not None:
                    inner.append(rec)
                    found = (x, sq)
                    break
        if found is None or found[1] is None:
            return "no sqrt(mean(...) + eps) divides x"
        x, sq = found
        rms = _root_mean_square(sq, x, "x")
        if isinstance(rms, str):
            return rms
        eps, mean, more = rms
        axes = _trailing_axes(mean, x.type.rank)
        if axes is None:
            return "the mean is not over trailing axes (constant, keepdims)"
        return DecomposedRMSNorm.found(node, x, axes, eps, inner + [sq] + more)


class DecomposedGelu(Rule):
    """``x * (1 + erf(x / sqrt(2))) * 0.5`` (in either order of the products, ``x * (1/sqrt(2))`` too)
    → ``Gelu(x)``; with ``tanh(sqrt(2/pi) * (x + 0.044715 x^3))`` for the erf → ``Gelu(x,
    approximate="tanh")`` (GPT-2's)."""

    name = "decomposed-gelu"
    roots = ("Mul",)
    unrelated = ("no factor 0.5", "no x * (1 + erf(...)) beside the 0.5")

    @staticmethod
    def match(node: Node):
        """(x, the inner nodes) or the reason it is not the pattern."""
        inner = []
        a, b = node.inputs
        half, rest = (b, a) if _scalar(b) == 0.5 else (a, b) if _scalar(a) == 0.5 else (None, None)
        if half is not None:  # (x * (1 + erf)) * 0.5
            prod = _producer(rest, "Mul")
            if prod is None:
                return "no x * (1 + erf(...)) beside the 0.5"
            inner.append(prod)
            pair = prod.inputs
        else:  # (x * 0.5) * (1 + erf), or the other way round
            pair = None
            for h, other in ((a, b), (b, a)):
                hm = _producer(h, "Mul")
                if hm is not None and 0.5 in (_scalar(hm.inputs[0]), _scalar(hm.inputs[1])):
                    x = hm.inputs[0] if _scalar(hm.inputs[1]) == 0.5 else hm.inputs[1]
                    inner.append(hm)
                    pair = (x, other)
                    break
            if pair is None:
                return "no factor 0.5"
        found = None
        for x, one in (pair, pair[::-1]):
            add = _producer(one, "Add")
            if add is None:
                continue
            (e, c) = add.inputs if _scalar(add.inputs[1]) is not None else add.inputs[::-1]
            if _scalar(c) != 1.0:
                continue
            if (erf := _producer(e, "Erf")) is not None:
                scaled = _producer(erf.inputs[0], "Div", "Mul")
                if scaled is None or scaled.inputs[0] is not x:
                    continue
                k = _scalar(scaled.inputs[1])
                k = None if k is None else (k if scaled.op.name == "Div" else 1.0 / k if k else None)
                if k is not None and abs(k - 2 ** 0.5) < 1e-4:
                    found = (x, inner + [add, erf, scaled], "none")
            elif (tanh := _producer(e, "Tanh")) is not None:
                cubic = _tanh_argument(tanh.inputs[0], x)
                if cubic is not None:
                    found = (x, inner + [add, tanh] + cubic, "tanh")
        if found is None:
            return "no 1 + erf(x / sqrt(2)) or 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)) of the same x"
        x, nodes, approximate = found
        if x.dtype not in (DType.f32, DType.f64, DType.f16):
            return f"Gelu does not take {x.dtype}"
        return _used_outside(node, nodes) or found

    def check(self, node):
        found = self.match(node)
        return found if isinstance(found, str) else None

    def rewrite(self, graph, node):
        x, _, approximate = self.match(node)
        gelu = graph.add_node(op("Gelu", approximate=approximate), [x], name=node.name, before=node)
        node.output.replace_all_uses_with(gelu.output)


def _constant_times(v: Value, k: float) -> Value | None:
    """``w`` when ``v = w * c`` (either order) with the constant ``c`` within 1e-5 of ``k``."""
    p = _producer(v, "Mul")
    if p is None:
        return None
    for w, c in (p.inputs, p.inputs[::-1]):
        if _scalar(c) is not None and abs(_scalar(c) - k) <= 1e-5 * max(1.0, abs(k)):
            return w
    return None


def _tanh_argument(v: Value, x: Value) -> list[Node] | None:
    """The nodes of ``sqrt(2/pi) * (x + 0.044715 * x^3)`` computing ``v`` (the cube as Pow(x, 3) or
    x * (x * x) in any order), or None."""
    a = _constant_times(v, (2 / np.pi) ** 0.5)
    add = _producer(a, "Add")
    if add is None or x not in add.inputs:
        return None
    other = add.inputs[1] if add.inputs[0] is x else add.inputs[0]
    cube = _constant_times(other, 0.044715)
    c = _producer(cube, "Pow", "Mul")
    if c is None:
        return None
    if c.op.name == "Pow":
        inner = [] if c.inputs[0] is x and _scalar(c.inputs[1]) == 3.0 else None
    else:
        sq = next((_producer(w, "Mul") for w in c.inputs if w is not x), None)
        inner = [sq] if x in c.inputs and sq is not None and sq.inputs[0] is x and sq.inputs[1] is x else None
    if inner is None:
        return None
    return [v.producer, add, other.producer, c] + inner


def _last_axis_slice(n: Node | None) -> tuple[Value, int, int] | None:
    """(x, start, end) when ``n`` is a step-1 Slice of the last axis of a static ``x``, else None."""
    if n is None or _static_rank(n.inputs[0]) is None:
        return None
    x = n.inputs[0]
    ins = list(n.inputs) + [None] * (5 - len(n.inputs))
    starts, ends = known_ints(ins[1]), known_ints(ins[2])
    axes = known_ints(ins[3]) if ins[3] is not None else list(range(len(starts or [])))
    steps = known_ints(ins[4]) if ins[4] is not None else [1]
    rank, d = x.type.rank, int(x.shape[-1])
    if starts is None or ends is None or axes is None or len(starts) != 1 or len(ends) != 1 or \
            len(axes) != 1 or axes[0] % rank != rank - 1 or steps != [1]:
        return None
    start, end, _ = _slice_range(d, starts[0], ends[0], 1)
    return x, start, end


def _static_rank(v: Value | None) -> int | None:
    """The rank of a static tensor value, else None."""
    return v.type.rank if v is not None and getattr(v.type, "is_static", False) else None


def _rotate_half(r: Value):
    """(x, [the Concat, Neg and Slices]) when ``r`` is ``concat(-x[..., h:], x[..., :h])`` along the
    last axis of x (2h features), else None."""
    cat = _producer(r, "Concat")
    if cat is None or len(cat.inputs) != 2 or _static_rank(r) is None or cat.op.axis % r.type.rank != r.type.rank - 1:
        return None
    neg = _producer(cat.inputs[0], "Neg")
    hi = _last_axis_slice(_producer(neg.inputs[0], "Slice")) if neg is not None else None
    lo = _last_axis_slice(_producer(cat.inputs[1], "Slice"))
    if hi is None or lo is None or hi[0] is not lo[0]:
        return None
    x, d = hi[0], int(hi[0].shape[-1])
    if d % 2 or lo[1:] != (0, d // 2) or hi[1:] != (d // 2, d):
        return None
    return x, [cat, neg, neg.inputs[0].producer, cat.inputs[1].producer]


def _computed_cache(c: Value, shape: list[int]):
    """(the unary op, f) when ``c`` is ``op(concat(f, f))`` along the last axis (op Cos or Sin: its
    halves are equal by construction), seen through a view that adds the head axis, with f of
    [B, S, D/2] or [S, D/2] (B = 1 or any, broadcast); else the reason it is not."""
    b, _, s, d = shape
    v = c
    p = _producer(v, "Unsqueeze", "Reshape")
    if p is not None and tuple(int(n) for n in v.shape) in ((b, 1, s, d), (1, 1, s, d)) and \
            tuple(int(n) for n in p.inputs[0].shape) in ((b, s, d), (1, s, d), (s, d)):
        v = p.inputs[0]  # (HF's cos.unsqueeze(1))
    u = _producer(v, "Cos", "Sin")
    cat = _producer(u.inputs[0], "Concat") if u is not None else None
    if cat is None or len(cat.inputs) != 2 or cat.inputs[0] is not cat.inputs[1] or \
            cat.op.axis % cat.outputs[0].type.rank != cat.outputs[0].type.rank - 1:
        return "cos and sin are computed at run time, and not as cos/sin(cat(freqs, freqs))"
    f = cat.inputs[0]
    if tuple(int(n) for n in f.shape) not in ((b, s, d // 2), (1, s, d // 2), (s, d // 2)):
        return f"the frequencies {list(f.shape)} are not [batch, seq, head/2]"
    return u.op.name, f


def _cache(c: Value, x: Value):
    """``c`` (cos or sin, broadcast to x's [B, H, S, D]) as the op's per-token cache [B, S, D/2]: an
    array (c a constant), or (Cos or Sin, f) for one computed as ``cos/sin(cat(f, f))``; or the reason
    it cannot be."""
    shape = [int(d) for d in x.shape]
    if c.const is None:
        return _computed_cache(c, shape)
    a = np.asarray(c.const, np.float32)
    if a.ndim > 4:
        return "cos or sin has more axes than x"
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)
    if a.shape[1] != 1:
        return "cos or sin differs between heads"
    full = np.broadcast_to(a[:, 0], (shape[0], shape[2], shape[3]))
    h = shape[3] // 2
    if not np.array_equal(full[..., :h], full[..., h:]):
        return "cos or sin differs between the two halves of the features (not cat(freqs, freqs))"
    return np.ascontiguousarray(full[..., :h])


def _cache_value(graph, cache, x: Value, before: Node) -> Value:
    """The cache [B, S, D/2] in the graph: a constant, or op(f) (reshaped and broadcast to it)."""
    if isinstance(cache, np.ndarray):
        return graph.add_constant(cache)
    name, f = cache
    b, _, s, d = (int(n) for n in x.shape)
    v = graph.add_node(op(name), [f], before=before).output
    if v.type.rank == 2:
        v = graph.add_node(op("Reshape"), [v, graph.add_constant(np.array([1, s, d // 2], np.int64))],
                           before=before).output
    if int(v.shape[0]) != b:
        v = graph.add_node(op("Expand"), [v, graph.add_constant(np.array([b, s, d // 2], np.int64))],
                           before=before).output
    return v


class DecomposedRotary(Rule):
    """``x * cos + rotate_half(x) * sin`` (either order of each product and of the sum), with
    ``rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])`` on a static float32 ``x`` of [B, H, S, D],
    and cos, sin with equal halves, the same for every head: constants (checked), or computed at run
    time as ``cos(cat(f, f))`` and ``sin(cat(f, f))`` (Hugging Face's rotary module, position ids fed
    to the model; viewed as [B, 1, S, D]) →
    ``RotaryEmbedding(x, cos[..., :D/2], sin[..., :D/2])`` with per-token caches [B, S, D/2] (computed:
    ``cos(f)``, ``sin(f)``). Exact:
    each result is ``x1 * cos - x2 * sin`` or ``x2 * cos + x1 * sin``, the op's two sums. When x is
    the head split ``Transpose(perm=[0, 2, 1, 3])``, the op rotates the [B, S, H*D] projection
    (``num_heads``) and the Transpose follows it."""

    name = "decomposed-rotary"
    roots = ("Add",)
    unrelated = ("not x * cos + rotate_half(x) * sin",)

    @staticmethod
    def match(node: Node):
        """(x, cos cache, sin cache) or the reason it is not the pattern."""
        for a, b in (node.inputs, node.inputs[::-1]):
            ma, mb = _producer(a, "Mul"), _producer(b, "Mul")
            if ma is None or mb is None:
                continue
            for r, sin in (mb.inputs, mb.inputs[::-1]):
                rot = _rotate_half(r)
                if rot is None or rot[0] not in ma.inputs:
                    continue
                x, inner = rot
                cos = ma.inputs[1] if ma.inputs[0] is x else ma.inputs[0]
                if x.dtype is not DType.f32 or x.type.rank != 4:
                    return f"x is {x.type}: the rule takes static float32 [batch, heads, seq, head] tensors"
                caches = [_cache(c, x) for c in (cos, sin)]
                why = next((c for c in caches if isinstance(c, str)), None)
                return why or _used_outside(node, [ma, mb] + inner) or (x, *caches)
        return "not x * cos + rotate_half(x) * sin"

    def check(self, node):
        found = self.match(node)
        return found if isinstance(found, str) else None

    def rewrite(self, graph, node):
        x, cos, sin = self.match(node)
        caches = [_cache_value(graph, c, x, node) for c in (cos, sin)]
        t = _producer(x, "Transpose")
        if t is not None and list(t.op._perm(4)) == [0, 2, 1, 3]:
            # the head split's Transpose moves after the rotation: the op reads the [B, S, H, D]
            # projection as [B, S, H*D] (num_heads), and the Transpose is left to its consumer (the
            # attention kernel reads it as strides)
            y = t.inputs[0]
            b, s, h, d = (int(v) for v in y.shape)
            flat = graph.add_node(op("Reshape"), [y, graph.add_constant(np.array([b, s, h * d], np.int64))],
                                  before=node).output
            rope = graph.add_node(op("RotaryEmbedding", num_heads=h), [flat] + caches, name=node.name, before=node)
            back = graph.add_node(op("Reshape"), [rope.output, graph.add_constant(np.array([b, s, h, d], np.int64))],
                                  before=node).output
            out = graph.add_node(op("Transpose", perm=[0, 2, 1, 3]), [back], before=node).output
        else:
            out = graph.add_node(op("RotaryEmbedding"), [x] + caches, name=node.name, before=node).output
        node.output.replace_all_uses_with(out)
