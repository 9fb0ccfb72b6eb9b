"""The partition picture: a graph placed by ``split-devices`` drawn as SVG (``kiln dump --partition``).

One lane per device, a box per node in schedule order (top to bottom), colored by device: a fused
kernel shows its members, a Transfer its bytes. Data edges inside a device are thin lines; a value
crossing devices is a thick arrow into the Transfer that carries it, labelled with its size. Plain
SVG, no fonts or scripts to fetch.
"""
from __future__ import annotations

from html import escape

from ..ir.graph import Graph, Node
from ..ir.ops.device import Transfer
from ..ir.ops.kernel import Kernel
from ..ir.types import TensorType

COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"]
BOX_W, BOX_H, ROW, LANE, TOP, LEFT = 230, 22, 30, 280, 50, 20


def _label(n: Node) -> str:
    if isinstance(n.op, Kernel):
        ops = n.op.members()
        text = "+".join(ops[:3]) + ("+..." if len(ops) > 3 else "")
    elif isinstance(n.op, Transfer):
        t = n.outputs[0].type
        size = t.nbytes if isinstance(t, TensorType) and t.is_static else 0
        text = f"Transfer {_size(size or 0)}"
    else:
        text = n.op.name
    return text if len(text) <= 34 else text[:33] + "…"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def partition_svg(graph: Graph, title: str = "", lane: str = "?") -> str:
    """The SVG of ``graph`` (annotated by split-devices: every node has a device; a node without one
    is drawn in the lane named ``lane``: the report's kernel graph of a one-device compile)."""
    devices: list[str] = []
    for n in graph.nodes:
        if (n.device or lane) not in devices:
            devices.append(n.device or lane)
    lanes = {d: i for i, d in enumerate(devices)}
    pos = {}
    for i, n in enumerate(graph.nodes):
        x = LEFT + lanes[n.device or lane] * LANE
        pos[id(n)] = (x, TOP + i * ROW)
    width = LEFT * 2 + LANE * len(devices)
    height = TOP + ROW * len(graph.nodes) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#d62728"/></marker></defs>',
           f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>']
    for d, i in lanes.items():
        out.append(f'<text x="{LEFT + i * LANE}" y="38" font-weight="bold" fill="{COLORS[i % len(COLORS)]}">'
                   f'{escape(d)}</text>')
    for n in graph.nodes:  # edges first, under the boxes
        x1, y1 = pos[id(n)]
        for v in n.inputs:
            if v is None or v.producer is None or id(v.producer) not in pos:
                continue
            x0, y0 = pos[id(v.producer)]
            if isinstance(n.op, Transfer):
                t = v.type
                size = t.nbytes if isinstance(t, TensorType) and t.is_static else 0
                out.append(f'<line x1="{x0 + BOX_W / 2}" y1="{y0 + BOX_H}" x2="{x1 + BOX_W / 2}" y2="{y1}" '
                           f'stroke="#d62728" stroke-width="2.5" marker-end="url(#arrow)"/>')
                out.append(f'<text x="{(x0 + x1) / 2 + BOX_W / 2 + 6}" y="{(y0 + BOX_H + y1) / 2}" fill="#d62728">'
                           f'{_size(size or 0)}</text>')
            else:
                out.append(f'<path d="M{x0 + BOX_W / 2},{y0 + BOX_H} C{x0 + BOX_W / 2},{y1 - 8} '
                           f'{x1 + BOX_W / 2},{y0 + BOX_H + 8} {x1 + BOX_W / 2},{y1}" fill="none" '
                           f'stroke="#999" stroke-width="0.8"/>')
    for n in graph.nodes:
        x, y = pos[id(n)]
        color = COLORS[lanes[n.device or lane] % len(COLORS)]
        transfer = isinstance(n.op, Transfer)
        fill = "#fff" if transfer else color
        stroke = "#d62728" if transfer else color
        text = "#d62728" if transfer else "#fff"
        tip = escape(n.describe())
        out.append(f'<g><title>{tip}</title><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'
                   f'<text x="{x + 6}" y="{y + 15}" fill="{text}">{escape(_label(n))}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = ["partition_svg"]
