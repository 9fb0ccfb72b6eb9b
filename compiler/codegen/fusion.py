"""What the CPU backend can run as one kernel, as the fusion passes ask it (``CPU_FUSION``).

The passes never import a backend: the backend hands them a ``FusionCapabilities``
(``compiler/passes/fuse.py``), and the driver and ``kiln dump`` pass this one to ``pipeline``:

* ``fusable``: the float32 elementwise ops of ``SCALAR_OPS`` (those whose loop-form code
  vectorizes: arithmetic and Kiln's own math functions), static shapes, one result; a Cast of
  int32 to float32 (an int8 layer's sums, rescaled by the chain after it); and QuantizeLinear /
  DequantizeLinear by one scale (the fuse pass keeps them out of GEMM epilogues and blocks);
* ``check``: the ``check`` of the lowering that runs each block kind (``BLOCK_LOWERINGS``), so a block
  is formed exactly where that lowering accepts it, and its reason is kept where it does not.
"""
from __future__ import annotations

from ..ir.graph import Node
from ..ir.ops.shape import Identity
from ..ir.types import DType, TensorType
from ..passes.fuse import FusionCapabilities
from .kernels import ALL, KernelGroup
from .kernels.attention import Attention
from .kernels.base import Lowering
from .kernels.epilogue import Epilogue
from .kernels.requantize import Requantize
from .kernels.row_reduce import RowReduce
from .kernels.qdepthwise import DequantizedDepthwise
from .kernels.shuffle import ShuffledDepthwise
from ..ir.ops import elementwise as ew
from ..ir.ops import quant as qn
from .loops.scalar import per_tensor_quantization
from .loops.scalar import reason as scalar_reason

#: the elementwise ops fused into kernels (chains, GEMM epilogues and prologues, row reductions); their
#: semantics: ``loops/scalar.py``
SCALAR_OPS = frozenset({
    Identity, ew.Add, ew.Sub, ew.Mul, ew.Div, ew.Sum, ew.Mean, ew.Max, ew.Min, ew.Neg, ew.Abs, ew.Sqrt, ew.Floor,
    ew.Ceil, ew.Round, ew.Reciprocal, ew.Sign, ew.Exp, ew.Log, ew.Tanh, ew.Erf, ew.Sigmoid, ew.Softplus, ew.Mish,
    ew.Softsign, ew.Relu, ew.LeakyRelu, ew.PRelu, ew.Elu, ew.Celu, ew.Selu, ew.ThresholdedRelu, ew.HardSigmoid,
    ew.HardSwish, ew.Shrink, ew.Swish, ew.Gelu, ew.Clip, ew.Pow})

#: block kind of the fuse pass -> the lowering class that runs such a block as one kernel (a prologue
#: is run by the epilogue lowering: the chain is computed as the convolution's GEMM packs its input)
BLOCK_LOWERINGS: dict[str, type] = {"attention": Attention, "reduction": RowReduce,
                                    "shuffle": ShuffledDepthwise, "prologue": Epilogue, "requantize": Requantize,
                                    "qdepthwise": DequantizedDepthwise}

_LOWERING: dict[str, Lowering] = {kind: next(low for low in ALL if type(low) is cls)
                                  for kind, cls in BLOCK_LOWERINGS.items()}


def fusable(node: Node) -> bool:
    """Elementwise float32 ops the CPU backend computes in a loop (its scalar op table), the Cast
    of int32 sums to float32 that starts an int8 layer's rescale (so the rescale is one pass), and
    QuantizeLinear/DequantizeLinear by one scale between float32 and 8/16-bit integers (an int8
    layer's rescale ends in the next one's quantization; a QDQ model's residual Add reads two
    dequantized values)."""
    if isinstance(node.op, (qn.QuantizeLinear, qn.DequantizeLinear)):
        vs = [v for v in list(node.inputs) + list(node.outputs) if v is not None]
        return (all(isinstance(v.type, TensorType) and v.type.is_static for v in vs)
                and per_tensor_quantization(node)
                and scalar_reason(node.op, [None if v is None else v.type.dtype for v in node.inputs],
                                  node.outputs[0].type.dtype) is None)
    if isinstance(node.op, ew.Cast):
        x, y = node.inputs[0], node.outputs[0]
        return (isinstance(x.type, TensorType) and x.type.dtype is DType.i32 and x.type.is_static
                and y.type.dtype is DType.f32)
    return type(node.op) in SCALAR_OPS and not isinstance(node.op, Identity) and len(node.outputs) == 1 and all(
        v is None or (isinstance(v.type, TensorType) and v.type.dtype is DType.f32 and v.type.is_static)
        for v in list(node.inputs) + list(node.outputs))


def check(kind: str, nodes: list[Node]) -> str | None:
    """Why the CPU backend cannot run ``nodes`` as one kernel of ``kind`` (attention, reduction,
    shuffle, prologue, requantize, qdepthwise); None: it can."""
    return _LOWERING[kind].check(KernelGroup.of(nodes))


#: the CPU backend's capabilities: every block rule on
CPU_FUSION = FusionCapabilities(fusable=fusable, check=check, blocks=frozenset(BLOCK_LOWERINGS))

__all__ = ["BLOCK_LOWERINGS", "CPU_FUSION", "SCALAR_OPS", "check", "fusable"]
