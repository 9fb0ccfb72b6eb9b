"""Row kernels for the GPU: Softmax and LayerNormalization (float32) with a block of threads per row.

The CPU's loop-form kernels give each row to one thread, which on a GPU leaves most of it idle (a
BERT layer's LayerNorm: 128 rows). Here a block of ``THREADS`` threads takes a row (blocks stride
over the rows): each thread reduces its share of the row, the block combines the shares in shared
memory (a tree), and the threads write their share of the result. Reductions are the reference's:
Softmax shifts by the row's maximum (NaN if the row holds one) and divides by the sum of the
exponentials; LayerNormalization standardizes with the mean and the mean squared deviation in
float32, then scales and shifts.
"""
from __future__ import annotations

THREADS = 128


def reduce_lines(var: str, combine: str, indent: str = "    ") -> list[str]:
    """Lines combining every thread's ``var`` into ``var`` of all threads (``combine``: a format of
    two operands)."""
    out = [f"{indent}sh[t] = {var}", f"{indent}cuda.syncthreads()", f"{indent}step = {THREADS // 2}",
           f"{indent}while step > 0:", f"{indent}    if t < step:",
           f"{indent}        sh[t] = {combine.format('sh[t]', 'sh[t + step]')}",
           f"{indent}    cuda.syncthreads()", f"{indent}    step //= 2", f"{indent}{var} = sh[0]",
           f"{indent}cuda.syncthreads()"]
    return out


def softmax_source() -> str:
    """``kiln_softmax_rows(x, y, R, L)``: ``y`` = softmax of each of the R rows of length L of ``x``."""
    i = "        "
    lines = ["@cuda.jit", "def kiln_softmax_rows(x, y, R, L):", f"    sh = cuda.shared.array({THREADS}, float32)",
             "    t = cuda.threadIdx.x", "    for r in range(cuda.blockIdx.x, R, cuda.gridDim.x):",
             f"{i}base = r * L", f"{i}m = float32(-math.inf)", f"{i}for j in range(t, L, {THREADS}):",
             f"{i}    v = x[base + j]", f"{i}    if v > m or v != v:", f"{i}        m = v"]
    lines += reduce_lines("m", "_fmax({0}, {1})", i)
    lines += [f"{i}s = float32(0.0)", f"{i}for j in range(t, L, {THREADS}):",
              f"{i}    e = float32(math.exp(x[base + j] - m))", f"{i}    y[base + j] = e", f"{i}    s += e"]
    lines += reduce_lines("s", "{0} + {1}", i)
    lines += [f"{i}inv = float32(1.0) / s", f"{i}for j in range(t, L, {THREADS}):", f"{i}    y[base + j] *= inv"]
    return "\n".join(lines) + "\n"


def layernorm_source() -> str:
    """``kiln_layernorm_rows(x, scale, bias, y, R, L, eps, has_bias)``: each row standardized, times
    ``scale[j]``, plus ``bias[j]`` when ``has_bias``."""
    i = "        "
    lines = ["@cuda.jit", "def kiln_layernorm_rows(x, scale, bias, y, R, L, eps, has_bias):",
             f"    sh = cuda.shared.array({THREADS}, float32)", "    t = cuda.threadIdx.x",
             "    for r in range(cuda.blockIdx.x, R, cuda.gridDim.x):", f"{i}base = r * L",
             f"{i}s = float32(0.0)", f"{i}for j in range(t, L, {THREADS}):", f"{i}    s += x[base + j]"]
    lines += reduce_lines("s", "{0} + {1}", i)
    lines += [f"{i}mean = s / float32(L)", f"{i}q = float32(0.0)", f"{i}for j in range(t, L, {THREADS}):",
              f"{i}    d = x[base + j] - mean", f"{i}    q += d * d"]
    lines += reduce_lines("q", "{0} + {1}", i)
    lines += [f"{i}inv = float32(1.0) / float32(math.sqrt(q / float32(L) + eps))",
              f"{i}for j in range(t, L, {THREADS}):", f"{i}    v = (x[base + j] - mean) * inv * scale[j]",
              f"{i}    if has_bias:", f"{i}        v += bias[j]", f"{i}    y[base + j] = v"]
    return "\n".join(lines) + "\n"


__all__ = ["THREADS", "layernorm_source", "reduce_lines", "softmax_source"]
