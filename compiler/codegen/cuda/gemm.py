"""Kiln's CUDA GEMM: a shared-memory tiled, register-blocked SGEMM printed as numba.cuda source.

``gemm_source(tile)`` prints one kernel per tile shape (``TILES``), which computes, for each batch
entry z (grid axis z)::

    C[z][m, n] = act(alpha * sum_k A[z][m, k] * B[z][k, n] + beta * bias[m, n])

Every operand is a flat float32 array addressed through strides (so transposed operands, NCHW
images and a convolution's column matrix need no copy) plus a per-batch element offset read from
an int64 array (``aoff[z]``, ``boff[z]``, ``coff[z]``: broadcast batch dimensions repeat an
offset). ``bias`` is read at ``m * sbm + n * sbn`` (strides 0 broadcast: a per-channel bias is
``sbm = 1, sbn = 0``); ``act`` 1 is ReLU. A block of 16 x 16 threads computes a BM x BN tile of C:
each step it stages a BM x BK slab of A and a BK x BN slab of B in shared memory (each thread loads
its share, zeros outside the matrices), then every thread accumulates its TM x TN outputs (rows ``ty
+ 16 i``, columns ``tx + 16 j``: the B reads of a warp are consecutive) in registers, which the
source spells out one variable each so numba keeps them in registers.

``GemmCall`` is one launch's description (sizes, strides, offsets); ``choose_tile`` picks the tile:
the largest that still gives the GPU enough blocks, and for a product of at most four rows (a batch-1
linear layer) the GEMV kernel (``gemv_source``), which splits K among a block's threads instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: tile name -> (BM, BN, BK); threads are always 16 x 16
TILES = {"s32": (32, 32, 16), "s64": (64, 64, 16), "s128": (128, 128, 8)}
THREADS = 16
#: the product of a few rows (M at most ``GEMV_ROWS``): a block of 32 columns x ``GEMV_SLICES`` slices of K
GEMV_ROWS = 4
GEMV_SLICES = 8
#: loads of B each GEMV thread has in flight (its K loop unrolled this many times)
GEMV_UNROLL = 4


def gemm_source(tile: str) -> str:
    """The ``@cuda.jit`` source of ``kiln_sgemm_{tile}`` (see the module docstring)."""
    if tile == "gemv":
        return gemv_source()
    bm, bn, bk = TILES[tile]
    tm, tn = bm // THREADS, bn // THREADS
    la, lb = bm * bk // (THREADS * THREADS), bk * bn // (THREADS * THREADS)
    acc = [[f"c{i}_{j}" for j in range(tn)] for i in range(tm)]
    out = []
    e = out.append
    e("@cuda.jit")
    e(f"def kiln_sgemm_{tile}(a, b, c, bias, aoff, boff, coff, M, N, K, sam, sak, sbk, sbn, scm, scn, "
      "sbm_, sbn_, alpha, beta, act):")
    e(f"    As = cuda.shared.array(({bk}, {bm}), float32)")
    e(f"    Bs = cuda.shared.array(({bk}, {bn}), float32)")
    e("    tx = cuda.threadIdx.x")
    e("    ty = cuda.threadIdx.y")
    e(f"    tid = ty * {THREADS} + tx")
    e(f"    m0 = cuda.blockIdx.y * {bm}")
    e(f"    n0 = cuda.blockIdx.x * {bn}")
    e("    z = cuda.blockIdx.z")
    e("    ao = aoff[z]")
    e("    bo = boff[z]")
    e("    co = coff[z]")
    for row in acc:
        e("    " + " = ".join(row) + " = float32(0.0)")
    e(f"    for k0 in range(0, K, {bk}):")
    for l in range(la):  # A slab: element e = tid + 256 l; k fastest
        e(f"        ea = tid + {l * THREADS * THREADS}")
        e(f"        mm = ea // {bk}")
        e(f"        kk = ea % {bk}")
        e("        gm = m0 + mm")
        e("        gk = k0 + kk")
        e("        if gm < M and gk < K:")
        e("            As[kk, mm] = a[ao + gm * sam + gk * sak]")
        e("        else:")
        e("            As[kk, mm] = float32(0.0)")
    for l in range(lb):  # B slab: n fastest
        e(f"        eb = tid + {l * THREADS * THREADS}")
        e(f"        kk = eb // {bn}")
        e(f"        nn = eb % {bn}")
        e("        gk = k0 + kk")
        e("        gn = n0 + nn")
        e("        if gk < K and gn < N:")
        e("            Bs[kk, nn] = b[bo + gk * sbk + gn * sbn]")
        e("        else:")
        e("            Bs[kk, nn] = float32(0.0)")
    e("        cuda.syncthreads()")
    e(f"        for kk in range({bk}):")
    for i in range(tm):
        e(f"            a{i} = As[kk, ty + {THREADS * i}]")
    for j in range(tn):
        e(f"            b{j} = Bs[kk, tx + {THREADS * j}]")
    for i in range(tm):
        for j in range(tn):
            e(f"            {acc[i][j]} += a{i} * b{j}")
    e("        cuda.syncthreads()")
    for i in range(tm):
        e(f"    gm = m0 + ty + {THREADS * i}")
        e("    if gm < M:")
        for j in range(tn):
            e(f"        gn = n0 + tx + {THREADS * j}")
            e("        if gn < N:")
            e(f"            v = alpha * {acc[i][j]}")
            e("            if beta != 0.0:")
            e("                v += beta * bias[gm * sbm_ + gn * sbn_]")
            e("            if act == 1 and v < 0.0:")
            e("                v = float32(0.0)")
            e("            c[co + gm * scm + gn * scn] = v")
    return "\n".join(out) + "\n"


def gemv_source() -> str:
    """``kiln_sgemm_gemv``: the same contract for at most ``GEMV_ROWS`` rows of A (a batch-1 linear
    layer). A block holds 32 columns (x, so a warp reads 32 consecutive elements of a B row) by
    ``GEMV_SLICES`` interleaved slices of K (y); each thread sums its slice for every row (its loop
    unrolled ``GEMV_UNROLL`` times, so that many loads are in flight: the kernel is bound by memory
    latency, not bandwidth), the slices are added in shared memory, and the first slice's threads
    finish and store. Grid: (column blocks, 1, batch)."""
    r, sl = GEMV_ROWS, GEMV_SLICES
    e = [
        "@cuda.jit",
        "def kiln_sgemm_gemv(a, b, c, bias, aoff, boff, coff, M, N, K, sam, sak, sbk, sbn, scm, scn, sbm_, sbn_, "
        "alpha, beta, act):",
        f"    part = cuda.shared.array(({r}, {sl}, 32), float32)",
        "    tx = cuda.threadIdx.x",
        "    ty = cuda.threadIdx.y",
        "    n = cuda.blockIdx.x * 32 + tx",
        "    z = cuda.blockIdx.z",
        "    ao = aoff[z]",
        "    bo = boff[z]",
        "    co = coff[z]",
    ]
    e.append("    " + " = ".join(f"s{i}" for i in range(r)) + " = float32(0.0)")
    u = GEMV_UNROLL
    e += ["    if n < N:",
          "        k = ty",
          f"        while k + {(u - 1) * sl} < K:"]  # unrolled: loads in flight
    for j in range(u):
        e.append(f"            bv{j} = b[bo + (k + {j * sl}) * sbk + n * sbn]")
    for i in range(r):
        e.append(f"            if {i} < M:")
        for j in range(u):
            e.append(f"                s{i} += a[ao + {i} * sam + (k + {j * sl}) * sak] * bv{j}")
    e += [f"            k += {u * sl}",
          "        while k < K:",
          "            bv = b[bo + k * sbk + n * sbn]"]
    for i in range(r):
        e += [f"            if {i} < M:", f"                s{i} += a[ao + {i} * sam + k * sak] * bv"]
    e.append(f"            k += {sl}")
    for i in range(r):
        e.append(f"    part[{i}, ty, tx] = s{i}")
    e += ["    cuda.syncthreads()",
          f"    if ty < {r} and n < N and ty < M:",
          "        v = float32(0.0)",
          f"        for j in range({sl}):",
          "            v += part[ty, j, tx]",
          "        v = alpha * v",
          "        if beta != 0.0:",
          "            v += beta * bias[ty * sbm_ + n * sbn_]",
          "        if act == 1 and v < 0.0:",
          "            v = float32(0.0)",
          "        c[co + ty * scm + n * scn] = v"]
    return "\n".join(e) + "\n"


@dataclass
class GemmCall:
    """One GEMM launch: sizes, operand strides (elements), per-batch offsets, bias and activation."""

    M: int
    N: int
    K: int
    a_strides: tuple[int, int]           # (m, k)
    b_strides: tuple[int, int]           # (k, n)
    c_strides: tuple[int, int]           # (m, n)
    a_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    b_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    c_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    alpha: float = 1.0
    beta: float = 0.0                    # 0: no bias
    bias_strides: tuple[int, int] = (0, 0)
    act: int = 0                         # 0 none, 1 ReLU

    @property
    def batch(self) -> int:
        return len(self.c_offsets)

    def scalars(self) -> list:
        """The kernel's scalar arguments after the arrays, typed as numba will see them."""
        i, f = np.int64, np.float32
        return [i(self.M), i(self.N), i(self.K), i(self.a_strides[0]), i(self.a_strides[1]), i(self.b_strides[0]),
                i(self.b_strides[1]), i(self.c_strides[0]), i(self.c_strides[1]), i(self.bias_strides[0]),
                i(self.bias_strides[1]), f(self.alpha), f(self.beta), i(self.act)]


def choose_tile(M: int, N: int, batch: int, sms: int = 132) -> str:
    """The GEMV kernel for a few rows; else the largest tile that still makes two blocks per
    multiprocessor, else the smallest (more blocks for a small product)."""
    if M <= GEMV_ROWS:
        return "gemv"
    for tile in ("s128", "s64"):
        bm, bn, _ = TILES[tile]
        if -(-M // bm) * -(-N // bn) * batch >= 2 * sms:
            return tile
    return "s32"


def split_k(call: GemmCall, sms: int = 132) -> int:
    """Into how many slices of K to split a product that gives the GPU too few blocks (a long K and
    a small M x N: ResNet's last 3x3 convolutions, 512 x 49 x 4608): 1, or a power of two up to 16
    that divides K, keeps each slice at least 256 long and the blocks within two per multiprocessor.
    The slices' partial products go to scratch memory and a second kernel adds them and finishes."""
    if call.batch != 1 or call.M <= GEMV_ROWS:
        return 1
    bm, bn, _ = TILES[choose_tile(call.M, call.N, 1, sms)]
    blocks = -(-call.M // bm) * -(-call.N // bn)
    best = 1
    for s in (2, 4, 8, 16):
        if blocks * s <= 2 * sms and call.K % s == 0 and call.K // s >= 256:
            best = s
    return best if blocks < sms else 1


def grid(call: GemmCall, tile: str) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """(blocks (x: column tiles, y: row tiles, z: batch), threads)."""
    if tile == "gemv":
        return (-(-call.N // 32), 1, call.batch), (32, GEMV_SLICES)
    bm, bn, _ = TILES[tile]
    return (-(-call.N // bn), -(-call.M // bm), call.batch), (THREADS, THREADS)


def reference(call: GemmCall, a: np.ndarray, b: np.ndarray, c: np.ndarray, bias: np.ndarray | None = None) -> None:
    """What the kernel computes, in NumPy (the tests' oracle): writes ``c`` in place."""
    for z in range(call.batch):
        mi, ki, ni = np.arange(call.M)[:, None], np.arange(call.K)[None, :], np.arange(call.N)[None, :]
        A = a[call.a_offsets[z] + mi * call.a_strides[0] + ki * call.a_strides[1]].astype(np.float64)
        B = b[call.b_offsets[z] + ki.T * call.b_strides[0] + ni * call.b_strides[1]].astype(np.float64)
        v = call.alpha * (A @ B)
        if call.beta != 0.0:
            v = v + call.beta * bias[mi * call.bias_strides[0] + ni * call.bias_strides[1]]
        if call.act == 1:
            v = np.maximum(v, 0.0)
        c[call.c_offsets[z] + mi * call.c_strides[0] + ni * call.c_strides[1]] = v.astype(np.float32)


__all__ = ["GemmCall", "TILES", "choose_tile", "gemm_source", "grid", "reference", "split_k"]
