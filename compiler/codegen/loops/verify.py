"""The loop form's verifier: ``verify(kernel)`` raises ``FormError`` naming the statement and showing
the kernel's text when a kernel is ill-formed.

It checks that every name is bound before use and in scope (a loop index inside its loop, a ``let``
or ``acc`` in the rest of its block), bound once; loads read the kernel's buffers and stores write
only "out", "inout" or "scratch" ones, with one i64 index per axis and a value of the buffer's
compute type; an accumulator is updated with its own type and a combiner that takes it; at most one
loop is parallel and it is at the top level; a vector loop holds no loop. And that every index is
in bounds: each index expression's range follows from the loop extents (a run-time size: its bound)
by interval arithmetic
(``bounds``); an index whose range cannot be bounded (one read from memory, say) must be clamped in
the expression itself (``min``/``max``/``select``), so that no backend can address outside a buffer.
"""
from __future__ import annotations

from ...ir.types import DType
from .expr import INDEX, PRIMS, Const, Expr, FormError, Load, Op, Var, compute_type, walk
from .form import COMBINERS, Acc, Check, Kernel, Let, Loop, Store, Update
from .text import expr_text

INF = float("inf")


def bounds(e: Expr, ranges: dict[int, tuple[float, float]]) -> tuple[float, float]:
    """[lo, hi] of an integer expression, given the ranges of its variables (by id); (-inf, inf)
    where it cannot tell."""
    if isinstance(e, Const):
        v = float(e.value)
        return v, v
    if isinstance(e, Var):
        return ranges.get(id(e), (-INF, INF))
    if not isinstance(e, Op) or not e.dtype.is_int:
        return -INF, INF
    if e.prim == "cast":
        return bounds(e.args[0], ranges) if e.args[0].dtype.is_int else (-INF, INF)
    if e.prim == "select":
        (a0, a1), (b0, b1) = bounds(e.args[1], ranges), bounds(e.args[2], ranges)
        return min(a0, b0), max(a1, b1)
    rs = [bounds(a, ranges) for a in e.args]
    if e.prim == "add":
        return rs[0][0] + rs[1][0], rs[0][1] + rs[1][1]
    if e.prim == "sub":
        return rs[0][0] - rs[1][1], rs[0][1] - rs[1][0]
    if e.prim == "neg":
        return -rs[0][1], -rs[0][0]
    if e.prim == "mul":
        ps = [x * y for x in rs[0] for y in rs[1] if not ({x, y} & {INF, -INF} and 0 in (x, y))]
        return (min(ps), max(ps)) if len(ps) == 4 else (-INF, INF)
    if e.prim == "min":
        return min(rs[0][0], rs[1][0]), min(rs[0][1], rs[1][1])
    if e.prim == "max":
        return max(rs[0][0], rs[1][0]), max(rs[0][1], rs[1][1])
    if e.prim in ("div", "rem") and rs[1][0] == rs[1][1] and rs[1][0] > 0 and rs[0][0] >= 0:
        d = rs[1][0]
        return (rs[0][0] // d, rs[0][1] // d) if e.prim == "div" else (0, min(d - 1, rs[0][1]))
    return -INF, INF


class _Checker:
    def __init__(self, k: Kernel):
        self.k = k
        self.buffers = {id(b) for b in k.buffers}
        self.bound: set[int] = set()       # every Var bound anywhere (bound once)
        self.scope: list[set[int]] = [set()]
        self.ranges: dict[int, tuple[float, float]] = {}
        self.accs: set[int] = set()
        self.names: set[str] = set()
        self.sizes = {id(v): bound for v, bound in k.sizes}
        for v, bound in k.sizes:  # visible everywhere, in [0, bound]
            if bound < 0:
                self.fail("sizes", f"size {v.name} with a negative bound {bound}")
            self.bind(v, "sizes", (0, bound))

    def fail(self, where: str, message: str):
        raise FormError(f"kernel {self.k.name}: {where}: {message}\n{self.k}")

    def visible(self, v: Var) -> bool:
        return any(id(v) in s for s in self.scope)

    def bind(self, v: Var, where: str, rng=(-INF, INF)) -> None:
        if id(v) in self.bound:
            self.fail(where, f"{v.name} is bound twice")
        if v.name in self.names:
            self.fail(where, f"the name {v.name} is bound twice")
        self.bound.add(id(v))
        self.names.add(v.name)
        self.scope[-1].add(id(v))
        self.ranges[id(v)] = rng

    def expr(self, e: Expr, where: str) -> None:
        for x in walk(e):  # names first: an index's bounds need its names bound
            if isinstance(x, Var) and not self.visible(x):
                self.fail(where, f"{x.name} is used outside the scope that binds it")
        for x in walk(e):
            if isinstance(x, Load):
                if id(x.buf) not in self.buffers:
                    self.fail(where, f"{expr_text(x)} reads a buffer the kernel does not list")
                if x.buf.role == "out":
                    self.fail(where, f"{expr_text(x)} reads {x.buf.name}, an output only (make it inout)")
                self.index(x.buf, x.index, where)
            elif isinstance(x, Op):
                if x.prim not in PRIMS:
                    self.fail(where, f"unknown primitive {x.prim}")

    def index(self, buf, index, where: str) -> None:
        if len(index) != len(buf.shape):
            self.fail(where, f"{len(index)} indices into {buf.name}, which has {len(buf.shape)} axes")
        for axis, (i, d) in enumerate(zip(index, buf.shape)):
            if i.dtype is not INDEX:
                self.fail(where, f"index {axis} into {buf.name} is {i.dtype}, not i64")
            lo, hi = bounds(i, self.ranges)
            if lo < 0 or hi > d - 1:
                self.fail(where, f"index {axis} into {buf.name} ({expr_text(i)}) ranges over [{lo:g}, {hi:g}], "
                                 f"outside 0..{d - 1}")

    def block(self, stmts, depth: int, in_vector: bool) -> None:
        self.scope.append(set())
        for n, s in enumerate(stmts):
            where = f"{type(s).__name__.lower()} #{n} at depth {depth}"
            if isinstance(s, Loop):
                if s.kind == "parallel" and depth:
                    self.fail(where, "a parallel loop must be at the top level")
                if in_vector:
                    self.fail(where, "a loop inside a vector loop")
                if isinstance(s.extent, Var):
                    if id(s.extent) not in self.sizes:
                        self.fail(where, f"extent {s.extent.name} is not a size of the kernel")
                    if s.kind == "parallel":
                        self.fail(where, "a parallel loop over a run-time size")
                    top = self.sizes[id(s.extent)]
                else:
                    if s.extent < 0:
                        self.fail(where, f"negative extent {s.extent}")
                    top = s.extent
                self.scope.append(set())
                self.bind(s.var, where, (0, top - 1) if top > 0 else (0, -1))
                self.block(s.body, depth + 1, s.kind == "vector")
                self.scope.pop()
            elif isinstance(s, Let):
                self.expr(s.value, where)
                if s.var.dtype is not s.value.dtype:
                    self.fail(where, f"let {s.var.name}: {s.var.dtype} bound to a {s.value.dtype} value")
                self.bind(s.var, where, bounds(s.value, self.ranges) if s.value.dtype.is_int else (-INF, INF))
            elif isinstance(s, Acc):
                self.expr(s.init, where)
                if s.var.dtype is not s.init.dtype:
                    self.fail(where, f"acc {s.var.name}: {s.var.dtype} initialized with {s.init.dtype}")
                self.bind(s.var, where)
                self.accs.add(id(s.var))
            elif isinstance(s, Update):
                self.expr(s.value, where)
                if id(s.var) not in self.accs or not self.visible(s.var):
                    self.fail(where, f"{s.var.name} is not an accumulator in scope")
                if s.combiner not in COMBINERS:
                    self.fail(where, f"combiner {s.combiner}")
                if s.value.dtype is not s.var.dtype:
                    self.fail(where, f"{s.var.name} ({s.var.dtype}) updated with a {s.value.dtype} value")
                if s.combiner in ("and", "or") and not (s.var.dtype.is_int or s.var.dtype is DType.bool):
                    self.fail(where, f"{s.combiner} of {s.var.dtype}")
            elif isinstance(s, Store):
                if id(s.buf) not in self.buffers:
                    self.fail(where, f"a store to {s.buf.name}, which the kernel does not list")
                if s.buf.role == "in":
                    self.fail(where, f"a store to {s.buf.name}, an input")
                for i in s.index:
                    self.expr(i, where)
                self.expr(s.value, where)
                self.index(s.buf, s.index, where)
                if s.value.dtype is not compute_type(s.buf.dtype):
                    self.fail(where, f"a {s.value.dtype} value stored to {s.buf.name} ({s.buf.dtype})")
            elif isinstance(s, Check):
                self.expr(s.bad, where)
                self.expr(s.value, where)
                if s.bad.dtype is not DType.bool or s.value.dtype is not INDEX:
                    self.fail(where, f"fail_if takes a bool and an i64, got {s.bad.dtype} and {s.value.dtype}")
            else:
                self.fail(where, f"not a statement: {s!r}")
        self.scope.pop()


def verify(k: Kernel) -> Kernel:
    c = _Checker(k)
    names = [b.name for b in k.buffers]
    if len(set(names)) != len(names):
        c.fail("buffers", f"a buffer name appears twice: {names}")
    parallel = [lp for lp in k.loops() if lp.kind == "parallel"]
    if len(parallel) > 1:
        c.fail("loops", f"{len(parallel)} parallel loops (at most one)")
    c.block(k.body, 0, False)
    return k
