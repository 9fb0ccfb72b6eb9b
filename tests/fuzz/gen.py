"""A seeded generator of random valid ONNX models (opset 17) for differential fuzzing.

``generate(seed, index)`` builds model ``index`` of the stream ``seed`` from a few *recipes*, each
adding one op or a short chain shaped to meet one of Kiln's fusion rules (docs/fusion.md): GEMM and
convolution epilogues (bias, BatchNorm, activation, residual add), elementwise chains ending in a row
reduction, attention blocks, the 1x1-conv prologue, a channel shuffle before a depthwise conv, and the
plain ops (elementwise and broadcasting, MatMul/Gemm with batch dims, Conv with random strides, pads,
dilations, groups and batch, pooling, reductions, Softmax/LayerNorm, data movement, Where, Cast, int64
arithmetic, shapes with 0 and 1 dims). A recipe reads values made earlier (so recipes chain) or new
graph inputs and constants.

After each recipe ONNX's shape inference (strict) gives the new values' shapes; a recipe it rejects is
rolled back. The finished model must pass ``onnx.checker`` (full check) and run in ONNX Runtime with
finite outputs, else it is discarded and redrawn (``STATS`` counts why). Values only flow into
discontinuous ops (comparisons, Cast to an integer, Floor, ...) when they are *exact* (graph inputs
and data movement of them), so that rounding differences cannot flip a result.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper

from .builder import STATS, Builder
from .recipes import RECIPES


@dataclasses.dataclass
class Case:
    seed: int
    index: int
    model: onnx.ModelProto
    feeds: dict
    reference: dict         # ONNX Runtime's outputs
    recipes: list

    @property
    def tag(self) -> str:
        return f"s{self.seed}-g{self.index}"

    def describe(self) -> str:
        return "; ".join(self.recipes)

def reference(model: onnx.ModelProto, feeds: dict) -> dict:
    """ONNX Runtime's outputs (no graph optimizations: the plainest reading of the model)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def validate(model: onnx.ModelProto, feeds: dict) -> dict:
    """ORT's outputs of a model that passes the checker and runs with finite results; raises otherwise."""
    onnx.checker.check_model(model, full_check=True)
    ref = reference(model, feeds)
    declared = {o.name: o.type.tensor_type.shape.dim for o in model.graph.output}
    for name, arr in ref.items():
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ValueError(f"non-finite reference output {name}")
        dims = declared[name]
        if len(dims) != arr.ndim or any(d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, arr.shape)):
            raise ValueError(f"ONNX Runtime computes {name} as {list(arr.shape)}, ONNX's shape inference "
                             f"declares {[d.dim_value if d.HasField('dim_value') else '?' for d in dims]}")
    return ref


def finish(b: Builder) -> onnx.ModelProto:
    """The model whose outputs are the values nothing reads (and sometimes one that is also read)."""
    read = {i for n in b.nodes for i in n.input}
    made = [o for n in b.nodes for o in n.output if o in b.vals]
    outs = [o for o in made if o not in read]
    inner = [o for o in made if o in read]
    if inner and b.chance(0.3):
        outs.append(b.choice(inner))
    outs = outs[-5:]
    infos = [helper.make_tensor_value_info(o, b.vals[o].dtype, list(b.vals[o].shape)) for o in outs]
    return b.model(infos)


def generate(seed: int, index: int, max_attempts: int = 100) -> Case:
    """Model ``index`` of the stream ``seed`` (the same arguments give the same model)."""
    recipes, weights = list(RECIPES), np.array(list(RECIPES.values()), np.float64)
    for attempt in range(max_attempts):
        rng = np.random.default_rng([seed, index, attempt])
        b = Builder(rng, zero_dims=bool(rng.random() < 0.06))
        want, tries = b.int(1, 6), 0
        while len(b.recipes) < want and tries < 4 * want:
            tries += 1
            b.apply(recipes[int(rng.choice(len(recipes), p=weights / weights.sum()))])
        if not b.recipes:
            STATS["no recipe applied"] += 1
            continue
        model = finish(b)
        feeds = {k: v for k, v in b.feeds.items() if any(k in n.input for n in b.nodes)}
        model.graph.ClearField("input")
        model.graph.input.extend(i for i in b.inputs if i.name in feeds)
        try:
            ref = validate(model, feeds)
        except Exception as e:
            STATS[f"invalid: {type(e).__name__}: {str(e).splitlines()[0][:80]}"] += 1
            continue
        STATS["generated"] += 1
        return Case(seed, index, model, feeds, ref, b.recipes)
    raise RuntimeError(f"no valid model for seed {seed} index {index} in {max_attempts} attempts")


def merge(cases: list[Case]) -> tuple[onnx.ModelProto, dict, dict]:
    """One model holding every case's graph side by side (names prefixed ``g{j}.``): (model, feeds,
    ONNX Runtime's outputs by the new names). Compiling one model for several graphs spreads the fixed
    cost of a compile (LLVM, the linker, loading); the graphs share nothing but the arena and the
    passes' view of the whole (CSE merges equal constants across them: still a valid model)."""
    nodes, inputs, outputs, inits, feeds, ref = [], [], [], [], {}, {}
    for j, c in enumerate(cases):
        pre = f"g{j}."

        def name(x: str) -> str:
            return pre + x if x else x

        g = c.model.graph
        for n in g.node:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.name = name(n.name)
            m.input[:] = [name(x) for x in n.input]
            m.output[:] = [name(x) for x in n.output]
            nodes.append(m)
        for src, dst in ((g.input, inputs), (g.output, outputs)):
            for vi in src:
                v = onnx.ValueInfoProto()
                v.CopyFrom(vi)
                v.name = name(vi.name)
                dst.append(v)
        for t in g.initializer:
            u = onnx.TensorProto()
            u.CopyFrom(t)
            u.name = name(t.name)
            inits.append(u)
        feeds.update({name(k): v for k, v in c.feeds.items()})
        ref.update({name(k): v for k, v in c.reference.items()})
    first = cases[0].model
    g = helper.make_graph(nodes, "fuzz-batch", inputs, outputs, inits)
    model = helper.make_model(g, opset_imports=list(first.opset_import), ir_version=first.ir_version)
    return model, feeds, ref

