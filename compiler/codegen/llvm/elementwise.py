"""Elementwise kernels: a chain of elementwise/broadcast IR nodes on float32 as one LLVM loop nest.

``emit_elementwise(module, nodes, name)`` adds to an llvmlite module the function ::

    void name(const float *in0, ..., float *out0, ..., int64_t n)

computing every node of ``nodes`` (in order) at each point of the iteration space (the outputs'
shape), and returns an ``ElementwiseKernel`` that says what each argument is. ``n`` is the number
of output elements:

* when every input has the outputs' shape (or holds one element), the kernel is one flat loop and
  works for any ``n`` (symbolic dimensions are fine);
* otherwise inputs broadcast NumPy-style (a dimension of 1, or a missing leading one, repeats).
  Shapes are static, except the outermost dimension, which may be symbolic: it is ``n`` divided by
  the product of the others. Dimensions that broadcast the same way for every operand are merged,
  the strides are compiled in, and a value that the innermost loop does not move over is loaded
  once before it, so the innermost loop always reads with stride 1 (or not at all) and vectorizes.

Scalar constants (one element) are compiled in; other constants are inputs like any other value.
Pointers are declared ``noalias`` (no two overlap) unless ``noalias=False``, when LLVM checks for
overlap at run time before it takes the vector loop. To compute in place, ``in_place={k: j}``
writes output k through the pointer of input j (which must have the outputs' shape): the function
then has no pointer for that output, and each point reads all its inputs before writing. Results match the reference (``op.compute``) bit for bit for + - * /, sqrt, min, max,
clip, relu and the other piecewise-linear ops; for exp, log, tanh, erf and what is built on them
(``mathlib``) to about one ulp.

``emit_scalar_op`` (one op on float32 scalars) and ``MathLib`` are the pieces a fused-kernel
lowering reuses for its own loops.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
from llvmlite import ir

from ...ir.graph import Node, Value
from ...ir.ops import elementwise as ew
from ...ir.ops.base import OpDef
from ...ir.ops.shape import Identity
from ...ir.types import DType, TensorType
from .mathlib import F32, MathLib, f32
from .target import Target, host_target
from .toolchain import CodegenError

I64 = ir.IntType(64)
PTR = ir.PointerType()

# ---------------------------------------------------------------------------------------------
# One op on float32 scalars
# ---------------------------------------------------------------------------------------------

def fmax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """NumPy's maximum: NaN if either is NaN, else the larger (x on ties)."""
    keep = b.or_(b.fcmp_ordered(">=", x, y), b.fcmp_unordered("uno", x, x))
    return b.select(keep, x, y)


def fmin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """NumPy's minimum: NaN if either is NaN, else the smaller (x on ties)."""
    keep = b.or_(b.fcmp_ordered("<=", x, y), b.fcmp_unordered("uno", x, x))
    return b.select(keep, x, y)


#: the ops fused float32 chains compute (fusion's elementwise set; their semantics: ``loops/scalar.py``)
SCALAR_OPS = frozenset({
    Identity, ew.Add, ew.Sub, ew.Mul, ew.Div, ew.Sum, ew.Mean, ew.Max, ew.Min, ew.Neg, ew.Abs, ew.Sqrt, ew.Floor,
    ew.Ceil, ew.Round, ew.Reciprocal, ew.Sign, ew.Exp, ew.Log, ew.Tanh, ew.Erf, ew.Sigmoid, ew.Softplus, ew.Mish,
    ew.Softsign, ew.Relu, ew.LeakyRelu, ew.PRelu, ew.Elu, ew.Celu, ew.Selu, ew.ThresholdedRelu, ew.HardSigmoid,
    ew.HardSwish, ew.Shrink, ew.Swish, ew.Gelu, ew.Clip, ew.Pow})

#: ops whose element function calls a math function (see ``loop_metadata``)
_HEAVY = frozenset({ew.Exp, ew.Log, ew.Tanh, ew.Erf, ew.Sigmoid, ew.Softplus, ew.Mish, ew.Elu, ew.Celu, ew.Selu,
                    ew.Swish, ew.Gelu})


def emit_scalar_op(b: ir.IRBuilder, math_lib: MathLib, op: OpDef, args: Sequence[ir.Value | None]) -> ir.Value:
    """The float32 result of ``op`` at one point, from its operands' float32 values there (None for
    a missing optional operand; a constant operand is an ``ir.Constant``): the op's semantics from
    ``loops/scalar.py``, printed by the loop form's LLVM printer."""
    from ..loops.expr import Const, Var
    from ..loops.llvm import expr_llvm
    from ..loops.scalar import scalar

    if type(op) not in SCALAR_OPS:
        raise CodegenError(f"{op.name} has no elementwise float32 code generation; supported: "
                           f"{', '.join(sorted(c.__name__ for c in SCALAR_OPS))}")
    env, xs = {}, []
    for a in args:
        if a is None or isinstance(a, ir.Constant):
            xs.append(None if a is None else Const(float(a.constant), DType.f32))
        else:
            v = Var(f"a{len(env)}", DType.f32)
            env[id(v)] = a
            xs.append(v)
    try:
        return expr_llvm(b, math_lib, scalar(op, xs, DType.f32), env)
    except ValueError as e:
        raise CodegenError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# The loop nest
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoopNest:
    """The iteration space after merging dimensions: ``sizes[0]`` is None when it comes from ``n``."""

    sizes: tuple[int | None, ...]
    #: per input, per loop: the element stride (0 where the input broadcasts)
    strides: tuple[tuple[int, ...], ...]

    @property
    def inner(self) -> int:
        """Elements per step of the outermost loop."""
        return math.prod(s for s in self.sizes[1:])


def _dim_static(d) -> bool:
    return isinstance(d, int)


def plan_loops(out_shape: Sequence, in_shapes: Sequence[Sequence]) -> LoopNest:
    """Merge the dimensions of a broadcast into as few loops as possible, with static strides."""
    out_shape = tuple(out_shape)
    in_shapes = [tuple(s) for s in in_shapes]
    if all(s == out_shape or _numel(s) == 1 for s in in_shapes):
        return LoopNest((None,), tuple((0,) if s != out_shape else (1,) for s in in_shapes))
    rank = len(out_shape)
    full: list[list[bool]] = []  # per input, per dim: the input moves along it
    for s in in_shapes:
        if len(s) > rank:
            raise CodegenError(f"input shape {list(s)} has more dimensions than the output {list(out_shape)}")
        padded = (1,) * (rank - len(s)) + s
        row = []
        for d, (i, o) in enumerate(zip(padded, out_shape)):
            if i == o and not (o == 1):
                row.append(True)
            elif i == 1:
                row.append(False)
            else:
                raise CodegenError(f"input shape {list(s)} does not broadcast to {list(out_shape)} (dimension {d})")
        full.append(row)
    # drop size-1 output dimensions (no input moves along them)
    dims = [d for d, o in enumerate(out_shape) if o != 1]
    groups: list[list[int]] = []
    for d in dims:
        if groups and all(full[j][d] == full[j][groups[-1][-1]] for j in range(len(in_shapes))):
            groups[-1].append(d)
        else:
            groups.append([d])
    if not groups:
        groups = [[]]
    sizes: list[int | None] = []
    for g, members in enumerate(groups):
        dims_ = [out_shape[d] for d in members]
        if all(_dim_static(d) for d in dims_):
            sizes.append(math.prod(dims_))
        elif g == 0:
            sizes.append(None)
        else:
            raise CodegenError(f"broadcasting to {list(out_shape)}: only the outermost dimension may be dynamic "
                               f"when inputs broadcast")
    strides = []
    for j in range(len(in_shapes)):
        row, step = [], 1
        for g in reversed(range(len(groups))):
            moves = bool(groups[g]) and full[j][groups[g][0]]
            row.append(step if moves else 0)
            if moves:
                if sizes[g] is None:
                    step = 0  # nothing outside the outermost loop
                else:
                    step *= sizes[g]
        strides.append(tuple(reversed(row)))
    sizes[0] = None  # the outermost loop counts n / inner (n = the static size when the shape is static)
    return LoopNest(tuple(sizes), tuple(strides))


def _numel(shape) -> int | None:
    return math.prod(shape) if all(_dim_static(d) for d in shape) else None


def _loop_id(module: ir.Module, option: str, value: ir.Constant) -> ir.MDValue:
    """A loop ID (``!llvm.loop`` metadata) carrying one option."""
    opt = module.add_metadata([ir.MetaDataString(module, option), value])
    loop_id = ir.values.MDValue(module, [], name=str(len(module.metadata)))
    loop_id.operands = (loop_id, opt)  # a loop ID refers to itself first
    return loop_id


def loop_metadata(module: ir.Module, interleave: int) -> ir.MDValue:
    """A loop ID asking the vectorizer to interleave ``interleave`` vector iterations (more
    independent work in flight for long math bodies)."""
    return _loop_id(module, "llvm.loop.interleave.count", ir.Constant(ir.IntType(32), interleave))


def no_vectorize_metadata(module: ir.Module) -> ir.MDValue:
    """A loop ID that keeps the vectorizer off a loop (e.g. one over rows whose body is already
    vector code: vectorizing it would gather across rows)."""
    return _loop_id(module, "llvm.loop.vectorize.enable", ir.Constant(ir.IntType(1), 0))


class _For:
    """``for (i = 0; i < count; ++i)`` as a guarded, rotated loop (the form LLVM's passes expect)."""

    def __init__(self, b: ir.IRBuilder, count: ir.Value, name: str, metadata: ir.MDValue | None = None):
        self.b, self.count, self.name, self.metadata = b, count, name, metadata

    def __enter__(self) -> ir.Value:
        b = self.b
        fn = b.function
        self.pre = b.block
        self.body = fn.append_basic_block(f"{self.name}.body")
        self.done = fn.append_basic_block(f"{self.name}.end")
        b.cbranch(b.icmp_signed(">", self.count, ir.Constant(I64, 0)), self.body, self.done)
        b.position_at_end(self.body)
        self.i = b.phi(I64, name=self.name)
        self.i.add_incoming(ir.Constant(I64, 0), self.pre)
        return self.i

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        b = self.b
        nxt = b.add(self.i, ir.Constant(I64, 1), name=f"{self.name}.next", flags=["nuw", "nsw"])
        self.i.add_incoming(nxt, b.block)
        br = b.cbranch(b.icmp_signed("<", nxt, self.count), self.body, self.done)
        if self.metadata is not None:
            br.set_metadata("llvm.loop", self.metadata)
        b.position_at_end(self.done)
        return False


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ElementwiseKernel:
    """What ``emit_elementwise`` made: the function's name and the meaning of its arguments.

    The C signature is ``void name(const float *inputs..., float *outputs..., int64_t n)``; ``inputs``
    and ``outputs`` are the IR values each pointer holds (row-major, contiguous).
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    #: the iteration space: every output's shape
    shape: tuple
    loops: LoopNest
    #: (output index, input index) pairs: outputs written through an input's pointer
    in_place: tuple[tuple[int, int], ...] = ()

    @property
    def pointer_outputs(self) -> tuple[int, ...]:
        """The indices of the outputs that have a pointer argument (all but the in-place ones)."""
        done = {k for k, _ in self.in_place}
        return tuple(k for k in range(len(self.outputs)) if k not in done)

    @property
    def argtypes(self) -> list:
        """ctypes argument types, for ``lib[name].argtypes``."""
        return [ctypes.c_void_p] * (len(self.inputs) + len(self.pointer_outputs)) + [ctypes.c_int64]

    @property
    def signature(self) -> str:
        written = {j: k for k, j in self.in_place}
        ins = [f"{'' if j in written else 'const '}float *in{j} /* {v.type}"
               f"{f', also out{written[j]}' if j in written else ''} */" for j, v in enumerate(self.inputs)]
        outs = [f"float *out{k} /* {self.outputs[k].type} */" for k in self.pointer_outputs]
        return f"void {self.name}({', '.join(ins + outs + ['int64_t n'])})"

    def bind(self, lib: ctypes.CDLL) -> Callable[..., list[np.ndarray]]:
        """A Python callable running the kernel of a loaded library on NumPy arrays:
        ``run(*inputs, out=None) -> [outputs]`` (float32; symbolic dimensions bind from the inputs)."""
        fn = getattr(lib, self.name)
        fn.argtypes = self.argtypes
        fn.restype = None

        def run(*arrays: np.ndarray, out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
            if len(arrays) != len(self.inputs):
                raise ValueError(f"{self.name} takes {len(self.inputs)} inputs, got {len(arrays)}")
            xs = [np.asarray(a, dtype=np.float32, order="C") for a in arrays]
            binding: dict = {}
            for v, a in zip(self.inputs, xs):
                if a.ndim != len(v.shape) or any(
                        (want != got) if isinstance(want, int) else (binding.setdefault(want, got) != got)
                        for want, got in zip(v.shape, a.shape) if want is not None):
                    raise ValueError(f"{self.name}: input of shape {list(a.shape)} for {v.type}")
            shape = tuple(d if isinstance(d, int) else binding.get(d) for d in self.shape)
            if any(d is None for d in shape):
                shape = np.broadcast_shapes(*[a.shape for a in xs]) if xs else shape
            ptr_outs = self.pointer_outputs
            outs = list(out) if out is not None else [np.empty(shape, np.float32) for _ in ptr_outs]
            if len(outs) != len(ptr_outs):
                raise ValueError(f"{self.name} writes {len(ptr_outs)} output buffers, got {len(outs)}")
            for o in outs:
                if o.shape != tuple(shape) or o.dtype != np.float32 or not o.flags.c_contiguous:
                    raise ValueError(f"{self.name}: outputs must be contiguous float32 of shape {list(shape)}")
            fn(*[a.ctypes.data for a in xs], *[o.ctypes.data for o in outs], int(np.prod(shape)))
            result = dict(zip(ptr_outs, outs))
            result.update({k: xs[j] for k, j in self.in_place})
            return [result[k] for k in range(len(self.outputs))]

        return run


def _is_inlined(v: Value, inline_constants: bool) -> bool:
    return inline_constants and v.const is not None and v.const.size == 1


def _check_f32(node: Node, v: Value, what: str) -> None:
    if not isinstance(v.type, TensorType) or v.type.dtype is not DType.f32:
        raise CodegenError(f"{node.describe()}: {what} is {v.type}; elementwise kernels are float32 only")


def group_outputs(nodes: Sequence[Node]) -> list[Value]:
    """The values of a group that something outside it uses (the graph's return included); the
    last node's result when nothing does."""
    inside = {id(n) for n in nodes}
    outs = [v for n in nodes for v in n.outputs
            if any(not (hasattr(u, "op") and id(u) in inside) for u, _ in v.uses)]
    return outs or [nodes[-1].outputs[0]]


def emit_elementwise(module: ir.Module, nodes: Sequence[Node], name: str, outputs: Sequence[Value] | None = None,
                     math_lib: MathLib | None = None, noalias: bool = True,
                     inline_constants: bool = True, in_place: Mapping[int, int] | None = None) -> ElementwiseKernel:
    """Add ``void name(inputs..., outputs..., int64 n)`` computing ``nodes`` to ``module``.

    ``nodes`` are in topological order, each an op of ``SCALAR_OPS`` on float32 with one result;
    ``outputs`` defaults to ``group_outputs(nodes)``. Every output must have the iteration shape
    (the broadcast of everything the group reads). ``in_place`` maps output indices to the input
    whose buffer they overwrite (see the module docstring).
    """
    nodes = list(nodes)
    if not nodes:
        raise CodegenError("emit_elementwise needs at least one node")
    math_lib = math_lib or MathLib(module)
    produced = {id(v) for n in nodes for v in n.outputs}
    inputs: list[Value] = []
    for n in nodes:
        if type(n.op) not in SCALAR_OPS:
            raise CodegenError(f"{n.describe()}: {n.op.name} has no elementwise float32 code generation; "
                               f"supported: {', '.join(sorted(c.__name__ for c in SCALAR_OPS))}")
        if len(n.outputs) != 1:
            raise CodegenError(f"{n.describe()} has {len(n.outputs)} results; elementwise kernels take "
                               f"single-result ops")
        _check_f32(n, n.outputs[0], "its result")
        for i, v in enumerate(n.inputs):
            if v is None:
                continue
            _check_f32(n, v, f"input {i}")
            if id(v) not in produced and not _is_inlined(v, inline_constants) and all(v is not u for u in inputs):
                inputs.append(v)
    outs = list(outputs) if outputs is not None else group_outputs(nodes)
    for v in outs:
        if id(v) not in produced:
            raise CodegenError(f"output {v} is not computed by the group")
    shape = tuple(outs[0].shape)
    for v in outs[1:]:
        if tuple(v.shape) != shape:
            raise CodegenError(f"outputs of one kernel must share a shape: {outs[0].type} and {v.type}")
    nest = plan_loops(shape, [v.shape for v in inputs])
    # every value computed inside must broadcast to the iteration space too
    for n in nodes:
        plan_loops(shape, [n.outputs[0].shape])
    in_place = dict(in_place or {})
    for k, j in in_place.items():
        if not (0 <= k < len(outs) and 0 <= j < len(inputs)):
            raise CodegenError(f"in_place {{{k}: {j}}}: the kernel has {len(outs)} outputs and {len(inputs)} inputs")
        if tuple(inputs[j].shape) != shape:
            raise CodegenError(f"in_place: input {j} ({inputs[j].type}) cannot hold output {k} ({outs[k].type})")
    if len(set(in_place.values())) != len(in_place):
        raise CodegenError(f"in_place {in_place}: two outputs would overwrite one input")
    ptr_outs = [k for k in range(len(outs)) if k not in in_place]
    out_arg = {k: len(inputs) + i for i, k in enumerate(ptr_outs)}
    out_arg.update(in_place)

    fn_type = ir.FunctionType(ir.VoidType(), [PTR] * (len(inputs) + len(ptr_outs)) + [I64])
    if name in module.globals:
        raise CodegenError(f"the module already defines {name!r}")
    fn = ir.Function(module, fn_type, name=name)
    fn.attributes.add("nounwind")
    for k, arg in enumerate(fn.args[:-1]):
        arg.name = f"in{k}" if k < len(inputs) else f"out{ptr_outs[k - len(inputs)]}"
        if noalias:
            arg.add_attribute("noalias")
        arg.add_attribute("captures(none)")
    n_arg = fn.args[-1]
    n_arg.name = "n"
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def load(j: int, offset: ir.Value) -> ir.Value:
        ptr = b.gep(fn.args[j], [offset], inbounds=True, source_etype=F32)
        return b.load(ptr, typ=F32, align=4, name=f"x{j}")

    loaded: dict[int, ir.Value] = {}
    zero = ir.Constant(I64, 0)
    # inputs that never move (one element): read once
    for j in range(len(inputs)):
        if all(s == 0 for s in nest.strides[j]):
            loaded[j] = load(j, zero)

    depth = len(nest.sizes)
    counts: list[ir.Value] = [b.udiv(n_arg, ir.Constant(I64, nest.inner), name="outer") if depth > 1 else n_arg]
    counts += [ir.Constant(I64, s) for s in nest.sizes[1:]]

    def body(offsets: list[ir.Value], out_offset: ir.Value, values: dict[int, ir.Value]) -> None:
        env: dict[int, ir.Value] = {}
        for j, v in enumerate(inputs):
            env[id(v)] = values[j] if j in values else load(j, offsets[j])
        for n in nodes:
            args = []
            for v in n.inputs:
                if v is None:
                    args.append(None)
                elif id(v) in env:
                    args.append(env[id(v)])
                else:  # an inlined scalar constant
                    args.append(f32(float(np.asarray(v.const, dtype=np.float32).reshape(()))))
            env[id(n.outputs[0])] = emit_scalar_op(b, math_lib, n.op, args)
        for k, v in enumerate(outs):
            ptr = b.gep(fn.args[out_arg[k]], [out_offset], inbounds=True, source_etype=F32)
            b.store(env[id(v)], ptr, align=4)

    def level(g: int, offsets: list[ir.Value], out_offset: ir.Value) -> None:
        values = dict(loaded)
        if g == depth - 1:  # hoist what the innermost loop does not move over
            for j in range(len(inputs)):
                if j not in values and nest.strides[j][g] == 0:
                    values[j] = load(j, offsets[j])
        with _For(b, counts[g], f"i{g}", inner_md if g == depth - 1 else None) as i:
            inner = [off if nest.strides[j][g] == 0 else
                     b.add(off, b.mul(i, ir.Constant(I64, nest.strides[j][g]), flags=["nsw"]), flags=["nsw"])
                     for j, off in enumerate(offsets)]
            ostride = math.prod(s for s in nest.sizes[g + 1:])
            oo = b.add(out_offset, b.mul(i, ir.Constant(I64, ostride), flags=["nsw"]) if ostride != 1 else i,
                       flags=["nsw"])
            if g == depth - 1:
                body(inner, oo, values)
            else:
                level(g + 1, inner, oo)

    # long bodies (the math functions) gain from two vector iterations in flight
    heavy = any(type(n.op) in _HEAVY for n in nodes)
    inner_md = loop_metadata(module, 2) if heavy else None
    level(0, [zero] * len(inputs), zero)
    b.ret_void()
    return ElementwiseKernel(name=name, inputs=tuple(inputs), outputs=tuple(outs), shape=shape, loops=nest,
                             in_place=tuple(sorted(in_place.items())))


def new_module(name: str = "kiln", target: Target | None = None) -> ir.Module:
    """An empty llvmlite module with the target's triple and data layout."""
    target = target or host_target()
    module = ir.Module(name=name)
    module.triple = target.triple
    module.data_layout = target.data_layout
    return module


def elementwise_module(nodes: Sequence[Node], name: str = "kernel", target: Target | None = None,
                       **options) -> tuple[str, ElementwiseKernel]:
    """A module holding one elementwise kernel: (LLVM IR text, kernel description)."""
    module = new_module(name, target)
    kernel = emit_elementwise(module, nodes, name, **options)
    return str(module), kernel


__all__ = ["ElementwiseKernel", "LoopNest", "SCALAR_OPS", "elementwise_module", "emit_elementwise",
           "emit_scalar_op", "fmax", "fmin", "group_outputs", "loop_metadata", "new_module", "plan_loops"]
