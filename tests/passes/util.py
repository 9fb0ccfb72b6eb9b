"""Helpers for pass tests: parse IR text, run a pass under the verifier, check structure and numbers."""
from __future__ import annotations

import textwrap

import numpy as np

from compiler.tools.cli import random_inputs
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.ir.printer import print_graph
from compiler.ir.verify import verify
from compiler.passes.manager import PassManager, Verify


def ir(text: str, weights=None):
    return parse(textwrap.dedent(text).strip() + "\n", weights)


def run_pass(p, graph, rtol=1e-5, seed=0):
    """Run pass ``p`` with the verifier; check the interpreter agrees before/after. Returns changed."""
    feeds = random_inputs(graph, {}, seed)
    before = interpret(graph, feeds)
    result = PassManager([p], [Verify()]).run(graph)
    verify(graph)
    after = interpret(graph, feeds)
    for name, ref in before.items():
        np.testing.assert_allclose(after[name], ref, rtol=rtol, atol=rtol * max(1.0, float(np.abs(ref).max()) if ref.size else 0.0))
    return result.records[0].changed


def same_ir(graph, expected: str) -> None:
    got = print_graph(graph).strip()
    want = textwrap.dedent(expected).strip()
    assert got == want, f"IR differs.\n--- got:\n{got}\n--- expected:\n{want}"
