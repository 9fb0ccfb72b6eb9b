"""Test-suite wide hooks: the ONNX conformance counts printed at the end of every run."""
from __future__ import annotations

import collections
import os
import re

# CUDA kernels are tested in numba's CUDA simulator unless the environment says otherwise (a GPU machine
# runs benchmarks/gpu_check.py with NUMBA_ENABLE_CUDASIM=0); numba reads it when numba.cuda is imported
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

_SUITE_OF_CLASS = {
    "OnnxBackendNodeModelTest": "node",
    "OnnxBackendSimpleModelTest": "simple",
    "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
    "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator",
    "OnnxBackendRealModelTest": "real",
}
_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
#: per suite, (op, reason) -> passed cases that ran it in the interpreter
_fallbacks: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """For a conformance case: whether every model it prepared ran entirely as native code."""
    outcome = yield
    if call.when != "call" or "test_onnx_backend" not in item.nodeid:
        return
    import sys

    mod = sys.modules.get(item.module.__name__)
    prepared = getattr(mod, "PREPARED", None)
    if prepared is None:
        return
    exes = [r.executable for r in prepared]
    native = bool(exes) and all(e is not None and not e.fallback for e in exes)
    outcome.get_result().user_properties.append(("kiln_native", native))
    why = sorted({(f["op"], re.sub(r" \[[^\]]*\]| \(only .*", "", f["reason"]).strip())
                  for e in exes if e is not None for f in e.fallback})
    outcome.get_result().user_properties.append(("kiln_fallback", why))
    prepared.clear()


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
        props = dict(report.user_properties)
        if props.get("kiln_native"):
            _counts[suite]["native"] += 1
        for op, why in props.get("kiln_fallback") or ():
            _fallbacks[suite][op, why] += 1


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
                          f"  ({c['failed']} failed, {c['excluded']} excluded; {c['native']} of the passed "
                          f"ran fully native)")
    top = _fallbacks.get("node")
    if top:
        tr.write_line("what keeps passed node cases off native code (cases, op: reason), most first:")
        for (op, why), n in top.most_common(12):
            tr.write_line(f"{n:>22}  {op}: {why}")
