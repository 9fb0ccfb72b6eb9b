"""Compiled artifacts: a directory holding everything needed to run a model, and nothing to compile.

::

    model.kiln/
      manifest.json   format and Kiln version, target CPU and features, input/output signature,
                      the step plan, kernels, memory sizes, and a SHA-256 of every other file
      model.so        the native code: every kernel and the forward function(s)
      weights.bin     the weights native code reads (64-byte aligned; memory-mapped on load)
      model.kir       the final IR, as text (what ``kiln inspect`` shows)
      model.kir.npz   the large constants of that IR, only when some nodes run in the interpreter

``write_artifact`` builds the directory under a temporary name beside the destination and renames it
into place only when complete, so a failed compile leaves nothing behind. ``read_manifest``
verifies format version, checksums and CPU features before anything is loaded.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from typing import Any

from ..errors import KilnError

FORMAT = "kiln-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
IR_TEXT = "model.kir"


class ArtifactError(KilnError):
    """An artifact that cannot be loaded here: missing, corrupt, tampered, newer, or for another CPU."""


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _manifest_digest(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def finish_manifest(directory: str, manifest: dict) -> dict:
    """Record the checksum of every file in ``directory`` (but the manifest) and of the manifest."""
    manifest = dict(manifest)
    manifest["files"] = {name: sha256_file(os.path.join(directory, name))
                         for name in sorted(os.listdir(directory)) if name != MANIFEST}
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return manifest


class staging:
    """``with staging(dest) as tmp:`` build the artifact in ``tmp``; on success it becomes ``dest``
    (replacing an older artifact there), on any error ``tmp`` is removed and ``dest`` is untouched."""

    def __init__(self, dest: str):
        self.dest = os.path.abspath(os.fspath(dest))
        parent = os.path.dirname(self.dest) or "."
        if not os.path.isdir(parent):
            raise ArtifactError(f"cannot write {dest}: directory {parent} does not exist")
        if os.path.exists(self.dest) and not os.path.exists(os.path.join(self.dest, MANIFEST)):
            raise ArtifactError(f"{dest} exists and is not a Kiln artifact; refusing to replace it")
        self.parent = parent

    def __enter__(self) -> str:
        self.tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(self.dest)}.", suffix=".partial", dir=self.parent)
        return self.tmp

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        old = None
        if os.path.exists(self.dest):
            old = self.tmp + ".old"
            os.rename(self.dest, old)
        os.rename(self.tmp, self.dest)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return False


def read_manifest(directory: str, check_files: bool = True) -> dict[str, Any]:
    """The verified manifest of the artifact in ``directory`` (see ``ArtifactError``)."""
    from ..codegen.llvm.target import host_target

    directory = os.fspath(directory)
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise ArtifactError(f"no artifact at {directory}" + (" (a file: Kiln artifacts are directories)"
                                                             if os.path.exists(directory) else ""))
    if not os.path.exists(path):
        raise ArtifactError(f"{directory} is not a Kiln artifact: it has no {MANIFEST}")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not a Kiln artifact manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ArtifactError(f"{directory} has artifact format version {version!r}, newer than this Kiln "
                            f"({manifest.get('kiln_version', '?')} wrote it) reads (up to {FORMAT_VERSION}); "
                            f"upgrade Kiln or recompile the model")
    if manifest.get("manifest_sha256") != _manifest_digest(manifest):
        raise ArtifactError(f"{path} was modified after the artifact was written (its checksum does not match)")
    host = host_target()
    need = set(manifest["target"]["isa"])
    missing = sorted(need - set(host.isa))
    if missing:
        raise ArtifactError(f"{directory} was compiled for CPU {manifest['target']['cpu']!r} with "
                            f"{', '.join(missing)}, which this CPU ({host.cpu}) lacks; recompile it here "
                            f"(or compile with a target this CPU supports)")
    if manifest["target"]["triple"].split("-")[0] != host.triple.split("-")[0]:
        raise ArtifactError(f"{directory} was compiled for {manifest['target']['triple']}, this machine is "
                            f"{host.triple}")
    if check_files:
        for name, digest in manifest.get("files", {}).items():
            fp = os.path.join(directory, name)
            if not os.path.exists(fp):
                raise ArtifactError(f"{directory} is incomplete: {name} is missing")
            if sha256_file(fp) != digest:
                raise ArtifactError(f"{directory}: {name} does not match its checksum (corrupt or tampered)")
    return manifest
