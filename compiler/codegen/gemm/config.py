"""Blocking parameters of Kiln's sgemm, chosen per target from the CPU's vector features.

The microkernel computes an ``MR x NR`` tile of C (``NR = NV * W``, W = float lanes of a vector
register) with ``MR * NV`` vector accumulators; ``KC`` (depth of a packed panel), ``MC`` (rows of A
packed at once) and ``NC`` (columns of B packed at once) size the packed panels for the caches:

* a ``KC x NR`` micro-panel of B stays in L1 while the kernel sweeps the ``MC x KC`` block of A,
* the ``MC x KC`` block of A stays in L2,
* the ``KC x NC`` block of B stays in L2/L3.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class GemmConfig:
    isa: str  # "avx512", "avx2", "sse" (baseline; the IR is generic, other targets use it too)
    W: int  # float lanes of one vector register
    MR: int  # rows of the register tile
    NV: int  # vectors per row of the register tile
    KC: int
    MC: int
    NC: int
    unroll: int = 4  # unrolling of the microkernel's k loop
    prefetch_b: int = 0  # k steps ahead to software-prefetch the packed B panel (0: none)
    #: floats ahead along B's rows to software-prefetch a B read in place (0: none), and the hint's
    #: locality (3: all the caches; 1, 2: the outer ones)
    prefetch_direct_b: int = 0
    prefetch_direct_locality: int = 3
    #: the last columns of an N remainder, at most this many (< W) past its whole vectors, run through a
    #: kernel with C's rows as the vector lanes (``emit_col_tail``), not a masked vector; 0: never
    col_tail: int = 0
    direct_b_max_m: int = 16  # M at or below which B (row-major) is read in place, not packed
    #: ... when B's rows are at most this many floats apart, or M <= 4 (rows far apart put each k step
    #: of an NR-wide stripe on a new page: packing won on AVX2)
    direct_b_max_ldb: int = 1024
    #: also read B in place up to this M when K >= 4 M (a narrowing product: a 1x1 projection)
    direct_b_narrow_max_m: int = 0
    #: M at or below which a row-major B (not pre-packed) is streamed row by row (``stream.py``)
    stream_max_m: int = 4
    #: ... and threads share such a product (below ``par_min_flops`` too) when B holds this many floats
    stream_par_min_floats: int = 1 << 17
    par_min_flops: float = 3e6  # below 2*M*N*K = this, run on the calling thread only
    tasks_per_thread: int = 2  # tasks per thread, the fewest the grid search tries (it tries up to 2x)
    max_threads: int = 64
    pool_spin: int = 300  # sched_yield polls of an idle pool thread before it sleeps on its condvar
    #: use the artifact's shared thread pool (``kiln_parallel_for``, codegen/native/parallel.c) instead
    #: of a pool of the GEMM's own: one set of threads for every kernel of a model
    external_pool: bool = False
    cpu: str = ""  # LLVM target cpu ("" = generic)
    features: str = ""  # LLVM target features, e.g. "+avx2,+fma"

    @property
    def NR(self) -> int:
        return self.NV * self.W

    def replace(self, **kw) -> GemmConfig:
        return dataclasses.replace(self, **kw)

    def validate(self) -> None:
        if self.W not in (4, 8, 16) or self.MR < 1 or self.NV < 1:
            raise ValueError(f"bad register tile {self}")
        if self.MC % self.MR or self.NC % self.NR:
            raise ValueError(f"MC must be a multiple of MR and NC of NR: {self}")
        if not 0 <= self.col_tail < self.W:
            raise ValueError(f"col_tail must be in [0, W): {self}")
        if self.unroll < 1 or self.unroll & (self.unroll - 1):
            raise ValueError("unroll must be a power of two")
        if self.stream_max_m < 0:
            raise ValueError(f"stream_max_m must be >= 0: {self}")


# Register tiles and blocks measured on the machines Kiln runs on (docs/gemm.md):
#  AVX-512 (32 zmm): 12x32 -> 24 accumulators + 2 B vectors + 1 broadcast of A.
#  AVX2+FMA (16 ymm): 4x24 -> 12 accumulators + 3 B vectors + 1 broadcast (7 loads per 12 FMAs;
#    the classic 6x16 needs 8 and measured 5-25% slower on the big and the M=64 shapes).
#  SSE (16 xmm, no FMA): 6x8, mul+add.
PRESETS = {
    # AVX-512: B read in place up to 4 row tiles, rows any distance apart (2 threads, Zen 4: a
    # MobileNetV2 1x1 96->24 on 56x56 0.108 -> 0.073 ms, 144->24 0.151 -> 0.106; MobileNetV2 -4%,
    # Inception-v1 -6%, SqueezeNet -4%; docs/gemm.md); and up to 8 row tiles (96) when K >= 4 M,
    # the narrowing 1x1 projections (2 threads, Zen 4: MobileNetV2's 576->96 and 384->96 on 14x14
    # 0.150 -> 0.138 and 0.103 -> 0.088 ms, SqueezeNet's 512->64 on 13x13 0.113 -> 0.074; the model
    # 0.973-0.993x; reading B in place for every M up to 96 or 192 slowed the expanding 1x1 layers)
    # The last 1-8 columns of an N remainder by the rows-as-lanes kernel (a 7x7 map's 49 = 32 + 16 +
    # 1 pixels, 14x14's 196 = 6 x 32 + 4; 1 thread, Zen 4, A packed: 960x49x160 196 -> 158 us,
    # 2048x49x512 1236 -> 987, 576x196x96 229 -> 215; from about 12 columns the masked vector wins)
    # A B read in place prefetched 128 floats (8 lines) ahead along its rows into L2: its K rows are
    # K streams, more than the hardware prefetchers follow (1 thread, Zen 4, B not in cache: 16 x
    # 12544 x 32 375 -> 206 us, 24 x 3136 x 144 404 -> 233; in cache the same; docs/gemm.md)
    "avx512": GemmConfig("avx512", W=16, MR=12, NV=2, KC=256, MC=192, NC=1024, direct_b_max_m=48,
                         direct_b_max_ldb=1 << 40, direct_b_narrow_max_m=96, col_tail=8,
                         prefetch_direct_b=128, prefetch_direct_locality=2),
    "avx2": GemmConfig("avx2", W=8, MR=4, NV=3, KC=256, MC=144, NC=1008, col_tail=3, prefetch_direct_b=128,
                       prefetch_direct_locality=2),
    "sse": GemmConfig("sse", W=4, MR=6, NV=2, KC=256, MC=144, NC=2048),
}


def host_isa() -> str:
    """The widest ISA level of the host CPU that Kiln's GEMM has a preset for."""
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    if feats.get("avx512f") and feats.get("fma"):
        return "avx512"
    if feats.get("avx2") and feats.get("fma"):
        return "avx2"
    return "sse"


_FEATURES = {
    "avx512": "+sse4.2,+avx,+avx2,+fma,+f16c,+avx512f,+avx512vl,+avx512bw,+avx512dq",
    "avx2": "+sse4.2,+avx,+avx2,+fma,+f16c",
    "sse": "+sse4.2",
}


def config_for(isa: str | None = None, **overrides) -> GemmConfig:
    """The preset for ``isa`` (default: the host's), with LLVM cpu/features filled in.

    For the host ISA the host CPU name and all its features are used (best scheduling model); for
    a narrower ISA on this host, or another machine's ISA, a generic cpu with only that ISA's
    features, so the code runs on any CPU having them.
    """
    import llvmlite.binding as llvm

    host = host_isa()
    isa = isa or host
    if isa not in PRESETS:
        raise ValueError(f"unknown GEMM ISA {isa!r}; known: {sorted(PRESETS)}")
    cfg = PRESETS[isa]
    if llvm.get_process_triple().startswith(("x86_64", "i686", "i386")):
        if isa == host:
            cpu = llvm.get_host_cpu_name()
            features = llvm.get_host_cpu_features().flatten()
        else:
            cpu = {"avx512": "skylake-avx512", "avx2": "haswell", "sse": "x86-64-v2"}[isa]
            features = _FEATURES[isa]
        cfg = cfg.replace(cpu=cpu, features=features)
    cfg = cfg.replace(**overrides)
    cfg.validate()
    return cfg


def config_for_target(target, **overrides) -> GemmConfig:
    """The preset matching a ``compiler.codegen.llvm.target.Target`` (anything with ``isa``, a set
    of feature names, and ``cpu``/``features`` strings), compiled for exactly that target.

    >>> from compiler.codegen.llvm.target import target_for
    >>> config_for_target(target_for("znver3")).isa
    'avx2'
    """
    isa_set = set(getattr(target, "isa", ()))
    if "avx512f" in isa_set and "fma" in isa_set:
        isa = "avx512"
    elif "avx2" in isa_set and "fma" in isa_set:
        isa = "avx2"
    else:
        isa = "sse"
    cfg = PRESETS[isa].replace(cpu=target.cpu, features=target.features).replace(**overrides)
    cfg.validate()
    return cfg


def model_config(target) -> GemmConfig:
    """The GEMM as compiled into a model's artifact: it runs on the artifact's shared thread pool
    (``external_pool``), whose threads are cheap to wake, so products from 0.5 MFLOP are split."""
    return config_for_target(target, external_pool=True, par_min_flops=5e5)
