"""Small LLVM helpers the lowerings share: a counted loop in the form LLVM's passes expect (``_For``),
loop metadata (interleave, no vectorization), an empty module for a target and the release of one
whose text has been taken.

(The float32 elementwise code generator that lived here is gone: elementwise kernels, fused chains
and the row functions of the GEMM's epilogues and prologues are printed from the loop form,
``codegen/loops/``.)
"""
from __future__ import annotations

from llvmlite import ir

from .target import Target, host_target

I64 = ir.IntType(64)


def _loop_id(module: ir.Module, option: str, *value: ir.Constant) -> ir.MDValue:
    """A loop ID (``!llvm.loop`` metadata) carrying one option (and its value, if it takes one)."""
    opt = module.add_metadata([ir.MetaDataString(module, option), *value])
    loop_id = ir.values.MDValue(module, [], name=str(len(module.metadata)))
    loop_id.operands = (loop_id, opt)  # a loop ID refers to itself first
    return loop_id


def loop_metadata(module: ir.Module, interleave: int) -> ir.MDValue:
    """A loop ID asking the vectorizer to interleave ``interleave`` vector iterations (more
    independent work in flight for long math bodies)."""
    return _loop_id(module, "llvm.loop.interleave.count", ir.Constant(ir.IntType(32), interleave))


def no_vectorize_metadata(module: ir.Module) -> ir.MDValue:
    """A loop ID that keeps the vectorizer off a loop (e.g. one over rows whose body is already
    vector code: vectorizing it would gather across rows)."""
    return _loop_id(module, "llvm.loop.vectorize.enable", ir.Constant(ir.IntType(1), 0))


def no_unroll_metadata(module: ir.Module) -> ir.MDValue:
    """A loop ID that keeps LLVM from unrolling a loop (e.g. one whose body is already unrolled vector
    code: unrolling it again only makes compiling slower)."""
    return _loop_id(module, "llvm.loop.unroll.disable")


class _For:
    """``for (i = 0; i < count; ++i)`` as a guarded, rotated loop (the form LLVM's passes expect)."""

    def __init__(self, b: ir.IRBuilder, count: ir.Value, name: str, metadata: ir.MDValue | None = None):
        self.b, self.count, self.name, self.metadata = b, count, name, metadata

    def __enter__(self) -> ir.Value:
        b = self.b
        fn = b.function
        self.pre = b.block
        self.body = fn.append_basic_block(f"{self.name}.body")
        self.done = fn.append_basic_block(f"{self.name}.end")
        b.cbranch(b.icmp_signed(">", self.count, ir.Constant(I64, 0)), self.body, self.done)
        b.position_at_end(self.body)
        self.i = b.phi(I64, name=self.name)
        self.i.add_incoming(ir.Constant(I64, 0), self.pre)
        return self.i

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        b = self.b
        nxt = b.add(self.i, ir.Constant(I64, 1), name=f"{self.name}.next", flags=["nuw", "nsw"])
        self.i.add_incoming(nxt, b.block)
        br = b.cbranch(b.icmp_signed("<", nxt, self.count), self.body, self.done)
        if self.metadata is not None:
            br.set_metadata("llvm.loop", self.metadata)
        b.position_at_end(self.done)
        return False


def new_module(name: str = "kiln", target: Target | None = None) -> ir.Module:
    """An empty llvmlite module with the target's triple and data layout."""
    target = target or host_target()
    module = ir.Module(name=name)
    module.triple = target.triple
    module.data_layout = target.data_layout
    return module


def release_module(module: ir.Module) -> None:
    """Break ``module``'s reference cycles (an instruction and its block, a block and its function,
    ...), once its text has been taken: its objects are then freed as it is dropped, not left to
    Python's cycle collector. A model's module is hundreds of thousands of objects, which a
    collection after the compile scanned and freed in 0.2 s (Inception-v1; 0.03 s released). The
    module cannot be used afterwards."""
    for g in list(module.globals.values()):
        if isinstance(g, ir.Function):
            for block in g.blocks:
                for ins in block.instructions:
                    ins.__dict__.clear()
                block.__dict__.clear()
            for a in g.args:
                a.__dict__.clear()
        g.__dict__.clear()
    for md in [*module.metadata, *module.namedmetadata.values()]:  # (loop IDs name themselves)
        md.__dict__.clear()
    module.__dict__.clear()


__all__ = ["loop_metadata", "new_module", "no_vectorize_metadata", "release_module"]
