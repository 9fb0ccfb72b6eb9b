"""split-products: a product whose weights are over the limit becomes pieces along N joined by a
Concat (structure, numbers), from constants and ConstantOfShape fills; refusals."""
from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from compiler.ir.printer import print_graph
from compiler.passes.split_products import SplitProducts

from .util import ir, run_pass

rng = np.random.default_rng(0)


def test_a_gemm_is_cut_into_pieces_along_its_columns():
    g = ir("""
graph @t(%x: f32[4,16]) -> (y: f32[4,8]) {
  %w = const f32[8,16]
  %b = const f32[8]
  %0 = Gemm(%x, %w, %b) {transB=1} : f32[4,8] @"fc"
  %1 = Relu(%0) : f32[4,8]
  return y=%1
}""", {"w": rng.standard_normal((8, 16)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)})
    p = SplitProducts(limit_bytes=200)  # 512 bytes of weights: three pieces of 2, 3 and 3 rows
    assert run_pass(p, g)  # the interpreter agrees
    got = re.sub(r" dense<[^>]*>", "", print_graph(g)).strip()  # the bias pieces' values are printed inline
    assert got == textwrap.dedent("""
graph @t(%x: f32[4,16]) -> (y: f32[4,8]) {
  %w_part0 = const f32[2,16]
  %b_part0 = const f32[2]
  %w_part1 = const f32[3,16]
  %b_part1 = const f32[3]
  %w_part2 = const f32[3,16]
  %b_part2 = const f32[3]
  %0 = Gemm(%x, %w_part0, %b_part0) {transB=1} : f32[4,2] @"fc/part0"
  %1 = Gemm(%x, %w_part1, %b_part1) {transB=1} : f32[4,3] @"fc/part1"
  %2 = Gemm(%x, %w_part2, %b_part2) {transB=1} : f32[4,3] @"fc/part2"
  %3 = Concat(%0, %1, %2) {axis=1} : f32[4,8] @"fc/join"
  %4 = Relu(%3) : f32[4,8]
  return y=%4
}""").strip()
    assert p.split == {"fc": 3}


def test_a_matmul_of_a_fill_gets_one_fill_per_piece():
    g = ir("""
graph @t(%x: f32[2,3,16]) -> (y: f32[2,3,10]) {
  %s = const i64[2] dense<[16, 10]>
  %0 = ConstantOfShape(%s) {value=dense<f32[1]: [0.5]>} : f32[16,10]
  %1 = MatMul(%x, %0) : f32[2,3,10] @"mm"
  return y=%1
}""")
    assert run_pass(SplitProducts(limit_bytes=400), g)  # 640 bytes: two pieces of 5 columns
    fills = [n for n in g.nodes if n.op.name == "ConstantOfShape"]
    assert [tuple(n.outputs[0].shape) for n in fills] == [(16, 5), (16, 5)]
    assert [n.op.name for n in g.nodes if n.op.name != "ConstantOfShape"] == ["MatMul", "MatMul", "Concat"]


def test_small_products_and_computed_weights_are_left_alone():
    text = """
graph @t(%x: f32[4,16], %v: f32[16,8]) -> (y: f32[4,8], z: f32[4,8]) {
  %w = const f32[16,8]
  %0 = Relu(%v) : f32[16,8]
  %1 = MatMul(%x, %0) : f32[4,8] @"computed"
  %2 = MatMul(%x, %w) : f32[4,8] @"small"
  return y=%1, z=%2
}"""
    g = ir(text, {"w": rng.standard_normal((16, 8)).astype(np.float32)})
    p = SplitProducts(limit_bytes=256)
    p.limit_bytes = 1 << 20  # the constant's 512 bytes are under it
    assert not run_pass(p, g)
    p = SplitProducts(limit_bytes=256)
    g = ir(text, {"w": rng.standard_normal((16, 8)).astype(np.float32)})
    assert run_pass(p, g)
    assert p.split == {"small": 2}
    assert "computed" in p.refusals and "weights are computed" in p.refusals["computed"]


@pytest.mark.parametrize("rows", [3, 1, 0])
def test_pieces_agree_with_the_interpreter_for_any_number_of_rows(rows):
    # batch > 1, a size-1 and a size-0 row axis; N = 7 cut into pieces of 2, 2 and 3 columns
    text = f"""
graph @t(%x: f32[{rows},16]) -> (y: f32[{rows},7]) {{
  %w = const f32[16,7]
  %b = const f32[7]
  %0 = Gemm(%x, %w, %b) : f32[{rows},7] @"fc"
  return y=%0
}}"""
    g = ir(text, {"w": rng.standard_normal((16, 7)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32)})
    p = SplitProducts(limit_bytes=160)  # 448 bytes of weights: three pieces
    assert run_pass(p, g)  # the interpreter agrees before and after
    assert p.split == {"fc": 3}
    assert [n.outputs[0].shape for n in g.nodes if n.op.name == "Gemm"] == [(rows, 2), (rows, 2), (rows, 3)]
