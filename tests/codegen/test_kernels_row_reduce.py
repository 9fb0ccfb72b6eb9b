"""Row reductions with their elementwise producers (``kernels/row_reduce.py``): structure (the fusion
pass makes one ``reduction`` kernel of the chain and the reduction), numbers (native against the
reference interpreter, 1 and 2 threads) and refusals (the reason a chain and its reduction stay
apart)."""
from __future__ import annotations

import numpy as np
import pytest

from .fused import check_native, fuse

RNG = np.random.default_rng(17)


def _fuse(text, weights=None):
    return fuse(text, weights, RNG)


def _check(g, feeds, want, threads=(1, 2)):
    check_native(g, feeds, want, threads)


CASES = {
    # BERT's embeddings: token + position, then LayerNorm with scale and bias
    "layernorm": ("""graph @g(%x: f32[2,5,24], %p: f32[1,5,24]) -> (y: f32[2,5,24]) {
  %s = const f32[24]
  %b = const f32[24]
  %0 = Add(%x, %p) : f32[2,5,24]
  %1 = LayerNormalization(%0, %s, %b) {axis=-1} : f32[2,5,24]
  return y=%1
}""", ["Add", "LayerNormalization"]),
    # DenseNet's head: BatchNorm as scale and shift per channel, ReLU, the global average
    "gap": ("""graph @g(%x: f32[2,6,5,7]) -> (y: f32[2,6,1,1]) {
  %s = const f32[6,1,1]
  %t = const f32[6,1,1]
  %0 = Mul(%x, %s) : f32[2,6,5,7]
  %1 = Add(%0, %t) : f32[2,6,5,7]
  %2 = Relu(%1) : f32[2,6,5,7]
  %3 = GlobalAveragePool(%2) : f32[2,6,1,1]
  return y=%3
}""", ["Mul", "Add", "Relu", "GlobalAveragePool"]),
    "softmax": ("""graph @g(%x: f32[3,4,33], %m: f32[33]) -> (y: f32[3,4,33]) {
  %c = const f32[] dense<0.125>
  %0 = Mul(%x, %c) : f32[3,4,33]
  %1 = Add(%0, %m) : f32[3,4,33]
  %2 = Softmax(%1) {axis=-1} : f32[3,4,33]
  return y=%2
}""", ["Mul", "Add", "Softmax"]),
    "logsoftmax": ("""graph @g(%x: f32[3,40]) -> (y: f32[3,40]) {
  %0 = Tanh(%x) : f32[3,40]
  %1 = LogSoftmax(%0) {axis=1} : f32[3,40]
  return y=%1
}""", ["Tanh", "LogSoftmax"]),
    "reducemean_trailing": ("""graph @g(%x: f32[4,3,5], %z: f32[4,3,5]) -> (y: f32[4,1,1]) {
  %ax = const i64[2] dense<[1, 2]>
  %0 = Sub(%x, %z) : f32[4,3,5]
  %1 = Mul(%0, %0) : f32[4,3,5]
  %2 = ReduceMean(%1, %ax) {keepdims=1} : f32[4,1,1]
  return y=%2
}""", ["Sub", "Mul", "ReduceMean"]),
    "reducemax": ("""graph @g(%x: f32[4,37]) -> (y: f32[4]) {
  %ax = const i64[1] dense<[-1]>
  %0 = Neg(%x) : f32[4,37]
  %1 = ReduceMax(%0, %ax) {keepdims=0} : f32[4]
  return y=%1
}""", ["Neg", "ReduceMax"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chain_and_reduction_are_one_kernel(case):
    text, members = CASES[case]
    weights = {"s": RNG.standard_normal((6, 1, 1) if case == "gap" else 24).astype(np.float32),
               "b": RNG.standard_normal(24).astype(np.float32),
               "t": RNG.standard_normal((6, 1, 1)).astype(np.float32)}
    g, p, feeds, want = _fuse(text, {k: v for k, v in weights.items() if f"%{k} = const" in text})
    assert [(n.op.name, n.op.kind) for n in g.nodes] == [("Kernel", "reduction")]
    assert g.nodes[0].op.members() == members
    assert any(d.fused and d.reason == "elementwise chain into its reduction" for d in p.decisions)
    _check(g, feeds, want)


def test_the_chain_value_needed_outside_is_written_too():
    # a pre-LN transformer's residual: the sum goes to LayerNorm and out (a multi-output kernel)
    g, p, feeds, want = _fuse("""graph @g(%x: f32[6,32], %r: f32[6,32]) -> (y: f32[6,32], h: f32[6,32]) {
  %s = const f32[32]
  %0 = Add(%x, %r) : f32[6,32]
  %1 = LayerNormalization(%0, %s) {axis=-1} : f32[6,32]
  return y=%1, h=%0
}""", {"s": RNG.standard_normal(32).astype(np.float32)})
    assert [n.op.kind for n in g.nodes] == ["reduction"] and len(g.nodes[0].outputs) == 2
    _check(g, feeds, want)


def test_refusals_name_the_reason():
    # a reduction over leading axes is not a row reduction: the chain stays a loop of its own
    g, p, feeds, want = _fuse("""graph @g(%x: f32[4,6]) -> (y: f32[1,6]) {
  %ax = const i64[1] dense<[0]>
  %0 = Relu(%x) : f32[4,6]
  %1 = ReduceSum(%0, %ax) {keepdims=1} : f32[1,6]
  return y=%1
}""")
    assert [n.op.name for n in g.nodes] == ["Relu", "ReduceSum"]
    why = [d.reason for d in p.decisions if d.consumer.op.name == "ReduceSum"]
    assert why == ["ReduceSum is not elementwise (pattern reduce); not as the chain's reduction: "
                   "ReduceSum over axes [0], not the trailing axes"]
    _check(g, feeds, want)
    # an operand broadcast over part of the row: refused with the operand named
    g, p, feeds, want = _fuse("""graph @g(%x: f32[2,3,4], %z: f32[3,1]) -> (y: f32[2,3,4]) {
  %s = const f32[3,4]
  %0 = Add(%x, %z) : f32[2,3,4]
  %1 = LayerNormalization(%0, %s) {axis=1} : f32[2,3,4]
  return y=%1
}""", {"s": RNG.standard_normal((3, 4)).astype(np.float32)})
    assert "broadcast over some of the row's axes only" in \
        [d.reason for d in p.decisions if d.consumer.op.name == "LayerNormalization"][0]
    _check(g, feeds, want)
    # a Softmax not along the last axis
    g, p, feeds, want = _fuse("""graph @g(%x: f32[2,3,4]) -> (y: f32[2,3,4]) {
  %0 = Exp(%x) : f32[2,3,4]
  %1 = Softmax(%0) {axis=1} : f32[2,3,4]
  return y=%1
}""")
    assert "Softmax is not along the last axis" in [d.reason for d in p.decisions if d.consumer.op.name == "Softmax"][0]


def test_an_elementwise_user_continues_the_chain_first():
    # the sum feeds both a Relu (which continues the chain) and a LayerNorm: the chain goes on
    g, p, feeds, want = _fuse("""graph @g(%x: f32[6,32], %r: f32[6,32]) -> (y: f32[6,32], h: f32[6,32]) {
  %s = const f32[32]
  %0 = Add(%x, %r) : f32[6,32]
  %1 = LayerNormalization(%0, %s) {axis=-1} : f32[6,32]
  %2 = Relu(%0) : f32[6,32]
  return y=%1, h=%2
}""", {"s": RNG.standard_normal(32).astype(np.float32)})
    assert [n.op.name for n in g.nodes] == ["Kernel", "LayerNormalization"]
    assert g.nodes[0].op.kind == "elementwise"
    _check(g, feeds, want)


def test_rows_split_among_threads():
    # enough rows for the thread pool (the row loop runs as parallel tasks, each row buffer on its
    # task's stack); GAP over 2 images x 64 channels of 28 x 28 the same
    g, p, feeds, want = _fuse("""graph @g(%x: f32[256,384], %r: f32[256,384]) -> (y: f32[256,384]) {
  %s = const f32[384]
  %0 = Add(%x, %r) : f32[256,384]
  %1 = LayerNormalization(%0, %s) {axis=-1} : f32[256,384]
  return y=%1
}""", {"s": RNG.standard_normal(384).astype(np.float32)})
    assert [n.op.kind for n in g.nodes] == ["reduction"]
    _check(g, feeds, want, threads=(1, 2, 3))
    g, p, feeds, want = _fuse("""graph @g(%x: f32[2,64,28,28]) -> (y: f32[2,64,1,1]) {
  %0 = Relu(%x) : f32[2,64,28,28]
  %1 = GlobalMaxPool(%0) : f32[2,64,1,1]
  return y=%1
}""")
    assert [n.op.kind for n in g.nodes] == ["reduction"]
    _check(g, feeds, want, threads=(1, 2, 3))
