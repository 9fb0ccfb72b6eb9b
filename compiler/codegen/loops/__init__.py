"""The loop form: one kernel description that every backend prints.

A lowering describes a fused group as a ``Kernel`` (``form.py``): buffers, loops (one parallel, the
innermost vectorizable), ``let``s, accumulators and stores over typed scalar expressions
(``expr.py``), whose primitives have one meaning on every backend. Each op's scalar semantics are
written once (``scalar.py``). ``verify.py`` checks a kernel (names, types, roles, and indices in
bounds); ``text.py`` prints it for reading; ``llvm.py`` prints it as LLVM IR for the CPU and
``cuda.py`` as a numba.cuda kernel.
"""
from .expr import Const, Expr, FormError, Load, Op, Var, cast, const, op, select
from .form import Acc, Buffer, Kernel, KernelForm, Let, Loop, Store, Update
from .llvm import print_llvm
from .text import print_kernel
from .verify import verify

__all__ = ["Acc", "Buffer", "Const", "Expr", "FormError", "Kernel", "KernelForm", "Let", "Load", "Loop", "Op",
           "Store", "Update", "Var", "cast", "const", "op", "print_kernel", "print_llvm", "select", "verify"]
