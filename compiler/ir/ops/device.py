"""``kiln.Transfer``: a value moved from one device's memory to another's.

The device-splitting pass (``compiler/passes/split_devices.py``) places every node on a device
(``node.device``, printed ``on "cpu:1"``) and, where a value made on one device is read on another,
inserts a Transfer node on the reading device: its result is the value, in that device's memory.
The reference semantics are the identity (a copy changes no number); a multi-device artifact cuts
its graph at the Transfers into one program per device, and the runtime does the copy between them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from .base import Cost, OpDef, Pattern

#: a device name: a kind and an index ("cpu:0", "cuda:1")
DEVICE_NAME = re.compile(r"^(cpu|cuda):(0|[1-9][0-9]*)$")


@dataclass(frozen=True, eq=False)
class Transfer(OpDef):
    """``output`` is ``input``, moved from device ``source`` to device ``target``."""

    source: str
    target: str
    domain: ClassVar = "kiln"
    inputs: ClassVar = ("input",)
    outputs: ClassVar = ("output",)
    pattern: ClassVar = Pattern.OPAQUE
    foldable: ClassVar = False  # a copy between devices is work to place, not a value to precompute

    def validate(self):
        for attr in ("source", "target"):
            if not DEVICE_NAME.match(getattr(self, attr)):
                raise self.fail(f"attribute {attr}: expected a device name like 'cpu:0' or 'cuda:1', "
                                f"got {getattr(self, attr)!r}")
        if self.source == self.target:
            raise self.fail(f"source and target are the same device {self.source!r}")

    def infer(self, ins):
        return [ins[0].type]

    def compute(self, x):
        return [x]

    def cost(self, ins, outs) -> Cost:
        """No arithmetic; the bytes are the value's, read on one device and written on the other."""
        n = outs[0].nbytes or 0
        return Cost(0, 2 * n)


OPS = (Transfer,)
