"""The thread count of each call (``runtime/threads.py``): the choice by timing, and outputs that do
not depend on it."""
from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler.runtime.threads import ThreadChoice


def _drive(choice: ThreadChoice, seconds: dict[int, float], calls: int) -> list[int]:
    """``calls`` calls whose time depends only on their thread count: the counts picked."""
    picked = []
    for _ in range(calls):
        n = choice.pick()
        choice.record(n, seconds[n])
        picked.append(n)
    return picked


def test_the_faster_count_runs_the_calls_and_the_other_is_probed():
    choice = ThreadChoice(4, probe_every=8, window=3)
    picked = _drive(choice, {4: 2.0, 1: 3.0}, 6)
    assert sorted(picked) == [1, 1, 1, 4, 4, 4] and choice.using == 4  # both measured first, in turns
    picked = _drive(choice, {4: 2.0, 1: 3.0}, 64)
    assert [i for i, n in enumerate(picked) if n == 1] == list(range(7, 64, 8))  # a probe in 8 calls
    # the machine changes (the threads' cores drift apart): one thread is faster now
    _drive(choice, {4: 5.0, 1: 3.0}, 2 * 8)
    assert choice.using == 4  # the count in use still has a fast period in its window
    _drive(choice, {4: 5.0, 1: 3.0}, 8)
    assert choice.using == 1  # within `window` periods
    picked = _drive(choice, {4: 5.0, 1: 3.0}, 80)
    assert picked.count(4) == 10 and choice.using == 1  # only the probes
    _drive(choice, {4: 1.0, 1: 3.0}, 8)
    assert choice.using == 4


def test_interference_on_the_count_in_use_weighs_as_much_as_on_the_probes():
    """Each period gives both counts one figure: its probe, and the fastest call on the count in
    use; a burst of slow calls on the count in use does not make a single fast probe win."""
    choice = ThreadChoice(2, probe_every=4, window=3)
    _drive(choice, {2: 1.0, 1: 2.0}, 6 + 3 * 4)
    assert choice.using == 2 and list(choice.times[2]) == [1.0] * 3
    _drive(choice, {2: 9.0, 1: 2.0}, 4)  # a period of interference: every call on 2 threads slow
    assert choice.using == 2 and list(choice.times[2]) == [1.0, 1.0, 9.0]


def test_a_slow_outlier_does_not_move_the_choice():
    choice = ThreadChoice(2, probe_every=4, window=5)
    _drive(choice, {2: 1.0, 1: 2.0}, 10)
    assert choice.using == 2
    n = choice.pick()
    choice.record(n, 100.0)  # one call descheduled
    _drive(choice, {2: 1.0, 1: 2.0}, 12)
    assert choice.using == 2


def test_needs_two_counts():
    with pytest.raises(ValueError, match="at least 2"):
        ThreadChoice(1)


def _conv_net():
    """A small CNN as ONNX: conv+relu, a residual block, pooling, a linear layer."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Add", ["c1", "r0"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wl", "bl"], ["y"], transB=1),
             helper.make_node("Softmax", ["y"], ["s"], axis=1)]
    inits = [w("w0", 16, 3, 3, 3), w("b0", 16), w("w1", 16, 16, 3, 3), w("b1", 16), w("wl", 10, 16), w("bl", 10)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}


def test_outputs_are_the_same_on_every_count():
    """Bitwise: a CNN and the BERT-style suite model on 1 and 2 threads, and adaptive calls (which
    run on both while they measure)."""
    from compiler.tools.zoo import model_of

    cases = [_conv_net(), (model_of("zoo:bert"), None)]
    for model, feeds in cases:
        exe = compiler.compile(model, nthreads=2)
        if feeds is None:
            rng = np.random.default_rng(0)
            feeds = {n: (rng.standard_normal(s).astype(d.np) if d.np.kind == "f" else
                         rng.integers(0, 30, s).astype(d.np)) for n, d, s in exe.inputs}
        exe.adaptive_threads = False
        exe.nthreads = 1
        one = exe.run(feeds)
        exe.nthreads = 2
        two = exe.run(feeds)
        for name in one:
            np.testing.assert_array_equal(one[name], two[name], err_msg=name)
        exe.adaptive_threads = True
        for _ in range(12):  # the measuring calls: both counts
            out = exe.run(feeds)
            for name in one:
                np.testing.assert_array_equal(out[name], one[name], err_msg=name)
        assert len(exe._choice.times[1]) == len(exe._choice.times[2]) == exe._choice.times[1].maxlen


def test_pinned_threads_and_profiles_use_all_threads():
    model, feeds = _conv_net()
    exe = compiler.compile(model, nthreads=3)
    assert exe.adaptive_threads and exe.nthreads == 3
    exe.adaptive_threads = False
    assert exe._choice is None and exe.threads_in_use == 3
    exe.run(feeds)
    exe.adaptive_threads = True
    exe.nthreads = 1  # one thread: nothing to choose
    assert exe._choice is None and exe.threads_in_use == 1
    with pytest.raises(ValueError, match="at least 1"):
        exe.nthreads = 0
