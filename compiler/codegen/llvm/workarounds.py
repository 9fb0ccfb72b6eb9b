"""Rewrites of optimized LLVM IR that keep LLVM's code generator away from its known miscompiles.

Each is a *refinement* (the rewritten module computes one of the values the original allows), so it is
sound on every target; each names the bug it avoids and the test that reproduces it.

**Undefined lanes of i1-vector shuffles** (LLVM 22, x86 with AVX-512 mask registers). The optimizer
turns ``cond[j % 9]`` for 72 consecutive outputs into one ``<8 x i1>`` compare reused through
shuffles that leave one lane undefined and fill it with ``insertelement``. The AVX-512 lowering
implements that insert as "shift the mask, OR the new bit in", assuming the undefined lane holds 0;
the shift brings in a set bit from the widened mask, so the OR keeps a 1 where the inserted value was
0 (``Where(cond: bool[9], x: f32[8,9], y)`` returned ``y`` for its last element: fuzzing found it,
issue 21). Naming lane 0 for every undefined lane of an i1 shuffle mask removes the undefined lane the
lowering relies on. Test: ``tests/codegen/test_llvm_workarounds.py``.
"""
from __future__ import annotations

import re

_I1_SHUFFLE = re.compile(r"^.*= shufflevector <\d+ x i1> .*$", re.M)
_UNDEF_LANE = re.compile(r"\bi32 (?:poison|undef)\b")
_UNDEF_MASK = re.compile(r"(<\d+ x i32>) (?:poison|undef)\s*$")


def _define_lanes(m: re.Match) -> str:
    line = _UNDEF_LANE.sub("i32 0", m.group(0))
    return _UNDEF_MASK.sub(r"\1 zeroinitializer", line)


def define_i1_shuffle_lanes(text: str) -> str:
    """``text`` with every undefined lane of an i1-vector shuffle mask naming lane 0 (unchanged, the
    same object, when it has none)."""
    if "x i1>" not in text:
        return text
    out = _I1_SHUFFLE.sub(_define_lanes, text)
    return text if out == text else out


__all__ = ["define_i1_shuffle_lanes"]
