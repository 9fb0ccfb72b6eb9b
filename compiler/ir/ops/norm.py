"""Op family: norm (to be filled)."""
from __future__ import annotations

OPS: tuple = ()
