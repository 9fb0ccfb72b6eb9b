"""The HTML report (compiler/tools/report.py, ``kiln profile --html``): the compile record it is built
from, its sections and links, that it fetches nothing, and that a real headless browser (Chromium)
loads it without a script error and finds every section and drawing."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

import compiler
from compiler.profiling import CompileRecord, profile
from compiler.tools.cli import main
from compiler.tools.report import SECTIONS, report_html
from compiler.tools.summary import summarize_graph
from compiler.models import load_graph
from tests.cli.test_profile import FEEDS, ROOF, _model

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _Tags(HTMLParser):
    """Ids, links, and every address the page would fetch."""

    def __init__(self):
        super().__init__()
        self.ids, self.links, self.fetches = set(), [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href", "").startswith("#"):
            self.links.append(a["href"][1:])
        for key in ("src", "href"):
            url = a.get(key) or ""
            if url and not url.startswith(("#", "data:")):
                self.fetches.append(url)


def _report(model=None, feeds=None, runs=3):
    model = model if model is not None else _model()
    record = CompileRecord()
    exe = compiler.compile(model, profile=True, record=record)
    p = profile(exe, feeds if feeds is not None else FEEDS, runs=runs, roofline=ROOF)
    return record, report_html(p, record, summarize_graph(load_graph(model)), title="test model")


def test_the_record_holds_the_passes_the_ir_and_the_plan():
    record, _ = _report()
    assert [r.index for r in record.passes] == list(range(1, len(record.passes) + 1))
    assert record.stages[0][:2] == (0, "input") and "Conv" in record.stages[0][2]
    changed = [r.index for r in record.passes if r.changed]
    assert [i for i, _, _ in record.stages[1:]] == changed  # the IR after every pass that changed it
    assert any(name == "fuse" for _, name, _ in record.stages)
    assert record.graph is not None and record.program.arena_bytes > 0
    assert {"load", "passes", "codegen", "llvm_and_link"} <= set(record.seconds)


def test_a_recorded_compile_does_not_use_the_cache(tmp_path):
    compiler.compile(_model(), cache=str(tmp_path))
    record = CompileRecord()
    compiler.compile(_model(), cache=str(tmp_path), record=record)
    assert record.passes and record.program is not None


def test_the_page_has_every_section_its_links_resolve_and_it_fetches_nothing():
    record, html = _report()
    tags = _Tags()
    tags.feed(html)
    assert set(SECTIONS) <= tags.ids
    assert tags.fetches == []  # self-contained: no script, style, image or font from elsewhere
    assert set(tags.links) <= tags.ids  # the nav and every stage link land on the page
    assert {f"stage-{i}" for i, _, _ in record.stages} <= tags.ids
    assert html.count("<svg") >= 5  # kernel graph, memory plan, roofline, the run and the passes
    assert "data:application/json;base64," in html  # the trace, as a download
    assert "/block/conv" in html  # the summary's scopes


def test_kiln_profile_html_writes_the_page(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    out = tmp_path / "r.html"
    assert main(["profile", str(path), "--runs", "2", "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    text = out.read_text()
    assert all(f'id="{s}"' in text for s in SECTIONS) and 'href="#stage-' in text


def test_an_artifact_report_says_what_was_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "m.kiln"), "--profile"]) == 0
    out = tmp_path / "r.html"
    assert main(["profile", str(tmp_path / "m.kiln"), "--runs", "2", "--html", str(out)]) == 0
    text = out.read_text()
    assert "its compile was not recorded" in text and 'id="kernels"' in text and 'id="roofline"' in text


def _browser() -> str | None:
    return next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


def _load_in_browser(path) -> dict:
    """<body>'s attributes once the page loaded in headless Chromium (the page's script writes them)."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium)")
    cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
           f"--user-data-dir={os.path.dirname(path)}/chromium-profile", "--dump-dom", f"file://{path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", out.stdout)
    assert body, out.stdout[:2000]
    return dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', body.group(1)))


def test_the_page_loads_in_a_headless_browser(tmp_path):
    _, html = _report()
    path = tmp_path / "report.html"
    path.write_text(html)
    attrs = _load_in_browser(path)
    assert attrs.get("data-ready") == "ok", attrs
    assert "data-errors" not in attrs, attrs["data-errors"]
    assert int(attrs["data-svgs"]) >= 5  # every drawing laid out with a size


def test_a_script_error_is_caught_by_the_check(tmp_path):
    """The check is not blind: a page whose script fails is reported as such."""
    _, html = _report()
    path = tmp_path / "broken.html"
    path.write_text(html.replace("</body>", "<script>undefinedFunction();</script></body>"))
    attrs = _load_in_browser(path)
    assert "undefinedFunction" in attrs.get("data-errors", "")


@pytest.mark.slow
def test_the_resnet50_report_renders(tmp_path, monkeypatch):
    """The issue's check: ResNet-50's report, from ``kiln profile --html``, in headless Chromium."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    out, trace = tmp_path / "resnet50.html", tmp_path / "resnet50.json"
    assert main(["profile", "light:resnet50", "--runs", "2", "--top", "3", "--html", str(out),
                 "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]  # every kernel once per run, on the caller's track
    kernels = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == 1]
    for run in (0, 1):
        names = [e["name"] for e in kernels if e["args"]["run"] == run]
        assert len(names) == len(kernels) // 2 > 50
    assert any(e["ph"] == "X" and e["pid"] == 2 for e in events)  # the compile's passes
    text = out.read_text()
    assert "25,610,152 parameters" in text  # the summary (kiln summary gives the same)
    attrs = _load_in_browser(out)
    assert attrs.get("data-ready") == "ok" and "data-errors" not in attrs, attrs
    assert int(attrs["data-svgs"]) >= 5
