"""Native RotaryEmbedding (compiler/codegen/kernels/rotary.py) against the reference interpreter: 4-D and
3-D inputs, half and interleaved pairs, a partial rotary dimension, caches per token or indexed by
position_ids, float32/float16/bfloat16, one and two threads (on the LLVM printer and in numba's CUDA
simulator), an empty sequence; a position outside the cache is reported, never read."""
from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.kernels.empty import Empty
from compiler.codegen.kernels.rotary import Rotary
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.errors import InputError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import attention as at
from compiler.ir.types import DType, TensorType

RNG = np.random.default_rng(23)

# (X shape, num_heads, rotary_embedding_dim, interleaved, with position_ids)
CASES = [((2, 3, 5, 8), None, 0, 0, False), ((2, 3, 5, 8), None, 0, 1, True), ((1, 2, 7, 12), None, 8, 0, True),
         ((2, 5, 12), 3, 0, 0, False), ((2, 5, 24), 2, 4, 1, True), ((3, 1, 1, 2), None, 0, 0, False),
         ((2, 3, 0, 8), None, 0, 0, True)]


def _rope_graph(dt: DType):
    g = Graph("rope")
    feeds, outs = {}, []
    for k, (shape, heads, rot, inter, with_pos) in enumerate(CASES):
        d = shape[-1] if heads is None else shape[-1] // heads
        half = (rot or d) // 2
        b, s = shape[0], shape[2] if heads is None else shape[1]
        x = g.add_input(f"x{k}", TensorType(dt, shape))
        feeds[x.name] = RNG.standard_normal(shape).astype(dt.np)
        cache = (11, half) if with_pos else (b, s, half)
        cos, sin = (g.add_input(f"{w}{k}", TensorType(dt, cache)) for w in ("cos", "sin"))
        angle = RNG.uniform(0, 6, cache)
        feeds[cos.name], feeds[sin.name] = np.cos(angle).astype(dt.np), np.sin(angle).astype(dt.np)
        ins = [x, cos, sin]
        if with_pos:
            pos = g.add_input(f"pos{k}", TensorType(DType.i64, (b, s)))
            feeds[pos.name] = RNG.integers(0, 11, (b, s)).astype(np.int64)
            ins.append(pos)
        outs.append(g.add_node(at.RotaryEmbedding(interleaved=inter, num_heads=heads, rotary_embedding_dim=rot),
                               ins).outputs[0])
    g.set_outputs(outs, [f"y{k}" for k in range(len(outs))])
    return g, feeds


@pytest.mark.parametrize("dt", [DType.f32, DType.f16, DType.bf16], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
def test_rotary_matches_the_reference(dt, threads):
    g, feeds = _rope_graph(dt)
    for n in g.nodes:  # (an empty sequence has nothing to compute: the empty lowering)
        assert isinstance(lowering_for(KernelGroup.of_node(n))[0], Empty if 0 in n.outputs[0].shape else Rotary)
    got, want = run_kernels(g, feeds, nthreads=threads), interpret(g, feeds)
    tol = 1e-6 if dt is DType.f32 else 1e-2
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=tol, atol=tol,
                                   err_msg=name)


def test_a_position_outside_the_cache_is_reported():
    m = helper.make_model(helper.make_graph(
        [helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], name="rope")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 3, 4)),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, (5, 2)),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, (5, 2)),
         helper.make_tensor_value_info("p", TensorProto.INT64, (1, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 2, 3, 4))]),
        opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    exe = compiler.compile(m, fallback=False)
    feeds = {"x": np.ones((1, 2, 3, 4), np.float32), "c": np.ones((5, 2), np.float32),
             "s": np.zeros((5, 2), np.float32)}
    np.testing.assert_array_equal(exe.run({**feeds, "p": np.array([[0, 4, 2]])})["y"], feeds["x"])
    for bad in (5, -1):  # a negative position does not count from the end (the reference raises too)
        with pytest.raises(InputError, match=rf"'rope'.*{bad} is out of range"):
            exe.run({**feeds, "p": np.array([[0, bad, 2]])})


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")
def test_rotary_on_the_cuda_printer():
    g, feeds = _rope_graph(DType.f32)
    want, got = interpret(g, feeds), run_cuda_forms(g, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=name)
