"""sink-reshapes: a Reshape between a GEMM and its elementwise users moves below them. Structure (the
expected IR), numbers (the interpreter agrees before and after) and refusals (the rule's reason)."""
from __future__ import annotations

import numpy as np

from compiler.codegen.fusion import CPU_FUSION
from compiler.passes.fuse import FuseKernels
from compiler.passes.sink_reshapes import SinkReshape, SinkReshapes

from .util import ir, run_pass, same_ir

RNG = np.random.default_rng(2)
W = {"w": RNG.standard_normal((16, 16)).astype(np.float32), "b": (np.arange(16) / 4).astype(np.float32)}
B_TEXT = "dense<[" + ", ".join(str(float(x)) for x in W["b"]) + "]>"  # 16 values print inline

GELU_RESIDUAL = """
graph @g(%x: f32[8,16], %r: f32[1,8,16]) -> (y: f32[1,8,16]) {
  %w = const f32[16,16]
  %b = const f32[16]
  %s = const i64[3] dense<[1, 8, 16]>
  %h = const f32[] dense<0.5>
  %0 = Gemm(%x, %w, %b) : f32[8,16]
  %1 = Reshape(%0, %s) : f32[1,8,16]
  %2 = Mul(%1, %h) : f32[1,8,16]
  %3 = Add(%2, %r) : f32[1,8,16]
  %4 = Tanh(%3) : f32[1,8,16]
  %5 = Mul(%4, %1) : f32[1,8,16]
  return y=%5
}"""


def test_reshape_sinks_to_the_end_of_the_chain():
    g = ir(GELU_RESIDUAL, W)
    assert run_pass(SinkReshapes(capabilities=CPU_FUSION), g)
    same_ir(g, f"""
    graph @g(%x: f32[8,16], %r: f32[1,8,16]) -> (y: f32[1,8,16]) {{
      %w = const f32[16,16]
      %b = const f32[16] {B_TEXT}
      %h = const f32[] dense<0.5>
      %Reshape.shape = const i64[2] dense<[8, 16]>
      %Reshape.shape_1 = const i64[3] dense<[1, 8, 16]>
      %0 = Gemm(%x, %w, %b) : f32[8,16]
      %1 = Mul(%0, %h) : f32[8,16]
      %2 = Reshape(%r, %Reshape.shape) : f32[8,16]
      %3 = Add(%1, %2) : f32[8,16]
      %4 = Tanh(%3) : f32[8,16]
      %5 = Mul(%4, %0) : f32[8,16]
      %6 = Reshape(%5, %Reshape.shape_1) : f32[1,8,16]
      return y=%6
    }}""")
    # and the whole chain is then the GEMM's epilogue
    FuseKernels(capabilities=CPU_FUSION).run(g)
    kernels = [n for n in g.nodes if n.op.name == "Kernel"]
    assert len(kernels) == 1 and kernels[0].op.members() == \
        ["Gemm", "Mul", "Add", "Tanh", "Mul"]


def test_trailing_broadcast_and_constants_are_seen_in_the_source_shape():
    g = ir("""
    graph @g(%x: f32[8,16], %c: f32[16]) -> (y: f32[2,4,16]) {
      %w = const f32[16,16]
      %b = const f32[16]
      %s = const i64[3] dense<[2, 4, 16]>
      %k = const f32[2,4,16]
      %0 = Gemm(%x, %w, %b) : f32[8,16]
      %1 = Reshape(%0, %s) : f32[2,4,16]
      %2 = Add(%1, %c) : f32[2,4,16]
      %3 = Mul(%2, %k) : f32[2,4,16]
      return y=%3
    }""", {**W, "k": RNG.standard_normal((2, 4, 16)).astype(np.float32)})
    assert run_pass(SinkReshapes(capabilities=CPU_FUSION), g)
    ops = [(n.op.name, [list(v.shape) for v in n.inputs]) for n in g.nodes]
    assert ops == [("Gemm", [[8, 16], [16, 16], [16]]), ("Add", [[8, 16], [16]]), ("Mul", [[8, 16], [8, 16]]),
                   ("Reshape", [[8, 16], [3]])]


def _gemm_reshaped(inputs: str, out: str, tail: str):
    """A Gemm [8,16] reshaped to ``out``, then ``tail`` (IR lines reading %1, returning y)."""
    dims = out.strip("[]")
    return ir(f"""
    graph @g(%x: f32[8,16]{inputs}) -> (y: f32{out}) {{
      %w = const f32[16,16]
      %b = const f32[16]
      %s = const i64[3] dense<[{dims.replace(",", ", ")}]>
      %0 = Gemm(%x, %w, %b) : f32[8,16]
      %1 = Reshape(%0, %s) : f32{out}
    {tail}
    }}""", W)


def test_refusals():
    rule = SinkReshape(CPU_FUSION)
    # the side operand broadcasts along the axes the Reshape splits: the rule says so
    g = _gemm_reshaped(", %c: f32[2,1,16]", "[2,4,16]", """  %2 = Add(%1, %c) : f32[2,4,16]
      return y=%2""")
    assert "broadcasts along dimensions the Reshape from [8, 16] changes" in rule.check(g.nodes[-1])
    assert not run_pass(SinkReshapes(capabilities=CPU_FUSION), g)
    # a Reshape of a graph input: nothing to fuse with, nothing moves
    g = ir("""
    graph @g(%x: f32[8,16]) -> (y: f32[2,4,16]) {
      %s = const i64[3] dense<[2, 4, 16]>
      %0 = Reshape(%x, %s) : f32[2,4,16]
      %1 = Relu(%0) : f32[2,4,16]
      return y=%1
    }""")
    assert rule.check(g.nodes[-1]) == "no operand is a Reshape of a result the op could fuse with"
    assert not run_pass(SinkReshapes(capabilities=CPU_FUSION), g)


def test_an_op_that_already_reads_a_fusable_producer_stays():
    # the Add reads the Relu directly (it can join the Relu's loop): the Reshape stays where it is,
    # which is also what keeps the rule from moving Reshapes back and forth between two producers
    g = _gemm_reshaped(", %z: f32[1,8,16]", "[1,8,16]", """  %2 = Relu(%z) : f32[1,8,16]
      %3 = Add(%1, %2) : f32[1,8,16]
      return y=%3""")
    assert SinkReshape(CPU_FUSION).check(g.nodes[-1]) == "it already reads Relu's result directly, without a Reshape"
    assert not run_pass(SinkReshapes(capabilities=CPU_FUSION), g)
