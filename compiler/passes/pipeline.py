"""The default pipeline: one readable recipe per optimization level.

    -O0  infer-shapes
    -O1  + fold-constants · canonicalize · eliminate-common-subexpressions · eliminate-dead
    -O2  + fold-batchnorm · fold-scale-bias, then clean up again · sink-reshapes · fuse · schedule-memory  (the default)
    -O3  as -O2 (later issues add aggressive rewrites here)

``fuse`` groups nodes into ``kiln.Kernel`` nodes (one native kernel each); later issues add
quantization and device splitting.
"""
from __future__ import annotations

from .fuse import FuseKernels
from .manager import Pass
from .options import CompileOptions
from .schedule import ScheduleForMemory
from .sink_reshapes import SinkReshapes
from .simplify.canonicalize import Canonicalize
from .simplify.cse import EliminateCommonSubexpressions
from .simplify.dce import EliminateDead
from .simplify.fold_batchnorm import FoldBatchNorm, FoldScaleBias
from .simplify.fold_constants import FoldConstants
from .simplify.infer_shapes import InferShapes


def pipeline(opts: CompileOptions) -> list[Pass]:
    passes: list[Pass] = [InferShapes(opts.input_shapes)]
    if opts.opt_level >= 1:
        passes += [FoldConstants(opts.fold_limit_bytes), Canonicalize(max_rounds=opts.max_rewrite_rounds),
                   EliminateCommonSubexpressions(), EliminateDead()]
    if opts.opt_level >= 2:
        passes += [FoldBatchNorm(), FoldScaleBias(), FoldConstants(opts.fold_limit_bytes),
                   Canonicalize(max_rounds=opts.max_rewrite_rounds), EliminateDead(),
                   SinkReshapes(opts.max_rewrite_rounds),  # Reshapes after a GEMM move below its elementwise users
                   FuseKernels(max_ops=opts.max_fused_ops),  # kiln.Kernel nodes: one native kernel each
                   ScheduleForMemory()]  # last: a topological order with a lower peak of live bytes
    return passes


def all_pass_names() -> list[str]:
    """Every pass name any level uses (for --disable-pass and --print-after validation)."""
    names: list[str] = []
    for p in pipeline(CompileOptions(opt_level=3)):
        if p.name not in names:
            names.append(p.name)
    return names
