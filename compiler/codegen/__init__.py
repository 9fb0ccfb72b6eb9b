"""Code generation: kernels for the CPU (llvm/) and, later, CUDA."""
