"""An integer product and the elementwise chain after it as one kernel (``kernels/requantize.py``, the
fuse pass's ``requantize`` blocks): structure (which chains join, the dequantized residual computed
in the kernel, refusals with their reasons), numbers (native, on each instruction set the host runs
and on the portable loop, against the reference interpreter before fusion) and the refusal of an
operand the finishing expression cannot address."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.fusion import CPU_FUSION
from compiler.codegen.kernels.requantize import FinishChain
from compiler.codegen.kernels.testing import build_kernels, run_kernels
from compiler.codegen.llvm.target import host_target, target_for
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import elementwise as ew
from compiler.ir.ops import quant as qn
from compiler.ir.ops.kernel import Kernel
from compiler.ir.types import DType, TensorType
from compiler.passes.fuse import FuseKernels

CPUS = ["icelake-server", "skylake-avx512", "x86-64-v3", "x86-64-v2"]  # VNNI, AVX-512 BW, AVX2, portable


def _f32(a):
    return np.asarray(a, np.float32)


def _layer(g, rng, x, m, k=1, quantize=True, residual=None, product="conv", clip=True):
    """x (uint8) -> ConvInteger/MatMulInteger -> Cast -> Mul (per channel) -> Add (bias) [-> Add
    (DequantizeLinear of the uint8 ``residual``)] [-> Clip] [-> QuantizeLinear]; returns the last value."""
    c = int(x.shape[1]) if product == "conv" else int(x.shape[-1])
    zx = g.add_constant(np.array(3, np.uint8))
    if product == "conv":
        w = g.add_constant(rng.integers(-127, 128, (m, c, k, k)).astype(np.int8))
        acc = g.add(qn.ConvInteger(pads=(k // 2,) * 4), x, w, zx)
        per = (m, 1, 1)
    else:
        w = g.add_constant(rng.integers(-127, 128, (c, m)).astype(np.int8))
        acc = g.add(qn.MatMulInteger(), x, w, zx)
        per = (m,)
    y = g.add(ew.Mul(), g.add(ew.Cast(to=DType.f32), acc), g.add_constant(_f32(rng.random(per) * 1e-3)))
    y = g.add(ew.Add(), y, g.add_constant(_f32(rng.standard_normal(per))))
    if residual is not None:
        y = g.add(ew.Add(), y, g.add(qn.DequantizeLinear(), residual, g.add_constant(np.float32(0.05)),
                                     g.add_constant(np.array(128, np.uint8))))
    if clip:
        y = g.add(ew.Clip(), y, g.add_constant(np.float32(0.0)), g.add_constant(np.float32(6.0)))
    if quantize:
        y = g.add(qn.QuantizeLinear(), y, g.add_constant(np.float32(6.0 / 255)), g.add_constant(np.array(0, np.uint8)))
    return y


def _graph(seed=0):
    """Every case at once: a 1x1 conv on a large image (W x X) with a uint8 residual, a 3x3 conv on the
    same image (W x cols), a 3x3 conv on a small one (im2col: its chain stays a pass of its own),
    products of a 2-D and a batched 3-D A, one with a float result."""
    rng = np.random.default_rng(seed)
    g = Graph("requantize")
    x = g.add_input("x", TensorType(DType.u8, (2, 12, 24, 24)))
    small = g.add_input("small", TensorType(DType.u8, (2, 12, 7, 7)))
    r = g.add_input("r", TensorType(DType.u8, (2, 20, 24, 24)))
    a = g.add_input("a", TensorType(DType.u8, (9, 40)))
    a3 = g.add_input("a3", TensorType(DType.u8, (2, 5, 40)))
    outs = [_layer(g, rng, x, 20, residual=r), _layer(g, rng, x, 8, k=3), _layer(g, rng, small, 8, k=3), _layer(g, rng, a, 70, product="matmul"),
            _layer(g, rng, a3, 33, product="matmul", quantize=False, clip=False)]
    g.set_outputs(outs, [f"y{i}" for i in range(len(outs))])
    feeds = {v.name: rng.integers(0, 256, [int(d) for d in v.shape]).astype(np.uint8) for v in g.inputs}
    return g, feeds


def _fused(seed=0):
    g, feeds = _graph(seed)
    want = interpret(g, feeds)
    p = FuseKernels(capabilities=CPU_FUSION)
    p.run(g)
    return g, p, feeds, want


def test_structure():
    g, p, _, _ = _fused()
    kernels = [n for n in g.nodes if isinstance(n.op, Kernel)]
    kinds = sorted(n.op.kind for n in kernels)
    # the 1x1 conv (with its dequantized residual), the 3x3 conv on 24x24 and both products; the 3x3
    # conv on 7x7's chain alone
    assert kinds == ["elementwise", "requantize", "requantize", "requantize", "requantize"], kinds
    for n in kernels:
        ops = [m.op.name for m in n.op.body.nodes]
        if n.op.kind == "requantize":
            assert ops[0] in ("ConvInteger", "MatMulInteger") and ops[1] == "Cast", ops
        if "DequantizeLinear" in ops:
            assert n.op.kind == "requantize" and ops.index("DequantizeLinear") < ops.index("Clip"), ops
    texts = [d.text() for d in p.decisions]
    assert any("not as a requantize block: on the im2col path" in t for t in texts), texts
    assert any("a dequantized operand, computed in the kernel" in t for t in texts), texts


def test_an_intermediate_needed_outside_keeps_the_chain_apart():
    rng = np.random.default_rng(1)
    g = Graph("two_outputs")
    x = g.add_input("x", TensorType(DType.u8, (1, 8, 24, 24)))
    y = _layer(g, rng, x, 16, quantize=False)
    q = g.add(qn.QuantizeLinear(), y, g.add_constant(np.float32(0.02)), g.add_constant(np.array(0, np.uint8)))
    g.set_outputs([y, q], ["y", "q"])
    p = FuseKernels(capabilities=CPU_FUSION)
    p.run(g)
    assert not any(isinstance(n.op, Kernel) and n.op.kind == "requantize" for n in g.nodes)
    assert any("needed outside the kernel" in d.text() for d in p.decisions)


@pytest.mark.parametrize("cpu", CPUS)
def test_numbers(cpu):
    """The chain computed on each finished sum gives the interpreter's results: the uint8 results
    exactly, the float one to float32 rounding; the convs on 24x24 and the products carry the note."""
    target = target_for(cpu)
    g, _, feeds, want = _fused(seed=2)
    _, _, plan = build_kernels(g, target)
    notes = [x for _, k in plan if k is not None for x in k.notes]
    assert sum("computed on each finished sum" in x for x in notes) == 4, notes
    if target.isa > host_target().isa:
        pytest.skip(f"this CPU lacks {cpu}'s instructions (the kernels were built above)")
    got = run_kernels(g, feeds, target=target)
    for name, ref in want.items():
        if ref.dtype == np.uint8:
            np.testing.assert_array_equal(got[name], ref, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6 * float(np.abs(ref).max()), err_msg=name)


def test_an_operand_broadcast_along_part_of_the_pixels_is_refused():
    g = Graph("partial")
    x = g.add_input("x", TensorType(DType.u8, (1, 4, 6, 6)))
    acc = g.add(qn.ConvInteger(), x, g.add_constant(np.ones((8, 4, 1, 1), np.int8)))
    f = g.add(ew.Cast(to=DType.f32), acc)
    rows = g.add(ew.Mul(), f, g.add_constant(np.ones((1, 8, 6, 1), np.float32)))   # along image rows only
    chans = g.add(ew.Mul(), f, g.add_constant(np.ones((8, 1, 1), np.float32)))     # per channel: fine
    groups = [(1,), (8,), (6, 6)]
    why = FinishChain([rows.producer], acc, groups).reason()
    assert why is not None and "broadcast along part" in why, why
    assert FinishChain([chans.producer], acc, groups).reason() is None


@pytest.mark.parametrize("shape, rows", [((2, 12, 1, 24), (1, 40)), ((1, 12, 24, 1), (2, 1, 40))])
def test_size_one_axes(shape, rows):
    """Size-1 axes (a one-row image, a one-column image, one-row products, batch 1 and 2): the
    blocks form and give the interpreter's bits on this host."""
    rng = np.random.default_rng(4)
    g = Graph("ones")
    x = g.add_input("x", TensorType(DType.u8, shape))
    a = g.add_input("a", TensorType(DType.u8, rows))
    outs = [_layer(g, rng, x, 20), _layer(g, rng, a, 17, product="matmul")]
    g.set_outputs(outs, ["y0", "y1"])
    feeds = {v.name: rng.integers(0, 256, [int(d) for d in v.shape]).astype(np.uint8) for v in g.inputs}
    want = interpret(g, feeds)
    FuseKernels(capabilities=CPU_FUSION).run(g)
    assert sorted(n.op.kind for n in g.nodes if isinstance(n.op, Kernel)) == ["requantize", "requantize"]
    got = run_kernels(g, feeds)
    for name, ref in want.items():
        np.testing.assert_array_equal(got[name], ref, err_msg=name)


def test_empty_results_are_left_to_the_empty_lowering():
    """A product with a size-0 axis forms no block (its result needs no code) and still runs."""
    rng = np.random.default_rng(5)
    g = Graph("empty")
    a = g.add_input("a", TensorType(DType.u8, (0, 40)))
    g.set_outputs([_layer(g, rng, a, 17, product="matmul")], ["y"])
    feeds = {"a": np.zeros((0, 40), np.uint8)}
    FuseKernels(capabilities=CPU_FUSION).run(g)
    assert not any(isinstance(n.op, Kernel) and n.op.kind == "requantize" for n in g.nodes)
    assert run_kernels(g, feeds)["y"].shape == (0, 17)
