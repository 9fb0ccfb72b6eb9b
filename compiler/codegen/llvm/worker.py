"""A compile worker: ``python -m compiler.codegen.llvm.worker`` reads a target (one line of JSON:
triple, cpu, features, isa, opt_level) and LLVM IR text on stdin and writes the object file to
stdout (``toolchain.compile_parts`` runs one per part of a split module). On failure it prints the
error on stderr and exits 1."""
from __future__ import annotations

import json
import sys


def main() -> int:
    from .target import Target
    from .toolchain import compile_ir

    spec = json.loads(sys.stdin.buffer.readline())
    text = sys.stdin.buffer.read().decode()
    target = Target(spec["triple"], spec["cpu"], spec["features"], frozenset(spec["isa"]), spec["target_opt"])
    try:
        obj = compile_ir(text, target, spec["opt_level"])
    except Exception as e:  # the parent reports it (and compiles the part itself)
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(obj)
    return 0


if __name__ == "__main__":
    sys.exit(main())
