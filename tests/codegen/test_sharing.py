"""Kernels that share one LLVM function (``codegen/sharing.py``): layers alike but for their weights
call one function with their own weight slots, and code that differs is never shared."""
from __future__ import annotations

import gc
import re

import numpy as np
import onnxruntime as ort
from onnx import helper

import compiler
from compiler.codegen import sharing
from compiler.codegen.fusion import CPU_FUSION
from compiler.codegen.llvm.target import host_target
from compiler.codegen.program import build_program
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import elementwise as ew
from compiler.ir.types import DType, TensorType
from compiler.models import load_graph
from compiler.passes.manager import PassManager
from compiler.passes.options import CompileOptions
from compiler.passes.pipeline import pipeline
from tests.onnx_build import float_model


def _layers(seed: int = 0):
    """Three Conv+Relu layers of one shape, then three Gemm-like MatMul+Add+Relu layers of one shape,
    every layer with weights of its own."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        inits += [(f"w{i}", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2),
                  (f"b{i}", rng.standard_normal(8).astype(np.float32))]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("Reshape", [prev, "shape"], ["flat"]))
    inits.append(("shape", np.array([8, 100], np.int64)))
    prev = "flat"
    for i in range(3):
        inits += [(f"m{i}", rng.standard_normal((100, 100)).astype(np.float32) * 0.1),
                  (f"a{i}", rng.standard_normal(100).astype(np.float32))]
        nodes += [helper.make_node("MatMul", [prev, f"m{i}"], [f"p{i}"]),
                  helper.make_node("Add", [f"p{i}", f"a{i}"], [f"q{i}"]),
                  helper.make_node("Relu", [f"q{i}"], ["y" if i == 2 else f"h{i}"])]
        prev = f"h{i}"
    return float_model(nodes, [("x", [1, 8, 10, 10])], inits, name="layers")


def _program(model, verify_shared: bool = True):
    g = load_graph(model)
    opts = CompileOptions.make(opt_level=2)
    PassManager(pipeline(opts, CPU_FUSION), [], opts).run(g)
    return g, build_program(g, host_target(), verify_shared=verify_shared)


def test_layers_alike_but_for_their_weights_share_a_function_with_their_own_weights():
    model = _layers()
    g, prog = _program(model)
    steps = [st for st in prog.steps if st.native and not st.alias]
    convs = [st for st in steps if "Conv" in st.group.ops]
    gemms = [st for st in steps if "Gemm" in st.group.ops]
    assert len(convs) == 3 and len(gemms) == 3
    # structure: one function per kind of layer
    assert len({st.kernel for st in convs}) == 1
    assert len({st.kernel for st in gemms}) == 1
    assert len({st.kernel for st in steps}) < len(steps)
    # each step's weight slots are its own (the packed weights of three layers differ)
    for group in (convs, gemms):
        weights = [[sl.array for sl in st.slots if sl.kind == "weight"] for st in group]
        assert all(len(w) == len(weights[0]) > 0 for w in weights)
        for a, b in zip(weights, weights[1:]):
            assert any(not np.array_equal(x, y) for x, y in zip(a, b))
    # numbers: against ONNX Runtime and the reference interpreter
    x = np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype(np.float32)
    got = compiler.compile(model, opt_level=2, fallback=False).run({"x": x})["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, interpret(g, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_kernels_whose_code_differs_do_not_share(monkeypatch):
    """Refusal: with every constant's contents left out of the alike key, Add(x, 0.5) and Add(x, 0.25)
    are alike, but Elementwise compiles scalars into its code: the code differs, so each keeps its
    own function (and its own number)."""
    monkeypatch.setattr(sharing, "ALIKE_ABOVE", 0)
    g = Graph("scalars")
    x = g.add_input("x", TensorType(DType.f32, (1, 8)))
    outs = [g.add(ew.Add(), x, g.add_constant(np.float32(k))) for k in (0.5, 0.25, 0.5)]
    g.set_outputs(outs, ["y0", "y1", "y2"])
    prog = build_program(g, host_target(), verify_shared=True)
    names = [st.kernel for st in prog.steps]
    assert names[0] != names[1] and names[2] == names[0]
    xs = np.arange(8, dtype=np.float32).reshape(1, 8)
    exe = compiler.compile(g, opt_level=0, fallback=False)
    got = exe.run({"x": xs})
    for i, k in enumerate((0.5, 0.25, 0.5)):
        np.testing.assert_array_equal(got[f"y{i}"], xs + np.float32(k))


def test_code_comparison_reads_metadata_contents(monkeypatch):
    """Loop metadata is numbered per module: the Gemm layers' loop IDs are !2.. in the model's module
    (the convolutions' come first) and !0.. in a scratch module. The comparison reads the metadata's
    contents, so the layers share; comparing the raw numbers would not."""
    _, prog = _program(_layers(seed=2), verify_shared=False)
    gemms = [st for st in prog.steps if st.native and "Gemm" in st.group.ops]
    assert len(gemms) == 3 and len({st.kernel for st in gemms}) == 1
    monkeypatch.setattr(sharing, "_MD_REF", re.compile(r"(?!)"))  # raw numbers compared
    _, prog = _program(_layers(seed=2), verify_shared=False)
    gemms = [st for st in prog.steps if st.native and "Gemm" in st.group.ops]
    assert len({st.kernel for st in gemms}) == 3


def test_program_leaves_its_llvm_modules_to_reference_counting():
    """Structure: ``build_program`` releases its module (and the scratch modules alike groups are
    compared in) once their text is taken, so none of their llvmlite objects waits for Python's
    cycle collector (a model's module is hundreds of thousands of them: 0.2 s of a collection
    after an Inception-v1 compile). A mutation that skips ``release_module`` fails it."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        _, prog = _program(_layers(seed=3), verify_shared=False)
        assert "define" in prog.llvm_ir
        assert len({st.kernel for st in prog.steps if st.native and "Gemm" in st.group.ops}) == 1  # (compared)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if type(o).__module__.startswith("llvmlite")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert left == []
