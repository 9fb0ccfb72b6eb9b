"""MatMul of float64 and integer operands on the loop form (float32 goes to the GEMM core, float16
and bfloat16 are float32 products between Casts: ``narrow-matmul-to-f32``).

``y[b.., i, j] = sum_k a[b.., i, k] * b[b.., k, j]`` with NumPy's rules: a 1-D operand promoted (a row
for A, a column for B), batch dimensions broadcast through zero strides. The loops run i, k, j: row i
of y is zeroed, then each ``a[i, k]`` times row k of B is added to it, a vector loop along j (rows of
B and y contiguous). Integers wrap, as NumPy's do; float64 sums in k's order (a BLAS dgemm sums in
blocks: the last bits may differ). The first batch loop, else the row loop, is split among the
threads.
"""
from __future__ import annotations

import math
from contextlib import ExitStack

import numpy as np

from ...ir.ops import linalg as la
from ...ir.types import DType
from ..loops import Kernel, KernelForm
from ..loops.expr import Const, compute_type
from .base import FormLowering, KernelGroup, dtype_reason, par_grain
from .data import broadcast_strides
from .linalg import _promoted

#: the element types this lowering takes
TYPES = (DType.f64, DType.i32, DType.i64, DType.u32, DType.u64)


class MatMulLoops(FormLowering):
    """MatMul (float64, 32/64-bit integers; static shapes) as loops."""

    ops = (la.MatMul,)

    def check(self, group: KernelGroup) -> str | None:
        n = group.node
        a, b = n.inputs
        why = dtype_reason([a, b, n.outputs[0]], allowed=TYPES)
        if why:
            return why
        if len(a.shape) == 0 or len(b.shape) == 0:
            return "operands must have rank >= 1"
        return self.form_reason(group)

    def form(self, group: KernelGroup, name: str, in_place: dict | None = None) -> Kernel:
        n = group.node
        a, b = n.inputs
        y = n.outputs[0]
        sa, sb = _promoted(a.shape, b.shape)
        m, kk, nn = sa[-2], sa[-1], sb[-1]
        batch = [int(d) for d in np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))]
        ct = compute_type(y.type.dtype)
        kf = KernelForm(name)
        ab = kf.buffer("a", a.type.dtype, (*batch, m, kk), strides=broadcast_strides(sa, (*batch, m, kk)), value=a)
        bb = kf.buffer("b", b.type.dtype, (*batch, kk, nn), strides=broadcast_strides(sb, (*batch, kk, nn)), value=b)
        yb = kf.buffer("y", y.type.dtype, (*batch, m, nn), "inout", value=y)
        kf.note(f"MatMul {'x'.join(map(str, batch)) + ' of ' if batch else ''}{m}x{kk} @ {kk}x{nn} as loops (i, k, j)")
        with ExitStack() as st:
            at = []
            for d, ext in enumerate(batch):
                work = math.prod(batch[d + 1:]) * m * kk * nn
                at.append(st.enter_context(kf.loop(ext, "parallel" if d == 0 else "serial",
                                                   grain=par_grain(work) if d == 0 else 1, name="bt")))
            i = st.enter_context(kf.loop(m, "serial" if batch else "parallel", grain=par_grain(kk * nn), name="i"))
            with kf.loop(nn, "vector", name="j") as j:
                kf.store(yb, (*at, i, j), Const(0, ct))
            with kf.loop(kk, name="k") as k:
                aik = kf.let(ab[(*at, i, k)], "aik")
                with kf.loop(nn, "vector", name="j") as j:
                    kf.store(yb, (*at, i, j), yb[(*at, i, j)] + aik * bb[(*at, k, j)])
        return kf.finish()


LOWERINGS = (MatMulLoops(),)

__all__ = ["LOWERINGS", "MatMulLoops", "TYPES"]
