"""The int8 fuzzer: random float CNNs and MLPs quantized by Kiln, each with random quantization options
(static with each calibrator, per channel or per tensor, symmetric or not; dynamic), the artifact's
outputs against the reference interpreter's on the same quantized IR (the compile's recorded graph).

What it checks is the code generation of the quantized graph: the int8 tiles and their paths (W x X,
W x cols, the NHWC taps, the im2col; the depthwise planes on integers), the requantizing chains
fused into them, the residual adds on uint8, the dynamic quantization. The reference computes the
same integer sums exactly but the float chains around them in its own order, so a value lying at a
rounding tie could come out one quantization step apart (well under 1% of an output's range), while
a wrong sum, channel or pixel moves it by much more. So an output agrees when its largest difference
is at most ``MAX_ERROR`` of its largest magnitude and the difference's norm at most ``MAX_NORM`` of
its norm. (On 800 models of this generator, seeds 123, 8888 and 20260521, the largest seen were
2.8e-7 and 2.3e-7: float32 rounding after the last dequantization, no value a step apart.) The
kernels' bits are checked exactly, on fixed and random shapes, by ``tests/codegen/test_kernels_q*.py``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .harness import Failure, Report, save
from .pool import Pool

MAX_ERROR, MAX_NORM = 0.01, 0.01


@dataclasses.dataclass
class QCase:
    tag: str
    model: onnx.ModelProto
    calibration: list          # feed dicts (static int8)
    feeds: dict                # the compared run's inputs
    options: dict              # QuantizeOptions fields
    nthreads: int


class _Model:
    """A float model under construction: nodes, constants and fresh names."""

    def __init__(self, r: np.random.Generator):
        self.r, self.nodes, self.inits, self.n = r, [], [], 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, a) -> str:
        name = self.name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    def node(self, op: str, inputs: list, **attrs) -> str:
        y = self.name(op[:2].lower())
        self.nodes.append(helper.make_node(op, inputs, [y], **attrs))
        return y

    def activation(self, x: str) -> str:
        act = self.r.choice(["Relu", "Relu", "Clip", "Sigmoid", "silu", "none"])
        if act == "Clip":
            return self.node("Clip", [x, self.const(0.0), self.const(6.0)])
        if act == "silu":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        return x if act == "none" else self.node(str(act), [x])

    def finish(self, x: str, shape: tuple, y: str) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, "q", [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], self.inits)
        # (the output's shape from ONNX's shape inference: a valid model declares it)
        return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def _cnn(r: np.random.Generator) -> tuple[onnx.ModelProto, tuple]:
    """Convolutions (1x1 to 5x5, strides 1 and 2, some unpadded, depthwise with multipliers 1 and 2),
    activations, residual adds, pooling, and maybe a classifier head."""
    m = _Model(r)
    side = int(r.choice([7, 8, 12, 16, 20, 28, 33]))
    xs = shape = (int(r.choice([1, 1, 2])), int(r.choice([3, 4, 8, 16, 24, 32])), side, side)
    cur = "x"
    skip = None
    for _ in range(int(r.integers(2, 7))):
        kind = r.choice(["conv", "conv", "conv", "depthwise", "pool", "add"])
        n, c, h, _ = shape
        if kind in ("conv", "depthwise"):
            k = int(r.choice([1, 1, 3, 3, 5]))
            s = int(r.choice([1, 1, 2])) if h >= 4 else 1
            p = k // 2 if r.random() < 0.85 else 0
            if h + 2 * p < k:
                continue
            g = c if kind == "depthwise" else 1
            out = c * int(r.choice([1, 1, 2])) if g > 1 else int(r.choice([4, 8, 16, 24, 32, 48, 64, 96]))
            w = r.standard_normal((out, c // g, k, k)) / np.sqrt(c // g * k * k)
            cur = m.node("Conv", [cur, m.const(w), m.const(r.standard_normal(out) * 0.1)], pads=[p] * 4,
                         strides=[s, s], group=g)
            side = (h + 2 * p - k) // s + 1
            shape = (n, out, side, side)
            cur = m.activation(cur)
            if skip is None or r.random() < 0.5:
                skip = (cur, shape)
        elif kind == "pool" and h >= 4:
            cur = m.node(str(r.choice(["MaxPool", "AveragePool"])), [cur], kernel_shape=[2, 2], strides=[2, 2])
            shape, skip = (n, c, h // 2, h // 2), None
        elif kind == "add" and skip is not None and skip[1] == shape and skip[0] != cur:
            cur = m.node("Add", [cur, skip[0]])
    if r.random() < 0.6:
        flat = m.node("Flatten", [m.node("GlobalAveragePool", [cur])])
        classes = int(r.choice([5, 10, 16]))
        cur = m.node("Gemm", [flat, m.const(r.standard_normal((classes, shape[1])) * 0.3),
                              m.const(r.standard_normal(classes) * 0.1)], transB=1)
    return m.finish("x", xs, cur), xs


def _mlp(r: np.random.Generator) -> tuple[onnx.ModelProto, tuple]:
    """MatMuls with constant weights over 1 to 2 leading axes, biases, activations, residual adds, and
    maybe a Softmax."""
    m = _Model(r)
    d = int(r.choice([8, 16, 17, 32, 64, 100]))
    xs = tuple(int(v) for v in r.integers(1, 5, int(r.integers(1, 3)))) + (d,)
    cur, width, skip = "x", d, None
    for _ in range(int(r.integers(1, 5))):
        out = int(r.choice([d, 8, 24, 33, 64, 128]))
        cur = m.node("MatMul", [cur, m.const(r.standard_normal((width, out)) / np.sqrt(width))])
        if r.random() < 0.8:
            cur = m.node("Add", [cur, m.const(r.standard_normal(out) * 0.1)])
        width = out
        cur = m.activation(cur)
        if skip is not None and skip[1] == width and r.random() < 0.5:
            cur = m.node("Add", [cur, skip[0]])
        skip = (cur, width)
    if r.random() < 0.3:
        cur = m.node("Softmax", [cur], axis=-1)
    return m.finish("x", xs, cur), xs


def generate(seed: int, index: int) -> QCase:
    """Case ``index`` of the stream ``seed`` (the same case every time)."""
    r = np.random.default_rng([seed, index])
    model, shape = _cnn(r) if r.random() < 0.5 else _mlp(r)
    mode = str(r.choice(["int8", "int8", "int8-dynamic"]))
    options = dict(mode=mode, calibrator=str(r.choice(["minmax", "entropy", "percentile"])),
                   per_channel=bool(r.random() < 0.5), symmetric=bool(mode == "int8" and r.random() < 0.3))
    calibration = [{"x": r.standard_normal(shape).astype(np.float32)} for _ in range(3)] if mode == "int8" else []
    feeds = {"x": r.standard_normal(shape).astype(np.float32)}
    return QCase(f"q{seed}-{index}", model, calibration, feeds, options, int(r.choice([1, 2])))


def task(model: bytes, calibration: list, feeds: dict, options: dict, nthreads: int) -> dict:
    """In a worker: compile the int8 model, run it, and interpret its quantized IR on the same feeds."""
    import compiler
    from compiler.ir.interpreter import interpret
    from compiler.passes.quantize import QuantizeOptions
    from compiler.profiling import CompileRecord

    record = CompileRecord()
    exe = compiler.compile(onnx.load_from_string(model), 2, nthreads=nthreads, quantize=QuantizeOptions(**options),
                           calibration=calibration or None, record=record)
    got = {k: np.asarray(v) for k, v in exe.run(feeds).items()}
    return {"outputs": got, "reference": {k: np.asarray(v) for k, v in interpret(record.graph, feeds).items()},
            "quantized": len(exe.quantization["quantized"])}


def judge(got: dict, ref: dict) -> str | None:
    """None when every output agrees with the reference (see the module's docstring), else what differs."""
    if sorted(got) != sorted(ref):
        return f"outputs {sorted(got)}, the reference gives {sorted(ref)}"
    for name, want in ref.items():
        a, b = np.asarray(got[name], np.float64), np.asarray(want, np.float64)
        if a.shape != b.shape:
            return f"{name}: shape {list(a.shape)}, the reference gives {list(b.shape)}"
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return f"{name}: values not finite"
        error = float(np.abs(a - b).max(initial=0.0)) / max(float(np.abs(b).max(initial=0.0)), 1e-6)
        norm = float(np.linalg.norm(a - b)) / max(float(np.linalg.norm(b)), 1e-9)
        if error > MAX_ERROR or norm > MAX_NORM:
            return (f"{name}: largest difference {error:.3g} of the largest magnitude, norm of the "
                    f"difference {norm:.3g} of the output's")
    return None


def run(pool: Pool, n: int, seed: int, out: str | None, timeout: float = 120.0,
        log: Callable = print) -> Report:
    """``n`` cases of the stream ``seed`` on the pool's workers; failures saved under ``out``."""
    report = Report(f"int8 models: {n}, seed {seed}")

    def one(i: int) -> None:
        case = generate(seed, i)
        o = pool.run("tests.fuzz.quantized:task", case.model.SerializeToString(), case.calibration, case.feeds,
                     case.options, case.nthreads, timeout=timeout)
        if o.status == "ok":
            report.counts["quantized layers"] += o.value["quantized"]
            detail = judge(o.value["outputs"], o.value["reference"])
            kind = "mismatch" if detail else "ok"
        else:
            kind, detail = o.status, o.brief()  # crash, hang; an error: refused, rejected or an exception
            if o.status == "error":
                kind = "refused" if o.unsupported else "rejected" if o.kiln else "exception"
        report.counts[kind] += 1
        if kind in ("ok", "refused"):
            return
        about = f"{' '.join(nd.op_type for nd in case.model.graph.node)}; {case.options}, {case.nthreads} thread(s)"
        path = save(out, case.tag, case.model, case.feeds, f"{kind}: {detail}; {about}") if out else ""
        report.failures.append(Failure(case.tag, kind, "int8", detail or "", about, path))
        log(f"  FAIL {case.tag} {kind}: {detail}")

    pool.map(one, range(n))
    report.counts["models"] = n
    return report.done()
