"""Typed compile options: every knob of the pipeline in one dataclass, validated when built."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from .quantize import QuantizeOptions


class OptionError(ValueError):
    """An unknown option, or an option with a bad value."""


@dataclass(frozen=True)
class CompileOptions:
    #: 0: only what correctness needs (shape inference); 1: simplification; 2: + folding into
    #: kernels (the default); 3: + aggressive rewrites
    opt_level: int = 2
    #: passes to skip, by name (see ``kiln dump --list-passes``)
    disabled_passes: tuple[str, ...] = ()
    #: input name -> shape, replacing symbolic dimensions
    input_shapes: Mapping[str, tuple] = field(default_factory=dict)
    #: input name -> value: the input becomes a constant (the compiled model no longer takes it);
    #: for inputs that decide shapes (a Reduce's axes, a Reshape's shape fed as an input)
    input_values: Mapping[str, object] = field(default_factory=dict)
    #: constant folding never creates a constant larger than this many bytes
    fold_limit_bytes: int = 1 << 26
    #: run the IR verifier after every pass
    verify: bool = False
    #: the rewrite driver gives up after this many rounds over the graph (loop guard)
    max_rewrite_rounds: int = 50
    #: the fusion pass puts at most this many ops in one kernel
    max_fused_ops: int = 32
    #: the most memory a compiled model may need (arena + weights, and any one value); None: this
    #: machine's physical memory (``limits.memory_limit``)
    memory_limit_bytes: int | None = None
    #: int8 quantization (``passes/quantize.py``): a ``QuantizeOptions`` or a mode name ("int8",
    #: "int8-dynamic"); None: none
    quantize: "QuantizeOptions | None" = None

    def __post_init__(self):
        from .quantize import QuantizeOptions

        object.__setattr__(self, "quantize", QuantizeOptions.of(self.quantize))
        if self.opt_level not in (0, 1, 2, 3):
            raise OptionError(f"opt_level must be 0, 1, 2 or 3, got {self.opt_level!r}")
        object.__setattr__(self, "disabled_passes", tuple(self.disabled_passes))
        object.__setattr__(self, "input_shapes", {k: tuple(v) for k, v in dict(self.input_shapes).items()})
        object.__setattr__(self, "input_values", dict(self.input_values))
        if self.fold_limit_bytes < 0:
            raise OptionError("fold_limit_bytes must be >= 0")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes < 1:
            raise OptionError(f"memory_limit_bytes must be >= 1, got {self.memory_limit_bytes}")
        if self.max_fused_ops < 1:
            raise OptionError(f"max_fused_ops must be >= 1, got {self.max_fused_ops}")

    @classmethod
    def valid_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def make(cls, options: "CompileOptions | None" = None, **kwargs) -> "CompileOptions":
        """Options from keyword arguments; an unknown name is an error that lists the valid ones."""
        unknown = sorted(set(kwargs) - set(cls.valid_names()))
        if unknown:
            raise OptionError(f"unknown compile option(s) {', '.join(unknown)}; valid options: "
                              f"{', '.join(cls.valid_names())}")
        base = options or cls()
        return dataclasses.replace(base, **kwargs)

    def check_pass_names(self, known: Sequence[str]) -> None:
        unknown = sorted(set(self.disabled_passes) - set(known))
        if unknown:
            raise OptionError(f"cannot disable unknown pass(es) {', '.join(unknown)}; passes: {', '.join(known)}")
