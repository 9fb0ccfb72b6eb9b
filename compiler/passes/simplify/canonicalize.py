"""Canonicalization: declarative rewrite rules that bring the graph to one normal form.

* Identity, a Cast to its input's own type, a step-1 Slice that keeps every element and
  inference-mode Dropout disappear.
* Sum of n inputs becomes a chain of Adds.
* Flatten / Squeeze / Unsqueeze with a static result become Reshape; chains of Reshapes collapse to
  one; a Reshape to its input's shape disappears.
* Transpose chains compose into one Transpose; an identity permutation disappears.
* MatMul by a constant matrix followed by Add of a constant bias becomes Gemm (through a Reshape to
  2-D when the activation has more dimensions, as in transformer layers).
* MatMul of float16 or bfloat16 operands becomes Casts to float32 around a float32 MatMul (what its
  reference computes: the product of the widened operands, rounded once).
* Decomposed normalizations and activations, as exporters write them for older opsets, become the
  op (``decomposed.py``): ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` over trailing axes
  is LayerNormalization, ``x / sqrt(mean(x^2) + eps)`` (or ``x * (1 / sqrt(...))``) is
  RMSNormalization (a following ``* gamma`` and, for LayerNormalization, ``+ beta`` by constants
  become their Scale and B), and ``0.5 * x * (1 + erf(x / sqrt(2)))`` is Gelu (its tanh form too),
  so each becomes one row kernel or one elementwise op; ``kiln dump --explain-fusion`` lists the
  near misses and why they did not match.
* Einsum of two operands of a type MatMul takes whose labels are batch, row, column or
  contracted labels (each in the places a matrix product puts it; a label in one operand only, not
  in the result, is summed there first) becomes Transposes and Reshapes around one MatMul; Einsum of
  one operand (a sum, a transpose) becomes a ReduceSum and a Transpose.
"""
from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...ir.ops.base import known_ints
from ...ir.types import DType
from ..manager import Pass
from ..rewrite import Rule, apply_rules, explain, only_use_is, op
from .decomposed import DecomposedGelu, DecomposedLayerNorm, DecomposedRMSNorm, DecomposedRotary, NormAffine


def reshape_to(graph: Graph, x: Value, shape, before: Node, name: str | None = None) -> Value:
    """``x`` reshaped to the static ``shape`` (a 0 in it is a size-0 axis: allowzero, not "copy")."""
    target = graph.add_constant(np.asarray(shape, dtype=np.int64))
    reshape = op("Reshape", allowzero=1) if 0 in tuple(shape) else op("Reshape")
    return graph.add_node(reshape, [x, target], name=name, before=before).output


class RemoveIdentity(Rule):
    """Identity, a Cast to the type its input already has (``x.float()`` of a float32 tensor, as
    PyTorch exports it), and a step-1 Slice that keeps every element (``x[:, :n]`` where ``n`` is a
    size known only at run time, once the sizes are static) are their input."""

    name = "remove-identity"
    roots = ("Identity", "Cast", "Slice")

    def check(self, node):
        if node.op.name == "Cast" and node.inputs[0].dtype != node.output.dtype:
            return "the Cast changes the element type"
        if node.op.name == "Slice":
            x = node.inputs[0]
            if not (x.type.is_static and x.type == node.output.type):
                return "the Slice drops elements (or its shapes are not static)"
            steps = known_ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
            if steps is None or any(st != 1 for st in steps):
                return "the Slice's steps are not all 1"
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


RULES: tuple[Rule, ...] = (RemoveIdentity(), RemoveInferenceDropout(), SumToAdd(), CastLikeToCast(),
                           SoftmaxCrossEntropyToNLL(), BlocksToTranspose(), BatchNormToElementwise(),
                           ReshapeLikeToReshape(), CollapseReshapes(), ComposeTransposes(),
                           MatMulAddToGemm(), EinsumToMatMul(), EinsumOfOne(), NarrowMatMulToFloat32(),
                           DecomposedLayerNorm(), DecomposedRMSNorm(), NormAffine(), DecomposedGelu(),
                           DecomposedRotary())


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
