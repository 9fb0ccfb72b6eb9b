"""The layers point one way: every import of every module under ``compiler/`` and ``frontends/``
(imports inside functions too) goes to its own layer or to one ``ALLOWED`` lists for it.

    compiler/ir  <-  compiler/passes  <-  compiler/codegen  <-  compiler/runtime  <-  driver  <-  compiler/tools
    compiler/ir  <-  frontends/ (the ONNX importer and exporter)  <-  driver

A backend tells the passes what it can fuse by handing them a ``FusionCapabilities``
(``compiler/codegen/fusion.py``); the passes never import it. See docs/design.md.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: module (or package: its modules too) -> layer; a module belongs to its longest prefix listed
LAYER_OF = {
    "compiler.errors": "errors",
    "compiler.paths": "errors",  # (the cache folder: below every layer, as the errors are)
    "compiler.ir": "ir",
    "frontends": "frontends",
    "compiler.passes": "passes",
    "compiler.codegen": "codegen",
    "compiler.runtime": "runtime",
    "compiler": "driver",  # the package itself (compile, load), driver.py, models.py, limits.py
    "compiler.tools": "tools",
}

#: layer -> the layers it may import besides its own: only ones below it
ALLOWED = {
    "errors": set(),
    "ir": {"errors"},
    "frontends": {"errors", "ir"},
    "passes": {"errors", "ir"},
    "codegen": {"errors", "ir", "passes"},
    "runtime": {"errors", "ir", "passes", "codegen"},
    "driver": {"errors", "ir", "frontends", "passes", "codegen", "runtime"},
    "tools": {"errors", "ir", "frontends", "passes", "codegen", "runtime", "driver"},
}


def layer_of(module: str) -> str | None:
    """The layer of a Kiln module (None for other packages: the standard library, numpy, onnx...)."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        layer = LAYER_OF.get(".".join(parts[:k]))
        if layer is not None:
            return layer
    return None


def imported(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) for every import in ``source``, relative ones resolved against ``module``.
    ``from X import name`` counts as ``X.name`` (a submodule or a name of X: both are in X's layer,
    or in the submodule's)."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return out


def modules():
    """(path relative to the root, module name, is a package) of every module of Kiln."""
    for top in ("compiler", "frontends"):
        for d, _, files in os.walk(ROOT / top):
            for f in sorted(files):
                if f.endswith(".py"):
                    rel = Path(d, f).relative_to(ROOT)
                    name = ".".join(rel.with_suffix("").parts)
                    is_package = f == "__init__.py"
                    yield rel, name.removesuffix(".__init__") if is_package else name, is_package


def violations(rel, module: str, is_package: bool, source: str) -> list[str]:
    mine = layer_of(module)
    out = []
    for line, target in imported(source, module, is_package):
        theirs = layer_of(target)
        if theirs is not None and theirs != mine and theirs not in ALLOWED[mine]:
            out.append(f"{rel}:{line}: {module} ({mine}) imports {target} ({theirs}); {mine} may import only "
                       f"{', '.join(sorted(ALLOWED[mine])) or 'nothing of Kiln'}")
    return out


def test_every_layer_is_in_the_table():
    assert set(LAYER_OF.values()) == set(ALLOWED)
    for rel, module, _ in modules():
        assert layer_of(module) is not None, f"{rel} is in no layer: add it to LAYER_OF"


def test_no_layer_imports_one_above_it():
    found = []
    for rel, module, is_package in modules():
        found += violations(rel, module, is_package, (ROOT / rel).read_text(encoding="utf-8"))
    assert not found, "imports against the layers:\n" + "\n".join(found)


@pytest.mark.parametrize("module, source, bad", [
    ("compiler.passes.fuse", "def f():\n    from ..codegen.kernels import ALL\n", "compiler.codegen.kernels.ALL"),
    ("compiler.ir.graph", "import compiler.tools.cli\n", "compiler.tools.cli"),
    ("compiler.passes.instruments", "from frontends.onnx import export_model\n", "frontends.onnx.export_model"),
    ("compiler.codegen.llvm.toolchain", "from ...runtime import artifact\n", "compiler.runtime.artifact"),
    ("frontends.onnx.importer", "import compiler\n", "compiler"),
])
def test_an_upward_import_is_named(module, source, bad):
    found = violations("x.py", module, False, source)
    assert len(found) == 1 and f"imports {bad} (" in found[0], found


def test_imports_within_a_layer_and_downward_pass():
    assert violations("x.py", "compiler.codegen.fusion", False,
                      "from ..passes.fuse import FusionCapabilities\nfrom .kernels import ALL\nimport numpy\n") == []
    assert violations("x.py", "compiler.tools", True, "from .. import compile\nfrom . import zoo\n") == []
