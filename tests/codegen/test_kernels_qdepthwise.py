"""A depthwise conv computed in float32 between 8-bit tensors (``kernels/qdepthwise.py``):
structure (one ``qdepthwise`` kernel: DequantizeLinear, Conv and the chain up to the
QuantizeLinear), numbers (native against the reference interpreter on every ISA the host runs, each
plane path: tiny, flat, rows; strides, padding, a channel multiplier, two images, int8 input, no
chain) and refusals (the reason a chain op stays outside)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.kernels.testing import build_kernels, run_kernels
from compiler.codegen.llvm.target import host_target, target_for

from .fused import fuse

CPUS = ["icelake-server", "x86-64-v3", "x86-64-v2"]  # AVX-512, AVX2, portable: the vector width differs


def block(n=1, c=6, h=9, w=9, k=3, stride=1, pad=1, mult=1, xt="u8", tail="clip", dil=1):
    """DequantizeLinear(x) -> depthwise Conv -> ``tail``: "clip" (Clip(0, 6) and QuantizeLinear to
    uint8), "quantize" (QuantizeLinear only), "relu-mul" (Relu, a Mul by a scalar, QuantizeLinear),
    "none" (the float result), "residual" (an Add of another input: a tensor operand)."""
    m = c * mult
    oh = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dil * (k - 1) - 1) // stride + 1
    out = f"[{n},{m},{oh},{ow}]"
    zx = "dense<-3>" if xt == "i8" else "dense<7>"
    ops = {"clip": f"""  %4 = Clip(%3, %lo, %hi) : f32{out}
  %5 = QuantizeLinear(%4, %sy, %zy) : u8{out}
  return y=%5""",
           "quantize": f"""  %5 = QuantizeLinear(%3, %sy, %zy) : u8{out}
  return y=%5""",
           "relu-mul": f"""  %4 = Relu(%3) : f32{out}
  %6 = Mul(%4, %two) : f32{out}
  %5 = QuantizeLinear(%6, %sy, %zy) : u8{out}
  return y=%5""",
           "none": "  return y=%3",
           "residual": f"""  %4 = Add(%3, %r) : f32{out}
  %5 = QuantizeLinear(%4, %sy, %zy) : u8{out}
  return y=%5"""}[tail]
    extra = f", %r: f32{out}" if tail == "residual" else ""
    yt = f"f32{out}" if tail == "none" else f"u8{out}"
    text = f"""graph @g(%x: {xt}[{n},{c},{h},{w}]{extra}) -> (y: {yt}) {{
  %sx = const f32[] dense<0.05>
  %zx = const {xt}[] {zx}
  %wt = const f32[{m},1,{k},{k}]
  %b = const f32[{m}]
  %lo = const f32[] dense<0.0>
  %hi = const f32[] dense<6.0>
  %two = const f32[] dense<2.0>
  %sy = const f32[] dense<0.03>
  %zy = const u8[] dense<0>
  %1 = DequantizeLinear(%x, %sx, %zx) : f32[{n},{c},{h},{w}]
  %3 = Conv(%1, %wt, %b) {{group={c}, kernel_shape=[{k}, {k}], pads=[{pad}, {pad}, {pad}, {pad}], \
strides=[{stride}, {stride}], dilations=[{dil}, {dil}]}} : f32{out}
{ops}
}}"""
    rng = np.random.default_rng(n * 1000 + c * 10 + h)
    weights = {"wt": (rng.standard_normal((m, 1, k, k)) * 0.4).astype(np.float32),
               "b": (rng.standard_normal(m) * 0.2).astype(np.float32)}
    info = np.iinfo(np.int8 if xt == "i8" else np.uint8)
    feeds = {"x": rng.integers(info.min, info.max + 1, (n, c, h, w)).astype(info.dtype)}
    if tail == "residual":
        feeds["r"] = rng.standard_normal((n, m, oh, ow)).astype(np.float32)
    return text, weights, feeds


def _fused(**kw):
    text, weights, feeds = block(**kw)
    return fuse(text, weights, feeds=feeds)


def _close(got, want):
    """uint8 results: the interpreter's, or one step off where the float sums' rounding order puts a
    value on the other side of a rounding boundary (rare); float results to float32 rounding."""
    if want.dtype == np.uint8:
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and np.mean(diff != 0) < 0.01, (diff.max(), np.mean(diff != 0))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_structure():
    g, p, feeds, want = _fused()
    kernels = [n for n in g.nodes if n.op.name == "Kernel"]
    assert len(kernels) == 1 and kernels[0].op.kind == "qdepthwise"
    assert kernels[0].op.members() == ["DequantizeLinear", "Conv", "Clip", "QuantizeLinear"]
    assert [d.reason for d in p.decisions if d.fused] == ["qdepthwise"] * 3


# (image size, stride, padding, multiplier, images, dilation): a plane of 2x2 (tiny), 9x9 and 14x14
# (flat: one vector loop over the padded plane), 40x40 (rows: the padded copy dequantizes row by
# row), strided, unpadded, a channel multiplier of 2, two images, dilation 2
SHAPES = [(2, 1, 1, 1, 1, 1), (9, 1, 1, 1, 1, 1), (14, 2, 1, 1, 1, 1), (40, 1, 1, 1, 1, 1), (40, 2, 1, 1, 1, 1),
          (40, 1, 0, 1, 1, 1), (9, 1, 1, 2, 2, 1), (40, 2, 1, 1, 2, 2), (1, 1, 1, 1, 1, 1)]


@pytest.mark.parametrize("hw,stride,pad,mult,n,dil", SHAPES)
def test_numbers(hw, stride, pad, mult, n, dil):
    g, p, feeds, want = _fused(h=hw, w=hw, stride=stride, pad=pad, mult=mult, n=n, dil=dil)
    assert [n_.op.kind for n_ in g.nodes if n_.op.name == "Kernel"] == ["qdepthwise"]
    for t in (1, 2):
        _close(run_kernels(g, feeds, nthreads=t)["y"], want["y"])


@pytest.mark.parametrize("hw,stride,pad,mult,n,dil", [(40, 1, 1, 1, 1, 1), (40, 2, 1, 1, 1, 1), (40, 2, 1, 2, 2, 2)])
def test_numbers_by_strips(monkeypatch, hw, stride, pad, mult, n, dil):
    """Planes padded (and dequantized) and computed by strips of a few output rows
    (``DW_STRIP_BYTES``), the uint8 output stored per plane after them."""
    from compiler.codegen.kernels import conv as conv_lowering

    monkeypatch.setattr(conv_lowering, "DW_STRIP_BYTES", 3000)
    g, p, feeds, want = _fused(h=hw, w=hw, stride=stride, pad=pad, mult=mult, n=n, dil=dil)
    _, _, plan = build_kernels(g, host_target())
    notes = [x for _, k in plan if k is not None for x in k.notes]
    assert any("by strips of" in x for x in notes), notes
    for t in (1, 2):
        _close(run_kernels(g, feeds, nthreads=t)["y"], want["y"])


@pytest.mark.parametrize("regs", [True, False])
@pytest.mark.parametrize("hw,stride,pad,mult,n,dil", [(9, 1, 1, 2, 2, 1), (14, 2, 1, 1, 1, 1), (8, 1, 1, 1, 1, 2)])
def test_numbers_flat_in_registers_and_in_scratch(monkeypatch, regs, hw, stride, pad, mult, n, dil):
    """Small planes by the flat form, in registers (``dw_regs.py``: the dequantized plane loaded as
    whole vectors) or through scratch planes, whichever the host's vectors would pick."""
    from compiler.codegen.kernels import conv as conv_lowering

    monkeypatch.setattr(conv_lowering, "DW_REGS", regs)
    monkeypatch.setattr(conv_lowering, "DW_REG_OUTPUTS", 10 ** 6)
    monkeypatch.setattr(conv_lowering, "DW_REG_VECTORS", 10 ** 6)
    g, p, feeds, want = _fused(h=hw, w=hw, stride=stride, pad=pad, mult=mult, n=n, dil=dil)
    _, _, plan = build_kernels(g, host_target())
    notes = [x for _, k in plan if k is not None for x in k.notes]
    assert ("the padded plane and outputs in registers" in notes) == regs, notes
    for t in (1, 2):
        _close(run_kernels(g, feeds, nthreads=t)["y"], want["y"])


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("hw,stride", [(9, 1), (40, 2)])
def test_every_isa(cpu, hw, stride):
    target = target_for(cpu)
    g, _, feeds, want = _fused(h=hw, w=hw, stride=stride)
    _, _, plan = build_kernels(g, target)
    notes = [x for _, k in plan if k is not None for x in k.notes]
    assert any("between 8-bit tensors" in x for x in notes), notes
    if target.isa > host_target().isa:
        pytest.skip(f"this CPU lacks {cpu}'s instructions (the kernel was built above)")
    _close(run_kernels(g, feeds, target=target)["y"], want["y"])


@pytest.mark.parametrize("tail,members", [("quantize", ["DequantizeLinear", "Conv", "QuantizeLinear"]),
                                          ("relu-mul", ["DequantizeLinear", "Conv", "Relu", "Mul", "QuantizeLinear"]),
                                          ("none", ["DequantizeLinear", "Conv"])])
def test_chains(tail, members):
    g, p, feeds, want = _fused(tail=tail, h=12, w=12)
    kernels = [n for n in g.nodes if n.op.name == "Kernel"]
    assert [k.op.members() for k in kernels] == [members]
    _close(run_kernels(g, feeds)["y"], want["y"])


def test_int8_input():
    g, p, feeds, want = _fused(xt="i8", h=20, w=20, stride=2)
    assert [n.op.kind for n in g.nodes if n.op.name == "Kernel"] == ["qdepthwise"]
    _close(run_kernels(g, feeds)["y"], want["y"])


def test_refusals_name_the_reason():
    # the Add reads another tensor: the kernel ends at the conv, the Add and QuantizeLinear are a loop
    g, p, feeds, want = _fused(tail="residual", h=12, w=12)
    kinds = [n.op.kind for n in g.nodes if n.op.name == "Kernel"]
    assert kinds[0] == "qdepthwise" and g.nodes[[n.op.name for n in g.nodes].index("Kernel")].op.members() == \
        ["DequantizeLinear", "Conv"]
    assert [d.reason for d in p.decisions if d.producer.op.name == "Conv" and not d.fused] == \
        ["not in the depthwise kernel: Add reads a tensor besides its row (only one-element constants are "
         "compiled in)"]
    _close(run_kernels(g, feeds)["y"], want["y"])
    # not a depthwise conv (one group): the DequantizeLinear is computed by the loop before the conv
    text, weights, feeds = block(h=8, w=8)
    text = text.replace("group=6", "group=1").replace("f32[6,1,3,3]", "f32[6,6,3,3]")
    weights["wt"] = np.random.default_rng(0).standard_normal((6, 6, 3, 3)).astype(np.float32)
    g, p, feeds, want = fuse(text, weights, feeds=feeds)
    assert "qdepthwise" not in [n.op.kind for n in g.nodes if n.op.name == "Kernel"]
    _close(run_kernels(g, feeds)["y"], want["y"])


def test_a_quantizing_loop_before_leaves_the_dequantization_to_the_conv():
    """An elementwise chain ending in the QuantizeLinear before (a layer whose rescale is a loop of its
    own) stops there: the DequantizeLinear after it goes to the qdepthwise kernel, with the reason."""
    text = """graph @g(%x: f32[1,6,9,9]) -> (y: u8[1,6,9,9]) {
  %k = const f32[] dense<0.5>
  %s = const f32[] dense<0.05>
  %z = const u8[] dense<7>
  %wt = const f32[6,1,3,3]
  %sy = const f32[] dense<0.03>
  %zy = const u8[] dense<0>
  %0 = Mul(%x, %k) : f32[1,6,9,9]
  %1 = QuantizeLinear(%0, %s, %z) : u8[1,6,9,9]
  %2 = DequantizeLinear(%1, %s, %z) : f32[1,6,9,9]
  %3 = Conv(%2, %wt) {group=6, kernel_shape=[3, 3], pads=[1, 1, 1, 1]} : f32[1,6,9,9]
  %4 = QuantizeLinear(%3, %sy, %zy) : u8[1,6,9,9]
  return y=%4
}"""
    weights = {"wt": (np.random.default_rng(3).standard_normal((6, 1, 3, 3)) * 0.4).astype(np.float32)}
    g, p, feeds, want = fuse(text, weights, feeds={"x": np.random.default_rng(4).standard_normal((1, 6, 9, 9))
                                                   .astype(np.float32) * 4})
    kernels = [n for n in g.nodes if n.op.name == "Kernel"]
    assert [(k.op.kind, k.op.members()) for k in kernels] == [
        ("elementwise", ["Mul", "QuantizeLinear"]),
        ("qdepthwise", ["DequantizeLinear", "Conv", "QuantizeLinear"])]
    assert any(d.reason == "the dequantized value is computed in the depthwise convolution reading it"
               for d in p.decisions if not d.fused)
    _close(run_kernels(g, feeds)["y"], want["y"])


def test_empty_images_are_left_to_the_empty_lowering():
    """No images (a size-0 batch): the conv refuses empty tensors, so no qdepthwise kernel forms and
    the empty result is still the interpreter's."""
    g, p, feeds, want = _fused(n=0, h=9, w=9)
    assert "qdepthwise" not in [n.op.kind for n in g.nodes if n.op.name == "Kernel"]
    got = run_kernels(g, feeds)["y"]
    assert got.shape == want["y"].shape == (0, 6, 9, 9)


def test_a_chain_op_may_read_the_result_as_its_second_operand():
    text, weights, feeds = block(tail="relu-mul", h=12, w=12)
    g, p, feeds, want = fuse(text.replace("Mul(%4, %two)", "Mul(%two, %4)"), weights, feeds=feeds)
    assert [k.op.members() for k in g.nodes if k.op.name == "Kernel"] == [
        ["DequantizeLinear", "Conv", "Relu", "Mul", "QuantizeLinear"]]
    _close(run_kernels(g, feeds)["y"], want["y"])


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("hw,stride,pad,flat,n,c", [(40, 2, 1, False, 2, 3), (41, 2, 1, False, 1, 1),
                                                     (66, 2, 0, False, 1, 3), (9, 2, 1, False, 1, 3),
                                                     (20, 2, 1, False, 1, 3), (14, 2, 1, True, 2, 3),
                                                     (9, 1, 1, True, 1, 1), (37, 1, 1, False, 1, 3)])
def test_dequantized_on_explicit_vectors(monkeypatch, cpu, hw, stride, pad, flat, n, c):
    """The DequantizeLinear on explicit vectors (``RowChain.vector``): each uint8 row of a width
    stride 2 split into both phases and dequantized a pair of vectors at a time, the last pair
    overlapping the one before (``_pad_plane_pairs``; widths with no whole vector, a few, an odd
    one, no padding; two images, one channel), and the flat form's planes in registers converted as
    loaded (``dw_regs.py``):
    bit for bit the row function's results (that path forced by refusing the vector form), on
    every ISA's vectors the host runs."""
    from compiler.codegen.kernels import conv as conv_lowering
    from compiler.codegen.kernels.tile_epilogue import RowChain

    target = target_for(cpu)
    if target.isa > host_target().isa:
        pytest.skip(f"this CPU lacks {cpu}'s instructions")
    monkeypatch.setattr(conv_lowering, "DW_FLAT_SPAN", 10 ** 6 if flat else 0)
    monkeypatch.setattr(conv_lowering, "DW_TINY_PIXELS", 0)
    monkeypatch.setattr(conv_lowering, "DW_REG_OUTPUTS", 10 ** 6)
    monkeypatch.setattr(conv_lowering, "DW_REG_VECTORS", 10 ** 6)
    g, _, feeds, want = _fused(h=hw, w=hw, stride=stride, pad=pad, n=n, c=c)
    vec = run_kernels(g, feeds, target=target)["y"]
    _close(vec, want["y"])
    monkeypatch.setattr(RowChain, "vector_reason", lambda self, outputs: "refused here")
    np.testing.assert_array_equal(vec, run_kernels(g, feeds, target=target)["y"])


@pytest.mark.parametrize("cpu", CPUS)
def test_flat_rows_copied_out_in_vectors(monkeypatch, cpu):
    """The flat form through scratch copies each output row out of its wide plane in vectors of a
    whole, half or quarter vector (of at least 2 floats), the last overlapping (``conv._copy_row``),
    narrower rows by LLVM's loop: rows 2 to 32 wide (and a one-row image) on every ISA the host runs (AVX-512, AVX2, SSE:
    vectors of 16, 8 or 4 floats)."""
    from compiler.codegen.kernels import conv as conv_lowering

    if target_for(cpu).isa > host_target().isa:
        pytest.skip(f"this CPU lacks {cpu}'s instructions")
    monkeypatch.setattr(conv_lowering, "DW_REGS", False)
    for h, w in ((9, 2), (1, 32), (4, 4), (5, 6), (7, 8), (9, 10), (16, 16), (17, 18), (28, 28), (31, 32)):
        g, p, feeds, want = _fused(h=h, w=w, c=3, n=2)
        _, _, plan = build_kernels(g, target_for(cpu))
        notes = [x for _, k in plan if k is not None for x in k.notes]
        assert "the padded plane and outputs in registers" not in notes
        _close(run_kernels(g, feeds, target=target_for(cpu))["y"], want["y"])
