"""Tampering with a compiled artifact (``model.kiln``, see compiler/runtime/artifact.py) for the
malformed-file fuzzer (``mutate.py``): files flipped, truncated, deleted, swapped, or replaced by
/dev/zero, a FIFO, a directory or a symlink; the manifest replaced (100,000 deep, empty, garbage) or
edited with its checksums rewritten, as a forger would: keys removed, input dtypes and shapes, the
arena size, the symbol a plan step calls, ``files`` paths outside the artifact, output places, the
format version, the target; the weights shortened; another model's library and weights."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat


def safe_copy(src: str, dst: str) -> None:
    """Copy a (possibly tampered) directory without opening FIFOs or following symlinks."""
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        s, t = os.path.join(src, name), os.path.join(dst, name)
        st = os.lstat(s)
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(s), t)
        elif stat.S_ISFIFO(st.st_mode):
            os.mkfifo(t)
        elif stat.S_ISDIR(st.st_mode):
            safe_copy(s, t)
        elif stat.S_ISREG(st.st_mode):
            shutil.copy2(s, t)


def _rewrite(d: str, manifest: dict) -> None:
    """Write ``manifest`` with its files' checksums and its own digest recomputed (a forger's work)."""
    files = {}
    for name in manifest.get("files", {}) if isinstance(manifest.get("files"), dict) else {}:
        p = os.path.join(d, name)
        try:
            files[name] = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else "0" * 64
        except OSError:
            files[name] = "0" * 64
    if "files" in manifest and isinstance(manifest["files"], dict):
        manifest["files"] = files
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    manifest["manifest_sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def _replace(path: str, how: str) -> None:
    os.remove(path)
    if how == "devzero":
        os.symlink("/dev/zero", path)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "directory":
        os.mkdir(path)
    elif how == "passwd":
        os.symlink("/etc/passwd", path)


def tamper(rng, d: str, other: str) -> tuple[str, bool, bool]:
    """Tamper with the artifact in ``d`` (``other``: another artifact); (about, refuse, feeds_by_manifest)."""
    files = ["weights.bin", "model.so", "model.kir", "manifest.json"]
    files = [f for f in files if os.path.exists(os.path.join(d, f))]
    f = files[int(rng.integers(len(files)))]
    p = os.path.join(d, f)
    kind = int(rng.integers(8))
    if kind == 0:
        b = bytearray(open(p, "rb").read())
        if b:
            b[int(rng.integers(len(b)))] ^= 0x40
        open(p, "wb").write(b)
        return f"{f}: a byte flipped", False, False
    if kind == 1:
        how = ["truncate", "delete", "devzero", "fifo", "directory", "passwd"][int(rng.integers(6))]
        if how == "truncate":
            os.truncate(p, os.path.getsize(p) // 2)
        elif how == "delete":
            os.remove(p)
        else:
            _replace(p, how)
        return f"{f}: {how}", False, False
    if kind == 2:
        a, b = os.path.join(d, "weights.bin"), os.path.join(d, "model.so")
        if os.path.exists(b):
            os.rename(a, a + ".x"), os.rename(b, a), os.rename(a + ".x", b)
            return "weights.bin and model.so swapped", False, False
        shutil.copy2(os.path.join(other, "weights.bin"), a)
        return "weights.bin from another artifact", False, False
    mp = os.path.join(d, "manifest.json")
    if kind == 3:
        body = [b"[" * 100000 + b"]" * 100000, b"{}", b"null", b"", b"\x00\xff" * 50,
                b'{"format": "kiln-artifact", "format_version": 1}'][int(rng.integers(6))]
        open(mp, "wb").write(body)
        return f"manifest.json replaced ({body[:20]!r}...)", False, False
    man = json.load(open(mp))
    if kind == 4:  # a key removed, checksums rewritten
        key = ["plan", "inputs", "outputs", "memory", "target", "files", "fallback", "format_version",
               "kernels", "model"][int(rng.integers(10))]
        man.pop(key, None)
        _rewrite(d, man)
        return f"manifest without {key!r} (checksums rewritten)", False, False
    if kind == 5:  # a field changed, checksums rewritten
        field = int(rng.integers(9))
        if field == 0 and man.get("inputs"):
            man["inputs"][0]["dtype"] = str(rng.choice(["f99", "", "object", "<U1"]))
            about, refuse = f"input dtype {man['inputs'][0]['dtype']!r}", False
        elif field == 1 and man.get("inputs") and man["inputs"][0].get("shape"):
            man["inputs"][0]["shape"] = [s * 2 + 1 for s in man["inputs"][0]["shape"]]
            _rewrite(d, man)
            return "input shape disagrees with the plan (checksums rewritten)", True, True
        elif field == 2:
            man["memory"]["arena_bytes"] = int(rng.choice([0, -1, 1, 1 << 62]))
            about, refuse = f"arena_bytes {man['memory']['arena_bytes']}", True
        elif field == 3 and any("native" in s for s in man["plan"]):
            step = next(s for s in man["plan"] if "native" in s)
            step["native"] = str(rng.choice(["abort", "_exit", "puts", "kiln_nope", "../x"]))
            about, refuse = f"plan calls {step['native']!r}", True
        elif field == 4:
            man.setdefault("files", {})[str(rng.choice(["../../../../etc/passwd", "/etc/hostname"]))] = ""
            about, refuse = "files lists a path outside the artifact", True
        elif field == 5 and man.get("outputs"):
            o = man["outputs"][0]
            if o.get("place") and o["place"][0] == "arena":
                o["place"][1] = int(rng.choice([1 << 40, -64]))
            o["shape"] = [1 << 20] * len(o.get("shape", [1]))
            about, refuse = "output place/shape out of the arena", True
        elif field == 6:
            man["format_version"] = [0, "1", 1.5, None, 1, 3][int(rng.integers(6))]
            about, refuse = f"format_version {man['format_version']!r}", False
        elif field == 7:
            man["target"] = [{"isa": []}, "x", {"isa": "avx2", "triple": 5, "cpu": None}][int(rng.integers(3))]
            about, refuse = f"target {man['target']!r}", False
        else:
            man["model"] = "renamed"
            about, refuse = "model renamed", False
        _rewrite(d, man)
        return about + " (checksums rewritten)", refuse, False
    if kind == 6:  # the weights resized, checksums rewritten
        w = os.path.join(d, "weights.bin")
        size = os.path.getsize(w)
        os.truncate(w, max(0, size - int(rng.choice([64, 4, size]))))
        _rewrite(d, man)
        if size == 0:  # a model without weights: nothing to shorten, nothing changed
            return "weights.bin empty, left as it is (checksums rewritten)", False, False
        return "weights.bin shorter than the plan (checksums rewritten)", True, False
    for name in ("model.so", "weights.bin"):  # another artifact's files, checksums rewritten
        if os.path.exists(os.path.join(other, name)):
            shutil.copy2(os.path.join(other, name), os.path.join(d, name))
    _rewrite(d, man)
    return "model.so and weights.bin of another model (checksums rewritten)", False, False
