"""kiln dump: stages per pass (text, DOT, ONNX), summaries, printing one stage, and --check naming the
pass that changes the numbers."""
from __future__ import annotations

import json
import re

import numpy as np
import onnxruntime as ort
import pytest

from compiler.tools.cli import main
from compiler.ir.interpreter import interpret
from compiler.ir.parser import load_text
from compiler.ir.printer import print_graph
from compiler.tools import zoo


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """A small EfficientNet-style model (Conv + BatchNorm + SiLU + SE) as an ONNX file."""
    path = tmp_path_factory.mktemp("m") / "effnet.onnx"
    path.write_bytes(zoo.export("efficientnet_block", resolution=32)[0])
    return str(path)


def test_dump_dir_writes_one_parseable_stage_per_pass(cnn, tmp_path, capsys):
    out = tmp_path / "stages"
    assert main(["dump", cnn, "--print-after-all", "--dump-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    files = sorted(p.name for p in out.glob("*.kir"))
    assert files[0] == "00-input.kir" and "08-fold-batchnorm.kir" in files
    summary = (out / "summary.txt").read_text()
    assert "fold-batchnorm" in summary and "yes" in summary and "nodes before → after" in summary
    assert printed.count("IR after pass") == len(files) - 1
    stage = load_text(str(out / "08-fold-batchnorm.kir"))
    assert "BatchNormalization" not in stage.op_counts()
    assert print_graph(load_text(str(out / "08-fold-batchnorm.kir"))) == print_graph(stage)
    # a dumped stage runs with the reference interpreter
    assert main(["run", str(out / "08-fold-batchnorm.kir")]) == 0
    assert "output: float32[1, 64, 8, 8]" in capsys.readouterr().out


def test_print_after_one_pass(cnn, capsys):
    assert main(["dump", cnn, "--print-after", "fold-batchnorm"]) == 0
    out = capsys.readouterr().out
    assert out.count("IR after pass") == 1 and "08 fold-batchnorm (changed)" in out
    assert main(["dump", cnn, "--print-after", "no-such-pass"]) == 1
    assert "unknown pass(es) no-such-pass" in capsys.readouterr().err


def test_json_summary(cnn, capsys):
    assert main(["dump", cnn, "--json", "-O1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in doc["passes"]][:3] == ["infer-shapes", "fold-qdq", "fold-constants"]
    assert all({"seconds", "nodes_before", "nodes_after", "changed"} <= set(p) for p in doc["passes"])


def test_onnx_stages_run_in_onnxruntime(cnn, tmp_path):
    out = tmp_path / "onnx"
    assert main(["dump", cnn, "--dump-dir", str(out), "--format", "onnx"]) == 0
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    first = ort.InferenceSession(str(out / "00-input.onnx")).run(None, {"x": x})[0]
    last = sorted(out.glob("*.onnx"))[-1]
    np.testing.assert_allclose(ort.InferenceSession(str(last)).run(None, {"x": x})[0], first, rtol=1e-4, atol=1e-5)


def test_dot_stages(cnn, tmp_path):
    out = tmp_path / "dot"
    assert main(["dump", cnn, "--dump-dir", str(out), "--format", "dot", "-O1"]) == 0
    text = (out / "00-input.dot").read_text()
    assert text.startswith("digraph") and "Conv" in text and "->" in text


def test_check_passes_on_the_real_pipeline(cnn, capsys):
    assert main(["dump", cnn, "--check"]) == 0
    assert "OK: no pass changed the outputs beyond tolerance" in capsys.readouterr().out


def test_check_names_a_planted_wrong_pass(cnn, capsys):
    code = main(["dump", cnn, "--check", "--extra-pass", "tests.cli.planted:SkewFirstWeights"])
    out = capsys.readouterr().out
    assert code == 1
    assert re.search(r"FAIL: pass \d+ 'planted-wrong-pass' changed the outputs beyond tolerance", out), out
    assert "<-- first pass beyond tolerance" in out


def test_list_and_disable_passes(cnn, capsys):
    assert main(["dump", cnn, "--list-passes", "-O2"]) == 0
    assert "fold-batchnorm" in capsys.readouterr().out
    assert main(["dump", cnn, "--disable-pass", "fold-batchnorm", "--disable-pass", "fold-scale-bias"]) == 0
    assert "BatchNormalization(" in capsys.readouterr().out
    assert main(["dump", cnn, "--disable-pass", "nope"]) == 1
    assert "cannot disable unknown pass(es) nope" in capsys.readouterr().err


def test_interpreter_agrees_after_dump_roundtrip(cnn, tmp_path):
    """The final IR written with -o parses back and computes what the model computes."""
    from frontends.onnx import import_model

    out = tmp_path / "final.kir"
    assert main(["dump", cnn, "-o", str(out)]) == 0
    g = load_text(str(out))
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    ref = interpret(import_model(cnn), {"x": x})["output"]
    np.testing.assert_allclose(interpret(g, {"x": x})["output"], ref, rtol=1e-4, atol=1e-5)


def test_check_handles_sequence_values(tmp_path, capsys):
    path = tmp_path / "seq.kir"
    path.write_text("""graph @s(%a: f32[2,3], %b: f32[2,3]) -> (y: f32[4,3]) {
  %0 = SequenceConstruct(%a, %b) : seq<2 x f32[2,3]>
  %1 = ConcatFromSequence(%0) {axis=0} : f32[4,3]
  return y=%1
}
""")
    assert main(["dump", str(path), "--check"]) == 0
    assert "OK: no pass changed the outputs beyond tolerance" in capsys.readouterr().out


def test_explain_fusion_says_why_pairs_stay_apart(cnn, capsys):
    assert main(["dump", cnn, "--explain-fusion"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fusion: ") and "fused      Conv node" in out and ": epilogue chain" in out
    assert "not fused  " in out and "(pattern reduce)" in out  # the squeeze-excite's GlobalAveragePool
    assert main(["dump", cnn, "--explain-fusion", "-O1"]) == 1
    assert "the pipeline has no fuse pass" in capsys.readouterr().err


def test_explain_fusion_lists_a_decomposed_pattern_that_did_not_match(tmp_path, capsys):
    """A GELU written out whose erf is also a graph output stays decomposed, and --explain-fusion
    says so with the reason (the GELU of tests/passes/test_decomposed.py)."""
    from tests.passes.test_decomposed import GELU

    path = tmp_path / "m.kir"
    path.write_text(GELU.replace("(y: f32[4,16])", "(y: f32[4,16], e: f32[4,16])")
                    .replace("return y=%4", "return y=%4, e=%1").strip() + "\n")
    assert main(["dump", str(path), "--explain-fusion"]) == 0
    out = capsys.readouterr().out
    assert "patterns: 1 near miss(es) of a decomposed LayerNorm or GELU" in out
    assert "not matched decomposed-gelu at Mul: Erf is used outside the pattern" in out
    assert main(["dump", str(path)]) == 0
    assert "Gelu(" not in capsys.readouterr().out


def test_kernels_prints_each_kernel_in_the_loop_form(tmp_path, capsys):
    path = tmp_path / "m.kir"
    path.write_text("""\
graph @g(%x: f32[2,3,8], %b: f32[8], %m: i64[2,3,8]) -> (y: f32[2,3,8], z: bool[2,3,8], w: f32[2,3,3]) {
  %0 = Add(%x, %b) : f32[2,3,8]
  %1 = Sigmoid(%0) : f32[2,3,8]
  %2 = Mul(%0, %1) : f32[2,3,8]
  %c = const i64[] dense<3>
  %3 = Greater(%m, %c) : bool[2,3,8]
  %t = Transpose(%x) {perm=[0, 2, 1]} : f32[2,8,3]
  %4 = MatMul(%x, %t) : f32[2,3,3]
  return y=%2, z=%3, w=%4
}
""")
    assert main(["dump", str(path), "--kernels"]) == 0
    out = capsys.readouterr().out
    assert "# kernel 0: group [Add, Sigmoid, Mul] -> Elementwise" in out
    assert "kernel k0_Add_Sigmoid_Mul(in0: f32[6,8] in, in1: f32[6,8] strides [0,1] in, out0: f32[6,8] out)" in out
    assert "let t1 = sigmoid(t0)" in out and "gt(in0[i0], 3:i64)" in out
    assert "-> MatMul\n  (hand-written LLVM; not yet in the loop form)" in out
