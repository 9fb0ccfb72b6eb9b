"""ONNX's own backend test suite (onnx.backend.test.BackendTest) against Kiln.

Runs the node, simple, pytorch-converted, pytorch-operator and real (light model-zoo) cases. Cases Kiln
cannot pass yet are skipped by the explicit, commented list in ``exclusions.py``; every skip names its
reason, and ``make test`` prints the pass counts per suite (see tests/conftest.py).
"""
from __future__ import annotations

import re
import warnings

import onnx.backend.test
import pytest

from compiler.tools.onnx_backend import KilnBackend

from .exclusions import EXCLUDED, MIN_PASSING

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the case generators overflow on purpose

#: the models prepared by the running case (conftest.py reads them: did the case run fully native?)
PREPARED: list = []


class RecordingBackend(KilnBackend):
    """Kiln's backend, remembering each prepared model so the summary can count native cases."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        rep = super().prepare(model, device, **kwargs)
        PREPARED.append(rep)
        return rep


backend_test = onnx.backend.test.BackendTest(RecordingBackend, __name__)
for pattern, _reason in EXCLUDED:
    backend_test.exclude(pattern)

globals().update(backend_test.test_cases)

SUITES = {
    "node": "OnnxBackendNodeModelTest",
    "simple": "OnnxBackendSimpleModelTest",
    "pytorch-converted": "OnnxBackendPyTorchConvertedModelTest",
    "pytorch-operator": "OnnxBackendPyTorchOperatorModelTest",
    "real": "OnnxBackendRealModelTest",
}


def _case_names(cls_name: str) -> list[str]:
    cls = backend_test.test_cases[cls_name]
    return [n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu")]


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_exclusions_leave_the_required_cases(suite):
    """The exclusion list may not grow past what each suite must pass (the issue's floor)."""
    names = _case_names(SUITES[suite])
    excluded = [n for n in names if any(re.search(p, n) for p, _ in EXCLUDED)]
    runnable = len(names) - len(excluded)
    assert runnable >= MIN_PASSING[suite], (
        f"{suite}: only {runnable} of {len(names)} cases are not excluded; at least {MIN_PASSING[suite]} must pass")


def test_every_exclusion_matches_a_case():
    """A stale exclusion (matching no case) hides nothing and must be removed."""
    names = [n for cls in SUITES.values() for n in _case_names(cls)]
    stale = [p for p, _ in EXCLUDED if not any(re.search(p, n) for n in names)]
    assert not stale, f"exclusions that match no case: {stale}"
