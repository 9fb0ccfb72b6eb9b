"""Small helpers for emitting LLVM IR with llvmlite: scalar types, constants, and ``_Fn``,
a function under construction with loops, ifs and stack slots (used by the GEMM emitter)."""
from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
FP = F32.as_pointer()
I8P = I8.as_pointer()
VOID = ir.VoidType()


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def cf(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


# ----------------------------------------------------------------------------------------------
# builder helpers


class _Fn:
    """A function under construction: its builder plus small integer/loop helpers."""

    def __init__(self, fn: ir.Function):
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))

    def alloca(self, ty, count=None, name=""):
        """An alloca at the start of the entry block (static stack slot, promotable)."""
        if self.b.block is self.fn.entry_basic_block:
            return self.b.alloca(ty, count, name=name)
        eb = ir.IRBuilder(self.fn.entry_basic_block)  # (llvmlite's builder positions are indices:
        eb.position_at_start(self.fn.entry_basic_block)  # only insert before another block's b)
        return eb.alloca(ty, count, name=name)

    def block(self, name: str) -> ir.Block:
        return self.fn.append_basic_block(name)

    def min(self, x, y):
        b = self.b
        return b.select(b.icmp_signed("<", x, y), x, y)

    def max(self, x, y):
        b = self.b
        return b.select(b.icmp_signed(">", x, y), x, y)

    def ceildiv(self, x, d):
        b = self.b
        d = c64(d) if isinstance(d, int) else d
        return b.sdiv(b.add(x, b.sub(d, c64(1))), d)

    def roundup(self, x, d: int):
        return self.b.mul(self.ceildiv(x, d), c64(d))

    def at(self, ptr, idx):
        return self.b.gep(ptr, [idx if isinstance(idx, ir.Value) else c64(idx)], inbounds=True)

    @contextmanager
    def loop(self, start, stop, step=1, name="i"):
        """for (i = start; i < stop; i += step) — yields i (signed i64 compare)."""
        b = self.b
        start = c64(start) if isinstance(start, int) else start
        step = c64(step) if isinstance(step, int) else step
        pre = b.block
        head, body, end = self.block(name + ".head"), self.block(name + ".body"), self.block(name + ".end")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, end)
        b.position_at_end(body)
        yield i
        i.add_incoming(b.add(i, step), b.block)
        b.branch(head)
        b.position_at_end(end)

    @contextmanager
    def if_(self, cond, name="if"):
        b = self.b
        then, end = self.block(name + ".then"), self.block(name + ".end")
        b.cbranch(cond, then, end)
        b.position_at_end(then)
        yield
        b.branch(end)
        b.position_at_end(end)

    @contextmanager
    def if_else(self, cond, name="if"):
        """with f.if_else(c) as (then, otherwise): with then: ... ; with otherwise: ..."""
        b = self.b
        bt, bf, end = self.block(name + ".then"), self.block(name + ".else"), self.block(name + ".end")
        b.cbranch(cond, bt, bf)

        @contextmanager
        def arm(blk):
            b.position_at_end(blk)
            yield
            b.branch(end)

        yield arm(bt), arm(bf)
        b.position_at_end(end)


def _new_fn(mod, name, ret, args, internal=True):
    fn = ir.Function(mod, ir.FunctionType(ret, [a for a, _ in args]), name)
    for a, (_, n) in zip(fn.args, args):
        a.name = n
    if internal:
        fn.linkage = "internal"
    fn.attributes.add("nounwind")
    return fn


def _declare(mod, name, ret, args):
    if name in mod.globals:
        return mod.globals[name]
    return ir.Function(mod, ir.FunctionType(ret, args), name)


class VectorOps:
    """Vector helpers of an emitter of ``W``-float vectors (``vec``, ``vecp``) into ``mod``."""

    def splat(self, b, s, ty: ir.VectorType | None = None):
        """``s`` in every lane of a vector of ``ty`` (default: the W-wide one)."""
        ty = ty or self.vec
        v = b.insert_element(ir.Constant(ty, ir.Undefined), s, ir.Constant(I32, 0))
        zeros = ir.Constant(ir.VectorType(I32, ty.count), [0] * ty.count)
        return b.shuffle_vector(v, ir.Constant(ty, ir.Undefined), zeros)

    def vload(self, f, ptr, idx, align=4):
        return f.b.load(f.b.bitcast(f.at(ptr, idx), self.vecp), align=align)

    def vstore(self, f, val, ptr, idx, align=4):
        f.b.store(val, f.b.bitcast(f.at(ptr, idx), self.vecp), align=align)

    def lane_mask(self, b, n):
        """The lanes below ``n`` (an i64 value) of a W-wide vector, as a mask."""
        W = self.W
        return b.icmp_signed("<", ir.Constant(ir.VectorType(I64, W), list(range(W))),
                             self.splat(b, n, ir.VectorType(I64, W)))

    def tail_mask(self, f, n):
        """(the floats of ``n``'s whole vectors, the mask of the ``n % W`` lanes after them)."""
        b, W = f.b, self.W
        whole = b.mul(b.sdiv(n, c64(W)), c64(W))
        return whole, self.lane_mask(b, b.sub(n, whole))

    def masked_ops(self):
        """(masked load, masked store) of W-wide float vectors: the LLVM intrinsics, declared once."""
        W, mask_ty = self.W, ir.VectorType(I1, self.W)
        mstore = _declare(self.mod, f"llvm.masked.store.v{W}f32.p0", VOID, [self.vec, self.vecp, I32, mask_ty])
        mload = _declare(self.mod, f"llvm.masked.load.v{W}f32.p0", self.vec, [self.vecp, I32, mask_ty, self.vec])
        return mload, mstore
