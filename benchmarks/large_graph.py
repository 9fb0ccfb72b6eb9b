"""Large generated graphs: compile time must grow linearly with the number of nodes (issue 21).

    .venv/bin/python benchmarks/large_graph.py [--kinds chain,wide,wide-out,wide-cse,matmul]
                                               [--sizes 5000,10000,20000] [--O 0,2] [--check] [--save DIR]

Builds ONNX models of N nodes and times ``compiler.compile(model, opt_level=O)`` (passes, program,
LLVM and the link into one shared library) for each kind, size and level; ``--check`` also runs the
executable and compares its outputs with NumPy. The kinds:

``chain``   one input [1,64] through N elementwise ops of mixed kinds (Add/Mul/Sub by constants, Relu,
            Sigmoid, Tanh, Neg, Abs, ...), scaled so the values stay in range.
``wide``    one input [1,64] and N/3 independent two-op branches; the branch results are summed
            pairwise in a balanced tree (N/3 - 1 more Adds) into one output.
``wide-out`` the same branches, each its own graph output (about N nodes, N/2 outputs).
``wide-cse`` ``wide`` with the branch constants repeating every 97 branches (CSE merges branches).
``matmul``  a chain mixing MatMul by small [16,16] weights with elementwise ops ([1,16] values).

The builders are also used by ``tests/passes/test_large_graphs.py``; ``reference(model, feeds)``
computes the expected outputs with NumPy (``input_for(model, seed)`` makes the feeds).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WIDTH = 64
MM_WIDTH = 16


def _onnx():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    return onnx, TensorProto, helper, numpy_helper


def _model(nodes, inits, inputs, outputs, name):
    onnx, TensorProto, helper, numpy_helper = _onnx()
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# The chain's op cycle: (op, constant or None). The constants keep values in a moderate range
# (Tanh/Sigmoid bound them, the scale never exceeds 1), so 20,000 ops neither overflow nor vanish.
_CHAIN = [("Add", 0.25), ("Relu", None), ("Mul", 0.9), ("Sigmoid", None), ("Sub", 0.1), ("Tanh", None),
          ("Mul", 1.5), ("Neg", None), ("Add", 0.5), ("Abs", None), ("Mul", 0.75), ("Tanh", None)]


def chain(n: int, width: int = WIDTH):
    """N elementwise ops in one chain on a [1, width] float32 input."""
    onnx, TensorProto, helper, numpy_helper = _onnx()
    nodes, inits, consts = [], [], {}
    prev = "x"
    for i in range(n):
        op, c = _CHAIN[i % len(_CHAIN)]
        ins = [prev]
        if c is not None:
            cname = consts.get((op, c))
            if cname is None:  # one initializer per distinct constant (a real model shares too)
                cname = consts[(op, c)] = f"c{len(consts)}"
                inits.append(numpy_helper.from_array(np.full([1, width], c, np.float32), cname))
            ins.append(cname)
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node(op, ins, [out], name=f"n{i}"))
        prev = out
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], f"chain{n}")


_BRANCH = [("Add", "Relu"), ("Mul", "Sigmoid"), ("Sub", "Tanh"), ("Mul", "Abs")]


def _branches(n_branches: int, width: int, period: int = 0):
    onnx, TensorProto, helper, numpy_helper = _onnx()
    nodes, inits, outs = [], [], []
    for b in range(n_branches):
        first, second = _BRANCH[b % len(_BRANCH)]
        cname = f"k{b}"  # a constant of its own per branch, so CSE cannot merge branches
        value = (b % period) / period if period else (b + 1) / (n_branches + 1)  # (unless they repeat)
        inits.append(numpy_helper.from_array(np.full([1, width], value, np.float32), cname))
        nodes.append(helper.make_node(first, ["x", cname], [f"a{b}"], name=f"b{b}a"))
        nodes.append(helper.make_node(second, [f"a{b}"], [f"r{b}"], name=f"b{b}b"))
        outs.append(f"r{b}")
    return nodes, inits, outs


def wide(n: int, width: int = WIDTH, period: int = 0):
    """About N nodes: N/3 two-op branches off one input, summed pairwise in a tree into one output.
    With ``period``, branch b's constant is that of branch b % period (CSE then merges equal branches:
    a DAG whose sums share operands, where fusion once formed kernels needing each other's results)."""
    onnx, TensorProto, helper, numpy_helper = _onnx()
    nb = max(2, (n + 1) // 3)
    nodes, inits, level = _branches(nb, width, period)
    k = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            out = "y" if len(level) == 2 else f"s{k}"
            nodes.append(helper.make_node("Add", [level[i], level[i + 1]], [out], name=f"sum{k}"))
            nxt.append(out)
            k += 1
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], f"wide{n}")


def wide_out(n: int, width: int = WIDTH):
    """N nodes: N/2 two-op branches off one input, each its own graph output."""
    onnx, TensorProto, helper, numpy_helper = _onnx()
    nodes, inits, outs = _branches(max(1, n // 2), width)
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, width]) for o in outs], f"wideout{n}")


def matmul_chain(n: int, width: int = MM_WIDTH):
    """N nodes: repeated MatMul by a small weight, Add of a bias, Tanh (a third of the nodes MatMul)."""
    onnx, TensorProto, helper, numpy_helper = _onnx()
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    n_w = 8  # a few distinct weights, reused
    for j in range(n_w):
        w = (rng.standard_normal([width, width]) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{j}"))
        inits.append(numpy_helper.from_array((rng.standard_normal([width]) * 0.1).astype(np.float32), f"bias{j}"))
    prev = "x"
    kinds = ("MatMul", "Add", "Tanh")
    for i in range(n):
        op = kinds[i % 3]
        j = (i // 3) % n_w
        ins = [prev, f"w{j}"] if op == "MatMul" else [prev, f"bias{j}"] if op == "Add" else [prev]
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node(op, ins, [out], name=f"n{i}"))
        prev = out
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], f"mm{n}")


BUILDERS = {"chain": chain, "wide": wide, "wide-out": wide_out, "matmul": matmul_chain,
            "wide-cse": lambda n: wide(n, period=97)}

_NP = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "MatMul": np.matmul,
       "Relu": lambda a: np.maximum(a, np.float32(0)), "Neg": np.negative, "Abs": np.abs, "Tanh": np.tanh,
       "Sigmoid": lambda a: (np.float32(1) / (np.float32(1) + np.exp(-a))).astype(np.float32)}


def reference(model, feeds: dict) -> dict:
    """The model's outputs computed node by node with NumPy (float32, in graph order)."""
    from onnx import numpy_helper

    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env.update(feeds)
    for node in model.graph.node:
        args = [env[i] for i in node.input]
        env[node.output[0]] = np.asarray(_NP[node.op_type](*args), dtype=np.float32)
    return {o.name: env[o.name] for o in model.graph.output}


def input_for(model, seed: int = 0) -> dict:
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    return {inp.name: np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)}


def time_compile(model, opt_level: int, check: bool = False) -> tuple[float, dict, float]:
    """(wall seconds of compile(), its phase timings, the max abs error against NumPy or nan)."""
    import compiler

    timings: dict = {}
    t0 = time.perf_counter()
    exe = compiler.compile(model, opt_level=opt_level, timings=timings)
    secs = time.perf_counter() - t0
    err = float("nan")
    if check:
        feeds = input_for(model)
        got = exe.run(feeds)
        ref = reference(model, feeds)
        err = max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref)
    return secs, timings, err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="chain,wide")
    ap.add_argument("--sizes", default="5000,10000,20000")
    ap.add_argument("--O", default="0,2", help="opt levels, comma-separated")
    ap.add_argument("--check", action="store_true", help="run the result and compare with NumPy")
    ap.add_argument("--save", metavar="DIR", help="write each model as DIR/KIND-N.onnx and compile nothing")
    a = ap.parse_args(argv)
    kinds = a.kinds.split(",")
    sizes = [int(s) for s in a.sizes.split(",")]
    levels = [int(o) for o in a.O.split(",")]
    if a.save:
        import onnx

        os.makedirs(a.save, exist_ok=True)
        for k in kinds:
            for n in sizes:
                path = os.path.join(a.save, f"{k}-{n}.onnx")
                onnx.save(BUILDERS[k](n), path)
                print(path)
        return
    print(f"{'kind':<9} {'nodes':>6} {'-O':>3} {'total s':>8} {'load':>6} {'passes':>7} {'codegen':>8} "
          f"{'llvm+link':>9}" + ("   max abs err" if a.check else ""), flush=True)
    for k in kinds:
        for n in sizes:
            model = BUILDERS[k](n)
            for o in levels:
                secs, t, err = time_compile(model, o, a.check)
                print(f"{k:<9} {len(model.graph.node):6d} {o:3d} {secs:8.2f} {t.get('load', 0):6.2f} "
                      f"{t.get('passes', 0):7.2f} {t.get('codegen', 0):8.2f} {t.get('llvm_and_link', 0):9.2f}"
                      + (f"   {err:.2e}" if a.check else ""), flush=True)


if __name__ == "__main__":
    main()
