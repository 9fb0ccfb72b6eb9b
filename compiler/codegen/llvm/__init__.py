"""LLVM CPU code generation: the host target, the toolchain (LLVM IR -> object -> shared library) and
the generated loops (elementwise kernels; see docs/codegen.md)."""
