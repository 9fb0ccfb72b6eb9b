"""The loop form of one kernel: buffers, loops and statements over typed scalar expressions.

A ``Kernel`` is a name, its ``Buffer``s and a body of statements:

    Loop(var, extent, body, kind)   ``for var in 0..extent``; kind "serial", "parallel" (split among
                                    threads or GPU blocks: only at the top level, at most one) or
                                    "vector" (innermost: no loop inside; its iterations are independent);
                                    the extent is static, or (serial and vector loops) a run-time
                                    size of the kernel (``KernelForm.size(name, bound)``)
    Let(var, value)                 an immutable name for a value in the rest of the block
    Acc(var, init)                  a mutable accumulator, visible in the rest of the block
    Update(var, combiner, value)    ``var = combiner(var, value)``: a reduction step (add, mul, min, max,
                                    and, or); a backend may reassociate it (vector or tree reductions)
    Store(buf, index, value)        one element of an output or scratch buffer
    Check(bad, value, limit)        where ``bad`` holds the input data is wrong (an index ``value``
                                    outside ``[-limit, limit)``): the run reports it and the kernel
                                    goes on without reading out of bounds (its indices are clamped)

A buffer has an element type, a shape and strides in elements (0 on an axis it broadcasts along),
a role ("in", "out", "inout": read and written, "scratch": the kernel's own), and ``value``: what the
backend binds it to (an IR value for the CPU program). Indices are i64 expressions per axis; the
verifier (``verify.py``) proves them in bounds from the loop extents where it can.

``KernelForm`` builds kernels with ``with`` blocks::

    kf = KernelForm("scale")
    x = kf.buffer("x", DType.f32, (4, 8))
    y = kf.buffer("y", DType.f32, (4, 8), role="out")
    with kf.loop(4, "parallel") as i, kf.loop(8, "vector") as j:
        kf.store(y, (i, j), x[i, j] * 2.0)
    kernel = kf.finish()
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence, Union

from ...ir.types import DType
from .expr import INDEX, STORAGE_TYPES, Expr, FormError, Load, Var, compute_type, lift

ROLES = ("in", "out", "inout", "scratch")
LOOP_KINDS = ("serial", "parallel", "vector")
COMBINERS = ("add", "mul", "min", "max", "and", "or")


@dataclass(eq=False)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...] = ()     # in elements; () = dense row-major
    role: str = "in"
    value: object = None              # what the backend binds the buffer to (a NumPy array: constant data)

    def __post_init__(self):
        if self.dtype not in STORAGE_TYPES:
            raise FormError(f"buffer {self.name} of {self.dtype}: buffers hold "
                            f"{', '.join(sorted(t.short for t in STORAGE_TYPES))}")
        if self.role not in ROLES:
            raise FormError(f"buffer {self.name}: role {self.role!r} is not one of {ROLES}")
        self.shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in self.shape):
            raise FormError(f"buffer {self.name}: negative dimension in {list(self.shape)}")
        if not self.strides:
            self.strides = dense_strides(self.shape)
        self.strides = tuple(int(s) for s in self.strides)
        if len(self.strides) != len(self.shape):
            raise FormError(f"buffer {self.name}: {len(self.strides)} strides for {len(self.shape)} axes")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def extent(self) -> int:
        """Elements from the first to one past the last the buffer can address (0 when empty)."""
        if self.numel == 0:
            return 0
        return 1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides))

    def __getitem__(self, index) -> Load:
        index = index if isinstance(index, tuple) else (index,)
        return Load(self, tuple(lift(i, INDEX) for i in index))


def dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(out))


@dataclass(eq=False)
class Loop:
    var: Var
    extent: "int | Var"               # a run-time size (``KernelForm.size``) for serial and vector loops
    body: list = field(default_factory=list)
    kind: str = "serial"
    #: (parallel loops) the fewest iterations worth a task of their own
    grain: int = 1


@dataclass(eq=False)
class Let:
    var: Var
    value: Expr


@dataclass(eq=False)
class Acc:
    var: Var
    init: Expr


@dataclass(eq=False)
class Update:
    var: Var
    combiner: str
    value: Expr


@dataclass(eq=False)
class Store:
    buf: Buffer
    index: tuple[Expr, ...]
    value: Expr


@dataclass(eq=False)
class Check:
    bad: Expr
    value: Expr
    limit: int


Stmt = Union[Loop, Let, Acc, Update, Store, Check]


@dataclass(eq=False)
class Kernel:
    name: str
    buffers: list[Buffer]
    body: list
    #: how the lowering made it, in a few words each
    notes: list[str] = field(default_factory=list)
    #: the run-time sizes the kernel takes (``KernelForm.size``), each with its largest value
    sizes: list[tuple[Var, int]] = field(default_factory=list)

    @property
    def checks(self) -> bool:
        """Whether the kernel reports bad input data (has a ``Check``)."""
        stack = list(self.body)
        while stack:
            s = stack.pop()
            if isinstance(s, Check):
                return True
            if isinstance(s, Loop):
                stack.extend(s.body)
        return False

    def loops(self):
        """Every loop, outermost first."""
        stack = list(reversed(self.body))
        while stack:
            s = stack.pop()
            if isinstance(s, Loop):
                yield s
                stack.extend(reversed(s.body))

    def __str__(self) -> str:
        from .text import print_kernel

        return print_kernel(self)


class KernelForm:
    """Builds a ``Kernel`` (see the module docstring); names of loop indices and bound values are
    made unique (``i0``, ``i1``, ``t0``, ...)."""

    def __init__(self, name: str):
        self.name = name
        self.buffers: list[Buffer] = []
        self._blocks: list[list] = [[]]
        self._count: dict[str, int] = {}
        self.notes: list[str] = []
        self.sizes: list[tuple[Var, int]] = []

    def fresh(self, prefix: str) -> str:
        k = self._count.get(prefix, 0)
        self._count[prefix] = k + 1
        return f"{prefix}{k}"

    def buffer(self, name: str, dtype: DType, shape: Sequence[int], role: str = "in", strides: Sequence[int] = (),
               value: object = None) -> Buffer:
        if any(b.name == name for b in self.buffers):
            name = f"{name}_{len(self.buffers)}"
        buf = Buffer(name, dtype, tuple(shape), tuple(strides), role, value)
        self.buffers.append(buf)
        return buf

    def size(self, name: str, bound: int) -> Var:
        """A size known at run time only (the backend passes it: a kernel argument), at most
        ``bound``: the extent of serial and vector loops whose length varies between calls (a GEMM
        tile's edge, a symbolic batch), and a value for index arithmetic."""
        v = Var(self.fresh(name), INDEX)
        self.sizes.append((v, int(bound)))
        return v

    def emit(self, stmt) -> None:
        self._blocks[-1].append(stmt)

    @contextmanager
    def loop(self, extent: "int | Var", kind: str = "serial", grain: int = 1, name: str = "i"):
        if kind not in LOOP_KINDS:
            raise FormError(f"loop kind {kind!r} is not one of {LOOP_KINDS}")
        if isinstance(extent, Var):
            if all(extent is not v for v, _ in self.sizes):
                raise FormError(f"loop extent {extent.name} is not a size of this kernel (KernelForm.size)")
        else:
            extent = int(extent)
        lp = Loop(Var(self.fresh(name), INDEX), extent, [], kind, max(int(grain), 1))
        self.emit(lp)
        self._blocks.append(lp.body)
        try:
            yield lp.var
        finally:
            self._blocks.pop()

    def let(self, value: Expr, name: str = "t") -> Var:
        v = Var(self.fresh(name), value.dtype)
        self.emit(Let(v, value))
        return v

    def acc(self, init: Expr, name: str = "acc") -> Var:
        v = Var(self.fresh(name), init.dtype)
        self.emit(Acc(v, init))
        return v

    def update(self, var: Var, combiner: str, value: Expr) -> None:
        if combiner not in COMBINERS:
            raise FormError(f"combiner {combiner!r} is not one of {COMBINERS}")
        self.emit(Update(var, combiner, lift(value, var.dtype)))

    def store(self, buf: Buffer, index, value: Expr) -> None:
        index = index if isinstance(index, tuple) else (index,)
        self.emit(Store(buf, tuple(lift(i, INDEX) for i in index), lift(value, compute_type(buf.dtype))))

    def fail_if(self, bad: Expr, value: Expr, limit: int) -> None:
        """Report bad input data where ``bad`` holds (see ``Check``)."""
        self.emit(Check(bad, lift(value, INDEX), int(limit)))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def finish(self, check: bool = True) -> Kernel:
        if len(self._blocks) != 1:
            raise FormError("finish() inside a loop")
        k = Kernel(self.name, list(self.buffers), self._blocks[0], list(self.notes), list(self.sizes))
        if check:
            from .verify import verify

            verify(k)
        return k
