"""Hostile and racing artifacts (issue 21): a library rebuilt at the same path runs its new code; the
bytes checksummed are the bytes loaded; only regular files inside the artifact are opened; every
manifest field is validated (types, ranges, names, and against itself) before any native call; a
symbol is resolved only in the artifact's own library; writers racing for one path leave one
complete artifact and no debris."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import stat
import threading
import warnings

import numpy as np
import pytest

import compiler
from compiler.driver import FallbackWarning
from compiler.ir.parser import parse
from compiler.runtime import artifact
from compiler.runtime.artifact import MANIFEST, ArtifactDir, ArtifactError, _manifest_digest, library_function

from .test_executable import feeds, mlp_graph

UNARY = """graph @g(%x: f32[4]) -> (y: f32[4]) {{
  %0 = {op}(%x) : f32[4]
  return y=%0
}}"""
X = np.array([1, -2, 3, -4], np.float32)

MIXED = """graph @g(%x: f32[2,3,4]) -> (flat: f32[1,24], nz: i64[4,?], r: f32[2,3,4]) {
  %0 = Flatten(%x) {axis=0} : f32[1,24]
  %a = const i64[1] dense<[0]>
  %1 = Unsqueeze(%x, %a) : f32[1,2,3,4]
  %2 = NonZero(%1) : i64[4,?]
  %3 = Relu(%x) : f32[2,3,4]
  %4 = Exp(%3) : f32[2,3,4]
  return flat=%0, nz=%2, r=%4
}"""


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mlp") / "mlp.kiln")
    compiler.compile(mlp_graph(), output=path)
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Native segments and an interpreted node between them."""
    path = str(tmp_path_factory.mktemp("mixed") / "mixed.kiln")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        compiler.compile(parse(MIXED), 0, output=path)
    return path


def _copy(src, tmp_path, name="copy.kiln"):
    dst = str(tmp_path / name)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _edit(path, change):
    """Rewrite the manifest as a tamperer would: checksums recomputed."""
    mp = os.path.join(path, MANIFEST)
    m = json.load(open(mp))
    change(m)
    m["manifest_sha256"] = _manifest_digest(m)
    with open(mp, "w") as f:
        json.dump(m, f)


def _rehash(path, name):
    digest = artifact.sha256_file(os.path.join(path, name))
    _edit(path, lambda m: m["files"].__setitem__(name, digest))


def _load_error(path, seconds=60) -> BaseException:
    """What ``compiler.load`` raises, from a thread that must finish: a hang is a failure."""
    box = []

    def go():
        try:
            compiler.load(path)
            box.append(None)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            box.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"compiler.load({path}) hangs"
    return box[0]


def refused(path, match):
    err = _load_error(path)
    assert isinstance(err, ArtifactError), f"expected ArtifactError, got {err!r}"
    assert err.args and __import__("re").search(match, str(err)), str(err)
    return err


# -- defect: a rebuilt library at the same path ran the old code ------------------------------------------

def test_recompiling_to_the_same_path_runs_the_new_code(tmp_path):
    p = str(tmp_path / "m.kiln")
    relu = compiler.compile(parse(UNARY.format(op="Relu")), output=p)
    np.testing.assert_array_equal(relu.run({"x": X})["y"], np.maximum(X, 0))
    neg = compiler.compile(parse(UNARY.format(op="Neg")), output=p)
    np.testing.assert_array_equal(neg.run({"x": X})["y"], -X)
    np.testing.assert_array_equal(compiler.load(p).run({"x": X})["y"], -X)
    np.testing.assert_array_equal(relu.run({"x": X})["y"], np.maximum(X, 0))  # the first still runs its own


def test_library_is_loaded_from_a_private_copy_that_is_gone(mlp):
    exe = compiler.load(mlp)
    name = exe._lib._name
    assert not name.startswith(os.path.abspath(mlp)) and not os.path.exists(name)
    assert os.path.basename(name).startswith(f".kiln-{os.getpid()}-")
    other = compiler.load(mlp)
    assert other._lib._name != name


def test_the_bytes_checksummed_are_the_bytes_loaded(mlp, tmp_path, monkeypatch):
    """model.so swapped for another valid library after the manifest is read: refused, not run."""
    dst = _copy(mlp, tmp_path)
    other = str(tmp_path / "other.kiln")
    compiler.compile(parse(UNARY.format(op="Neg")), output=other)
    from compiler.runtime import executable

    real = executable.read_manifest

    def read_then_swap(d, check_files=True):
        m = real(d, check_files=True)  # every checksum matches at this point
        shutil.copy(os.path.join(other, "model.so"), os.path.join(dst, "model.so"))
        return m

    monkeypatch.setattr(executable, "read_manifest", read_then_swap)
    refused(dst, "model.so does not match its checksum")


def test_toolchain_load_library_sees_a_rebuilt_library(tmp_path):
    from compiler.codegen.llvm.toolchain import build_library, load_library

    path = tmp_path / "lib.so"
    results = []
    for value in (1, 2):
        build_library([f"define i32 @answer() {{\n  ret i32 {value}\n}}\n"], path)
        results.append(load_library(path).answer())
    assert results == [1, 2]


# -- only regular files inside the artifact -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["weights.bin", "model.so"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory", "link-outside"])
def test_special_files_are_refused_without_hanging(mlp, tmp_path, name, kind):
    dst = _copy(mlp, tmp_path)
    p = os.path.join(dst, name)
    os.unlink(p)
    if kind == "fifo":
        os.mkfifo(p)
        match = f"{name} is a FIFO, not a regular file"
    elif kind == "dev-zero-link":
        os.symlink("/dev/zero", p)
        match = f"{name} is a symbolic link"
    elif kind == "directory":
        os.mkdir(p)
        match = f"{name} is a directory, not a regular file"
    else:  # a link to an identical file outside: the checksum would match, the link is still refused
        shutil.copy(os.path.join(mlp, name), tmp_path / "outside")
        os.symlink(tmp_path / "outside", p)
        match = f"{name} is a symbolic link"
    refused(dst, match)


def test_a_character_device_is_refused(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)
    p = os.path.join(dst, "weights.bin")
    os.unlink(p)
    try:
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero
    except PermissionError:
        pytest.skip("creating a device node needs privileges")
    refused(dst, "weights.bin is a character device")


def test_manifest_that_is_not_a_regular_file(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)
    os.unlink(os.path.join(dst, MANIFEST))
    os.mkfifo(os.path.join(dst, MANIFEST))
    refused(dst, "manifest.json is a FIFO")


def test_missing_file_is_refused(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)
    os.unlink(os.path.join(dst, "model.kir"))
    refused(dst, "incomplete: model.kir is missing")


def test_deep_and_huge_manifests(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)
    mp = os.path.join(dst, MANIFEST)
    with open(mp, "w") as f:
        f.write("[" * 100_000 + "]" * 100_000)
    refused(dst, "nested too deeply")
    with open(mp, "w") as f:  # deep enough to pass the JSON parser, not the schema
        f.write('{"format": "kiln-artifact", "x": ' + "[" * 500 + "]" * 500 + "}")
    refused(dst, "nested too deeply")
    with open(mp, "wb") as f:  # sparse: nothing is read
        f.truncate(artifact.MAX_MANIFEST_BYTES + 1)
    refused(dst, "manifest.json is .* bytes, more than")
    with open(mp, "wb") as f:
        f.write(b"\xff\xfe{")
    refused(dst, "not readable JSON")


# -- the manifest's schema ----------------------------------------------------------------------------------

SCHEMA_CASES = {
    "missing memory": (lambda m: m.pop("memory"), "manifest field memory: missing"),
    "missing inputs": (lambda m: m.pop("inputs"), "manifest field inputs: missing"),
    "missing target isa": (lambda m: m["target"].pop("isa"), r"target\.isa: missing"),
    "target not an object": (lambda m: m.__setitem__("target", "x86"), "target: expected an object"),
    "unknown dtype": (lambda m: m["inputs"][0].__setitem__("dtype", "f33"), r"inputs\[0\]\.dtype: unknown element"),
    "shape not a list": (lambda m: m["inputs"][0].__setitem__("shape", 4), r"inputs\[0\]\.shape: expected a list"),
    "negative dim": (lambda m: m["inputs"][0].__setitem__("shape", [-4, 64]), r"inputs\[0\]\.shape\[0\]"),
    "shape disagrees with type": (lambda m: m["inputs"][0].__setitem__("shape", [1, 64]),
                                  r"inputs\[0\]\.shape: f32\[1, 64\] disagrees with the type"),
    "arena as a string": (lambda m: m["memory"].__setitem__("arena_bytes", "4096"), "arena_bytes: expected an integer"),
    "arena as a bool": (lambda m: m["memory"].__setitem__("arena_bytes", True), "arena_bytes: expected an integer"),
    "arena zero": (lambda m: m["memory"].__setitem__("arena_bytes", 0), "arena_bytes: 0 is less than the lower bound"),
    "arena negative": (lambda m: m["memory"].__setitem__("arena_bytes", -64), r"arena_bytes: -64 is out of range"),
    "arena absurd": (lambda m: m["memory"].__setitem__("arena_bytes", 1 << 60), "more than this machine's memory"),
    "output past the arena": (lambda m: m["outputs"][0].__setitem__("place", ["arena", 1 << 20]),
                              r"outputs\[0\]\.place: 160 bytes at offset 1048576 run past the arena"),
    "output in another memory": (lambda m: m["outputs"][0].__setitem__("place", ["heap", 0]),
                                 r"outputs\[0\]\.place: expected \[kind, offset\]"),
    "output from no step": (lambda m: m["outputs"][0].update(place=["python", 0], key="%9:0"),
                            r"outputs\[0\]\.key: no step computes"),
    "symbol of libc": (lambda m: m["plan"].__setitem__(0, {"native": "abort"}),
                       r"plan\[0\]\.native: 'abort' is not a forward function"),
    "symbol twice": (lambda m: m["plan"].append({"native": "kiln_forward"}), r"plan\[1\]\.native"),
    "step of neither kind": (lambda m: m["plan"].append({"python": 1}), r"plan\[1\]: a step is either"),
    "status record past the arena": (lambda m: m.__setitem__("status_offset", m["memory"]["arena_bytes"]),
                                     "status_offset: the status record"),
    "kernel scratch past the arena": (lambda m: m["kernels"][0].__setitem__("scratch_bytes", 1 << 40),
                                      r"kernels\[0\]\.scratch_bytes"),
    "files as a list": (lambda m: m.__setitem__("files", ["model.so"]), "files: expected an object"),
    "no library listed": (lambda m: m["files"].pop("model.so"), "files: does not list model.so"),
    "bad digest": (lambda m: m["files"].__setitem__("model.so", "0" * 63), r"files\.model\.so: expected a SHA-256"),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_every_manifest_field_is_validated(mlp, tmp_path, case):
    change, match = SCHEMA_CASES[case]
    dst = _copy(mlp, tmp_path)
    _edit(dst, change)
    refused(dst, match)
    with pytest.raises(ArtifactError, match=match):  # kiln inspect reads the same way
        artifact.read_manifest(dst)


@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", "sub/file", ".hidden", "..", ""])
def test_file_names_outside_the_artifact_are_never_opened(mlp, tmp_path, monkeypatch, name):
    (tmp_path / "outside").write_bytes(b"secret")
    dst = _copy(mlp, tmp_path)
    _edit(dst, lambda m: m["files"].__setitem__(name, artifact.sha256_file(str(tmp_path / "outside"))))
    opened = []
    real = ArtifactDir.open

    def spy(self, member):
        opened.append(member)
        return real(self, member)

    monkeypatch.setattr(ArtifactDir, "open", spy)
    refused(dst, "manifest field files: .* is not a file name inside the artifact")
    assert opened == [MANIFEST]  # nothing but the manifest was read
    with pytest.raises(ArtifactError, match="refusing to open"):  # and the reader refuses such names itself
        with ArtifactDir(dst) as d:
            d.verify(name or "..", "0" * 64)


def test_weights_size_must_match_the_manifest(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)
    _edit(dst, lambda m: m["memory"].__setitem__("weights_bytes", m["memory"]["weights_bytes"] - 64))
    refused(dst, r"weights.bin is \d+ bytes, the manifest says \d+ \(memory.weights_bytes\)")
    dst = _copy(mlp, tmp_path, "truncated.kiln")
    with open(os.path.join(dst, "weights.bin"), "r+b") as f:
        f.truncate(64)
    _rehash(dst, "weights.bin")
    refused(dst, r"weights.bin is 64 bytes, the manifest says")


def test_a_manifest_rewritten_consistently_with_shortened_weights_is_refused(mlp, tmp_path):
    """weights.bin shortened, weights_bytes and the checksums rewritten to match: everything agrees
    except the library, which records the layout its code was compiled for."""
    dst = _copy(mlp, tmp_path)
    size = os.path.getsize(os.path.join(dst, "weights.bin"))
    with open(os.path.join(dst, "weights.bin"), "r+b") as f:
        f.truncate(64)
    _rehash(dst, "weights.bin")
    _edit(dst, lambda m: m["memory"].__setitem__("weights_bytes", 64))
    refused(dst, rf"manifest field memory.weights_bytes: 64, but model.so was compiled for {size}")


def test_the_manifest_must_describe_the_layout_the_library_was_compiled_for(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)  # a larger arena passes every other check
    _edit(dst, lambda m: m["memory"].__setitem__("arena_bytes", m["memory"]["arena_bytes"] + 64))
    refused(dst, r"manifest field memory.arena_bytes: \d+, but model.so was compiled for \d+")
    dst = _copy(mlp, tmp_path, "shape.kiln")
    _edit(dst, lambda m: m["inputs"][0].__setitem__("shape", [2 * d for d in m["inputs"][0]["shape"]]))
    refused(dst, r"manifest field")  # the plan's checks or the layout's


def test_a_missing_symbol_is_refused(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)
    _edit(dst, lambda m: m["plan"].__setitem__(0, {"native": "kiln_segment_7"}))
    refused(dst, r"manifest field plan: \['kiln_segment_7'\], but model.so was compiled for \['kiln_forward'\]")
    lib = compiler.load(mlp)._lib  # and when looked up (a library with no such function)
    with pytest.raises(ArtifactError, match="has no function 'kiln_segment_7'"):
        library_function(lib, "kiln_segment_7")


def test_symbols_resolve_only_in_the_artifacts_own_library(mlp):
    lib = compiler.load(mlp)._lib
    assert library_function(lib, "kiln_forward") is not None
    with pytest.raises(ArtifactError, match="does not define 'abort' itself"):
        library_function(lib, "abort")  # dlsym on the handle finds libc's: refused


MIXED_CASES = {
    "buffer past the arena": (lambda m: _fallback(m)["outputs"].__setitem__(0, ["buffer", ["arena", 1 << 20], "i64",
                                                                              [4, 2]]),
                              r"plan\[1\]\.outputs\[0\]\.place: .* run past the arena"),
    "result written into an input": (lambda m: _fallback(m)["outputs"].__setitem__(0, ["buffer", ["input", 0],
                                                                                     "f32", [24]]),
                                     r"plan\[1\]\.outputs\[0\]\.place: expected \[kind, offset\] with kind one of arena"),
    "input view of another size": (lambda m: _fallback(m)["inputs"][0].__setitem__(3, [1, 2, 3, 5]),
                                   r"plan\[1\]\.inputs\[0\]: f32\[1, 2, 3, 5\] is not a view of input 0"),
    "input out of range": (lambda m: _fallback(m)["inputs"].__setitem__(0, ["input", 3]),
                           r"plan\[1\]\.inputs\[0\]\[1\]: 3 is out of range"),
    "read before written": (lambda m: _fallback(m)["inputs"].__setitem__(0, ["python", "%1:0"]),
                            r"plan\[1\]\.inputs\[0\]: reads '%1:0' before any step computes it"),
    "node out of range": (lambda m: _fallback(m).__setitem__("fallback", 99), r"plan\[1\]\.fallback: node 99"),
    "node of another op": (lambda m: _fallback(m).__setitem__("op", "Relu"), r"plan\[1\]\.op: 'Relu', but node"),
    "operand count": (lambda m: _fallback(m)["inputs"].append(None), r"plan\[1\]: 2 operand\(s\)"),
}


def _fallback(m):
    return next(s for s in m["plan"] if "fallback" in s)


@pytest.mark.parametrize("case", sorted(MIXED_CASES))
def test_interpreted_steps_are_checked_against_the_plan_and_the_ir(mixed, tmp_path, case):
    change, match = MIXED_CASES[case]
    dst = _copy(mixed, tmp_path)
    _edit(dst, change)
    refused(dst, match)


def test_the_untampered_artifacts_still_load_and_run(mlp, mixed):
    out = compiler.load(mlp).run(feeds())
    assert out["y"].shape == (4, 10)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 5
    got = compiler.load(mixed).run({"x": x})
    np.testing.assert_allclose(got["r"], np.exp(np.maximum(x, 0)), rtol=1e-6)
    assert got["nz"].shape[0] == 4


def test_save_copies_only_verified_files(mlp, tmp_path):
    dst = _copy(mlp, tmp_path)
    exe = compiler.load(dst)
    (tmp_path / "copy.kiln" / "extra.txt").write_text("not part of the artifact")
    saved = exe.save(str(tmp_path / "saved.kiln"))
    assert sorted(os.listdir(saved)) == ["manifest.json", "model.kir", "model.so", "weights.bin"]
    with open(os.path.join(dst, "weights.bin"), "r+b") as f:
        f.write(b"\x01")
    with pytest.raises(ArtifactError, match="weights.bin does not match its checksum"):
        exe.save(str(tmp_path / "again.kiln"))
    assert sorted(os.listdir(tmp_path)) == ["copy.kiln", "saved.kiln"]


# -- writers racing for one path ----------------------------------------------------------------------------

def _debris(parent, keep):
    return sorted(n for n in os.listdir(parent) if n not in keep)


def _stage_many(dest, rounds, barrier):
    """A writer: ``rounds`` artifacts (a manifest and one file naming the writer) staged into ``dest``."""
    barrier.wait()
    for r in range(rounds):
        with artifact.staging(dest) as tmp:
            with open(os.path.join(tmp, "model.kir"), "w") as f:
                f.write(f"{os.getpid()} {r}\n" * 1000)
            with open(os.path.join(tmp, MANIFEST), "w") as f:
                json.dump({"writer": os.getpid(), "round": r}, f)


def test_concurrent_writers_leave_one_complete_artifact_and_no_debris(tmp_path):
    dest = str(tmp_path / "m.kiln")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_stage_many, args=(dest, 25, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert _debris(tmp_path, {"m.kiln"}) == []
    m = json.load(open(os.path.join(dest, MANIFEST)))
    assert open(os.path.join(dest, "model.kir")).read() == f"{m['writer']} {m['round']}\n" * 1000


def _together(barrier):
    """Make this process reach the final swap together with the others."""
    real = artifact._locked

    def together(path):
        barrier.wait()
        return real(path)

    artifact._locked = together


def _write_at(dest, op, barrier):
    """A process writing a compiled artifact (``driver.write_artifact``: native code, weights, IR, manifest)."""
    from compiler.codegen.llvm.target import host_target
    from compiler.codegen.program import build_program
    from compiler.driver import write_artifact

    _together(barrier)
    write_artifact(build_program(parse(UNARY.format(op=op)), host_target()), dest, host_target())


def _compile_at(dest, op, barrier):
    _together(barrier)
    y = compiler.compile(parse(UNARY.format(op=op)), output=dest).run({"x": X})["y"]
    assert np.array_equal(y, np.maximum(X, 0) if op == "Relu" else -X), f"{op} ran another model's code: {y}"


def _race(target, dest):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=target, args=(dest, op, barrier)) for op in ("Relu", "Neg")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    return [p.exitcode for p in procs]


def test_two_processes_writing_one_path(tmp_path):
    dest = str(tmp_path / "m.kiln")
    compiler.compile(parse(UNARY.format(op="Abs")), output=dest)  # an older artifact to replace
    assert _race(_write_at, dest) == [0, 0]
    assert _debris(tmp_path, {"m.kiln"}) == []
    y = compiler.load(dest).run({"x": X})["y"]
    assert np.array_equal(y, np.maximum(X, 0)) or np.array_equal(y, -X)


def test_two_processes_compiling_to_one_path_each_run_their_own_model(tmp_path):
    dest = str(tmp_path / "m.kiln")
    compiler.compile(parse(UNARY.format(op="Abs")), output=dest)
    assert _race(_compile_at, dest) == [0, 0]
    assert _debris(tmp_path, {"m.kiln"}) == []


def test_a_failed_swap_keeps_the_old_artifact_and_leaves_nothing(mlp, tmp_path, monkeypatch):
    dest = str(tmp_path / "m.kiln")
    compiler.compile(parse(UNARY.format(op="Relu")), output=dest)

    def fail(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(artifact, "_exchange", fail)
    with pytest.raises(ArtifactError, match="cannot write .*No space left"):
        compiler.compile(parse(UNARY.format(op="Neg")), output=dest)
    assert _debris(tmp_path, {"m.kiln"}) == []
    np.testing.assert_array_equal(compiler.load(dest).run({"x": X})["y"], np.maximum(X, 0))


def test_a_failed_compile_leaves_no_artifact_and_no_lock(tmp_path, monkeypatch):
    from compiler import driver

    def fail(directory, manifest):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(driver, "finish_manifest", fail)  # after the library and weights are written
    with pytest.raises(OSError, match="Input/output"):
        compiler.compile(parse(UNARY.format(op="Relu")), output=str(tmp_path / "m.kiln"))
    assert os.listdir(tmp_path) == []
