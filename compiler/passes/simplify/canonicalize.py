"""Canonicalization: declarative rewrite rules that bring the graph to one normal form.

* Identity and inference-mode Dropout disappear.
* Sum of n inputs becomes a chain of Adds.
* Flatten / Squeeze / Unsqueeze with a static result become Reshape; chains of Reshapes collapse to
  one; a Reshape to its input's shape disappears.
* Transpose chains compose into one Transpose; an identity permutation disappears.
* MatMul by a constant matrix followed by Add of a constant bias becomes Gemm (through a Reshape to
  2-D when the activation has more dimensions, as in transformer layers).
* MatMul of float16 or bfloat16 operands becomes Casts to float32 around a float32 MatMul (what its
  reference computes: the product of the widened operands, rounded once).
* Decomposed normalizations and activations, as exporters write them for older opsets, become the
  op: ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` over trailing axes is
  LayerNormalization (a following ``* gamma`` and ``+ beta`` by constants become its Scale and B),
  and ``0.5 * x * (1 + erf(x / sqrt(2)))`` is Gelu (its tanh form too), so each becomes one row kernel or one
  elementwise op; ``kiln dump --explain-fusion`` lists the near misses and why they did not match.
* Einsum of two operands of a type MatMul takes whose labels are batch, row, column or
  contracted labels (each in the places a matrix product puts it; a label in one operand only, not
  in the result, is summed there first) becomes Transposes and Reshapes around one MatMul; Einsum of
  one operand (a sum, a transpose) becomes a ReduceSum and a Transpose.
"""
from __future__ import annotations

import numpy as np

from ...ir import ops
from ...ir.graph import Graph, Node, Value
from ...ir.types import DType
from ..manager import Pass
from ..rewrite import Rule, apply_rules, explain


def op(name: str, **attrs):
    cls = ops.lookup(name)
    if cls is None:  # pragma: no cover - every op used here is in the table
        raise RuntimeError(f"op {name} is missing from the op table")
    return cls(**attrs)


def only_use_is(v: Value, node: Node) -> bool:
    use = v.uses.single()
    return use is not None and use[0] is node


def reshape_to(graph: Graph, x: Value, shape, before: Node, name: str | None = None) -> Value:
    """``x`` reshaped to the static ``shape`` (a 0 in it is a size-0 axis: allowzero, not "copy")."""
    target = graph.add_constant(np.asarray(shape, dtype=np.int64))
    reshape = op("Reshape", allowzero=1) if 0 in tuple(shape) else op("Reshape")
    return graph.add_node(reshape, [x, target], name=name, before=before).output


class RemoveIdentity(Rule):
    name = "remove-identity"
    roots = ("Identity",)

    def check(self, node):
        return None

    def rewrite(self, graph, node):
        node.output.replace_all_uses_with(node.inputs[0])


class RemoveInferenceDropout(Rule):
    name = "remove-dropout"
    roots = ("Dropout",)

    def check(self, node):
        training = node.inputs[2] if len(node.inputs) > 2 else None
        if training is not None and (training.known is None or bool(np.asarray(training.known).item())):
            return "training_mode is not known to be false"
        if len(node.outputs) > 1 and node.outputs[1].uses and not node.outputs[1].type.is_static:
            return "the mask output is used and its shape is not static"
        return None

    def rewrite(self, graph, node):
        node.outputs[0].replace_all_uses_with(node.inputs[0])
        if len(node.outputs) > 1 and node.outputs[1].uses:  # in inference the mask keeps everything
            shape = graph.add_constant(np.asarray(node.outputs[1].shape, np.int64))
            ones = graph.add_node(op("ConstantOfShape", value=np.ones(1, bool)), [shape], before=node).output
            node.outputs[1].replace_all_uses_with(ones)


class SumToAdd(Rule):
    name = "sum-to-add"
    roots = ("Sum",)

    def check(self, node):
        return None

    def rewrite(self, graph, node):
        acc = node.inputs[0]
        for x in node.inputs[1:]:
            acc = graph.add_node(op("Add"), [acc, x], name=node.name, before=node).output
        if acc.type != node.output.type:  # Sum of one input broadcast nowhere: same value
            acc = graph.add_node(op("Identity"), [acc], before=node).output
        node.output.replace_all_uses_with(acc)


class CastLikeToCast(Rule):
    """CastLike reads only its second operand's element type: a Cast to that type says so (and the
    second operand, often a broadcast-incompatible tensor, is no longer an operand of anything)."""

    name = "cast-like-to-cast"
    roots = ("CastLike",)

    def check(self, node):
        return None

    def rewrite(self, graph, node):
        cast = op("Cast", to=node.inputs[1].dtype, saturate=node.op.saturate, round_mode=node.op.round_mode)
        node.output.replace_all_uses_with(graph.add_node(cast, [node.inputs[0]], name=node.name, before=node).output)


class SoftmaxCrossEntropyToNLL(Rule):
    """SoftmaxCrossEntropyLoss is NegativeLogLikelihoodLoss of LogSoftmax along the class axis (its
    definition; the log-probabilities are its second result). float32/float64 only: for f16 the op
    rounds once where the pair would round the log-probabilities first."""

    name = "sce-to-logsoftmax-nll"
    roots = ("SoftmaxCrossEntropyLoss",)

    def check(self, node):
        if node.inputs[0].dtype not in (DType.f32, DType.f64):
            return f"{node.inputs[0].dtype} scores (the op computes them in f32 and rounds once)"
        return None

    def rewrite(self, graph, node):
        logp = graph.add_node(op("LogSoftmax", axis=1), [node.inputs[0]], name=node.name, before=node).output
        nll = op("NegativeLogLikelihoodLoss", ignore_index=node.op.ignore_index, reduction=node.op.reduction)
        loss = graph.add_node(nll, [logp, *node.inputs[1:]], name=node.name, before=node).output
        node.outputs[0].replace_all_uses_with(loss)
        if len(node.outputs) > 1:
            node.outputs[1].replace_all_uses_with(logp)


class BlocksToTranspose(Rule):
    """DepthToSpace / SpaceToDepth are a Reshape to 6-D, a Transpose and a Reshape back (their
    definition; the Transpose has native code for every type)."""

    name = "blocks-to-transpose"
    roots = ("DepthToSpace", "SpaceToDepth")

    def check(self, node):
        if not node.inputs[0].type.is_static:
            return "the input's shape is not static"
        return None

    def rewrite(self, graph, node):
        n, c, h, w = (int(d) for d in node.inputs[0].shape)
        b, dcr = node.op.blocksize, node.op.mode == "DCR"
        if node.op.name == "DepthToSpace":
            six = (n, b, b, c // (b * b), h, w) if dcr else (n, c // (b * b), b, b, h, w)
            perm = (0, 3, 4, 1, 5, 2) if dcr else (0, 1, 4, 2, 5, 3)
        else:
            six, perm = (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
        t = graph.add_node(op("Transpose", perm=list(perm)), [reshape_to(graph, node.inputs[0], six, node)],
                           name=node.name, before=node).output
        node.output.replace_all_uses_with(reshape_to(graph, t, node.output.shape, node))


class BatchNormToElementwise(Rule):
    """Inference BatchNormalization whose statistics are not constants (fed as inputs) is its formula,
    ``(x - mean) * (scale / sqrt(var + epsilon)) + B`` per channel, in elementwise ops (as the
    reference computes it). With constant statistics ``fold-batchnorm`` / ``fold-scale-bias`` fold it
    into the conv before it or into a scale and bias."""

    name = "batchnorm-to-elementwise"
    roots = ("BatchNormalization",)

    def check(self, node):
        x = node.inputs[0]
        if node.op.training_mode or len(node.outputs) > 1:
            return "training mode (running statistics)"
        if x.dtype not in (DType.f32, DType.f64) or not x.type.is_static or x.type.rank < 2:
            return "the input is not a static f32/f64 tensor of rank 2 or more"
        if all(v.const is not None for v in node.inputs[1:]):
            return "constant statistics: fold-batchnorm and fold-scale-bias take them"
        return None

    def rewrite(self, graph, node):
        x, scale, bias, mean, var = node.inputs
        channels = (int(x.shape[1]),) + (1,) * (x.type.rank - 2)

        def add(name, *ins):
            return graph.add_node(op(name), list(ins), name=node.name, before=node).output

        eps = graph.add_constant(np.asarray(node.op.epsilon, x.dtype.np))
        one = graph.add_constant(np.asarray(1, x.dtype.np))
        k = add("Mul", add("Div", one, add("Sqrt", add("Add", var, eps))), scale)
        centred = add("Sub", x, reshape_to(graph, mean, channels, node))
        y = add("Add", add("Mul", centred, reshape_to(graph, k, channels, node)), reshape_to(graph, bias, channels, node))
        node.outputs[0].replace_all_uses_with(y)


_RESHAPE_LIKE = ("Flatten", "Squeeze", "Unsqueeze")


class ReshapeLikeToReshape(Rule):
    name = "reshape-like-to-reshape"
    roots = _RESHAPE_LIKE

    def check(self, node):
        if not node.output.type.is_static:
            return "the result shape is not static"
        return None

    def rewrite(self, graph, node):
        node.output.replace_all_uses_with(reshape_to(graph, node.inputs[0], node.output.shape, node, node.name))


class CollapseReshapes(Rule):
    name = "collapse-reshapes"
    roots = ("Reshape",)

    def check(self, node):
        x = node.inputs[0]
        if not node.output.type.is_static:
            return "the result shape is not static"
        if x.type.shape == node.output.shape:
            return None
        if x.producer is None or x.producer.op.name != "Reshape":
            return "the input is not a Reshape"
        return None

    def rewrite(self, graph, node):
        x = node.inputs[0]
        if x.type.shape == node.output.shape:
            node.output.replace_all_uses_with(x)
            return
        src = x.producer.inputs[0]
        if src.type.shape == node.output.shape:
            node.output.replace_all_uses_with(src)
        else:
            node.output.replace_all_uses_with(reshape_to(graph, src, node.output.shape, node, node.name))


class ComposeTransposes(Rule):
    name = "compose-transposes"
    roots = ("Transpose",)

    @staticmethod
    def perm(node) -> list[int]:
        p = node.op.perm
        rank = node.inputs[0].type.rank
        return list(p) if p else list(reversed(range(rank)))

    def check(self, node):
        if self.perm(node) == list(range(node.inputs[0].type.rank)):
            return None
        x = node.inputs[0]
        if x.producer is None or x.producer.op.name != "Transpose":
            return "the input is not a Transpose and the permutation is not the identity"
        return None

    def rewrite(self, graph, node):
        p = self.perm(node)
        if p == list(range(len(p))):
            node.output.replace_all_uses_with(node.inputs[0])
            return
        inner = node.inputs[0].producer
        q = self.perm(inner)
        composed = [q[i] for i in p]
        src = inner.inputs[0]
        if composed == list(range(len(composed))):
            node.output.replace_all_uses_with(src)
        else:
            new = graph.add_node(op("Transpose", perm=tuple(composed)), [src], name=node.name, before=node)
            node.output.replace_all_uses_with(new.output)


class MatMulAddToGemm(Rule):
    """Add(MatMul(A, B), C) → Gemm(A, B, C) for constant 2-D B and constant bias C of shape [N]/[1,N]."""

    name = "matmul-add-to-gemm"
    roots = ("Add",)

    @staticmethod
    def split(node):
        a, b = node.inputs
        for mm, bias in ((a, b), (b, a)):
            if mm.producer is not None and mm.producer.op.name == "MatMul":
                return mm, bias
        return None, None

    def check(self, node):
        mm, bias = self.split(node)
        if mm is None:
            return "neither operand is a MatMul"
        if not only_use_is(mm, node):
            return "the MatMul result has other uses"
        a, b = mm.producer.inputs
        if b.const is None or b.type.rank != 2:
            return "the MatMul's right operand is not a constant matrix"
        if a.type.rank < 2 or not a.type.is_static:
            return "the MatMul's left operand is not a static matrix or batch of matrices"
        if a.dtype not in (DType.f32, DType.f64, DType.f16):
            return f"Gemm does not take {a.dtype}"
        n = b.shape[1]
        if bias.const is None or bias.type.numel not in (1, n) or (bias.type.rank > 1 and bias.shape[-1] not in (1, n)):
            return "the addend is not a constant bias of shape [N]"
        if bias.dtype != a.dtype:
            return "the bias has another element type"
        if node.output.shape != mm.shape:
            return "the Add broadcasts the MatMul result"
        return None

    def rewrite(self, graph, node):
        mm, bias = self.split(node)
        a, b = mm.producer.inputs
        n = b.shape[1]
        c = graph.add_constant(np.broadcast_to(bias.const.reshape(-1), (n,)).copy())
        rows = int(np.prod(a.shape[:-1]))  # not -1: that is ambiguous when a has no elements
        x = a if a.type.rank == 2 else reshape_to(graph, a, (rows, a.shape[-1]), node)
        gemm = graph.add_node(op("Gemm"), [x, b, c], name=mm.producer.name, before=node).output
        out = gemm if a.type.rank == 2 else reshape_to(graph, gemm, node.output.shape, node)
        node.output.replace_all_uses_with(out)


class NarrowMatMulToFloat32(Rule):
    """MatMul of float16 or bfloat16 operands: Cast both to float32, MatMul, Cast the product back.
    The op's definition widens narrow floats and rounds the product once, so this is the same
    computation, and the float32 GEMM runs natively."""

    name = "narrow-matmul-to-f32"
    roots = ("MatMul",)

    def check(self, node):
        if node.inputs[0].type.dtype not in (DType.f16, DType.bf16):
            return "the operands are not float16 or bfloat16"
        return None

    def rewrite(self, graph, node):
        dt = node.inputs[0].type.dtype
        f32 = [graph.add_node(op("Cast", to=DType.f32), [v], before=node).output for v in node.inputs]
        mm = graph.add_node(op("MatMul"), f32, name=node.name, before=node).output
        node.output.replace_all_uses_with(graph.add_node(op("Cast", to=dt), [mm], before=node).output)


#: the element types of MatMul (float32 on the GEMM core, float16/bfloat16 through float32, float64
#: and integers as loops)
_MATMUL_TYPES = frozenset({DType.f32, DType.f16, DType.bf16, DType.f64, DType.i32, DType.i64, DType.u32, DType.u64})


class EinsumToMatMul(Rule):
    """``A, B -> Y`` where every label of the equation is a batch label (in A, B and Y), a row label
    (A and Y), a column label (B and Y) or a contracted one (A and B): A transposed to [batch, rows,
    contracted] and B to [batch, contracted, columns], each reshaped to 3-D (2-D without batch
    labels), one MatMul, reshaped to [batch, rows, columns] and transposed to Y's label order.
    Transposes and Reshapes that change nothing are left out."""

    name = "einsum-to-matmul"
    roots = ("Einsum",)

    def _labels(self, node):
        from ...ir.ops.linalg import _ELLIPSIS

        if len(node.inputs) != 2:
            return None, f"{len(node.inputs)} operands (only two become a MatMul)"
        if not all(v.type.is_static and v.type.dtype in _MATMUL_TYPES for v in node.inputs):
            return None, "the operands are not of static shape and a type MatMul takes"
        eq, _ = node.op.resolve([tuple(v.shape) for v in node.inputs])
        lhs, out = eq.split("->")
        a, b = lhs.split(",")
        if _ELLIPSIS in eq or "." in eq:
            return None, "an ellipsis"
        if len(set(a)) != len(a) or len(set(b)) != len(b):
            return None, "a label repeats within an operand (a diagonal)"
        sizes = {}
        for term, v in ((a, node.inputs[0]), (b, node.inputs[1])):
            for label, d in zip(term, v.shape):
                if sizes.setdefault(label, int(d)) != int(d):
                    return None, f"label {label!r} has sizes {sizes[label]} and {int(d)} (broadcast)"
        return (a, b, out, sizes), None

    def check(self, node):
        return self._labels(node)[1]

    def rewrite(self, graph, node):
        (a, b, out, sizes), _ = self._labels(node)
        # a label in one operand only and not in Y is summed there first
        operands = []
        for term, other, v in ((a, b, node.inputs[0]), (b, a, node.inputs[1])):
            alone = [i for i, x in enumerate(term) if x not in other and x not in out]
            if alone:
                v = _sum_axes(graph, v, alone, node)
                term = "".join(x for i, x in enumerate(term) if i not in alone)
            operands.append((term, v))
        (a, va), (b, vb) = operands
        # labels in their operand's order: the operands move as little as they can, Y's order last
        batch = [x for x in a if x in b and x in out]
        rows = [x for x in a if x in out and x not in b]
        cols = [x for x in b if x in out and x not in a]
        red = [x for x in a if x in b and x not in out]
        size = lambda labels: int(np.prod([sizes[x] for x in labels], dtype=np.int64))  # noqa: E731

        def arrange(v, term, order, shape):
            perm = [term.index(x) for x in order]
            if perm != list(range(len(perm))):
                v = graph.add_node(op("Transpose", perm=tuple(perm)), [v], before=node).output
            if tuple(int(d) for d in v.shape) != tuple(shape):
                v = reshape_to(graph, v, shape, node)
            return v

        lead = [size(batch)] if batch else []
        x = arrange(va, a, batch + rows + red, lead + [size(rows), size(red)])
        y = arrange(vb, b, batch + red + cols, lead + [size(red), size(cols)])
        z = graph.add_node(op("MatMul"), [x, y], name=node.name, before=node).output
        grouped = batch + rows + cols
        full = [sizes[x] for x in grouped]
        if tuple(int(d) for d in z.shape) != tuple(full):
            z = reshape_to(graph, z, full, node)
        perm = [grouped.index(x) for x in out]
        if perm != list(range(len(perm))):
            z = graph.add_node(op("Transpose", perm=tuple(perm)), [z], before=node).output
        node.output.replace_all_uses_with(z)


def _sum_axes(graph: Graph, v: Value, axes, before: Node) -> Value:
    """``v`` summed over ``axes`` (dropped)."""
    ax = graph.add_constant(np.asarray(axes, dtype=np.int64))
    return graph.add_node(op("ReduceSum", keepdims=0), [v, ax], before=before).output


class EinsumOfOne(Rule):
    """``A -> Y`` (no label three times): an ellipsis stands for labels of its own, each label taken
    twice becomes its diagonal (the two axes moved last and merged, every (n+1)-th element sliced),
    then a ReduceSum over the labels Y lacks and a Transpose to Y's order ("->" of a scalar: the
    operand itself). Any element type (Transpose, Reshape, Slice and ReduceSum take them all)."""

    name = "einsum-of-one"
    roots = ("Einsum",)

    def _terms(self, node):
        if len(node.inputs) != 1:
            return None, f"{len(node.inputs)} operands"
        x = node.inputs[0]
        if not x.type.is_static:
            return None, "the operand's shape is not static"
        eq, _ = node.op.resolve([tuple(x.shape)])
        a, out = eq.split("->")
        if "..." in eq:  # the ellipsis: labels no term uses, one per dimension it covers (maybe none)
            free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in eq]
            ell = "".join(free[:x.type.rank - (len(a) - 3)]) if "..." in a else ""
            a, out = a.replace("...", ell), out.replace("...", ell)
        if any(a.count(c) > 2 for c in a):
            return None, "a label appears three times or more within the operand"
        return (a, out), None

    def check(self, node):
        return self._terms(node)[1]

    def rewrite(self, graph, node):
        (a, out), _ = self._terms(node)
        v = node.inputs[0]
        for c in sorted({c for c in a if a.count(c) == 2}):
            v, a = _diagonal(graph, v, a, c, node)
        summed = [i for i, x in enumerate(a) if x not in out]
        if summed:
            v = _sum_axes(graph, v, summed, node)
        kept = [x for x in a if x in out]
        perm = [kept.index(x) for x in out]
        if perm != list(range(len(perm))):
            v = graph.add_node(op("Transpose", perm=tuple(perm)), [v], before=node).output
        node.output.replace_all_uses_with(v)


def _diagonal(graph: Graph, v: Value, term: str, label: str, before: Node) -> tuple[Value, str]:
    """The diagonal of ``v`` over the two axes ``label`` names in ``term``, as its last axis: those
    axes moved last and merged (n*n), every (n+1)-th element taken; the new term."""
    i, j = term.index(label), term.rindex(label)
    rest = [k for k in range(len(term)) if k not in (i, j)]
    if rest + [i, j] != list(range(len(term))):
        v = graph.add_node(op("Transpose", perm=tuple(rest + [i, j])), [v], before=before).output
    shape = [int(d) for d in v.shape]
    n = shape[-1]
    v = reshape_to(graph, v, shape[:-2] + [n * n], before)
    const = lambda x: graph.add_constant(np.asarray([x], dtype=np.int64))  # noqa: E731
    v = graph.add_node(op("Slice"), [v, const(0), const(n * n), const(-1), const(n + 1)], before=before).output
    return v, "".join(term[k] for k in rest) + label


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


class DecomposedLayerNorm(Rule):
    """``Div(Sub(x, m), Sqrt(Add(ReduceMean(Pow(Sub(x, m), 2)), eps)))`` with ``m = ReduceMean(x)``
    over the same trailing axes → ``LayerNormalization(x, ones, axis, epsilon=eps)`` (float32: the
    decomposed form rounds each step to x's type; the op's stash type is float32)."""

    name = "decomposed-layernorm"
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
        add = _producer(sq.inputs[0], "Add") if sq is not None else None
        if add is None:
            return "the denominator is not sqrt(variance + eps)"
        (v, e) = add.inputs if _scalar(add.inputs[1]) is not None else add.inputs[::-1]
        eps, var = _scalar(e), _producer(v, "ReduceMean")
        if eps is None or var is None:
            return "the denominator is not sqrt(mean(...) + eps) with a constant eps"
        sqr = _producer(var.inputs[0], "Pow", "Mul")
        if sqr is None or sqr.inputs[0] is not d or (
                sqr.inputs[1] is not d if sqr.op.name == "Mul" else _scalar(sqr.inputs[1]) != 2.0):
            return "the variance is not mean((x - mean(x))^2)"
        axes = _reduced_axes(mean)
        rank = x.type.rank
        if axes is None or axes != _reduced_axes(var) or not axes or axes != tuple(range(axes[0], rank)):
            return "the means are not over the same trailing axes (constant, keepdims)"
        if x.dtype != DType.f32 or not x.type.is_static:
            return f"x is {x.type}: the rule takes static float32 tensors"
        inner = (mean, sub, sqr, var, add, sq)
        users = {id(n) for n in inner} | {id(node)}
        for n in inner:
            if any(u[0] is not None and id(u[0]) not in users for u in n.outputs[0].uses):
                return f"{n.op.name} {n.name or ''} is used outside the pattern".replace("  ", " ")
        return x, axes, eps

    def check(self, node):
        found = self.match(node)
        return found if isinstance(found, str) else None

    def rewrite(self, graph, node):
        x, axes, eps = self.match(node)
        ones = graph.add_constant(np.ones([int(d) for d in x.shape[axes[0]:]], np.float32))
        ln = graph.add_node(op("LayerNormalization", axis=axes[0], epsilon=eps), [x, ones], name=node.name,
                            before=node)
        node.output.replace_all_uses_with(ln.outputs[0])


class LayerNormAffine(Rule):
    """``LayerNormalization(x, scale, b) * c`` or ``+ c`` with constants (``c`` of the normalized
    shape, or broadcast to it) → the LayerNormalization with ``scale * c`` and ``b * c`` (or ``b +
    c``): the affine step of a decomposed layer norm."""

    name = "layernorm-affine"
    roots = ("Mul", "Add")

    @staticmethod
    def split(node):
        for ln, c in (node.inputs, node.inputs[::-1]):
            if _producer(ln, "LayerNormalization") is not None and c is not None and c.const is not None:
                return ln.producer, c
        return None, None

    def check(self, node):
        ln, c = self.split(node)
        if ln is None:
            return "no operand is a LayerNormalization's result and the other a constant"
        if not only_use_is(ln.outputs[0], node) or any(o.uses for o in ln.outputs[1:]):
            return "the LayerNormalization's results have other uses"
        scale = ln.inputs[1]
        b = ln.inputs[2] if len(ln.inputs) > 2 else None
        if scale.const is None or (b is not None and b.const is None):
            return "the LayerNormalization's scale or bias is not constant"
        norm = tuple(int(d) for d in ln.inputs[0].shape[ln.op.axis % ln.inputs[0].type.rank:])
        cs = tuple(int(d) for d in c.shape)
        if len(cs) > len(norm) or any(d not in (1, n) for d, n in zip(cs[::-1], norm[::-1])) or c.dtype != DType.f32:
            return f"the constant's shape {list(cs)} does not broadcast over the normalized axes {list(norm)}"
        if node.output.shape != ln.outputs[0].shape:
            return "the result broadcasts beyond the normalized tensor"
        return None

    def rewrite(self, graph, node):
        ln, c = self.split(node)
        x, scale = ln.inputs[0], ln.inputs[1]
        norm = [int(d) for d in x.shape[ln.op.axis % x.type.rank:]]
        cv = np.broadcast_to(np.asarray(c.const, np.float32), norm)
        s = np.broadcast_to(np.asarray(scale.const, np.float32), norm)
        b = np.broadcast_to(np.asarray(ln.inputs[2].const, np.float32), norm) if len(ln.inputs) > 2 and \
            ln.inputs[2] is not None else np.zeros(norm, np.float32)
        s, b = (s * cv, b * cv) if node.op.name == "Mul" else (s, b + cv)
        new = graph.add_node(ln.op, [x, graph.add_constant(np.ascontiguousarray(s, np.float32)),
                                     graph.add_constant(np.ascontiguousarray(b, np.float32))],
                             name=ln.name, before=node)
        node.output.replace_all_uses_with(new.outputs[0])


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
        for n in nodes:
            if not all(u[0] is not None and (u[0] is node or u[0] in nodes) for u in n.outputs[0].uses):
                return f"{n.op.name} {n.name or ''} is used outside the pattern".replace("  ", " ")
        return found

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


RULES: tuple[Rule, ...] = (RemoveIdentity(), RemoveInferenceDropout(), SumToAdd(), CastLikeToCast(),
                           SoftmaxCrossEntropyToNLL(), BlocksToTranspose(), BatchNormToElementwise(),
                           ReshapeLikeToReshape(), CollapseReshapes(), ComposeTransposes(),
                           MatMulAddToGemm(), EinsumToMatMul(), EinsumOfOne(), NarrowMatMulToFloat32(),
                           DecomposedLayerNorm(), LayerNormAffine(), DecomposedGelu())


def type_of(name: str, rules):
    return next(r for r in rules if r.name == name)


class Canonicalize(Pass):
    """Apply the canonicalization rules (RULES) to a fixed point."""

    name = "canonicalize"

    def __init__(self, rules=RULES, max_rounds: int = 50):
        self.rules = tuple(rules)
        self.max_rounds = max_rounds
        self.fired: dict[str, int] = {}
        #: the decomposed patterns that nearly matched, and why not (``kiln dump --explain-fusion``)
        self.near_misses: list = []

    def run(self, graph: Graph) -> bool:
        fired: dict[str, int] = {}
        for body in graph.subgraphs():  # control-flow bodies are canonicalized too
            self.run(body)
            for k, v in self.fired.items():
                fired[k] = fired.get(k, 0) + v
        here = apply_rules(graph, self.rules, self.max_rounds)
        if here:
            graph.remove_unused_constants()
        for k, v in here.items():
            fired[k] = fired.get(k, 0) + v
        self.fired = fired
        patterns = [r for r in self.rules if getattr(r, "unrelated", None) is not None]
        self.near_misses = [m for m in explain(graph, patterns) if m.reason not in type_of(m.rule, patterns).unrelated]
        return bool(fired)
