"""The runtime: compiled artifacts (save, load, verify) and executables.

Empty until the LLVM codegen issue lands: see the issues and docs/design.md.
"""
