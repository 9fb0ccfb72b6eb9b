"""The malformed-file fuzzer: mutants of valid models, and tampered compiled artifacts, given to Kiln in a
worker process (``pool.py``) and, for some, to the ``kiln`` command.

Sources: models from the generator (``gen.py``) and the light model-zoo networks the ``onnx`` package
ships (``light:NAME``). Mutants:

    bytes      truncations, bit flips, spliced or overwritten byte runs of the serialized model
    semantic   wrong attribute types or values, bad/negative/huge dims, element type 999, dangling
               inputs, duplicate names (outputs, graph inputs, initializers), wrong output dtype,
               cycles, unknown ops, bad opsets, wrong arity, short tensor data, invalid UTF-8 names,
               the graph nested inside If nodes (1 to 1000 deep)
    extdata    an initializer's external data at ../../etc/passwd, /etc/passwd, /dev/zero, a FIFO, a
               symlink out of the model's directory, a missing file, a directory, a bad offset/length
               (and one valid external file)
    artifact   a compiled model.kiln with files flipped, truncated, deleted, swapped, replaced by
               /dev/zero, a FIFO, a directory or a symlink; the manifest replaced, 100,000 deep, or
               edited (keys removed, dtypes, shapes, arena size, symbol names, ``files`` paths) with
               its checksums rewritten (``tamper.py``); two models compiled to one path in one process

The acceptable outcomes are a ``KilnError`` or a correct result. Failures: a traceback (any other
exception), a crash by a signal, a hang, a wrong result (against ONNX Runtime, or the untampered
artifact), and accepting what must be refused: an *invalid* mutant that onnx.checker or ONNX Runtime
rejects, a hostile external-data path, a huge input, or an artifact manifest pointing outside the
artifact or at a foreign symbol. ``kiln run`` on every ``cli_every``-th mutant must exit 0 or print
``kiln: error:`` without a traceback.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import gen
from .harness import Failure, Report, compare
from .pool import Pool
from .tamper import safe_copy, tamper

LIGHT = ("squeezenet", "zfnet512", "bvlc_alexnet")
MAX_RUN_ELEMENTS = 1 << 24
HUGE = (1 << 31, 1 << 33, 1 << 40, 1 << 62)


@dataclasses.dataclass
class Mutant:
    tag: str
    kind: str                 # bytes:..., semantic:..., extdata:..., artifact:...
    about: str
    path: str                 # the mutant model file, or the tampered artifact directory
    invalid: bool = False     # accepting it is a failure when onnx.checker or ONNX Runtime rejects it
    refuse: bool = False      # accepting it is a failure, full stop
    feeds: dict | None = None
    expect: dict | None = None   # the correct outputs, when known (artifacts)
    level: int = 2


# -- in the worker ----------------------------------------------------------------------------------
def _feeds_for(exe, feeds: dict | None, seed: int) -> dict | None:
    sig = exe.inputs
    if feeds is not None and sorted(feeds) == sorted(n for n, _, _ in sig) and all(
            d is not None and np.asarray(feeds[n]).shape == tuple(s) and np.asarray(feeds[n]).dtype == d.np
            for n, d, s in sig):
        return feeds
    rng = np.random.default_rng(seed)
    out = {}
    for name, dtype, shape in sig:
        if dtype is None or int(np.prod(shape, dtype=np.float64)) > MAX_RUN_ELEMENTS:
            return None
        if dtype.np.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dtype.np)
        elif dtype.np.kind == "b":
            out[name] = rng.random(shape) < 0.5
        else:
            out[name] = rng.integers(0, 2, shape).astype(dtype.np)
    return out


def compile_task(path: str, level: int, feeds: dict | None, seed: int) -> dict:
    """Compile a mutant and run it (when its inputs fit in memory); the feeds used and the outputs."""
    import compiler

    exe = compiler.compile(path, opt_level=level)
    feeds = _feeds_for(exe, feeds, seed)
    if feeds is None:
        return {"feeds": None, "outputs": None}
    return {"feeds": feeds, "outputs": {k: np.asarray(v) for k, v in exe.run(feeds).items()}}


def load_task(path: str, feeds: dict | None, seed: int) -> dict:
    import compiler

    exe = compiler.load(path)
    feeds = _feeds_for(exe, feeds, seed)
    if feeds is None:
        return {"feeds": None, "outputs": None}
    return {"feeds": feeds, "outputs": {k: np.asarray(v) for k, v in exe.run(feeds).items()}}


def build_task(path: str, dest: str, level: int, feeds: dict) -> dict:
    import compiler

    exe = compiler.compile(path, opt_level=level, output=dest)
    return {k: np.asarray(v) for k, v in exe.run(feeds).items()}


def same_path_task(a: str, b: str, dest: str, feeds_a: dict, feeds_b: dict) -> dict:
    """Model A then model B compiled to one path in this process; B's outputs."""
    import compiler

    compiler.compile(a, opt_level=2, output=dest).run(feeds_a)
    return {k: np.asarray(v) for k, v in compiler.compile(b, opt_level=2, output=dest).run(feeds_b).items()}


def ort_task(path: str, feeds: dict) -> dict:
    """onnx.checker (full) and ONNX Runtime on a mutant: its outputs, or the exception."""
    onnx.checker.check_model(path, full_check=True)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


# -- model mutations ----------------------------------------------------------------------------------
def _copy(m: onnx.ModelProto) -> onnx.ModelProto:
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def m_attr_type(rng, m):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return None
    attrs = nodes[int(rng.integers(len(nodes)))].attribute
    a = attrs[int(rng.integers(len(attrs)))]
    name, old = a.name, a.type
    a.Clear()
    a.name = name
    if old == onnx.AttributeProto.FLOAT:
        a.type, a.i = onnx.AttributeProto.INT, 1
    elif old == onnx.AttributeProto.INT:
        a.type, a.f = onnx.AttributeProto.FLOAT, 1.5
    elif old == onnx.AttributeProto.INTS:
        a.type, a.s = onnx.AttributeProto.STRING, b"\x00\xff"
    else:
        a.type, a.ints[:] = onnx.AttributeProto.INTS, [1, 2]
    return f"attribute {name} as {onnx.AttributeProto.AttributeType.Name(a.type)}", True


def m_attr_value(rng, m):
    bad = {"strides": [0, -1, 1 << 40], "kernel_shape": [0, -3, 1 << 31], "group": [0, -1, 7, 1 << 40],
           "axis": [99, -99, 1 << 62], "dilations": [0, -2], "pads": [-5, 1 << 40], "perm": [0, 9],
           "axes": [99, -99], "to": [999, 0], "keepdims": [7], "epsilon": [-1.0, float("nan")]}
    hits = [(n, a) for n in m.graph.node for a in n.attribute if a.name in bad]
    if not hits:
        return None
    n, a = hits[int(rng.integers(len(hits)))]
    v = bad[a.name][int(rng.integers(len(bad[a.name])))]
    if a.type == onnx.AttributeProto.INTS and a.ints:
        a.ints[int(rng.integers(len(a.ints)))] = int(v)
    elif a.type == onnx.AttributeProto.INTS:
        a.ints.append(int(v))
    elif a.type == onnx.AttributeProto.INT:
        a.i = int(v)
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = float(v)
    return f"{n.op_type}.{a.name} = {v}", True


def _input_dims(m):
    return [(i, d) for i in m.graph.input for d in i.type.tensor_type.shape.dim]


def m_dim(rng, m):
    dims = _input_dims(m)
    if not dims:
        return None
    i, d = dims[int(rng.integers(len(dims)))]
    kind = ["other", "negative", "huge", "zero", "param"][int(rng.integers(5))]
    if kind == "negative":
        d.dim_value = int(rng.choice([-1, -7]))
    elif kind == "huge":
        d.dim_value = int(HUGE[int(rng.integers(len(HUGE)))])
    elif kind == "zero":
        d.dim_value = 0
    elif kind == "param":
        d.dim_param = "N"
    else:
        d.dim_value = int(rng.integers(1, 65))
    return f"input {i.name} dim {kind} ({d.dim_value or d.dim_param})", kind == "negative"


def m_elem_type(rng, m):
    where = [("input", t.type.tensor_type) for t in m.graph.input] + [
        ("output", t.type.tensor_type) for t in m.graph.output] + [("initializer", t) for t in m.graph.initializer]
    what, t = where[int(rng.integers(len(where)))]
    value = int(rng.choice([999, 0, -1, TensorProto.STRING, TensorProto.COMPLEX64]))
    if what == "initializer":
        t.data_type = value
    else:
        t.elem_type = value
    # an output declared UNDEFINED (0) takes the type computed for it: Kiln accepts it on purpose (ONNX's
    # own test models declare outputs so; docs/reliability.md), so running it is a note, not a failure
    return f"{what} element type {value}", not (what == "output" and value == 0)


def m_dangling(rng, m):
    nodes = [n for n in m.graph.node if n.input]
    if not nodes:
        return None
    n = nodes[int(rng.integers(len(nodes)))]
    n.input[int(rng.integers(len(n.input)))] = "no_such_value"
    return f"{n.op_type} reads an undefined value", True


def m_duplicate(rng, m):
    kind = ["output", "input", "initializer"][int(rng.integers(3))]
    g = m.graph
    if kind == "output" and len(g.node) >= 2:
        a, b = rng.choice(len(g.node), 2, replace=False)
        g.node[int(b)].output[0] = g.node[int(a)].output[0]
    elif kind == "input" and g.input:
        g.input.append(g.input[int(rng.integers(len(g.input)))])
    elif kind == "initializer" and g.initializer:
        t = onnx.TensorProto()
        t.CopyFrom(g.initializer[int(rng.integers(len(g.initializer)))])
        arr = onnx.numpy_helper.to_array(t)
        g.initializer.append(onnx.numpy_helper.from_array((arr + 1).astype(arr.dtype), t.name))
    else:
        return None
    return f"{kind} name defined twice", True


def m_output_dtype(rng, m):
    o = m.graph.output[int(rng.integers(len(m.graph.output)))]
    old = o.type.tensor_type.elem_type
    o.type.tensor_type.elem_type = TensorProto.INT64 if old != TensorProto.INT64 else TensorProto.FLOAT
    return f"output {o.name} declared {TensorProto.DataType.Name(o.type.tensor_type.elem_type)}", True


def m_cycle(rng, m):
    g = m.graph
    if len(g.node) < 1 or not g.node[0].input:
        return None
    j = int(rng.integers(len(g.node)))
    g.node[0].input[0] = g.node[j].output[0]
    return f"node 0 reads node {j}'s result (a cycle)", True


def m_unknown(rng, m):
    n = m.graph.node[int(rng.integers(len(m.graph.node)))]
    if rng.random() < 0.5:
        n.op_type = "NoSuchOp"
    else:
        n.domain = "com.evil"
    return f"{n.name or n.op_type}: unknown op/domain", True


def m_opset(rng, m):
    v = int(rng.choice([0, 999, -1]))
    kind = int(rng.integers(3))
    if kind == 0:
        m.opset_import[0].version = v
    elif kind == 1:
        del m.opset_import[:]
    else:
        m.ir_version = v
    return f"{['opset', 'no opset_import', 'ir_version'][kind]} {v}", kind == 0


def m_arity(rng, m):
    n = m.graph.node[int(rng.integers(len(m.graph.node)))]
    if rng.random() < 0.5 and n.input:
        del n.input[-1]
        return f"{n.op_type} without its last input", True
    n.input.extend([n.input[0] if n.input else "x"] * 3)
    return f"{n.op_type} with 3 more inputs", True


def m_tensor_data(rng, m):
    inits = [t for t in m.graph.initializer if t.dims]
    if not inits:
        return None
    t = inits[int(rng.integers(len(inits)))]
    if rng.random() < 0.5:
        t.dims[0] = t.dims[0] * 3 + 1
        return f"initializer {t.name} dims disagree with its data", True
    if t.raw_data:
        t.raw_data = t.raw_data[: len(t.raw_data) // 2 - 1]
    elif t.float_data:
        del t.float_data[len(t.float_data) // 2:]
    else:
        return None
    return f"initializer {t.name} data too short", True


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (concatenated serialized messages merge, so a deep nest of
    graphs can be written without protobuf's depth limit, which only the parser must meet)."""
    key, n, out = (number << 3) | 2, len(payload), bytearray()
    for v in (key, n):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out) + payload


def m_nest(rng, m):
    """The graph inside ``depth`` nested Ifs (else: zeros), outputs renamed; written as bytes."""
    depth = int(rng.choice([1, 3, 10, 30, 40, 200, 1000]))
    outs = list(m.graph.output)
    if any(not o.type.tensor_type.HasField("shape") for o in outs):
        return None
    body = helper.make_graph(list(m.graph.node), "then0", [], outs).SerializeToString()
    for k in range(depth):
        zeros = []
        for j, o in enumerate(outs):
            dims = [d.dim_value for d in o.type.tensor_type.shape.dim]
            zeros += [helper.make_node("Constant", [], [f"c{k}_{j}"], value=helper.make_tensor(
                          f"ct{k}_{j}", o.type.tensor_type.elem_type, [], [0])),
                      helper.make_node("Constant", [], [f"s{k}_{j}"], value=helper.make_tensor(
                          f"st{k}_{j}", TensorProto.INT64, [len(dims)], dims)),
                      helper.make_node("Expand", [f"c{k}_{j}", f"s{k}_{j}"], [f"z{k}_{j}"])]
        other = helper.make_graph(zeros, f"else{k}", [], [helper.make_value_info(f"z{k}_{j}", o.type)
                                                           for j, o in enumerate(outs)]).SerializeToString()
        names = [f"if{k}_{j}" for j in range(len(outs))]
        infos = [helper.make_value_info(n, o.type) for n, o in zip(names, outs)]
        node = helper.make_node("If", ["nest_cond"], names).SerializeToString() + b"".join(
            _field(5, onnx.AttributeProto(name=a, type=onnx.AttributeProto.GRAPH).SerializeToString()
                   + _field(6, branch)) for a, branch in (("then_branch", body), ("else_branch", other)))
        body = helper.make_graph([], f"level{k + 1}", [], infos).SerializeToString() + _field(1, node)
    top = _copy(m)
    g = top.graph
    g.ClearField("node")
    g.node.append(helper.make_node("Constant", [], ["nest_cond"],
                                   value=helper.make_tensor("t", TensorProto.BOOL, [], [True])))
    g.ClearField("output")
    g.output.extend(infos)
    graph = g.SerializeToString() + _field(1, node)
    top.ClearField("graph")
    return f"graph nested in {depth} If nodes", False, top.SerializeToString() + _field(7, graph)


SEMANTIC = [m_attr_type, m_attr_value, m_dim, m_elem_type, m_dangling, m_duplicate, m_output_dtype, m_cycle,
            m_unknown, m_opset, m_arity, m_tensor_data, m_nest]


def byte_mutant(rng, data: bytes) -> tuple[bytes, str]:
    kind = int(rng.integers(4))
    if kind == 0:
        cut = int(rng.integers(0, len(data)))
        return data[:cut], f"truncated to {cut} of {len(data)} bytes"
    b = bytearray(data)
    if kind == 1:
        flips = int(rng.integers(1, 9))
        for _ in range(flips):
            b[int(rng.integers(len(b)))] ^= 1 << int(rng.integers(8))
        return bytes(b), f"{flips} bit flips"
    at, n = int(rng.integers(len(b))), int(rng.integers(1, 64))
    if kind == 2:
        return bytes(b[:at]) + rng.bytes(n) + bytes(b[at:]), f"{n} random bytes spliced in at {at}"
    b[at:at + n] = b"\xff" * len(b[at:at + n])
    return bytes(b), f"{n} bytes at {at} overwritten with 0xff"


def bad_utf8(rng, m: onnx.ModelProto) -> tuple[bytes, str] | None:
    if not m.graph.input:
        return None
    name = m.graph.input[int(rng.integers(len(m.graph.input)))].name.encode()
    bad = (b"\xff\xfe" * len(name))[:len(name)]
    return m.SerializeToString().replace(name, bad), f"input name {name!r} as invalid UTF-8"


EXTDATA = {  # kind -> (location, hostile)
    "parent": ("../../../../../../etc/passwd", True), "absolute": ("/etc/passwd", True),
    "devzero": ("/dev/zero", True), "symlink": ("link.bin", True), "fifo": ("pipe.bin", True),
    "missing": ("nope.bin", False), "directory": ("sub", False), "offset": ("w.bin", False),
    "length": ("w.bin", False), "valid": ("w.bin", False)}


def ext_mutant(rng, m: onnx.ModelProto, d: str) -> tuple[str, bool, bool] | None:
    inits = [t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT and t.dims]
    if not inits:
        return None
    t = inits[int(rng.integers(len(inits)))]
    raw = onnx.numpy_helper.to_array(t).tobytes()
    kind = list(EXTDATA)[int(rng.integers(len(EXTDATA)))]
    location, hostile = EXTDATA[kind]
    t.ClearField("raw_data"), t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location}
    with open(os.path.join(d, "w.bin"), "wb") as f:
        f.write(raw)
    if kind == "symlink":
        os.symlink("/etc/passwd", os.path.join(d, location))
    elif kind == "fifo":
        os.mkfifo(os.path.join(d, location))
    elif kind == "directory":
        os.mkdir(os.path.join(d, location))
    if kind == "offset":
        entries["offset"] = str(len(raw) + 4096)
    elif kind in ("length", "devzero") or rng.random() < 0.5:
        entries["length"] = str(len(raw) * (1000 if kind == "length" else 1))
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return f"external data {kind} ({location}) for {t.name}", hostile, kind != "valid"


# -- the run ----------------------------------------------------------------------------------------------
def kiln_command() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "kiln")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "compiler.tools.cli"]


def cli_check(args: list[str], timeout: float) -> tuple[str, str] | None:
    """None when ``kiln ARGS`` exits 0 or with a clear error; else (kind, detail)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    try:
        p = subprocess.run(kiln_command() + args, capture_output=True, timeout=timeout, preexec_fn=limit,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "hang", f"kiln {' '.join(args)}: no exit in {timeout:.0f} s"
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode < 0:
        return "crash", f"kiln {' '.join(args)}: killed by signal {-p.returncode}: {err[-300:]}"
    if p.returncode and ("Traceback" in err or "kiln: error:" not in err):
        last = [ln for ln in err.splitlines() if ln.strip()][-1:] or ["(no output)"]
        return "cli-traceback", f"kiln {' '.join(args)} (exit {p.returncode}): {last[0][:300]}"
    return None


class Mutants:
    def __init__(self, pool: Pool, out: str | None, timeout: float = 60.0, cli_every: int = 10,
                 light_share: float = 0.1, log: Callable = print):
        self.pool, self.out, self.timeout, self.cli_every = pool, out, timeout, cli_every
        self.light_share, self.log = light_share, log
        self.work = tempfile.TemporaryDirectory(prefix="kiln-mutants-")
        self.bases: list | None = None
        self.base_error = ""

    def sources(self, seed: int) -> list:
        """(name, model, feeds) to mutate: a few generated models and the light networks."""
        out = []
        for i in range(8):
            c = gen.generate(seed + 7919, i)
            out.append((c.tag, c.model, c.feeds))
        return out

    def artifacts(self, srcs: list) -> list:
        """Two compiled artifacts to tamper with: (directory, feeds, expected outputs, model path);
        none when they cannot be built (``base_error`` says why, a failure of the run)."""
        if self.bases is None:
            self.bases = []
            for name, model, feeds in srcs[:2]:
                path = os.path.join(self.work.name, f"{name}.onnx")
                onnx.save(model, path)
                dest = os.path.join(self.work.name, f"{name}.kiln")
                o = self.pool.run("tests.fuzz.mutate:build_task", path, dest, 2, feeds, timeout=self.timeout)
                if o.status != "ok":
                    self.base_error = f"compiling {name} to an artifact to tamper with: {o.brief()}"
                    self.bases = []
                    break
                self.bases.append((dest, feeds, o.value, path))
        return self.bases

    def make(self, seed: int, i: int, srcs: list) -> Mutant:
        rng = np.random.default_rng([seed, 7, i])
        d = os.path.join(self.work.name, f"m{i}")
        os.makedirs(d)
        tag = f"s{seed}-m{i}"
        level = int(rng.integers(4))
        r = rng.random()
        bases = self.artifacts(srcs)
        if r < 0.15 and bases:  # a tampered artifact, or two models to one path
            k = int(rng.integers(2))
            base, feeds, expect, path = bases[k]
            if rng.random() < 0.08:
                other = bases[1 - k]
                return Mutant(tag, "artifact:same-path", "two models compiled to one path in one process",
                              d, feeds=(other[3], path, other[1], feeds), expect=expect)
            art = os.path.join(d, "model.kiln")
            safe_copy(base, art)
            about, refuse, by_manifest = tamper(rng, art, bases[1 - k][0])
            return Mutant(tag, "artifact", about, art, refuse=refuse, feeds=None if by_manifest else feeds,
                          expect=None if by_manifest else expect)
        if rng.random() < self.light_share:
            name = LIGHT[int(rng.integers(len(LIGHT)))]
            from compiler.models import resolve

            src, model, feeds = f"light:{name}", onnx.load(resolve(f"light:{name}")), None
        else:
            src, model, feeds = srcs[int(rng.integers(len(srcs)))]
        path = os.path.join(d, "model.onnx")
        r = rng.random()
        if r < 0.35:
            data, about = byte_mutant(rng, model.SerializeToString())
            open(path, "wb").write(data)
            return Mutant(tag, "bytes", f"{src}: {about}", path, feeds=feeds, level=level)
        m = _copy(model)
        if r < 0.47:
            res = ext_mutant(rng, m, d)
            if res:
                about, hostile, invalid = res
                open(path, "wb").write(m.SerializeToString())
                return Mutant(tag, "extdata", f"{src}: {about}", path, invalid, hostile, feeds, level=level)
        if r < 0.5:
            res = bad_utf8(rng, m)
            if res:
                open(path, "wb").write(res[0])
                return Mutant(tag, "semantic:utf8", f"{src}: {res[1]}", path, False, False, None, level=level)
        for _ in range(10):
            fn = SEMANTIC[int(rng.integers(len(SEMANTIC)))]
            m = _copy(model)
            res = fn(rng, m)
            if res:
                open(path, "wb").write(res[2] if len(res) > 2 else m.SerializeToString())
                about, invalid = res[:2]
                huge = "huge" in about
                return Mutant(tag, f"semantic:{fn.__name__[2:]}", f"{src}: {about}", path, invalid, huge,
                              feeds, level=level)
        open(path, "wb").write(model.SerializeToString())
        return Mutant(tag, "unchanged", f"{src}: unchanged", path, feeds=feeds, level=level)

    def check(self, mut: Mutant, seed: int, i: int, report: Report) -> None:
        report.counts["mutants"] += 1
        report.counts[mut.kind.split(":")[0]] += 1
        if mut.kind == "artifact:same-path":
            a, b, fa, fb = mut.feeds
            o = self.pool.run("tests.fuzz.mutate:same_path_task", a, b, os.path.join(mut.path, "x.kiln"),
                              fa, fb, timeout=self.timeout)
            verdict = self.judge(mut, o, None if o.status != "ok" else o.value, mut.expect)
        elif mut.kind == "artifact":
            o = self.pool.run("tests.fuzz.mutate:load_task", mut.path, mut.feeds, seed,
                              timeout=min(self.timeout, 15))
            verdict = self.judge(mut, o, o.value["outputs"] if o.status == "ok" else None, mut.expect)
        else:
            o = self.pool.run("tests.fuzz.mutate:compile_task", mut.path, mut.level, mut.feeds, seed,
                              timeout=self.timeout)
            verdict = self.judge(mut, o, None, None)
            if verdict is None and o.status == "ok" and o.value["outputs"] is not None:
                ref = self.pool.run("tests.fuzz.mutate:ort_task", mut.path, o.value["feeds"], timeout=self.timeout)
                verdict = self.judge_against(mut, o.value["outputs"], ref)
        if verdict is None and self.cli_every and i % self.cli_every == 0 and "same-path" not in mut.kind:
            report.counts["cli runs"] += 1
            verdict = cli_check(["run", mut.path], self.timeout)
        if verdict is None:
            report.counts["refused (KilnError)" if o.status == "error" else "ran"] += 1
            return
        kind, detail = verdict
        if kind == "note":
            report.notes.append(f"{mut.tag} {mut.kind}: {mut.about}: {detail}")
            report.counts["ran"] += 1
            return
        report.counts[kind] += 1
        f = Failure(mut.tag, kind, mut.kind, detail, mut.about)
        f.path = self.save(mut, f)
        report.failures.append(f)
        self.log(f"  FAIL {f.tag} [{f.where}] {f.kind}: {f.about[:120]}: {f.detail[:200]}")

    def judge(self, mut: Mutant, o, outputs, expect) -> tuple[str, str] | None:
        """A failure (kind, detail) by the outcome alone, or None."""
        if o.status == "hang":
            return "hang", o.brief()
        if o.status == "crash":
            return "crash", o.brief()
        if o.status == "error":
            return None if o.kiln else ("traceback", o.brief() + (f" (at {o.where})" if o.where else ""))
        if mut.refuse and (outputs is not None or not mut.kind.startswith("artifact")):
            return "accepted", "ran what must be refused"
        if expect is not None and outputs is not None:
            diff = compare(expect, outputs)
            return ("mismatch", diff) if diff else None
        return None

    def judge_against(self, mut: Mutant, outputs: dict, ref) -> tuple[str, str] | None:
        """Kiln ran a mutant model: ONNX Runtime (and the checker) decide whether that was right."""
        if ref.status != "ok":
            if mut.invalid:
                return "accepted", f"ran a model that onnx.checker/ONNX Runtime reject: {ref.brief()}"
            return "note", f"Kiln runs it, onnx.checker/ONNX Runtime reject it: {ref.brief()}"
        diff = compare(ref.value, outputs)
        return ("mismatch", diff) if diff else None

    def save(self, mut: Mutant, f: Failure) -> str:
        if not self.out:
            return ""
        d = os.path.join(self.out, mut.tag)
        shutil.rmtree(d, ignore_errors=True)
        safe_copy(os.path.dirname(mut.path) if not mut.kind.startswith("artifact") else mut.path,
                   d if not mut.kind.startswith("artifact") else os.path.join(d, "model.kiln"))
        target = os.path.join(d, os.path.basename(mut.path)) if mut.kind != "artifact:same-path" else d
        with open(os.path.join(self.out, "README.md"), "a", encoding="utf-8") as fh:
            fh.write(f"- `{mut.tag}` ({mut.kind}, -O{mut.level}): {f.kind}: {mut.about} -> {f.detail[:300]} | "
                     f"repro: `kiln run {target}`\n")
        return target

    def run(self, n: int, seed: int, report: Report | None = None) -> Report:
        report = report or Report(f"malformed files and tampered artifacts: {n} mutants, seed {seed}")
        srcs = self.sources(seed)
        if not self.artifacts(srcs):
            report.failures.append(Failure("artifacts", "exception", "artifact", self.base_error,
                                           "no artifact mutants in this run"))
        not_artifact = self.work.name  # a directory that is not an artifact
        for tag, args in (("cli-run-dir", ["run", not_artifact]),
                          ("cli-compile-dir", ["compile", not_artifact, "-o", os.path.join(not_artifact, "x.kiln")])):
            report.counts["cli runs"] += 1
            v = cli_check(args, self.timeout)
            if v:
                report.failures.append(Failure(tag, v[0], "cli", v[1], "a directory that is not an artifact"))
        done = [0]

        def one(i: int) -> None:
            mut = self.make(seed, i, srcs)
            self.check(mut, seed, i, report)
            done[0] += 1
            if done[0] % 50 == 0:
                self.log(f"  {done[0]}/{n} mutants")

        self.pool.map(one, range(n))
        return report.done()
