"""The fuzzers in the test suite: a fixed-seed batch of random graphs at every -O level, of random int8
models and of malformed files and tampered artifacts must give no failure (``make fuzz`` runs as many
as asked); and the harness's own parts: the generators are deterministic and valid, the comparisons
and the worker pool classify what they see."""
from __future__ import annotations

import os

import numpy as np
import pytest

from . import gen, quantized
from .harness import Diff, Report, classify, compare
from .mutate import Mutants
from .pool import Outcome, Pool

SEED = 20260521
GRAPHS = 40        # x 4 levels
MUTANTS = 150
QUANTIZED = 24


@pytest.fixture(scope="module")
def pool():
    with Pool(2) as p:
        yield p


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fuzz-failures"))


def _explain(report: Report, out: str) -> str:
    return f"{report.text()}\n(repros under {out}; README.md there has a line for each)"


@pytest.mark.slow
def test_random_graphs_match_onnxruntime_at_every_level(pool, out):
    report = Diff(pool, out, minimize=False, log=lambda s: None).run(GRAPHS, SEED)
    print(report.text())
    assert report.counts["graphs"] == GRAPHS
    assert not report.failures, _explain(report, out)


@pytest.mark.slow
def test_random_int8_models_match_the_reference_on_their_quantized_ir(pool, out):
    report = quantized.run(pool, QUANTIZED, SEED, out, log=lambda s: None)
    print(report.text())
    assert report.counts["models"] == QUANTIZED and report.counts["quantized layers"] > QUANTIZED
    assert report.counts["ok"] == QUANTIZED and not report.failures, _explain(report, out)


@pytest.mark.slow
def test_malformed_files_and_tampered_artifacts_give_clear_errors(pool, out):
    report = Mutants(pool, out, cli_every=15, log=lambda s: None).run(MUTANTS, SEED)
    print(report.text())
    assert report.counts["mutants"] == MUTANTS
    assert not report.failures, _explain(report, out)


# -- the harness itself ---------------------------------------------------------------------------------
#: node test models whose mutants found defects (2026-12-07): each must sweep clean now
SWEPT = ("test_tfidfvectorizer_tf_onlybigrams_levelempty,test_cast_FLOAT_to_DOUBLE,test_split_equal_parts_2d,"
         "test_maxunpool_export_with_output_shape,test_linear_attention_gated_delta_beta_scalar,"
         "test_attention_4d_with_qk_matmul_softcap")


@pytest.mark.slow
def test_node_tests_with_one_change_give_no_finding():
    """``tests.fuzz.nodesweep`` on the node test models where it found defects: every mutant is refused
    or computed as ONNX Runtime and ONNX's reference compute it (its own process: each mutant forks)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-m", "tests.fuzz.nodesweep", "--only", SWEPT], cwd=root,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 finding(s)" in r.stdout and " 0 mutants" not in r.stdout, r.stdout[-2000:]


def test_node_sweep_judge():
    """The sweep's verdicts: Kiln refusing is never a finding; running what the checker or both
    references refuse is; outputs count against the references where they agree."""
    from .nodesweep import judge, known

    a, b = [np.array([1.0, 2.0])], [np.array([1.0, 3.0])]
    ok = dict(checker=None, ort=a, ref=a)
    assert judge(dict(ok, kiln="refused: ModelError"), "Relu", False) is None
    assert judge(dict(ok, kiln=a), "Relu", False) is None
    assert judge(dict(ok, kiln=b), "Relu", False)[0] == "differs"
    assert judge(dict(ok, kiln=b), "Bernoulli", False) is None  # random: not compared
    assert judge(dict(ok, ort=b, kiln=b), "Relu", False) is None  # the references disagree
    assert judge(dict(ok, checker="Required attribute 'to' is missing.", kiln=a), "Cast", False)[0] == "accepted"
    refused = dict(checker=None, ort="error: FAIL", ref="error: bad", kiln=a)
    assert judge(refused, "Relu", False)[0] == "accepted"
    assert judge(dict(refused, ort="error: NOT_IMPLEMENTED"), "Relu", False) is None
    assert judge(dict(ok, kiln="crashed: TypeError: x"), "Relu", False)[0] == "crashed"
    assert known("test_maxpool_2d_precomputed_same_upper", "value strides[0]=7")
    assert known("test_maxpool_2d_default", "value strides[0]=7") is None


def test_generator_is_deterministic_and_valid():
    a, b = gen.generate(5, 3), gen.generate(5, 3)
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert a.recipes == b.recipes and sorted(a.feeds) == sorted(b.feeds)
    for k in a.feeds:
        np.testing.assert_array_equal(a.feeds[k], b.feeds[k])
    for i in range(20):
        c = gen.generate(6, i)
        assert c.model.graph.node and c.reference
        assert c.reference.keys() == gen.validate(c.model, c.feeds).keys()


def test_int8_generator_is_deterministic_and_valid():
    import onnx

    a, b = quantized.generate(5, 3), quantized.generate(5, 3)
    assert a.model.SerializeToString() == b.model.SerializeToString() and a.options == b.options
    np.testing.assert_array_equal(a.feeds["x"], b.feeds["x"])
    kinds = set()
    for i in range(30):
        c = quantized.generate(7, i)
        onnx.checker.check_model(c.model)
        ops = {n.op_type for n in c.model.graph.node}
        kinds.add("Conv" if "Conv" in ops else "MatMul")
        assert bool(c.calibration) == (c.options["mode"] == "int8")
    assert kinds == {"Conv", "MatMul"}


def test_int8_judge_takes_a_step_and_not_a_wrong_value():
    rng = np.random.default_rng(0)
    ref = {"y": rng.standard_normal((2, 8, 5, 5)).astype(np.float32)}
    step = ref["y"].copy()
    step[0, 3, 2, 2] += np.abs(ref["y"]).max() / 255  # one value a uint8 quantization step off
    assert quantized.judge({"y": step}, ref) is None
    swapped = ref["y"][:, ::-1].copy()  # channels in the wrong order
    assert "largest difference" in quantized.judge({"y": swapped}, ref)
    assert "not finite" in quantized.judge({"y": np.full_like(ref["y"], np.nan)}, ref)
    assert "outputs" in quantized.judge({"z": ref["y"]}, ref)


def test_merged_cases_are_one_valid_model_with_every_reference():
    cases = [gen.generate(8, i) for i in range(4)]
    model, feeds, ref = gen.merge(cases)
    got = gen.validate(model, feeds)
    assert sorted(got) == sorted(ref) and len(ref) == sum(len(c.reference) for c in cases)
    for k in ref:
        assert compare({k: ref[k]}, {k: got[k]}, rtol=0, atol=0) is None


def test_compare_is_relative_to_the_magnitude():
    ref = {"y": np.array([1000.0, 0.001, -3.0], np.float32)}
    assert compare(ref, {"y": ref["y"] * np.float32(1 + 1e-5)}) is None
    assert compare(ref, {"y": np.array([1000.05, 0.0011, -3.0], np.float32)}) is None  # within 1e-4 x 1000
    assert "differ" in compare(ref, {"y": np.array([1000.0, 0.001, -2.5], np.float32)})
    assert "shape" in compare(ref, {"y": ref["y"][:2]})
    assert "dtype" in compare(ref, {"y": ref["y"].astype(np.float64)})
    assert "outputs" in compare(ref, {"z": ref["y"]})
    assert "differ" in compare({"i": np.array([1, 2])}, {"i": np.array([1, 3])})


def test_compare_with_infinities():
    """Equal infinities agree (inf - inf is NaN), and an infinity sets no scale: finite elements beside
    it are still compared (a mutant with a 0xff weight byte gave both)."""
    ref = {"y": np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)}
    assert compare(ref, {"y": ref["y"].copy()}) is None
    assert "differ" in compare(ref, {"y": np.array([np.inf, np.inf, 1.0, np.nan], np.float32)})
    assert "differ" in compare(ref, {"y": np.array([np.inf, -np.inf, 2.0, np.nan], np.float32)})


def test_classify_outcomes():
    ref = {"y": np.ones(3, np.float32)}
    assert classify(Outcome("ok", value={"outputs": {"y": np.ones(3, np.float32)}}), ref)[0] == "ok"
    assert classify(Outcome("ok", value={"outputs": {"y": np.zeros(3, np.float32)}}), ref)[0] == "mismatch"
    assert classify(Outcome("error", error="UnsupportedError", kiln=True, unsupported=True), ref)[0] == "refused"
    assert classify(Outcome("error", error="ModelError", kiln=True), ref)[0] == "rejected"
    assert classify(Outcome("error", error="KeyError"), ref)[0] == "exception"
    assert classify(Outcome("crash", error="SIGSEGV"), ref)[0] == "crash"
    assert classify(Outcome("hang", seconds=9), ref)[0] == "hang"


def _segfault():
    import ctypes

    ctypes.string_at(0)


def _sleep():
    import time

    time.sleep(60)


def _raise():
    from compiler.errors import UnsupportedError

    raise UnsupportedError("not this")


def test_pool_survives_crashes_and_hangs(pool):
    me = "tests.fuzz.test_fuzz"
    crash = pool.run(f"{me}:_segfault", timeout=30)
    assert crash.status == "crash" and crash.error == "SIGSEGV", crash
    hang = pool.run(f"{me}:_sleep", timeout=2)
    assert hang.status == "hang", hang
    err = pool.run(f"{me}:_raise", timeout=30)
    assert err.status == "error" and err.kiln and err.unsupported and "not this" in err.message
    ok = pool.run("os:getpid", timeout=30)
    assert ok.status == "ok" and ok.value != os.getpid()
