"""The numba.cuda printer: a loop-form ``Kernel`` as the Python source of a ``@cuda.jit`` kernel.

``print_cuda(kernel)`` returns a ``CudaKernel``: the source (``.source``, readable) and ``launch``.
The kernel takes each buffer as a flat device array (its elements from the first the buffer
addresses; strides are compiled into the index arithmetic), then its run-time sizes (int64); buffers bound to one value (two views
of one array) share one parameter, so their reads and writes see each other. The top-level parallel loop becomes a
grid-stride loop (``for i in range(cuda.grid(1), n, cuda.gridsize(1))``: a thread per iteration
while there are threads, any grid size works); only ``let``s may stand beside it at the top level
(every thread computes them). A kernel without a parallel loop is one thread's work. Inner loops are
``range`` loops, accumulators Python variables.

Values keep their compute types: every operation is wrapped in its type's constructor
(``float32(a + b)``, ``int8(a * b)``), which numba compiles to a conversion (integers wrap) and the
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) evaluates with NumPy scalars. The primitives' meanings
(``expr.PRIMS``) are kept with a few device helpers printed into the module: NaN-propagating
min/max, truncating integer division (0 for division by 0), round half to even.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...ir.types import DType
from .expr import SMALL_FLOATS, NARROW_INTS, Const, Expr, FormError, Load, Op, Var
from .form import Acc, Buffer, Check, Kernel, Let, Loop, Store, Update

#: compute or storage type -> numba type name
TYPES = {DType.f32: "float32", DType.f64: "float64", DType.f16: "float16", DType.bool: "boolean",
         DType.i8: "int8", DType.i16: "int16", DType.i32: "int32", DType.i64: "int64", DType.u8: "uint8",
         DType.u16: "uint16", DType.u32: "uint32", DType.u64: "uint64"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
          "ne": "!=", "shl": "<<", "shr": ">>"}
_BITS = {"and": "&", "or": "|", "xor": "^"}
_MATH = {"sqrt": "sqrt", "exp": "exp", "expm1": "expm1", "log": "log", "log1p": "log1p", "tanh": "tanh",
         "erf": "erf", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "sin": "sin", "cos": "cos", "tan": "tan",
         "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
         "acosh": "acosh", "atanh": "atanh", "abs": "fabs"}

#: primitives printed from a template ({0}, {1}, ...: the operands; {t}: the result's numba type)
_TEMPLATES = {
    "fma": "{t}({0} * {1} + {2})",
    "isnan": "math.isnan({0})",
    "isinf": "math.isinf({0})",
    "round": "{t}(_rint({0}))",
    "to_f16": "{t}(float16({0}))",
    "sigmoid": "{t}({t}(1.0) / ({t}(1.0) + math.exp(-{0})))",
    "xsigmoid": "{t}({0} / ({t}(1.0) + math.exp(-{1})))",
    "softplus": "({0} if math.isnan({0}) else {t}(max({0}, {t}(0.0)) + math.log1p(math.exp(-abs({0})))))",
    "gelu": "{t}({t}(0.5) * {0} * ({t}(1.0) + math.erf({0} * {t}(0.7071067811865476))))",
    "pow": "{t}(math.pow({0}, {1}))",
}

#: device helpers, printed into every module (numba compiles them; the simulator runs them as Python)
PRELUDE = '''
@cuda.jit(device=True)
def _fmin(x, y):
    return x if (x <= y or x != x) else y


@cuda.jit(device=True)
def _fmax(x, y):
    return x if (x >= y or x != x) else y


@cuda.jit(device=True)
def _idiv(a, b):
    if b == 0:
        return a - a
    q = a // b
    if a % b != 0 and (a < 0) != (b < 0):
        q += 1
    return q


@cuda.jit(device=True)
def _irem(a, b):
    if b == 0:
        return a - a
    return a - _idiv(a, b) * b


@cuda.jit(device=True)
def _odd_f32(x):
    # x (float64) rounded to float32 toward odd, as a float64 (the odd_f32 primitive)
    y = float64(float32(x))
    if y == x or x != x or math.isinf(y):
        return y
    if y == 0.0:
        return math.copysign(1.401298464324817e-45, x)
    f, e = math.frexp(y)
    ulp = math.ldexp(1.0, max(e - 24, -149))
    if math.fmod(y / ulp, 2.0) != 0.0:
        return y
    step = ulp / 2.0 if abs(x) < abs(y) and abs(f) == 0.5 and e - 24 > -149 else ulp
    return y + math.copysign(step, x - y)


@cuda.jit(device=True)
def _rint(x):
    r = math.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and math.fmod(r, 2.0) != 0.0):
        r += 1.0
    return r
'''


@dataclass
class CudaKernel:
    name: str
    source: str
    buffers: list[Buffer]
    #: iterations of the parallel loop (0: none)
    parallel: int
    #: the kernel reports bad input data: it takes a status array (int64[3]) after its buffers
    checks: bool = False
    #: the run-time sizes it takes after its buffers: (name, largest value)
    sizes: list = field(default_factory=list)
    _fn: object = field(default=None, repr=False)

    def function(self):
        """The ``@cuda.jit`` kernel (compiled from ``source`` on first use)."""
        if self._fn is None:
            import numba
            from numba import cuda

            ns = {"cuda": cuda, "math": _SimMath() if numba.config.ENABLE_CUDASIM else math, "numba": numba}
            ns.update({t: getattr(numba, t) for t in set(TYPES.values()) if hasattr(numba, t)})
            ns["float16"] = getattr(numba, "float16", None) or numba.types.float16
            exec(compile(self.source, f"<kiln cuda {self.name}>", "exec"), ns)
            self._fn = ns[self.name]
        return self._fn

    def launch(self, arrays, threads: int = 128, blocks: int | None = None, sizes=()) -> None:
        """Run on ``arrays`` (one per parameter, ``buffers``: the kernel's buffers, those bound to
        one value once; flat arrays or device arrays) and ``sizes`` (one int per run-time size). A
        kernel that reports bad input data raises ``KernelReport`` after the launch."""
        if len(arrays) != len(self.buffers):
            raise ValueError(f"{self.name} takes {len(self.buffers)} buffers, got {len(arrays)}")
        if len(sizes) != len(self.sizes):
            raise ValueError(f"{self.name} takes {len(self.sizes)} sizes, got {len(sizes)}")
        for (name, bound), n in zip(self.sizes, sizes):
            if not 0 <= int(n) <= bound:
                raise ValueError(f"{self.name}: size {name} = {n} is outside [0, {bound}]")
        import numpy as np

        arrays = list(arrays) + [np.int64(n) for n in sizes]
        if blocks is None:
            blocks = max(1, min(-(-self.parallel // threads), 1024)) if self.parallel else 1
        if not self.checks:
            self.function()[blocks, threads](*arrays)
            return
        status = np.zeros(3, np.int64)
        self.function()[blocks, threads](*arrays, status)
        if status[0]:
            raise KernelReport(int(status[1]), int(status[2]))


class KernelReport(ValueError):
    """A kernel found bad input data: an index ``value`` outside ``[-limit, limit)``."""

    def __init__(self, value: int, limit: int):
        super().__init__(f"index {value} is out of range [-{limit}, {limit})")
        self.value, self.limit = value, limit


class _SimMath:
    """``math`` for kernels in the CUDA simulator: IEEE results as on the GPU (NaN and infinities
    in and out) where Python's ``math`` raises, computed with NumPy on the simulator's NumPy scalars."""

    def __getattr__(self, name: str):
        import numpy as np

        if name in ("inf", "nan", "pi", "e"):
            return getattr(math, name)
        if name == "erf":
            return lambda x: type(x)(math.erf(x)) if hasattr(x, "dtype") else math.erf(x)
        return {"fabs": np.abs, "pow": np.power, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
                "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh}.get(name) or getattr(np, name)


class _Printer:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.lines: list[str] = []
        #: one parameter per array: buffers bound to the same value (views of one array) share it
        self.params: list[Buffer] = []
        self.args: dict[int, str] = {}
        #: id(index variable) -> (lo, hi): loop indices and integer lets, for ``natural``
        self.ranges: dict[int, tuple] = {}
        first: dict[int, str] = {}
        for b in kernel.buffers:
            key = id(b.value) if b.value is not None else id(b)
            if key not in first:
                first[key] = f"b{len(self.params)}_{_ident(b.name)}"
                self.params.append(b)
            self.args[id(b)] = first[key]
        for b in kernel.buffers:
            if b.dtype is DType.bf16:
                raise FormError(f"buffer {b.name}: numba.cuda has no bfloat16")
            if b.dtype in SMALL_FLOATS:
                raise FormError(f"buffer {b.name}: the numba.cuda printer has no {b.dtype} loads and stores yet")
            if b.dtype in NARROW_INTS:
                raise FormError(f"buffer {b.name}: the numba.cuda printer has no {b.dtype} loads and stores yet")

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    # -- expressions -------------------------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        if isinstance(e, Const):
            return self.const(e)
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Load):
            ref = f"{self.args[id(e.buf)]}[{self.offset(e.buf, e.index)}]"
            return f"float32({ref})" if e.buf.dtype is DType.f16 else ref
        return self.op(e)

    def const(self, e: Const) -> str:
        if e.dtype is DType.bool:
            return "True" if e.value else "False"
        if e.dtype.is_float:
            v = e.value
            text = "math.nan" if math.isnan(v) else ("math.inf" if v > 0 else "-math.inf") if math.isinf(v) \
                else repr(float(v))
            return f"{TYPES[e.dtype]}({text})"
        return f"{TYPES[e.dtype]}({int(e.value)})"

    def offset(self, buf: Buffer, index) -> str:
        terms = []
        for i, s in zip(index, buf.strides):
            if s == 0:
                continue
            t = self.expr(i)
            terms.append(t if s == 1 else f"{t} * {s}")
        return " + ".join(terms) if terms else "0"

    def op(self, e: Op) -> str:
        p, t = e.prim, TYPES[e.dtype]
        if p == "select":
            return f"({self.expr(e.args[1])} if {self.expr(e.args[0])} else {self.expr(e.args[2])})"
        xs = [self.expr(a) for a in e.args]
        dt = e.args[0].dtype
        if p == "cast":
            if e.dtype is DType.bool:
                return f"({xs[0]} != 0)"
            if dt.is_float and e.dtype.is_int and e.dtype not in (DType.i64, DType.u64, DType.i32):
                return f"{t}(int64({xs[0]}))"  # float to a narrow integer wraps through i64
            return f"{t}({xs[0]})"
        if p in _INFIX:
            r = f"({xs[0]} {_INFIX[p]} {xs[1]})"
            return r if e.dtype is DType.bool else f"{t}{r}"
        if p in _BITS:
            return f"{t}({xs[0]} {_BITS[p]} {xs[1]})" if dt is not DType.bool else f"({xs[0]} {_BITS[p]} {xs[1]})"
        if p == "not":
            return f"(not {xs[0]})" if dt is DType.bool else f"{t}(~{xs[0]})"
        if p == "neg":
            return f"{t}(-{xs[0]})"
        if p in ("min", "max"):
            return f"_f{p}({xs[0]}, {xs[1]})" if dt.is_float else f"{t}({p}({xs[0]}, {xs[1]}))"
        if p in ("div", "rem") and not dt.is_float and self.natural(e):
            return f"{t}({xs[0]} {'//' if p == 'div' else '%'} {xs[1]})"  # a constant divisor: a multiply
        if p == "div":
            return f"{t}({xs[0]} / {xs[1]})" if dt.is_float else f"{t}(_idiv({xs[0]}, {xs[1]}))"
        if p == "rem":
            if dt.is_float:
                return f"{t}(math.fmod({xs[0]}, {xs[1]}))"
            return f"{t}(_irem({xs[0]}, {xs[1]}))"
        if p == "abs" and not dt.is_float:
            return f"{t}(abs({xs[0]}))"
        if p == "to_bf16":
            raise FormError("numba.cuda has no bfloat16")
        if p == "odd_f32":
            return xs[0] if dt is DType.f32 else f"{t}(_odd_f32({xs[0]}))"
        if p in _TEMPLATES:
            return _TEMPLATES[p].format(*xs, t=t)
        if p in _MATH:
            return f"{t}(math.{_MATH[p]}({xs[0]}))"
        raise FormError(f"the numba.cuda printer has no {p} for {dt}")

    def natural(self, e: Op) -> bool:
        """An integer division or remainder of a value known non-negative by a positive constant:
        Python's floor semantics are the primitive's truncating ones, and the compiler turns the
        division into a multiply (``_idiv``'s tests for signs and 0 would stay)."""
        from .verify import bounds

        d = e.args[1]
        return isinstance(d, Const) and d.value > 0 and bounds(e.args[0], self.ranges)[0] >= 0

    def bind(self, var: Var, lo, hi) -> None:
        """What the printer knows of an index variable's range (for ``natural``)."""
        self.ranges[id(var)] = (lo, hi)

    # -- statements --------------------------------------------------------------------------------
    def block(self, stmts, depth: int) -> None:
        from .verify import bounds

        if not stmts:
            self.emit(depth, "pass")
        for s in stmts:
            if isinstance(s, Loop):
                extent = s.extent.name if isinstance(s.extent, Var) else s.extent
                self.bind(s.var, 0, (s.extent - 1) if isinstance(s.extent, int) else float("inf"))
                self.emit(depth, f"for {s.var.name} in range({extent}):")
                self.block(s.body, depth + 1)
            elif isinstance(s, (Let, Acc)):
                if isinstance(s, Let) and s.var.dtype.is_int:
                    self.bind(s.var, *bounds(s.value, self.ranges))
                self.emit(depth, f"{s.var.name} = {self.expr(s.value if isinstance(s, Let) else s.init)}")
            elif isinstance(s, Update):
                v, x, t = s.var.name, self.expr(s.value), TYPES[s.var.dtype]
                if s.combiner in ("min", "max"):
                    rhs = f"_f{s.combiner}({v}, {x})" if s.var.dtype.is_float else f"{t}({s.combiner}({v}, {x}))"
                elif s.combiner in ("and", "or") and s.var.dtype is DType.bool:
                    rhs = f"({v} {_BITS[s.combiner]} {x})"
                else:
                    sym = {"add": "+", "mul": "*", "and": "&", "or": "|"}[s.combiner]
                    rhs = f"{t}({v} {sym} {x})"
                self.emit(depth, f"{v} = {rhs}")
            elif isinstance(s, Store):
                self.emit(depth, f"{self.args[id(s.buf)]}[{self.offset(s.buf, s.index)}] = {self.expr(s.value)}")
            elif isinstance(s, Check):
                self.emit(depth, f"if {self.expr(s.bad)}:")
                for j, v in enumerate(("1", self.expr(s.value), str(s.limit))):
                    self.emit(depth + 1, f"_status[{j}] = {v}")
            else:
                raise FormError(f"not a statement: {s!r}")


def _collapsed(loop: Loop) -> tuple[list[Loop], list]:
    """The parallel loop and the loops nested alone inside it whose iterations are independent (a
    vector loop, or one storing to no buffer it reads: with nothing else in its parent's body, no
    accumulator or let outside it can carry a value between iterations), and the innermost body: a
    GPU runs their iterations as threads (a CPU form splits only its outer loop among a few threads)."""
    nest, body = [loop], loop.body
    while len(body) == 1 and isinstance(body[0], Loop) and isinstance(body[0].extent, int) and \
            (body[0].kind == "vector" or not _reads_what_it_stores(body[0])):
        nest.append(body[0])
        body = body[0].body
    return nest, body


def _reads_what_it_stores(loop: Loop) -> bool:
    from .expr import walk

    stored, loaded = set(), set()
    stack = list(loop.body)
    while stack:
        s = stack.pop()
        if isinstance(s, Loop):
            stack.extend(s.body)
            continue
        # (an accumulator is private to one iteration: the loop stands alone in its parent's body,
        # so every accumulator it updates is declared inside it)
        if isinstance(s, Store):
            stored.add(id(s.buf.value) if s.buf.value is not None else id(s.buf))
        for e in _exprs(s):
            for x in walk(e):
                if isinstance(x, Load):
                    loaded.add(id(x.buf.value) if x.buf.value is not None else id(x.buf))
    return bool(stored & loaded)


def _exprs(s) -> list:
    if isinstance(s, Let):
        return [s.value]
    if isinstance(s, Store):
        return [s.value, *s.index]
    if isinstance(s, Check):
        return [s.bad, s.value]
    return []


def _print_parallel(p: "_Printer", loop: Loop) -> int:
    """The parallel loop (collapsed with the loops nested alone in it) as a grid-stride loop over
    their iterations; returns how many there are."""
    nest, body = _collapsed(loop)
    extents = [int(lp.extent) for lp in nest]
    total = math.prod(extents)
    for lp, n in zip(nest, extents):
        p.bind(lp.var, 0, n - 1)
    if len(nest) == 1:
        p.emit(1, f"for {loop.var.name} in range(tid, {loop.extent}, cuda.gridsize(1)):")
    else:
        p.emit(1, f"for _flat in range(tid, {total}, cuda.gridsize(1)):")
        inner = 1
        for lp, n in reversed(list(zip(nest, extents))):
            rest = f"_flat // {inner}" if inner > 1 else "_flat"
            p.emit(2, f"{lp.var.name} = {rest} % {n}" if lp is not loop else f"{lp.var.name} = {rest}")
            inner *= n
    p.block(body, 2)
    return total


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def print_cuda(kernel: Kernel) -> CudaKernel:
    """The numba.cuda kernel of ``kernel`` (see the module docstring)."""
    p = _Printer(kernel)
    name = _ident(kernel.name)
    p.lines += PRELUDE.strip("\n").splitlines() + ["", ""]
    p.emit(0, "@cuda.jit")
    params = [p.args[id(b)] for b in p.params] + [v.name for v, _ in kernel.sizes] + \
        (["_status"] if kernel.checks else [])
    p.emit(0, f"def {name}({', '.join(params)}):")
    p.emit(1, "tid = cuda.grid(1)")
    parallel = next((s for s in kernel.body if isinstance(s, Loop) and s.kind == "parallel"), None)
    if parallel is None:  # one thread's work
        p.emit(1, "if tid == 0:")
        p.block(kernel.body, 2)
    total = 0
    for s in kernel.body if parallel is not None else ():
        if s is parallel:
            total = _print_parallel(p, s)
        elif isinstance(s, Let):
            p.block([s], 1)
        else:
            raise FormError(f"kernel {kernel.name}: only lets may stand beside the parallel loop at the top "
                            f"level (a {type(s).__name__.lower()} does)")
    return CudaKernel(name, "\n".join(p.lines) + "\n", list(p.params), total,
                      kernel.checks, [(v.name, bound) for v, bound in kernel.sizes])
