"""The CPU that generated code is compiled for: LLVM triple, CPU name, feature string, ISA summary.

``host_target()`` describes the machine Kiln runs on (what ``llc -mcpu=native`` would pick);
``target_for("znver3")`` names another x86-64 CPU (cross-compiling for it needs nothing more: the
x86 backend is the native one). A ``Target`` is a plain frozen value, safe to hash, compare and
store in an artifact manifest; ``target_machine()`` makes (and caches) the LLVM object that
optimizes and emits code for it.

Code compiled for a target runs on CPUs that have all of its features: an artifact built for the
host of this machine (with AVX-512) does not run on a Zen 3 (AVX2 + FMA); build for
``target_for("znver3")`` or ``target_for("x86-64-v3")`` when the artifact must move.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import llvmlite.binding as llvm

#: The ISA extensions code generation cares about (vector width, FMA, int8/bf16 dot products).
ISA_FEATURES: tuple[str, ...] = (
    "sse2", "sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi2",
    "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16",
    "avxvnni", "amx-tile", "amx-int8", "amx-bf16",
)

#: ISA of a few named CPUs, for ``target_for(cpu)`` without an explicit feature string (LLVM knows
#: each CPU's features, but llvmlite does not expose them).
_V2 = frozenset({"sse2", "sse4.1", "sse4.2"})
_V3 = _V2 | {"avx", "avx2", "fma", "f16c", "bmi2"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
KNOWN_CPUS: dict[str, frozenset[str]] = {
    "x86-64": frozenset({"sse2"}),
    "x86-64-v2": _V2,
    "x86-64-v3": _V3,
    "x86-64-v4": _V4,
    "haswell": _V3,
    "znver2": _V3,
    "znver3": _V3,
    "znver4": _V4 | {"avx512vnni", "avx512bf16"},
    "skylake-avx512": _V4,
    "icelake-server": _V4 | {"avx512vnni"},
    "sapphirerapids": _V4 | {"avx512vnni", "avx512bf16", "avx512fp16", "avxvnni", "amx-tile", "amx-int8",
                             "amx-bf16"},
}


#: LLVM features Kiln adds to every x86 target machine: ``prefer-no-gather`` makes the vectorizer load
#: strided accesses as wide loads and shuffles (or scalar loads) instead of ``vgatherdps``, measured
#: slower on AMD Zen 4: a 3x3 stride-2 max pool over 16-wide output rows 12.0 -> 6.6 us; over 14
#: models (the suite and the real-architecture ones) the same speed but ConvNeXt (0.91x) and UNet (0.98x)
CODEGEN_FEATURES = "+prefer-no-gather"


@dataclass(frozen=True)
class Target:
    """A CPU to generate code for.

    ``features`` is LLVM's feature string (``"+avx2,+fma,-avx512f,..."``; empty: the CPU's own
    defaults); ``isa`` the subset of ``ISA_FEATURES`` the target has.
    """

    triple: str
    cpu: str
    features: str
    isa: frozenset[str] = field(default_factory=frozenset)
    opt_level: int = 3

    def has(self, feature: str) -> bool:
        """Whether the target has an ISA extension (a name of ``ISA_FEATURES``)."""
        if feature not in ISA_FEATURES:
            raise ValueError(f"unknown ISA feature {feature!r}; known: {', '.join(ISA_FEATURES)}")
        return feature in self.isa

    @property
    def vector_bits(self) -> int:
        """The widest SIMD register: 512 (AVX-512), 256 (AVX) or 128 (SSE).

        LLVM's cost model still picks the width it vectorizes with: 256 bits on most AVX-512 Intel
        cores (their ``prefer-256-bit`` tuning), so ``<8 x float>`` loops are the norm on both.
        """
        return 512 if "avx512f" in self.isa else 256 if "avx" in self.isa else 128

    @property
    def f32_lanes(self) -> int:
        """float32 lanes per vector of ``min(vector_bits, 256)``: what the vectorizer typically uses."""
        return min(self.vector_bits, 256) // 32

    def target_machine(self) -> llvm.TargetMachine:
        """The LLVM TargetMachine (position-independent code, for shared libraries); cached. On x86
        it also has ``CODEGEN_FEATURES`` (code generation choices, not the CPU's ISA)."""
        extra = CODEGEN_FEATURES if self.triple.startswith(("x86_64", "i386", "i686")) else ""
        return _target_machine(self.triple, self.cpu, ",".join(f for f in (self.features, extra) if f),
                               self.opt_level)

    @property
    def data_layout(self) -> str:
        return str(self.target_machine().target_data)

    @property
    def family(self) -> str:
        """The vector ISA in a few words, for reports: "AVX-512 (VNNI, BF16)", "AVX2+FMA", "SSE"."""
        isa = self.isa
        if "avx512f" in isa:
            base, extra = "AVX-512", (("avx512vnni", "VNNI"), ("avx512bf16", "BF16"), ("avx512fp16", "FP16"),
                                      ("amx-tile", "AMX"))
        elif "avx2" in isa:
            base, extra = "AVX2+FMA" if "fma" in isa else "AVX2", (("avxvnni", "AVX-VNNI"),)
        else:
            base, extra = ("AVX" if "avx" in isa else "SSE"), ()
        names = [n for f, n in extra if f in isa]
        return base + (f" ({', '.join(names)})" if names else "")

    def describe(self) -> str:
        isa = " ".join(f for f in ISA_FEATURES if f in self.isa) or "(baseline)"
        return f"{self.triple} cpu={self.cpu} isa: {isa}"


def _init_llvm() -> None:
    # Kiln only emits x86-64 (or whatever the host is) code: the native target is enough.
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()


@functools.lru_cache(maxsize=None)
def _target_machine(triple: str, cpu: str, features: str, opt_level: int) -> llvm.TargetMachine:
    _init_llvm()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=opt_level, reloc="pic",
                                        codemodel="default")


def _isa_of(features: str) -> frozenset[str]:
    on = {f[1:] for f in features.split(",") if f.startswith("+")}
    return frozenset(f for f in ISA_FEATURES if f in on)


@functools.lru_cache(maxsize=1)
def host_target() -> Target:
    """The CPU this process runs on, with every feature LLVM detects on it."""
    _init_llvm()
    features = llvm.get_host_cpu_features().flatten()
    return Target(triple=llvm.get_process_triple(), cpu=llvm.get_host_cpu_name(), features=features,
                  isa=_isa_of(features))


def target_for(cpu: str, features: str = "", triple: str | None = None) -> Target:
    """A named CPU (``"znver3"``, ``"x86-64-v3"``, ...), optionally with an explicit feature string.

    Without ``features`` the CPU's own defaults apply (LLVM's table) and ``isa`` comes from
    ``KNOWN_CPUS``; an unknown CPU without features is refused, since nothing would say what it has.
    """
    _init_llvm()
    if features:
        isa = _isa_of(features)
    elif cpu in KNOWN_CPUS:
        isa = KNOWN_CPUS[cpu]
    else:
        raise ValueError(f"CPU {cpu!r} is not in KNOWN_CPUS ({', '.join(KNOWN_CPUS)}); "
                         f"pass its LLVM feature string too (e.g. '+avx2,+fma')")
    return Target(triple=triple or llvm.get_process_triple(), cpu=cpu, features=features, isa=isa)


__all__ = ["ISA_FEATURES", "KNOWN_CPUS", "Target", "host_target", "target_for"]
