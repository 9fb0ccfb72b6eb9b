"""Worker processes that run Kiln (and anything else that could crash) for the fuzzers.

``Pool.run("module:function", *args, timeout=60)`` calls the function in a worker process and returns
an ``Outcome``: its value, the exception it raised (type, message, traceback, and whether it is a
``KilnError``), a crash by a signal (the worker died: SIGSEGV, SIGABRT, ...; the tail of what it wrote to
stderr, with faulthandler's Python stack, comes back as the message) or a hang (no answer within
``timeout``: the worker is killed). A dead or killed worker is replaced on the next call; a worker is
also replaced after ``recycle`` tasks, since every compiled model stays loaded in it.

Workers are started with ``spawn`` (the parent has ONNX Runtime's threads), run under an address-space
limit (``mem_limit`` bytes: a run that asks for more gets a MemoryError, not the machine's memory),
and are used by up to ``workers`` threads at once (``Pool.map``).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import multiprocessing
import os
import queue
import signal
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Iterable

DEFAULT_MEM_LIMIT = 6 << 30


@dataclasses.dataclass
class Outcome:
    status: str                # "ok", "error" (an exception), "crash" (killed by a signal), "hang"
    value: Any = None          # the function's result when "ok"
    error: str = ""            # the exception's type name, or the signal's name
    message: str = ""
    traceback: str = ""
    kiln: bool = False         # the exception is a compiler.errors.KilnError
    unsupported: bool = False  # ... an UnsupportedError
    where: str = ""            # the innermost frame of Kiln's code (file:line) that raised
    seconds: float = 0.0

    def brief(self) -> str:
        if self.status == "ok":
            return "ok"
        if self.status == "hang":
            return f"hang (no answer in {self.seconds:.0f} s)"
        if self.status == "crash":  # faulthandler's report: the fatal error and Kiln's innermost frame
            lines = [ln.strip() for ln in self.message.splitlines() if ln.strip()]
            fatal = next((ln for ln in lines if ln.startswith("Fatal Python error")), "")
            frame = next((ln for ln in lines if ln.startswith("File ") and ("/compiler/" in ln or
                                                                            "/frontends/" in ln)), "")
            return f"crash by {self.error}: {fatal} {frame}".strip()
        return f"{self.error}: {self.message.splitlines()[0] if self.message else ''}"[:300]


def _describe(e: BaseException) -> dict:
    try:
        from compiler.errors import KilnError, UnsupportedError
    except Exception:  # pragma: no cover - Kiln not importable at all
        KilnError = UnsupportedError = ()
    where = ""
    for fr in traceback.extract_tb(e.__traceback__):
        if "/compiler/" in fr.filename or "/frontends/" in fr.filename:
            where = f"{fr.filename.rsplit('/', 2)[-2]}/{fr.filename.rsplit('/', 1)[-1]}:{fr.lineno}"
    try:
        message = str(e)
    except Exception:
        message = "<str() failed>"
    return dict(error=type(e).__name__, message=message[:2000],
                traceback="".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:],
                kiln=isinstance(e, KilnError) if KilnError else False,
                unsupported=isinstance(e, UnsupportedError) if UnsupportedError else False, where=where)


def _worker_main(conn, log_path: str, mem_limit: int) -> None:
    import faulthandler
    import resource
    import warnings

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable()
    if mem_limit:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    warnings.simplefilter("ignore")
    import numpy  # noqa: F401  (so that the first task's timeout is not spent importing)
    import compiler  # noqa: F401
    import frontends.onnx  # noqa: F401

    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        os.ftruncate(2, 0)
        target, args = task
        t0 = time.perf_counter()
        try:
            mod, _, name = target.partition(":")
            value = getattr(importlib.import_module(mod), name)(*args)
            reply = ("ok", value, None)
        except BaseException as e:  # noqa: B902 - every failure is a result here
            reply = ("error", None, _describe(e))
        reply = reply + (time.perf_counter() - t0,)
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable value
            conn.send(("error", None, _describe(e), time.perf_counter() - t0))


class _Worker:
    def __init__(self, ctx, log_path: str, mem_limit: int):
        self.log_path = log_path
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, log_path, mem_limit), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.tasks = 0
        if not self.conn.poll(180):
            self.kill()
            raise RuntimeError("a fuzz worker did not start in 180 s")
        if self.conn.recv() != "ready":  # pragma: no cover
            raise RuntimeError("a fuzz worker said something else than ready")

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
            return data[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


class Pool:
    def __init__(self, workers: int = 2, mem_limit: int = DEFAULT_MEM_LIMIT, recycle: int = 100):
        self.ctx = multiprocessing.get_context("spawn")
        self.mem_limit, self.recycle = mem_limit, recycle
        self.tmp = tempfile.TemporaryDirectory(prefix="kiln-fuzz-pool-")
        self.free: queue.Queue = queue.Queue()
        for i in range(workers):
            self.free.put((i, None))
        self.workers = workers
        self.executor = concurrent.futures.ThreadPoolExecutor(workers)
        self.restarts = 0
        self._lock = threading.Lock()

    def run(self, target: str, *args, timeout: float = 60.0) -> Outcome:
        """Call ``target`` ("module:function") with ``args`` in a worker; never raises for what the
        function does."""
        slot, w = self.free.get()
        try:
            if w is None or w.tasks >= self.recycle or not w.proc.is_alive():
                if w is not None:
                    w.kill()
                w = _Worker(self.ctx, os.path.join(self.tmp.name, f"worker{slot}.log"), self.mem_limit)
            w.tasks += 1
            t0 = time.perf_counter()
            try:
                w.conn.send((target, args))
                answered = w.conn.poll(timeout)
                reply = w.conn.recv() if answered else None
            except (EOFError, OSError, BrokenPipeError):
                answered, reply = True, None
            seconds = time.perf_counter() - t0
            if not answered:
                w.kill()
                w, _ = None, self._count_restart()
                return Outcome("hang", seconds=seconds)
            if reply is None:  # the worker died
                w.proc.join(10)
                code = w.proc.exitcode
                tail = w.log_tail()
                w.kill()
                w, _ = None, self._count_restart()
                try:
                    name = signal.Signals(-code).name if code is not None and code < 0 else f"exit code {code}"
                except ValueError:
                    name = f"signal {-code}"
                return Outcome("crash", error=name, message=tail, seconds=seconds)
            status, value, err, secs = reply
            if status == "ok":
                return Outcome("ok", value=value, seconds=secs)
            return Outcome("error", seconds=secs, **err)
        finally:
            self.free.put((slot, w))

    def _count_restart(self) -> None:
        with self._lock:
            self.restarts += 1

    def submit(self, target: str, *args, timeout: float = 60.0) -> concurrent.futures.Future:
        return self.executor.submit(self.run, target, *args, timeout=timeout)

    def map(self, fn: Callable, items: Iterable) -> list:
        """``fn(item)`` for every item on ``workers`` threads (each may call ``run``), in order."""
        return list(self.executor.map(fn, items))

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        while not self.free.empty():
            _, w = self.free.get()
            if w is not None:
                try:
                    w.conn.close()  # the worker's recv() ends: it exits by itself
                    w.proc.join(5)
                finally:
                    w.kill()
        self.tmp.cleanup()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
