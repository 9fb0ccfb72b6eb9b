"""Op family: linalg (to be filled)."""
from __future__ import annotations

OPS: tuple = ()
