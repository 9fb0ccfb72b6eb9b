"""runtime/format.py: the manifest as typed records, read from and written back to the same JSON."""
from __future__ import annotations

import json
import os
import warnings

import pytest

import compiler
from compiler.ir.parser import parse
from compiler.runtime.format import (MANIFEST, BufferRef, ConstRef, FallbackStep, InputRef, Manifest, NativeStep,
                                     PythonRef, SchemaError)

# a native segment, an interpreted node between two more, a constant operand, an input passed to the
# interpreter, a result kept in Python and one in the arena
MIXED = """graph @g(%x: f32[2,3,4]) -> (y: f32[2,3,4], nz: i64[3,?], r: f32[2,3,4]) {
  %c = const f32[1] dense<[2.0]>
  %0 = Relu(%x) : f32[2,3,4]
  %1 = NonZero(%0) : i64[3,?]
  %2 = Mul(%0, %x) : f32[2,3,4]
  %3 = Pow(%x, %c) : f32[2,3,4]
  return y=%2, nz=%1, r=%0
}"""


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fmt") / "m.kiln")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiler.compile(parse(MIXED), output=path)
    with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
        return path, json.load(f)


def test_reads_typed_records_and_writes_the_same_document(artifact):
    _, doc = artifact
    m = Manifest.from_json(doc)
    assert m.to_json() == doc
    kinds = [type(s) for s in m.plan]
    assert NativeStep in kinds and FallbackStep in kinds
    fb = next(s for s in m.plan if isinstance(s, FallbackStep))
    assert fb.op == "NonZero" and isinstance(fb.inputs[0], BufferRef) and fb.inputs[0].place == "arena"
    assert isinstance(fb.outputs[0], PythonRef)
    outs = {t.name: t for t in m.outputs}
    assert isinstance(outs["nz"].ref, PythonRef) and outs["nz"].dtype is None
    assert isinstance(outs["y"].ref, BufferRef) and outs["y"].ref.shape == (2, 3, 4) == outs["y"].shape
    assert m.inputs[0].dtype == "f32" and m.target.triple and m.native and m.interpreted


def test_refs_round_trip():
    from compiler.runtime.format import ref_from_json

    for r in (BufferRef("weight", 64, "f16", (3, 1)), PythonRef("%4:0"), InputRef(1), ConstRef(2)):
        assert ref_from_json(r.to_json()) == r


def test_a_bad_field_is_a_schema_error_before_any_record_is_built(artifact):
    _, doc = artifact
    bad = json.loads(json.dumps(doc))
    bad["outputs"][1]["place"] = ["python"]  # no key: where would it be read?
    bad["outputs"][1].pop("key", None)
    with pytest.raises(SchemaError, match="outputs\\[1\\]"):
        Manifest.from_json(bad)


def test_the_loaded_executable_holds_the_typed_manifest(artifact):
    path, _ = artifact
    exe = compiler.load(path)
    assert isinstance(exe.manifest, Manifest)
    assert exe.manifest.model and exe.manifest.files and exe.kernels == exe.manifest.kernels
