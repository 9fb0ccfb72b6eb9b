"""kiln compile / run / inspect on hostile input (issue 21): directories that are not artifacts, tampered
artifacts, .npz inputs, and two `kiln compile` processes writing one -o. Every failure is one
`kiln: error:` line, never a traceback or a hang."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from compiler.tools.cli import main
from compiler.ir.parser import parse
from compiler.ir.printer import save_text
from compiler.runtime.artifact import MANIFEST, _manifest_digest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = """graph @small(%x: f32[2,8]) -> (y: f32[2,8]) {
  %0 = Relu(%x) : f32[2,8]
  return y=%0
}"""
X = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "small.kir"
    save_text(parse(TEXT), str(path))
    return str(path)


@pytest.fixture(scope="module")
def built(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("a") / "small.kiln")
    assert main(["compile", model, "-o", out]) == 0
    return out


def error_of(argv, capsys) -> str:
    """The one error line `kiln` prints (exit status 1)."""
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("kiln: error: ") and "Traceback" not in err, err
    return err


def test_a_directory_that_is_not_an_artifact(tmp_path, capsys):
    d = tmp_path / "photos"
    d.mkdir()
    (d / "a.jpg").write_bytes(b"x")
    for argv in (["run", str(d)], ["run", str(d), "--interpret"], ["compile", str(d), "-o", str(tmp_path / "x.kiln")]):
        err = error_of(argv, capsys)
        assert f"{d} is a directory but not a Kiln artifact (it has no manifest.json)" in err
    assert sorted(os.listdir(tmp_path)) == ["photos"]


def test_compiling_an_artifact_says_to_run_it(built, tmp_path, capsys):
    err = error_of(["compile", built, "-o", str(tmp_path / "x.kiln")], capsys)
    assert "is a compiled Kiln artifact, not a model" in err and "kiln run" in err


def _tampered(built, tmp_path, how):
    import shutil

    dst = str(tmp_path / "t.kiln")
    shutil.copytree(built, dst)
    how(dst)
    return dst


def _fifo_weights(d):
    os.unlink(os.path.join(d, "weights.bin"))
    os.mkfifo(os.path.join(d, "weights.bin"))


def _deep_manifest(d):
    with open(os.path.join(d, MANIFEST), "w") as f:
        f.write("[" * 100_000 + "]" * 100_000)


def _resigned(change):
    def how(d):
        mp = os.path.join(d, MANIFEST)
        m = json.load(open(mp))
        change(m)
        m["manifest_sha256"] = _manifest_digest(m)
        json.dump(m, open(mp, "w"))
    return how


@pytest.mark.parametrize("how, message", [
    (_fifo_weights, "weights.bin is a FIFO, not a regular file"),
    (_deep_manifest, "nested too deeply"),
    (_resigned(lambda m: m.pop("kernels")), "manifest field kernels: missing"),
    (_resigned(lambda m: m["inputs"][0].update(dtype="q7")), r"inputs[0].dtype: unknown element type 'q7'"),
    (_resigned(lambda m: m["files"].update({"../../etc/passwd": "0" * 64})), "is not a file name inside the artifact"),
    (_resigned(lambda m: m["memory"].update(arena_bytes=-1)), "memory.arena_bytes: -1 is out of range"),
], ids=["fifo", "deep-json", "missing-key", "unknown-dtype", "path-escape", "negative-arena"])
def test_tampered_artifacts_are_refused_by_run_and_inspect(built, tmp_path, capsys, how, message):
    dst = _tampered(built, tmp_path, how)
    for argv in (["run", dst], ["inspect", dst]):
        assert message in error_of(argv, capsys)


def test_npz_inputs(built, tmp_path, capsys):
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    np.savez(one, data=X)
    np.savez(two, a=X, b=X)
    out = tmp_path / "o.npz"
    assert main(["run", built, "--input", f"x={one}", "--output", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out)["y"], np.maximum(X, 0))
    assert main(["run", built, "--input", f"x={two}:b", "--output", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out)["y"], np.maximum(X, 0))
    err = error_of(["run", built, "--input", f"x={two}"], capsys)
    assert f"input 'x': {two} holds 2 arrays (a, b); name one with --input x={two}:KEY" in err
    err = error_of(["run", built, "--input", f"x={two}:c"], capsys)
    assert f"{two} has no array 'c' (it holds a, b)" in err
    np.save(tmp_path / "x.npy", X)
    err = error_of(["run", built, "--input", f"x={tmp_path / 'missing.npz'}"], capsys)
    assert "cannot read input 'x'" in err


def test_two_kiln_compile_processes_writing_one_output(model, tmp_path):
    out = str(tmp_path / "m.kiln")
    cmd = [sys.executable, "-m", "compiler.tools.cli", "compile", model, "-o", out]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(300), p.stderr.read()) for p in procs]
    for rc, err in results:
        # the artifacts are equal here, so both normally succeed; a loser reloading while the winner
        # swaps may get a clear error from compile's reload (see test_artifact_hostile), never a traceback
        assert rc == 0 or (rc == 1 and err.startswith("kiln: error: ")), err
        assert "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["m.kiln"]
    assert main(["run", out, "--input", f"x={_save(tmp_path / 'x.npy')}"]) == 0


def _save(path):
    np.save(path, X)
    return path
