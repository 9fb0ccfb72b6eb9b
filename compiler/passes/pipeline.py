"""The default pipeline: one readable recipe per optimization level.

    -O0  infer-shapes
    -O1  + fold-constants · canonicalize · eliminate-common-subexpressions · eliminate-dead
    -O2  + fold-batchnorm · fold-scale-bias, then clean up again · sink-reshapes · fuse · schedule-memory  (the default)
    -O3  as -O2 (later issues add aggressive rewrites here)

With ``opts.quantize`` (int8), ``quantize`` runs after the simplifications of the level (MatMul + Add
are a Gemm by then) and before ``sink-reshapes``/``fuse``; static int8 measures activation ranges
through ``calibrate``, which the driver hands in (it compiles and runs the float model).

``fuse`` groups nodes into ``kiln.Kernel`` nodes (one native kernel each); later issues add
device splitting. What can run as one kernel is the backend's to say: ``fusion``
is the backend's ``FusionCapabilities`` (``compiler.codegen.fusion.CPU_FUSION``, which the driver
passes); without it ``sink-reshapes`` and ``fuse`` run but change nothing.
"""
from __future__ import annotations

from .fuse import NO_FUSION, FuseKernels, FusionCapabilities
from .manager import Pass
from .options import CompileOptions
from .quantize import Calibrate, Quantize
from .schedule import ScheduleForMemory
from .sink_reshapes import SinkReshapes
from .simplify.canonicalize import Canonicalize
from .simplify.cse import EliminateCommonSubexpressions
from .simplify.dce import EliminateDead
from .simplify.fold_batchnorm import FoldBatchNorm, FoldScaleBias
from .simplify.fold_constants import FoldConstants
from .simplify.infer_shapes import InferShapes


def pipeline(opts: CompileOptions, fusion: FusionCapabilities = NO_FUSION,
             calibrate: Calibrate | None = None) -> list[Pass]:
    """The passes of ``opts.opt_level``, fusing what ``fusion`` (the backend) can run as one kernel;
    ``calibrate``: the driver's range measurement, for static int8 (``opts.quantize``)."""
    passes: list[Pass] = [InferShapes(opts.input_shapes, opts.input_values)]
    if opts.opt_level >= 1:
        passes += [FoldConstants(opts.fold_limit_bytes), Canonicalize(max_rounds=opts.max_rewrite_rounds),
                   EliminateCommonSubexpressions(), EliminateDead()]
    if opts.opt_level >= 2:
        passes += [FoldBatchNorm(), FoldScaleBias(), FoldConstants(opts.fold_limit_bytes),
                   Canonicalize(max_rounds=opts.max_rewrite_rounds), EliminateDead()]
    if opts.quantize is not None:
        passes.append(Quantize(opts.quantize, calibrate))
    if opts.opt_level >= 2:
        passes += [SinkReshapes(opts.max_rewrite_rounds, fusion),  # Reshapes after a GEMM go below its users
                   FuseKernels(opts.max_fused_ops, fusion),  # kiln.Kernel nodes: one native kernel each
                   ScheduleForMemory()]  # last: a topological order with a lower peak of live bytes
    return passes


def all_pass_names() -> list[str]:
    """Every pass name any level uses (for --disable-pass and --print-after validation)."""
    names: list[str] = []
    for p in pipeline(CompileOptions(opt_level=3, quantize="int8-dynamic")):
        if p.name not in names:
            names.append(p.name)
    return names
