"""Multi-device splitting: place a model's nodes on several devices as contiguous pipeline stages.

``SplitDevices(devices)`` runs last in the pipeline (after fusion and scheduling: its unit of work is
a kernel as it will run). For every top-level node it estimates the time on each device from the
op table's cost (``op.cost``: FLOPs and bytes; ``kiln.Kernel`` sums its members) and the device's
measured speed (``DeviceSpec.gflops``, ``gbps``), and the memory a stage holds (its constants, and
the most bytes live at once over its nodes, from ``ir/liveness.py``). Then:

1. **Balance.** The devices are stages in the order given. A binary search finds the smallest
   bottleneck time T for which a greedy walk over the schedule fits every node in some stage with
   each stage's time (its nodes, plus copying in what it reads from earlier stages) at most T and
   its memory within its device's ``memory_bytes``. A device may be left empty (a model that fits
   one device stays on it when splitting buys nothing). A node larger than every device is an
   error naming it and its memory.
2. **Cut.** Each boundary between two stages is then moved to the cheapest cut near it: nodes whose
   running time lies within ``slack`` of the boundary may go to either side, and a minimum s-t cut
   (networkx) over a flow network of those nodes chooses the side of each so that the fewest bytes
   cross, every value that crosses counted once (a value node between its producer and its users)
   and the data dependencies kept (infinite edges back from each user to its producer: no user
   before its producer). The cut is kept only if the slower of the two stages, its copy included,
   is no slower than before, and both still fit their devices: bytes matter as copy time (a slow
   link), not for themselves.
3. **Annotate.** Every node gets its stage's device (``node.device``, printed ``on "cpu:1"``); the
   nodes are reordered stage by stage (a topological order still: the cut keeps dependencies); a
   value read on another device than its own gets one ``kiln.Transfer`` node per reading device,
   placed first in that device's stage.

``stages`` (a list of ``Stage``) and ``explain()`` tell what was decided and why; ``refusals``
why nothing was split. ``cut_stages(graph)`` cuts an annotated graph at its Transfers into one graph
per device for the code generator (``compiler/multidevice.py`` builds and runs them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..errors import LimitError
from ..ir.graph import Graph, Node, Value
from ..ir.liveness import live_ranges
from ..ir.ops.base import graph_fields
from ..ir.ops.device import DEVICE_NAME, Transfer
from ..ir.ops.kernel import Kernel
from ..ir.types import TensorType
from .manager import Pass
from .options import OptionError

#: seconds a step costs beyond its arithmetic and memory traffic (a kernel call, a task start)
STEP_SECONDS = 2e-6


@dataclass(frozen=True)
class DeviceSpec:
    """A device the pass may place nodes on: its name ("cpu:0"), the bytes it may hold (constants
    plus live intermediates), its speed (f32 GEMM GFLOP/s and memory GB/s, measured), the cores it
    runs on (a CPU device; informative here) and the bandwidth of copies into it (None: ``gbps``)."""

    name: str
    memory_bytes: int
    gflops: float
    gbps: float
    cores: tuple[int, ...] = ()
    link_gbps: float | None = None

    def __post_init__(self):
        if not DEVICE_NAME.match(self.name):
            raise OptionError(f"device {self.name!r}: expected a name like 'cpu:0' or 'cuda:1'")
        if self.memory_bytes < 1 or self.gflops <= 0 or self.gbps <= 0:
            raise OptionError(f"device {self.name}: memory, GFLOP/s and GB/s must be positive")

    def seconds(self, flops: int, nbytes: int) -> float:
        """The time of a step that does ``flops`` and moves ``nbytes`` on this device (roofline)."""
        return max(flops / (self.gflops * 1e9), nbytes / (self.gbps * 1e9)) + STEP_SECONDS

    def copy_seconds(self, nbytes: int) -> float:
        return nbytes / ((self.link_gbps or self.gbps) * 1e9)


@dataclass
class Stage:
    """A device's share: its nodes (in order) and the estimates the placement used."""

    device: str
    nodes: list = field(default_factory=list)
    seconds: float = 0.0
    weight_bytes: int = 0
    peak_bytes: int = 0
    transfer_in_bytes: int = 0

    @property
    def memory_bytes(self) -> int:
        return self.weight_bytes + self.peak_bytes


def _nbytes(v: Value | None) -> int:
    if v is None or not isinstance(v.type, TensorType) or not v.type.is_static:
        return 0
    return int(v.type.nbytes or 0)


def _sent(a: list[Node], b: list[Node], m: "_Model") -> int:
    """Bytes made in ``a`` and read in ``b`` or after it: what the cut between them copies."""
    if not a or not b:
        return 0
    later = {id(n) for n in b} | {id(n) for n in m.order[m.pos[id(b[-1])] + 1:]}
    return sum(_nbytes(v) for n in a for v in n.outputs
               if any(isinstance(u, Node) and id(u) in later for u, _ in v.uses))


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _placement(graph: Graph) -> list[tuple]:
    """What the pass decides, comparable before and after: each node's op and device in order (a
    Transfer by the value it moves)."""
    return [(id(n.inputs[0]) if isinstance(n.op, Transfer) else id(n), n.device) for n in graph.nodes]


def _cost(n: Node):
    try:
        c = n.op.cost([v.type if v is not None else None for v in n.inputs], [o.type for o in n.outputs])
        return int(c.flops), int(c.bytes)
    except Exception:  # an op without a cost model: its results' bytes, no arithmetic
        return 0, sum(_nbytes(o) for o in n.outputs)


def _constants(n: Node) -> list[tuple[int, int]]:
    """(identity, bytes) of the constants ``n`` reads: its operands and its kernel body's."""
    found = [(id(v), _nbytes(v)) for v in n.inputs if v is not None and v.const is not None]
    if isinstance(n.op, Kernel):
        found += [(id(c), _nbytes(c)) for c in n.op.body.constants]  # what its body nodes read
    return found


class _Model:
    """The per-node figures of one schedule: time per device, constants, live bytes, crossing bytes."""

    def __init__(self, order: list[Node], devices: Sequence[DeviceSpec], outputs: Sequence[Value]):
        self.order = order
        self.pos = {id(n): i for i, n in enumerate(order)}
        costs = [_cost(n) for n in order]
        self.seconds = [[d.seconds(f, b) for f, b in costs] for d in devices]
        self.consts = [_constants(n) for n in order]
        # live bytes at each step (results only: inputs are the caller's, constants counted apart)
        ranges = live_ranges(order, id, outputs)
        size = {id(o): _nbytes(o) for n in order for o in n.outputs}
        delta = [0] * (len(order) + 2)
        for key, s in ranges.start.items():
            delta[s] += size.get(key, 0)
            delta[ranges.end[key] + 1] -= size.get(key, 0)
        self.live, acc = [], 0
        for i in range(len(order)):
            acc += delta[i]
            self.live.append(acc)
        # bytes made before step i and read at i or later: what a stage starting at i copies in
        self.crossing = [0] * (len(order) + 1)
        cdelta = [0] * (len(order) + 2)
        for key, s in ranges.start.items():
            e = min(ranges.end[key], len(order) - 1)
            if e > s:  # read after the step that makes it
                cdelta[s + 1] += size.get(key, 0)
                cdelta[e + 1] -= size.get(key, 0)
        acc = 0
        for i in range(len(order) + 1):
            acc += cdelta[i]
            self.crossing[i] = acc

    def node_memory(self, i: int) -> int:
        return sum(b for _, b in self.consts[i]) + self.live[i]


class SplitDevices(Pass):
    """Place the nodes on ``devices`` as pipeline stages (see the module docstring)."""

    name = "split-devices"
    requires = ("topological order", "fused kernels")
    preserves = ("topological order", "fused kernels")

    def __init__(self, devices: Sequence[DeviceSpec], slack: float = 0.1):
        if len(devices) < 2:
            raise OptionError("split-devices needs at least two devices")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise OptionError(f"a device is named twice in {', '.join(names)}")
        self.devices = list(devices)
        self.slack = slack
        self.stages: list[Stage] = []
        self.refusals: list[str] = []
        self.bottleneck_seconds = 0.0
        self.single_device_seconds = 0.0
        self.cut_bytes: list[int] = []
        #: per boundary: where balance put it, where the min-cut would, and which was kept and why
        self.cuts: list[dict] = []

    # -- the pass -----------------------------------------------------------------------------
    def run(self, graph: Graph) -> bool:
        before = _placement(graph)
        for n in list(graph.nodes):  # placed before: place again from the plain graph
            if isinstance(n.op, Transfer):
                n.output.replace_all_uses_with(n.inputs[0])
                graph.remove(n)
        self._place(graph)
        return _placement(graph) != before

    def _place(self, graph: Graph) -> None:
        order = list(graph.nodes)
        self.stages, self.refusals, self.cut_bytes, self.cuts = [], [], [], []
        captured = next((n for n in order if not isinstance(n.op, Kernel) and graph_fields(type(n.op))), None)
        if captured is not None:
            self.refusals.append(f"{captured.describe()} holds a subgraph (control flow) whose body may read "
                                 f"values of the outer graph: the model stays on {self.devices[0].name}")
        if not order or captured is not None:
            for n in order:
                n.device = self.devices[0].name
            self.stages = [Stage(self.devices[0].name, order)]
            return
        model = _Model(order, self.devices, graph.outputs)
        starts = self._balance(model)
        self._annotate(graph, self._refine_cuts(model, starts))

    # -- 1. balance ---------------------------------------------------------------------------
    def _greedy(self, m: _Model, limit: float):
        """Stage start positions (one per device; a device left empty starts where the next does)
        with every stage within ``limit`` seconds and its device's memory; None when none fit."""
        n, starts, j = len(m.order), [0], 0
        t = mem = peak = 0
        consts: set = set()
        i = 0
        while i < n:
            d = self.devices[j]
            add_t = m.seconds[j][i]
            new = [(k, b) for k, b in m.consts[i] if k not in consts]
            add_w = sum(b for _, b in new)
            new_peak = max(peak, m.live[i])
            if t + add_t <= limit and mem + add_w + new_peak <= d.memory_bytes:
                t, mem, peak = t + add_t, mem + add_w, new_peak
                consts.update(k for k, _ in new)
                i += 1
                continue
            j += 1  # this node starts the next device's stage
            if j == len(self.devices):
                return None
            starts.append(i)
            t = self.devices[j].copy_seconds(m.crossing[i]) if i > 0 else 0.0
            mem = peak = 0
            consts = set()
        while len(starts) < len(self.devices):
            starts.append(n)
        return starts

    def _balance(self, m: _Model) -> list[int]:
        n = len(m.order)
        for i in range(n):
            need = m.node_memory(i)
            if all(need > d.memory_bytes for d in self.devices):
                node = m.order[i]
                raise LimitError(f"{node.describe()} needs {_size(need)} (its constants and the values live "
                                 f"while it runs), more than any device holds (the largest: "
                                 f"{_size(max(d.memory_bytes for d in self.devices))}): give a device more memory "
                                 f"(--device-memory)")
        lo = max(min(m.seconds[j][i] for j in range(len(self.devices))) for i in range(n))
        hi = max(sum(m.seconds[j]) for j in range(len(self.devices))) * 2 + 1.0
        self.single_device_seconds = min(sum(s) for s in m.seconds)
        if self._greedy(m, hi) is None:
            have = ", ".join(f"{d.name}: {_size(d.memory_bytes)}" for d in self.devices)
            weights = sum({k: b for c in m.consts for k, b in c}.values())
            raise LimitError(f"the model does not fit the devices' memory ({have}): its constants alone take "
                             f"{_size(weights)}, and each stage also holds the values live in it")
        for _ in range(60):
            mid = (lo + hi) / 2
            if self._greedy(m, mid) is None:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-3 * hi:
                break
        self.bottleneck_seconds = hi
        return self._greedy(m, hi)

    # -- 2. cut -------------------------------------------------------------------------------
    def _refine_cuts(self, m: _Model, starts: list[int]) -> list[list[Node]]:
        """The stages' nodes, each boundary moved to the min-byte cut within the slack."""
        order = m.order
        groups = [order[starts[j]:(starts[j + 1] if j + 1 < len(starts) else len(order))]
                  for j in range(len(starts))]
        for j in range(len(groups) - 1):
            a, b = groups[j], groups[j + 1]
            if not a or not b:
                continue
            cut = self._min_cut(a, b, m, j)
            # fewer bytes is only a means: keep the cut if the slower of the two stages (the copy
            # included) is no slower than before and both still fit their devices
            old, new = self._pair(a, b, m, j), self._pair(*cut, m, j)
            kept = new is not None and (old is None or new <= old)
            record = {"devices": (self.devices[j].name, self.devices[j + 1].name),
                      "balanced_after": a[-1].name or a[-1].describe(), "balanced_bytes": _sent(a, b, m),
                      "balanced_ms": None if old is None else old * 1e3,
                      "min_cut_after": cut[0][-1].name or cut[0][-1].describe() if cut[0] else None,
                      "min_cut_bytes": _sent(*cut, m), "min_cut_ms": None if new is None else new * 1e3}
            if [id(n) for n in cut[0]] == [id(n) for n in a]:
                record["why"] = "the balanced cut is already the cheapest within the slack"
            elif kept:
                record["why"] = "the min-byte cut is no slower (its copy saved at least the imbalance it adds)"
            else:
                record["why"] = ("the min-byte cut would overflow a device" if new is None else
                                 "the min-byte cut would make the slower stage slower: kept the balanced one")
            self.cuts.append(record)
            if kept:
                groups[j], groups[j + 1] = cut
        return groups

    def _pair(self, a: list[Node], b: list[Node], m: _Model, j: int) -> float | None:
        """The time of the slower of stages ``a`` (device j) and ``b`` (device j+1, with its copy of
        what ``a`` sends it); None when either is over its device's memory."""
        if not a or not b:
            return None
        sent = _sent(a, b, m)
        times, (da, db) = [], self.devices[j:j + 2]
        for nodes, k, dev in ((a, j, da), (b, j + 1, db)):
            consts: dict = {}
            for n in nodes:
                consts.update(m.consts[m.pos[id(n)]])
            if sum(consts.values()) + max(m.live[m.pos[id(n)]] for n in nodes) > dev.memory_bytes:
                return None
            times.append(sum(m.seconds[k][m.pos[id(n)]] for n in nodes))
        return max(times[0], times[1] + db.copy_seconds(sent))

    def _min_cut(self, a: list[Node], b: list[Node], m: _Model, j: int) -> tuple[list[Node], list[Node]]:
        import networkx as nx

        span = a + b
        t = [m.seconds[j][m.pos[id(n)]] for n in span]
        total = sum(t)
        boundary = sum(t[:len(a)])
        window, run = set(), 0.0
        for n, s in zip(span, t):
            mid = run + s / 2
            if abs(mid - boundary) <= self.slack * total:
                window.add(id(n))
            run += s
        if not window:
            return a, b
        in_a = {id(n) for n in a}

        def side(n) -> str | int:
            if id(n) in window:
                return id(n)
            if m.pos.get(id(n), len(m.order)) < m.pos[id(span[0])] or id(n) in in_a:
                return "S"
            return "T"

        g = nx.DiGraph()
        g.add_nodes_from(["S", "T"])
        inf = float("inf")
        for n in span:
            if id(n) not in window:
                continue
            for v in n.inputs:  # the producer must come first: a user on the S side pulls it there
                if v is not None and v.producer is not None and id(v.producer) in m.pos:
                    p = side(v.producer)
                    if p != id(n):
                        g.add_edge(id(n), p, capacity=inf)
        for n in span:  # values made in the span, or before it and read in the window
            for v in n.outputs:
                users = [u for u, _ in v.uses if isinstance(u, Node)]
                if not users or not _nbytes(v):
                    continue
                sides = {side(u) for u in users}
                src = side(n)
                if sides == {src}:
                    continue
                vn = ("value", id(v))
                g.add_edge(src, vn, capacity=_nbytes(v))
                for s in sides:
                    if s != src:
                        g.add_edge(vn, s, capacity=inf)
        _, (reach, _) = nx.minimum_cut(g, "S", "T")

        def goes_first(n) -> bool:
            if id(n) not in window:
                return side(n) == "S"
            return id(n) in reach if id(n) in g else id(n) in in_a  # a node no value ties stays put

        return [n for n in span if goes_first(n)], [n for n in span if not goes_first(n)]

    # -- 3. annotate --------------------------------------------------------------------------
    def _annotate(self, graph: Graph, groups: list[list[Node]]) -> None:
        device_of: dict[int, str] = {}
        new_order: list[Node] = []
        for d, nodes in zip(self.devices, groups):
            for n in nodes:
                n.device = device_of[id(n)] = d.name
            new_order += nodes
        if [id(n) for n in new_order] != [id(n) for n in graph.nodes]:
            graph.reorder(new_order)
        first_of = {d.name: nodes[0] for d, nodes in zip(self.devices, groups) if nodes}
        for n in new_order:
            for v in n.outputs:
                readers: dict[str, list] = {}
                for user, i in list(v.uses):
                    if isinstance(user, Node) and device_of.get(id(user)) not in (None, n.device):
                        readers.setdefault(device_of[id(user)], []).append((user, i))
                for dev, uses in readers.items():
                    t = graph.add_node(Transfer(source=n.device, target=dev), [v], before=first_of[dev])
                    t.device = dev
                    for user, i in uses:
                        user.set_input(i, t.output)
        self._record(graph)

    def _record(self, graph: Graph) -> None:
        model = _Model(list(graph.nodes), self.devices, graph.outputs)
        self.stages = []
        for j, d in enumerate(self.devices):
            nodes = [n for n in graph.nodes if n.device == d.name]
            if not nodes:
                continue
            idx = [model.pos[id(n)] for n in nodes]
            seen: dict = {}
            for i in idx:
                seen.update(model.consts[i])
            into = sum(_nbytes(n.inputs[0]) for n in nodes if isinstance(n.op, Transfer))
            work = sum(model.seconds[j][i] for i, n in zip(idx, nodes) if not isinstance(n.op, Transfer))
            self.stages.append(Stage(d.name, nodes, work + d.copy_seconds(into), sum(seen.values()),
                                     max(model.live[i] for i in idx), into))
        self.cut_bytes = [s.transfer_in_bytes for s in self.stages[1:]]
        self.bottleneck_seconds = max(s.seconds for s in self.stages)  # after the cuts moved

    def explain(self) -> str:
        """What was placed where, with the estimates, as the dumps and ``kiln compile`` print it."""
        if self.refusals:
            return "split-devices: " + "; ".join(self.refusals)
        lines = [f"split-devices: {len(self.stages)} stage(s) on {len(self.devices)} device(s); estimated "
                 f"bottleneck {self.bottleneck_seconds * 1e3:.3f} ms per item against "
                 f"{self.single_device_seconds * 1e3:.3f} ms on one device"]
        for s in self.stages:
            lines.append(f"  {s.device}: {len(s.nodes)} node(s), ~{s.seconds * 1e3:.3f} ms, constants "
                         f"{_size(s.weight_bytes)}, live at most {_size(s.peak_bytes)}, copies in "
                         f"{_size(s.transfer_in_bytes)}")
        return "\n".join(lines)

    def explain_cuts(self) -> str:
        """Why each boundary is where it is (``kiln dump --explain-placement``)."""
        if not self.cuts:
            return "split-devices: no boundary to place" + (f" ({'; '.join(self.refusals)})" if self.refusals else "")
        lines = []
        for c in self.cuts:
            a, b = c["devices"]

            def ms(x):
                return "over memory" if x is None else f"{x:.3f} ms"

            lines.append(f"{a} | {b}: balanced after {c['balanced_after']} ({_size(c['balanced_bytes'])} copied, "
                         f"slower stage {ms(c['balanced_ms'])}); min-byte cut after {c['min_cut_after']} "
                         f"({_size(c['min_cut_bytes'])}, {ms(c['min_cut_ms'])}): {c['why']}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Cutting an annotated graph into one graph per device
# ---------------------------------------------------------------------------------------------

@dataclass
class StageGraph:
    """One device's program: ``graph`` reads the model inputs it needs and the wires coming in
    (inputs named as the wires), and returns the model outputs it makes and the wires going out."""

    device: str
    graph: Graph
    wires_in: list[str]
    wires_out: list[str]


def cut_stages(graph: Graph) -> list[StageGraph]:
    """One ``StageGraph`` per device of an annotated graph (``SplitDevices``), in stage order. A wire
    is a value one device makes and another reads through a Transfer, named ``wire<k>``."""
    devices: list[str] = []
    for n in graph.nodes:
        if n.device is None:
            raise OptionError(f"{n.describe()} has no device: run split-devices first")
        if n.device not in devices:
            devices.append(n.device)
    wire: dict[int, str] = {}
    for n in graph.nodes:
        if isinstance(n.op, Transfer) and id(n.inputs[0]) not in wire:
            wire[id(n.inputs[0])] = f"wire{len(wire)}"
    out_pos = {}
    for name, v in zip(graph.output_names, graph.outputs):
        out_pos.setdefault(id(v), []).append(name)
    stages = []
    for dev in devices:
        g = Graph(f"{graph.name}@{dev}")
        where: dict[int, Value] = {}
        wires_in, wires_out, outs, names = [], [], [], []

        def of(v: Value | None) -> Value | None:
            if v is None:
                return None
            if id(v) not in where:
                if v.const is not None:
                    c = Value(v.type, name=v.name, const=v.const)
                    c.known = v.known
                    g.constants.append(c)
                    where[id(v)] = c
                elif v.producer is None:  # a model input
                    where[id(v)] = g.add_input(v.name, v.type)
                else:
                    raise OptionError(f"{v.producer.describe()} on {v.producer.device} is read on {dev} without "
                                      f"a Transfer")
            return where[id(v)]

        for n in graph.nodes:
            if n.device != dev:
                continue
            if isinstance(n.op, Transfer):
                name = wire[id(n.inputs[0])]
                where[id(n.output)] = g.add_input(name, n.output.type)
                wires_in.append(name)
                continue
            copy = Node(n.op, [of(v) for v in n.inputs], [o.type for o in n.outputs], name=n.name, device=dev)
            g.insert(copy)
            for a, b in zip(n.outputs, copy.outputs):
                b.name, b.known = a.name, a.known
                where[id(a)] = b
                if id(a) in wire and any(isinstance(u, Node) and isinstance(u.op, Transfer) for u, _ in a.uses):
                    wires_out.append(wire[id(a)])
                    outs.append(b)
                    names.append(wire[id(a)])
                for name in out_pos.get(id(a), ()):
                    outs.append(b)
                    names.append(name)
        g.set_outputs(outs, names)
        stages.append(StageGraph(dev, g, wires_in, wires_out))
    return stages


__all__ = ["DeviceSpec", "SplitDevices", "Stage", "StageGraph", "cut_stages"]
