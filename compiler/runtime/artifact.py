"""Compiled artifacts: a directory holding everything needed to run a model, and nothing to compile.

::

    model.kiln/
      manifest.json   format and Kiln version, target CPU and features, input/output signature,
                      the step plan, kernels, memory sizes, and a SHA-256 of every other file
      model.so        the native code: every kernel and the forward function(s)
      weights.bin     the weights native code reads (64-byte aligned; memory-mapped on load)
      model.kir       the final IR, as text (what ``kiln inspect`` shows)
      model.kir.npz   the large constants of that IR, only when some nodes run in the interpreter

Writing (``staging``): the directory is built under a name of its own beside the destination and,
once complete, swapped into place under a lock, so a failed compile leaves nothing and concurrent
writers leave one complete artifact. Reading (``read_manifest``, ``ArtifactDir``): only regular files
inside the directory are opened (no symbolic links, FIFOs, devices or subdirectories; names of one
component), the manifest is size-limited and validated against its schema (``format.py``) before
use, and every byte the runtime uses is hashed as it is read. ``library_function`` finds a function
in a library loaded from those bytes (``codegen/loader.py``: under a name no earlier load can alias).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import stat
import tempfile
from typing import Iterator

from ..errors import KilnError
from .format import (FILE_NAME, FORMAT, FORMAT_VERSION, IR_TEXT, LIBRARY, MANIFEST, WEIGHTS, Manifest,
                     SchemaError, check_depth)

MAX_MANIFEST_BYTES = 64 << 20
MAX_LIBRARY_BYTES = 1 << 30


class ArtifactError(KilnError):
    """An artifact that cannot be loaded here: missing, corrupt, tampered, inconsistent, newer, or for
    another CPU."""


def _manifest_digest(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# -- reading the files of an artifact ----------------------------------------------------------------

def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


class ArtifactDir:
    """An artifact directory, opened once: its files are opened relative to it, by one name each,
    and only if they are regular files (lstat, then ``O_NOFOLLOW | O_NONBLOCK``, then fstat: a
    symbolic link, FIFO, device or directory is refused without being read, and nothing can hang)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ArtifactError(f"no artifact at {self.path}") from None
        except NotADirectoryError:
            raise ArtifactError(f"no artifact at {self.path} (a file: Kiln artifacts are directories)") from None
        except OSError as e:
            raise ArtifactError(f"cannot open the artifact {self.path}: {e.strerror}") from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "ArtifactDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def has(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except OSError:
            return False

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[tuple[int, int]]:
        """``with d.open(name) as (fd, size):`` a regular file of the artifact (``ArtifactError`` otherwise)."""
        if not FILE_NAME.match(name):
            raise ArtifactError(f"{self.path}: refusing to open {name!r}: not a file name inside the artifact")
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise ArtifactError(f"{self.path}: {name} is {_kind(st.st_mode)}, not a regular file; refusing "
                                    f"to read it")
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            raise ArtifactError(f"{self.path} is incomplete: {name} is missing") from None
        except OSError as e:
            raise ArtifactError(f"{self.path}: cannot open {name}: {e.strerror}") from None
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise ArtifactError(f"{self.path}: {name} changed while it was being opened; refusing to read it")
            yield fd, now.st_size
        finally:
            os.close(fd)

    def read(self, name: str, digest: str | None, limit: int) -> bytes:
        """The bytes of ``name`` (at most ``limit``), checked against ``digest`` when given: the bytes
        returned are the bytes hashed."""
        with self.open(name) as (fd, size):
            if size > limit:
                raise ArtifactError(f"{self.path}: {name} is {size} bytes, more than the {limit} Kiln reads")
            chunks, got = [], 0
            while got <= limit and (chunk := os.read(fd, min(1 << 22, limit + 1 - got))):
                chunks.append(chunk)  # (in pieces: read(limit + 1) would allocate the whole limit)
                got += len(chunk)
            data = b"".join(chunks)
        if len(data) > limit:
            raise ArtifactError(f"{self.path}: {name} is more than the {limit} bytes Kiln reads")
        if digest is not None:
            self._check(name, hashlib.sha256(data).hexdigest(), digest)
        return data

    def map(self, name: str, digest: str, size: int) -> mmap.mmap | None:
        """``name`` memory-mapped read-only (None when empty), of exactly ``size`` bytes, checked
        against ``digest`` by hashing the mapping itself."""
        with self.open(name) as (fd, actual):
            if actual != size:
                raise ArtifactError(f"{self.path}: {name} is {actual} bytes, the manifest says {size} "
                                    f"(memory.weights_bytes)")
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        self._check(name, hashlib.sha256(mapped if mapped is not None else b"").hexdigest(), digest)
        return mapped

    def verify(self, name: str, digest: str) -> None:
        """Hash ``name`` as it is read (for the files the runtime does not use itself)."""
        h = hashlib.sha256()
        with self.open(name) as (fd, _):
            while chunk := os.read(fd, 1 << 22):
                h.update(chunk)
        self._check(name, h.hexdigest(), digest)

    def copy(self, name: str, dest: str) -> None:
        with self.open(name) as (fd, _), open(dest, "xb") as out:
            while chunk := os.read(fd, 1 << 22):
                out.write(chunk)

    def _check(self, name: str, got: str, want: str) -> None:
        if got != want:
            raise ArtifactError(f"{self.path}: {name} does not match its checksum (corrupt or tampered)")


def read_manifest(directory: "str | os.PathLike | ArtifactDir", check_files: bool = True) -> Manifest:
    """The verified manifest of the artifact in ``directory`` (see ``ArtifactError``): format version,
    checksum, schema (``Manifest.from_json``), CPU features and, with ``check_files``, every file's
    checksum."""
    with contextlib.ExitStack() as stack:
        d = directory if isinstance(directory, ArtifactDir) else stack.enter_context(ArtifactDir(directory))
        if not d.has(MANIFEST):
            raise ArtifactError(f"{d.path} is not a Kiln artifact: it has no {MANIFEST}")
        manifest = _parse(d.read(MANIFEST, None, MAX_MANIFEST_BYTES), os.path.join(d.path, MANIFEST))
        _check_version(manifest, d.path)
        if manifest.get("manifest_sha256") != _manifest_digest(manifest):
            raise ArtifactError(f"{d.path}/{MANIFEST} was modified after the artifact was written (its checksum "
                                f"does not match)")
        try:
            manifest = Manifest.from_json(manifest)
        except SchemaError as e:
            raise ArtifactError(f"{d.path}: {e}") from None
        _check_target(manifest, d.path)
        if check_files:
            for name, digest in manifest.files.items():
                d.verify(name, digest)
    return manifest


def _parse(data: bytes, path: str) -> dict:
    try:
        manifest = json.loads(data)
    except RecursionError:
        raise ArtifactError(f"{path} is not a Kiln artifact manifest: its JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not readable JSON: {e}") from None
    try:
        check_depth(manifest)
    except SchemaError:
        raise ArtifactError(f"{path} is not a Kiln artifact manifest: its JSON is nested too deeply") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not a Kiln artifact manifest")
    return manifest


def _check_version(manifest: dict, directory: str) -> None:
    version = manifest.get("format_version")
    if type(version) is not int or version > FORMAT_VERSION:
        raise ArtifactError(f"{directory} has artifact format version {version!r}, newer than this Kiln "
                            f"({manifest.get('kiln_version', '?')} wrote it) reads (up to {FORMAT_VERSION}); "
                            f"upgrade Kiln or recompile the model")
    if version < FORMAT_VERSION:
        raise ArtifactError(f"{directory} has artifact format version {version}, older than this Kiln reads "
                            f"({FORMAT_VERSION}; Kiln {manifest.get('kiln_version', '?')} wrote it): recompile the model")


def _check_target(manifest: Manifest, directory: str) -> None:
    from ..codegen.llvm.target import host_target

    host = host_target()
    target = manifest.target
    missing = sorted(set(target.isa) - set(host.isa))
    if missing:
        raise ArtifactError(f"{directory} was compiled for CPU {target.cpu!r} with "
                            f"{', '.join(missing)}, which this CPU ({host.cpu}) lacks; recompile it here "
                            f"(or compile with a target this CPU supports)")
    if target.triple.split("-")[0] != host.triple.split("-")[0]:
        raise ArtifactError(f"{directory} was compiled for {target.triple}, this machine is {host.triple}")


# -- functions of a loaded library -------------------------------------------------------------------


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _dladdr():
    for lib in (None, "libdl.so.2"):
        try:
            f = ctypes.CDLL(lib).dladdr
        except (OSError, AttributeError):
            continue
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)], ctypes.c_int
        return f
    return None


def library_function(lib: ctypes.CDLL, name: str, label: str = "model.so"):
    """The function ``name`` defined in ``lib`` itself: ``dlsym`` on the library's handle also finds its
    dependencies' symbols (libc's ``abort``), so the address must lie in ``lib``'s own file
    (``dladdr``). ``ArtifactError`` otherwise."""
    try:
        fn = lib[name]
    except AttributeError:
        raise ArtifactError(f"{label} has no function {name!r}") from None
    dladdr = _dladdr()
    info = _DlInfo()
    if dladdr is not None:
        address = ctypes.cast(fn, ctypes.c_void_p).value
        if not dladdr(address, ctypes.byref(info)) or info.dli_fname != os.fsencode(lib._name):
            raise ArtifactError(f"{label} does not define {name!r} itself (found in "
                                f"{(info.dli_fname or b'?').decode(errors='replace')}); refusing to call it")
    return fn


def library_string(lib: ctypes.CDLL, name: str, label: str = "model.so", limit: int = 1 << 20) -> bytes:
    """The NUL-terminated constant ``name`` defined in ``lib`` itself (checked as ``library_function``
    checks a function), at most ``limit`` bytes."""
    address = ctypes.cast(library_function(lib, name, label), ctypes.c_void_p).value
    data = ctypes.string_at(address)
    if len(data) > limit:
        raise ArtifactError(f"{label}: {name} is longer than {limit} bytes")
    return data


# -- writing -----------------------------------------------------------------------------------------

def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def write_weights_and_ir(directory: str, weights, weights_bytes: int, graph, interpreted: bool) -> None:
    """``weights.bin`` (each (offset, array) at its offset, ``weights_bytes`` in all) and the final IR
    (``model.kir``; with ``interpreted``, the interpreter's constants too, beside it)."""
    import numpy as np

    from ..ir.printer import print_graph, save_text

    with open(os.path.join(directory, WEIGHTS), "wb") as f:
        for off, arr in weights:
            f.seek(off)
            f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))  # (its bytes, not a copy)
        f.truncate(weights_bytes)
    if interpreted:
        save_text(graph, os.path.join(directory, IR_TEXT))  # the interpreter needs the constants too
    else:
        with open(os.path.join(directory, IR_TEXT), "w", encoding="utf-8") as f:
            f.write(print_graph(graph))


def finish_manifest(directory: str, manifest: Manifest) -> None:
    """Write ``manifest`` into ``directory`` with the checksum of every file there (but the manifest)
    and of the manifest itself."""
    manifest.files = {name: sha256_file(os.path.join(directory, name))
                      for name in sorted(os.listdir(directory)) if name != MANIFEST}
    doc = manifest.to_json()
    manifest.manifest_sha256 = doc["manifest_sha256"] = _manifest_digest(doc)
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def _check_replaceable(dest: str, shown: str) -> None:
    """Refuse to replace anything at ``dest`` but a Kiln artifact (a directory with a manifest, or
    with the index of a multi-device artifact)."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    marked = any(os.path.isfile(os.path.join(dest, f)) for f in (MANIFEST, "devices.json"))
    if not stat.S_ISDIR(st.st_mode) or not marked:
        what = _kind(st.st_mode) if not stat.S_ISDIR(st.st_mode) else "a directory"
        raise ArtifactError(f"{shown} exists ({what}) and is not a Kiln artifact; refusing to replace it")


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path``, and remove it when done. A waiter that
    wakes on a lock file its holder has removed tries again, so exactly one process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(fd)


_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Swap the directories ``a`` and ``b`` in one step (Linux ``renameat2``); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


class staging:
    """``with staging(dest) as tmp:`` build the artifact in ``tmp``; on success it becomes ``dest``
    (replacing an older artifact there), on any error ``tmp`` is removed and ``dest`` is untouched.

    ``tmp`` is a directory of this writer's own beside ``dest``; the swap into place holds a lock
    (``.NAME.lock`` beside it, removed after), so writers racing for one ``dest`` replace each other
    in turn: the last one wins, each leaves a complete artifact and no debris. Where the file system
    can, the old and new directories are exchanged in one step, so a reader never finds ``dest``
    missing."""

    def __init__(self, dest: str | os.PathLike):
        self.shown = os.fspath(dest)
        self.dest = os.path.abspath(self.shown)
        self.parent = os.path.dirname(self.dest)
        if not os.path.isdir(self.parent):
            raise ArtifactError(f"cannot write {self.shown}: directory {self.parent} does not exist")
        _check_replaceable(self.dest, self.shown)
        self.base = os.path.basename(self.dest)

    def __enter__(self) -> str:
        try:
            self.tmp = tempfile.mkdtemp(prefix=f".{self.base}.", suffix=".partial", dir=self.parent)
        except OSError as e:
            raise ArtifactError(f"cannot write {self.shown}: {e.strerror}") from None
        return self.tmp

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        try:
            with _locked(os.path.join(self.parent, f".{self.base}.lock")):
                self._swap()
        except OSError as e:
            raise ArtifactError(f"cannot write {self.shown}: {e}") from None
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)  # the old artifact, or what is left of a failure
        return False

    def _swap(self) -> None:
        """Put ``tmp`` at ``dest``; afterwards ``tmp`` holds the old artifact, or nothing."""
        _check_replaceable(self.dest, self.shown)  # another writer may have put something else there
        if os.path.lexists(self.dest):
            if _exchange(self.tmp, self.dest):
                return
            old = self.tmp[:-len(".partial")] + ".old"
            os.rename(self.dest, old)
            try:
                os.rename(self.tmp, self.dest)
            except BaseException:
                os.rename(old, self.dest)
                raise
            os.rename(old, self.tmp)
        else:
            os.rename(self.tmp, self.dest)


__all__ = ["ArtifactDir", "ArtifactError", "FORMAT", "FORMAT_VERSION", "IR_TEXT", "LIBRARY", "MANIFEST",
           "WEIGHTS", "finish_manifest", "write_weights_and_ir", "library_function", "read_manifest", "staging"]
