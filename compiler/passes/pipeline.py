"""The default pipeline: one readable recipe per optimization level.

    -O0  infer-shapes
    -O1  + fold-qdq · fold-constants · unroll-loops · canonicalize · eliminate-common-subexpressions · eliminate-dead
    -O2  + fold-batchnorm · fold-scale-bias, then clean up again · drop-saturated-clamps ·
         fold-quantize-scale · sink-reshapes · fuse · schedule-memory  (the default)
    -O3  as -O2 (later issues add aggressive rewrites here)
    any level with devices: + split-products (before sink-reshapes) and split-devices (last)

``fold-qdq`` runs first: a QDQ model's DequantizeLinear -> Conv/MatMul/Gemm -> QuantizeLinear
become integer products while the weights are still int8 constants (constant folding would make
them float).

With ``opts.quantize`` (int8), ``quantize`` runs after the simplifications of the level (MatMul + Add
are a Gemm by then) and before ``sink-reshapes``/``fuse``; static int8 measures activation ranges
through ``calibrate``, which the driver hands in (it compiles and runs the float model).

``fuse`` groups nodes into ``kiln.Kernel`` nodes (one native kernel each). With ``devices`` (a
multi-device pipeline compile, ``compiler/multidevice.py``), ``split-products`` cuts products whose
weights are over half the largest device's memory into several, and ``split-devices`` runs last: it
places the kernels on the devices as stages and inserts the ``kiln.Transfer`` nodes between them.

What can run as one kernel is the backend's to say: ``fusion`` is the backend's
``FusionCapabilities`` (``compiler.codegen.fusion.CPU_FUSION``, which the driver passes); without
it ``sink-reshapes`` and ``fuse`` run but change nothing.
"""
from __future__ import annotations

from typing import Sequence

from .fold_qdq import FoldQDQ
from .fuse import NO_FUSION, FuseKernels, FusionCapabilities
from .manager import Pass
from .options import CompileOptions
from .quantize import Calibrate, Quantize
from .quantize_scale import FoldQuantizeScale
from .saturated_clamps import DropSaturatedClamps
from .schedule import ScheduleForMemory
from .sink_reshapes import SinkReshapes
from .split_devices import DeviceSpec, SplitDevices
from .split_products import SplitProducts
from .simplify.canonicalize import Canonicalize
from .simplify.cse import EliminateCommonSubexpressions
from .simplify.dce import EliminateDead
from .simplify.fold_batchnorm import FoldBatchNorm, FoldScaleBias
from .simplify.fold_constants import FoldConstants
from .simplify.infer_shapes import InferShapes
from .simplify.unroll import UnrollLoops


def pipeline(opts: CompileOptions, fusion: FusionCapabilities = NO_FUSION,
             calibrate: Calibrate | None = None, devices: Sequence[DeviceSpec] = ()) -> list[Pass]:
    """The passes of ``opts.opt_level``, fusing what ``fusion`` (the backend) can run as one kernel;
    ``calibrate``: the driver's range measurement, for static int8 (``opts.quantize``); ``devices``:
    the devices to split the model over as pipeline stages (two or more)."""
    passes: list[Pass] = [InferShapes(opts.input_shapes, opts.input_values)]
    if opts.opt_level >= 1:
        passes += [FoldQDQ(), FoldConstants(opts.fold_limit_bytes), UnrollLoops(),  # short Loops/Scans: their bodies
                   Canonicalize(max_rounds=opts.max_rewrite_rounds), EliminateCommonSubexpressions(), EliminateDead()]
    if opts.opt_level >= 2:
        passes += [FoldBatchNorm(), FoldScaleBias(), FoldConstants(opts.fold_limit_bytes),
                   Canonicalize(max_rounds=opts.max_rewrite_rounds), EliminateDead()]
    if opts.quantize is not None:
        passes.append(Quantize(opts.quantize, calibrate))
    if devices:  # a product too large for a device becomes several, before fusion
        passes.append(SplitProducts(max(d.memory_bytes for d in devices) // 2))
    if opts.opt_level >= 2:
        passes += [DropSaturatedClamps(),  # a Relu/Clip its readers' QuantizeLinear already clips
                   FoldQuantizeScale(),  # a QuantizeLinear's division into the constants before it
                   SinkReshapes(opts.max_rewrite_rounds, fusion),  # Reshapes after a GEMM go below its users
                   FuseKernels(opts.max_fused_ops, fusion),  # kiln.Kernel nodes: one native kernel each
                   ScheduleForMemory()]  # a topological order with a lower peak of live bytes
    if devices:
        passes.append(SplitDevices(devices))  # last: stages on the devices, Transfers between them
    return passes


def all_pass_names() -> list[str]:
    """Every pass name any level uses (for --disable-pass and --print-after validation)."""
    names: list[str] = []
    two = [DeviceSpec(f"cpu:{i}", 1, 1.0, 1.0) for i in range(2)]
    for p in pipeline(CompileOptions(opt_level=3, quantize="int8-dynamic"), devices=two):
        if p.name not in names:
            names.append(p.name)
    return names
