"""Test-suite wide hooks: the ONNX conformance counts printed at the end of every run."""
from __future__ import annotations

import collections
import re

_SUITE_OF_CLASS = {
    "OnnxBackendNodeModelTest": "node",
    "OnnxBackendSimpleModelTest": "simple",
    "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
    "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator",
    "OnnxBackendRealModelTest": "real",
}
_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def pytest_runtest_logreport(report):
    m = re.search(r"test_onnx_backend\.py::(\w+)::", report.nodeid)
    if not m or m.group(1) not in _SUITE_OF_CLASS:
        return
    if report.nodeid.endswith("_cuda"):
        return  # BackendTest makes every case once per device; Kiln's backend is CPU only
    suite = _SUITE_OF_CLASS[m.group(1)]
    if report.skipped:
        _counts[suite]["excluded"] += 1
    elif report.failed:
        _counts[suite]["failed"] += 1
    elif report.when == "call":
        _counts[suite]["passed"] += 1


def pytest_terminal_summary(terminalreporter):
    if not _counts:
        return
    tr = terminalreporter
    tr.section("ONNX backend conformance (Kiln)")
    for suite in ("node", "simple", "pytorch-converted", "pytorch-operator", "real"):
        c = _counts.get(suite)
        if c:
            total = c["passed"] + c["failed"] + c["excluded"]
            tr.write_line(f"{suite:>18}: {c['passed']:5d} passed of {total:5d}"
                          f"  ({c['failed']} failed, {c['excluded']} excluded)")
