"""The pass manager: options, instruments, failure reports."""
from __future__ import annotations

import io

import pytest

from compiler.ir.graph import Graph
from compiler.passes.manager import Pass, PassError, PassManager, PrintAfter, Timing, Verify
from compiler.passes.options import CompileOptions, OptionError
from compiler.passes.pipeline import all_pass_names, pipeline
from compiler.passes.simplify.dce import EliminateDead

from .util import ir

TEXT = """
graph @t(%x: f32[2,3]) -> (y: f32[2,3]) {
  %0 = Relu(%x) : f32[2,3]
  %1 = Neg(%x) : f32[2,3]
  return y=%0
}
"""


class Breaks(Pass):
    """Leaves a result with the wrong type: the verifier must catch it."""

    name = "breaks-types"

    def run(self, graph: Graph) -> bool:
        from compiler.ir.types import DType, TensorType

        graph.nodes[0].outputs[0].type = TensorType(DType.f32, (3, 2))
        return True


class Raises(Pass):
    name = "raises"

    def run(self, graph):
        raise ZeroDivisionError("boom")


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(OptionError, match="unknown compile option.*opt_levle.*valid options: opt_level"):
        CompileOptions.make(opt_levle=2)
    with pytest.raises(OptionError, match="opt_level must be"):
        CompileOptions(opt_level=7)


def test_disable_unknown_pass_is_an_error():
    with pytest.raises(OptionError, match="unknown pass.*no-such-pass"):
        PassManager(pipeline(CompileOptions()), options=CompileOptions(disabled_passes=("no-such-pass",)))


def test_disabled_pass_does_not_run():
    g = ir(TEXT)
    opts = CompileOptions(opt_level=1, disabled_passes=("eliminate-dead", "canonicalize"))
    res = PassManager(pipeline(opts), options=opts).run(g)
    assert [r.name for r in res.records] == ["infer-shapes", "fold-qdq", "fold-constants", "unroll-loops",
                                            "eliminate-common-subexpressions"]
    assert len(g.nodes) == 2


def test_changed_is_honest_and_recorded():
    g = ir(TEXT)
    res = PassManager([EliminateDead(), EliminateDead()], [Verify()]).run(g)
    assert [r.changed for r in res.records] == [True, False]
    assert (res.records[0].nodes_before, res.records[0].nodes_after) == (2, 1)
    assert "eliminate-dead" in res.summary()


def test_verify_names_the_pass_that_broke_the_ir():
    g = ir(TEXT)
    with pytest.raises(PassError) as e:
        PassManager([EliminateDead(), Breaks()], [Verify()]).run(g)
    msg = str(e.value)
    assert "pass 'breaks-types' failed" in msg and "passes run before it: eliminate-dead" in msg
    assert "%0 = Relu(%x) : f32[2,3]" in msg  # the IR it was given: after eliminate-dead,
    assert "Neg(" not in msg.split("the IR it was given")[1]  # not the pipeline's input


def test_a_raising_pass_is_reported_with_its_input():
    with pytest.raises(PassError, match=r"pass 'raises' failed: ZeroDivisionError: boom(.|\n)*Relu"):
        PassManager([Raises()], [Timing()]).run(ir(TEXT))


def test_print_after_only_if_changed():
    out = io.StringIO()
    PassManager([EliminateDead(), EliminateDead()], [PrintAfter("all", only_if_changed=True, stream=out)]).run(ir(TEXT))
    text = out.getvalue()
    assert text.count("IR after pass") == 1 and "01 eliminate-dead (changed)" in text


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_every_level_has_a_recipe(level):
    names = [p.name for p in pipeline(CompileOptions(opt_level=level))]
    assert names[0] == "infer-shapes"
    assert set(names) <= set(all_pass_names())
    if level >= 2:
        assert "fold-batchnorm" in names
