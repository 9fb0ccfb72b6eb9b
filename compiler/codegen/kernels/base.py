"""The interface between ops and native code: kernel groups, lowerings and the kernel builder.

A **kernel group** is what one native kernel computes: a list of IR nodes (one node when fusion is
off; the fusion pass makes larger groups), the values it reads from outside and the values it
leaves for others. A **lowering** turns a group into the body of one LLVM function; the program
builder (``compiler/codegen/program.py``) calls the kernels in schedule order from one native
forward function.

Every kernel has the same C signature::

    void kernel(void **slots, int32_t nthreads)

``slots`` holds one pointer per buffer the kernel asked for with ``KernelBuilder.ptr`` (an input
or output value of the group), ``KernelBuilder.weight`` (data prepared at compile time, e.g. a
pre-packed weight, stored in the artifact) or ``KernelBuilder.scratch`` (temporary memory for this
kernel alone, planned in the arena). The program builder resolves each slot to an address once the
memory plan is known, so a lowering never deals with offsets. Buffers are dense, row-major and
64-byte aligned (inputs passed by the user: element-aligned only).

A lowering states what it cannot do in ``check`` (a reason, shown by ``kiln inspect`` and in the
warning for an interpreter fallback) and must then never be asked to ``emit``.
"""
from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir

from ...ir.graph import Node, Value
from ...ir.types import DType, TensorType
from ..gemm.config import GemmConfig
from ..gemm.irbuild import _Fn
from ..llvm.elementwise import _For
from ..llvm.mathlib import MathLib
from ..llvm.target import Target
from ..loops import Kernel, print_llvm
from ..loops.expr import FormError

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
PTR = ir.PointerType()
VOID = ir.VoidType()

#: the LLVM scalar type of each element type native kernels handle
LLVM_TYPES: dict[DType, ir.Type] = {
    DType.f32: F32, DType.f64: F64, DType.i64: I64, DType.i32: I32, DType.i8: I8, DType.u8: I8,
    DType.bool: I8,
}

ALIGN = 64
#: the status record of one call (``KernelBuilder.fail_if``): i64 flag, value, limit, step
STATUS_BYTES = 32
#: slots past this many are plain (not ``noalias``) pointers loaded from the slot array
MAX_NOALIAS = 24


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, int(v))


def cf32(v: float) -> ir.Constant:
    return ir.Constant(F32, float(v))


@dataclass(frozen=True, eq=False)
class KernelGroup:
    """The nodes one kernel computes (topological order), what it reads and what it leaves."""

    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    #: for the body of a ``kiln.Kernel`` node: id(body input or result) -> the graph's value there
    #: (``KernelBuilder.ptr`` resolves through it, so lowerings only ever see body values)
    outer: dict = field(default_factory=dict)

    @staticmethod
    def of_node(node: Node) -> "KernelGroup":
        """The group a graph node stands for: the body of a ``kiln.Kernel``, else the node alone."""
        from ...ir.ops.kernel import Kernel

        if not isinstance(node.op, Kernel):
            return KernelGroup.of([node])
        body = node.op.body
        group = KernelGroup.of(body.nodes, outputs=body.outputs)
        outer = {id(b): o for b, o in zip(body.inputs, node.inputs)}
        outer.update({id(b): o for b, o in zip(body.outputs, node.outputs)})
        return KernelGroup(group.nodes, group.inputs, group.outputs, outer)

    def outer_of(self, v: Value) -> Value:
        """The graph's value for a value of the group (itself unless the group is a kernel body)."""
        return self.outer.get(id(v), v)

    def cost(self) -> tuple[int, int]:
        """(FLOPs, bytes) of the group's nodes from the op table (``Op.cost``; bytes: every node's
        operands and results, an upper estimate for a fused kernel), as the manifests record them for
        the profiler; a node whose cost cannot be had counts 0 (the figures are informative only)."""
        flops = bytes_ = 0
        for n in self.nodes:
            try:
                c = n.op.cost([v.type if v is not None else None for v in n.inputs], [o.type for o in n.outputs])
                flops, bytes_ = flops + c.flops, bytes_ + c.bytes
            except Exception:  # noqa: BLE001 - informative only
                pass
        return int(flops), int(bytes_)

    @staticmethod
    def of(nodes: Sequence[Node], outputs: Sequence[Value] | None = None) -> "KernelGroup":
        nodes = tuple(nodes)
        inside = {id(n) for n in nodes}
        produced = {id(v) for n in nodes for v in n.outputs}
        ins: list[Value] = []
        for n in nodes:
            for v in n.inputs:
                if v is not None and id(v) not in produced and all(v is not u for u in ins):
                    ins.append(v)
        if outputs is None:
            outputs = [v for n in nodes for v in n.outputs
                       if any(not (isinstance(u, Node) and id(u) in inside) for u, _ in v.uses)]
        return KernelGroup(nodes, tuple(ins), tuple(outputs or [nodes[-1].outputs[0]]))

    @property
    def node(self) -> Node:
        """The node of a group of one."""
        if len(self.nodes) != 1:
            raise ValueError(f"a group of {len(self.nodes)} nodes has no single node")
        return self.nodes[0]

    @property
    def ops(self) -> list[str]:
        return [n.op.name for n in self.nodes]

    def describe(self) -> str:
        if len(self.nodes) == 1:
            return self.nodes[0].describe()
        return f"group [{', '.join(self.ops)}]"


@dataclass
class Slot:
    """One pointer argument of a kernel: a group value, compile-time data, or scratch memory."""

    kind: str                        # "value" | "weight" | "scratch" | "status"
    value: Value | None = None       # kind "value"
    array: np.ndarray | None = None  # kind "weight"
    offset: int = 0                  # kind "scratch": offset in the kernel's scratch region


class Services:
    """What kernels of one module share: the target, the math library and Kiln's GEMM (emitted on
    first use, once per module)."""

    def __init__(self, module: ir.Module, target: Target, gemm_cfg: GemmConfig):
        self.module, self.target, self.gemm_cfg = module, target, gemm_cfg
        self.math = MathLib(module)
        self._sgemm: ir.Function | None = None
        self.uses_gemm = False
        self.uses_parallel = False
        self._helpers: dict[str, ir.Function] = {}

    def sgemm(self) -> ir.Function:
        """``int32 kiln_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads)``
        (docs/gemm.md); ``ta``/``tb`` = 2 for operands packed with ``pack_a``/``pack_b``.

        Declared here; the GEMM itself is compiled once per configuration and cached
        (``gemm.build.gemm_object``), then linked into the library (``uses_gemm`` says to)."""
        if self._sgemm is None:
            self._sgemm = ir.Function(self.module, _sgemm_type(), "kiln_sgemm")
            self.uses_gemm = True
            if self.gemm_cfg.external_pool:  # its threads are the artifact's pool: link parallel.c
                self.uses_parallel = True
        return self._sgemm

    def sgemm_ep(self) -> ir.Function:
        """``int32 kiln_sgemm_ep(..., nthreads, ep, epctx)``: ``sgemm`` with an epilogue
        ``void ep(void *epctx, i64 i0, i64 i1, i64 j0, i64 j1)`` called on each final block of C."""
        self.sgemm()
        if "kiln_sgemm_ep" not in self.module.globals:
            t = _sgemm_type()
            ir.Function(self.module, ir.FunctionType(t.return_type, list(t.args) + [PTR, PTR]), "kiln_sgemm_ep")
        return self.module.globals["kiln_sgemm_ep"]

    def sgemm_cb(self) -> ir.Function:
        """``int32 kiln_sgemm_cb(..., nthreads, ep, epctx, pb, pbctx)``: ``sgemm_ep`` whose B blocks the
        caller packs: ``void pb(void *pbctx, i64 p0, i64 kc, i64 j0, i64 nc, float *dst)``."""
        self.sgemm()
        if "kiln_sgemm_cb" not in self.module.globals:
            t = _sgemm_type()
            ir.Function(self.module, ir.FunctionType(t.return_type, list(t.args) + [PTR] * 4), "kiln_sgemm_cb")
        return self.module.globals["kiln_sgemm_cb"]

    def sgemm_taps(self) -> ir.Function:
        """``int32 kiln_sgemm_taps(..., nthreads, ep, epctx, pb, pbctx, boff, bgroup)``: ``sgemm_cb``
        whose B rows come in groups of ``bgroup``, group t at ``boff[t]`` (an i64 table) and its rows
        ``ldb`` apart: a convolution's taps read in place (docs/gemm.md)."""
        self.sgemm()
        if "kiln_sgemm_taps" not in self.module.globals:
            t = _sgemm_type()
            ir.Function(self.module, ir.FunctionType(t.return_type, list(t.args) + [PTR] * 5 + [I64]),
                        "kiln_sgemm_taps")
        return self.module.globals["kiln_sgemm_taps"]

    def parallel_for(self, chunks: bool = False) -> ir.Function:
        """``void kiln_parallel_for(void (*task)(void *ctx, i64 begin, i64 end), void *ctx, i64 n,
        i32 nthreads)`` (``codegen/native/parallel.c``, linked when used: ``uses_parallel``); with
        ``chunks``, ``kiln_parallel_for_chunks``, which takes the chunks per thread after nthreads."""
        name = "kiln_parallel_for_chunks" if chunks else "kiln_parallel_for"
        if name not in self.module.globals:
            ir.Function(self.module, ir.FunctionType(VOID, [PTR, PTR, I64, I32] + [I32] * chunks), name)
            self.uses_parallel = True
        return self.module.globals[name]

    def helper(self, name: str, build: Callable[[ir.Module], ir.Function]) -> ir.Function:
        """A module-level function shared by kernels (built once by ``build``)."""
        if name not in self._helpers:
            self._helpers[name] = build(self.module)
        return self._helpers[name]

    def pack_a(self, a: np.ndarray) -> np.ndarray:
        from ..gemm.packing import pack_a_numpy

        return pack_a_numpy(np.ascontiguousarray(a, dtype=np.float32), self.gemm_cfg)

    def pack_b(self, b: np.ndarray) -> np.ndarray:
        from ..gemm.packing import pack_b_numpy

        return pack_b_numpy(np.ascontiguousarray(b, dtype=np.float32), self.gemm_cfg)


@functools.lru_cache(maxsize=1)
def _sgemm_type() -> ir.FunctionType:
    """The entry's LLVM type, from the argument list ``emit_gemm`` defines it with (emitting the GEMM
    to read its type took 0.3 s of every process's first compile)."""
    from ..gemm.kernel import sgemm_type

    return sgemm_type()


def _body_function(module: ir.Module, name: str, extra: list[tuple[ir.Type, str]]) -> ir.Function:
    """``void name(ptr noalias s0, ..., s{MAX_NOALIAS-1}, ptr slots, extra...)``: where a kernel's (or a
    parallel task's) code goes; internal and always inlined into its caller, which passes the slot
    pointers (LLVM keeps their ``noalias`` as alias scopes when it inlines)."""
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR] * (MAX_NOALIAS + 1) + [t for t, _ in extra]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("alwaysinline")
    for j, a in enumerate(fn.args[:MAX_NOALIAS]):
        a.name = f"s{j}"
        a.add_attribute("noalias")
    fn.args[MAX_NOALIAS].name = "slots"
    for a, (_, n) in zip(fn.args[MAX_NOALIAS + 1:], extra):
        a.name = n
    return fn


class KernelBuilder:
    """One kernel function under construction (see the module docstring).

    ``b`` is the llvmlite builder, positioned in the body; ``f`` offers loop/if helpers
    (``f.loop(start, stop, step)``, ``f.if_(cond)``, ``f.min``/``f.max``); ``loop(count)`` is the
    rotated loop the vectorizer likes best.
    """

    def __init__(self, services: Services, name: str, group: KernelGroup, internal: bool = True):
        self.services = services
        self.module = services.module
        self.math = services.math
        self.target = services.target
        self.group = group
        self.name = name
        self._tasks = 0  # parallel_for task functions made so far (``name.task{i}``)
        #: chunks per thread of this kernel's parallel loops (None: ``kiln_parallel_for``'s 4); a
        #: lowering sets it for all of them (the int8 ones: ``gemm/int8.py``)
        self.chunks_per_thread: int | None = None
        # ``name(slots, nthreads)`` (what the forward function calls) loads the slot pointers and calls
        # ``name.body(s0, ..., s{MAX_NOALIAS-1}, slots, nthreads)``, where the lowering's code goes:
        # its pointer arguments are ``noalias`` (buffers a kernel writes never overlap the others),
        # which LLVM keeps as alias scopes when it inlines the body, so loops need no overlap checks.
        wrapper = ir.Function(self.module, ir.FunctionType(VOID, [PTR, I32]), name)
        if internal:
            wrapper.linkage = "internal"
        wrapper.attributes.add("nounwind")
        # kept out of the forward function: LLVM's O3 on one huge inlined function is superlinear
        wrapper.attributes.add("noinline")
        wrapper.args[0].name, wrapper.args[1].name = "slots", "nthreads"
        self.wrapper = wrapper
        fn = _body_function(self.module, name + ".body", [(I32, "nthreads")])
        self.fn = fn
        self.f = _Fn(fn)  # its "entry" block loads slot pointers past MAX_NOALIAS, then branches to "body"
        self._body = fn.append_basic_block("body")
        self.b = self.f.b
        self.b.position_at_end(self._body)
        self.nthreads = fn.args[-1]
        self.slots: list[Slot] = []
        self._slot_of: dict[int, int] = {}
        self._ptrs: dict[int, ir.Value] = {}
        self._trampolines: list[ir.Function] = []
        self._alias: dict[int, Value] = {}
        self._slot_of_ptr: dict[int, int] = {}  # id(pointer value) -> its slot (for again())
        self.scratch_bytes = 0
        #: (output index, input index) pairs of ``group`` the program builder gave one buffer (the
        #: lowering offered them in ``Lowering.in_place``): the kernel must ask ``ptr`` for the input
        #: only and write the output through it, since two slots of one address break ``noalias``
        self.in_place: dict[int, int] = {}
        #: how the lowering made this kernel, in a few words each (``kiln inspect --kernels``)
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        """Record how this kernel was made (e.g. "epilogue inside the GEMM"), for the manifest."""
        if text not in self.notes:
            self.notes.append(text)

    # -- buffers -------------------------------------------------------------------------------
    def _slot_ptr(self, j: int) -> ir.Value:
        if j < MAX_NOALIAS:
            ptr = self.fn.args[j]
        else:
            if j not in self._ptrs:
                eb = ir.IRBuilder(self.fn.entry_basic_block)
                addr = eb.gep(self.fn.args[MAX_NOALIAS], [c64(j)], source_etype=PTR)
                self._ptrs[j] = eb.load(addr, typ=PTR, name=f"slot{j}")
            ptr = self._ptrs[j]
        self._slot_of_ptr[id(ptr)] = j
        return ptr

    def again(self, ptr: ir.Value) -> ir.Value:
        """The buffer a pointer from ``ptr``/``weight``/``scratch`` stands for, in the function being
        built now: e.g. inside ``parallel_for`` for scratch asked for before the block."""
        j = self._slot_of_ptr.get(id(ptr))
        if j is None:
            raise ValueError("again() takes a pointer that ptr(), weight() or scratch() returned")
        return self._slot_ptr(j)

    def here(self, ptr: ir.Value) -> ir.Value:
        """``ptr`` in the function being built now: ``again`` for a slot pointer (from ``ptr``, ``weight``
        or ``scratch``), else ``ptr`` itself (a value of this function)."""
        return self.again(ptr) if id(ptr) in self._slot_of_ptr else ptr

    def ptr(self, value: Value) -> ir.Value:
        """The buffer of an input or output value of the group (dense row-major)."""
        if all(value is not v for v in self.group.inputs + self.group.outputs) and \
                all(value is not o for n in self.group.nodes for o in n.outputs):
            raise ValueError(f"{value} is not read or written by {self.group.describe()}")
        while id(value) in self._alias:
            value = self._alias[id(value)]
        value = self.group.outer_of(value)
        key = id(value)
        if key not in self._slot_of:
            self._slot_of[key] = len(self.slots)
            self.slots.append(Slot("value", value=value))
        return self._slot_ptr(self._slot_of[key])

    def share(self, value: Value, with_value: Value) -> None:
        """Let ``value`` (a result computed inside the group) live in ``with_value``'s buffer: e.g. a
        GEMM writes its result where its epilogue then computes the group's output in place."""
        self._alias[id(value)] = with_value

    def weight(self, array: np.ndarray) -> ir.Value:
        """Compile-time data (e.g. a pre-packed weight): stored in the artifact, read-only."""
        key = id(array)
        if key not in self._slot_of:
            self._slot_of[key] = len(self.slots)
            self.slots.append(Slot("weight", array=np.ascontiguousarray(array)))
        return self._slot_ptr(self._slot_of[key])

    def scratch(self, nbytes: int) -> ir.Value:
        """Temporary memory for this kernel alone (64-byte aligned, contents undefined on entry)."""
        off = self.scratch_bytes
        self.scratch_bytes += -(-max(int(nbytes), 1) // ALIGN) * ALIGN
        self.slots.append(Slot("scratch", offset=off))
        return self._slot_ptr(len(self.slots) - 1)

    def fail_if(self, bad: ir.Value, value: ir.Value, limit: int) -> None:
        """Report a run-time error of the input data (e.g. an index ``value`` out of ``[-limit,
        limit)``) when ``bad`` (i1) holds: the kernel writes ``(1, value, limit)`` to the call's status
        record (``STATUS_BYTES`` in the arena), the forward function returns after this kernel and
        the runtime raises an error naming the node. The kernel itself must still not touch memory
        out of bounds (it goes on to its end)."""
        b = self.b
        if not any(sl.kind == "status" for sl in self.slots):
            self.slots.append(Slot("status"))
        j = next(i for i, sl in enumerate(self.slots) if sl.kind == "status")
        rec = self._slot_ptr(j)
        with b.if_then(bad, likely=False):
            for i, v in enumerate((c64(1), value, c64(limit))):
                b.store(v, b.gep(rec, [c64(i)], source_etype=I64))

    # -- parallel loops --------------------------------------------------------------------------
    @contextmanager
    def parallel_for(self, count: int, min_per_task: int = 1):
        """``with k.parallel_for(n) as (begin, end):`` emit code for the indices [begin, end) of a loop
        over ``n`` iterations that the thread pool runs in chunks (``kiln_parallel_for``: about 4 per
        thread, or the kernel's ``chunks_per_thread``).

        The body goes into a function of its own: inside the block, ``k.b``, ``k.f``, ``k.fn`` and
        ``k.nthreads`` (1: no nested parallelism) are the task's, and ``k.ptr``/``k.weight``/``k.scratch``
        give the task's pointers. So the body must not use LLVM values made before the block (ask
        ``k.ptr`` again inside, or ``k.again(p)`` for a pointer got before), and scratch memory is
        shared by all tasks: partition it by index.
        With ``count < 2 * min_per_task`` the loop runs on the calling thread (no block function).
        """
        outer = (self.fn, self.f, self.b, self.nthreads, self._ptrs, self._body)
        idx = self._tasks  # the next free task number (a dict lookup each: modules hold thousands of globals)
        while f"{self.name}.task{idx}" in self.module.globals:
            idx += 1
        self._tasks = idx + 1
        task = _body_function(self.module, f"{self.name}.task{idx}", [(I32, "nthreads"), (I64, "begin"), (I64, "end")])
        begin, end = task.args[-2:]
        self.fn, self.f = task, _Fn(task)
        self._body = task.append_basic_block("body")
        self.b = self.f.b
        self.b.position_at_end(self._body)
        self.nthreads, self._ptrs = ir.Constant(I32, 1), {}
        try:
            yield begin, end
            if not self.b.block.is_terminated:
                self.b.ret_void()
            ir.IRBuilder(task.entry_basic_block).branch(self._body)
        finally:
            self.fn, self.f, self.b, self.nthreads, self._ptrs, self._body = outer
        # the trampoline the pool calls: task(ctx = the slot array, begin, end)
        tramp = ir.Function(self.module, ir.FunctionType(VOID, [PTR, I64, I64]), f"{task.name}.run")
        tramp.linkage = "internal"
        tramp.attributes.add("nounwind")
        tb = ir.IRBuilder(tramp.append_basic_block("entry"))
        ctx, lo, hi = tramp.args
        nslots = len(self.slots)
        ptrs = [tb.load(tb.gep(ctx, [c64(j)], source_etype=PTR), typ=PTR) if j < nslots else ir.Constant(PTR, None)
                for j in range(MAX_NOALIAS)]
        tb.call(task, ptrs + [ctx, ir.Constant(I32, 1), lo, hi])
        tb.ret_void()
        self._trampolines.append(tramp)
        # in the kernel: run it over the pool, or inline when too small to split
        if count < 2 * max(min_per_task, 1):
            self.b.call(tramp, [self.fn.args[MAX_NOALIAS], c64(0), c64(count)])
        else:
            args = [tramp, self.fn.args[MAX_NOALIAS], c64(count), self.nthreads]
            if self.chunks_per_thread is None:
                self.b.call(self.services.parallel_for(), args)
            else:
                self.b.call(self.services.parallel_for(chunks=True), args + [ir.Constant(I32, self.chunks_per_thread)])

    # -- code ----------------------------------------------------------------------------------
    @contextmanager
    def loop(self, count, name: str = "i", interleave: int | None = None):
        """``for (i = 0; i < count; ++i)`` (count an int or an i64 value); yields i."""
        from ..llvm.elementwise import loop_metadata

        md = loop_metadata(self.module, interleave) if interleave else None
        with _For(self.b, c64(count) if isinstance(count, int) else count, name, md) as i:
            yield i

    def at(self, ptr: ir.Value, index, ty: ir.Type = F32) -> ir.Value:
        """The address of element ``index`` (an int or i64 value) of a buffer of ``ty``."""
        return self.b.gep(ptr, [c64(index) if isinstance(index, int) else index], inbounds=True, source_etype=ty)

    def load(self, ptr: ir.Value, index, ty: ir.Type = F32) -> ir.Value:
        return self.b.load(self.at(ptr, index, ty), typ=ty)

    def store(self, value: ir.Value, ptr: ir.Value, index) -> None:
        self.b.store(value, self.at(ptr, index, value.type))

    def finish(self) -> None:
        if not self.b.block.is_terminated:
            self.b.ret_void()
        ir.IRBuilder(self.fn.entry_basic_block).branch(self._body)
        b = ir.IRBuilder(self.wrapper.append_basic_block("entry"))
        slots, nthreads = self.wrapper.args
        args = [b.load(b.gep(slots, [c64(j)], source_etype=PTR), typ=PTR) if j < len(self.slots)
                else ir.Constant(PTR, None) for j in range(MAX_NOALIAS)]
        b.call(self.fn, args + [slots, nthreads])
        b.ret_void()


class Lowering:
    """How the groups of some op classes become native code.

    ``ops``: the op classes it lowers (a group of one node of such a class). ``alias``: the result
    is the input's buffer seen with another shape (Reshape and the like): no kernel at all.
    """

    ops: tuple[type, ...] = ()
    alias: bool = False

    def check(self, group: KernelGroup) -> str | None:
        """None when ``emit`` can lower the group, else why not (one short sentence)."""
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        raise NotImplementedError

    def in_place(self, group: KernelGroup) -> list[tuple[int, int]]:
        """(output index, input index) pairs of ``group`` that ``emit`` can compute in place: the
        output written over the input's buffer (same size). The program builder applies a pair when
        the input dies in this kernel and tells ``emit`` through ``k.in_place``. Default: none."""
        return []


class FormLowering(Lowering):
    """A lowering whose kernel is built in the loop form (``form``): ``emit`` prints it with the LLVM
    printer, and every other backend prints the same kernel."""

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        """The group as a loop-form kernel; ``in_place`` {output index: input index} writes those
        outputs over their inputs' buffers (for lowerings that offer ``in_place``)."""
        raise NotImplementedError

    def form_reason(self, group: KernelGroup) -> str | None:
        """Why the form cannot be built for ``group`` (None when it can)."""
        try:
            self.form(group, "check")
        except (FormError, ValueError) as e:
            return str(e)
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        print_llvm(k, self.form(group, f"{k.name}.loop", k.in_place))


#: elements of work a parallel task gets at least
PAR_MIN_WORK = 1 << 16


def par_grain(work_per_iter: int, min_work: int = PAR_MIN_WORK) -> int:
    """The fewest iterations of ``work_per_iter`` elements each worth a parallel task (a loop's
    ``grain``)."""
    return max(1, -(-int(min_work) // max(int(work_per_iter), 1)))


def dtype_reason(values: Sequence[Value | None], allowed=(DType.f32,)) -> str | None:
    """Why values are not all static tensors of the allowed element types (None if they are)."""
    for v in values:
        if v is None:
            continue
        if not isinstance(v.type, TensorType):
            return f"{v.type} values are not handled by native kernels"
        if v.type.dtype not in allowed:
            return f"element type {v.type.dtype.name} is not supported natively (only " \
                   f"{', '.join(d.name for d in allowed)})"
        if not v.type.is_static:
            return f"shape {list(v.shape)} is not static"
    return None


def unary_f32_reason(group: KernelGroup) -> str | None:
    """Why a one-node group does not map a non-empty static float32 tensor to another (None if it does):
    the common refusal of the row/plane lowerings (pooling, softmax, LRN, ...)."""
    n = group.node
    why = dtype_reason([n.inputs[0], n.outputs[0]])
    if why:
        return why
    if n.inputs[0].type.numel == 0:
        return "empty tensors are left to the interpreter"
    return None


def unravel(b: ir.IRBuilder, index: ir.Value, shape: Sequence[int]) -> list[ir.Value]:
    """The per-axis indices of the flat (row-major) ``index`` into ``shape``."""
    return [b.urem(b.udiv(index, c64(math.prod(shape[a + 1:]))), c64(int(d))) for a, d in enumerate(shape)]


def strides_of(shape: Sequence[int]) -> list[int]:
    out, s = [], 1
    for d in reversed(list(shape)):
        out.append(s)
        s *= int(d)
    return list(reversed(out))


__all__ = ["ALIGN", "F32", "F64", "I1", "I8", "I32", "I64", "PTR", "VOID", "LLVM_TYPES", "KernelBuilder", "unravel",
           "KernelGroup", "Lowering", "Services", "Slot", "c64", "cf32", "dtype_reason", "par_grain", "strides_of"]
