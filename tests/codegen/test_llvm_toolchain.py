"""The LLVM toolchain: host target, IR -> object -> shared library -> ctypes call, and its errors."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from compiler.codegen.llvm.target import ISA_FEATURES, host_target, target_for
from compiler.codegen.llvm.toolchain import (CodegenError, assembly, build_library, compile_ir, find_cc,
                                             link_shared, load_library, merge_functions, optimized_ir,
                                             parse_module)
from compiler.errors import KilnError

#: out[i] = a[i] * b[i] + c (a plain loop LLVM must vectorize)
SAXPY = """
define void @{name}(ptr noalias %a, ptr noalias %b, ptr noalias %out, i64 %n) {{
entry:
  %go = icmp sgt i64 %n, 0
  br i1 %go, label %loop, label %done
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %pa = getelementptr inbounds float, ptr %a, i64 %i
  %pb = getelementptr inbounds float, ptr %b, i64 %i
  %x = load float, ptr %pa, align 4
  %y = load float, ptr %pb, align 4
  %m = fmul float %x, %y
  %r = fadd float %m, {c}
  %po = getelementptr inbounds float, ptr %out, i64 %i
  store float %r, ptr %po, align 4
  %next = add nuw nsw i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}}
"""


def saxpy(name: str = "saxpy", c: str = "1.0") -> str:
    return SAXPY.format(name=name, c=c)


def _call(lib, name, *arrays, n):
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * len(arrays) + [ctypes.c_int64]
    fn.restype = None
    fn(*[a.ctypes.data for a in arrays], n)


# -- targets -------------------------------------------------------------------------------------

def test_host_target_describes_this_cpu():
    t = host_target()
    assert t.triple.startswith("x86_64") and t.cpu
    assert t.isa <= set(ISA_FEATURES)
    on = {f[1:] for f in t.features.split(",") if f.startswith("+")}
    assert t.isa == {f for f in ISA_FEATURES if f in on}
    assert "sse2" in t.isa and t.vector_bits >= 128
    assert t.vector_bits == (512 if t.has("avx512f") else 256 if t.has("avx") else 128)
    assert host_target() is host_target()  # cached
    assert t.target_machine() is t.target_machine()
    assert "cpu=" in t.describe()


def test_named_targets():
    zen3 = target_for("znver3")
    assert zen3.has("avx2") and zen3.has("fma") and not zen3.has("avx512f")
    assert zen3.vector_bits == 256 and zen3.f32_lanes == 8
    assert target_for("x86-64-v4").has("avx512f")
    custom = target_for("haswell", "+avx2,+fma,-avx512f")
    assert custom.isa == {"avx2", "fma"}
    with pytest.raises(ValueError, match="not in KNOWN_CPUS"):
        target_for("my-cpu")
    with pytest.raises(ValueError, match="unknown ISA feature"):
        zen3.has("avx9")


def test_zen3_code_uses_256_bit_registers_only():
    asm = assembly(saxpy(), target_for("znver3"))
    assert "ymm" in asm and "zmm" not in asm
    assert "vfmadd" not in asm  # fmul + fadd without fast-math flags must not be fused


# -- compile, link, load, call ----------------------------------------------------------------------

def test_compile_link_load_call(tmp_path):
    obj = compile_ir(saxpy())
    assert obj[:4] == b"\x7fELF"
    path = link_shared([obj], tmp_path / "libsaxpy.so")
    assert path.is_file() and not list(tmp_path.glob(".*.tmp"))
    lib = load_library(path)
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 33, 1000):
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        out = np.full(n + 1, -7.0, np.float32)  # one guard element
        _call(lib, "saxpy", a, b, out, n=n)
        np.testing.assert_array_equal(out[:n], a * b + np.float32(1))
        assert out[n] == -7.0


def test_one_library_from_several_modules(tmp_path):
    path = build_library([saxpy("f_one", "1.0"), saxpy("f_two", "2.0")], tmp_path / "libtwo.so")
    lib = load_library(path)
    a, b, out = np.ones(16, np.float32), np.full(16, 3, np.float32), np.empty(16, np.float32)
    _call(lib, "f_one", a, b, out, n=16)
    assert (out == 4).all()
    _call(lib, "f_two", a, b, out, n=16)
    assert (out == 5).all()


def test_loop_vectorizes():
    text = optimized_ir(saxpy())
    width = max(int(w) for w in re.findall(r"<(\d+) x float>", text))
    assert width >= host_target().f32_lanes
    assert "vector.body" in text
    # opt level 0 leaves the scalar loop alone
    assert "x float>" not in optimized_ir(saxpy(), opt_level=0)


def test_identical_functions_merge_before_optimizing(tmp_path):
    """Two internal functions of the same code become one (calls go to the one left); one that
    differs in a constant stays; the results are each call's own."""
    helpers = "".join(saxpy(name, c).replace("define void", "define internal void")
                      for name, c in (("h_a", "1.0"), ("h_b", "1.0"), ("h_c", "2.0")))
    run = """
define void @run(ptr %a, ptr %b, ptr %o1, ptr %o2, ptr %o3, i64 %n) {
entry:
  call void @h_a(ptr %a, ptr %b, ptr %o1, i64 %n)
  call void @h_b(ptr %a, ptr %b, ptr %o2, i64 %n)
  call void @h_c(ptr %a, ptr %b, ptr %o3, i64 %n)
  ret void
}
"""
    m = parse_module(helpers + run)
    merge_functions(m, host_target())
    defined = {f.name for f in m.functions if not f.is_declaration}
    assert "run" in defined and "h_c" in defined and len(defined & {"h_a", "h_b"}) == 1
    lib = load_library(link_shared([compile_ir(helpers + run)], tmp_path / "libmerged.so"))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(37).astype(np.float32), rng.standard_normal(37).astype(np.float32)
    outs = [np.zeros(37, np.float32) for _ in range(3)]
    _call(lib, "run", a, b, *outs, n=37)
    for out, c in zip(outs, (1, 1, 2)):
        np.testing.assert_array_equal(out, a * b + np.float32(c))


def test_parse_module_sets_the_target():
    m = parse_module(saxpy())
    assert m.triple == host_target().triple and m.data_layout


# -- errors ----------------------------------------------------------------------------------------

def test_parse_error_points_at_the_line():
    text = "define void @f() {\nentry:\n  %x = fadd float 1.0, %nope\n  ret void\n}\n"
    with pytest.raises(CodegenError, match=r"parse error at line 3.*undefined value '%nope'") as e:
        compile_ir(text)
    assert ">    3 |   %x = fadd float 1.0, %nope" in str(e.value)
    assert isinstance(e.value, KilnError)


def test_verifier_error_quotes_the_instructions():
    text = ("define void @g(i32 %a) {\nentry:\n  br label %b\nb:\n  %y = add i32 %z, 1\n"
            "  %z = add i32 %a, 1\n  ret void\n}\n")
    with pytest.raises(CodegenError, match="verifier error: Instruction does not dominate all uses") as e:
        compile_ir(text)
    msg = str(e.value)
    assert "line 5 (in void @g)" in msg and ">    5 |   %y = add i32 %z, 1" in msg


def test_link_error_is_clear(tmp_path):
    obj = compile_ir(saxpy())
    with pytest.raises(CodegenError, match="(?s)linking libdup.so failed.*multiple definition of .saxpy"):
        link_shared([obj, obj], tmp_path / "libdup.so")  # the same symbol twice
    assert not list(tmp_path.iterdir())
    with pytest.raises(CodegenError, match="at least one object"):
        link_shared([], tmp_path / "libnone.so")


def test_no_compiler_driver(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(CodegenError, match="no C compiler driver found"):
        find_cc()


def test_load_errors(tmp_path):
    with pytest.raises(CodegenError, match="no shared library"):
        load_library(tmp_path / "missing.so")
    (tmp_path / "junk.so").write_bytes(b"not a library")
    with pytest.raises(CodegenError, match="could not load"):
        load_library(tmp_path / "junk.so")


def test_bad_opt_level():
    with pytest.raises(ValueError, match="opt_level"):
        compile_ir(saxpy(), opt_level=4)
