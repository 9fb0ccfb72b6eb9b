"""The IR's mutation API (docs/ir.md, "Editing a graph"): inserting at a point, moving, erasing,
reordering and replacing uses give the expected structure, keep the printed IR deterministic, and stay
correct at 20,000 edits on one graph (none of them reads the whole order)."""
from __future__ import annotations

import copy
import random
import textwrap

import numpy as np
import pytest

from compiler.ir import ops
from compiler.ir.graph import Graph, IRError, Node
from compiler.ir.parser import parse
from compiler.ir.printer import print_graph
from compiler.ir.types import DType, TensorType
from compiler.ir.verify import check, verify


def op(name: str, **attrs):
    return ops.lookup(name)(**attrs)


def f32(*shape) -> TensorType:
    return TensorType(DType.f32, shape)


def chain(n: int = 4) -> Graph:
    """x -> n0 -> n1 -> ... (Relu, Neg alternating), the last one the output y."""
    g = Graph("chain")
    v = g.add_input("x", f32(4))
    for k in range(n):
        v = g.add(op("Relu" if k % 2 == 0 else "Neg"), v, name=f"n{k}")
    g.set_outputs([v], ["y"])
    return g


def names(g: Graph) -> list[str]:
    return [n.name for n in g.nodes]


# -- the order ------------------------------------------------------------------------------------

def test_insert_before_after_and_at_the_end():
    g = chain(3)
    n0, n1, n2 = g.nodes
    x = g.inputs[0]
    g.add_node(op("Abs"), [x], name="a", before=n1)
    g.add_node(op("Abs"), [x], name="b", after=n1)
    g.add_node(op("Abs"), [x], name="c")
    g.insert(Node(op("Abs"), [x], [f32(4)], name="d"), after=n2)
    assert names(g) == ["n0", "a", "n1", "b", "n2", "d", "c"]
    assert len(g.nodes) == 7
    with pytest.raises(IRError, match="give before= or after=, not both"):
        g.add_node(op("Abs"), [x], before=n1, after=n1)
    with pytest.raises(IRError, match="already in a graph"):
        g.insert(n0)


def test_inserting_before_and_after_keep_the_order_nodes_are_made_in():
    g = chain(2)
    n0, n1 = g.nodes
    with g.inserting_before(n1):
        a = g.add(op("Abs"), n0.output, name="a")
        g.add(op("Abs"), a, name="b")
    with g.inserting_after(n0):
        c = g.add(op("Abs"), n0.output, name="c")
        g.add(op("Abs"), c, name="d")
        g.add_node(op("Abs"), [g.inputs[0]], name="e", before=n0)  # an explicit place wins
    g.add(op("Abs"), n0.output, name="end")  # the insertion point ended with the block
    assert names(g) == ["e", "n0", "c", "d", "a", "b", "n1", "end"]
    assert check(g) == []


def test_nested_insertion_points_and_a_removed_anchor():
    g = chain(2)
    n0, n1 = g.nodes
    with g.inserting_before(n1):
        g.add(op("Abs"), n0.output, name="a")
        with g.inserting_after(n0):
            g.add(op("Abs"), n0.output, name="inner")
        g.add(op("Abs"), n0.output, name="b")
    assert names(g) == ["n0", "inner", "a", "b", "n1"]
    tmp = g.add_node(op("Abs"), [n0.output], name="tmp")
    with g.inserting_before(tmp):
        g.remove(tmp)
        with pytest.raises(IRError, match="the insertion point .* is not a node of graph @chain"):
            g.add(op("Abs"), n0.output)
    with pytest.raises(IRError, match="inserting_after: .* is not a node"):
        with g.inserting_after(tmp):
            pass


def test_move_before_and_after():
    g = Graph("g")
    x = g.add_input("x", f32(4))
    a, b, c, d = (g.add_node(op("Abs"), [x], name=s) for s in "abcd")
    g.move_before(d, a)
    assert names(g) == ["d", "a", "b", "c"]
    g.move_after(d, c)
    assert names(g) == ["a", "b", "c", "d"]
    g.move_after(a, c)
    g.move_before(b, b)  # no-op
    g.move_after(c, c)  # no-op
    assert names(g) == ["b", "c", "a", "d"]
    assert (b.prev, b.next, d.next, a.prev) == (None, c, None, c)
    assert len(g.nodes) == 4
    other = chain(1)
    with pytest.raises(IRError, match="anchor .* is not a node of graph @g"):
        g.move_before(a, other.nodes[0])
    with pytest.raises(IRError, match="move: node .* is not a node of graph @g"):
        g.move_before(other.nodes[0], a)


def test_remove_unlinks_the_node_and_its_uses():
    g = chain(3)
    n0, n1, n2 = g.nodes
    with pytest.raises(IRError, match="still has 1 use"):
        g.remove(n1)
    n2.set_input(0, n0.output)
    g.remove(n1)
    assert names(g) == ["n0", "n2"]
    assert (n1.graph, n1.prev, n1.next, n1.inputs) == (None, None, None, [])
    assert list(n0.output.uses) == [(n2, 0)]
    assert n1 not in g.nodes and n2 in g.nodes
    with pytest.raises(IRError, match="remove: .* is not a node of graph @chain"):
        g.remove(n1)
    g.insert(n1, before=n2)  # an erased node can go back (without inputs)
    assert names(g) == ["n0", "n1", "n2"]


def test_reorder_takes_exactly_the_graphs_nodes():
    g = Graph("g")
    x = g.add_input("x", f32(4))
    a, b, c = (g.add_node(op("Abs"), [x], name=s) for s in "abc")
    g.reorder([c, a, b])
    assert names(g) == ["c", "a", "b"] and (c.prev, b.next) == (None, None)
    g.move_after(c, b)
    assert names(g) == ["a", "b", "c"]
    stranger = chain(1).nodes[0]
    for bad in ([a, b], [a, b, b], [a, b, stranger], [a, b, c, c]):
        with pytest.raises(IRError, match="each of the graph's 3 nodes once"):
            g.reorder(bad)
    assert names(g) == ["a", "b", "c"]


def test_nodes_is_a_read_only_view():
    g = chain(4)
    view = g.nodes
    assert g.nodes is view and len(view) == 4
    assert [n.name for n in view[1:3]] == ["n1", "n2"] and view[-1].name == "n3"
    assert [n.name for n in reversed(view)] == ["n3", "n2", "n1", "n0"]
    assert view.index(view[2]) == 2
    with pytest.raises(TypeError):
        view[0] = view[1]  # type: ignore[index]
    with pytest.raises(AttributeError):
        g.nodes = []  # type: ignore[misc]
    with pytest.raises(AttributeError):
        view.append(view[0])  # type: ignore[attr-defined]
    seen = []
    for n in g.nodes:  # editing while iterating: the loop sees the order it started with
        seen.append(n.name)
        if n.name == "n1":
            g.add(op("Abs"), n.output, name="late")
    assert seen == ["n0", "n1", "n2", "n3"] and names(g)[-1] == "late"


# -- uses -----------------------------------------------------------------------------------------

def test_uses_are_kept_in_the_order_they_were_made():
    g = Graph("g")
    x = g.add_input("x", f32(4))
    y = g.add_input("y", f32(4))
    a = g.add_node(op("Add"), [x, x], name="a")
    b = g.add_node(op("Relu"), [x], name="b")
    g.set_outputs([x], ["out"])
    assert list(x.uses) == [(a, 0), (a, 1), (b, 0), (g.ret, 0)]
    assert x.users == [a, b] and len(x.uses) == 4 and (a, 1) in x.uses and x.uses.single() is None
    a.set_input(0, y)
    a.set_input(0, x)  # back at the end
    assert list(x.uses) == [(a, 1), (b, 0), (g.ret, 0), (a, 0)]
    x.replace_all_uses_with(y)
    assert not x.uses and list(y.uses) == [(a, 1), (b, 0), (g.ret, 0), (a, 0)]
    assert b.output.uses.single() is None
    c = g.add_node(op("Relu"), [b.output])
    assert b.output.uses.single() == (c, 0)
    with pytest.raises(AttributeError):
        y.uses.append((c, 0))  # type: ignore[attr-defined]
    for edit in (lambda u: u.pop((c, 0)), lambda u: u.clear(), lambda u: u.update({(c, 1): None}),
                 lambda u: u.__setitem__((c, 1), None), lambda u: u.__delitem__((c, 0))):
        with pytest.raises(IRError, match="a value's uses are kept by the IR"):
            edit(b.output.uses)
    assert list(b.output.uses) == [(c, 0)]


# -- the printed IR -------------------------------------------------------------------------------

TEXT = textwrap.dedent("""\
    graph @g(%x: f32[4]) -> (y: f32[4], z: f32[4]) {
      %b = const f32[4] dense<[1.0, 2.0, 3.0, 4.0]>
      %0 = Relu(%x) : f32[4] @"r"
      %1 = Add(%0, %b) : f32[4] @"add"
      %2 = Neg(%1) : f32[4] @"neg"
      %3 = Mul(%0, %2) : f32[4] @"mul"
      return y=%3, z=%1
    }
    """)


def test_edits_that_end_in_the_same_graph_print_the_same_ir():
    direct = parse(TEXT)
    assert print_graph(direct) == TEXT
    # the same graph, built out of order and put right with the mutation API
    g = Graph("g")
    x = g.add_input("x", f32(4))
    b = g.add_constant(np.array([1, 2, 3, 4], np.float32), name="b")
    tmp = g.add_node(op("Abs"), [x], name="tmp")
    with g.inserting_after(tmp):
        neg = g.add_node(op("Neg"), [x], name="neg")
        mul = g.add_node(op("Mul"), [x, neg.output], name="mul")
    r = g.add_node(op("Relu"), [x], name="r", before=tmp)
    add = g.add_node(op("Add"), [r.output, b], name="add")
    neg.set_input(0, add.output)
    mul.set_input(0, r.output)
    g.remove(tmp)
    g.move_before(add, neg)
    g.set_outputs([mul.output, add.output], ["y", "z"])
    verify(g)
    assert print_graph(g) == TEXT
    g.reorder([r, add, neg, mul])  # the same order: the same text
    assert print_graph(g) == TEXT
    assert print_graph(copy.deepcopy(g)) == TEXT  # the links are rebuilt on copy


# -- at scale: 20,000 edits, none of which reads the whole order -----------------------------------

def test_twenty_thousand_edits_on_one_graph(monkeypatch):
    n = 20_000
    g = chain(n)
    reads = []
    real_order = Graph._order
    monkeypatch.setattr(Graph, "_order", lambda self: reads.append(1) or real_order(self))
    first_node = g.nodes[0]  # (a read before the edits)
    reads.clear()
    node = first_node
    while node is not None:  # after every node a Neg Neg pair, which its users now read
        nxt = node.next
        uses = list(node.output.uses)
        with g.inserting_after(node):
            a = g.add(op("Neg"), node.output)
            b = g.add(op("Neg"), a)
        for user, i in uses:
            user.set_input(i, b)
        node = nxt
    assert len(g.nodes) == 3 * n and len(reads) == 0
    node = first_node
    while node is not None:  # swap each pair, then swap it back
        a = node.next
        b = a.next
        g.move_before(b, a)
        assert (node.next, b.next) == (b, a)
        g.move_after(b, a)
        node = b.next
    node = first_node
    while node is not None:  # erase the pairs: their users read the node again
        a = node.next
        b = a.next
        nxt = b.next
        b.output.replace_all_uses_with(node.output)
        g.remove(b)
        g.remove(a)
        node = nxt
    assert reads == []  # no edit walked the order
    assert len(g.nodes) == n
    monkeypatch.undo()
    verify(g)
    assert print_graph(g) == print_graph(chain(n))


def test_a_value_with_twenty_thousand_uses():
    g = Graph("wide")
    x = g.add_input("x", f32(4))
    users = [g.add_node(op("Relu"), [x]) for _ in range(20_000)]
    y = g.add_input("y", f32(4))
    rng = random.Random(0)
    order = users[:]
    rng.shuffle(order)
    for k, u in enumerate(order):  # replace uses in a random order, then erase
        u.set_input(0, y)
        if k % 2:
            g.remove(u)
    assert not x.uses and len(y.uses) == 10_000
    assert [u for u, _ in y.uses] == [u for k, u in enumerate(order) if k % 2 == 0]  # the order they were made
    g.set_outputs([y], ["y"])
    for u in list(g.nodes):
        g.remove(u)
    assert len(g.nodes) == 0 and list(y.uses) == [(g.ret, 0)]
    verify(g)


@pytest.mark.parametrize("seed", range(10))
def test_random_edits_match_a_list(seed):
    """Insert (at a point, before, after), move and erase at random; the order is what the same edits
    on a Python list give."""
    rng = random.Random(seed)
    g = Graph("edits")
    x = g.add_input("x", f32(2))
    ref: list[Node] = []
    for step in range(400):
        what = rng.random()
        if what < 0.35 or not ref:
            n = Node(op("Relu"), [x], [f32(2)])
            anchor = rng.choice(ref) if ref and rng.random() < 0.7 else None
            how = rng.choice(["before", "after", "point-before", "point-after"])
            if anchor is None:
                g.insert(n)
                ref.append(n)
            elif how == "before":
                g.insert(n, before=anchor)
                ref.insert(ref.index(anchor), n)
            elif how == "after":
                g.insert(n, after=anchor)
                ref.insert(ref.index(anchor) + 1, n)
            elif how == "point-before":
                with g.inserting_before(anchor):
                    g.insert(n)
                ref.insert(ref.index(anchor), n)
            else:
                with g.inserting_after(anchor):
                    g.insert(n)
                ref.insert(ref.index(anchor) + 1, n)
        elif what < 0.6 and len(ref) > 1:
            n = rng.choice(ref)
            ref.remove(n)
            anchor = rng.choice(ref)
            if rng.random() < 0.5:
                g.move_before(n, anchor)
                ref.insert(ref.index(anchor), n)
            else:
                g.move_after(n, anchor)
                ref.insert(ref.index(anchor) + 1, n)
        elif what < 0.85:
            n = rng.choice(ref)
            g.remove(n)
            ref.remove(n)
        elif what < 0.9:
            rng.shuffle(ref)
            g.reorder(ref)
        else:
            assert list(g.nodes) == ref
    assert list(g.nodes) == ref and len(g.nodes) == len(ref)
    assert all(n.graph is g for n in g.nodes) and g._links_problem() is None
