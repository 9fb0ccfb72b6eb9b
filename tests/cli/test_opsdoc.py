"""docs/ops.md is what ``python -m compiler.tools.opsdoc`` writes: the op table of the code, and the
native dtypes measured on the installed onnx package's node cases."""
from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from compiler.ir.ops import lookup
from compiler.tools import opsdoc

DOC = Path(__file__).resolve().parents[2] / "docs" / "ops.md"


def _without_measured_column(text: str) -> list[str]:
    """The lines, table rows without their last cell (the measured one)."""
    return [re.sub(r" [^|]*\|$", "", line) if line.startswith("|") else line
            for line in text.splitlines() if "native dtypes** column" not in line]


@pytest.fixture(scope="module")
def found() -> opsdoc.Survey:
    return opsdoc.survey()


@pytest.mark.slow
def test_docs_ops_md_is_up_to_date(found):
    written, now = DOC.read_text(), opsdoc.render(found)
    made_with = re.search(r"\(onnx ([^:]+):", written)
    assert made_with, "docs/ops.md does not say which onnx its native dtypes were measured with"
    assert _without_measured_column(written) == _without_measured_column(now), (
        "docs/ops.md is out of date with the op table: run python -m compiler.tools.opsdoc > docs/ops.md")
    if made_with.group(1) == onnx.__version__:  # another onnx has other node cases: the table is what counts
        assert written == now, ("docs/ops.md's native dtypes are out of date: run "
                                "python -m compiler.tools.opsdoc > docs/ops.md")


@pytest.mark.slow
def test_the_survey_counts_and_marks(found):
    """The survey sees every node case; the common float ops are native in f32, and an op with no
    native lowering is listed as run in the interpreter."""
    assert found.cases > 1500 and found.fully_native > 0.8 * found.cases
    assert found.not_compiled < 0.05 * found.cases
    assert "f32" in found.native[lookup("Relu")] and "f32" in found.native[lookup("Conv")]
    assert found.column(lookup("StringSplit")) == "none; interpreter: string"
    assert opsdoc.Survey().column(lookup("Relu")) == "—"
