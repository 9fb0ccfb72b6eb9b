"""Op family: conv (to be filled)."""
from __future__ import annotations

OPS: tuple = ()
