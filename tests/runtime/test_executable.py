"""Compiled executables and artifacts: results against the interpreter, the artifact round trip (also in
a fresh process), refusals (tampered, newer format, foreign CPU), input checks before native code,
concurrent runs, fallback and strict mode, and no partial artifact after a failed compile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import compiler
from compiler.driver import FallbackWarning
from compiler.runtime.format import NativeStep
from compiler.errors import UnsupportedError
from compiler.ir.interpreter import InputError, interpret
from compiler.ir.parser import parse
from compiler.runtime.artifact import MANIFEST, ArtifactError, _manifest_digest

from ..threads import run_threads

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((64, 32)).astype(np.float32)
B1 = RNG.standard_normal(32).astype(np.float32)
W2 = RNG.standard_normal((32, 10)).astype(np.float32)

MLP = """graph @mlp(%x: f32[4,64]) -> (y: f32[4,10], h: f32[4,32]) {
  %w1 = const f32[64,32]
  %b1 = const f32[32]
  %w2 = const f32[32,10]
  %0 = MatMul(%x, %w1) : f32[4,32]
  %1 = Add(%0, %b1) : f32[4,32]
  %2 = Relu(%1) : f32[4,32]
  %3 = MatMul(%2, %w2) : f32[4,10]
  %4 = Sigmoid(%3) : f32[4,10]
  return y=%4, h=%2
}"""


def mlp_graph():
    return parse(MLP, weights={"w1": W1, "b1": B1, "w2": W2})


@pytest.fixture(scope="module")
def exe():
    return compiler.compile(mlp_graph())


@pytest.fixture(scope="module")
def saved(exe, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("a") / "mlp.kiln")
    exe.save(path)
    return path


def feeds(seed=1):
    return {"x": np.random.default_rng(seed).standard_normal((4, 64)).astype(np.float32)}


def test_matches_the_interpreter_and_runs_as_one_native_call(exe):
    f = feeds()
    ref = interpret(mlp_graph(), f)
    out = exe.run(f)
    for k in ("y", "h"):
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-5)
    assert exe.manifest.plan == [NativeStep("kiln_forward")]
    assert exe.fallback == []
    # -O2: MatMul+Add is Gemm; each GEMM and the activation after it are one kernel
    assert [k["ops"] for k in exe.kernels] == [["Gemm", "Relu"], ["MatMul", "Sigmoid"]]


def test_positional_call(exe):
    x = feeds()["x"]
    y, h = exe(x)
    np.testing.assert_array_equal(y, exe.run({"x": x})["y"])


def test_outputs_never_alias_the_arena(exe):
    a = exe.run(feeds(1))
    kept = {k: v.copy() for k, v in a.items()}
    exe.run(feeds(2))
    for k in a:
        np.testing.assert_array_equal(a[k], kept[k])
        assert a[k].flags.owndata or a[k].base is None or not np.shares_memory(a[k], exe._arenas[0].host)


def test_round_trip_in_a_fresh_process(exe, saved, tmp_path):
    f = feeds(3)
    np.save(tmp_path / "x.npy", f["x"])
    code = ("import sys, numpy as np, compiler; e = compiler.load(sys.argv[1]); "
            "o = e.run({'x': np.load(sys.argv[2])}); np.save(sys.argv[3], o['y'])")
    subprocess.run([sys.executable, "-c", code, saved, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                   check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), exe.run(f)["y"])


def test_artifact_layout_and_manifest(saved):
    names = sorted(os.listdir(saved))
    assert names == ["manifest.json", "model.kir", "model.so", "weights.bin"]
    m = json.load(open(os.path.join(saved, MANIFEST)))
    assert m["format_version"] == 2 and m["kiln_version"] == compiler.__version__
    assert set(m["files"]) == {"model.kir", "model.so", "weights.bin"}
    assert m["inputs"] == [{"name": "x", "type": "f32[4,64]", "dtype": "f32", "shape": [4, 64]}]
    assert m["memory"]["weights_bytes"] >= W1.nbytes + B1.nbytes + W2.nbytes
    assert "avx2" in m["target"]["isa"] or "sse2" in m["target"]["isa"]


def _copy(saved, tmp_path):
    import shutil

    dst = str(tmp_path / "copy.kiln")
    shutil.copytree(saved, dst)
    return dst


def _edit_manifest(path, change, resign=True):
    mp = os.path.join(path, MANIFEST)
    m = json.load(open(mp))
    change(m)
    if resign:
        m["manifest_sha256"] = _manifest_digest(m)
    json.dump(m, open(mp, "w"))


def test_tampered_weights_are_refused(saved, tmp_path):
    dst = _copy(saved, tmp_path)
    with open(os.path.join(dst, "weights.bin"), "r+b") as f:
        f.seek(10)
        f.write(b"\x01")
    with pytest.raises(ArtifactError, match="weights.bin does not match its checksum"):
        compiler.load(dst)


def test_tampered_manifest_is_refused(saved, tmp_path):
    dst = _copy(saved, tmp_path)
    _edit_manifest(dst, lambda m: m["memory"].update(arena_bytes=1), resign=False)
    with pytest.raises(ArtifactError, match="modified after the artifact was written"):
        compiler.load(dst)


def test_newer_format_is_refused(saved, tmp_path):
    dst = _copy(saved, tmp_path)
    _edit_manifest(dst, lambda m: m.update(format_version=99))
    with pytest.raises(ArtifactError, match="format version 99, newer"):
        compiler.load(dst)


def test_older_format_is_refused(saved, tmp_path):
    dst = _copy(saved, tmp_path)
    _edit_manifest(dst, lambda m: m.update(format_version=1))
    with pytest.raises(ArtifactError, match="format version 1, older than this Kiln reads .2.*recompile"):
        compiler.load(dst)


def test_foreign_cpu_features_are_refused(saved, tmp_path, monkeypatch):
    # A baseline x86-64 stands in for the host, so the test holds on any machine (even one with every
    # feature Kiln knows).
    from compiler.codegen.llvm import target

    host = target.target_for("x86-64")
    monkeypatch.setattr(target, "host_target", lambda: host)
    foreign = "avx512vnni"
    dst = _copy(saved, tmp_path)
    _edit_manifest(dst, lambda m: m["target"].update(isa=sorted(set(m["target"]["isa"]) | {foreign}),
                                                     cpu="future-cpu"))
    with pytest.raises(ArtifactError, match=f"compiled for CPU 'future-cpu' with .*{foreign}.*which this CPU"):
        compiler.load(dst)


def test_missing_file_and_not_an_artifact(saved, tmp_path):
    dst = _copy(saved, tmp_path)
    os.remove(os.path.join(dst, "model.so"))
    with pytest.raises(ArtifactError, match="model.so is missing"):
        compiler.load(dst)
    with pytest.raises(ArtifactError, match="no artifact"):
        compiler.load(str(tmp_path / "nothing.kiln"))
    (tmp_path / "empty.kiln").mkdir()
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        compiler.load(str(tmp_path / "empty.kiln"))


@pytest.mark.parametrize("bad, message", [
    ({"x": np.zeros((4, 63), np.float32)}, r"input 'x' has shape \[4, 63\], the model takes f32\[4, 64\]"),
    ({"x": np.zeros((4, 64), np.float64)}, "input 'x' has element type float64"),
    ({"x": np.zeros((4, 64), np.int32)}, "input 'x' has element type int32"),
    ({}, r"missing input\(s\) \['x'\]"),
    ({"x": np.zeros((4, 64), np.float32), "z": np.zeros(1)}, r"unknown input\(s\) \['z'\]"),
])
def test_bad_inputs_are_rejected_before_native_code(saved, bad, message):
    e = compiler.load(saved)
    called = []
    e._segments = {k: (lambda *a, _f=f: called.append(a) or _f(*a)) for k, f in e._segments.items()}
    with pytest.raises(InputError, match=message):
        e.run(bad)
    assert called == []


def test_non_contiguous_input_is_copied(exe):
    x = np.asfortranarray(feeds()["x"])
    assert not x.flags.c_contiguous
    np.testing.assert_array_equal(exe.run({"x": x})["y"], exe.run({"x": np.ascontiguousarray(x)})["y"])


def test_concurrent_runs_from_8_threads_give_identical_results(saved):
    e = compiler.load(saved)
    inputs = [feeds(s) for s in range(8)]
    want = [e.run(f)["y"] for f in inputs]
    got: list = [None] * 8

    def work(i):
        for _ in range(20):
            r = e.run(inputs[i])["y"]
            assert np.array_equal(r, want[i]), i
        got[i] = r

    errors = run_threads(work, 8)
    assert errors == []
    for i in range(8):
        np.testing.assert_array_equal(got[i], want[i])
    assert 1 <= len(e._arenas) <= 8  # one arena per concurrent caller, reused


FALLBACK = """graph @g(%x: f32[2,3,4]) -> (y: f32[2,3,4], nz: i64[3,?]) {
  %0 = Relu(%x) : f32[2,3,4]
  %1 = NonZero(%0) : i64[3,?]
  %2 = Mul(%0, %x) : f32[2,3,4]
  return y=%2, nz=%1
}"""


def test_fallback_runs_in_the_interpreter_with_a_warning(tmp_path):
    with pytest.warns(FallbackWarning, match="NonZero"):
        e = compiler.compile(parse(FALLBACK), output=str(tmp_path / "fb.kiln"))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    ref = interpret(parse(FALLBACK), {"x": x})
    out = e.run({"x": x})
    np.testing.assert_array_equal(out["y"], ref["y"])
    np.testing.assert_array_equal(out["nz"], ref["nz"])
    assert [f["op"] for f in e.fallback] == ["NonZero"]
    assert "no native lowering for NonZero" in e.fallback[0]["reason"]
    again = compiler.load(str(tmp_path / "fb.kiln")).run({"x": x})  # the IR travels in the artifact
    np.testing.assert_array_equal(again["nz"], ref["nz"])


def test_strict_mode_refuses_and_leaves_no_partial_artifact(tmp_path):
    dest = tmp_path / "strict.kiln"
    with pytest.raises(UnsupportedError, match="NonZero node: no native code"):
        compiler.compile(parse(FALLBACK), output=str(dest), fallback=False)
    assert not dest.exists()
    assert os.listdir(tmp_path) == []


def test_failed_codegen_leaves_no_partial_artifact(tmp_path, monkeypatch):
    from compiler.codegen.llvm import toolchain

    def broken(*a, **k):
        raise toolchain.CodegenError("planted failure")

    monkeypatch.setattr(toolchain, "link_shared", broken)
    with pytest.raises(toolchain.CodegenError, match="planted"):
        compiler.compile(mlp_graph(), output=str(tmp_path / "m.kiln"))
    assert os.listdir(tmp_path) == []


def test_save_replaces_an_artifact_but_not_other_directories(exe, tmp_path):
    target = tmp_path / "m.kiln"
    exe.save(str(target))
    exe.save(str(target))  # replacing an artifact is fine
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.jpg").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="not a Kiln artifact; refusing to replace it"):
        exe.save(str(other))
    assert (other / "a.jpg").exists()


def test_no_native_node_needs_no_library(tmp_path):
    g = parse("""graph @g(%x: f32[4]) -> (nz: i64[1,?]) {
  %0 = NonZero(%x) : i64[1,?]
  return nz=%0
}""")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        e = compiler.compile(g)
    assert "model.so" not in os.listdir(e.path)
    np.testing.assert_array_equal(e.run({"x": np.array([0, 1, 0, 2], np.float32)})["nz"], [[1, 3]])


def test_views_of_inputs_keep_their_shape():
    """An output that is a view of an input, and an interpreted node reading a view of an input."""
    g = parse("""graph @g(%x: f32[2,3,4]) -> (flat: f32[1,24], nz: i64[4,?]) {
  %0 = Flatten(%x) {axis=0} : f32[1,24]
  %a = const i64[1] dense<[0]>
  %1 = Unsqueeze(%x, %a) : f32[1,2,3,4]
  %2 = NonZero(%1) : i64[4,?]
  return flat=%0, nz=%2
}""")
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        out = compiler.compile(g, 0).run({"x": x})
    ref = interpret(g, {"x": x})
    np.testing.assert_array_equal(out["flat"], ref["flat"])
    np.testing.assert_array_equal(out["nz"], ref["nz"])


def test_profiled_build_times_every_kernel(exe):
    """``compile(profile=True)``: the same results, and ``run_timed`` gives each kernel's time of that
    run (zeroed before it: a second run does not add to the first); an artifact built without it says
    so instead of returning zeros."""
    prof = compiler.compile(mlp_graph(), profile=True)
    x = feeds()
    np.testing.assert_array_equal(prof.run(x)["y"], exe.run(x)["y"])
    out, t = prof.run_timed(x)
    np.testing.assert_array_equal(out["y"], exe.run(x)["y"])
    assert len(t.steps) == len(prof.kernels) >= 2 and all(s > 0.0 for s in t.steps)
    assert sum(t.steps) <= t.seconds and t.interpreted == {}
    for _ in range(5):
        _, again = prof.run_timed(x)
        assert sum(again.steps) <= again.seconds  # each run's own times, not a running sum
    with pytest.raises(compiler.errors.KilnError, match="profile=True"):
        exe.run_timed(x)


def test_concurrent_timed_runs_each_time_their_own_run():
    """The times live in each call's arena: threads timing one executable at once (and others calling
    ``run``) each get their run's kernels, within their own call's time, and the right results."""
    import threading

    prof = compiler.compile(mlp_graph(), profile=True)
    x = feeds()
    want = prof.run(x)["y"]
    errors: list = []

    def timed():
        try:
            for _ in range(20):
                out, t = prof.run_timed(x)
                np.testing.assert_array_equal(out["y"], want)
                assert all(s > 0 for s in t.steps) and sum(t.steps) <= t.seconds
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def plain():
        for _ in range(20):
            prof.run(x)

    threads = [threading.Thread(target=f) for f in (timed, timed, timed, plain)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]


def test_input_values_bind_an_input_that_decides_shapes():
    """Axes fed as an input: with its value bound the Reduce runs natively and the model no longer
    takes it; without, the Reduce runs in the interpreter."""
    text = """
    graph @t(%x: f32[2,3,4], %axes: i64[1]) -> (y: f32[?,?]) {
      %0 = ReduceSum(%x, %axes) {keepdims=0} : f32[?,?]
      return y=%0
    }"""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    exe = compiler.compile(parse(text), input_values={"axes": np.array([1])})
    assert exe.fallback == [] and exe.input_names == ["x"]
    np.testing.assert_array_equal(exe.run({"x": x})["y"], x.sum(axis=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        loose = compiler.compile(parse(text))
    assert [f["op"] for f in loose.fallback] == ["ReduceSum"]
    np.testing.assert_array_equal(loose.run({"x": x, "axes": np.array([1])})["y"], x.sum(axis=1))


def test_interpreted_views_of_native_buffers_outlive_them():
    """An interpreted result kept for interpreted readers only (here Reshape's, a view of the Expand
    kernel's buffer) is copied: the memory plan gives that buffer to the next Expand."""
    g = parse("""graph @g(%x: f16[2,8], %y: f16[2,8], %a: i64[2], %b: i64[2]) -> (m: f16[?,?]) {
  %s = const i64[2] dense<[2, 8]>
  %0 = Expand(%x, %s) : f16[2,8]
  %1 = Reshape(%0, %a) : f16[?,?]
  %2 = Expand(%y, %s) : f16[2,8]
  %3 = Reshape(%2, %b) : f16[?,?]
  %4 = MatMul(%1, %3) : f16[?,?]
  return m=%4
}""")
    rng = np.random.default_rng(0)
    feeds = {v: rng.standard_normal((2, 8)).astype(np.float16) for v in ("x", "y")}
    feeds.update(a=np.array([1, 16]), b=np.array([16, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        e = compiler.compile(g, 0)
    # (the case needs native Expands and interpreted Reshapes: the shapes are fed at run time, so the
    # Reshapes' results are not static and run in the interpreter, as views of the Expands' buffers)
    assert [f["op"] for f in e.fallback] == ["Reshape", "Reshape", "MatMul"]
    np.testing.assert_array_equal(e.run(feeds)["m"], interpret(g, feeds)["m"])


def test_the_fast_path_gives_and_checks_what_the_general_one_does(exe):
    assert exe._fast is not None  # one native segment, static inputs, outputs in the arena
    x = feeds(3)["x"]
    want = exe._run_general({"x": x})
    for got in (exe.run({"x": x}), dict(zip(exe.output_names, exe(x)))):
        assert list(got) == exe.output_names
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
            assert got[k].flags.owndata  # a copy, not a view of the arena
    ro = x.copy()
    ro.setflags(write=False)  # no writable buffer: the address comes another way
    np.testing.assert_array_equal(exe.run({"x": ro})["y"], want["y"])
    strided = np.asfortranarray(x)  # not C-contiguous: the general path makes it so
    np.testing.assert_array_equal(exe.run({"x": strided})["y"], want["y"])
    with pytest.raises(InputError, match="element type float64"):
        exe.run({"x": x.astype(np.float64)})
    with pytest.raises(InputError, match="has shape"):
        exe(x[:2])
    with pytest.raises(InputError, match="unknown input"):
        exe.run({"x": x, "z": x})


def test_compiles_collect_garbage_less_often_and_put_the_setting_back(monkeypatch):
    """While a compile runs the collector's young threshold is COMPILE_GC_THRESHOLD; after it, and
    after one that failed, and after compiles on four threads at once, it is what it was."""
    import gc

    from compiler import driver

    before = gc.get_threshold()
    seen = []
    real = driver.build_program

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold()[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "build_program", spy)
    compiler.compile(mlp_graph())
    with pytest.raises(Exception):
        compiler.compile("no-such-model.onnx")
    assert not run_threads(lambda i: compiler.compile(mlp_graph()), 4)
    assert len(seen) == 5 and all(t == max(before[0], driver.COMPILE_GC_THRESHOLD) for t in seen)
    assert gc.get_threshold() == before
