"""The op table: every op family module lists its classes in ``OPS``; this table joins them.

No registry is filled by importing: adding an op means adding it to its family's ``OPS`` tuple.
"""
from __future__ import annotations

from . import (attention, control, conv, device, elementwise, indexing, kernel, linalg, ml, norm, pool, quant, random, recurrent,
               reduce, resample, sequence, shape, signal, strings, tensor, training)
from .base import Cost, OpDef, OpError, Pattern

FAMILIES = (elementwise, shape, tensor, indexing, resample, conv, pool, norm, reduce, linalg, attention, quant,
            signal, strings, random, recurrent, ml, training, sequence,
            control, kernel, device)

#: (domain, op name) -> op class
BY_NAME: dict[tuple[str, str], type[OpDef]] = {}
for _family in FAMILIES:
    for _cls in _family.OPS:
        _key = (_cls.domain, _cls.name)
        assert _key not in BY_NAME, f"op {_key} defined twice"
        BY_NAME[_key] = _cls


def lookup(name: str, domain: str = "") -> type[OpDef] | None:
    return BY_NAME.get((domain, name))


__all__ = ["BY_NAME", "Cost", "OpDef", "OpError", "Pattern", "lookup"]
