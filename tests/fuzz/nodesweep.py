"""ONNX's node test models, each with one change, against ONNX Runtime and ONNX's reference evaluator:
``python -m tests.fuzz.nodesweep [--only NAME] [--kinds K,...] [--seconds S] [--seed N]``.

The models are the ones ``onnx.backend.test.case.node`` generates (one node each, with its inputs).
A mutant changes one thing (``KINDS``): the node's last input dropped (``drop-input``), its first
input given again at the end (``extra-input``), an attribute dropped (``drop-attr``), or one
attribute's value changed (``value``: an int to -1, 0, 2 or 7, one element of an int list to -1, 0
or 7, a float to -1, 0 or 1e9, a string to "XYZ"). Each mutant runs in a process of its own (forked:
ONNX Runtime and onnx.checker abort on some): ONNX's reference evaluator, ONNX Runtime, then Kiln
(``compile`` at -O2 on one thread, and a run). A finding:

* **accepted**: Kiln ran a mutant that onnx.checker (full check) refuses, or that both ONNX Runtime
  and the reference refuse (ONNX Runtime lacking a kernel does not count);
* **differs**: Kiln's outputs are not those of ONNX Runtime and the reference where the two agree, or
  of the one that ran where the other refused (random ops: not compared);
* **crashed**: the process died while Kiln ran, or Kiln raised something other than a KilnError.

``KNOWN`` lists the findings that are Kiln's deliberate choices, each with its reason. Exit status 1
when anything else is found. Found with it (2026-12-07): a TfIdfVectorizer whose n-grams share an
output coordinate kept one count, a Cast without ``to`` cast to float32, a MaxUnpool cropped to a
smaller ``output_shape``, an Attention with ``is_causal`` 2 ran; each now fixed and tested.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import random
import signal
import sys
import time
import warnings

import numpy as np

KINDS = ("drop-input", "extra-input", "drop-attr", "value")

#: (case name prefix, what the mutant's tag contains) -> why Kiln's verdict is the one it means to give
KNOWN = {
    ("test_maxpool_2d_precomputed_same_upper", "strides"): "SAME padding that would be negative is 0, as in "
    "TensorFlow (ONNX Runtime refuses it, the reference crops)",
    ("test_averagepool_2d_precomputed_same_upper", "strides"): "as for MaxPool",
    ("test_batchnorm_", "training_mode"): "a BatchNormalization in inference mode with three outputs passes "
    "its statistics through (old exporters write them)",
    ("test_scan", "extra-input"): "a trailing empty input name is an absent optional input",
    ("test_resize_", "drop-attr mode"): "antialias with mode nearest is ignored: ONNX defines it for linear and "
    "cubic only (ONNX Runtime and the reference refuse it)",
}

#: ops whose outputs are random: only whether Kiln runs them is compared
RANDOM_OPS = frozenset({"Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                        "Multinomial"})


def cases(only: str = ""):
    """The node test cases of one node in the default domain whose inputs are all tensors (``only``: those
    whose name contains one of its comma-separated parts)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        all_cases = node.collect_testcases()
    for c in all_cases:
        g = c.model.graph
        if (only and not any(o in c.name for o in only.split(","))) or not c.data_sets or len(g.node) != 1 or \
                g.node[0].domain not in ("", "ai.onnx"):
            continue
        inputs = c.data_sets[0][0]
        if len(inputs) == len(g.input) and all(isinstance(v, np.ndarray) for v in inputs):
            yield c


def mutants(case, kinds, rng):
    """(tag, model) of each change of ``kinds`` to the case's model."""
    import onnx

    A = onnx.AttributeProto
    base = case.model

    def copy():
        m = onnx.ModelProto()
        m.CopyFrom(base)
        for o in m.graph.output:  # a change may change the results' shapes: declare none
            for d in o.type.tensor_type.shape.dim:
                d.ClearField("dim_value")
                d.dim_param = "d"
        return m, m.graph.node[0]

    n0 = base.graph.node[0]
    if "drop-input" in kinds and len(n0.input) >= 2 and n0.input[-1]:
        m, n = copy()
        del n.input[-1]
        yield "drop-input", m
    if "extra-input" in kinds and n0.input:
        m, n = copy()
        n.input.append(n.input[0])
        yield "extra-input", m
    for i, a in enumerate(n0.attribute):
        if "drop-attr" in kinds:
            m, n = copy()
            del n.attribute[i]
            yield f"drop-attr {a.name}", m
        if "value" not in kinds:
            continue
        if a.type == A.INT:
            changes = [(None, v) for v in (-1, 0, 2, 7) if v != a.i]
        elif a.type == A.INTS and a.ints:
            j = rng.randrange(len(a.ints))
            changes = [(j, v) for v in (-1, 0, 7) if v != a.ints[j]]
        elif a.type == A.FLOAT:
            changes = [(None, v) for v in (-1.0, 0.0, 1e9) if v != a.f]
        elif a.type == A.STRING:
            changes = [(None, b"XYZ")]
        else:
            changes = []
        for j, v in changes:
            m, n = copy()
            at = n.attribute[i]
            if a.type == A.INT:
                at.i = v
            elif a.type == A.INTS:
                at.ints[j] = v
            elif a.type == A.FLOAT:
                at.f = v
            else:
                at.s = v
            yield f"value {a.name}{'' if j is None else f'[{j}]'}={v!r}", m


def _outputs(f):
    try:
        return [o if isinstance(o, list) else np.asarray(o) for o in f()]
    except Exception as e:  # noqa: BLE001 - any refusal is a verdict here
        return "error: " + ((str(e).splitlines() or [type(e).__name__])[0])[:160]


def _child(model, feeds, w) -> None:
    """In the forked process: every engine's outputs (or why it refused), pickled into ``w``."""
    import onnx
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    import compiler
    from compiler.errors import KilnError

    res = {}
    try:
        onnx.checker.check_model(model, full_check=True)
        res["checker"] = None
    except Exception as e:  # noqa: BLE001
        res["checker"] = ((str(e).splitlines() or [""])[0])[:160]
    res["ref"] = _outputs(lambda: ReferenceEvaluator(model).run(None, feeds))
    so = ort.SessionOptions()
    so.log_severity_level, so.intra_op_num_threads = 4, 1
    res["ort"] = _outputs(lambda: ort.InferenceSession(model.SerializeToString(), so,
                                                       providers=["CPUExecutionProvider"]).run(None, feeds))
    os.write(w, b"K")  # Kiln starts: dying after this is Kiln's

    def kiln():
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return list(compiler.compile(model, 2, nthreads=1, cache=False).run(feeds).values())
            except KilnError as e:
                raise _Refused(str(e)) from None

    try:
        res["kiln"] = kiln()
    except _Refused as e:
        res["kiln"] = "refused: " + str(e)[:160]
    except Exception as e:  # noqa: BLE001
        res["kiln"] = f"crashed: {type(e).__name__}: {str(e)[:160]}"
    data = pickle.dumps(res)
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
        view = view[os.write(w, view[:1 << 16]):]


class _Refused(Exception):
    pass


def _run(model, feeds, timeout: int = 60) -> tuple[bool, dict | None]:
    """(whether Kiln had started, the engines' results or None when the process died)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        signal.alarm(timeout)
        try:
            _child(model, feeds, w)
        finally:
            os._exit(0)
    os.close(w)
    buf = bytearray()
    while chunk := os.read(r, 1 << 20):
        buf += chunk
    os.close(r)
    os.waitpid(pid, 0)
    started = buf[:1] == b"K"
    if len(buf) < 9:
        return started, None
    return started, pickle.loads(bytes(buf[9:]))


def _same(a, b, loose: bool) -> bool:
    if len(a) != len(b):
        return False
    tol = 1e-2 if loose else 2e-3
    for x, y in zip(a, b):
        if isinstance(x, list) or isinstance(y, list):  # sequences
            if not (isinstance(x, list) and isinstance(y, list) and
                    _same([np.asarray(v) for v in x], [np.asarray(v) for v in y], loose)):
                return False
            continue
        if x.shape != y.shape:
            return False
        if x.dtype == object or y.dtype == object:
            if x.tolist() != y.tolist():
                return False
        elif x.dtype.kind in "fc" or y.dtype.kind in "fc":
            if not np.allclose(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64),
                               y.astype(np.complex128 if y.dtype.kind == "c" else np.float64),
                               rtol=tol, atol=tol, equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def judge(res: dict, op: str, loose: bool) -> tuple[str, str] | None:
    """A finding (kind, detail) from the engines' results, or None."""
    k, o, f = res["kiln"], res["ort"], res["ref"]
    if isinstance(k, str) and k.startswith("crashed"):
        return "crashed", k
    if isinstance(k, str):
        return None  # refused: never wrong here
    ort_ok, ref_ok = not isinstance(o, str), not isinstance(f, str)
    if res["checker"] is not None:
        return "accepted", f"onnx.checker: {res['checker']}"
    if not ort_ok and not ref_ok and "NOT_IMPLEMENTED" not in o:
        return "accepted", f"ONNX Runtime: {o[:100]} | reference: {f[:80]}"
    if op in RANDOM_OPS:
        return None
    if ort_ok and ref_ok:
        if _same(o, f, loose) and not _same(k, o, loose):
            return "differs", "from ONNX Runtime and the reference, which agree"
        return None  # the references disagree (or Kiln agrees with them)
    if ort_ok and not _same(k, o, loose):
        return "differs", f"from ONNX Runtime (the reference refused: {f[:80]})"
    if ref_ok and not _same(k, f, loose) and "NOT_IMPLEMENTED" not in o:
        return "differs", f"from the reference (ONNX Runtime refused: {o[:80]})"
    return None


def known(name: str, tag: str) -> str | None:
    return next((why for (prefix, what), why in KNOWN.items() if name.startswith(prefix) and what in tag), None)


def sweep(only: str = "", kinds=KINDS, seconds: float = 0.0, seed: int = 0, log=print) -> list[tuple]:
    """The findings (case, tag, kind, detail) not in ``KNOWN``; ``seconds`` > 0 stops after that long."""
    rng = random.Random(seed)
    todo = list(cases(only))
    rng.shuffle(todo)
    end = time.time() + seconds if seconds > 0 else float("inf")
    found, count = [], 0
    for c in todo:
        if time.time() > end:
            break
        feeds = {vi.name: v for vi, v in zip(c.model.graph.input, c.data_sets[0][0])}
        op = c.model.graph.node[0].op_type
        loose = any(v.dtype.kind == "f" and v.dtype.itemsize < 4 or v.dtype.name == "bfloat16"
                    for v in feeds.values()) or "bfloat16" in c.name or "float16" in c.name
        for tag, model in mutants(c, kinds, rng):
            count += 1
            started, res = _run(model, feeds)
            verdict = (("crashed", "the process died while Kiln ran") if started else None) if res is None \
                else judge(res, op, loose)
            if verdict is None:
                continue
            why = known(c.name, tag)
            if why:
                continue
            found.append((c.name, tag) + verdict)
            log(f"  {verdict[0].upper()} {c.name} [{tag}]: {verdict[1]}")
    log(f"node sweep: {count} mutants of {len(todo)} node test models, {len(found)} finding(s)")
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.nodesweep", description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help="node test cases whose name contains one of these (comma-separated)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"changes to make (default: {','.join(KINDS)})")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this long (default: every case)")
    p.add_argument("--seed", type=int, default=0, help="the order of the cases and the list elements changed")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"unknown kind(s) {', '.join(bad)}; known: {', '.join(KINDS)}")
    return 1 if sweep(args.only, kinds, args.seconds, args.seed) else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.exit(main())
