"""A whole graph as native code: kernel groups in schedule order, a memory plan, and forward functions.

``build_program(graph, target)`` is the code generator's entry point, a recipe of four jobs:

1. ``choose_lowerings``: forms the kernel groups (one node each until fusion) and picks each group's
   lowering; a group without one runs in the reference interpreter (a *fallback* step, with the
   reason why);
2. ``MemoryPlan`` (``places.py``): the values that share a buffer (views, concat pieces), live
   ranges (``ir/liveness.py``, as memory-aware scheduling models them) and in-place results;
3. ``emit_kernels`` (``sharing.py``): one LLVM function per distinct kernel;
4. ``MemoryPlan`` again: every value native code touches gets a place: a graph input (the caller's
   array), a weight (the artifact's read-only weights, memory-mapped at load) or the arena (one block
   of scratch memory per concurrent caller, offsets planned here); values only fallback steps see
   stay Python objects; then one *segment* function per maximal run of native steps::

       void kiln_forward(void **inputs, char *weights, char *arena, int32_t nthreads)

   which calls the segment's kernels in order with their buffer addresses (all offsets compiled
   in). A model without fallback steps is one segment, ``kiln_forward``: the whole forward pass is
   one native call.

The result, ``Program``, is plain data: the LLVM IR text, the weights with their offsets, and the
step list with every value's place, which ``compiler.runtime`` saves in an artifact and executes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from llvmlite import ir

from ..ir.graph import Graph, Node, Value
from .gemm.config import model_config
from .kernels import KernelGroup, Services, lowering_for
from .kernels.base import ALIGN, I32, I64, PTR, VOID, c64
from .llvm.elementwise import new_module, release_module
from .llvm.target import Target
from .places import MemoryPlan, Place, align
from .sharing import emit_kernels
from .plan import Buffer


@dataclass
class Step:
    """One kernel group in schedule order: native (``kernel`` is its function) or a fallback."""

    index: int
    group: KernelGroup
    native: bool
    reason: str | None = None        # why it is not native
    kernel: str | None = None        # LLVM function name (None for views)
    lowering: str | None = None
    alias: bool = False
    scratch_bytes: int = 0
    slots: list = field(default_factory=list)
    slot_places: list = field(default_factory=list)
    #: (output index, input index) pairs of the group computed in place (one buffer)
    in_place: dict = field(default_factory=dict)
    #: the graph node (a ``kiln.Kernel`` for a fused group): its inputs and results are the values
    #: the step reads and writes in the graph (``group`` holds the body's own values)
    node: Node | None = None
    #: how the lowering made the kernel (``KernelBuilder.note``); a concat in place says so here
    notes: list = field(default_factory=list)


@dataclass
class Program:
    """What ``build_program`` made (see the module docstring)."""

    llvm_ir: str
    steps: list[Step]
    segments: list[list[int]]         # per segment, the step indices it runs natively
    places: dict[int, Place]          # id(value) -> place
    weights: list[tuple[int, np.ndarray]]
    weights_bytes: int
    arena_bytes: int
    buffers: list[Buffer]
    graph: Graph
    #: the library must link Kiln's GEMM (``gemm.build.gemm_object(gemm_cfg)``)
    uses_gemm: bool = False
    gemm_cfg: object = None
    #: the library must link ``native/parallel.c`` (``kiln_parallel_for``)
    uses_parallel: bool = False
    #: the sum of every arena buffer's aligned size before any reuse (= the arena with reuse off)
    naive_bytes: int = 0
    #: every step is timed (``build_program(profile=True)``)
    profiled: bool = False
    #: the arena offset of the status record (``KernelBuilder.fail_if``), None when no kernel checks
    status_offset: int | None = None
    #: the arena offset of the profile record (``profile=True``: ``native/parallel.c``), else None
    profile_offset: int | None = None

    def memory_summary(self) -> dict:
        """The memory figures (manifest, ``kiln compile``/``inspect``, docs/memory.md), all from the
        buffers the planner placed, each kernel's scratch included (``scratch_bytes`` is their sum):
        ``arena_bytes`` (allocated per caller), ``lower_bound_bytes`` (most bytes live at one step of
        this schedule: no plan can use less), ``naive_bytes`` (every buffer its own memory),
        ``weights_bytes`` (memory-mapped, outside the arena), ``in_place`` (kernels writing over an
        input) and the ratios arena/lower bound and naive/arena."""
        from .plan import lower_bound

        lb = lower_bound(self.buffers, ALIGN)
        return {"arena_bytes": self.arena_bytes, "lower_bound_bytes": lb, "naive_bytes": self.naive_bytes,
                "weights_bytes": self.weights_bytes,
                "scratch_bytes": sum(align(s.scratch_bytes) for s in self.steps if s.scratch_bytes),
                "in_place": sum(len(s.in_place) for s in self.steps),
                "arena_over_lower_bound": round(self.arena_bytes / lb, 4) if lb else 1.0,
                "naive_over_arena": round(self.naive_bytes / self.arena_bytes, 4) if self.arena_bytes else 1.0}

    @property
    def fallback_steps(self) -> list[Step]:
        return [s for s in self.steps if not s.native]

    def segment_name(self, j: int) -> str:
        return "kiln_forward" if len(self.segments) == 1 and not self.fallback_steps else f"kiln_segment_{j}"


def value_key(v: Value, index: dict[int, int]) -> str:
    return f"%{index[id(v.producer)]}:{v.index}"


def form_groups(graph: Graph) -> list[KernelGroup]:
    """The kernel groups in schedule order: one per node; a ``kiln.Kernel`` node (made by the fusion
    pass) stands for the group of the nodes in its body."""
    return [KernelGroup.of_node(n) for n in graph.nodes]


def kernel_forms(graph: Graph) -> list[tuple[KernelGroup, str, object]]:
    """Per kernel group: (the group, its lowering's name or why it has none, what it runs: its
    loop-form ``Kernel``, or a few words when it has none: a view, hand-written LLVM, the
    interpreter). In-place choices are the program builder's and are not shown (``kiln dump
    --kernels``)."""
    out = []
    for i, group in enumerate(form_groups(graph)):
        low, why = lowering_for(group)
        if low is None:
            out.append((group, "interpreter", f"runs in the reference interpreter: {why}"))
        elif low.alias:
            out.append((group, type(low).__name__, "a view of its input's buffer: no code"))
        elif getattr(low, "form", None) is None:
            out.append((group, type(low).__name__, "hand-written LLVM; not yet in the loop form"))
        else:
            out.append((group, type(low).__name__, low.form(group, f"k{i}_{'_'.join(group.ops)}")))
    return out


def build_program(graph: Graph, target: Target, fallback: bool = True, reuse_memory: bool = True,
                  in_place: bool = True, profile: bool = False, verify_shared: bool = False) -> Program:
    """Lower ``graph`` (after the pipeline) to a ``Program`` for ``target`` (see the module docstring).

    With ``fallback=False`` a group without a native lowering is an error naming the op, the node
    and the reason. ``reuse_memory=False`` gives every value arena memory of its own (debugging; no
    in-place reuse either); ``in_place=False`` only turns off kernels writing over their inputs.
    ``profile=True`` times every step (``kiln_profile_mark`` in ``native/parallel.c``) into a profile
    record in the arena (``profile_offset``; read by ``Executable.run_timed``). ``verify_shared=True`` (``compile(verify=True)``, ``--verify``)
    emits every kernel anyway and checks that a function shared by equal kernels is exactly what each
    step would have got (``kernel_key``).
    """
    module = new_module("kiln_model", target)
    services = Services(module, target, model_config(target))
    steps, lowerings = choose_lowerings(graph, fallback)
    memory = MemoryPlan(graph, steps, reuse=reuse_memory, profile=profile)
    memory.choose_in_place(lowerings, enabled=in_place)
    emit_kernels(steps, lowerings, services, verify_shared)
    memory.place_constants()
    memory.plan_arena()
    memory.bind_slots()
    segments = native_segments(steps)
    prog = Program("", steps, segments, memory.places, memory.weights, memory.weights_bytes, memory.arena_bytes,
                   memory.buffers, graph, naive_bytes=memory.naive_bytes)
    prog.status_offset = memory.status.offset if memory.status is not None else None
    if not any(st.native and not st.alias for st in steps):
        prog.segments = segments = []  # nothing to run natively: no library at all
    prog.profile_offset = memory.profile.offset if memory.profile is not None and segments else None
    if profile and segments:
        services.uses_parallel = True
    for j, seg in enumerate(segments):
        _emit_segment(module, prog.segment_name(j), [steps[i] for i in seg], services.uses_parallel,
                      prog.profile_offset, prog.status_offset, len(steps))
    prog.llvm_ir = str(module)
    release_module(module)
    prog.uses_gemm, prog.gemm_cfg = services.uses_gemm, services.gemm_cfg
    prog.uses_parallel = services.uses_parallel
    prog.profiled = profile and bool(segments)
    return prog


def choose_lowerings(graph: Graph, fallback: bool = True) -> tuple[list[Step], dict[int, object]]:
    """The steps: per kernel group in schedule order, its lowering, or (no lowering, or a group
    holding control flow) a fallback step with the reason; with ``fallback=False`` that is an error
    naming the op, the node and the reason. Returns the steps and step index -> lowering."""
    from ..errors import UnsupportedError

    steps: list[Step] = []
    lowerings: dict[int, object] = {}
    for i, (node, group) in enumerate(zip(graph.nodes, form_groups(graph))):
        low, why = (None, "its op holds a subgraph (control flow)") if _has_subgraph(group) else lowering_for(group)
        lowerings[i] = low
        if low is None:
            if not fallback:
                raise UnsupportedError(f"{group.describe()}: no native code: {why} (strict mode: fallback=False)")
            steps.append(Step(i, group, native=False, reason=why, node=node))
        else:
            steps.append(Step(i, group, native=True, lowering=type(low).__name__, alias=low.alias, node=node))
    return steps, lowerings


def native_segments(steps: list[Step]) -> list[list[int]]:
    """Maximal runs of native steps (step indices), each one function."""
    segments: list[list[int]] = [[]]
    for st in steps:
        if st.native:
            segments[-1].append(st.index)
        elif segments[-1]:
            segments.append([])
    if not segments[-1] and len(segments) > 1:
        segments.pop()
    return segments


def _has_subgraph(group: KernelGroup) -> bool:
    from ..ir.ops.base import graph_fields

    return any(graph_fields(type(n.op)) for n in group.nodes)


#: a segment of more steps than this is split into functions of this many steps each (called in
#: turn by the segment's function): LLVM's optimizer and code generator take superlinear time on
#: one function of 20,000 calls
SEGMENT_PART_STEPS = 256


def _emit_segment(module: ir.Module, name: str, steps: Sequence[Step], wake_pool: bool = False,
                  profile: int | None = None, status: int | None = None, nsteps: int = 0) -> None:
    """The forward function of one segment: each step's kernel called with its slot table (and with
    ``profile``, the arena offset of the profile record of ``nsteps`` steps, ``kiln_profile_mark``
    after each). A kernel
    that checks its input data (a status slot) is followed by a look at the status record: if it
    reported an error, the step's index is written there and the function returns. A long segment
    calls its steps in parts (``SEGMENT_PART_STEPS``), each a function that returns nonzero when a
    check failed."""
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, PTR, I32]), name)
    fn.attributes.add("nounwind")
    for a, n in zip(fn.args, ("inputs", "weights", "arena", "nthreads")):
        a.name = n
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    if wake_pool:  # threads asleep since the last call start polling while the first kernels run
        wake = module.globals.get("kiln_parallel_wake") or ir.Function(
            module, ir.FunctionType(VOID, [I32]), "kiln_parallel_wake")
        b.call(wake, [fn.args[3]])
    mark = None
    if profile is not None:  # (kiln_profile_mark, the profile record's arena offset)
        fn_mark = module.globals.get("kiln_profile_mark") or ir.Function(
            module, ir.FunctionType(VOID, [PTR, I32, I32]), "kiln_profile_mark")
        mark = (fn_mark, profile, nsteps)
        b.call(fn_mark, [b.gep(fn.args[2], [c64(profile)], inbounds=True, source_etype=ir.IntType(8)),
                         ir.Constant(I32, -1), ir.Constant(I32, nsteps)])
    if len(steps) <= SEGMENT_PART_STEPS:
        _emit_steps(module, fn, b, steps, mark, status, b.ret_void)
        b.ret_void()
        return
    for j in range(0, len(steps), SEGMENT_PART_STEPS):
        chunk = steps[j:j + SEGMENT_PART_STEPS]
        part = ir.Function(module, ir.FunctionType(I32, [PTR, PTR, PTR, I32]), f"{name}.part{j // SEGMENT_PART_STEPS}")
        part.linkage = "internal"
        part.attributes.add("nounwind")
        part.attributes.add("noinline")
        for a, n in zip(part.args, ("inputs", "weights", "arena", "nthreads")):
            a.name = n
        pb = ir.IRBuilder(part.append_basic_block("entry"))
        _emit_steps(module, part, pb, chunk, mark, status, lambda pb=pb: pb.ret(ir.Constant(I32, 1)))
        pb.ret(ir.Constant(I32, 0))
        failed = b.call(part, list(fn.args))
        if any(sl.kind == "status" for st in chunk for sl in st.slots):
            with b.if_then(b.icmp_unsigned("!=", failed, ir.Constant(I32, 0)), likely=False):
                b.ret_void()
    b.ret_void()


def _emit_steps(module: ir.Module, fn: ir.Function, b: ir.IRBuilder, steps: Sequence[Step], mark, status,
                fail) -> None:
    """The calls of ``steps`` in ``fn`` (whose arguments are the forward function's); ``fail()`` emits
    the return after a kernel reported bad input data."""
    inputs, weights, arena, nthreads = fn.args
    width = max([len(st.slots) for st in steps] + [1])
    table = b.alloca(PTR, c64(width), name="slots")
    input_ptrs: dict[int, ir.Value] = {}

    def address(place: Place) -> ir.Value:
        if place.kind == "input":
            if place.where not in input_ptrs:
                input_ptrs[place.where] = b.load(b.gep(inputs, [c64(place.where)], source_etype=PTR), typ=PTR,
                                                 name=f"input{place.where}")
            return input_ptrs[place.where]
        base = weights if place.kind == "weight" else arena
        return b.gep(base, [c64(place.where)], inbounds=True, source_etype=ir.IntType(8))

    for st in steps:
        if st.alias:
            continue
        for j, place in enumerate(st.slot_places):
            b.store(address(place), b.gep(table, [c64(j)], source_etype=PTR))
        b.call(module.globals[st.kernel], [b.bitcast(table, PTR), nthreads])
        if any(sl.kind == "status" for sl in st.slots):
            rec = b.gep(arena, [c64(status)], inbounds=True, source_etype=ir.IntType(8))
            with b.if_then(b.icmp_unsigned("!=", b.load(rec, typ=I64), c64(0)), likely=False):
                b.store(c64(st.index), b.gep(rec, [c64(3)], source_etype=I64))
                fail()
        if mark is not None:
            b.call(mark[0], [b.gep(arena, [c64(mark[1])], inbounds=True, source_etype=ir.IntType(8)),
                             ir.Constant(I32, st.index), ir.Constant(I32, mark[2])])
