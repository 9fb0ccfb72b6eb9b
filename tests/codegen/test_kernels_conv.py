"""Conv lowering against the reference interpreter (many kernels per compiled graph)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.kernels import KernelGroup, lowering_for
from compiler.codegen.llvm.target import host_target
from compiler.codegen.program import build_program
from compiler.ir.graph import Graph
from compiler.ir.ops import conv as cv
from compiler.ir.types import DType, TensorType

from compiler.codegen.kernels.testing import run_kernels
from compiler.ir.interpreter import interpret

from .test_kernels_linalg import Bench

#: (these tests are of the GEMM paths)
pytestmark = pytest.mark.usefixtures("gemm_conv_paths")


def conv(t: Bench, x_shape, m, k, group=1, bias=True, const_w=True, **attrs):
    x = t.input(*x_shape)
    c = x_shape[1]
    wshape = (m, c // group) + tuple(k)
    w = t.const(*wshape) if const_w else t.input(*wshape)
    b = (t.const(m) if const_w else t.input(m)) if bias else None
    t.add(cv.Conv(group=group, **attrs), x, w, b)


def check_on(t: Bench, target, cpu: str) -> None:
    """``t``'s kernels compiled for ``target`` against the interpreter on 1 to 3 threads, where the
    host runs that code (else the test is skipped, saying so)."""
    if target.isa > host_target().isa:
        pytest.skip(f"compiled for {cpu}; this CPU lacks its instructions to run it")
    want = interpret(t.g, t.feed)
    for threads in (1, 2, 3):
        got = run_kernels(t.g, t.feed, target=target, nthreads=threads)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4,
                                       atol=1e-4 * max(1.0, np.abs(want[name]).max()), err_msg=name)


@pytest.mark.parametrize("task_budget", [None, 0])
def test_conv_gemm_paths(monkeypatch, task_budget):
    """Every GEMM path; images x groups whose GEMMs are small run as parallel tasks when they fit
    the thread count, each with its own scratch (``task_budget`` 0: no room for the copies, so in
    sequence)."""
    from compiler.codegen.kernels import conv as conv_lowering

    if task_budget is not None:
        monkeypatch.setattr(conv_lowering, "TASK_SCRATCH_BUDGET", task_budget)
    t = Bench()
    # 1x1 stride 1 (GEMM on the input), with/without bias, batch 2, groups
    conv(t, (1, 16, 7, 9), 24, (1, 1))
    conv(t, (2, 8, 5, 5), 12, (1, 1), bias=False)
    conv(t, (2, 12, 6, 5), 9, (1, 1), group=3)
    conv(t, (1, 6, 4, 4), 5, (1, 1), const_w=False)
    # 1x1 with stride / padding (im2col)
    conv(t, (1, 8, 9, 9), 16, (1, 1), strides=(2, 2))
    conv(t, (1, 4, 5, 6), 3, (1, 1), pads=(1, 0, 0, 2))
    # 3x3 pad 1, odd sizes, strides, dilations, asymmetric pads
    conv(t, (1, 5, 11, 13), 7, (3, 3), pads=(1, 1, 1, 1))
    conv(t, (2, 3, 10, 9), 8, (3, 3), pads=(1, 1, 1, 1), strides=(2, 2))
    conv(t, (1, 4, 12, 12), 6, (3, 3), dilations=(2, 2), pads=(2, 2, 2, 2), bias=False)
    conv(t, (1, 3, 9, 14), 5, (3, 2), pads=(0, 2, 1, 0), strides=(1, 3))
    conv(t, (1, 3, 17, 17), 8, (7, 7), pads=(3, 3, 3, 3), strides=(2, 2))
    conv(t, (1, 2, 8, 8), 4, (5, 5), auto_pad="SAME_UPPER", strides=(2, 2))
    conv(t, (1, 2, 7, 8), 4, (4, 4), auto_pad="SAME_LOWER")
    conv(t, (1, 2, 6, 6), 3, (3, 3), auto_pad="VALID", const_w=False)
    conv(t, (1, 3, 4, 4), 2, (5, 5), pads=(3, 3, 3, 3), strides=(3, 3))   # windows mostly padding
    conv(t, (1, 1, 6, 6), 4, (3, 3), pads=(1, 1, 1, 1))                  # one input channel
    # grouped (ShuffleNet / ResNeXt style)
    conv(t, (1, 12, 8, 8), 6, (3, 3), group=3, pads=(1, 1, 1, 1))
    conv(t, (2, 8, 7, 7), 8, (3, 3), group=2, pads=(1, 1, 1, 1), strides=(2, 2), const_w=False)
    # few pixels, many channels: computed as Y^T = col^T @ W^T (res5-like)
    conv(t, (2, 32, 3, 3), 64, (3, 3), pads=(1, 1, 1, 1))
    conv(t, (1, 24, 7, 7), 48, (1, 1))
    conv(t, (1, 16, 7, 7), 48, (1, 1), bias=False, const_w=False)
    conv(t, (1, 16, 5, 5), 96, (3, 3), group=2, strides=(2, 2), pads=(1, 1, 1, 1))
    conv(t, (1, 64, 2, 2), 128, (3, 3), pads=(1, 1, 1, 1))  # one image, 2x2 map: transposed too
    conv(t, (1, 32, 4, 4), 64, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), bias=False)
    # 1-D (as 2-D of height 1): plain, strided/dilated/padded, depthwise
    conv(t, (2, 6, 19), 5, (3,), pads=(1, 2))
    conv(t, (1, 4, 23), 8, (5,), strides=(2,), dilations=(2,), pads=(3, 1))
    conv(t, (1, 6, 17), 6, (7,), group=6, pads=(3, 3))
    t.run()


@pytest.mark.parametrize("col_budget,table_width", [(None, 8), (None, 0), (3000, 8)])
def test_conv_im2col_stride_pad_sweep(monkeypatch, col_budget, table_width):
    """Regression (issue 21): with two images, strides (2, 1) and pads summing to KW - 1 (output
    width = input width) im2col copied the window as one run of the plane, right only for a height
    stride of 1. Every stride/pad/dilation pair of a small grid, several images (im2col), also by
    row blocks; the outputs (at most 7 wide) gathered through the index table, and (``table_width``
    0) by run-by-run copies."""
    from compiler.codegen.kernels import conv as conv_lowering
    from compiler.codegen.kernels import im2col as im2col_module

    if col_budget is not None:
        monkeypatch.setattr(conv_lowering, "COL_BUDGET", col_budget)
    monkeypatch.setattr(im2col_module, "TABLE_WIDTH", table_width)
    t = Bench()
    for sh in (1, 2, 3):
        for sw in (1, 2):
            for (pl, pr) in ((0, 0), (1, 1), (0, 2), (2, 0)):
                for dh in (1, 2):
                    conv(t, (2, 2, 9, 7), 3, (3, 3), strides=(sh, sw), dilations=(dh, 1),
                         pads=(1, pl, 0, pr), bias=(sh + sw) % 2 == 0)
    t.run()


def test_conv_im2col_table():
    """A narrow output's col matrix is one gather through a compile-time index table: structure
    (the note; not for a wide output or past the table's size) and numbers, on several images and
    groups, strides, dilations, uneven pads and a 1-D conv."""
    from compiler.codegen.kernels import im2col as im2col_module
    from compiler.codegen.kernels.testing import build_kernels

    t = Bench()
    # (weights as inputs: with constant ones, maps of at most 16 pixels take the direct kernel)
    conv(t, (1, 128, 2, 2), 64, (3, 3), pads=(1, 1, 1, 1), const_w=False)        # transposed GEMM
    conv(t, (1, 64, 4, 4), 128, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), const_w=False)  # strided
    conv(t, (3, 8, 5, 6), 12, (3, 2), group=2, strides=(1, 2), dilations=(2, 1), pads=(2, 0, 1, 1))
    conv(t, (2, 4, 9), 6, (3,), strides=(2,), pads=(2, 1), bias=False, const_w=False)  # 1-D: 5 wide
    conv(t, (2, 4, 16, 16), 6, (3, 3), pads=(1, 1, 1, 1))                        # 16 wide: copies
    conv(t, (2, 16, 4, 4), 64, (3, 3), pads=(1, 1, 1, 1), const_w=False)  # 16 pixels: A in several panels
    conv(t, (3, 24, 2, 3), 40, (3, 3), pads=(1, 1, 1, 1), bias=False, const_w=False)  # 6 pixels, 3 images
    conv(t, (2, 32, 1, 1), 64, (3, 3), pads=(1, 1, 1, 1), const_w=False)         # one pixel, 2 images
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, host_target())
    tabled = [any("index table" in note for note in k.notes) for _, k in plan]
    assert tabled == [True, True, True, True, False, True, True, True], [k.notes for _, k in plan]
    # transposed with a table: the gather writes the GEMM's packed A (whatever the host's MR and NR)
    for _, k in plan:
        trans = any("transposed GEMM" in note for note in k.notes)
        assert trans == any("as the GEMM's packed A" in note for note in k.notes), k.notes
    assert not im2col_module.table_applies(9 * 512, 7, 49)  # ResNet-50's 7x7 maps: the table too big
    t.run()


def test_conv_packed_cols():
    """One image: the GEMM asks the conv for each block of the col matrix, packed straight from the
    padded input (``packed_cols.py``); panels straddle two output rows, or several when rows are
    narrower than a panel, the last one is partial, strided and dilated windows read column-phase
    planes; blocks of several K depths and column ranges."""
    t = Bench()
    conv(t, (1, 5, 10, 30), 7, (3, 3), pads=(1, 1, 1, 1))                 # 300 pixels: a partial panel
    conv(t, (1, 3, 7, 24), 4, (3, 3), pads=(1, 1, 1, 1), bias=False)     # rows exactly 24 wide
    conv(t, (1, 4, 6, 27), 6, (5, 5), pads=(2, 1, 1, 3))                 # asymmetric padding
    conv(t, (1, 2, 9, 40), 3, (1, 3), pads=(0, 1, 0, 1), const_w=False)  # weights an input
    conv(t, (1, 6, 8, 26), 5, (3, 3))                                    # no padding: 6 x 24
    conv(t, (1, 16, 33, 33), 40, (3, 3), pads=(1, 1, 1, 1))              # several threads' panels
    conv(t, (1, 5, 14, 14), 8, (3, 3), pads=(1, 1, 1, 1))                # 14-wide rows: 3 per panel
    conv(t, (1, 4, 7, 7), 6, (3, 3), pads=(1, 1, 1, 1))                  # 7-wide: 5 rows per panel
    conv(t, (1, 2, 5, 3), 3, (3, 3), pads=(1, 1, 1, 1), bias=False)      # 3-wide: a panel holds them all
    conv(t, (1, 3, 31, 33), 8, (7, 7), pads=(3, 3, 3, 3), strides=(2, 2))  # strided: column phases
    conv(t, (1, 4, 20, 29), 6, (3, 3), pads=(1, 0, 2, 1), strides=(3, 2))  # odd strides, asymmetric
    conv(t, (1, 3, 18, 30), 5, (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2))  # dilated
    conv(t, (1, 8, 14, 14), 16, (1, 1), strides=(2, 2))                    # 1x1 strided
    conv(t, (1, 40, 20, 61), 8, (3, 3), pads=(1, 1, 1, 1))                  # K 360, N 1220: 2 x 2 blocks
    t.g.set_outputs(t.outs)
    ll = build_program(t.g, host_target()).llvm_ir
    assert "kiln_pack_cols" in ll and "kiln_sgemm_cb" in ll  # (the path is taken)
    t.run()


@pytest.mark.parametrize("cpu", ["x86-64-v3", "skylake-avx512"])
def test_conv_packer_reads_input(cpu):
    """Small convs of width stride 1 or 2 have no padded copy of their input (the calling thread
    made it alone while the others waited): the packer reads the input, the lanes of each output
    row masked to the window's columns inside it, padding rows none (``_direct_packer``; stride 2:
    the even floats of two masked loads). Structure
    (the note, no scratch, no call of memmove) on AVX2 and AVX-512 code; numbers, where the host
    runs that code, on 1 to 3 threads: pads of 0 to 2 on each side, dilations, height strides,
    panels over 2 to 5 output rows and partial, K in two blocks (a block starting inside a
    channel's taps), weights as an input."""
    from compiler.codegen.gemm.config import model_config
    from compiler.codegen.kernels.packed_cols import reads_input
    from compiler.codegen.kernels.testing import build_kernels
    from compiler.codegen.llvm import toolchain
    from compiler.codegen.llvm.target import target_for

    t = Bench()
    conv(t, (1, 16, 16, 16), 16, (3, 3), pads=(1, 1, 1, 1))                # ResNet-18@64's layer 1
    conv(t, (1, 32, 12, 12), 20, (3, 3), pads=(1, 1, 1, 1))                # K 288: two blocks
    conv(t, (1, 3, 9, 10), 5, (3, 3), pads=(2, 0, 1, 2), bias=False)       # asymmetric, 2-wide pads
    conv(t, (1, 4, 11, 13), 6, (5, 5), pads=(2, 2, 2, 2), dilations=(2, 1))  # dilated rows
    conv(t, (1, 5, 13, 9), 7, (3, 3), pads=(1, 1, 1, 1), strides=(2, 1))   # height stride 2
    conv(t, (1, 6, 10, 40), 8, (3, 3), pads=(0, 1, 0, 1), const_w=False)   # rows wider than a panel
    conv(t, (1, 2, 10, 10), 3, (3, 3))                                      # no padding at all
    conv(t, (1, 3, 7, 9), 4, (1, 7), pads=(0, 3, 0, 3))                     # one row of taps
    conv(t, (1, 64, 4, 4), 64, (3, 3), pads=(1, 1, 1, 1), const_w=False)    # 9 pieces, one panel
    conv(t, (1, 40, 3, 6), 48, (3, 3), pads=(1, 0, 1, 2), bias=False)      # one panel, 6 wide
    conv(t, (1, 3, 64, 64), 16, (7, 7), pads=(3, 3, 3, 3), strides=(2, 2))  # ResNet-18@64's stem
    conv(t, (1, 16, 16, 16), 32, (1, 1), strides=(2, 2), bias=False)       # its downsampling 1x1/2
    conv(t, (1, 5, 11, 13), 6, (3, 3), pads=(0, 2, 1, 1), strides=(3, 2), dilations=(1, 2))  # odd sizes
    conv(t, (1, 4, 9, 40), 8, (3, 5), pads=(1, 1, 1, 3), strides=(1, 2))   # rows wider than a panel
    conv(t, (1, 16, 1, 16), 8, (3, 3), pads=(1, 1, 1, 1), const_w=False)    # one row: two of taps pad
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    target = target_for(cpu)
    module, _, plan = build_kernels(t.g, target)
    nr = model_config(target).NR
    for node, (_, k) in zip(t.g.nodes, plan):
        n, c, h, w = node.inputs[0].shape
        kh, kw = node.inputs[1].shape[2:]
        oh, ow = node.outputs[0].shape[2:]
        (sh, sw), (dh, dw) = node.op.strides or (1, 1), node.op.dilations or (1, 1)
        assert reads_input(c, kh, kw, oh, ow, sh, sw, dh, dw, nr), node.describe()
        assert "the packer reads the input: no padded copy" in k.notes, k.notes
        # pixels in one panel, channels for two tasks at least: the threads pack the panel first
        one_panel = oh * ow <= nr and node.outputs[0].shape[1] >= 2 * model_config(target).MR
        assert one_panel == ("B's one panel packed by the threads before the GEMM" in k.notes), k.notes
    asm = toolchain.assembly(str(module), target)
    assert "memmove" not in asm and "memcpy" not in asm and "kiln_pad_planes" not in asm
    assert not reads_input(64, 3, 3, 56, 56, 1, 1, 1, 1, nr)   # big planes: padded by the threads
    assert not reads_input(16, 3, 3, 16, 16, 1, 3, 1, 1, nr)   # width stride 3: phase planes
    assert not reads_input(128, 3, 3, 2, 2, 1, 1, 1, 1, nr)    # 2 wide: the transposed GEMM's path
    check_on(t, target, cpu)


def test_conv_depthwise():
    t = Bench()
    conv(t, (1, 8, 12, 12), 8, (3, 3), group=8, pads=(1, 1, 1, 1))
    conv(t, (2, 6, 13, 11), 6, (3, 3), group=6, pads=(1, 1, 1, 1), strides=(2, 2))
    conv(t, (1, 4, 9, 9), 4, (3, 3), group=4, bias=False)                 # no padding: in place
    conv(t, (1, 4, 10, 10), 4, (5, 5), group=4, pads=(2, 2, 2, 2), dilations=(2, 2))
    conv(t, (1, 3, 7, 9), 6, (3, 3), group=3, pads=(0, 1, 2, 1))          # channel multiplier 2
    conv(t, (1, 5, 8, 8), 5, (3, 3), group=5, auto_pad="SAME_UPPER", strides=(2, 2), const_w=False)
    conv(t, (1, 4, 9, 9), 4, (1, 1), group=4, strides=(2, 2))
    t.run()


def test_conv_depthwise_tiny_maps():
    """Maps of at most 16 output pixels (EfficientNet's last stages at 32x32: 2x2) are computed
    pixel by pixel over each pixel's in-bounds taps, reading the input in place: structure (the
    note) and numbers, with padding on every side, strides, dilations, a channel multiplier, two
    images and 1x1 maps; weights as an input (which might not be finite: a NaN weight over the
    padding makes NaN) take the padded planes."""
    from compiler.codegen.kernels.testing import build_kernels

    t = Bench()
    conv(t, (1, 480, 2, 2), 480, (3, 3), group=480, pads=(1, 1, 1, 1))          # EfficientNet-B0@32
    conv(t, (1, 240, 4, 4), 240, (3, 3), group=240, pads=(1, 1, 1, 1), strides=(2, 2))
    conv(t, (2, 16, 1, 1), 16, (5, 5), group=16, pads=(2, 2, 2, 2))              # one pixel, 2 images
    conv(t, (0, 8, 2, 2), 8, (3, 3), group=8, pads=(1, 1, 1, 1))                 # no image
    conv(t, (3, 8, 2, 2), 8, (3, 3), group=8, pads=(1, 1, 1, 1))                 # 3 images
    conv(t, (1, 8, 3, 5), 8, (3, 3), group=8, pads=(0, 2, 1, 0), dilations=(1, 2), bias=False)
    conv(t, (1, 3, 4, 4), 6, (3, 3), group=3, pads=(1, 1, 1, 1))                 # multiplier 2, 16 px
    conv(t, (1, 4, 2, 3), 4, (3, 3), group=4, pads=(1, 1, 1, 1), const_w=False)  # weights an input
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, host_target())
    for node, (_, k) in zip(t.g.nodes, plan):
        want = ("every result is empty: nothing to compute" if node.outputs[0].shape[0] == 0 else
                "depthwise: direct loop on padded planes" if node.inputs[1].const is None else
                "depthwise: each pixel over its in-bounds taps, unrolled (a tiny map)")
        assert want in k.notes, k.notes
    t.run()


@pytest.mark.parametrize("cpu", ["host", "znver3"])
@pytest.mark.parametrize("form", ["rows", "flat", "registers"])
def test_conv_depthwise_flat_and_rows(monkeypatch, form, cpu):
    """The forms of a depthwise plane on the same shapes: row by row, as one flat loop of vectors
    spanning rows over a padded scratch plane split by row and column phase (the last vector reads
    into slack past it), and the same flat form in registers (``dw_regs.py``: every padded vector a
    shuffle of the input vectors, every vector of Y one of the outputs; here on every plane, however
    large): strides 1-3 in either axis, dilations, uneven pads and pads wider than the kernel, a
    channel multiplier, two images, a wide kernel on a narrow output (a vector of Y from three
    output vectors), planes that are and are not a multiple of a vector (the last plane's last
    vector read masked), the host's vectors and AVX2's."""
    from compiler.codegen.kernels import conv as conv_lowering
    from compiler.codegen.kernels.testing import build_kernels
    from compiler.codegen.llvm.target import target_for

    target = host_target() if cpu == "host" else target_for(cpu)
    if not target.isa <= host_target().isa:
        pytest.skip(f"compiled for {cpu}; this CPU lacks its instructions to run it")
    monkeypatch.setattr(conv_lowering, "DW_FLAT_SPAN", 0 if form == "rows" else 10 ** 6)
    monkeypatch.setattr(conv_lowering, "DW_REGS", form == "registers")
    monkeypatch.setattr(conv_lowering, "DW_REG_OUTPUTS", 10 ** 6)
    monkeypatch.setattr(conv_lowering, "DW_REG_VECTORS", 10 ** 6)
    monkeypatch.setattr(conv_lowering, "DW_TINY_PIXELS", 0)  # (the 15- and 1-pixel maps too)
    t = Bench()
    for (sh, sw) in ((1, 1), (2, 2), (3, 1), (1, 2), (2, 3), (1, 3)):
        conv(t, (1, 3, 11, 13), 3, (3, 3), group=3, strides=(sh, sw), pads=(1, 0, 2, 1))
    conv(t, (2, 4, 14, 14), 4, (3, 3), group=4, pads=(1, 1, 1, 1), bias=False)
    conv(t, (1, 4, 10, 9), 4, (5, 5), group=4, pads=(2, 2, 2, 2), dilations=(2, 1), strides=(2, 2))
    conv(t, (1, 3, 7, 7), 6, (3, 3), group=3, pads=(1, 1, 1, 1))             # channel multiplier 2
    conv(t, (1, 2, 16, 16), 2, (3, 3), group=2)                              # no padding
    conv(t, (1, 5, 1, 1), 5, (3, 3), group=5, pads=(1, 1, 1, 1))            # one pixel
    conv(t, (1, 6, 23), 6, (7,), group=6, pads=(3, 3))                       # 1-D
    conv(t, (1, 2, 9, 3), 2, (3, 7), group=2, pads=(1, 3, 1, 3))             # 3 wide, rows 9 apart
    conv(t, (1, 2, 6, 5), 2, (3, 3), group=2, pads=(4, 0, 0, 5))             # pads wider than the kernel
    conv(t, (1, 7, 7, 7), 7, (3, 3), group=7, pads=(1, 1, 1, 1), strides=(2, 2))
    conv(t, (3, 2, 7, 7), 2, (3, 3), group=2, pads=(1, 1, 1, 1))             # three images
    conv(t, (0, 4, 7, 7), 4, (3, 3), group=4, pads=(1, 1, 1, 1))             # no image: the empty lowering
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, target)
    assert [("the padded plane and outputs in registers" in k.notes) for _, k in plan] == \
        [form == "registers"] * (len(plan) - 1) + [False], [k.notes for _, k in plan]
    got, want = run_kernels(t.g, t.feed, target=target), interpret(t.g, t.feed)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4,
                                   atol=1e-4 * max(1.0, np.abs(want[name]).max(initial=0.0)))


def test_conv_depthwise_in_registers_where_it_pays():
    """Which flat planes take the register form (``DW_REG_OUTPUTS``, ``DW_REG_VECTORS``): with
    AVX-512's 16 lanes MobileNetV2's 7x7 and 14x14 planes and its 28x28 stride-2 one, not the 28x28
    stride-1 one (53 output vectors); with AVX2's 8 lanes the 7x7 ones and the 14x14 stride-2 one
    only. The kernels are built, not run (either ISA)."""
    from compiler.codegen.kernels.testing import build_kernels
    from compiler.codegen.llvm.target import target_for

    for cpu, want in (("znver4", [True, True, True, True, False]), ("znver3", [True, False, True, False, False])):
        t = Bench()
        for (hw, s) in ((7, 1), (14, 1), (14, 2), (28, 2), (28, 1)):
            conv(t, (1, 8, hw, hw), 8, (3, 3), group=8, pads=(1, 1, 1, 1), strides=(s, s))
        t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
        _, _, plan = build_kernels(t.g, target_for(cpu))
        assert [("the padded plane and outputs in registers" in k.notes) for _, k in plan] == want, cpu


@pytest.mark.parametrize("cpu", ["host", "znver3"])
@pytest.mark.parametrize("pairs", [True, False])
def test_conv_depthwise_by_strips(monkeypatch, pairs, cpu):
    """Planes padded and computed by strips of output rows (``DW_STRIP_BYTES``; here a few rows,
    so most planes have several strips and a shorter last one), the width-stride-2 rows split into
    both phases in one pass (``PAD_PAIRS``, vectors of the host's width and of AVX2's) or phase by
    phase: strides 1-3 in either axis, dilations, pads on every side (none, uneven, wider than the
    kernel), a channel multiplier, two images, rows wide enough for whole vector pairs and odd
    widths; against the reference."""
    from compiler.codegen.kernels import conv as conv_lowering
    from compiler.codegen.kernels import im2col
    from compiler.codegen.kernels.testing import build_kernels
    from compiler.codegen.llvm.target import target_for

    target = host_target() if cpu == "host" else target_for(cpu)
    if not target.isa <= host_target().isa:
        pytest.skip(f"compiled for {cpu}; this CPU lacks its instructions to run it")

    monkeypatch.setattr(conv_lowering, "DW_STRIP_BYTES", 9000)
    monkeypatch.setattr(im2col, "PAD_PAIRS", pairs)
    t = Bench()
    for (sh, sw) in ((1, 1), (2, 2), (3, 1), (1, 2), (2, 3)):
        conv(t, (1, 3, 29, 83), 3, (3, 3), group=3, strides=(sh, sw), pads=(1, 0, 2, 1))
    conv(t, (1, 4, 40, 80), 4, (3, 3), group=4, pads=(1, 1, 1, 1), strides=(2, 2))       # pairs of vectors
    conv(t, (2, 4, 37, 71), 4, (3, 3), group=4, pads=(1, 1, 1, 1), bias=False)
    conv(t, (1, 4, 30, 67), 4, (5, 5), group=4, pads=(2, 2, 2, 2), dilations=(2, 1), strides=(2, 2))
    conv(t, (1, 3, 41, 64), 6, (3, 3), group=3, pads=(1, 1, 1, 1), strides=(2, 2))      # multiplier 2
    conv(t, (1, 2, 25, 66), 2, (3, 3), group=2, pads=(0, 4, 5, 0), strides=(2, 2))      # wide pads
    conv(t, (1, 2, 39, 64), 2, (3, 3), group=2, strides=(2, 2))                         # no padding
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, target)
    stripped = [any("by strips of" in n for n in k.notes) for _, k in plan]
    assert all(stripped), [k.notes for _, k in plan]
    # rows so wide that a strip would pad more of its neighbours' rows than half its own: none
    wide = Bench()
    conv(wide, (1, 2, 9, 600), 2, (3, 3), group=2, pads=(1, 1, 1, 1))
    conv(wide, (1, 2, 9, 600), 2, (3, 3), group=2, pads=(1, 1, 1, 1), strides=(2, 2))
    _, _, plan = build_kernels(wide.g, target)
    assert [any("by strips of" in n for n in k.notes) for _, k in plan] == [False, True], [k.notes for _, k in plan]
    got, want = run_kernels(t.g, t.feed, target=target), interpret(t.g, t.feed)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want[name]).max()))


def test_conv_refusals():
    g = Graph("r")
    x1 = g.add_input("x1", TensorType(DType.f32, (1, 2, 5, 5, 5)))
    y1 = g.add(cv.Conv(), x1, g.add_constant(np.ones((3, 2, 3, 3, 3), np.float32)))
    x2 = g.add_input("x2", TensorType(DType.f64, (1, 2, 5, 5)))
    y2 = g.add(cv.Conv(), x2, g.add_constant(np.ones((3, 2, 3, 3))))
    x3 = g.add_input("x3", TensorType(DType.f32, ("N", 2, 5, 5)))
    y3 = g.add(cv.Conv(), x3, g.add_constant(np.ones((3, 2, 3, 3), np.float32)))
    for v, words in ((y1, "3-D"), (y2, "f64"), (y3, "static")):
        low, why = lowering_for(KernelGroup.of([v.producer]))
        assert low is None and words in why, why


def test_conv_im2col_by_row_blocks(monkeypatch):
    from compiler.codegen.kernels import conv as conv_lowering

    monkeypatch.setattr(conv_lowering, "COL_BUDGET", 3000)  # a few output rows per block
    t = Bench()
    conv(t, (1, 3, 13, 11), 5, (3, 3), pads=(1, 1, 1, 1))
    conv(t, (2, 4, 12, 12), 6, (3, 3), pads=(2, 1, 0, 1), strides=(2, 1), bias=False)
    conv(t, (1, 2, 17, 16), 4, (7, 7), pads=(3, 3, 3, 3), strides=(2, 2), dilations=(1, 1))
    conv(t, (1, 2, 9, 9), 4, (3, 3), pads=(4, 1, 5, 1), dilations=(2, 1), group=2)
    conv(t, (1, 3, 4, 4), 2, (5, 5), pads=(3, 3, 3, 3), strides=(3, 3))
    t.run()


def test_conv_parallel_paths():
    """Shapes big enough that im2col, the bias fill and depthwise planes run split among threads."""
    t = Bench()
    conv(t, (1, 16, 40, 40), 24, (3, 3), pads=(1, 1, 1, 1))                          # im2col by channels
    conv(t, (1, 12, 41, 43), 16, (3, 3), pads=(1, 1, 1, 1), strides=(2, 2))           # phased, by channels
    conv(t, (1, 3, 64, 64), 8, (7, 7), pads=(3, 3, 3, 3), strides=(2, 2), bias=False)  # stem-like
    conv(t, (2, 16, 36, 36), 64, (1, 1))                                               # bias fill, 2 images
    conv(t, (1, 40, 38, 38), 40, (3, 3), group=40, pads=(1, 1, 1, 1))                 # depthwise planes
    conv(t, (2, 24, 33, 33), 48, (3, 3), group=24, pads=(1, 1, 1, 1), strides=(2, 2))  # multiplier 2, batch 2
    conv(t, (1, 96, 30, 30), 96, (3, 3), group=96)                                     # unpadded, in place
    conv(t, (2, 32, 30, 30), 64, (3, 3), pads=(1, 1, 1, 1))                  # images in sequence, parallel GEMMs
    conv(t, (1, 64, 24, 24), 64, (3, 3), group=2, pads=(1, 1, 1, 1), strides=(1, 2))  # groups in sequence
    t.run()


def test_strided_1x1_subsamples_then_multiplies():
    """A strided 1x1 conv without padding, one image and group, on planes too big for the packer to
    read itself: the pixels it reads are subsampled into a [C, OH*OW] matrix, then one GEMM (no
    padded phase planes); with padding, or planes the packer reads, the other paths."""
    from compiler.codegen.kernels.testing import build_kernels

    t = Bench()
    conv(t, (1, 32, 40, 40), 24, (1, 1), strides=(2, 2))                 # ResNet's downsampling
    conv(t, (1, 24, 41, 39), 16, (1, 1), strides=(2, 2), bias=False)     # odd sizes: the last row/column read
    conv(t, (1, 40, 45, 34), 8, (1, 1), strides=(3, 2))                  # unequal strides
    conv(t, (1, 32, 40, 40), 24, (1, 1), strides=(2, 2), pads=(1, 1, 1, 1))  # padding: not this path
    conv(t, (1, 16, 16, 16), 32, (1, 1), strides=(2, 2))                 # small: the packer reads the input
    conv(t, (1, 1, 200, 150), 1, (1, 1), strides=(2, 2))                  # one channel in and out
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    _, _, plan = build_kernels(t.g, host_target())
    subsampled = ["1x1 strided: the pixels subsampled, then a GEMM on them" in k.notes for _, k in plan]
    assert subsampled == [True, True, True, False, False, True], [k.notes for _, k in plan]
    want = interpret(t.g, t.feed)
    for threads in (1, 2, 3):
        got = run_kernels(t.g, t.feed, nthreads=threads)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want[name]).max()))


def test_a_few_panels_are_packed_first():
    """One image and group whose pixels fill a few of the GEMM's panels (at most ``PREPACK_PANELS``;
    13x13 and 12x13 maps fill 8 or fewer at AVX2's or AVX-512's NR, 24 or 32): the threads pack all panels of the col
    matrix first and the GEMM multiplies them pre-packed (its threads split such a product by rows
    and would each pack every block again); wider maps keep the GEMM's requests."""
    from compiler.codegen.kernels.testing import build_kernels

    t = Bench()
    conv(t, (1, 64, 26, 26), 40, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1))  # 13x13: ResNet's 3x3/2
    conv(t, (1, 48, 12, 12), 30, (3, 3), pads=(1, 0, 1, 2), bias=False)     # 12x13, asymmetric
    conv(t, (1, 20, 40, 40), 24, (3, 3), pads=(1, 1, 1, 1))                  # 1600 pixels: block by block
    t.g.set_outputs(t.outs, [f"y{i}" for i in range(len(t.outs))])
    from compiler.codegen.gemm.config import model_config
    from compiler.codegen.kernels.conv import PREPACK_PANELS

    _, _, plan = build_kernels(t.g, host_target())
    nr = model_config(host_target()).NR  # (the host's: no vector width assumed)
    expect = [-(-int(np.prod(v.shape[2:])) // nr) <= PREPACK_PANELS for v in t.outs]
    first = ["B's panels packed by the threads before the GEMM" in k.notes for _, k in plan]
    assert first == expect and expect[2] is False, [k.notes for _, k in plan]
    want = interpret(t.g, t.feed)
    for threads in (1, 2, 3):
        got = run_kernels(t.g, t.feed, nthreads=threads)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want[name]).max()))
