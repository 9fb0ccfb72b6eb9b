"""Native data-movement lowerings (kernels/data.py, on the loop form) and conversions against the
reference interpreter, bit for bit, on many shapes, axes and element types: on the LLVM printer and
in numba's CUDA simulator; Gather's bad run-time indices are reported."""
from __future__ import annotations

import os

import numpy as np
import pytest

import compiler
from compiler.codegen.kernels import EMPTY, KernelBuilder, KernelGroup, Services, data, lowering_for
from compiler.codegen.kernels.testing import run_cuda_forms, run_kernels
from compiler.codegen.loops.cuda import KernelReport
from compiler.errors import InputError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import elementwise as ew
from compiler.ir.ops import indexing as ix
from compiler.ir.ops import quant as qt
from compiler.ir.ops import shape as sh
from compiler.ir.ops import tensor as tn
from compiler.ir.types import DType, TensorType

TYPES = [DType.f32, DType.f64, DType.i64, DType.i32, DType.i8, DType.u8, DType.bool]
rng = np.random.default_rng(1234)


def rand(shape, dt: DType) -> np.ndarray:
    shape = tuple(shape)
    if dt is DType.bool:
        return np.asarray(rng.integers(0, 2, shape), bool)
    if dt.is_float:
        return np.asarray(rng.standard_normal(shape) * 10, dt.np)
    info = np.iinfo(dt.np)
    return np.asarray(rng.integers(info.min, info.max, shape, dtype=dt.np, endpoint=True))


def i64(*v) -> np.ndarray:
    return np.array(v, np.int64)


class Bench:
    """A graph of many independent nodes, run natively and by the interpreter in one go."""

    def __init__(self):
        self.g = Graph("bench")
        self.inputs: dict[str, np.ndarray] = {}
        self.outs = []

    def input(self, array: np.ndarray, dt: DType | None = None):
        dt = dt or DType.from_numpy(array.dtype)
        v = self.g.add_input(f"x{len(self.inputs)}", TensorType(dt, array.shape))
        self.inputs[v.name] = array
        return v

    def const(self, array):
        return self.g.add_constant(np.asarray(array))

    def add(self, op, *ins, n: int = 1):
        node = self.g.add_node(op, list(ins), n)
        self.outs.extend(node.outputs)
        return node.outputs[0] if n == 1 else node.outputs

    def check(self, cuda: bool = False):
        """Every output bit for bit as the interpreter's, on the LLVM printer (or the CUDA one)."""
        names = [f"y{i}" for i in range(len(self.outs))]
        self.g.set_outputs(self.outs, names)
        with np.errstate(all="ignore"):
            ref = interpret(self.g, self.inputs)
        got = run_cuda_forms(self.g, self.inputs, threads=3) if cuda else run_kernels(self.g, self.inputs)
        for name, v in zip(names, self.outs):
            r, o = ref[name], got[name]
            assert r.dtype == o.dtype and r.shape == o.shape, (v.producer.describe(), r.shape, o.shape)
            assert r.tobytes() == o.tobytes(), f"{v.producer.describe()}:\n{r}\n!=\n{o}"
        return got


def reason(op, *ins, n: int = 1) -> str | None:
    g = Graph("r")
    node = g.add_node(op, list(ins), n)
    return lowering_for(KernelGroup.of([node]))[1]


# ---------------------------------------------------------------------------------------------
# Concat, Split, Slice
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", TYPES)
def test_concat(dt):
    b = Bench()
    for shapes, axis in [([(3, 5, 7), (3, 2, 7), (3, 1, 7)], 1), ([(4, 6), (4, 6)], 0), ([(2, 3, 4), (2, 3, 5)], -1),
                         ([(5,), (0,), (17,)], 0), ([(2, 1, 3, 4), (2, 2, 3, 4)], 1), ([(1, 9)], 0)]:
        b.add(tn.Concat(axis=axis), *[b.input(rand(s, dt)) for s in shapes])
    b.check()


@pytest.mark.parametrize("dt", [DType.f32, DType.i8, DType.i64])
def test_split(dt):
    b = Bench()
    x = b.input(rand((4, 10, 3), dt))
    b.add(tn.Split(axis=1), x, b.const(i64(2, 5, 3)), n=3)
    b.add(tn.Split(axis=0, num_outputs=3), x, n=3)
    b.add(tn.Split(axis=-1, num_outputs=2), x, n=2)
    b.add(tn.Split(axis=1), x, b.const(i64(0, 10)), n=2)
    b.check()


def test_split_unused_output():
    b = Bench()
    x = b.input(rand((6, 4), DType.f32))
    y0, _ = b.g.add_node(tn.Split(axis=0, num_outputs=2), [x], 2).outputs
    b.outs.append(y0)
    b.check()


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.u8, DType.bool])
def test_slice(dt):
    b = Bench()
    x = b.input(rand((5, 8, 6), dt))
    cases = [((1,), (4,), None, None), ((0, 2), (-1, 100), (0, 2), None), ((-1,), (-100,), (1,), (-1,)),
             ((4, 7, 5), (0, 0, 0), None, (-2, -3, -1)), ((1, 0), (2, 8), (0, 1), (1, 3)),
             ((0,), (8,), (-2,), (2,)), ((3,), (3,), (0,), None), ((-100,), (100,), (2,), (1,))]
    for starts, ends, axes, steps in cases:
        ops = [b.const(i64(*starts)), b.const(i64(*ends))]
        if axes is not None or steps is not None:
            ops.append(b.const(i64(*axes)) if axes is not None else None)
        if steps is not None:
            ops.append(b.const(i64(*steps)))
        b.add(tn.Slice(), x, *ops)
    b.check()


# ---------------------------------------------------------------------------------------------
# Transpose
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", TYPES)
def test_transpose(dt):
    b = Bench()
    for shape, perm in [((3, 5), None), ((37, 29), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (0, 2, 1)),
                        ((2, 3, 4, 5), (3, 2, 1, 0)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((1, 7, 1, 9), (3, 1, 2, 0)),
                        ((4, 33, 65), (0, 2, 1)), ((6,), None), ((3, 1, 4), (1, 0, 2))]:
        b.add(sh.Transpose(perm=perm), b.input(rand(shape, dt)))
    b.check()


def test_transpose_large():
    b = Bench()
    b.add(sh.Transpose(perm=(1, 0)), b.input(rand((257, 130), DType.f32)))
    b.add(sh.Transpose(perm=(0, 3, 1, 2)), b.input(rand((2, 17, 19, 24), DType.f32)))
    b.add(sh.Transpose(perm=(2, 1, 0)), b.input(rand((70, 3, 66), DType.u8)))
    b.check()


# ---------------------------------------------------------------------------------------------
# Gather
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.i32, DType.u8])
def test_gather(dt):
    b = Bench()
    x = b.input(rand((4, 6, 5), dt))
    for axis in (0, 1, 2, -1):
        d = (4, 6, 5, 5)[axis]
        b.add(ix.Gather(axis=axis), x, b.input(rng.integers(-d, d, (3, 2)).astype(np.int64)))
        b.add(ix.Gather(axis=axis), x, b.input(rng.integers(-d, d, (7,)).astype(np.int32)))
        b.add(ix.Gather(axis=axis), x, b.const(rng.integers(-d, d, (2, 2)).astype(np.int64)))
        b.add(ix.Gather(axis=axis), x, b.const(np.array(-1, np.int64)))  # scalar index
        b.add(ix.Gather(axis=axis), x, b.const(i64(1, 2, 3)))  # a contiguous range: a slice copy
    b.add(ix.Gather(axis=0), x, b.const(np.zeros((0,), np.int64)))
    b.check()


def test_gather_bad_runtime_index_leaves_zeros():
    g = Graph("g")
    x = g.add_input("x", TensorType(DType.f32, (3, 4)))
    i = g.add_input("i", TensorType(DType.i64, (4,)))
    y0 = g.add(ix.Gather(axis=0), x, i)
    y1 = g.add(ix.Gather(axis=1), x, i)
    g.set_outputs([y0, y1], ["y0", "y1"])
    xv = rand((3, 4), DType.f32)
    idx = np.array([1, 3, -4, -3], np.int64)  # 3 and -4 are out of range for axis 0
    got = run_kernels(g, {"x": xv, "i": idx})
    want0 = np.zeros((4, 4), np.float32)
    want0[0], want0[3] = xv[1], xv[0]
    np.testing.assert_array_equal(got["y0"], want0)
    np.testing.assert_array_equal(got["y1"], np.take(xv, [1, 3, 0, 1], axis=1))
    got = run_kernels(g, {"x": xv, "i": np.array([2**40, -2**40, 7, 2], np.int64)})
    assert np.all(got["y0"][:3] == 0) and np.all(got["y1"][:, :3] == 0)


# ---------------------------------------------------------------------------------------------
# Expand, Tile, Pad, ConstantOfShape
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [DType.f32, DType.i64, DType.i8, DType.bool])
def test_broadcast_copies(dt):
    b = Bench()
    for shape, target in [((3, 1), (2, 3, 5)), ((1,), (7,)), ((4, 1, 6), (4, 5, 6)), ((2, 3), (1, 1)),
                          ((1, 1, 3), (2, 1)), ((5,), (3, 1, 5))]:
        b.add(tn.Expand(), b.input(rand(shape, dt)), b.const(i64(*target)))
    for shape, reps in [((2, 3), (2, 3)), ((4,), (5,)), ((1, 3, 2), (3, 1, 2)), ((2, 2), (1, 1)), ((3, 2), (0, 2))]:
        b.add(tn.Tile(), b.input(rand(shape, dt)), b.const(i64(*reps)))
    b.check()


@pytest.mark.parametrize("dt", [DType.f32, DType.f64, DType.i32, DType.u8, DType.bool])
def test_pad(dt):
    b = Bench()
    x = b.input(rand((3, 5, 4), dt))
    xv = b.inputs[x.name]
    value = b.const(np.asarray(xv.reshape(-1)[0]))
    runtime_value = b.input(rand((), dt))
    for pads in [(1, 0, 2, 0, 3, 1), (0, 0, 0, 0, 0, 0), (1, -1, 2, -2, 0, 3), (-1, -2, -1, -1, -1, -1)]:
        b.add(tn.Pad(), x, b.const(i64(*pads)))
        b.add(tn.Pad(), x, b.const(i64(*pads)), value)
        b.add(tn.Pad(), x, b.const(i64(*pads)), runtime_value)
    b.add(tn.Pad(), x, b.const(i64(2, 1)), None, b.const(i64(-2)))
    for mode in ("reflect", "edge", "wrap"):
        for pads in [(1, 0, 2, 0, 3, 1), (2, 4, 0, 2, 1, 3), (0, -1, 0, 1, 2, -1), (0, 0, 0, 0, 0, 0)]:
            b.add(tn.Pad(mode=mode), x, b.const(i64(*pads)))
        b.add(tn.Pad(mode=mode), x, b.const(i64(2, 3)), None, b.const(i64(1)))
    b.check()


def test_constant_of_shape():
    b = Bench()
    shape = b.const(i64(3, 7))
    b.add(tn.ConstantOfShape(), shape)
    for v in [np.array([1.5], np.float32), np.array([-2.25], np.float64), np.array([7], np.int64),
              np.array([-1], np.int32), np.array([3], np.int8), np.array([200], np.uint8), np.array([True]),
              np.array([0x01010101], np.int32), np.array([0], np.int64)]:
        b.add(tn.ConstantOfShape(value=v), shape)
    b.add(tn.ConstantOfShape(value=np.array([5], np.int32)), b.const(np.zeros((0,), np.int64)))
    b.add(tn.ConstantOfShape(value=np.array([5], np.int32)), b.const(i64(4, 0)))
    b.check()


# ---------------------------------------------------------------------------------------------
# Cast, comparisons, logic, Where
# ---------------------------------------------------------------------------------------------

SPECIAL = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 1e20, 300.7, -300.7, -1.5, 255.9, 128.5, -129.5, 1e10,
                    2.0 ** 31, -2.0 ** 31 - 1, -2.0 ** 31, 2.0 ** 31 - 1, -0.0, 0.0, 0.5, -0.5, 0.99, 2.0 ** 63,
                    -2.0 ** 63, 9.3e18, -9.3e18, 1e-40, 3.4e38, 1e300, -1e300, 65535.5, -32768.9, 127.99, -128.99])


def values_of(dt: DType, n: int) -> np.ndarray:
    if dt.is_float:
        with np.errstate(all="ignore"):
            base = SPECIAL.astype(dt.np)
        return np.concatenate([base, rand((n,), dt) * 1000])[:n] if n > len(base) else base[:n]
    if dt is DType.bool:
        return rand((n,), dt)
    info = np.iinfo(dt.np)
    edge = np.array([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], dt.np)
    return np.concatenate([edge, rand((n,), dt)])[:n]


@pytest.mark.parametrize("src", TYPES)
def test_cast(src):
    b = Bench()
    for n in (len(SPECIAL), 1, 13, 67):
        x = b.input(values_of(src, n))
        for dst in TYPES:
            b.add(ew.Cast(to=dst), x)
    x = b.input(values_of(src, 24).reshape(2, 3, 4))
    b.add(ew.CastLike(), x, b.const(np.zeros(1, np.int32)))
    b.check()


@pytest.mark.parametrize("dt", TYPES)
def test_compare(dt):
    b = Bench()
    for sa, sb in [((5, 7), (5, 7)), ((3, 1, 4), (5, 1)), ((1,), (9,)), ((), (2, 3))]:
        xa, xb = rand(sa, dt), rand(sb, dt)
        if dt.is_float and xa.size > 2:
            xa.reshape(-1)[:2] = [np.nan, 0.0]
        if xa.size and xb.size:  # some equal elements
            xb.reshape(-1)[0] = xa.reshape(-1)[0]
        a, c = b.input(xa), b.input(xb)
        ops = [ew.Equal] if dt is DType.bool else [ew.Equal, ew.Less, ew.LessOrEqual, ew.Greater, ew.GreaterOrEqual]
        for op in ops:
            b.add(op(), a, c)
    b.check()


def test_logic_and_where():
    b = Bench()
    p, q, r = b.input(rand((4, 5), DType.bool)), b.input(rand((5,), DType.bool)), b.input(rand((3, 4, 1), DType.bool))
    b.add(ew.Not(), p)
    for op in (ew.And, ew.Or, ew.Xor):
        b.add(op(), p, q)
        b.add(op(), r, p)
    for dt in TYPES:
        b.add(ew.Where(), r, b.input(rand((4, 5), dt)), b.input(rand((5,), dt)))
        b.add(ew.Where(), p, b.input(rand((4, 5), dt)), b.input(rand((), dt)))
    b.check()


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------

def test_refusals():
    g = Graph("r")
    x = g.add_input("x", TensorType(DType.f32, (4, 6)))
    n = g.add_input("n", TensorType(DType.i64, (1,)))
    dyn = g.add_input("d", TensorType(DType.f32, ("N", 6)))
    half = g.add_input("h", TensorType(DType.f16, (4, 6)))
    brain = g.add_input("b", TensorType(DType.bf16, (4, 6)))
    assert "not static" in reason(sh.Transpose(), dyn)
    assert reason(sh.Transpose(), half) is None  # data movement: every type the loop form stores
    assert reason(sh.Transpose(), brain) is None  # (bf16 as its 16 bits)
    assert "every index is out of range" in reason(ix.Gather(axis=1), g.add_input("e", TensorType(DType.f32, (4, 0))),
                                                   n)
    assert reason(ew.Cast(to=DType.f16), x) is None  # the loop form stores f16 and bf16
    assert reason(ew.Cast(to=DType.bf16), x) is None
    assert reason(ew.Cast(to=DType.f8e4m3fn), x) is None  # float 8/4: stored as their byte
    f8 = g.add_input("f8", TensorType(DType.f8e5m2, (4, 6)))
    assert "f8e5m2 to i32: float 8/4 converts to floats and bool only" in reason(ew.Cast(to=DType.i32), f8)
    assert "f8e8m0" in reason(ew.Cast(to=DType.f8e8m0), x)
    assert reason(tn.Slice(), x, n, g.add_constant(i64(3)))  # runtime starts: unknown output shape
    assert "out of range" in reason(ix.Gather(axis=0), x, g.add_constant(i64(0, 4)))
    assert reason(tn.Pad(), x, g.add_input("p", TensorType(DType.i64, (4,))))
    assert reason(ix.Gather(axis=0), x, g.add_constant(i64(0, 3))) is None
    assert reason(ew.Cast(to=DType.u8), x) is None
    assert "string" in reason(ew.Equal(), g.add_input("s", TensorType(DType.string, (2,))),
                              g.add_input("s2", TensorType(DType.string, (2,))))


def test_scalars():
    b = Bench()
    x = b.input(rand((), DType.f32))
    b.add(tn.Pad(mode="reflect"), x, b.const(np.zeros((0,), np.int64)))
    b.add(tn.Pad(), x, b.const(np.zeros((0,), np.int64)))
    b.add(sh.Transpose(), x)
    b.add(ew.Cast(to=DType.i32), x)
    b.add(tn.Expand(), x, b.const(i64(3, 2)))
    b.add(ix.Gather(axis=0), b.input(rand((5,), DType.i64)), b.const(np.array(2, np.int64)))
    b.check()


# ---------------------------------------------------------------------------------------------
# The loop form: every op on every type the form stores, both printers, edge shapes
# ---------------------------------------------------------------------------------------------

MOVE_TYPES = [DType.f32, DType.f64, DType.f16, DType.bf16, DType.i64, DType.i8, DType.bool, DType.u16]
CUDA = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs numba's CUDA simulator")


def bits_rand(shape, dt: DType) -> np.ndarray:
    """Random data with, for floats, the values a copy must keep bit for bit: NaNs with payloads,
    -0.0, infinities, denormals."""
    a = rand(shape, dt)
    if dt.is_float and a.size >= 6:
        u = np.dtype(f"u{dt.itemsize}")
        flat = a.reshape(-1)
        flat[:4] = np.array([-0.0, np.inf, -np.inf, np.finfo(dt.np).smallest_subnormal], dt.np)
        flat[4:6] = np.array([np.iinfo(u).max, (np.iinfo(u).max >> 1) - 3], u).view(dt.np)  # NaNs, payloads
    return a


def every_op(b: Bench, dt: DType, small: bool = False) -> None:
    """One node of each data-movement op (several forms each) on ``dt``."""
    x = b.input(bits_rand((3, 5, 6), dt))
    xv = b.inputs[x.name]
    b.add(tn.Concat(axis=1), x, b.input(bits_rand((3, 2, 6), dt)), x)
    b.add(tn.Concat(axis=0), b.input(bits_rand((0, 5, 6), dt)), x)
    b.add(tn.Split(axis=2), x, b.const(i64(1, 0, 5)), n=3)
    b.add(tn.Split(axis=0, num_outputs=3), x, n=3)
    for starts, ends, axes, steps in [((4, 5), (0, 0), (1, 2), (-2, -1)), ((-1,), (-100,), (0,), (-1,)),
                                      ((1, 0, 1), (3, 5, 6), None, (1, 3, 4))]:
        ops = [b.const(i64(*starts)), b.const(i64(*ends)), b.const(i64(*axes)) if axes else None, b.const(i64(*steps))]
        b.add(tn.Slice(), x, *ops)
    for perm in [(2, 0, 1), (0, 2, 1), (1, 0, 2), (2, 1, 0)]:
        b.add(sh.Transpose(perm=perm), x)
    b.add(sh.Transpose(perm=(1, 0)), b.input(bits_rand((5, 19) if small else (37, 21), dt)))
    b.add(tn.Expand(), b.input(bits_rand((3, 1, 6), dt)), b.const(i64(2, 3, 4, 6)))
    b.add(tn.Expand(), b.input(bits_rand((1,), dt)), b.const(i64(7)))
    b.add(tn.Tile(), x, b.const(i64(2, 1, 3)))
    value = b.const(np.asarray(xv.reshape(-1)[7]))
    b.add(tn.Pad(), x, b.const(i64(1, 0, 2, 0, 3, 1)), value)
    b.add(tn.Pad(), x, b.const(i64(0, -1, 1, 2, 0, -2)), b.input(bits_rand((), dt)))
    for mode in ("reflect", "edge", "wrap"):
        b.add(tn.Pad(mode=mode), x, b.const(i64(2, 1, 3, 1, 0, 4)))
    d = 5
    b.add(ix.Gather(axis=1), x, b.input(rng.integers(-d, d, (2, 3)).astype(np.int64)))
    b.add(ix.Gather(axis=-1), x, b.input(rng.integers(-6, 6, (4,)).astype(np.int32)))
    b.add(ix.Gather(axis=0), x, b.const(i64(2, -3, 1)))
    b.add(ix.Gather(axis=1), x, b.const(i64(1, 2, 3)))
    fill = np.asarray(bits_rand((6,), dt).reshape(-1)[4 if dt.is_float else 0]).reshape(1)  # a NaN for floats
    b.add(tn.ConstantOfShape(value=fill), b.const(i64(3, 4)))


def test_bfloat16_casts_round_to_nearest_even_bit_for_bit():
    """bf16 is stored as its 16 bits (llvmlite has no bfloat type): float32 -> bf16 rounds in integer
    arithmetic, ties to even, overflow to infinity, NaN to the quiet NaN of its sign; bf16 -> f32 and
    f64 are exact. Bit for bit as ml_dtypes (the interpreter's cast)."""
    u = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                  0x00008000, 0x00018000, 0x80000001, 0x7FC00001, 0xFFC12345, 0x7F800001, 0xFF800000,
                  0x80000000], np.uint32)
    x = np.concatenate([u.view(np.float32), rand((97,), DType.f32)])
    b = Bench()
    xv = b.input(x)
    brain = b.add(ew.Cast(to=DType.bf16), xv)
    b.add(ew.Cast(to=DType.f32), brain)
    b.add(ew.Cast(to=DType.f64), brain)
    b.add(ew.Cast(to=DType.f16), brain)
    b.add(ew.Cast(to=DType.bf16), b.input(bits_rand((40,), DType.f16)))
    b.add(ew.Cast(to=DType.i32), b.input(rand((40,), DType.bf16)))
    for node in b.g.nodes:
        assert lowering_for(KernelGroup.of_node(node))[0] is not None, node.describe()
    got = b.check()
    bits = got["y0"].view(np.uint16)
    assert list(bits[:7]) == [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x7F80, 0x7F80, 0x7F7F]  # ties to even, overflow
    assert list(bits[10:14]) == [0x7FC0, 0xFFC0, 0x7FC0, 0xFF80]  # NaNs quiet with their sign; -inf


def test_four_and_two_bit_integers_cast_and_move_bit_for_bit():
    """int4/uint4/int2/uint2 are a byte each holding the value's low bits (as ml_dtypes stores them):
    from floats truncated toward zero, out of range, NaN and infinities giving 0 (as ml_dtypes casts);
    from integers the low bits; loads sign- or zero-extend. Bit for bit as the interpreter."""
    x = np.array([-9.7, -8.5, -8, -7.5, -0.5, 0.5, 1.5, 2.5, 3.9, 7.4, 7.5, 8, 9, 15, 15.9, 16, 17, -1.5,
                  np.nan, np.inf, -np.inf], np.float32)
    ints = np.arange(-20, 20, dtype=np.int32)
    b = Bench()
    xf, xi = b.input(x), b.input(ints)
    for dt in (DType.i4, DType.u4, DType.i2, DType.u2):
        small = b.add(ew.Cast(to=dt), xf)
        b.add(ew.Cast(to=DType.f32), small)
        wrapped = b.add(ew.Cast(to=dt), xi)
        b.add(ew.Cast(to=DType.i32), wrapped)
        b.add(sh.Transpose(), b.add(tn.Expand(), wrapped, b.const(i64(2, 40))))
    for node in b.g.nodes:
        assert lowering_for(KernelGroup.of_node(node))[0] is not None, node.describe()
    b.check()


@pytest.mark.parametrize("saturate", [1, 0])
def test_float8_and_float4_casts_bit_for_bit(saturate):
    """The four float 8 types and float 4 (E2M1): every byte read back (f32, f16, another float 8: NaNs become the quiet
    NaN of their sign, as ml_dtypes reads them), every float16 and
    the values around each type's limits written (from f32, f16, f64, int32), both ``saturate``
    modes, and a transpose; bit for bit as the interpreter (ml_dtypes), NaNs included."""
    limits = [448, 464, 464.1, 480, 240, 247.9, 248, 256, 57344, 61439, 61440, 65536, 1e9, 2.0 ** -10, 2.0 ** -11,
              2.0 ** -12, 1.5 * 2.0 ** -17, 2.0 ** -18, 3 * 2.0 ** -19, 1 + 2.0 ** -4 + 2.0 ** -40]
    tail = np.array(limits + [-v for v in limits] + [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0])
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    b = Bench()
    xh, xf, xd = b.input(halves), b.input(np.concatenate([halves.astype(np.float32), tail.astype(np.float32)])), \
        b.input(tail)
    xi = b.input(np.array([0, 1, -3, 17, 447, 449, 465, 239, 249, 57343, 61440, 1 << 20, -(1 << 30)], np.int32))
    for dt in (DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz, DType.f4e2m1):
        codes = b.input(np.arange(16 if dt is DType.f4e2m1 else 256, dtype=np.uint8).view(dt.np))
        b.add(ew.Cast(to=DType.f32), codes)
        b.add(ew.Cast(to=DType.f16), codes)
        b.add(ew.Cast(to=DType.f8e4m3fn if dt is DType.f8e5m2 else DType.f8e5m2, saturate=saturate), codes)
        b.add(sh.Transpose(), b.add(tn.Expand(), codes, b.const(i64(3, codes.type.shape[0]))))
        for x in (xh, xf, xd, xi):
            b.add(ew.Cast(to=dt, saturate=saturate), x)
    for node in b.g.nodes:
        assert lowering_for(KernelGroup.of_node(node))[0] is not None, node.describe()
    b.check()


def test_bitcast_moves_bits():
    """BitCast: the same bytes seen as another type of their width (NaN payloads, -0.0, a float 8's
    NaNs, int4 as uint4); to bool a non-zero byte is true."""
    b = Bench()
    f = np.array([1.5, -0.0, np.inf, 3e-45], np.float32)
    f = np.concatenate([f, np.array([0x7FA00001, 0xFFC00123], np.uint32).view(np.float32)])
    b.add(qt.BitCast(to=DType.i32), b.input(f))
    b.add(qt.BitCast(to=DType.f16), b.input(np.arange(-300, 300, 7, dtype=np.int16)))
    b.add(qt.BitCast(to=DType.u8), b.input(np.arange(256, dtype=np.uint8).view(DType.f8e5m2.np)))
    b.add(qt.BitCast(to=DType.bool), b.input(np.array([0, 1, 2, 255], np.uint8)))
    b.add(qt.BitCast(to=DType.u4), b.input(np.arange(-8, 8).astype(DType.i4.np)))
    b.add(qt.BitCast(to=DType.f64), b.input(np.array([[1, -1], [0, 1 << 62]], np.int64)))
    b.add(qt.BitCast(to=DType.u32), b.input(np.ones((2, 1, 3), np.float32)))
    b.add(qt.BitCast(to=DType.bool), b.input(np.zeros((2, 0, 3), np.int8)))
    for node in b.g.nodes:  # (an empty result needs no code: the Empty lowering)
        want = data.BitCast if node.output.type.numel else type(EMPTY)
        assert type(lowering_for(KernelGroup.of_node(node))[0]) is want, node.describe()
    b.check()


def round_once(b: Bench, narrow=(DType.f16, DType.bf16, DType.f8e4m3fn)) -> None:
    x = b.input(np.array([1 + 2.0 ** -11 + 2.0 ** -40, 1 + 2.0 ** -8 + 2.0 ** -40, -(1 + 2.0 ** -11 + 2.0 ** -40),
                          65519.999, 1e300, -1e300, 2.0 ** -25 + 2.0 ** -60, 1e-300, -1e-300, 2.0 ** -149 * 1.5,
                          1 + 2.0 ** -4 + 2.0 ** -50, 2.0 - 2.0 ** -60, np.nan, np.inf, 0.0, -0.0]))
    xi = b.input(np.array([2 ** 25 + 2 ** 17 + 1, -(2 ** 25 + 2 ** 17 + 1), 2 ** 31 - 1], np.int32))
    for dt in narrow:
        b.add(ew.Cast(to=dt), x)
        b.add(ew.Cast(to=dt), xi)
    b.add(ew.Cast(to=DType.f16), b.input(np.random.default_rng(5).standard_normal(4000) * 10))


def test_narrow_floats_round_once_from_float64_and_int32():
    """A float16/bfloat16/float 8 cast from float64 or int32 rounds once (to odd on the way through
    float32): rounding to float32 first would land on the narrow type's midpoints and round the wrong way."""
    b = Bench()
    round_once(b)
    got = b.check()
    assert float(got["y0"][0]) == 1 + 2.0 ** -10 and float(got["y2"][1]) == 1 + 2.0 ** -7


@CUDA
def test_narrow_floats_round_once_on_the_cuda_printer():
    b = Bench()
    round_once(b, narrow=(DType.f16,))
    b.check(cuda=True)


@pytest.mark.parametrize("dt", MOVE_TYPES)
def test_every_op_on_every_type(dt):
    b = Bench()
    every_op(b, dt)
    for node in b.g.nodes:
        low = lowering_for(KernelGroup.of_node(node))[0]
        assert type(low).__module__ == data.__name__ and hasattr(low, "form"), node.describe()
    b.check()


@CUDA
@pytest.mark.parametrize("dt", [DType.f32, DType.f16, DType.i8, DType.bool, DType.u16, DType.f64])
def test_every_op_on_the_cuda_printer(dt):
    b = Bench()
    every_op(b, dt, small=True)
    b.check(cuda=True)


def edge_shapes(b: Bench, dt: DType) -> None:
    """Size-0 and size-1 axes, broadcasts along every axis, negative steps, widths that are no
    multiple of a vector, transposes whose sides are no multiple of a tile."""
    for shape in [(1, 1, 1), (2, 1, 7), (1, 3, 1), (2, 3, 1), (1, 1, 7), (2, 1, 1), (7,), (3, 1)]:
        b.add(tn.Expand(), b.input(bits_rand(shape, dt)), b.const(i64(2, 3, 7)))
    b.add(tn.Expand(), b.input(bits_rand((), dt)), b.const(i64(1, 1)))
    x = b.input(bits_rand((1, 7, 1, 13), dt))
    b.add(sh.Transpose(perm=(3, 2, 1, 0)), x)
    b.add(sh.Transpose(perm=(0, 3, 2, 1)), x)
    b.add(tn.Concat(axis=2), x, x, x)
    b.add(tn.Slice(), x, b.const(i64(12, 6)), b.const(i64(-100, -100)), b.const(i64(3, 1)), b.const(i64(-3, -2)))
    b.add(tn.Slice(), x, b.const(i64(0)), b.const(i64(1)), b.const(i64(1)))
    b.add(tn.Pad(mode="reflect"), x, b.const(i64(0, 3, 0, 15)), None, b.const(i64(1, 3)))  # reflects more than once
    b.add(tn.Pad(mode="wrap"), x, b.const(i64(30, 0, 2, 9)), None, b.const(i64(3, 1)))  # wraps more than once
    b.add(tn.Pad(mode="edge"), x, b.const(i64(2, 2, 1, 0)), None, b.const(i64(2, 0)))
    b.add(tn.Pad(), x, b.const(i64(-13, 0, 2, 1)), None, b.const(i64(3, 1)))  # all cropped: only the value
    b.add(tn.Tile(), x, b.const(i64(3, 1, 2, 1)))
    z = b.input(bits_rand((4, 0, 3), dt))
    b.add(tn.Concat(axis=1), z, b.input(bits_rand((4, 2, 3), dt)), z)
    b.add(tn.Pad(), z, b.const(i64(0, 2, 0, 0, 1, 0)))  # an empty input padded: all value
    w = b.input(bits_rand((3, 33, 65), dt))
    b.add(sh.Transpose(perm=(0, 2, 1)), w)
    b.add(sh.Transpose(perm=(2, 0, 1)), w)
    b.add(tn.Slice(), w, b.const(i64(-1, 64)), b.const(i64(-100, 0)), b.const(i64(1, 2)), b.const(i64(-5, -7)))
    b.add(ix.Gather(axis=2), w, b.input(rng.integers(-65, 65, (1, 9)).astype(np.int64)))
    b.add(ix.Gather(axis=0), w, b.input(np.zeros((0,), np.int32)))


@pytest.mark.parametrize("dt", MOVE_TYPES)
def test_edge_shapes(dt):
    b = Bench()
    edge_shapes(b, dt)
    b.check()


@CUDA
@pytest.mark.parametrize("dt", [DType.f32, DType.bool, DType.u16])
def test_edge_shapes_on_the_cuda_printer(dt):
    b = Bench()
    edge_shapes(b, dt)
    b.check(cuda=True)


@pytest.mark.parametrize("dt", [DType.f32, DType.u8, DType.f64, DType.f16])
def test_large_copies_split_among_threads(dt):
    """Shapes big enough for the parallel loop: runs cut at a divisor, transposes with few rows (column
    tiles in groups; the last tile shifted), a prime run that cannot be cut, fills."""
    b = Bench()
    b.add(sh.Transpose(perm=(1, 0)), b.input(bits_rand((30011, 20), dt)))
    b.add(sh.Transpose(perm=(1, 0)), b.input(bits_rand((20, 30011), dt)))
    b.add(sh.Transpose(perm=(0, 2, 3, 1)), b.input(bits_rand((1, 24, 61, 59), dt)))
    b.add(tn.Concat(axis=1), b.input(bits_rand((1, 3, 100000), dt)), b.input(bits_rand((1, 5, 100000), dt)))
    b.add(tn.Concat(axis=0), b.input(bits_rand((100003,), dt)), b.input(bits_rand((7,), dt)))
    b.add(tn.Split(axis=1, num_outputs=2), b.input(bits_rand((2, 64, 4099), dt)), n=2)
    b.add(tn.Expand(), b.input(bits_rand((1, 1, 999), dt)), b.const(i64(300, 2, 999)))
    b.add(tn.Pad(mode="reflect"), b.input(bits_rand((3, 40, 57, 57), dt)), b.const(i64(0, 0, 2, 1, 0, 0, 1, 2)))
    b.add(tn.Pad(), b.input(bits_rand((3, 40, 57, 57), dt)), b.const(i64(0, 1, 2, 1, 0, 0, 1, 2)))
    b.add(tn.Slice(), b.input(bits_rand((4, 300, 600), dt)), b.const(i64(1, 599)), b.const(i64(299, -1000)),
          b.const(i64(1, 2)), b.const(i64(1, -1)))
    b.add(ix.Gather(axis=0), b.input(bits_rand((3000, 256), dt)), b.input(rng.integers(-3000, 3000, 500)))
    b.add(tn.ConstantOfShape(value=np.array([3], dt.np)), b.const(i64(1000003)))
    b.check()


def test_gather_bad_index_is_reported():
    g = Graph("g")
    x = g.add_input("x", TensorType(DType.f16, (3, 4)))
    i = g.add_input("i", TensorType(DType.i32, (2,)))
    g.set_outputs([g.add(ix.Gather(axis=1), x, i, name="gather")], ["y"])
    exe = compiler.compile(g, fallback=False)
    xv = rand((3, 4), DType.f16)
    np.testing.assert_array_equal(exe.run({"x": xv, "i": np.array([3, -4], np.int32)})["y"], xv[:, [3, 0]])
    for bad in (4, -5, -2**31):
        with pytest.raises(InputError, match=rf"'gather'.*index {bad} is out of range"):
            exe.run({"x": xv, "i": np.array([0, bad], np.int32)})


@CUDA
def test_gather_bad_index_is_reported_on_the_cuda_printer():
    g = Graph("g")
    g.set_outputs([g.add(ix.Gather(axis=0), g.add_input("x", TensorType(DType.f32, (3, 4))),
                         g.add_input("i", TensorType(DType.i64, (2,))))])
    x = rand((3, 4), DType.f32)
    np.testing.assert_array_equal(run_cuda_forms(g, {"x": x, "i": np.array([-1, 0])})[g.output_names[0]], x[[2, 0]])
    with pytest.raises(KernelReport, match="index 3 is out of range"):
        run_cuda_forms(g, {"x": x, "i": np.array([1, 3])})


def test_forms_of_the_fast_paths():
    """How the kernels are made: contiguous runs (a big one printed as one llvm.memcpy), tiles for
    transposes, the runs of a Concat on axis 1 of one image in one parallel loop."""
    from compiler.codegen.gemm.config import model_config
    from compiler.codegen.llvm.elementwise import new_module
    from compiler.codegen.llvm.target import host_target

    g = Graph("f")
    xs = [g.add_input(f"x{j}", TensorType(DType.f32, (1, 64, 56, 56))) for j in range(2)]
    nodes = [g.add_node(tn.Concat(axis=1), xs), g.add_node(sh.Transpose(perm=(0, 2, 3, 1)), xs[:1])]
    concat, transpose = [lowering_for(KernelGroup.of_node(n))[0].form(KernelGroup.of_node(n), "k") for n in nodes]
    text = str(concat)
    assert text.count("parallel for") == 1 and text.count("vector for") == 2, text
    assert "tiles" in str(transpose) and "parallel for" in str(transpose), transpose
    target = host_target()
    module = new_module("m", target)
    k = KernelBuilder(Services(module, target, model_config(target)), "concat", KernelGroup.of_node(nodes[0]),
                      internal=False)
    lowering_for(KernelGroup.of_node(nodes[0]))[0].emit(k, KernelGroup.of_node(nodes[0]))
    k.finish()
    assert "llvm.memcpy" in str(module)
