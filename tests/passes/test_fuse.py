"""The fusion pass: structure (the kiln.Kernel nodes it makes), numbers (the interpreter agrees before
and after) and refusals (shared producer, cycle, pattern, broadcast, limit), each with its reason."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.fusion import CPU_FUSION
from compiler.ir.interpreter import interpret
from compiler.ir.parser import parse
from compiler.ir.printer import external_weights, print_graph
from compiler.ir.verify import verify
from compiler.passes.fuse import FuseKernels, plan_fusion

RNG = np.random.default_rng(0)


def _feeds(g):
    def one(v):
        shape = [int(d) for d in v.shape]
        if v.dtype.is_float:
            return RNG.standard_normal(shape).astype(v.dtype.np)
        return RNG.integers(0, 100, shape).astype(v.dtype.np)
    return {v.name: one(v) for v in g.inputs}


def _fuse(text, weights=None, **kw):
    g = parse(text, weights)
    feeds = _feeds(g)
    before = interpret(g, feeds)
    p = FuseKernels(**{"capabilities": CPU_FUSION, **kw})
    changed = p.run(g)
    verify(g)
    after = interpret(g, feeds)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    return g, p, changed


EPILOGUE = """graph @g(%x: f32[1,4,6,6]) -> (y: f32[1,8,6,6]) {
  %w = const f32[8,4,3,3]
  %b = const f32[8]
  %s = const f32[8,1,1]
  %0 = Conv(%x, %w, %b) {pads=[1, 1, 1, 1]} : f32[1,8,6,6]
  %1 = Mul(%0, %s) : f32[1,8,6,6]
  %2 = Relu(%1) : f32[1,8,6,6]
  return y=%2
}"""
W = {"w": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32), "b": RNG.standard_normal(8).astype(np.float32),
     "s": RNG.standard_normal((8, 1, 1)).astype(np.float32)}


def test_conv_epilogue_becomes_one_kernel():
    g, p, changed = _fuse(EPILOGUE, W)
    assert changed
    assert [n.op.name for n in g.nodes] == ["Kernel"]
    k = g.nodes[0].op
    assert k.kind == "epilogue" and k.members() == ["Conv", "Mul", "Relu"]
    text = print_graph(g)
    assert "kiln.Kernel(%x)" in text and 'kind="epilogue"' in text
    assert print_graph(parse(text, external_weights(g))) == text  # the printed kernel parses back
    assert [d.fused for d in p.decisions] == [True, True]


def test_elementwise_chain_and_multi_output():
    g, p, _ = _fuse("""graph @g(%x: f32[4,8], %y: f32[4,8]) -> (a: f32[4,8], b: f32[4,8]) {
  %0 = Add(%x, %y) : f32[4,8]
  %1 = Tanh(%0) : f32[4,8]
  %2 = Mul(%1, %x) : f32[4,8]
  return a=%2, b=%0
}""")
    assert [n.op.name for n in g.nodes] == ["Kernel"]
    node = g.nodes[0]
    assert node.op.kind == "elementwise" and node.op.members() == ["Add", "Tanh", "Mul"]
    assert len(node.outputs) == 2  # %0 is needed outside too: a multi-output kernel


def test_an_int8_layers_rescale_is_one_kernel():
    """The integer product takes the chain after its sums (a ``requantize`` block: the quantize
    pass's rescale, bias, activation); a Cast of anything else to float starts no chain."""
    g, p, _ = _fuse("""graph @g(%a: u8[4,8], %b: u8[8,3], %i: i64[4,3]) -> (y: f32[4,3], z: f32[4,3]) {
  %s = const f32[3] dense<[0.5, 0.25, 2.0]>
  %0 = MatMulInteger(%a, %b) : i32[4,3]
  %1 = Cast(%0) {to=f32} : f32[4,3]
  %2 = Mul(%1, %s) : f32[4,3]
  %3 = Relu(%2) : f32[4,3]
  %4 = Cast(%i) {to=f32} : f32[4,3]
  %5 = Relu(%4) : f32[4,3]
  return y=%3, z=%5
}""")
    kernels = [n.op for n in g.nodes if n.op.name == "Kernel"]
    assert [k.members() for k in kernels] == [["MatMulInteger", "Cast", "Mul", "Relu"]]
    assert kernels[0].kind == "requantize"
    assert [n.op.name for n in g.nodes].count("Cast") == 1  # the i64 one stays alone


def test_quantize_and_dequantize_by_one_scale_join_elementwise_chains():
    """An int8 layer's rescale ends in the next layer's QuantizeLinear, and its residual Add reads a
    DequantizeLinear, computed in the same kernel (its float result is never written). A
    QuantizeLinear per channel stays its own kernel (the elementwise loop broadcasts its operands
    NumPy's way, not along an axis)."""
    g, p, _ = _fuse("""graph @g(%a: u8[4,8], %b: u8[8,3], %r: u8[4,3], %c: f32[2,3,4]) -> (y: u8[4,3], z: u8[2,3,4]) {
  %s = const f32[3] dense<[0.5, 0.25, 2.0]>
  %sy = const f32[] dense<0.2>
  %zy = const u8[] dense<7>
  %sc = const f32[3] dense<[0.5, 0.25, 2.0]>
  %zc = const u8[3] dense<[1, 2, 3]>
  %0 = MatMulInteger(%a, %b) : i32[4,3]
  %1 = Cast(%0) {to=f32} : f32[4,3]
  %2 = Mul(%1, %s) : f32[4,3]
  %3 = DequantizeLinear(%r, %sy, %zy) : f32[4,3]
  %4 = Add(%2, %3) : f32[4,3]
  %5 = Relu(%4) : f32[4,3]
  %6 = QuantizeLinear(%5, %sy, %zy) : u8[4,3]
  %7 = QuantizeLinear(%c, %sc, %zc) {axis=1} : u8[2,3,4]
  return y=%6, z=%7
}""")
    kernels = [n.op for n in g.nodes if n.op.name == "Kernel"]
    assert [k.members() for k in kernels] == [["MatMulInteger", "Cast", "Mul", "DequantizeLinear", "Add", "Relu",
                                               "QuantizeLinear"]]
    assert [n.op.name for n in g.nodes].count("QuantizeLinear") == 1  # the per-channel one
    assert "DequantizeLinear" not in [n.op.name for n in g.nodes]  # a side operand, computed in the kernel


def test_a_residual_reads_the_bytes_of_the_add_before():
    """ONNX Runtime's QOperator models add residuals with QLinearAdd, which Kiln reads as
    DequantizeLinear, DequantizeLinear, Add, QuantizeLinear, the two dequantizations next to the
    Add (the convolution's first). The first Add's QuantizeLinear feeds the next convolution and the
    next Add's skip dequantization; that DequantizeLinear is not taken into the first kernel (which would write a
    float copy of the skip for the second Add, whose other operand comes through the convolution):
    the second Add's kernel computes both of its operands from the bytes."""
    g, p, _ = _fuse("""graph @g(%a: u8[1,4,3,3], %c: u8[1,4,3,3]) -> (y: u8[1,4,3,3]) {
  %s = const f32[] dense<0.1>
  %z = const u8[] dense<128>
  %w = const i8[4,4,1,1]
  %ws = const f32[] dense<0.01>
  %wz = const i8[] dense<0>
  %0 = DequantizeLinear(%a, %s, %z) : f32[1,4,3,3]
  %1 = DequantizeLinear(%c, %s, %z) : f32[1,4,3,3]
  %2 = Add(%0, %1) : f32[1,4,3,3]
  %3 = QuantizeLinear(%2, %s, %z) : u8[1,4,3,3]
  %4 = QLinearConv(%3, %s, %z, %w, %ws, %wz, %s, %z) : u8[1,4,3,3]
  %5 = DequantizeLinear(%4, %s, %z) : f32[1,4,3,3]
  %6 = DequantizeLinear(%3, %s, %z) : f32[1,4,3,3]
  %7 = Add(%5, %6) : f32[1,4,3,3]
  %8 = QuantizeLinear(%7, %s, %z) : u8[1,4,3,3]
  return y=%8
}""", {"w": RNG.integers(-20, 20, (4, 4, 1, 1)).astype(np.int8)})
    kernels = [n for n in g.nodes if n.op.name == "Kernel"]
    assert [sorted(k.op.members()) for k in kernels] == [["Add", "DequantizeLinear", "DequantizeLinear",
                                                         "QuantizeLinear"]] * 2
    assert all(v.type.dtype.name == "u8" for k in kernels for v in k.outputs)  # no float copy written
    why = [d.reason for d in p.decisions if d.producer.op.name == "QuantizeLinear"
           and d.consumer.op.name == "DequantizeLinear"]
    assert why == ["the dequantized value is computed in the kernel of the op reading it"]


def test_a_gemm_epilogue_stops_before_a_quantizelinear():
    """A float GEMM's epilogue computes float32 in the GEMM's blocks: the QuantizeLinear after the
    Relu is not taken, and says why."""
    g, p, _ = _fuse("""graph @g(%x: f32[4,8]) -> (y: u8[4,3]) {
  %w = const f32[8,3]
  %sy = const f32[] dense<0.2>
  %zy = const u8[] dense<0>
  %0 = MatMul(%x, %w) : f32[4,3]
  %1 = Relu(%0) : f32[4,3]
  %2 = QuantizeLinear(%1, %sy, %zy) : u8[4,3]
  return y=%2
}""", {"w": RNG.standard_normal((8, 3)).astype(np.float32)})
    assert [n.op.members() for n in g.nodes if n.op.name == "Kernel"] == [["MatMul", "Relu"]]
    assert any(not d.fused and "a GEMM's epilogue computes float32" in d.reason for d in p.decisions)


def test_refuses_a_cycle():
    # %1 joins %0's kernel; %3 reads %0's result through %2 (outside): fusing %3 would make a cycle
    g, p, _ = _fuse("""graph @g(%x: f32[4,8]) -> (y: f32[4,8]) {
  %0 = Relu(%x) : f32[4,8]
  %1 = Neg(%0) : f32[4,8]
  %2 = ReduceSum(%0) {keepdims=1} : f32[1,1]
  %3 = Add(%1, %2) : f32[4,8]
  return y=%3
}""")
    why = [d for d in p.decisions if not d.fused and d.consumer.op.name == "Add"]
    assert why and why[0].reason.startswith("cycle: its operand from ReduceSum node")


def test_refuses_non_elementwise_and_broadcast_and_limit():
    text = """graph @g(%x: f32[4,8], %z: f32[2,4,8]) -> (y: f32[2,4,8], s: f32[1,8]) {
  %0 = Relu(%x) : f32[4,8]
  %1 = Sigmoid(%0) : f32[4,8]
  %2 = Add(%1, %z) : f32[2,4,8]
  %ax = const i64[1] dense<[0]>
  %3 = ReduceSum(%1, %ax) {keepdims=1} : f32[1,8]
  return y=%2, s=%3
}"""
    g, p, _ = _fuse(text)
    reasons = {d.consumer.op.name: d.reason for d in p.decisions if not d.fused}
    assert reasons["Add"].startswith("Add broadcasts the result to a larger shape")
    # a reduction over the leading axis is no row reduction to end the chain in (tests/codegen/
    # test_kernels_row_reduce.py has the ones that are)
    assert reasons["ReduceSum"] == ("ReduceSum is not elementwise (pattern reduce); not as the chain's reduction: "
                                    "ReduceSum over axes [0], not the trailing axes")
    g, p, _ = _fuse(text, max_ops=1)
    assert all(n.op.name != "Kernel" for n in g.nodes)
    assert any("max_fused_ops=1" in d.reason for d in p.decisions)


def test_shared_producer_stays_a_kernel_result():
    """A result with two users inside and outside: the first continues the chain; the second reads the
    kernel's result (never recomputed)."""
    _, p, _ = _fuse("""graph @g(%x: f32[4,8]) -> (a: f32[4,8], b: f32[4,8]) {
  %0 = Exp(%x) : f32[4,8]
  %1 = Neg(%0) : f32[4,8]
  %2 = Abs(%0) : f32[4,8]
  return a=%1, b=%2
}""")
    fused = [(d.producer.op.name, d.consumer.op.name) for d in p.decisions if d.fused]
    assert fused == [("Exp", "Neg")]
    refused = [d for d in p.decisions if not d.fused]
    assert refused[0].consumer.op.name == "Abs" and "reads the kernel's result" in refused[0].reason


def test_nothing_to_fuse_is_an_honest_no_change():
    g, p, changed = _fuse("""graph @g(%x: f32[4,8]) -> (y: f32[4,1]) {
  %ax = const i64[1] dense<[1]>
  %0 = ReduceSum(%x, %ax) {keepdims=1} : f32[4,1]
  return y=%0
}""")
    assert changed is False and plan_fusion(g, capabilities=CPU_FUSION)[0] == []


@pytest.mark.parametrize("spec", ["zoo:efficientnet_block?resolution=16", "zoo:mlp"])
def test_zoo_models_fuse_without_changing_numbers(spec):
    from compiler.models import load_graph
    from compiler.passes.manager import PassManager, Verify
    from compiler.passes.options import CompileOptions
    from compiler.passes.pipeline import pipeline
    from compiler.tools import zoo

    g = load_graph(zoo.model_of(spec))
    PassManager(pipeline(CompileOptions(opt_level=1)), [Verify()]).run(g)
    feeds = {v.name: RNG.standard_normal([int(d) for d in v.shape]).astype(np.float32) for v in g.inputs}
    before = interpret(g, feeds)
    assert FuseKernels(capabilities=CPU_FUSION).run(g)
    verify(g)
    after = interpret(g, feeds)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
