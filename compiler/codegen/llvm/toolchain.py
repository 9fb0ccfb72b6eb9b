"""LLVM IR text -> optimized object code -> shared library -> loaded library.

The steps, each a plain function:

* ``parse_module(text)``: parse and verify; a ``CodegenError`` quotes LLVM's message and the IR lines
  it is about.
* ``optimize(module, target)``: identical functions merged (``merge_functions``), then LLVM's default
  ``O3`` pipeline (new pass manager), loop and SLP vectorization and unrolling on, tuned for the
  target CPU.
* ``compile_ir(text, target) -> bytes``: the above, the rewrites of ``workarounds`` (known LLVM
  code-generator bugs), and code emission: an ELF object file.
* ``link_shared(objects, path)``: the system C compiler driver (``cc -shared``) links objects into a
  ``.so``; ``load_library(path)`` opens it with ctypes.
* ``build_library(texts, path, target)``: all of it for several modules at once.
* ``optimized_ir`` / ``assembly``: what the optimizer and the code generator made of a module, for
  reading and for tests ("did the loop vectorize?").

``dlopen`` of a path already open returns the old library; ``load_library`` therefore loads a
private copy of the file's bytes, so rebuilding a library at the same path and loading it again runs
the new code.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Sequence

import llvmlite.binding as llvm

from ...errors import KilnError
from .target import Target, host_target
from .workarounds import define_i1_shuffle_lanes


class CodegenError(KilnError):
    """LLVM refused the generated code (parse or verifier error), or compiling/linking failed."""


# ---------------------------------------------------------------------------------------------
# IR -> module
# ---------------------------------------------------------------------------------------------

_LOCATION = re.compile(r"<string>:(\d+):(\d+): error: (.*)")


def _numbered(lines: Sequence[str], first: int, last: int, mark: int | None = None) -> str:
    first, last = max(first, 1), min(last, len(lines))
    return "\n".join(f"{'>' if i == mark else ' '}{i:5d} | {lines[i - 1]}" for i in range(first, last + 1))


def _parse_error(text: str, message: str) -> CodegenError:
    lines = text.splitlines()
    m = _LOCATION.search(message)
    if m:
        line, col, what = int(m.group(1)), int(m.group(2)), m.group(3)
        return CodegenError(f"LLVM IR parse error at line {line}, column {col}: {what}\n"
                            f"{_numbered(lines, line - 3, line + 2, mark=line)}")
    return CodegenError(f"LLVM IR parse error: {message.strip()}")


def _verifier_error(text: str, message: str) -> CodegenError:
    """LLVM's verifier prints the offending instructions after its message: find them in the text."""
    lines = text.splitlines()
    stripped = [ln.strip() for ln in lines]
    quoted = []
    for part in message.splitlines():
        part = part.strip()
        if part and part in stripped:
            quoted.append(stripped.index(part) + 1)
    where = []
    for line in sorted(set(quoted))[:8]:
        func = next((lines[i].strip() for i in range(line - 1, -1, -1) if lines[i].startswith("define ")), None)
        head = f"in {func.split('(')[0].removeprefix('define ')}" if func else "at module level"
        where.append(f"line {line} ({head}):\n{_numbered(lines, line - 2, line + 1, mark=line)}")
    body = "\n".join(where) if where else "(the verifier's message quotes no line of the module)"
    return CodegenError(f"LLVM IR verifier error: {message.strip()}\n{body}")


def parse_module(text: str, target: Target | None = None) -> llvm.ModuleRef:
    """Parse LLVM IR text and verify it; set the target's triple and data layout on the module."""
    target = target or host_target()
    tm = target.target_machine()  # initializes LLVM
    try:
        module = llvm.parse_assembly(text)
    except RuntimeError as e:
        raise _parse_error(text, str(e)) from None
    try:
        module.verify()
    except RuntimeError as e:
        raise _verifier_error(text, str(e)) from None
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    return module


# ---------------------------------------------------------------------------------------------
# Optimization and emission
# ---------------------------------------------------------------------------------------------

def optimize(module: llvm.ModuleRef, target: Target | None = None, opt_level: int = 3) -> None:
    """Merge identical functions (``merge_functions``), then run LLVM's default per-module pipeline at
    ``opt_level`` (0..3), vectorizers on, in place."""
    target = target or host_target()
    if not 0 <= opt_level <= 3:
        raise ValueError(f"opt_level must be 0..3, got {opt_level}")
    merge_functions(module, target)
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pto.loop_vectorization = opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    pto.loop_unrolling = opt_level >= 2
    pto.loop_interleaving = opt_level >= 2
    pb = llvm.create_pass_builder(target.target_machine(), pto)
    pb.getModulePassManager().run(module, pb)


def merge_functions(module: llvm.ModuleRef, target: Target) -> None:
    """LLVM's MergeFunctions on the module as generated: functions that are the same code become one.

    Kernels share whole functions already (``codegen/sharing.py``), but the helpers a kernel makes
    for itself (a GEMM's B packer and epilogue rows, named after the kernel) are often the same
    code in kernels that differ elsewhere: DenseNet's 58 prologue convolutions differ in their
    input channels, their 58 packers and 59 epilogues are 7 and 5 distinct functions. Merging before
    the optimizer is what saves the time (DenseNet-121's module: 5.3 -> 2.0 s in one process; the
    pass itself 0.02 s)."""
    pb = llvm.create_pass_builder(target.target_machine(), llvm.create_pipeline_tuning_options(speed_level=0))
    mpm = llvm.create_new_module_pass_manager()
    mpm.add_merge_functions_pass()
    mpm.run(module, pb)


def _compiled(module_text: str, target: Target | None, opt_level: int) -> tuple[llvm.ModuleRef, Target]:
    """Parse, optimize, then apply ``workarounds`` (re-parsing only when one changed the module)."""
    target = target or host_target()
    module = parse_module(module_text, target)
    optimize(module, target, opt_level)
    text = str(module)
    fixed = define_i1_shuffle_lanes(text)
    if fixed is not text:
        module = parse_module(fixed, target)
    return module, target


def compile_ir(module_text: str, target: Target | None = None, opt_level: int = 3) -> bytes:
    """LLVM IR text -> an optimized ELF object file (position-independent) for ``target``."""
    module, target = _compiled(module_text, target, opt_level)
    try:
        return target.target_machine().emit_object(module)
    except RuntimeError as e:
        raise CodegenError(f"LLVM could not emit code: {e}") from None


#: a module of this many characters of IR or more is compiled in parts, one process each
#: (``split.py``): a worker process costs about 0.15 s to start, and LLVM takes 3.5-6 us a character
SPLIT_MIN_CHARS = 100_000


def compile_parts(module_text: str, target: Target | None = None, opt_level: int = 3,
                  workers: int | None = None, cache_dir: str | None = None) -> list[bytes]:
    """``compile_ir`` of a large module as several object files made side by side: the module split
    into ``workers`` parts (default: the CPUs this process may use, at most 4; ``split.py``), the
    first part to compile compiled here while worker processes compile the others. A module under
    ``SPLIT_MIN_CHARS``, one that does not split, or a single CPU: one object, as ``compile_ir``. A
    worker that fails has its part compiled here (an error in the part is then raised as
    ``compile_ir`` raises it). With ``cache_dir`` (``objects.py``) a part compiled before is read
    from there, and each part compiled now is kept there."""
    from . import objects
    from .split import split_module

    target = target or host_target()
    if workers is None:
        workers = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    parts = split_module(module_text, workers) if workers > 1 and len(module_text) >= SPLIT_MIN_CHARS else None
    parts = parts or [module_text]
    keys = [objects.object_key(text, target, opt_level) for text in parts] if cache_dir else [None] * len(parts)
    found = [objects.lookup(cache_dir, key) if key else None for key in keys]
    todo = [i for i, obj in enumerate(found) if obj is None]
    for i, obj in zip(todo, _compile_side_by_side([parts[i] for i in todo], target, opt_level)):
        found[i] = obj
        if keys[i]:
            objects.store(cache_dir, keys[i], obj)
    return found


def _compile_side_by_side(texts: list[str], target: Target, opt_level: int) -> list[bytes]:
    """Each module of ``texts`` compiled: the first here, the others in worker processes at once."""
    if len(texts) <= 1:
        return [compile_ir(t, target, opt_level) for t in texts]
    spec = json.dumps({"triple": target.triple, "cpu": target.cpu, "features": target.features,
                       "isa": sorted(target.isa), "target_opt": target.opt_level, "opt_level": opt_level})
    root = str(Path(__file__).resolve().parents[3])  # the directory holding the compiler package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    procs = []
    for text in texts[1:]:
        try:
            # (its error, if any, is raised again by compiling the part here)
            proc = subprocess.Popen([sys.executable, "-m", "compiler.codegen.llvm.worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except OSError:
            proc = None
        procs.append((proc, text))
    feeders = []
    for proc, text in procs:
        if proc is not None:  # written from a thread: a pipe holds less than a part
            t = threading.Thread(target=_feed, args=(proc, (spec + "\n" + text).encode()), daemon=True)
            t.start()
            feeders.append(t)
    try:
        objects = [compile_ir(texts[0], target, opt_level)]
    except BaseException:  # (an error in the module: the workers' results are not wanted)
        for proc, _ in procs:
            if proc is not None:
                proc.kill()
                proc.wait()
                proc.stdout.close()
        raise
    for proc, text in procs:
        obj = None
        if proc is not None:
            out = proc.stdout.read()
            proc.stdout.close()
            obj = out if proc.wait() == 0 and out else None
        objects.append(obj if obj is not None else compile_ir(text, target, opt_level))
    for t in feeders:
        t.join()
    return objects


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:  # the worker died (or was stopped): its reader sees the exit status
        pass


def data_object(symbol: str, data: bytes, target: Target | None = None) -> bytes:
    """An object file defining ``const char symbol[]`` = ``data`` and a NUL (exported, read-only)."""
    from llvmlite import ir

    target = target or host_target()
    module = ir.Module(name=symbol)
    module.triple, module.data_layout = target.triple, target.data_layout
    raw = bytes(data) + b"\0"
    arr = ir.ArrayType(ir.IntType(8), len(raw))
    g = ir.GlobalVariable(module, arr, symbol)
    g.global_constant = True
    g.initializer = ir.Constant(arr, bytearray(raw))
    return compile_ir(str(module), target, opt_level=0)


def optimized_ir(module_text: str, target: Target | None = None, opt_level: int = 3) -> str:
    """The module after the optimization pipeline, as LLVM IR text."""
    module, _ = _compiled(module_text, target, opt_level)
    return str(module)


def assembly(module_text: str, target: Target | None = None, opt_level: int = 3) -> str:
    """The module's optimized machine code as assembly text (AT&T syntax)."""
    module, target = _compiled(module_text, target, opt_level)
    return target.target_machine().emit_assembly(module)


# ---------------------------------------------------------------------------------------------
# Linking and loading
# ---------------------------------------------------------------------------------------------

def find_cc() -> str:
    """The system C compiler driver that links shared libraries ($CC, else cc, gcc or clang)."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            found = shutil.which(name)
            if found:
                return found
    raise CodegenError("no C compiler driver found to link shared libraries (looked for $CC, cc, gcc, clang "
                       "on PATH); install one, e.g. `apt-get install gcc`")


def link_shared(objects: Iterable[bytes], out_path: str | os.PathLike, extra_args: Sequence[str] = ()) -> Path:
    """Link object files (bytes, as ``compile_ir`` returns them) into the shared library ``out_path``.

    The library is written beside ``out_path`` and renamed onto it, so a process that has an older
    library of that name mapped never sees a half-written file.
    """
    objects = list(objects)
    if not objects:
        raise CodegenError("link_shared needs at least one object file")
    out = Path(out_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    cc = find_cc()
    with tempfile.TemporaryDirectory(prefix="kiln-link-") as tmp:
        paths = []
        for i, obj in enumerate(objects):
            p = Path(tmp) / f"kernel{i}.o"
            p.write_bytes(obj)
            paths.append(str(p))
        staged = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        cmd = [cc, "-shared", "-Wl,-z,noexecstack", "-o", str(staged), *paths, *extra_args, "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise CodegenError(f"could not run the linker {cc}: {e}") from None
        if proc.returncode != 0:
            staged.unlink(missing_ok=True)
            raise CodegenError(f"linking {out.name} failed ({' '.join(cmd)}), exit {proc.returncode}:\n"
                               f"{(proc.stderr or proc.stdout).strip()}")
        os.replace(staged, out)
    return out


def load_library(path: str | os.PathLike) -> ctypes.CDLL:
    """Open a shared library (its symbols are looked up as attributes: ``lib.kernel``).

    The file's bytes are read once and loaded from a private copy (``codegen/loader.py``), so a
    library rebuilt at the same path is loaded afresh, never aliased to the one loaded before."""
    from ..loader import load_library as load_private

    p = Path(path)
    if not p.is_file():
        raise CodegenError(f"no shared library at {p}")
    try:
        data = p.read_bytes()
        return load_private(data, str(p))
    except OSError as e:
        raise CodegenError(f"could not load {p}: {e}") from None


def build_library(module_texts: Iterable[str], out_path: str | os.PathLike, target: Target | None = None,
                  opt_level: int = 3) -> Path:
    """Compile each LLVM IR module for ``target`` and link them all into one shared library."""
    return link_shared([compile_ir(t, target, opt_level) for t in module_texts], out_path)


__all__ = ["CodegenError", "assembly", "build_library", "compile_ir", "find_cc", "link_shared", "load_library",
           "optimize", "optimized_ir", "parse_module"]
