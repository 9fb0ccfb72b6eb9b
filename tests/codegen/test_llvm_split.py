"""Compiling a large module in parts, side by side (``codegen/llvm/split.py``,
``toolchain.compile_parts``): the parts are modules of their own that link into the library the
whole module makes, and anything the splitter does not know compiles whole."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from compiler.codegen.llvm import toolchain
from compiler.codegen.llvm.split import split_module
from compiler.codegen.llvm.target import host_target


def _kernel(i: int, factor: float) -> str:
    """A kernel as lowerings make them: an internal function, its internal helper and constant, all
    named after the kernel, calling a helper shared by every kernel."""
    k = f"k{i}_Mul"
    return f'''
@"{k}.scale" = internal constant [1 x float] [float {factor}]
define internal void @"{k}.body"(ptr noalias %"x", i64 %"n") nounwind
{{
entry:
  %"s" = load float, ptr @"{k}.scale"
  call void @"kiln_scale"(ptr %"x", i64 %"n", float %"s")
  ret void
}}
define internal void @"{k}"(ptr %"x", i64 %"n") noinline nounwind
{{
entry:
  call void @"{k}.body"(ptr %"x", i64 %"n")
  ret void
}}'''


def _module(kernels: int = 5) -> str:
    head = '''; ModuleID = "m"
target triple = "unknown-unknown-unknown"
target datalayout = ""

declare i32 @"some_external"(i32 %".1")
define linkonce_odr void @"kiln_scale"(ptr noalias %"x", i64 %"n", float %"s") nounwind
{
entry:
  %"c" = icmp sgt i64 %"n", 0
  br i1 %"c", label %"body", label %"end"
body:
  %"i" = phi i64 [0, %"entry"], [%"i2", %"body"]
  %"p" = getelementptr inbounds float, ptr %"x", i64 %"i"
  %"v" = load float, ptr %"p"
  %"w" = fmul float %"v", %"s"
  store float %"w", ptr %"p"
  %"i2" = add i64 %"i", 1
  %"d" = icmp slt i64 %"i2", %"n"
  br i1 %"d", label %"body", label %"end"
end:
  ret void
}'''
    body = "".join(_kernel(i, 1.0 + i) for i in range(kernels))
    calls = "\n".join(f'  call void @"k{i}_Mul"(ptr %"x", i64 %"n")' for i in range(kernels))
    forward = f'''
define void @"kiln_forward"(ptr %"x", i64 %"n") nounwind
{{
entry:
{calls}
  ret void
}}
'''
    return head + body + forward


def _run(objects, tmp_path, n=37) -> np.ndarray:
    lib = toolchain.load_library(toolchain.link_shared(objects, tmp_path / "lib.so"))
    x = np.arange(n, dtype=np.float32)
    fn = lib.kiln_forward
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int64], None
    fn(x.ctypes.data, n)
    return x


def test_the_parts_make_the_library_the_whole_module_makes(tmp_path):
    text = _module()
    parts = split_module(text, 2)
    assert parts is not None and len(parts) == 2
    for p in parts:
        toolchain.parse_module(p)  # each part is a module LLVM verifies on its own
    # every kernel whole in one part, called across parts through hidden symbols
    assert sum('define internal void @"k3_Mul.body"' in p for p in parts) == 1
    assert sum('define void @"kiln_forward"' in p for p in parts) == 1
    assert 'declare hidden void @"k' in parts[0] and "define hidden void @\"k" in parts[1]
    want = np.arange(37, dtype=np.float32) * np.prod([1.0 + i for i in range(5)])
    whole = _run([toolchain.compile_ir(text, host_target())], tmp_path / "a")
    split = _run([toolchain.compile_ir(p, host_target()) for p in parts], tmp_path / "b")
    np.testing.assert_array_equal(whole, want)
    np.testing.assert_array_equal(split, want)


def test_more_parts_than_kernels_and_refusals():
    assert len(split_module(_module(kernels=2), 8)) == 3  # the forward's part and one per kernel
    assert split_module(_module(kernels=0), 2) is None     # no kernel: nothing to split
    assert split_module(_module(), 1) is None
    assert split_module(_module() + "module asm \"nop\"\n", 2) is None  # a line it does not know
    # a kernel's constant read by another kernel: the parts could not declare it; compiled whole
    crossing = _module().replace('load float, ptr @"k1_Mul.scale"', 'load float, ptr @"k0_Mul.scale"')
    assert split_module(crossing, 5) is None


@pytest.mark.parametrize("python", ["/nonexistent/python", "/bin/false"])
def test_compile_parts_in_workers_and_when_a_worker_fails(tmp_path, monkeypatch, python):
    """Large modules compile in worker processes; a worker that cannot start or fails has its part
    compiled in this process, with the same result."""
    text = _module(kernels=6)
    monkeypatch.setattr(toolchain, "SPLIT_MIN_CHARS", 0)
    objects = toolchain.compile_parts(text, host_target(), workers=3)
    assert len(objects) == 3
    want = _run(objects, tmp_path / "ok")
    monkeypatch.setattr(toolchain.sys, "executable", python)
    np.testing.assert_array_equal(_run(toolchain.compile_parts(text, host_target(), workers=3), tmp_path / "bad"),
                                  want)
    assert len(toolchain.compile_parts(text, host_target(), workers=1)) == 1


def test_an_error_in_a_part_is_raised(monkeypatch):
    """Invalid IR in the part compiled here raises as compiling the whole module would (the workers
    are stopped)."""
    bad = _module().replace("  ret void\n}\n", "  ret i32 0\n}\n")  # the forward function's return
    assert bad != _module()
    monkeypatch.setattr(toolchain, "SPLIT_MIN_CHARS", 0)
    with pytest.raises(toolchain.CodegenError, match="LLVM IR"):
        toolchain.compile_parts(bad, host_target(), workers=2)


def test_a_model_compiled_in_parts_runs_as_compiled_whole(monkeypatch):
    """End to end: a model whose module is split (the size threshold lowered) gives the outputs of
    the same model compiled as one module."""
    import compiler
    from compiler.tools.zoo import model_of

    model = model_of("zoo:mlp?batch=2")
    x = np.random.default_rng(0).standard_normal((2, 784)).astype(np.float32)
    whole = compiler.compile(model, cache=False)
    monkeypatch.setattr(toolchain, "SPLIT_MIN_CHARS", 0)
    made = []
    real = toolchain.compile_parts
    monkeypatch.setattr(toolchain, "compile_parts", lambda *a, **k: made.append(real(*a, workers=2)) or made[-1])
    split = compiler.compile(model, cache=False)
    assert [len(objects) for objects in made] == [2]
    name = whole.input_names[0]
    a, b = whole.run({name: x}), split.run({name: x})
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
