"""The object cache (``codegen/llvm/objects.py``): a module part compiled before is read back, for
the same text, target and optimization level only; a damaged file is compiled again; the cache
keeps its most recently used files."""
from __future__ import annotations

import os

import numpy as np

import compiler
from compiler.codegen.llvm import objects, toolchain
from compiler.codegen.llvm.target import host_target, target_for
from compiler.tools.zoo import model_of

from .test_llvm_toolchain import saxpy


def _counting(monkeypatch):
    compiled = []
    real = toolchain._compile_side_by_side

    def count(texts, *args):
        compiled.extend(texts)
        return real(texts, *args)

    monkeypatch.setattr(toolchain, "_compile_side_by_side", count)
    return compiled


def test_a_part_compiled_before_is_read_back(tmp_path, monkeypatch):
    compiled = _counting(monkeypatch)
    target = host_target()
    first = toolchain.compile_parts(saxpy(), target, cache_dir=str(tmp_path))
    assert len(compiled) == 1 and len(os.listdir(tmp_path)) == 1
    assert toolchain.compile_parts(saxpy(), target, cache_dir=str(tmp_path)) == first
    assert len(compiled) == 1  # read back, not compiled
    # another text, opt level or target is another key
    toolchain.compile_parts(saxpy(c="2.0"), target, cache_dir=str(tmp_path))
    toolchain.compile_parts(saxpy(), target, opt_level=1, cache_dir=str(tmp_path))
    toolchain.compile_parts(saxpy(), target_for("znver3"), cache_dir=str(tmp_path))
    assert len(compiled) == 4 and len(os.listdir(tmp_path)) == 4
    # no cache_dir: compiled every time, nothing kept
    toolchain.compile_parts(saxpy(), target)
    assert len(compiled) == 5


def test_a_damaged_object_is_compiled_again(tmp_path, monkeypatch):
    compiled = _counting(monkeypatch)
    first = toolchain.compile_parts(saxpy(), host_target(), cache_dir=str(tmp_path))
    (name,) = os.listdir(tmp_path)
    path = tmp_path / name
    data = path.read_bytes()
    for damaged in (data[:-10], data[:40] + bytes([data[40] ^ 1]) + data[41:], b""):
        path.write_bytes(damaged)
        assert toolchain.compile_parts(saxpy(), host_target(), cache_dir=str(tmp_path)) == first
    assert len(compiled) == 4 and path.read_bytes() == data


def test_the_cache_keeps_the_most_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(objects, "KEEP", 2)
    for i, key in enumerate(("a", "b", "c")):
        objects.store(str(tmp_path), key, b"\x7fELF" + bytes([i]))
        os.utime(tmp_path / f"{key}.o", (i, i))  # (stored in this order, seconds apart)
    objects.store(str(tmp_path), "d", b"\x7fELFd")
    assert sorted(os.listdir(tmp_path)) == ["c.o", "d.o"]
    assert objects.lookup(str(tmp_path), "c") == b"\x7fELF\x02" and objects.lookup(str(tmp_path), "a") is None


def test_a_model_compiled_again_spends_no_time_in_llvm(tmp_path, monkeypatch):
    """Through the driver: the second compile of a model (a new artifact, the same code) reads every
    part from the cache and runs the same; ``kernel_cache=False`` compiles afresh."""
    monkeypatch.setattr(objects, "cache_dir", lambda: str(tmp_path))
    compiled = _counting(monkeypatch)
    model = model_of("zoo:mlp?batch=2")
    x = {"x": np.random.default_rng(0).standard_normal((2, 784)).astype(np.float32)}
    a = compiler.compile(model)
    n = len(compiled)
    assert n >= 1 and len(os.listdir(tmp_path)) == n
    b = compiler.compile(model)
    assert len(compiled) == n
    compiler.compile(model, kernel_cache=False)
    assert len(compiled) == 2 * n
    name = a.input_names[0]
    for k, v in a.run({name: x["x"]}).items():
        np.testing.assert_array_equal(b.run({name: x["x"]})[k], v)
