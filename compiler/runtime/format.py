"""The artifact format, owned by this one module: ``manifest.json`` as typed records that read and
write JSON (``Manifest``, its steps and references), and the schema checks that run before any of it
is used.

The records: ``Manifest`` (header, ``Target``, signature, plan, memory, reports), the signature's
``Tensor`` entries (an output's ``ref`` says where it is read), the plan's ``NativeStep`` (a forward
function of the library) and ``FallbackStep`` (a node the interpreter runs, each operand and result a
reference: ``BufferRef`` (a buffer in the arena, the weights or an input, with its element type and
shape), ``PythonRef`` (a value kept in Python), ``InputRef`` (a caller's input as given),
``ConstRef`` (a constant operand of the node)). ``Manifest.from_json`` validates, then builds;
``Manifest.to_json`` writes the same document back. Kernel, fallback and memory reports stay JSON
objects (``kernels``, ``fallback``, ``memory``): tools print them, the runtime reads only the
kernel names and steps.

A checksum says a file did not change by accident; it is not a signature: whoever can write the
artifact can rewrite the manifest and its checksums. So the loader trusts no field: ``validate``
checks every field the runtime or ``kiln inspect`` reads (types, ranges, names), and checks the
manifest against itself: every buffer the plan names lies inside the arena, the weights or an input,
with the size of its shape and element type; every value the plan reads is written before; every
native step names a function Kiln generates. ``check_fallback_nodes`` checks the plan's interpreted
steps against the parsed IR. And the manifest against the library: native code was compiled for one
arena size, one weights size and one shape per input, which the library records (``native_layout``,
the symbol ``kiln_layout``); a manifest that disagrees is refused before any native call, so a
rewritten manifest (with a shortened ``weights.bin``) cannot make native code read past a buffer.
Each check raises ``SchemaError`` naming the field; ``read_manifest``
(``artifact.py``) turns it into an ``ArtifactError`` naming the artifact.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from ..codegen.native import profile_record_bytes

FORMAT = "kiln-artifact"
FORMAT_VERSION = 2  # 2: the library records its layout (``kiln_layout``)
MANIFEST = "manifest.json"
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
IR_TEXT = "model.kir"

#: a file of the artifact: one path component, no leading dot (so never ``..``), no separator
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}\Z")
#: the functions of a plan's native steps, as ``Program.segment_name`` names them
SEGMENT = re.compile(r"kiln_(forward|segment_[0-9]{1,6})\Z")
SHA256 = re.compile(r"[0-9a-f]{64}\Z")
MAX_DEPTH = 32          # JSON nesting (a manifest needs 6)
MAX_INT = 1 << 62       # any count, size, offset or dimension
LAYOUT_SYMBOL = "kiln_layout"  # the library's record of what its native code was compiled for
STATUS_BYTES = 32       # the status record native code reports errors in (``runtime/status.py``)

_NUMPY = {"f32": "float32", "f64": "float64", "f16": "float16", "i8": "int8", "i16": "int16", "i32": "int32",
          "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "bool": "bool"}


class SchemaError(Exception):
    """A manifest field that is missing, of the wrong type, out of range, or inconsistent."""

    def __init__(self, field: str, message: str):
        super().__init__(f"manifest field {field}: {message}")
        self.field = field


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an element type name (the IR's table only for the narrow types: importing
    it loads ml_dtypes, which takes over a second, and loading should not). KeyError if unknown."""
    if name in _NUMPY:
        return np.dtype(_NUMPY[name])
    from ..ir.types import DType

    return DType[name].np


def machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return MAX_INT


# -- typed access: each names the field it checks ---------------------------------------------------

def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _get(d: dict, key: str, field: str, optional: bool = False) -> Any:
    if key not in d:
        if optional:
            return None
        raise SchemaError(f"{field}.{key}" if field else key, "missing")
    return d[key]


def _obj(v: Any, field: str) -> dict:
    if not isinstance(v, dict):
        raise SchemaError(field, f"expected an object, got {_show(v)}")
    return v


def _list(v: Any, field: str, limit: int = 1 << 24) -> list:
    if not isinstance(v, list):
        raise SchemaError(field, f"expected a list, got {_show(v)}")
    if len(v) > limit:
        raise SchemaError(field, f"{len(v)} entries, more than {limit}")
    return v


def _str(v: Any, field: str) -> str:
    if not isinstance(v, str):
        raise SchemaError(field, f"expected a string, got {_show(v)}")
    return v


def _int(v: Any, field: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if type(v) is not int:  # bool is not an int here
        raise SchemaError(field, f"expected an integer, got {_show(v)}")
    if not lo <= v <= hi:
        raise SchemaError(field, f"{v} is out of range ({lo} to {hi})")
    return v


def _strings(v: Any, field: str) -> list[str]:
    return [_str(s, f"{field}[{i}]") for i, s in enumerate(_list(v, field))]


def _dtype(v: Any, field: str) -> np.dtype:
    name = _str(v, field)
    try:
        return np_dtype(name)
    except (KeyError, TypeError):
        raise SchemaError(field, f"unknown element type {_show(name)}") from None


def _shape(v: Any, field: str) -> tuple[int, ...]:
    return tuple(_int(d, f"{field}[{i}]") for i, d in enumerate(_list(v, field, limit=64)))


def _nbytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            raise SchemaError("(document)", f"nested more than {limit} deep")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)


# -- one check per concern -------------------------------------------------------------------------

def check_header(m: dict) -> None:
    if m.get("format") != FORMAT:
        raise SchemaError("format", f"expected {FORMAT!r}, got {_show(m.get('format'))}")
    _int(_get(m, "format_version", ""), "format_version", 1, FORMAT_VERSION)
    _str(_get(m, "manifest_sha256", ""), "manifest_sha256")
    for key in ("kiln_version", "model"):
        _str(_get(m, key, ""), key)
    _int(_get(m, "opt_level", ""), "opt_level", 0, 3)
    _int(_get(m, "nodes", ""), "nodes")
    _int(_get(m, "views", ""), "views")
    if not isinstance(m.get("profile", False), bool):
        raise SchemaError("profile", f"expected true or false, got {_show(m['profile'])}")
    for key, secs in _obj(_get(m, "compile_seconds", ""), "compile_seconds").items():
        if type(secs) not in (int, float):
            raise SchemaError(f"compile_seconds.{key}", f"expected a number, got {_show(secs)}")


def check_target(m: dict) -> None:
    t = _obj(_get(m, "target", ""), "target")
    for key in ("triple", "cpu", "features"):
        _str(_get(t, key, "target"), f"target.{key}")
    _strings(_get(t, "isa", "target"), "target.isa")


def check_files(m: dict) -> None:
    """Every file is one name inside the artifact with a SHA-256; the files the runtime needs are there."""
    files = _obj(_get(m, "files", ""), "files")
    for name, digest in files.items():
        if not FILE_NAME.match(name):
            raise SchemaError("files", f"{_show(name)} is not a file name inside the artifact (a single name, "
                                       f"no '/', not starting with '.')")
        if not isinstance(digest, str) or not SHA256.match(digest):
            raise SchemaError(f"files.{name}", f"expected a SHA-256 in hex, got {_show(digest)}")
    if MANIFEST in files:
        raise SchemaError("files", f"lists {MANIFEST} itself")
    need = [WEIGHTS, IR_TEXT] + ([LIBRARY] if any("native" in s for s in m["plan"]) else [])
    for name in need:
        if name not in files:
            raise SchemaError("files", f"does not list {name}, which this artifact needs")


def _check_tensor(desc: dict, field: str) -> None:
    """A signature entry: a name and a type; with ``dtype``/``shape`` when static, matching the type."""
    _str(_get(desc, "name", field), f"{field}.name")
    type_text = _str(_get(desc, "type", field), f"{field}.type")
    if "dtype" in desc or "shape" in desc:
        _dtype(_get(desc, "dtype", field), f"{field}.dtype")
        shape = _shape(_get(desc, "shape", field), f"{field}.shape")
        written = f"{desc['dtype']}[{','.join(str(d) for d in shape)}]"
        if type_text != written:
            raise SchemaError(f"{field}.shape", f"{desc['dtype']}{list(shape)} disagrees with the type "
                                                f"{_show(type_text)}")


def check_signature(m: dict) -> None:
    for key in ("inputs", "outputs"):
        names = set()
        for i, d in enumerate(_list(_get(m, key, ""), key)):
            _check_tensor(_obj(d, f"{key}[{i}]"), f"{key}[{i}]")
            if d["name"] in names:
                raise SchemaError(f"{key}[{i}].name", f"{_show(d['name'])} appears twice")
            names.add(d["name"])


def check_memory(m: dict) -> None:
    mem = _obj(_get(m, "memory", ""), "memory")
    limit = machine_memory()
    arena = _int(_get(mem, "arena_bytes", "memory"), "memory.arena_bytes")
    if arena > limit:
        raise SchemaError("memory.arena_bytes", f"{arena} bytes is more than this machine's memory ({limit})")
    for key in ("lower_bound_bytes", "naive_bytes", "weights_bytes"):
        _int(_get(mem, key, "memory"), f"memory.{key}")
    for key in ("scratch_bytes", "in_place"):
        if key in mem:
            _int(mem[key], f"memory.{key}")
    if mem["lower_bound_bytes"] > arena:
        raise SchemaError("memory.arena_bytes", f"{arena} is less than the lower bound "
                                                f"{mem['lower_bound_bytes']} (memory.lower_bound_bytes)")
    status = m.get("status_offset")
    if status is not None and _int(status, "status_offset") + STATUS_BYTES > arena:
        raise SchemaError("status_offset", f"the status record at {status} runs past the arena ({arena} bytes)")
    prof = m.get("profile_offset")
    if prof is not None:
        if not m.get("profile", False):
            raise SchemaError("profile_offset", "a profile record in an artifact not built for profiling")
        steps = _int(m.get("nodes", 0), "nodes")  # a step per node of the final graph
        if _int(prof, "profile_offset") + profile_record_bytes(steps) > arena:
            raise SchemaError("profile_offset", f"the profile record at {prof} ({profile_record_bytes(steps)} bytes "
                                                f"for {steps} steps) runs past the arena ({arena} bytes)")


def check_kernels(m: dict) -> None:
    arena = m["memory"]["arena_bytes"]
    for i, k in enumerate(_list(_get(m, "kernels", ""), "kernels")):
        f = f"kernels[{i}]"
        _obj(k, f)
        _str(_get(k, "name", f), f"{f}.name")
        _int(_get(k, "step", f), f"{f}.step", hi=(1 << 31) - 1)
        _strings(_get(k, "ops", f), f"{f}.ops")
        _strings(_get(k, "nodes", f), f"{f}.nodes")
        _strings(k.get("notes", []), f"{f}.notes")
        if k.get("lowering") is not None:
            _str(k["lowering"], f"{f}.lowering")
        for key in ("flops", "bytes"):
            _int(_get(k, key, f), f"{f}.{key}")
        _int(_get(k, "scratch_bytes", f), f"{f}.scratch_bytes", hi=arena)
    for i, fb in enumerate(_list(_get(m, "fallback", ""), "fallback")):
        f = f"fallback[{i}]"
        _obj(fb, f)
        for key in ("op", "node", "reason"):
            _str(_get(fb, key, f), f"{f}.{key}")
        _int(_get(fb, "index", f), f"{f}.index")
    for i, c in enumerate(_list(m.get("concats_in_place", []), "concats_in_place")):
        _obj(c, f"concats_in_place[{i}]")
        for key in ("node", "note"):
            _str(_get(c, key, f"concats_in_place[{i}]"), f"concats_in_place[{i}].{key}")


class _Layout:
    """Where buffers may lie: the arena, the weights, the static inputs."""

    def __init__(self, m: dict):
        self.arena = m["memory"]["arena_bytes"]
        self.weights = m["memory"]["weights_bytes"]
        self.inputs = m["inputs"]

    def input(self, where: Any, field: str) -> dict:
        return self.inputs[_int(where, field, hi=len(self.inputs) - 1)]

    def buffer(self, place: Any, dtype: Any, shape: Any, field: str, kinds=("input", "arena", "weight")) -> None:
        """A buffer of ``dtype``/``shape`` at ``place``: inside its memory, of the size its type needs."""
        place = _list(place, f"{field}.place", limit=2)
        if len(place) != 2 or place[0] not in kinds:
            raise SchemaError(f"{field}.place", f"expected [kind, offset] with kind one of {', '.join(kinds)}, "
                                                f"got {_show(place)}")
        kind, where = place
        dt = _dtype(dtype, f"{field}.dtype")
        dims = _shape(shape, f"{field}.shape")
        if dt.kind == "O" and kind != "input":  # (an input passed through is the caller's object)
            raise SchemaError(f"{field}.dtype", f"{dtype} values cannot live in a buffer")
        if kind == "input":
            inp = self.input(where, f"{field}.place[1]")
            if "dtype" not in inp or inp["dtype"] != dtype or math.prod(inp["shape"]) != math.prod(dims):
                raise SchemaError(f"{field}", f"{dtype}{list(dims)} is not a view of input {where} "
                                              f"({inp['type']})")
            return
        where = _int(where, f"{field}.place[1]")
        size = self.arena if kind == "arena" else self.weights
        nbytes = _nbytes(dt, dims)
        if where + nbytes > size:
            raise SchemaError(f"{field}.place", f"{nbytes} bytes at offset {where} run past the {kind} "
                                                f"({size} bytes)")


def _check_ref(ref: Any, field: str, layout: _Layout, written: set, reading: bool) -> None:
    """One operand (``reading``) or result of an interpreted step."""
    if ref is None and reading:
        return
    ref = _list(ref, field, limit=4)
    kind = ref[0] if ref else None
    if kind == "python" and len(ref) == 2:
        key = _str(ref[1], f"{field}[1]")
        if reading and key not in written:
            raise SchemaError(field, f"reads {_show(key)} before any step computes it")
        written.add(key)
    elif kind == "buffer" and len(ref) == 4:
        layout.buffer(ref[1], ref[2], ref[3], field, ("input", "arena", "weight") if reading else ("arena",))
    elif reading and kind == "input" and len(ref) == 2:
        layout.input(ref[1], f"{field}[1]")
    elif reading and kind == "const" and len(ref) == 2:
        _int(ref[1], f"{field}[1]", hi=1 << 16)
    else:
        raise SchemaError(field, f"not a valid {'operand' if reading else 'result'}: {_show(ref)}")


def check_plan(m: dict) -> None:
    """The steps in order: native segments by name (each once), interpreted nodes by operand and result."""
    layout = _Layout(m)
    written: set[str] = set()
    natives = set()
    for i, step in enumerate(_list(m["plan"], "plan")):
        f = f"plan[{i}]"
        _obj(step, f)
        if "native" in step:
            name = _str(step["native"], f"{f}.native")
            if not SEGMENT.match(name) or name in natives:
                raise SchemaError(f"{f}.native", f"{_show(name)} is not a forward function of a Kiln artifact "
                                                 f"(kiln_forward or kiln_segment_N, each once)")
            natives.add(name)
        elif "fallback" in step:
            _int(step["fallback"], f"{f}.fallback")
            _str(_get(step, "op", f), f"{f}.op")
            for key, reading in (("inputs", True), ("outputs", False)):
                for j, ref in enumerate(_list(_get(step, key, f), f"{f}.{key}")):
                    _check_ref(ref, f"{f}.{key}[{j}]", layout, written, reading)
        else:
            raise SchemaError(f, "a step is either native or fallback")
    for i, o in enumerate(m["outputs"]):
        f = f"outputs[{i}]"
        place = _get(o, "place", f)
        if isinstance(place, list) and place[:1] == ["python"]:
            key = _str(_get(o, "key", f), f"{f}.key")
            if key not in written:
                raise SchemaError(f"{f}.key", f"no step computes {_show(key)}")
        elif isinstance(place, list) and place[:1] == ["input"] and "dtype" not in o:
            layout.input(place[1] if len(place) == 2 else None, f"{f}.place[1]")
        else:
            layout.buffer(place, _get(o, "dtype", f), _get(o, "shape", f), f)


def validate(m: Any) -> dict:
    """``m`` if it is a well-formed, self-consistent manifest (see the module docstring)."""
    check_depth(m)
    _obj(m, "(document)")
    _list(_get(m, "plan", ""), "plan")
    check_header(m)
    check_target(m)
    check_files(m)
    check_signature(m)
    check_memory(m)
    check_kernels(m)
    check_plan(m)
    return m


def native_layout(m: "Manifest") -> bytes:
    """What an artifact's native code was compiled for, as the library records it (``LAYOUT_SYMBOL``):
    the arena and weights sizes, the status record, each input's element type and shape (None for
    those only the interpreter reads) and the native functions in plan order. Canonical JSON."""
    layout = {"arena_bytes": m.memory["arena_bytes"], "weights_bytes": m.memory["weights_bytes"],
              "status_offset": m.status_offset,
              **({"profile_offset": m.profile_offset} if m.profile_offset is not None else {}),
              "inputs": [[i.dtype, list(i.shape)] if i.dtype is not None else None for i in m.inputs],
              "native": [s.function for s in m.plan if isinstance(s, NativeStep)]}
    return json.dumps(layout, sort_keys=True, separators=(",", ":")).encode()


_LAYOUT_FIELDS = {"arena_bytes": "memory.arena_bytes", "weights_bytes": "memory.weights_bytes",
                  "status_offset": "status_offset", "profile_offset": "profile_offset", "inputs": "inputs",
                  "native": "plan"}


def check_layout(m: "Manifest", recorded: bytes) -> None:
    """The manifest against the library's record of its native code (``native_layout``)."""
    want = native_layout(m)
    if recorded == want:
        return
    try:
        got, mine = json.loads(recorded), json.loads(want)
        key = next(k for k in sorted(mine) if got.get(k) != mine.get(k))
    except Exception:
        raise SchemaError("(layout)", f"{LIBRARY} holds no layout record Kiln wrote ({LAYOUT_SYMBOL})") from None
    raise SchemaError(_LAYOUT_FIELDS[key], f"{_show(mine[key])}, but {LIBRARY} was compiled for {_show(got.get(key))}")


def check_fallback_nodes(m: "Manifest", graph) -> None:
    """The interpreted steps against the parsed IR: each names a node of the right op, with as many
    operands and results, and its constant operands are constants."""
    for i, step in enumerate(m.plan):
        if not isinstance(step, FallbackStep):
            continue
        f = f"plan[{i}]"
        if step.node >= len(graph.nodes):
            raise SchemaError(f"{f}.fallback", f"node {step.node} does not exist ({len(graph.nodes)} nodes)")
        node = graph.nodes[step.node]
        if node.op.name != step.op:
            raise SchemaError(f"{f}.op", f"{step.op!r}, but node {step.node} is {node.op.name}")
        if len(step.inputs) != len(node.inputs) or len(step.outputs) != len(node.outputs):
            raise SchemaError(f, f"{len(step.inputs)} operand(s) and {len(step.outputs)} result(s), but "
                                 f"the {node.op.name} node has {len(node.inputs)} and {len(node.outputs)}")
        for j, ref in enumerate(step.inputs):
            if isinstance(ref, ConstRef):
                v = node.inputs[ref.position] if ref.position < len(node.inputs) else None
                if v is None or v.const is None:
                    raise SchemaError(f"{f}.inputs[{j}]", f"operand {ref.position} of the {node.op.name} node "
                                                          f"is not a constant")


# -- the records ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BufferRef:
    """A buffer: ``place`` "arena" or "weight" (a byte offset) or "input" (an input's index, seen
    with this element type and shape), holding ``dtype[shape]``."""

    place: str
    where: int
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> list:
        return ["buffer", [self.place, self.where], self.dtype, list(self.shape)]


@dataclass(frozen=True)
class PythonRef:
    """A value an interpreted step made, kept in Python under ``key``."""

    key: str

    def to_json(self) -> list:
        return ["python", self.key]


@dataclass(frozen=True)
class InputRef:
    """A caller's input as given (a sequence, or a tensor of symbolic shape)."""

    index: int

    def to_json(self) -> list:
        return ["input", self.index]


@dataclass(frozen=True)
class ConstRef:
    """The node's own constant operand at ``position``."""

    position: int

    def to_json(self) -> list:
        return ["const", self.position]


Ref = Union[BufferRef, PythonRef, InputRef, ConstRef]


def ref_from_json(j: list) -> Ref:
    kind = j[0]
    if kind == "buffer":
        return BufferRef(j[1][0], int(j[1][1]), j[2], tuple(int(d) for d in j[3]))
    return {"python": PythonRef, "input": InputRef, "const": ConstRef}[kind](j[1])


@dataclass(frozen=True)
class NativeStep:
    """A forward function of the library (``kiln_forward`` or ``kiln_segment_N``)."""

    function: str

    def to_json(self) -> dict:
        return {"native": self.function}


@dataclass(frozen=True)
class FallbackStep:
    """Node ``node`` (an ``op``) of the IR, run by the reference interpreter."""

    node: int
    op: str
    inputs: tuple  # Ref or None (an absent optional operand), per operand
    outputs: tuple  # Ref, per result

    def to_json(self) -> dict:
        return {"fallback": self.node, "op": self.op,
                "inputs": [r.to_json() if r is not None else None for r in self.inputs],
                "outputs": [r.to_json() for r in self.outputs]}


Step = Union[NativeStep, FallbackStep]


def step_from_json(j: dict) -> Step:
    if "native" in j:
        return NativeStep(j["native"])
    return FallbackStep(j["fallback"], j["op"], tuple(ref_from_json(r) if r is not None else None for r in j["inputs"]),
                        tuple(ref_from_json(r) for r in j["outputs"]))


@dataclass(frozen=True)
class Tensor:
    """A signature entry: the name and IR type; ``dtype``/``shape`` when the type is a static tensor.
    An output also says where it is read (``ref``)."""

    name: str
    type: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    ref: Ref | None = None

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.dtype is not None:
            d["dtype"], d["shape"] = self.dtype, list(self.shape)
        r = self.ref
        if isinstance(r, PythonRef):
            d["place"], d["key"] = ["python", 0], r.key
        elif isinstance(r, InputRef):
            d["place"] = ["input", r.index]
        elif isinstance(r, BufferRef):
            d["place"] = [r.place, r.where]
        return d

    @staticmethod
    def from_json(d: dict, output: bool = False) -> "Tensor":
        dtype = d.get("dtype")
        shape = tuple(int(x) for x in d["shape"]) if dtype is not None else None
        ref = None
        if output:
            place = d["place"]
            if place[0] == "python":
                ref = PythonRef(d["key"])
            elif dtype is None:
                ref = InputRef(place[1])
            else:
                ref = BufferRef(place[0], place[1], dtype, shape)
        return Tensor(d["name"], d["type"], dtype, shape, ref)


@dataclass(frozen=True)
class Target:
    """The CPU the native code was compiled for."""

    triple: str
    cpu: str
    features: str
    isa: tuple[str, ...]

    def to_json(self) -> dict:
        return {"triple": self.triple, "cpu": self.cpu, "features": self.features, "isa": sorted(self.isa)}


@dataclass
class Manifest:
    """An artifact's ``manifest.json`` (see the module docstring)."""

    kiln_version: str
    model: str
    opt_level: int
    target: Target
    inputs: list[Tensor]
    outputs: list[Tensor]
    plan: list  # of Step
    memory: dict        # the memory report (``Program.memory_summary``)
    kernels: list[dict] = field(default_factory=list)   # per kernel: name, step, ops, nodes, lowering, ...
    fallback: list[dict] = field(default_factory=list)  # per interpreted node: op, node, index, reason
    concats_in_place: list[dict] = field(default_factory=list)
    views: int = 0
    nodes: int = 0
    status_offset: int | None = None
    profile: bool = False
    profile_offset: int | None = None   # the profile record in the arena (``profile``)
    compile_seconds: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)           # file name -> SHA-256
    manifest_sha256: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def native(self) -> bool:
        """Whether any step runs native code (the artifact has a library)."""
        return any(isinstance(s, NativeStep) for s in self.plan)

    @property
    def interpreted(self) -> bool:
        """Whether any step runs in the interpreter (the artifact's IR is read at load)."""
        return any(isinstance(s, FallbackStep) for s in self.plan)

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "format_version": self.format_version, "kiln_version": self.kiln_version,
            "model": self.model, "opt_level": self.opt_level, "target": self.target.to_json(),
            "inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs],
            "plan": [s.to_json() for s in self.plan],
            "kernels": self.kernels, "views": self.views, "concats_in_place": self.concats_in_place,
            "fallback": self.fallback, "memory": self.memory, "status_offset": self.status_offset,
            "nodes": self.nodes, "profile": self.profile, "profile_offset": self.profile_offset,
            "compile_seconds": self.compile_seconds,
            "files": self.files, "manifest_sha256": self.manifest_sha256,
        }

    @staticmethod
    def from_json(m: Any) -> "Manifest":
        """The manifest a JSON document holds, validated first (``SchemaError`` naming the field)."""
        validate(m)
        t = m["target"]
        return Manifest(
            kiln_version=m["kiln_version"], model=m["model"], opt_level=m["opt_level"],
            target=Target(t["triple"], t["cpu"], t["features"], tuple(t["isa"])),
            inputs=[Tensor.from_json(d) for d in m["inputs"]],
            outputs=[Tensor.from_json(d, output=True) for d in m["outputs"]],
            plan=[step_from_json(s) for s in m["plan"]], memory=m["memory"], kernels=m["kernels"],
            fallback=m["fallback"], concats_in_place=m.get("concats_in_place", []), views=m["views"],
            nodes=m["nodes"], status_offset=m.get("status_offset"), profile=m.get("profile", False),
            profile_offset=m.get("profile_offset"),
            compile_seconds=m["compile_seconds"], files=m["files"], manifest_sha256=m["manifest_sha256"],
            format_version=m["format_version"])


__all__ = ["FILE_NAME", "FORMAT", "FORMAT_VERSION", "IR_TEXT", "LIBRARY", "MANIFEST", "SEGMENT", "BufferRef",
           "ConstRef", "FallbackStep", "InputRef", "Manifest", "NativeStep", "PythonRef", "SchemaError", "Target",
           "Tensor", "WEIGHTS", "check_depth", "check_fallback_nodes", "check_layout", "native_layout", "np_dtype",
           "validate"]
