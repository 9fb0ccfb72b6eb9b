"""Graphviz DOT for a graph (one box per node, edges labelled with types); SVG when `dot` exists."""
from __future__ import annotations

import shutil
import subprocess

from .graph import Graph


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: Graph, title: str | None = None) -> str:
    ids: dict[int, str] = {}
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB;", '  node [fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9];']
    if title:
        lines.append(f"  label={_q(title)}; labelloc=t;")
    for i, v in enumerate(graph.inputs):
        ids[id(v)] = f"in{i}"
        lines.append(f"  in{i} [shape=oval, style=filled, fillcolor=lightblue, label={_q(f'{v.name}: {v.type}')}];")
    for i, c in enumerate(graph.constants):
        ids[id(c)] = f"c{i}"
    for i, n in enumerate(graph.nodes):
        attrs = n.op.non_default_attributes()
        from .graph import Graph

        shown = {k: (f"<graph @{v.name}>" if isinstance(v, Graph) else v) for k, v in attrs.items()}
        detail = "\\n".join(f"{k}={v}" for k, v in list(shown.items())[:4] if not hasattr(v, "shape"))
        label = n.op.name + (f"\\n{detail}" if detail else "") + (f"\\n@{n.name}" if n.name else "")
        lines.append(f"  n{i} [shape=box, label=\"{label.replace(chr(34), chr(39))}\"];")
        for j, v in enumerate(n.outputs):
            ids[id(v)] = f"n{i}"
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is None:
                continue
            src = ids.get(id(v))
            if v.const is not None:
                label = f"{v.name or 'const'}: {v.type}"
                lines.append(f"  {src}_{i} [shape=note, fontsize=8, label={_q(label)}];")
                lines.append(f"  {src}_{i} -> n{i};")
            elif src:
                lines.append(f"  {src} -> n{i} [label={_q(str(v.type))}];")
    for k, (name, v) in enumerate(zip(graph.output_names, graph.outputs)):
        lines.append(f"  out{k} [shape=oval, style=filled, fillcolor=palegreen, label={_q(f'{name}: {v.type}')}];")
        lines.append(f"  {ids.get(id(v), 'in0')} -> out{k};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_path: str) -> str | None:
    """Render DOT to SVG beside it when Graphviz is installed; returns the SVG path or None."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    svg = dot_path[:-4] + ".svg" if dot_path.endswith(".dot") else dot_path + ".svg"
    subprocess.run([exe, "-Tsvg", dot_path, "-o", svg], check=True, capture_output=True, timeout=120)
    return svg
