"""The HTML report of ``kiln profile --html``: one self-contained page (no network, no external files)
showing what the compiler did to a model and where its time goes.

Sections, each an element with a fixed id (the browser test checks them):

* ``summary``: parameters, FLOPs, activation memory per name scope and per op (``kiln summary``);
* ``pipeline``: every pass with its time, nodes before and after, and a link to the IR it produced;
* ``stages``: the IR before the pipeline and after every pass that changed it (folded);
* ``kernel-graph``: the fused kernels in schedule order with their data edges, drawn as SVG;
* ``memory``: the arena plan (offset x schedule step), as ``kiln dump --memory-plan`` draws it;
* ``kernels``: the kernel table, slowest first (click a header to sort);
* ``roofline``: each kernel's GFLOP/s against its arithmetic intensity under this machine's roofline;
* ``timeline``: the median run's kernels, each pool thread's time in them, and the compile's passes
  on time axes, and the Chrome trace of every run as a download.

The page's one script sorts the tables and, once loaded, writes ``data-ready="ok"`` (or the missing
sections) on ``<body>``, and any script error into ``data-errors``: what a headless browser checks.
"""
from __future__ import annotations

import base64
import datetime
import json
import math
from html import escape

from .. import __version__
from ..profiling import CompileRecord, Profile
from .summary import _n, tree

SECTIONS = ("summary", "pipeline", "stages", "kernel-graph", "memory", "kernels", "roofline", "timeline")
#: kernel bar colors by the first member op's family
FAMILY_COLORS = {"Conv": "#4e79a7", "MatMul": "#59a14f", "Gemm": "#59a14f", "Attention": "#b07aa1",
                 "Pool": "#f28e2b", "Norm": "#edc948", "Softmax": "#e15759"}
OTHER_COLOR = "#9c9c9c"

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#222}
header{background:#2d3e50;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;font-size:13px;opacity:.85}
nav{position:sticky;top:0;background:#eef1f4;padding:6px 24px;font-size:13px;border-bottom:1px solid #ccd}
nav a{margin-right:14px;color:#2d3e50}
section{padding:8px 24px 18px;border-bottom:1px solid #e4e4e4}
h2{font-size:17px;margin:12px 0 8px}
table{border-collapse:collapse;font-size:12px}
th,td{padding:2px 8px;text-align:right;border-bottom:1px solid #eee;white-space:nowrap}
th{background:#f4f6f8;cursor:pointer}
.scroll th{position:sticky;top:0}
td.l,th.l{text-align:left}
pre{font-size:11px;background:#fafafa;border:1px solid #e4e4e4;padding:8px;overflow:auto;max-height:520px}
.scroll{max-height:640px;overflow:auto;border:1px solid #e4e4e4}
.note{font-size:12px;color:#555}
details summary{cursor:pointer;font-size:13px;margin:2px 0}
"""

SCRIPT = """
document.addEventListener('DOMContentLoaded', function () {
  var need = %s;
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.querySelectorAll('th').forEach(function (th, col) {
      th.addEventListener('click', function () {
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var down = th.dataset.dir !== 'down';
        th.dataset.dir = down ? 'down' : 'up';
        rows.sort(function (a, b) {
          var x = a.cells[col].dataset.v || a.cells[col].textContent;
          var y = b.cells[col].dataset.v || b.cells[col].textContent;
          var nx = parseFloat(x), ny = parseFloat(y);
          var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
          return down ? -c : c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  var missing = need.filter(function (id) { return !document.getElementById(id); });
  var drawn = 0;
  document.querySelectorAll('svg').forEach(function (s) {
    var r = s.getBoundingClientRect(); if (r.width > 0 && r.height > 0) drawn++;
  });
  document.body.dataset.svgs = String(drawn);
  document.body.dataset.ready = missing.length ? 'missing:' + missing.join(',') : 'ok';
});
"""
# registered first, in <head>: an error in any later script is recorded on <body>
ERROR_HOOK = ("window.addEventListener('error', function (e) { var b = document.body || document.documentElement;"
              " b.dataset.errors = (b.dataset.errors || '') + e.message + ';'; });")


def _family(ops) -> str:
    first = ops[0] if ops else ""
    for key in FAMILY_COLORS:
        if key in first:
            return key
    return "other"


def _color(ops) -> str:
    return FAMILY_COLORS.get(_family(ops), OTHER_COLOR)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def _section(sid: str, title: str, body: str, note: str = "") -> str:
    n = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{n}{body}</section>'


def _summary(summary: dict | None, depth: int) -> str:
    if summary is None:
        return _section("summary", "Model summary", "<p>(no model: an artifact was profiled)</p>")
    t = summary["total"]
    head = (f"<p>{t.params:,} parameters ({_n(t.params)}), {_n(t.flops)} FLOPs ({_n(t.flops / 2)} multiply-adds), "
            f"activations {t.activation_bytes / 2 ** 20:.1f} MiB over {t.nodes} nodes, as imported.</p>")
    rows = []
    for scope, level, lay in tree(summary, depth):
        label = scope if level == 1 else "&nbsp;" * 4 * (level - 1) + escape(scope.rsplit("/", 1)[-1])
        rows.append(f'<tr><td class="l">{label if level > 1 else escape(label)}</td><td data-v="{lay.params}">'
                    f'{_n(lay.params)}</td><td data-v="{lay.flops}">{_n(lay.flops)}</td>'
                    f'<td>{lay.activation_bytes / 2 ** 20:.2f}</td><td>{lay.nodes}</td></tr>')
    scopes = ('<div class="scroll"><table class="sortable"><thead><tr><th class="l">scope</th><th>params</th>'
              f'<th>FLOPs</th><th>act MiB</th><th>nodes</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>')
    ops = sorted(summary["by_op"].items(), key=lambda kv: -kv[1].flops)
    orow = "".join(f'<tr><td class="l">{escape(op)}</td><td>{lay.nodes}</td><td data-v="{lay.params}">'
                   f'{_n(lay.params)}</td><td data-v="{lay.flops}">{_n(lay.flops)}</td>'
                   f'<td>{100 * lay.flops / max(t.flops, 1):.1f}</td></tr>' for op, lay in ops)
    optable = ('<h3>Op mix</h3><table class="sortable"><thead><tr><th class="l">op</th><th>nodes</th>'
               f'<th>params</th><th>FLOPs</th><th>% FLOPs</th></tr></thead><tbody>{orow}</tbody></table>')
    return _section("summary", "Model summary", head + scopes + optable,
                    "Per name scope (the exporter's node names), before any pass; a multiply-add counts 2 FLOPs.")


def _pipeline(record: CompileRecord | None) -> str:
    if record is None or not record.passes:
        return (_section("pipeline", "Pass pipeline", "<p>(an artifact was profiled: its compile was not "
                         "recorded; give kiln profile the model to see the passes)</p>")
                + _section("stages", "IR after each pass", "<p>(not recorded)</p>"))
    changed = {i for i, _, _ in record.stages}
    rows = []
    for r in record.passes:
        link = f'<a href="#stage-{r.index}">IR</a>' if r.index in changed else ""
        rows.append(f'<tr><td>{r.index}</td><td class="l">{escape(r.name)}</td><td class="l">'
                    f'{"yes" if r.changed else "no"}</td><td data-v="{r.seconds}">{r.seconds * 1e3:.2f}</td>'
                    f'<td>{r.nodes_before}</td><td>{r.nodes_after}</td><td class="l">{link}</td></tr>')
    total = sum(r.seconds for r in record.passes)
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in record.seconds.items())
    table = ('<table class="sortable"><thead><tr><th>#</th><th class="l">pass</th><th class="l">changed</th>'
             '<th>ms</th><th>nodes before</th><th>nodes after</th><th class="l">stage</th></tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table><p class="note">passes {total:.2f} s in all; compile '
             f'phases: {escape(phases)}</p>')
    stages = "".join(f'<details id="stage-{i}"><summary>{i:02d} {escape(name)} ({text.count(chr(10))} lines)'
                     f'</summary><pre>{escape(text)}</pre></details>' for i, name, text in record.stages)
    return (_section("pipeline", "Pass pipeline", table, "Each pass in the order it ran; its IR is kept when "
                     "it changed the graph.")
            + _section("stages", "IR after each pass", '<a href="#stage-0">the input</a>' + stages,
                       "Kiln's text format (kiln dump --print-after-all prints the same); large constants "
                       "show their type only."))


def _kernel_graph(record: CompileRecord | None, title: str) -> str:
    if record is None or record.graph is None:
        return _section("kernel-graph", "Fused kernels", "<p>(not recorded)</p>")
    from .partition_svg import partition_svg

    svg = partition_svg(record.graph, f"{title}: {len(record.graph.nodes)} nodes after the pipeline",
                        lane="cpu")
    return _section("kernel-graph", "Fused kernels", f'<div class="scroll">{svg}</div>',
                    "One box per node of the final graph in schedule order (a fused kernel shows its "
                    "member ops), with the data edges between them.")


def _memory(record: CompileRecord | None, title: str) -> str:
    if record is None or record.program is None:
        return _section("memory", "Memory plan", "<p>(not recorded)</p>")
    from ..codegen.plan import plan_svg

    prog = record.program
    fig = prog.memory_summary()
    svg = plan_svg(prog.buffers, prog.arena_bytes, fig, title=title)
    return _section("memory", "Memory plan", svg,
                    f"{len(prog.buffers)} buffers in one arena of {prog.arena_bytes / 2 ** 20:.2f} MiB "
                    f"({fig.get('arena_over_lower_bound', 0):.3f} x the lower bound); weights "
                    f"{prog.weights_bytes / 2 ** 20:.1f} MiB are mapped from the artifact, outside the arena.")


def _kernels(p: Profile) -> str:
    total = max(p.kernel_sum_s, 1e-12)
    rows = []
    for k in sorted(p.kernels, key=lambda k: -k.median_s):
        roof = f"{k.roofline_pct:.0f}" if k.roofline_pct is not None else "-"
        nodes = ", ".join(k.nodes[:3]) + (f" (+{len(k.nodes) - 3})" if len(k.nodes) > 3 else "")
        where = f"{k.device} " if k.device else ""
        rows.append(f'<tr><td>{k.step}</td><td class="l">{escape(where + k.name)}</td><td class="l">'
                    f'{escape("+".join(k.ops))}</td><td data-v="{k.median_s}">{_ms(k.median_s)}</td>'
                    f'<td class="l">{_ms(k.min_s)}–{_ms(k.max_s)}</td><td>{100 * k.median_s / total:.1f}</td>'
                    f'<td>{k.gflops:.1f}</td><td>{k.gbs:.1f}</td><td data-v="{k.roofline_pct or -1}">{roof}</td>'
                    f'<td class="l">{escape(nodes)}</td></tr>')
    fall = "".join(f"<li>{escape(f['op'])} node {escape(repr(f['node']))}: {_ms(f.get('median_s', 0.0))} ms "
                   f"(median; {escape(f['reason'])})</li>" for f in p.fallback)
    body = ('<div class="scroll"><table class="sortable"><thead><tr><th>step</th><th class="l">kernel</th>'
            '<th class="l">ops</th><th>median ms</th><th class="l">min–max</th><th>%</th><th>GFLOP/s</th>'
            '<th>GB/s</th><th>% roofline</th><th class="l">nodes</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')
    if fall:
        body += f"<p>Run in the interpreter (their time is in 'other'):</p><ul>{fall}</ul>"
    note = (f"{p.runs} runs on {p.nthreads} thread(s): latency median {_ms(p.latency_median_s)} ms "
            f"(min {_ms(p.latency_min_s)}, max {_ms(p.latency_max_s)}); the kernels' medians add up to "
            f"{_ms(p.kernel_sum_s)} ms ({100 * p.kernel_sum_s / max(p.latency_median_s, 1e-12):.0f}%).")
    return _section("kernels", "Kernels by time", body, note)


def _roofline(p: Profile, width: int = 760, height: int = 440) -> str:
    roof = p.roofline
    pts = [k for k in p.kernels if k.flops and k.bytes and k.median_s > 0]
    left, right, top, bottom = 64, 20, 20, 44
    pw, ph = width - left - right, height - top - bottom
    xs = [k.flops / k.bytes for k in pts] or [1.0]
    ys = [k.gflops for k in pts] or [1.0]
    x0, x1 = math.floor(math.log10(min(xs + [roof["gflops"] / roof["gbs"]]))) - 0.5, \
        math.ceil(math.log10(max(xs + [roof["gflops"] / roof["gbs"]]))) + 0.5
    y0, y1 = math.floor(math.log10(max(min(ys), 1e-3))) - 0.5, math.log10(roof["gflops"]) + 0.4

    def sx(x):
        return left + (math.log10(x) - x0) / (x1 - x0) * pw

    def sy(y):
        return top + ph - (math.log10(max(y, 10 ** y0)) - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>']
    for e in range(math.ceil(x0), math.floor(x1) + 1):
        out.append(f'<line x1="{sx(10 ** e):.1f}" y1="{top}" x2="{sx(10 ** e):.1f}" y2="{top + ph}" stroke="#e4e4e4"/>'
                   f'<text x="{sx(10 ** e):.1f}" y="{top + ph + 14}" text-anchor="middle">{10.0 ** e:g}</text>')
    for e in range(math.ceil(y0), math.floor(y1) + 1):
        out.append(f'<line x1="{left}" y1="{sy(10 ** e):.1f}" x2="{left + pw}" y2="{sy(10 ** e):.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 6}" y="{sy(10 ** e) + 4:.1f}" text-anchor="end">{10.0 ** e:g}</text>')
    # the roof: bandwidth slope up to the ridge, then the sgemm peak
    ridge = roof["gflops"] / roof["gbs"]
    a = 10 ** x0
    out.append(f'<polyline fill="none" stroke="#d62728" stroke-width="2" points="{sx(a):.1f},{sy(a * roof["gbs"]):.1f} '
               f'{sx(ridge):.1f},{sy(roof["gflops"]):.1f} {sx(10 ** x1):.1f},{sy(roof["gflops"]):.1f}"/>')
    out.append(f'<text x="{sx(ridge) + 6:.1f}" y="{sy(roof["gflops"]) - 5:.1f}" fill="#d62728">'
               f'{roof["gflops"]:.0f} GFLOP/s, {roof["gbs"]:.1f} GB/s</text>')
    for k in pts:
        r = 3 + min(8, 60 * k.median_s / max(p.kernel_sum_s, 1e-12))
        pct = f"{k.roofline_pct:.0f}%" if k.roofline_pct is not None else "-"
        out.append(f'<circle cx="{sx(k.flops / k.bytes):.1f}" cy="{sy(k.gflops):.1f}" r="{r:.1f}" '
                   f'fill="{_color(k.ops)}" fill-opacity="0.75" stroke="#333" stroke-width="0.5"><title>'
                   f'{escape(k.name)} ({escape("+".join(k.ops))}): {_ms(k.median_s)} ms, {k.gflops:.1f} GFLOP/s, '
                   f'{pct} of roofline</title></circle>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">FLOPs per byte (log)</text>'
               f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
               f'text-anchor="middle">GFLOP/s (log)</text></svg>')
    moved = len(p.kernels) - len(pts)
    return _section("roofline", "Roofline", "".join(out),
                    f"One dot per kernel with FLOPs (size by its share of the time; hover for figures). "
                    f"The roof is this machine's measured sgemm peak and copy bandwidth ({escape(roof['cpu'])}, "
                    f"{roof['threads']} thread(s)). {moved} data-movement kernel(s) have no FLOPs and are not drawn.")


def _track(items, total_s: float, label: str, width: int = 1100) -> str:
    """One horizontal track of bars (name, start s, seconds, color, tooltip) on a time axis."""
    left, h = 130, 26
    scale = (width - left - 40) / max(total_s, 1e-12)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + 30}" font-family="sans-serif" '
           f'font-size="11"><text x="0" y="{h - 8}">{escape(label)}</text>']
    for name, at, s, color, tip in items:
        w = max(s * scale, 0.5)
        out.append(f'<rect x="{left + at * scale:.2f}" y="4" width="{w:.2f}" height="{h - 6}" fill="{color}" '
                   f'stroke="#fff" stroke-width="0.3"><title>{escape(tip)}</title></rect>')
        if w > 60:
            out.append(f'<text x="{left + at * scale + 3:.2f}" y="{h - 8}" fill="#fff">{escape(name[:int(w // 7)])}'
                       '</text>')
    for i in range(6):
        t = total_s * i / 5
        out.append(f'<text x="{left + t * scale:.1f}" y="{h + 22}" text-anchor="middle">{t * 1e3:.2f} ms</text>')
    out.append("</svg>")
    return "".join(out)


def _end_to_end(seconds):
    """(start, seconds) of durations laid one after another."""
    at, out = 0.0, []
    for s in seconds:
        out.append((at, s))
        at += s
    return out


def _timeline(p: Profile, record: CompileRecord | None, trace: dict) -> str:
    order = sorted(range(len(p.latencies)), key=lambda i: p.latencies[i])
    mid = order[len(order) // 2] if order else 0
    by_step = sorted(p.kernels, key=lambda k: k.step)
    times = p.per_run[mid] if p.per_run else []
    if p.parts:  # a multi-device artifact: a track per part, from where the part started
        starts = p.part_starts[mid]
        per_part = [[(k, s) for k, s in zip(p.kernels, times) if k.part == i] for i in range(len(p.parts))]
        total = max([starts[i] + sum(s for _, s in ks) for i, ks in enumerate(per_part)] + [1e-9])
        body = ""
        for i, (part, ks) in enumerate(zip(p.parts, per_part)):
            items = [(k.name, starts[i] + at, s, _color(k.ops), f"{part['device']} {k.name} ({'+'.join(k.ops)}): "
                      f"{_ms(s)} ms") for (k, _), (at, s) in zip(ks, _end_to_end([s for _, s in ks]))]
            body += _track(items, total, f"{part['device']}: {part['name']}")
    else:
        spans = _end_to_end(times)
        items = [(k.name, at, s, _color(k.ops), f"{k.step} {k.name} ({'+'.join(k.ops)}): {_ms(s)} ms")
                 for k, (at, s) in zip(by_step, spans)]
        body = _track(items, sum(times), f"run {mid} (median)")
    for t, busy in enumerate(p.pool_runs[mid] if mid < len(p.pool_runs) and not p.parts else []):
        pitems = [(k.name, at, min(b, s), _color(k.ops), f"{k.name}: {_ms(b)} ms of {_ms(s)} ms on pool thread {t + 1}")
                  for k, (at, s), b in zip(by_step, spans, busy) if b > 0]
        body += _track(pitems, sum(times), f"pool thread {t + 1} ({100 * sum(busy) / max(sum(times), 1e-12):.0f}% busy)")
    if record is not None and record.passes:
        secs = [r.seconds for r in record.passes]
        pitems = [(r.name, at, s, "#76b7b2" if r.changed else "#cfd8dc",
                   f"{r.index} {r.name}: {r.seconds * 1e3:.2f} ms, {r.nodes_before} -> {r.nodes_after} nodes")
                  for r, (at, s) in zip(record.passes, _end_to_end(secs))]
        body += _track(pitems, sum(secs), "compile passes")
    legend = " ".join(f'<span style="color:{c}">■</span> {k}' for k, c in FAMILY_COLORS.items()
                      if k not in ("Gemm",)) + f' <span style="color:{OTHER_COLOR}">■</span> other'
    data = base64.b64encode(json.dumps(trace).encode()).decode()
    body += (f'<p class="note">{legend}</p><p><a download="trace.json" href="data:application/json;base64,{data}">'
             f"download the Chrome trace of all {p.runs} runs</a> (open it in chrome://tracing or "
             "ui.perfetto.dev)</p>")
    return _section("timeline", "Timeline", body, "The median run's kernels one after another at their measured "
                    "times on the calling thread; below it, each pool thread's share of every kernel's parallel "
                    "loops (from the kernel's start); then the compile's passes. Hover for names and times.")


def report_html(profile: Profile, record: CompileRecord | None = None, summary: dict | None = None,
                title: str | None = None, depth: int = 2) -> str:
    """The report page (see the module docstring) of ``profile``, with ``record`` (``compile(record=)``)
    and ``summary`` (``summary.summarize_graph`` of the imported model) where known."""
    title = title or profile.model
    trace = profile.chrome_trace({f"{r.index:02d} {r.name}": r.seconds for r in record.passes}
                                 if record and record.passes else None)
    nav = "".join(f'<a href="#{s}">{s.replace("-", " ")}</a>' for s in SECTIONS)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    head = (f"<header><h1>Kiln report: {escape(title)}</h1><p>Kiln {escape(__version__)}, {escape(when)}; "
            f"{escape(profile.roofline['cpu'])}, {profile.nthreads} thread(s); latency median "
            f"{_ms(profile.latency_median_s)} ms over {profile.runs} runs</p></header><nav>{nav}</nav>")
    parts = [_summary(summary, depth), _pipeline(record), _kernel_graph(record, title), _memory(record, title),
             _kernels(profile), _roofline(profile), _timeline(profile, record, trace)]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Kiln report: {escape(title)}</title>'
            f"<script>{ERROR_HOOK}</script><style>{CSS}</style></head><body>{head}{''.join(parts)}"
            f"<script>{SCRIPT % json.dumps(list(SECTIONS))}</script></body></html>")


__all__ = ["SECTIONS", "report_html"]
