"""The memory figures in `kiln compile` / `kiln inspect --json`, and `kiln dump --memory-plan`."""
from __future__ import annotations

import json
import xml.dom.minidom

from compiler.tools.cli import main

TEXT = """graph @small(%x: f32[64,64]) -> (y: f32[64,64]) {
  %0 = Exp(%x) : f32[64,64]
  %1 = Tanh(%0) : f32[64,64]
  %2 = Sigmoid(%1) : f32[64,64]
  %3 = Add(%2, %x) : f32[64,64]
  return y=%3
}"""

KEYS = {"arena_bytes", "lower_bound_bytes", "naive_bytes", "weights_bytes", "scratch_bytes", "in_place",
        "arena_over_lower_bound", "naive_over_arena"}


def test_compile_and_inspect_report_the_figures(tmp_path, capsys):
    model = tmp_path / "small.kir"
    model.write_text(TEXT)
    out = str(tmp_path / "small.kiln")
    assert main(["compile", str(model), "-o", out, "--disable-pass", "fuse"]) == 0  # 4 kernels, not 1
    text = capsys.readouterr().out
    # Exp's result is the arena's first buffer; Tanh, Sigmoid and Add write over it in turn
    assert "arena 16384 B = 1.000 x lower bound 16384 B" in text and "3 kernel(s) in place" in text
    assert "naive 0.06 MiB = 4.0 x arena" in text
    assert main(["inspect", out, "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    assert KEYS <= set(mem)
    assert mem["arena_bytes"] == mem["lower_bound_bytes"] == 64 * 64 * 4
    assert mem["naive_bytes"] == 4 * 64 * 64 * 4 and mem["naive_over_arena"] == 4.0
    assert main(["inspect", out]) == 0
    assert "memory   weights 0 B (mapped); arena 16384 B = 1.000 x lower bound" in capsys.readouterr().out


def test_dump_memory_plan_svg(tmp_path, capsys):
    model = tmp_path / "small.kir"
    model.write_text(TEXT)
    svg = tmp_path / "plan.svg"
    assert main(["dump", str(model), "--memory-plan", str(svg)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # the IR is not printed
    assert "wrote" in captured.err and "1 buffers" in captured.err
    doc = xml.dom.minidom.parse(str(svg))
    rects = [r for r in doc.getElementsByTagName("rect") if r.getElementsByTagName("title")]
    assert len(rects) == 1  # one buffer: Exp, Tanh, Sigmoid and Add share it
    assert "in place" in svg.read_text() and "lower bound" in svg.read_text()
