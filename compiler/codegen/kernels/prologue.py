"""Elementwise prologues of a 1x1 convolution: the chain before the conv computed while the GEMM
packs its B operand (``kiln_sgemm_cb``), so the chain's result never reaches memory.

DenseNet applies BatchNorm (a scale and shift per channel) and ReLU to each concat before the 1x1
conv of the next layer. Alone, that chain is a loop writing a tensor as large as the concat, which
the conv's GEMM then reads and packs. Fused (``kiln.Kernel`` of kind ``prologue``, ``fuse.py``),
the GEMM asks for each block of B (``kc`` channels by ``nc`` pixels) as it multiplies it, and the
packer computes the chain on the block's rows straight into the GEMM's panels (``NR`` columns each;
the columns past the last pixel get zeros).

The chain's code is the elementwise code generator's row function (``RowChain``), called once per
row of a panel with each operand's pointer there: the conv input's channel ``c`` is row ``c``,
its pixels the columns. Operands must be laid out like the input over the pixels or be constant
over them (a per-channel scale, a scalar). A block of B is packed once per task of the GEMM that
needs it: when the GEMM splits the output channels among threads, each computes the chain of the
blocks it packs (cheap ops, bounded by the thread count); the plain conv packs those blocks too.
"""
from __future__ import annotations

from typing import Sequence

from llvmlite import ir

from ...ir.graph import Node, Value
from ..llvm.elementwise import _For
from .base import F32, I64, PTR, VOID, KernelBuilder, c64
from .tile_epilogue import RowChain, TileEpilogue


def prologue_reason(nodes: Sequence[Node], x: Value) -> str | None:
    """Why the chain ``nodes`` (computing ``x``, a 1x1 conv's input ``[1, C, H, W]``) cannot be
    computed in the conv's B packing (None if it can)."""
    if x.producer is not nodes[-1]:
        return "the convolution does not read the chain's last result"
    if len(x.shape) != 4 or int(x.shape[0]) != 1:
        return "the convolution's input is not one 2-D image"
    if any(tuple(n.outputs[0].shape) != tuple(x.shape) for n in nodes):
        return "the chain's results do not all have the convolution's input shape"
    return TileEpilogue.reason(x, nodes, 1)


class ProloguePacker:
    """The GEMM's B packer for a 1x1 conv whose input ``x`` is computed by ``nodes`` (see the module
    docstring). ``call_args()`` (in the kernel, before the GEMM call) gives ``pack_b`` for
    ``call_sgemm``."""

    def __init__(self, k: KernelBuilder, nodes: Sequence[Node], x: Value, nr: int):
        self.k = k
        shape = tuple(int(d) for d in x.shape)
        row = RowChain(lambda st: any(st[2:]))
        row.add_chain(nodes, shape)
        row_fn, _, self.operands = row.emit(k, f"{k.name}.prow", [x])
        self.fn = self._emit_callback(row_fn, shape[2] * shape[3], nr)

    def _emit_callback(self, row_fn: ir.Function, pixels: int, nr: int) -> ir.Function:
        k = self.k
        fn = ir.Function(k.module, ir.FunctionType(VOID, [PTR, I64, I64, I64, I64, PTR]), f"{k.name}.pb")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        ctx, p0, kc, j0, nc, dst = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        bases = [b.load(b.gep(ctx, [c64(i)], source_etype=PTR), typ=PTR) for i in range(len(self.operands))]
        npan = b.udiv(b.add(nc, c64(nr - 1)), c64(nr))
        with _For(b, kc, "prow") as r:
            c = b.add(p0, r)
            with _For(b, npan, "ppan") as jj:
                j = b.add(j0, b.mul(jj, c64(nr)))
                ptrs = [b.gep(base, [b.add(b.mul(c, c64(st[1])), j if any(st[2:]) else c64(0))], inbounds=True,
                              source_etype=F32) for base, (_, st) in zip(bases, self.operands)]
                out = b.gep(dst, [b.mul(b.add(b.mul(jj, kc), r), c64(nr))], inbounds=True, source_etype=F32)
                m = b.sub(c64(pixels), j)
                with b.if_else(b.icmp_signed(">=", m, c64(nr))) as (full, edge):
                    with full:  # a whole panel row: the row function with a constant width
                        b.call(row_fn, ptrs + [out, c64(nr)])
                    with edge:  # the last panel: its pixels, then zeros
                        b.call(row_fn, ptrs + [out, m])
                        with _For(b, b.sub(c64(nr), m), "pzero") as t:
                            b.store(ir.Constant(F32, 0.0), b.gep(out, [b.add(m, t)], inbounds=True, source_etype=F32))
        b.ret_void()
        return fn

    def call_args(self) -> tuple[ir.Value, ir.Value]:
        """``(packer, context)`` for ``call_sgemm(..., pack_b=...)``: the context holds the operands'
        base pointers, filled here (in the kernel function being built)."""
        k = self.k
        table = k.f.alloca(PTR, max(1, len(self.operands)), name="pbctx")
        for i, (v, _) in enumerate(self.operands):
            k.b.store(k.ptr(v), k.b.gep(table, [c64(i)], source_etype=PTR))
        return self.fn, table


__all__ = ["ProloguePacker", "prologue_reason"]
