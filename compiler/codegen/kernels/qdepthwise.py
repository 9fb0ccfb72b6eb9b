"""A depthwise convolution computed in float32 between 8-bit tensors (kernel kind ``qdepthwise``).

Static int8 quantization (``passes/quantize.py``, ``int8_depthwise``) leaves a depthwise
convolution's products in float32 (nine multiply-adds per output pixel: no int8 kernel tried paid
for itself, docs/quantization.md) but has it read its input as uint8, ``DequantizeLinear(
QuantizeLinear(x))``, so the layer before writes one byte per element instead of four. The fuse
pass groups the DequantizeLinear, the conv and the elementwise chain after it up to the next
layer's QuantizeLinear (``_dequantized_depthwise`` in ``passes/fuse.py``), and this lowering runs
the float depthwise kernel (``Conv._depthwise``) with two row functions printed from the loop form
(``RowChain``, the ops' scalar semantics as everywhere else): the DequantizeLinear on each input
plane as it is read into scratch, and the chain on each output plane computed in scratch. Neither
float tensor gets a buffer; the kernel reads and writes bytes.

Where the float kernel loads the input as vectors itself (a width stride 2's rows split into both
column phases, ``_pad_plane_pairs``; small planes in registers, ``dw_regs.py``), the
DequantizeLinear runs on those vectors (``RowChain.vector``: the same scalar semantics printed on
vectors), bit for bit what the row function gives. Measured on Zen 4, one thread, 3x3 + ReLU6 to
uint8, against the row function: 96 planes of 112x112/2 232 -> 200 us (the row function did each
phase's 56 columns as 48 in vectors of 8 and 8 one by one), 576 of 14x14/2 36 -> 30.5 (the plane
no longer dequantized into scratch first), 384 of 14x14 39.6 -> 36.9.
"""
from __future__ import annotations

from llvmlite import ir

from ...ir.graph import Node, Value
from ...ir.ops import conv as cv
from ...ir.ops import quant as qn
from ...ir.types import DType
from ..gemm.int8 import INT8_CHUNKS_PER_THREAD
from .base import KernelBuilder, KernelGroup, Lowering, strides_of
from .conv import Conv, _geometry
from .elementwise import Elementwise, inlined
from .tile_epilogue import RowChain


def _chain(nodes: list[Node], src: Value) -> RowChain:
    """The chain ``nodes`` on a row of ``src`` (its other operands are compiled-in constants:
    ``DequantizedDepthwise.check``)."""
    row = RowChain(lambda st: any(st))
    shape = tuple(int(d) for d in src.shape)
    row.operand(src, tuple(strides_of(shape)))
    row.add_chain(nodes, shape)
    return row


def _row_function(k: KernelBuilder, name: str, nodes: list[Node], src: Value, dst: Value,
                  stride: int = 1) -> ir.Function:
    """``name(src elements, dst elements, n)``: the chain ``nodes`` from every ``stride``-th element
    of ``src`` to ``dst`` on a row of ``n`` elements."""
    fn, _, operands = _chain(nodes, src).emit(k, name, [dst], stride=stride)
    assert [v for v, _ in operands] == [src], "a row function reads its row only"
    return fn


class DequantizedDepthwise(Lowering):
    ops = (qn.DequantizeLinear, cv.Conv) + Elementwise.ops

    @staticmethod
    def _parts(group: KernelGroup):
        """(the DequantizeLinear, the conv, the chain after it), or why the group is not one."""
        nodes = list(group.nodes)
        if len(nodes) < 2 or not isinstance(nodes[0].op, qn.DequantizeLinear) or not isinstance(nodes[1].op, cv.Conv):
            return "a qdepthwise kernel is a DequantizeLinear, the depthwise Conv reading it and a chain after it"
        d, conv, chain = nodes[0], nodes[1], nodes[2:]
        if conv.inputs[0] is not d.outputs[0]:
            return "the Conv does not read the DequantizeLinear as its input"
        prev = conv.outputs[0]
        for n in chain:
            if len(n.outputs) != 1 or not any(v is prev for v in n.inputs):
                return f"{n.op.name} does not read the result before it"
            prev = n.outputs[0]
        return d, conv, chain

    def check(self, group: KernelGroup) -> str | None:
        parts = self._parts(group)
        if isinstance(parts, str):
            return parts
        d, conv, chain = parts
        why = Conv().check(KernelGroup.of([conv]))
        if why:
            return why
        x = conv.inputs[0]
        if len(x.shape) != 4 or int(conv.op.group) != int(x.shape[1]) or int(conv.op.group) == 1:
            return "the Conv is not a 2-D depthwise convolution"
        if d.inputs[0].dtype not in (DType.u8, DType.i8):
            return f"the DequantizeLinear reads {d.inputs[0].dtype.name}, not 8-bit integers"
        rows = [d.inputs[0]] + [conv.outputs[0]] + [n.outputs[0] for n in chain[:-1]]  # what each one reads
        for n, row in zip([d] + chain, rows):
            if any(v is not None and v is not row and not inlined(v) for v in n.inputs):
                return f"{n.op.name} reads a tensor besides its row (only one-element constants are compiled in)"
        tail = group.nodes[-1].outputs[0]
        if list(group.outputs) != [tail]:
            return "a value before the chain's last is needed outside the kernel"
        if any(tuple(n.outputs[0].shape) != tuple(conv.outputs[0].shape) for n in chain):
            return "the chain changes the shape of the convolution's result"
        return None

    def emit(self, k: KernelBuilder, group: KernelGroup) -> None:
        k.chunks_per_thread = INT8_CHUNKS_PER_THREAD
        d, conv, chain = self._parts(group)
        xq, w = d.inputs[0], conv.inputs[1]
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        y = group.nodes[-1].outputs[0]
        n, c, h, wd, m, kh, kw, oh, ow, (sh, sw), (dh, dw), (pt, pl) = _geometry(conv)
        loads: dict[int, ir.Function] = {}

        def load(stride: int) -> ir.Function:
            if stride not in loads:
                loads[stride] = _row_function(k, f"{k.name}.dq{stride}", [d], xq, conv.inputs[0], stride)
            return loads[stride]

        dq = _chain([d], xq)  # the DequantizeLinear on explicit vectors, where it has that form
        convert = None if dq.vector_reason([conv.inputs[0]]) else \
            (lambda b, v: dq.vector(b, k.math, [v], [conv.inputs[0]])[0])
        store = _row_function(k, f"{k.name}.out", chain, conv.outputs[0], y) if chain else None
        Conv()._depthwise(k, xq, w, bias, y, n, c, h, wd, m // c, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
                          load=load, store=store, convert=convert)
        k.note("depthwise in float32 between 8-bit tensors: each input plane dequantized into scratch"
               + (" (on explicit vectors where the kernel loads them)" if convert else "") + ", "
               + ("the chain computed on each output plane" if chain else "the float result written"))


__all__ = ["DequantizedDepthwise"]
