"""Elementwise and broadcast ops (float32) as one loop nest, and view ops (Reshape & co) as aliases."""
from __future__ import annotations

from ...ir.ops import elementwise as ew
from ...ir.ops import shape as sh
from ..llvm.elementwise import SCALAR_OPS, _is_inlined, emit_elementwise, plan_loops
from ..llvm.toolchain import CodegenError
from .base import F32, LLVM_TYPES, KernelBuilder, KernelGroup, Lowering, c64, dtype_reason


class Elementwise(Lowering):
    """Any chain of float32 elementwise/broadcast ops (``SCALAR_OPS``): one loop nest, operands
    broadcast with compiled-in strides, scalar constants inlined."""

    ops = tuple(c for c in SCALAR_OPS if c is not sh.Identity)

    def check(self, group: KernelGroup) -> str | None:
        for n in group.nodes:
            if type(n.op) not in SCALAR_OPS:
                return f"{n.op.name} is not an elementwise float32 op"
            why = dtype_reason(list(n.inputs) + list(n.outputs))
            if why:
                return why
            if isinstance(n.op, ew.Pow):
                e = n.inputs[1]
                if e.const is None or e.const.size != 1 or float(e.const.reshape(())) not in (1, 2, 3, 0.5, -1):
                    return "Pow needs a constant scalar exponent of 1, 2, 3, 0.5 or -1"
            if isinstance(n.op, ew.Clip):
                for v in n.inputs[1:]:
                    if v is not None and not _is_inlined(v, True):
                        return "Clip bounds must be constants"
        try:
            shape = group.outputs[0].shape
            if any(tuple(o.shape) != tuple(shape) for o in group.outputs):
                return "outputs of different shapes"
            plan_loops(shape, [v.shape for v in group.inputs if not _is_inlined(v, True)])
        except CodegenError as e:
            return str(e)
        return None

    #: elements per parallel task at least (smaller kernels run on the calling thread)
    PARALLEL_MIN = 1 << 15

    def in_place(self, group: KernelGroup) -> list[tuple[int, int]]:
        """Any output may overwrite an input of its shape and type (each point reads all its inputs
        before it writes), in order of preference; the program builder picks at most one input per
        output and one output per input."""
        return [(k, j) for k, o in enumerate(group.outputs) for j, v in enumerate(group.inputs)
                if v.const is None and tuple(v.shape) == tuple(o.shape) and v.type.dtype is o.type.dtype]

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        # emit_elementwise numbers the inputs it takes pointers for (group inputs less inlined scalars)
        ptr_inputs = [j for j, v in enumerate(group.inputs) if not _is_inlined(v, True)]
        in_place = {out: ptr_inputs.index(j) for out, j in k.in_place.items()}
        kern = emit_elementwise(k.module, group.nodes, f"{k.name}.loop", outputs=group.outputs,
                                math_lib=k.math, in_place=in_place)
        fn = k.module.globals[kern.name]
        fn.linkage = "internal"
        n = group.outputs[0].type.numel
        inner = kern.loops.inner
        outer = n // inner if inner else 0
        # the outermost loop is cut among the threads: operand j advances strides[j][0] per step
        with k.parallel_for(outer, min_per_task=-(-self.PARALLEL_MIN // max(inner, 1))) as (begin, end):
            b = k.b
            args = [b.gep(k.ptr(v), [b.mul(begin, c64(kern.loops.strides[j][0]))], inbounds=True, source_etype=F32)
                    for j, v in enumerate(kern.inputs)]
            args += [b.gep(k.ptr(kern.outputs[o]), [b.mul(begin, c64(inner))], inbounds=True, source_etype=F32)
                     for o in kern.pointer_outputs]
            b.call(fn, args + [b.mul(b.sub(end, begin), c64(inner))])


class View(Lowering):
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity: the result is the input's buffer (no code)."""

    ops = (sh.Reshape, sh.Flatten, sh.Squeeze, sh.Unsqueeze, sh.Identity)
    alias = True

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        x, y = n.inputs[0], n.outputs[0]
        why = dtype_reason([x, y], allowed=tuple(LLVM_TYPES))
        if why:
            return why
        if x.type.dtype is not y.type.dtype or x.type.numel != y.type.numel:
            return "not a view"
        return None

