"""A whole graph as GPU launches: ``build_cuda_program(graph) -> CudaProgram``.

The recipe mirrors the CPU's (``codegen/program.py``):

1. per kernel group in schedule order, its CPU lowering (``kernels.lowering_for``) names what the
   group is and ``lowering.cuda_launches`` makes its launches; a group with none is a *fallback*
   step: it runs on the host in the reference interpreter, its operands copied from the GPU and its
   results copied back (reported, with the reason, as on the CPU);
2. the memory plan is the CPU's (``places.MemoryPlan``): views share their input's buffer, live
   ranges let buffers share memory, and every value, constant and scratch region gets a place: a
   graph input (copied to the GPU each call, or the caller's device array), the weights (uploaded
   once at load) or an offset in one device arena;
3. the kernels' sources, one per distinct kernel (equal loop-form kernels share one), go into one
   Python module (``source``) that the artifact holds: loading needs numba, not the compiler.

``CudaProgram.plan()`` is the JSON the runtime executes (``runtime/cuda.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...ir.graph import Graph, Value
from ...ir.types import TensorType
from ..kernels import lowering_for
from ..loops.cuda import PRELUDE
from ..places import MemoryPlan
from ..program import Step, _has_subgraph, form_groups, value_key
from .lowering import Launch, NoCuda, StepBinder, cuda_launches

#: the module's header: imports and the device helpers every loop-form kernel may call
HEADER = "import math\n\nimport numba\nfrom numba import cuda\nfrom numba.types import (boolean, float16, float32, " \
         "float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64)\n"


@dataclass
class CudaProgram:
    graph: Graph
    steps: list[Step]
    launches: dict[int, list[Launch]]      # step index -> its launches (native steps)
    places: dict
    weights: list[tuple[int, np.ndarray]]
    weights_bytes: int
    arena_bytes: int
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """The module of every kernel (numba.cuda source)."""
        return HEADER + "\n" + PRELUDE + "\n\n" + "\n\n".join(self.sources.values())

    @property
    def fallback_steps(self) -> list[Step]:
        return [s for s in self.steps if not s.native]

    def plan(self) -> dict:
        """The steps as the runtime runs them (JSON): launches with their arguments' places, and
        fallback nodes with where each operand and result lives."""
        index = {id(n): i for i, n in enumerate(self.graph.nodes)}
        input_pos = {id(v): k for k, v in enumerate(self.graph.inputs)}
        steps = []
        for st in self.steps:
            if st.native:
                if st.alias or not self.launches.get(st.index):
                    continue
                launches = []
                for ln in self.launches[st.index]:
                    args = []
                    for a in ln.args:
                        p = st.slot_places[a.slot]
                        args.append([p.kind, int(p.where), a.dtype, int(a.count)])
                    launches.append({"kernel": ln.kernel, "args": args, "scalars": ln.scalars,
                                     "blocks": list(ln.blocks), "threads": list(ln.threads), "status": ln.status})
                steps.append({"kind": "launch", "step": st.index, "node": st.node.name or "", "ops": st.group.ops,
                              "launches": launches})
                continue
            n = st.node
            refs = []
            for pos, v in enumerate(n.inputs):
                if v is None:
                    refs.append(None)
                elif id(v) in input_pos:
                    refs.append(["input", input_pos[id(v)]])
                elif v.const is not None:
                    refs.append(["const", pos])
                else:
                    refs.append(self.ref(v, index))
            steps.append({"kind": "fallback", "step": st.index, "node": index[id(n)], "op": n.op.name,
                          "reason": st.reason, "inputs": refs, "outputs": [self.ref(v, index) for v in n.outputs]})
        return {"steps": steps}

    def ref(self, v: Value, index: dict) -> list:
        """Where a value lives: ["buffer", kind, where, dtype, shape] or ["python", key]."""
        p = self.places.get(id(v))
        if p is not None and isinstance(v.type, TensorType) and v.type.is_static:
            return ["buffer", p.kind, int(p.where), v.type.dtype.name, [int(d) for d in v.shape]]
        return ["python", value_key(v, index)]


def build_cuda_program(graph: Graph, fallback: bool = True) -> CudaProgram:
    """Lower ``graph`` (after the pipeline, fused for the GPU: ``CUDA_FUSION``) to GPU launches.
    ``fallback=False`` refuses a group with no GPU kernel (naming the op, the node and the reason)."""
    from ...errors import UnsupportedError

    sources: dict[str, str] = {}
    steps: list[Step] = []
    launches: dict[int, list[Launch]] = {}
    for i, (node, group) in enumerate(zip(graph.nodes, form_groups(graph))):
        low, why = (None, "its op holds a subgraph (control flow)") if _has_subgraph(group) else lowering_for(group)
        if low is not None and low.alias:
            steps.append(Step(i, group, native=True, lowering=type(low).__name__, alias=True, node=node))
            continue
        if low is not None:
            binder = StepBinder(group, sources)
            try:
                launches[i] = cuda_launches(group, low, binder)
            except NoCuda as e:
                low, why = None, f"no CUDA kernel: {e}"
        if low is None:
            if not fallback:
                raise UnsupportedError(f"{group.describe()}: no GPU code: {why} (strict mode: fallback=False)")
            steps.append(Step(i, group, native=False, reason=why, node=node))
            continue
        st = Step(i, group, native=True, lowering=type(low).__name__, node=node, kernel=f"step{i}")
        st.slots, st.scratch_bytes = binder.slots, binder.scratch_bytes
        st.notes = [note for ln in launches[i] for note in ln.notes]
        steps.append(st)
    memory = MemoryPlan(graph, steps)
    memory.choose_in_place({}, enabled=False)
    memory.place_constants()
    memory.plan_arena()
    memory.bind_slots()
    return CudaProgram(graph, steps, launches, memory.places, memory.weights, memory.weights_bytes,
                       memory.arena_bytes, sources)


__all__ = ["CudaProgram", "HEADER", "build_cuda_program"]
