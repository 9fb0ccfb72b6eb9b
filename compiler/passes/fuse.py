"""Operator fusion: groups of nodes become one ``kiln.Kernel`` node each (a node holding the ops one
native kernel computes; ``compiler/ir/ops/kernel.py``).

Rules, in order of each group's first node (``plan_fusion``):

* **attention**: MatMul, an elementwise chain (scale, additive or boolean ``Where`` mask), Softmax
  on the last axis and a second MatMul, with the Transposes computing the MatMuls' operands and the
  one after the second (``_attention``);
* **shuffle**: a Transpose and the Reshape after it, read by a depthwise Conv only (``_shuffle``);
* **qdepthwise**: a DequantizeLinear read by a depthwise Conv only, the conv, and the elementwise
  chain after it up to a QuantizeLinear (``_dequantized_depthwise``: static int8 leaves depthwise
  convolutions in float32 but reads and writes their tensors as bytes);
* **epilogue**: a GEMM or convolution (pattern out-elementwise-fusable) takes the chain of
  elementwise ops after it: bias, folded BatchNorm scale/shift, activation, residual add;
* **requantize**: an integer product (ConvInteger, MatMulInteger: int32 sums) takes the chain after
  it the same way, and may end it in a QuantizeLinear (an int8 layer's rescale, activation and the
  next layer's quantization); a block: formed where the backend's ``check`` accepts it, else the
  chain is a kernel of its own;
* **elementwise**: a chain of elementwise/broadcast ops becomes one loop; when nothing continues it,
  it ends in the row reduction that reads its result, if any (kind **reduction**: LayerNorm,
  Softmax, global pooling, Reduce* over trailing axes), or in the 1x1 convolution reading it (kind
  **prologue**: computed as the conv's GEMM packs its input), which then takes its epilogue.

What can run as one kernel is the backend's to say, and the backend hands it to the pass as a
``FusionCapabilities`` (the pass never imports a backend): which elementwise ops have fused loop
code (``fusable``), and whether a block (attention, shuffle, reduction, prologue) can run as one
kernel (``check``: the CPU lowerings' ``check``, in ``compiler.codegen.fusion.CPU_FUSION``). A block
is formed only where ``check`` says so, else the reason joins the refusals. Without capabilities
(``NO_FUSION``, the default) the pass fuses nothing.

A chain grows from its last node ``cur`` to the first user of ``cur``'s result that is a fusable
elementwise op producing the same shape (side operands may broadcast into it). Other users of
``cur``'s result are outside the group: the value becomes one more result of the kernel (a
multi-output kernel). A consumer is refused when it would create a cycle (one of its other
operands is computed from the group's results outside the group), when it is not fusable (its
pattern, or the backend has no loop for it), when it broadcasts the chain to a larger shape, or at
the size limit. ``plan_fusion`` returns, for every pair of adjacent nodes, whether they were fused
and why (``kiln dump --explain-fusion`` prints it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ir.graph import Graph, Node, Value
from ..ir.ops.base import Pattern
from ..ir.ops import conv as cv
from ..ir.ops import linalg as la
from ..ir.ops import norm as nm
from ..ir.ops import quant as qn
from ..ir.ops import shape as sh
from ..ir.ops import tensor as tn
from ..ir.ops.kernel import Kernel
from ..ir.types import DType, TensorType
from .manager import Pass


@dataclass
class Decision:
    """Whether ``consumer`` joined ``producer``'s kernel, and why (or why not)."""

    producer: Node
    consumer: Node
    fused: bool
    reason: str

    def text(self, names: dict[int, str] | None = None) -> str:
        def d(n):
            return (names or {}).get(id(n), n.describe())
        verdict = "fused" if self.fused else "not fused"
        return f"{d(self.producer)} -> {d(self.consumer)}: {verdict}: {self.reason}"


@dataclass
class FusionGroup:
    nodes: list[Node]
    kind: str


def is_anchor(node: Node) -> bool:
    """Whether ``node`` can take an epilogue: a GEMM or convolution (out-elementwise-fusable) with one
    static float32 result."""
    out = node.outputs[0] if node.outputs else None
    return (node.op.pattern is Pattern.OUT_ELEMWISE_FUSABLE and len(node.outputs) == 1 and out is not None
            and isinstance(out.type, TensorType) and out.type.dtype is DType.f32 and out.type.is_static)


class _Contracted:
    """The graph with the groups planned so far contracted to one node each, and a topological order
    of that graph (``pos``), kept valid as groups are added (Pearce and Kelly's dynamic topological
    order: contracting a group moves only the nodes between its first and last member that must
    follow it). Whether a node joining a group would close a cycle is then a backward search that
    stops at positions before the group's first member.

    Each group must be checked in the contracted graph, not the original one: two groups can each be
    free of cycles alone and still need each other's results (A = {a1, a2}, B = {b1, b2} with
    a1 -> b2 and b1 -> a2), and a group joins the ends of paths through it (a path leaving a planned
    group's early member and one entering its late member meet there). Nodes are keyed by ``id``; a
    group by the ``id`` of its last member."""

    def __init__(self, graph: Graph):
        self.pos = {id(n): i for i, n in enumerate(graph.nodes)}
        self.node = {id(n): n for n in graph.nodes}
        self.group: dict[int, int] = {}               # id(grouped node) -> its group's key
        self.members: dict[int, list[Node]] = {}      # group key -> its nodes

    def key(self, n: Node) -> int | None:
        k = id(n)
        return self.group.get(k, k) if k in self.pos else None

    def _nodes(self, k: int) -> list[Node]:
        return self.members.get(k) or [self.node[k]]

    def preds(self, k: int):
        for m in self._nodes(k):
            for v in m.inputs:
                if v is not None and v.producer is not None:
                    p = self.key(v.producer)
                    if p is not None and p != k:
                        yield p

    def succs(self, k: int):
        for m in self._nodes(k):
            for v in m.outputs:
                for u, _ in v.uses:
                    if isinstance(u, Node):
                        s = self.key(u)
                        if s is not None and s != k:
                            yield s

    def reaches(self, sources: set[int], target: Node) -> bool:
        """Whether ``target`` is computed (transitively, through planned groups too) from a node in
        ``sources`` (ids of nodes not in any group)."""
        lo = min(self.pos[s] for s in sources)
        start = self.key(target)
        if start is None or self.pos[start] < lo:
            return False
        stack, seen = [start], {start}
        while stack:
            k = stack.pop()
            for p in self.preds(k):
                if p in seen or self.pos[p] < lo:
                    continue
                if p in sources:
                    return True
                seen.add(p)
                stack.append(p)
        return False

    def contract(self, nodes: list[Node]) -> bool:
        """Make ``nodes`` (none in a group yet) one node of the contracted graph, at the position of
        the last of them, and move what must now follow it; False (and nothing changed) when that
        would close a cycle."""
        pos = self.pos
        k = max((id(n) for n in nodes), key=pos.__getitem__)
        hi = pos[k]
        for n in nodes:
            self.group[id(n)] = k
        self.members[k] = list(nodes)
        late = {s for s in self.succs(k) if pos[s] < hi}  # users now placed before the group
        if not late:
            return True
        lb = min(pos[s] for s in late)
        forward, stack = set(late), list(late)
        while stack:
            x = stack.pop()
            for s in self.succs(x):
                if s == k:  # a path from the group back into it
                    for n in nodes:
                        del self.group[id(n)]
                    del self.members[k]
                    return False
                if s not in forward and pos[s] < hi:
                    forward.add(s)
                    stack.append(s)
        backward, stack = {k}, [k]
        while stack:
            x = stack.pop()
            for p in self.preds(x):
                if p not in backward and pos[p] > lb:
                    backward.add(p)
                    stack.append(p)
        slots = sorted(pos[x] for x in forward | backward)
        for x, p in zip(sorted(backward, key=pos.__getitem__) + sorted(forward, key=pos.__getitem__), slots):
            pos[x] = p
        return True


def _nothing_fuses(node: Node) -> bool:
    return False


def _no_backend(kind: str, nodes: list[Node]) -> str | None:
    return "no backend capabilities were given to the pass"


@dataclass(frozen=True)
class FusionCapabilities:
    """What a backend can run as one kernel, handed by the backend to ``fuse`` and ``sink-reshapes``
    (the CPU backend's: ``compiler.codegen.fusion.CPU_FUSION``, which the driver and ``kiln dump``
    pass to ``pipeline``).

    ``fusable(node)``: whether the backend computes the elementwise op ``node`` (with its operand
    types) in a fused loop. ``check(kind, nodes)``: why the backend cannot run ``nodes`` as one kernel
    of block ``kind`` (attention, reduction, shuffle, prologue, requantize), or None when it can. ``blocks``: the
    block rules that are on. The default fuses nothing (``NO_FUSION``)."""

    fusable: Callable[[Node], bool] = _nothing_fuses
    check: Callable[[str, list[Node]], str | None] = _no_backend
    blocks: frozenset = frozenset()


#: a pipeline built without a backend: every node stays its own kernel
NO_FUSION = FusionCapabilities()


def _only_user(v: Value) -> Node | None:
    """The one node reading ``v`` (once), when ``v`` is read by nothing else (not a graph output)."""
    use = v.uses.single()
    return use[0] if use is not None and isinstance(use[0], Node) else None


#: the data movements an attention block reads its operands through (as offsets and strides)
_ATTENTION_VIEWS = (sh.Transpose, sh.Reshape, tn.Tile, tn.Expand)


def _attention(mm1: Node, fusable, taken: set[int], max_ops: int,
               check: Callable[[str, list[Node]], str | None]) -> tuple[list[Node] | None, Node | None, str | None]:
    """(the nodes of an attention block whose first MatMul is ``mm1``, its Softmax, why it does not fuse)."""
    if not isinstance(mm1.op, la.MatMul):
        return None, None, None
    chain, cur = [], mm1
    while True:  # the scores, through an elementwise chain, to a Softmax
        u = _only_user(cur.outputs[0])
        if u is None or id(u) in taken:
            return None, None, None
        if type(u.op) is nm.Softmax:
            break
        # an elementwise op the backend does not fuse elsewhere (a mask's Where on a bool condition)
        # stays in the walk: the backend's check says whether its attention kernel takes it, and why not
        elementwise = fusable(u) or (u.op.pattern <= Pattern.BROADCAST and len(u.outputs) == 1)
        if not elementwise or _quantizes(u) or tuple(u.outputs[0].shape) != tuple(cur.outputs[0].shape):
            return None, None, None
        chain.append(u)
        cur = u
    sm = u
    mm2 = _only_user(sm.outputs[0])
    if mm2 is None or not isinstance(mm2.op, la.MatMul) or mm2.inputs[0] is not sm.outputs[0] or id(mm2) in taken:
        return None, None, None

    def view(v: Value | None) -> list[Node]:
        """The data movements computing an operand for this MatMul alone, source first: a Transpose
        (the head split), or a chain of Transposes, Reshapes, Tiles and Expands ending in one (grouped
        query attention's repeated key/value heads), each result read by the next only."""
        found: list[Node] = []
        while v is not None and v.producer is not None and type(v.producer.op) in _ATTENTION_VIEWS and \
                _only_user(v) is not None and id(v.producer) not in taken and \
                all(w.const is not None for w in v.producer.inputs[1:] if w is not None):
            found.insert(0, v.producer)
            v = v.producer.inputs[0]
        if not any(isinstance(n.op, (tn.Tile, tn.Expand)) for n in found):
            # nothing repeated: the last Transpose alone (the Reshapes before it are free views)
            return found[-1:] if found and isinstance(found[-1].op, sh.Transpose) else []
        return found
    members = view(mm1.inputs[0]) + view(mm1.inputs[1]) + [mm1] + chain + [sm] + view(mm2.inputs[1]) + [mm2]
    after = _only_user(mm2.outputs[0])
    if after is not None and isinstance(after.op, sh.Transpose) and id(after) not in taken:
        members.append(after)
    if len(members) > max_ops:
        return None, sm, f"an attention block of {len(members)} ops is over max_fused_ops={max_ops}"
    why = check("attention", members)
    if why is not None and members[-1] is after:  # the head merge may be what it cannot take
        members.pop()
        why = check("attention", members)
    return (None if why else members), sm, why


def _shuffle(t: Node, fusable, taken: set[int], check) -> tuple[list[Node] | None, str | None]:
    """(a Transpose, the Reshape after it and the depthwise Conv reading that: a channel shuffle the
    conv reads in place; or None, why not)."""
    if not isinstance(t.op, sh.Transpose):
        return None, None
    r = _only_user(t.outputs[0])
    conv = _only_user(r.outputs[0]) if r is not None and isinstance(r.op, sh.Reshape) else None
    if conv is None or not isinstance(conv.op, cv.Conv) or conv.inputs[0] is not r.outputs[0] or \
            any(id(n) in taken for n in (r, conv)):
        return None, None
    if any(fusable(u) for u in conv.outputs[0].users):
        return None, "the convolution's result has an elementwise chain (its epilogue)"
    why = check("shuffle", [t, r, conv])
    return (None if why else [t, r, conv]), why


def _dequantized_depthwise(d: Node, fusable, taken: set[int], max_ops: int,
                           check) -> tuple[list[Node] | None, str | None]:
    """(a DequantizeLinear, the depthwise Conv reading it alone, the elementwise chain after the
    conv, each result read by the next alone, up to a QuantizeLinear ending it: a depthwise
    convolution computed in float32 between 8-bit tensors; or None, why not). A chain the backend
    refuses is shortened until it accepts it (then ``why`` says why the first op left out was)."""
    if not isinstance(d.op, qn.DequantizeLinear) or id(d) in taken or not fusable(d):
        return None, None
    conv = _only_user(d.outputs[0])
    if conv is None or not isinstance(conv.op, cv.Conv) or conv.inputs[0] is not d.outputs[0] or \
            id(conv) in taken or int(conv.op.group) == 1 or not is_anchor(conv):
        return None, None
    members, cur = [d, conv], conv
    while len(members) < max_ops and not isinstance(cur.op, qn.QuantizeLinear):
        u = _only_user(cur.outputs[0])
        if u is None or id(u) in taken or not fusable(u) or isinstance(u.op, qn.DequantizeLinear) or \
                tuple(u.outputs[0].shape) != tuple(cur.outputs[0].shape):
            break
        members.append(u)
        cur = u
    why = first = check("qdepthwise", members)
    while why is not None and len(members) > 2:
        members.pop()
        why = check("qdepthwise", members)
    return (None, why) if why else (members, first)


def plan_fusion(graph: Graph, max_ops: int = 32,
                capabilities: FusionCapabilities = NO_FUSION) -> tuple[list[FusionGroup], list[Decision]]:
    """The groups to fuse (two nodes or more) and a decision for every adjacent pair, given what the
    backend can run as one kernel."""
    fusable = capabilities.fusable
    order = _Contracted(graph)
    taken: set[int] = set()
    groups: list[FusionGroup] = []
    decisions: list[Decision] = []
    refused: dict[int, str] = {}  # id(Softmax) -> why its attention block was not fused
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    for start in graph.nodes:
        if id(start) in taken:
            continue
        members, sm, why = _attention(start, fusable, taken, max_ops, capabilities.check) \
            if "attention" in capabilities.blocks else (None, None, None)
        if members and not order.contract(members):
            members, why = None, "cycle: the block needs a result computed from its own results outside it"
        if members:
            groups.append(FusionGroup(members, "attention"))
            taken |= {id(n) for n in members}
            continue
        if why:
            refused[id(sm)] = f"not as attention: {why}"
        members, why = _shuffle(start, fusable, taken, capabilities.check) if "shuffle" in capabilities.blocks \
            else (None, None)
        if members and len(members) <= max_ops and not order.contract(members):
            members, why = None, "cycle: the block needs a result computed from its own results outside it"
        if members and len(members) <= max_ops:
            groups.append(FusionGroup(members, "shuffle"))
            taken |= {id(n) for n in members}
            continue
        if why:
            refused[id(start)] = f"not as a channel shuffle the convolution reads in place: {why}"
        members, why = _dequantized_depthwise(start, fusable, taken, max_ops, capabilities.check) \
            if "qdepthwise" in capabilities.blocks else (None, None)
        if members and order.contract(members):
            groups.append(FusionGroup(members, "qdepthwise"))
            taken |= {id(n) for n in members}
            if why and (nxt := _only_user(members[-1].outputs[0])) is not None:
                decisions.append(Decision(members[-1], nxt, False, f"not in the depthwise kernel: {why}"))
            continue
        if why:
            refused[id(start)] = f"not as a depthwise convolution between 8-bit tensors: {why}"
        if _left_for_later(start, position):
            continue
        if is_anchor(start):
            kind = "epilogue"
        elif "requantize" in capabilities.blocks and _integer_product(start):
            kind = "requantize"
        elif fusable(start):
            kind = "elementwise"
        else:
            for v in start.outputs:
                for u in v.users:
                    decisions.append(Decision(start, u, False, f"{start.op.name} does not fuse with what follows "
                                                               f"(pattern {start.op.pattern.name.lower()})"))
            continue
        members = [start]
        ids = {id(start)}
        cur = start
        first_decision = len(decisions)
        while True:
            out = cur.outputs[0]
            users = [u for u in out.users if id(u) not in ids]
            if not users or (kind == "requantize" and _quantizes(cur)):
                break
            nxt = None
            closers: list[tuple[Node, str, str]] = []  # (user, refusal, block) that may end the chain
            for u in users:  # the first fusable user in schedule order continues the chain
                why = _refusal(u, out, ids, members, max_ops, fusable, taken, order)
                if why is None and kind in ("epilogue", "prologue") and _quantizes(u):
                    why = f"{u.op.name} changes the element type: a GEMM's epilogue computes float32"
                if why is None and kind == "requantize" and isinstance(u.op, qn.DequantizeLinear):
                    why = "a DequantizeLinear does not follow an integer product's sums"
                if why is None and (_left_for_later(u, position) or _dequantized_apart(u, ids, order)):
                    why = "the dequantized value is computed in the kernel of the op reading it"
                if why is None and "qdepthwise" in capabilities.blocks and \
                        _dequantized_depthwise(u, fusable, taken, max_ops, capabilities.check)[0]:
                    why = "the dequantized value is computed in the depthwise convolution reading it"
                if why is None and nxt is None:
                    nxt = u
                    label = "epilogue" if kind == "prologue" else kind  # after a prologue: the conv's epilogue
                    decisions.append(Decision(cur, u, True, f"{label} chain"))
                elif why is not None and kind == "elementwise" and id(u) not in taken and \
                        (block := _closing(u, out, capabilities.blocks)):
                    closers.append((u, why, block))
                else:
                    decisions.append(Decision(cur, u, False, why or "another user of the same result continues "
                                                                    "the chain (this one reads the kernel's result)"))
            closing = None
            for u, why, block in closers:  # the chain ends in a reduction or a conv when nothing continues it
                if nxt is None and closing is None:
                    rwhy = (f"the kernel has reached max_fused_ops={max_ops}" if len(members) >= max_ops else
                            "the chain quantizes or dequantizes: the block computes float32"
                            if any(_quantizes(m) for m in members) else
                            _cycle(u, ids, order) or capabilities.check(block, members + [u]))
                    if rwhy is None:
                        closing, kind = u, block
                        decisions.append(Decision(cur, u, True, _CLOSED[block]))
                        continue
                    why = f"{why}; not as the chain's {block}: {rwhy}"
                decisions.append(Decision(cur, u, False, why))
            if closing is not None:
                members.append(closing)
                ids.add(id(closing))
                if kind == "reduction":
                    break
                cur = closing  # a prologue: the conv takes its epilogue next
                continue
            if nxt is None:
                break
            if kind in ("requantize", "elementwise"):
                for d in _dequantized_operands(nxt, out, ids, members, max_ops, fusable, taken, order):
                    members.append(d)
                    ids.add(id(d))
                    decisions.append(Decision(d, nxt, True, "a dequantized operand, computed in the kernel"))
            members.append(nxt)
            ids.add(id(nxt))
            cur = nxt
        if kind == "requantize" and len(members) > 1:
            rwhy = capabilities.check("requantize", members)
            if rwhy is not None:  # the chain stays a kernel of its own (a later start)
                del decisions[first_decision:]
                decisions.append(Decision(start, members[1], False, f"not as a requantize block: {rwhy}"))
                continue
        if len(members) > 1:
            if not order.contract(members):  # pragma: no cover - every member was checked on joining
                raise RuntimeError(f"fusion: the group of {members[0].describe()} would close a cycle")
            groups.append(FusionGroup(members, kind))
            taken |= ids
    return groups, _block_decisions(groups, decisions, refused)


_CLOSED = {"reduction": "elementwise chain into its reduction",
           "prologue": "elementwise chain computed as the convolution's GEMM packs its input (a prologue)"}


def _closing(u: Node, out: Value, blocks) -> str | None:
    """The block an elementwise chain with result ``out`` may end in at its user ``u``: "reduction"
    (a reduction reading it), "prologue" (a convolution reading it as its input), or None."""
    if u.inputs[0] is not out:
        return None
    if u.op.pattern is Pattern.REDUCE and "reduction" in blocks:
        return "reduction"
    if isinstance(u.op, cv.Conv) and is_anchor(u) and "prologue" in blocks:
        return "prologue"
    return None


def _block_decisions(groups: list[FusionGroup], decisions: list[Decision],
                     refused: dict[int, str]) -> list[Decision]:
    """The decisions with the pairs inside attention and shuffle blocks marked fused, and the reason
    a block was not formed added to its node's refusals."""
    blocks = ("attention", "shuffle", "qdepthwise")
    group_of = {id(n): i for i, g in enumerate(groups) if g.kind in blocks for n in g.nodes}
    out = []
    for d in decisions:
        gp, gc = group_of.get(id(d.producer)), group_of.get(id(d.consumer))
        if gp is not None and gp == gc:
            continue
        if not d.fused and id(d.producer) in refused:
            d = Decision(d.producer, d.consumer, False, f"{d.reason}; {refused[id(d.producer)]}")
        out.append(d)
    for g in groups:
        if g.kind in blocks:
            ids = {id(n) for n in g.nodes}
            out += [Decision(v.producer, n, True, g.kind) for n in g.nodes for v in n.inputs
                    if v is not None and v.producer is not None and id(v.producer) in ids]
    return out


def _dequantized_operands(u: Node, out: Value, ids: set[int], members: list[Node], max_ops: int, fusable,
                          taken: set[int], order) -> list[Node]:
    """The DequantizeLinear nodes computing ``u``'s other operands for ``u`` alone (a residual read
    from its uint8 quantization), which the chain reaching ``u`` computes in its kernel: their float
    results are never written."""
    found: list[Node] = []
    for v in u.inputs:
        d = v.producer if v is not None and v is not out else None
        if d is None or not isinstance(d.op, qn.DequantizeLinear) or id(d) in taken or id(d) in ids or d in found:
            continue
        if not fusable(d) or tuple(v.shape) != tuple(out.shape) or _only_user(v) is not u:
            continue
        if len(members) + len(found) + 1 >= max_ops or _cycle(d, ids, order) is not None:
            continue
        found.append(d)
    return found


def _left_for_later(n: Node, position: dict[int, int]) -> bool:
    """A DequantizeLinear read by one elementwise op alone whose other operand is computed later:
    the chain computing that operand takes it in (``_dequantized_operands``), so it starts no group."""
    if not isinstance(n.op, qn.DequantizeLinear):
        return False
    u = _only_user(n.outputs[0])
    return u is not None and u.op.pattern <= Pattern.BROADCAST and any(
        v is not None and v is not n.outputs[0] and v.producer is not None
        and position.get(id(v.producer), -1) > position[id(n)] for v in u.inputs)


def _dequantized_apart(u: Node, ids: set[int], order) -> bool:
    """A DequantizeLinear read by one elementwise op alone that cannot join the chain ``ids`` (another
    of its operands is computed from the chain's results: a residual Add whose other operand comes
    through the next convolutions): the chain would write a float copy for it, where the kernel of
    that op computes it from the integers (``_dequantized_operands``) instead."""
    if not isinstance(u.op, qn.DequantizeLinear):
        return False
    w = _only_user(u.outputs[0])
    return w is not None and w.op.pattern <= Pattern.BROADCAST and _cycle(w, ids | {id(u)}, order) is not None


def _integer_product(n: Node) -> bool:
    """ConvInteger/MatMulInteger with one static int32 result: its sums may take the chain after it
    (a ``requantize`` block)."""
    out = n.outputs[0] if len(n.outputs) == 1 else None
    return (isinstance(n.op, (qn.ConvInteger, qn.MatMulInteger)) and isinstance(out.type, TensorType)
            and out.type.dtype is DType.i32 and out.type.is_static)


def _quantizes(n: Node) -> bool:
    """A QuantizeLinear/DequantizeLinear: it joins elementwise loops (where the backend says it is
    fusable), never a GEMM's epilogue or a block, whose code computes float32 values."""
    return isinstance(n.op, (qn.QuantizeLinear, qn.DequantizeLinear))


def _refusal(u: Node, out: Value, ids: set[int], members: list[Node], max_ops: int, fusable, taken: set[int],
             order) -> str | None:
    if id(u) in taken:
        return "the consumer is already in another kernel"
    if not fusable(u):
        if u.op.pattern <= Pattern.BROADCAST:
            return f"{u.op.name} has no fused loop code for its operand types"
        if isinstance(u.op, tn.Concat):
            return ("Concat is injective (no loop to join); where its pieces are contiguous slices the "
                    "program builder computes them into the result's buffer instead of copying")
        return f"{u.op.name} is not elementwise (pattern {u.op.pattern.name.lower()})"
    if tuple(u.outputs[0].shape) != tuple(out.shape):
        return f"{u.op.name} broadcasts the result to a larger shape {list(u.outputs[0].shape)}"
    if len(members) >= max_ops:
        return f"the kernel has reached max_fused_ops={max_ops}"
    return _cycle(u, ids, order)


def _cycle(u: Node, ids: set[int], order: _Contracted) -> str | None:
    """Why ``u`` joining the group ``ids`` would make a cycle (None: it would not)."""
    for v in u.inputs:
        p = v.producer if v is not None else None
        if p is not None and id(p) not in ids and order.reaches(ids, p):
            return (f"cycle: its operand from {p.describe()} is computed from the kernel's own results outside "
                    f"the kernel")
    return None


def outline(graph: Graph, group: FusionGroup, index: int) -> Node:
    """Replace the group's nodes by one ``kiln.Kernel`` node holding them (see the module docstring)."""
    node = _kernel_node(graph, group, index)
    graph.insert(node, before=group.nodes[-1])
    for n in reversed(group.nodes):
        graph.remove(n)
    return node


def _kernel_node(graph: Graph, group: FusionGroup, index: int) -> Node:
    """The ``kiln.Kernel`` node of ``group`` (not yet in the graph's node list), with every use of the
    group's results moved to it and the members' inputs dropped (they are then dead)."""
    from ..ir.ops.base import infer_node

    members = group.nodes
    ids = {id(n) for n in members}
    body = Graph(f"kernel{index}")
    mapping: dict[int, Value] = {}
    outer_inputs: list[Value] = []
    for n in members:
        for v in n.inputs:
            if v is None or id(v) in mapping or (v.producer is not None and id(v.producer) in ids):
                continue
            if v.const is not None:
                mapping[id(v)] = body.add_constant(v.const, name=v.name)
            else:
                mapping[id(v)] = body.add_input(v.name or f"in{len(outer_inputs)}", v.type)
                outer_inputs.append(v)
    outs: list[Value] = []
    for n in members:
        clone = body.add_node(n.op, [None if v is None else mapping[id(v)] for v in n.inputs], name=n.name,
                              num_outputs=len(n.outputs))
        for v, c in zip(n.outputs, clone.outputs):
            mapping[id(v)] = c
            if any(not (isinstance(u, Node) and id(u) in ids) for u, _ in v.uses):
                outs.append(v)
    body.set_outputs([mapping[id(v)] for v in outs], [f"r{k}" for k in range(len(outs))])
    op = Kernel(body=body, kind=group.kind)
    types, known = infer_node(op, outer_inputs, None)
    node = Node(op, outer_inputs, types, name=f"{members[0].name or members[0].op.name}+{len(members) - 1}")
    for r, k in zip(node.outputs, known):
        r.known = k
    for v, r in zip(outs, node.outputs):
        r.name = v.name
        v.replace_all_uses_with(r)
    for n in reversed(members):
        n.drop_inputs()
    return node


def _toposort(graph: Graph) -> None:
    """Restore a topological node order (stable: nodes keep their relative order where they can)."""
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    indeg = {id(n): 0 for n in graph.nodes}
    users: dict[int, list[Node]] = {id(n): [] for n in graph.nodes}
    for n in graph.nodes:
        preds = {id(v.producer) for v in n.inputs if v is not None and v.producer is not None and
                 id(v.producer) in pos}
        indeg[id(n)] = len(preds)
        for p in preds:
            users[p].append(n)
    import heapq

    ready = [(pos[id(n)], id(n), n) for n in graph.nodes if indeg[id(n)] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, _, n = heapq.heappop(ready)
        out.append(n)
        for u in users[id(n)]:
            indeg[id(u)] -= 1
            if indeg[id(u)] == 0:
                heapq.heappush(ready, (pos[id(u)], id(u), u))
    if len(out) != len(graph.nodes):  # pragma: no cover - plan_fusion refuses cycles
        raise RuntimeError("fusion left a cycle in the graph")
    graph.reorder(out)


class FuseKernels(Pass):
    """Group nodes into kernels (see the module docstring); each group becomes one ``kiln.Kernel``."""

    name = "fuse"

    def __init__(self, max_ops: int = 32, capabilities: FusionCapabilities = NO_FUSION):
        self.max_ops = max_ops
        self.capabilities = capabilities
        self.decisions: list[Decision] = []

    def run(self, graph: Graph) -> bool:
        groups, self.decisions = plan_fusion(graph, self.max_ops, self.capabilities)
        if not groups:
            return False
        # every kernel node takes its last member's place (each insertion and erasure is O(1))
        for i, g in enumerate(groups):
            outline(graph, g, i)
        _toposort(graph)
        graph.remove_unused_constants()  # the kernels' bodies hold the constants they read
        return True
