"""The IR verifier: well-formed graphs pass; each kind of breakage is reported with the node it is
about and the printed IR around it."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from compiler.ir import ops
from compiler.ir.graph import Graph, Node
from compiler.ir.parser import parse
from compiler.ir.types import DType, TensorType
from compiler.ir.verify import MAX_REPORTED, VerifyError, check, verify


def op(name: str, **attrs):
    return ops.lookup(name)(**attrs)


def f32(*shape) -> TensorType:
    return TensorType(DType.f32, shape)


def chain() -> Graph:
    """x -> Relu -> Neg -> Add(., b) -> Abs -> Exp -> Sqrt, with node names n0..n5."""
    g = Graph("chain")
    x = g.add_input("x", f32("N", 4))
    b = g.add_constant(np.arange(4, dtype=np.float32), name="b")
    v = g.add(op("Relu"), x, name="n0")
    v = g.add(op("Neg"), v, name="n1")
    v = g.add(op("Add"), v, b, name="n2")
    for k, name in enumerate(["Abs", "Exp", "Sqrt"], start=3):
        v = g.add(op(name), v, name=f"n{k}")
    g.set_outputs([v], ["y"])
    return g


def verify_error(g: Graph) -> VerifyError:
    with pytest.raises(VerifyError) as e:
        verify(g)
    return e.value


def test_well_formed_graphs_pass():
    verify(chain())
    verify(Graph("empty"))
    g = parse(textwrap.dedent("""\
        graph @g(%x: f32[2]) -> (y: f32[2], same: f32[2]) {
          %c = const f32[2] dense<[1.0, 2.0]>
          %0 = Add(%x, %c) : f32[2]
          return y=%0, same=%x
        }
        """))
    verify(g)
    assert check(g) == []


def test_wrong_result_type_names_the_node_and_shows_the_ir():
    g = chain()
    g.nodes[2].outputs[0].type = f32("N", 5)
    e = verify_error(g)
    msg = str(e)
    assert msg.splitlines()[0] == "graph @chain is malformed: 1 problem"
    assert ("[1] Add node 'n2' (#2, result %2): result %2 has type f32[N,5], but type inference gives f32[N,4]"
            in msg)
    # the IR around it, the bad line marked
    assert "\n  >>  %2 = Add(%1, %b) : f32[N,5] @\"n2\"\n" in msg
    assert '      %1 = Neg(%0) : f32[N,4] @"n1"' in msg and '      %3 = Abs(%2) : f32[N,4] @"n3"' in msg
    assert '      %4 = Abs' not in msg and '%4 = Exp' in msg and '%5 = Sqrt' not in msg  # two lines each side
    assert len(e.problems) == 1 and e.problems[0].where == "node" and e.problems[0].index == 2


def test_the_documented_message():
    g = chain()
    g.nodes[2].outputs[0].type = f32("N", 5)
    assert str(verify_error(g)) == textwrap.dedent("""\
        graph @chain is malformed: 1 problem
        [1] Add node 'n2' (#2, result %2): result %2 has type f32[N,5], but type inference gives f32[N,4]
             ...
              %0 = Relu(%x) : f32[N,4] @"n0"
              %1 = Neg(%0) : f32[N,4] @"n1"
          >>  %2 = Add(%1, %b) : f32[N,5] @"n2"
              %3 = Abs(%2) : f32[N,4] @"n3"
              %4 = Exp(%3) : f32[N,4] @"n4"
             ...""")


def test_text_with_a_wrong_type_parses_and_the_verifier_reports_it():
    g = parse(textwrap.dedent("""\
        graph @g(%x: f32[2]) -> (y: f32[3]) {
          %0 = Relu(%x) : f32[3] @"r"
          return y=%0
        }
        """))
    msg = str(verify_error(g))
    assert "Relu node 'r' (#0, result %0): result %0 has type f32[3], but type inference gives f32[2]" in msg
    assert '  >>  %0 = Relu(%x) : f32[3] @"r"' in msg


def test_broken_use_list_missing_entry():
    g = chain()
    node = g.nodes[3]
    node.inputs[0].uses._remove(node, 0)  # behind the IR's back
    msg = str(verify_error(g))
    assert "Abs node 'n3' (#3, result %3): input 0 (%2) is missing from that value's use-list" in msg
    assert '  >>  %3 = Abs(%2) : f32[N,4] @"n3"' in msg


def test_broken_use_list_stale_entry():
    g = chain()
    v = g.nodes[0].outputs[0]
    Node(op("Relu"), [v], [f32("N", 4)])  # never inserted: its use of %0 stays in the use-list
    node = g.nodes[1]
    node.inputs[0] = g.inputs[0]  # input changed behind the use-lists' back
    problems = [p.message for p in check(g)]
    assert any("%0: use-list names Relu node, which is not in this graph (a removed node?)" in p for p in problems)
    assert any("%0: use-list says it is input 0 of Neg node 'n1', but that input is %x" in p for p in problems)
    assert any("Neg node 'n1' (#1, result %1): input 0 (%x) is missing from that value's use-list" in p for p in problems)


def test_use_before_definition():
    g = chain()
    n = list(g.nodes)
    g.reorder([n[0], n[2], n[1], *n[3:]])  # reorder does not check the order; the verifier does
    e = verify_error(g)
    msg = str(e)
    assert ("Add node 'n2' (#1, result %1): input 0 (%2) is used before its definition by node #2 "
            "(graph.nodes is not in topological order)") in msg
    assert '  >>  %1 = Add(%2, %b) : f32[N,4] @"n2"' in msg


def test_value_from_another_graph():
    g, other = chain(), chain()
    g.nodes[3].set_input(0, other.nodes[0].outputs[0])
    msg = str(verify_error(g))
    assert "Abs node 'n3' (#3, result %3): input 0 (%\"<outside graph #1>\") is not defined in this graph" in msg


def test_node_ownership_and_arity():
    g = chain()
    g.nodes[4].graph = None
    bad = Node(op("Add"), [g.nodes[0].outputs[0]], [f32("N", 4)], name="half")
    g.insert(bad, before=g.nodes[5])
    problems = [p.message for p in check(g)]
    assert any("Exp node 'n4' (#4, result %4): node.graph is None, not this graph" in p for p in problems)
    assert any("Add node 'half' (#5, result %5): wrong number of inputs: Add: takes 2 inputs (A, B), got 1" in p
               for p in problems)


def test_broken_links_of_the_node_order():
    g = chain()
    g.nodes[3]._next = g.nodes[1]  # a cycle, made behind the graph's back
    assert "the node order's links are broken at #4 (Neg node 'n1'): prev is not #3" in [p.message for p in check(g)]


def test_constants_inputs_and_outputs():
    g = chain()
    b = g.constants[0]
    b.const = np.arange(5, dtype=np.float32)
    g.add_input("x", f32(2))  # a second input named x
    g.set_outputs([g.nodes[-1].outputs[0], g.inputs[0]], ["y", "y"])
    problems = [p.message for p in check(g)]
    assert "constant %b has type f32[4] but its data is f32[5]" in problems
    assert "graph input name 'x' is used twice (inputs #0 and #1)" in problems
    assert "output name 'y' is used twice (outputs #0 and #1)" in problems


def test_a_value_defined_twice_and_an_output_from_nowhere():
    g = chain()
    g.constants.append(g.inputs[0])  # the input listed again as a constant
    g.ret.inputs.append(chain().inputs[0])
    g.output_names.append("z")
    problems = [p.message for p in check(g)]
    assert any("constant %x is already defined as graph input" in p for p in problems)
    assert any('output #1 (%"<outside graph #1>") is not defined in this graph' in p for p in problems)
    assert any("output #1" in p and "is missing from that value's use-list" in p for p in problems)


def test_output_use_list():
    g = chain()
    out = g.outputs[0]
    out.uses._remove(g.ret, 0)  # behind the IR's back
    msg = str(verify_error(g))
    assert "output #0 (%5) is missing from that value's use-list" in msg
    assert "  >>  return y=%5" in msg


def test_many_problems_are_collected_and_the_first_few_shown():
    g = chain()
    for n in g.nodes:
        n.graph = None
    e = verify_error(g)
    assert len(e.problems) >= 6
    msg = str(e)
    assert msg.splitlines()[0] == (f"graph @chain is malformed: {len(e.problems)} problems "
                                   f"(the first {MAX_REPORTED} shown)")
    assert msg.count("\n[") == MAX_REPORTED


def test_one_wrong_type_is_reported_once_not_at_every_user():
    g = chain()
    g.nodes[1].outputs[0].type = f32(7)  # Neg: its users would fail to infer (7 vs 4) with it
    assert [p.message for p in check(g)] == [
        "Neg node 'n1' (#1, result %1): result %1 has type f32[7], but type inference gives f32[N,4]"]
    # ... and a wrong type that a pass propagated consistently is reported where it starts
    g = chain()
    for n in g.nodes[2:]:
        n.outputs[0].type = f32("M", 4)
    assert [p.message for p in check(g)] == [
        "Add node 'n2' (#2, result %2): result %2 has type f32[M,4], but type inference gives f32[N,4]"]


def test_known_value_that_disagrees_with_its_type():
    g = Graph()
    a = g.add_constant(np.array([1, 2], np.int64), name="a")
    s = g.add(op("Add"), a, a)
    assert s.known.tolist() == [2, 4]
    s.known = np.array([1, 2, 3])
    g.set_outputs([s], ["s"])
    assert any("the known value of %0 is int64[3], its type is i64[2]" in p.message for p in check(g))


def test_subgraphs_are_verified_as_graphs_of_their_own():
    """A body is verified recursively; an outer value used inside a body (not passed as an input, as the
    importer's closure conversion does) is reported as undefined there."""
    g = Graph("outer")
    c = g.add_input("c", TensorType(DType.bool, ()))
    x = g.add_input("x", f32(2))
    then, other = Graph("then"), Graph("else")
    tx = then.add_input("x", f32(2))
    then.set_outputs([then.add(op("Abs"), tx)], ["y"])
    ox = other.add_input("x", f32(2))
    other.set_outputs([other.add(op("Neg"), ox)], ["y"])
    g.set_outputs([g.add(op("If", then_branch=then, else_branch=other), c, x)], ["y"])
    verify(g)
    leak = Node(op("Relu"), [x], [f32(2)])  # reads the outer x directly
    other.insert(leak)
    other.set_outputs([leak.output], ["y"])
    problems = check(g)
    assert [p.message for p in problems] == [
        "If node (#0, result %0): in else_branch (graph @else): Relu node (#1, result %1): input 0 "
        "(%\"<outside graph #1>\") is not defined in this graph",
        # and the outer graph sees a use by a node that is not one of its own
        "%x: use-list names Relu node, which is not in this graph (a removed node?)"]
    assert "  >>  %1 = Relu(%\"<outside graph #1>\") : f32[2]" in problems[0].context
    other.set_outputs([other.nodes[0].output], ["y"])
    other.remove(leak)
    verify(g)
