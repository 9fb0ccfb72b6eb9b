"""Where every value that native code touches lives: the program builder's memory jobs.

``MemoryPlan`` takes the steps (kernel groups in schedule order, their lowerings chosen) and

1. finds the values that share a buffer: a view's result and its input, and the pieces of a concat
   computed straight into their slices of its result (``concats_in_place``);
2. takes each buffer's live range from ``ir/liveness.py`` (the model memory-aware scheduling plans
   with) and lets a kernel write a result over an input that dies in it (``choose_in_place``), before
   the kernels are emitted (a lowering reads ``in_place``);
3. once the kernels exist (their slots and scratch known): puts the constants they read in the
   weights (``place_constants``), plans the arena (``plan_arena``: ``plan.py`` places the buffers)
   and gives every slot of every step its place (``bind_slots``).

A place is a graph input (the caller's array), a weight (the artifact's read-only weights) or an
arena offset (one block of scratch memory per concurrent caller); values only fallback steps see
stay Python objects.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.liveness import live_ranges
from ..ir.types import TensorType
from .kernels.base import ALIGN, STATUS_BYTES
from .llvm.toolchain import CodegenError
from .plan import Buffer, plan_arena


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def bufferable(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.is_static


def step_reads(st) -> list[Value]:
    """The graph values a step reads (a fused kernel's body constants are its own)."""
    return [v for v in st.node.inputs if v is not None]


@dataclass(frozen=True)
class Place:
    """Where a value lives at run time."""

    kind: str          # "input" (index) | "weight" (offset) | "arena" (offset) | "python"
    where: int = 0

    def to_json(self) -> list:
        return [self.kind, self.where]

    @staticmethod
    def from_json(j) -> "Place":
        return Place(j[0], int(j[1]))


class MemoryPlan:
    """The places of one program's values (see the module docstring); ``reuse=False`` gives every
    value arena memory of its own (no in-place results, no concat pieces in place)."""

    def __init__(self, graph: Graph, steps: list, reuse: bool = True, profile: bool = False):
        self.graph, self.steps, self.reuse, self.with_profile = graph, steps, reuse, profile
        self.places: dict[int, Place] = {}
        self.native_values: dict[int, Value] = {}
        for st in steps:
            if st.native:
                for v in step_reads(st) + list(st.node.outputs):
                    self.native_values[id(v)] = v
        self.input_index = {id(v): k for k, v in enumerate(graph.inputs)}
        for key in self.native_values:
            if key in self.input_index:
                self.places[key] = Place("input", self.input_index[key])
        # 1. shared buffers: view results -> the value whose buffer they share (byte offsets: concat pieces)
        self.root: dict[int, Value] = {}
        for st in steps:
            if st.native and st.alias:
                self.root[id(st.group.node.outputs[0])] = st.group.node.inputs[0]
        self.offset: dict[int, int] = concats_in_place(steps, graph, self.root) if reuse else {}
        # 2. live ranges of the buffers, and the values that get arena memory
        self.ranges = live_ranges([st.node for st in steps], lambda v: id(self.root_of(v)), graph.outputs)
        self.arena_kind = {id(v) for v in self.native_values.values()
                           if id(v) not in self.input_index and id(v) not in self.root and v.const is None
                           and bufferable(v) and v.producer is not None}
        self.owner: dict[int, Value] = {}   # value -> the value whose arena buffer it shares (in place)
        self.owner_end: dict[int, int] = {}  # a buffer's last step (joined with those written in place)
        self.weights: list[tuple[int, np.ndarray]] = []
        self.weight_at: dict[int, int] = {}
        self.weights_bytes = 0
        self.buffers: list[Buffer] = []
        self.arena_bytes = self.naive_bytes = 0
        self.status: Buffer | None = None
        self.profile: Buffer | None = None
        self._arena_value: dict[int, Buffer] = {}

    def root_of(self, v: Value) -> Value:
        while id(v) in self.root:
            v = self.root[id(v)]
        return v

    def offset_of(self, v: Value) -> int:
        off = 0
        while id(v) in self.root:
            off += self.offset.get(id(v), 0)
            v = self.root[id(v)]
        return off

    # -- before emission ---------------------------------------------------------------------
    def choose_in_place(self, lowerings: dict, enabled: bool = True) -> None:
        """An output takes the buffer of an input that dies in its kernel (``st.in_place``), where the
        lowering allows it (``in_place``) and no later step or other operand sees the input."""
        steps, arena_kind, root_of = self.steps, self.arena_kind, self.root_of
        ends = self.ranges.end
        owner_start: dict[int, int] = {}
        for st in steps:
            for v in st.node.outputs:
                if id(v) in arena_kind:
                    owner_start[id(v)] = st.index
                    self.owner_end[id(v)] = ends[id(v)]
            if not (enabled and self.reuse and st.native and not st.alias):
                continue
            ins = st.group.inputs
            for k_out, j_in in lowerings[st.index].in_place(st.group):
                if k_out in st.in_place or j_in in st.in_place.values():
                    continue
                o, v = st.group.outer_of(st.group.outputs[k_out]), st.group.outer_of(ins[j_in])
                r = root_of(v)
                if id(o) not in arena_kind or id(r) not in arena_kind or id(r) in self.input_index:
                    continue
                rep = self.owner.get(id(r), r)
                if id(rep) not in self.owner_end:
                    continue  # a concat piece: its buffer is the concat's, made later
                if self.owner_end[id(rep)] != st.index or owner_start[id(rep)] >= st.index:
                    continue  # the input's buffer is read later (or a graph output)
                if any(u is not v and root_of(u) is r for u in map(st.group.outer_of, ins)):
                    continue  # another operand views the same buffer: two pointers to one address
                if o.type.nbytes != r.type.nbytes:
                    continue
                self.owner[id(o)] = rep
                self.owner_end[id(rep)] = max(self.owner_end[id(rep)], self.owner_end.pop(id(o)))
                owner_start.pop(id(o))
                st.in_place[k_out] = j_in

    # -- after emission ----------------------------------------------------------------------
    def add_weight(self, key: int, arr: np.ndarray) -> int:
        """The weights offset of an array (added once per key)."""
        if key not in self.weight_at:
            arr = np.ascontiguousarray(arr)
            self.weight_at[key] = self.weights_bytes
            self.weights.append((self.weights_bytes, arr))
            self.weights_bytes += align(arr.nbytes)
        return self.weight_at[key]

    def place_constants(self) -> None:
        """The constants native code reads, and the arrays kernels prepared, into the weights."""
        for st in self.steps:
            for s in st.slots:
                if s.kind == "value":
                    r = self.root_of(s.value)
                    if r.const is not None:
                        self.places[id(r)] = Place("weight", self.add_weight(id(r), r.const))
                elif s.kind == "weight":
                    self.add_weight(id(s.array), s.array)

    def plan_arena(self) -> None:
        """Every other value native code touches, each kernel's scratch and the status record, placed
        in the arena; views and constant outputs get their places."""
        buffers, arena_value = self.buffers, self._arena_value
        outputs = {id(self.root_of(v)) for v in self.graph.outputs}
        first_write = self.ranges.start
        for st in self.steps:
            n = st.node
            for v in n.outputs:
                if id(v) not in self.arena_kind:
                    continue
                self.naive_bytes += align(max(v.type.nbytes or 0, 1))
                label = f"%{n.name or n.op.name}:{v.index}"
                if id(v) in self.owner:  # in place: the input's buffer, living on
                    rep = self.owner[id(v)]
                    buf = arena_value[id(rep)]
                    buf.end = max(buf.end, self.owner_end[id(rep)])
                    buf.values.append(label)
                    if id(v) in outputs:
                        buf.kind = "output"
                else:
                    buf = Buffer(label, v.type.nbytes or 0, min(st.index, first_write.get(id(v), st.index)),
                                 self.owner_end[id(v)], kind="output" if id(v) in outputs else "value")
                    buffers.append(buf)
                arena_value[id(v)] = buf
            if st.scratch_bytes:
                buf = Buffer(f"scratch of {st.kernel}", st.scratch_bytes, st.index, st.index, kind="scratch")
                buffers.append(buf)
                self.naive_bytes += align(st.scratch_bytes)
                arena_value[-(st.index + 1)] = buf
        if any(sl.kind == "status" for st in self.steps for sl in st.slots):
            # the status record of kernels that check their input data (live all along)
            self.status = Buffer("status record", STATUS_BYTES, 0, len(self.steps), kind="scratch")
            buffers.append(self.status)
            self.naive_bytes += align(STATUS_BYTES)
        if self.with_profile:  # the profile record of a timed build (live all along)
            from .native import profile_record_bytes

            self.profile = Buffer("profile record", profile_record_bytes(len(self.steps)), 0, len(self.steps),
                                  kind="scratch")
            buffers.append(self.profile)
            self.naive_bytes += align(self.profile.size)
        self.arena_bytes = plan_arena(buffers, ALIGN, reuse=self.reuse)
        places = self.places
        for key, buf in arena_value.items():
            if key >= 0:
                places[key] = Place("arena", buf.offset)
        for key, v in self.native_values.items():
            if id(v) in self.root and key not in places:
                r = self.root_of(v)
                if id(r) in places:
                    places[key] = Place(places[id(r)].kind, places[id(r)].where + self.offset_of(v))
        for v in self.graph.outputs:  # a constant returned as an output is read from the weights
            r = self.root_of(v)
            if id(v) not in places and r.const is not None and bufferable(r):
                places[id(v)] = places[id(r)] = Place("weight", self.add_weight(id(r), r.const))

    def bind_slots(self) -> None:
        """Every slot of every step gets its place (``st.slot_places``)."""
        for st in self.steps:
            for sl in st.slots:
                if sl.kind == "value":
                    place = self.places.get(id(sl.value)) or self.places.get(id(self.root_of(sl.value)))
                    if place is None:
                        raise CodegenError(f"{st.group.describe()}: the lowering {st.lowering} asked for "
                                           f"{sl.value}, which has no buffer (a value inside a fused kernel: "
                                           f"use KernelBuilder.share or scratch)")
                    st.slot_places.append(place)
                elif sl.kind == "weight":
                    st.slot_places.append(Place("weight", self.weight_at[id(sl.array)]))
                elif sl.kind == "status":
                    st.slot_places.append(Place("arena", self.status.offset))
                else:
                    st.slot_places.append(Place("arena", self._arena_value[-(st.index + 1)].offset + sl.offset))


def concats_in_place(steps: list, graph: Graph, root: dict[int, Value]) -> dict[int, int]:
    """Concats whose pieces are contiguous runs of the result (every dimension before the axis is
    1, e.g. channels of one image) need no copy: each piece is computed by its own kernel straight
    into its slice of the result's buffer (``root[piece] = result``, byte offsets returned), and the
    concat step becomes a view. Chains of concats (DenseNet's blocks) nest: one buffer for all.

    A piece qualifies when a native kernel makes it in the arena, only native kernels read it,
    it is no view, graph input/output or constant, and it is not a piece of another concat; else
    the concat copies as usual."""
    from ..ir.ops import tensor as tn

    produced_by = {id(v): st for st in steps for v in st.node.outputs}
    readers: dict[int, list] = {}
    for st in steps:
        for v in step_reads(st):
            readers.setdefault(id(v), []).append(st)
    outputs = {id(v) for v in graph.outputs}
    graph_inputs = {id(v) for v in graph.inputs}
    offset: dict[int, int] = {}
    for st in steps:
        n = st.node
        if not (st.native and not st.alias and isinstance(n.op, tn.Concat)):
            continue
        y = n.outputs[0]
        axis = n.op.axis % y.type.rank
        if id(y) in outputs or id(y) in root or any(int(d) != 1 for d in y.shape[:axis]):
            continue
        pieces = list(n.inputs)

        def ok(v: Value) -> bool:
            p = produced_by.get(id(v))
            return (p is not None and p.native and not p.alias and v.const is None and id(v) not in root
                    and id(v) not in outputs and id(v) not in graph_inputs and bufferable(v)
                    and sum(u is v for u in pieces) == 1
                    and all(r.native and not r.alias for r in readers.get(id(v), [])))
        if not pieces or not all(ok(v) for v in pieces):
            continue
        off = 0
        for v in pieces:
            root[id(v)] = y
            offset[id(v)] = off
            off += v.type.nbytes
        st.alias = True
        st.notes = [f"concat in place: its {len(pieces)} pieces are computed into their slices"]
    return offset


__all__ = ["MemoryPlan", "Place", "align", "bufferable", "concats_in_place", "step_reads"]
