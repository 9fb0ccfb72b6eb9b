"""compiler/codegen/llvm/workarounds.py: the rewrites that keep LLVM's code generator away from its
known miscompiles, checked on their text, on the optimized IR for an AVX-512 target (whatever the
host), and by running the reduced reproducer on the host."""
from __future__ import annotations

import ctypes

import numpy as np

from compiler.codegen.llvm import toolchain
from compiler.codegen.llvm.target import host_target, target_for
from compiler.codegen.llvm.workarounds import define_i1_shuffle_lanes

# Reduced from Where(cond: bool[9], x: f32[8,9], y: f32[]) after LLVM's O3 (its last block of 8
# outputs): lane 7 of the shuffled mask is undefined, then set by insertelement. On AVX-512 LLVM 22
# lowered the insert as an OR into a mask whose lane 7 held a stray 1: out[7] came out as y.
REDUCED = """
define void @where_tail(ptr %c, ptr %x, ptr %py, ptr %out) {
  %y = load float, ptr %py
  %c8p = getelementptr i8, ptr %c, i64 8
  %c8 = load i8, ptr %c8p
  %c8z = icmp eq i8 %c8, 0
  %v = load <8 x i8>, ptr %c
  %m = icmp eq <8 x i8> %v, zeroinitializer
  %ys0 = insertelement <8 x float> poison, float %y, i64 0
  %ys = shufflevector <8 x float> %ys0, <8 x float> poison, <8 x i32> zeroinitializer
  %xv = load <8 x float>, ptr %x, align 4
  %s = shufflevector <8 x i1> %m, <8 x i1> poison, <8 x i32> <i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 poison>
  %m2 = insertelement <8 x i1> %s, i1 %c8z, i64 7
  %r = select <8 x i1> %m2, <8 x float> %ys, <8 x float> %xv
  store <8 x float> %r, ptr %out, align 4
  ret void
}
"""


def test_undefined_lanes_of_i1_shuffles_name_lane_0():
    text = ("  %a = shufflevector <4 x i1> %m, <4 x i1> poison, <4 x i32> <i32 1, i32 poison, i32 undef, i32 3>\n"
            "  %b = shufflevector <4 x float> %f, <4 x float> poison, <4 x i32> <i32 1, i32 poison, i32 2, i32 3>\n"
            "  %c = shufflevector <2 x i1> %m, <2 x i1> %n, <2 x i32> poison\n")
    assert define_i1_shuffle_lanes(text) == (
        "  %a = shufflevector <4 x i1> %m, <4 x i1> poison, <4 x i32> <i32 1, i32 0, i32 0, i32 3>\n"
        "  %b = shufflevector <4 x float> %f, <4 x float> poison, <4 x i32> <i32 1, i32 poison, i32 2, i32 3>\n"
        "  %c = shufflevector <2 x i1> %m, <2 x i1> %n, <2 x i32> zeroinitializer\n")


def test_a_module_without_undefined_i1_lanes_is_left_alone():
    text = "  %b = shufflevector <4 x float> %f, <4 x float> poison, <4 x i32> <i32 1, i32 poison, i32 2, i32 3>\n"
    assert define_i1_shuffle_lanes(text) is text


def test_the_optimized_ir_for_avx512_has_no_undefined_i1_lane():
    """What the code generator gets, for an AVX-512 CPU whatever the host is."""
    ir = toolchain.optimized_ir(REDUCED, target_for("skylake-avx512"))
    shuffles = [ln for ln in ir.splitlines() if "shufflevector <8 x i1>" in ln]
    assert shuffles and not any("poison" in ln.split("<8 x i32>")[1] for ln in shuffles), ir


def test_the_reduced_reproducer_runs_right_on_the_host(tmp_path):
    obj = toolchain.compile_ir(REDUCED, host_target())
    so = str(tmp_path / "r.so")
    toolchain.link_shared([obj], so)
    lib = toolchain.load_library(so)
    c = np.array([1, 0, 1, 1, 0, 1, 1, 1, 1], np.uint8)
    x = np.arange(8, dtype=np.float32)
    y = np.array([-7.0], np.float32)
    out = np.zeros(8, np.float32)
    lib.where_tail(*(ctypes.c_void_p(a.ctypes.data) for a in (c, x, y, out)))
    want = np.where(c[1:] != 0, x, y[0])
    np.testing.assert_array_equal(out, want)
