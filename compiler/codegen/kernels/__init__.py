"""Lowerings: how each op becomes native code (see ``base.py`` for the interface).

``LOWERINGS`` is the explicit table, op class -> lowering; ``lowering_for(group)`` picks the
lowering of a group and says why there is none.
"""
from __future__ import annotations

from .attention import Attention
from .base import KernelBuilder, KernelGroup, Lowering, Services
from .data import LOWERINGS as DATA_LOWERINGS
from .conv import Conv
from .elementwise import Elementwise, View
from .empty import Empty
from .indexing import LOWERINGS as INDEXING_LOWERINGS
from .epilogue import Epilogue
from .linalg import Gemm, MatMul
from .matmul_loops import LOWERINGS as MATMUL_LOOPS_LOWERINGS
from .onehot import LOWERINGS as ONEHOT_LOWERINGS
from .norm import GroupNorm, InstanceNorm, LayerNorm, Lrn, RMSNorm, Softmax
from .pool import GlobalPool, Pool
from .qconv import LOWERINGS as QCONV_LOWERINGS
from .qmatmul import LOWERINGS as QMATMUL_LOWERINGS
from .quant import LOWERINGS as QUANT_LOWERINGS
from .resize import LOWERINGS as RESIZE_LOWERINGS
from .rotary import LOWERINGS as ROTARY_LOWERINGS
from .topk import LOWERINGS as TOPK_LOWERINGS
from .gridsample import LOWERINGS as GRIDSAMPLE_LOWERINGS
from .lppool import LOWERINGS as LPPOOL_LOWERINGS
from .conv_transpose import ConvTranspose
from .reduction import ArgReduce, Hardmax, LpNormalization, Reduce
from .row_reduce import RowReduce
from .scan import LOWERINGS as SCAN_LOWERINGS
from .recurrent import LOWERINGS as RECURRENT_LOWERINGS
from .requantize import Requantize
from .shuffle import ShuffledDepthwise
from .qdepthwise import DequantizedDepthwise

#: every lowering, in the order they are consulted
_GEMM, _MATMUL, _CONV, _CONVT = Gemm(), MatMul(), Conv(), ConvTranspose()
ALL: tuple[Lowering, ...] = (View(), Elementwise(), _GEMM, _MATMUL, *MATMUL_LOOPS_LOWERINGS, _CONV, Pool(), GlobalPool(), Reduce(), ArgReduce(),
                             Hardmax(), LpNormalization(), *ONEHOT_LOWERINGS,
                             Softmax(), LayerNorm(), RMSNorm(), InstanceNorm(), GroupNorm(), Lrn(), *DATA_LOWERINGS, *INDEXING_LOWERINGS, *SCAN_LOWERINGS,
                             *QUANT_LOWERINGS, *QMATMUL_LOWERINGS, *QCONV_LOWERINGS, *RESIZE_LOWERINGS, *ROTARY_LOWERINGS, *TOPK_LOWERINGS, *GRIDSAMPLE_LOWERINGS, *LPPOOL_LOWERINGS, _CONVT,
                             *RECURRENT_LOWERINGS,
                             Epilogue((_GEMM, _MATMUL, _CONV, _CONVT)), Requantize(), RowReduce(), Attention(),
                             ShuffledDepthwise(), DequantizedDepthwise())

#: the lowering of groups with nothing to compute
EMPTY = Empty()

#: op class -> the first lowering that takes it alone (the fused lowerings, last, also list the ops
#: they fuse)
LOWERINGS: dict[type, Lowering] = {op: low for low in reversed(ALL) for op in low.ops}


def lowering_for(group: KernelGroup) -> tuple[Lowering | None, str | None]:
    """(the lowering, None), or (None, the reason the group cannot run natively). A group whose
    results are all empty tensors needs no code, whatever its ops."""
    if EMPTY.check(group) is None:
        return EMPTY, None
    kinds = {type(n.op) for n in group.nodes}
    candidates = [low for low in ALL if kinds <= set(low.ops)]
    if not candidates:
        missing = sorted(k.__name__ for k in kinds if k not in LOWERINGS)
        return None, f"no native lowering for {', '.join(missing) or 'this combination of ops'}"
    reasons = []
    for low in candidates:
        reason = low.check(group)
        if reason is None:
            return low, None
        reasons.append(reason)
    return None, reasons[0]  # the first candidate's: the most specific lowering for the group


__all__ = ["ALL", "EMPTY", "LOWERINGS", "KernelBuilder", "KernelGroup", "Lowering", "Services", "lowering_for"]
