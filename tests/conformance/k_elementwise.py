"""Elementwise kernels: TileLang's elementwise-add example shape (index math in a T.Parallel
nest, ragged tails left to the guards), a tiled copy with vector hints, a fused SiLU-mul."""

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[-1])
def elementwise_add(M, N, block_M=32, block_N=32, in_dtype="float32", out_dtype="float32",
                    threads=128):
    @T.prim_func
    def main(A: T.Tensor((M, N), in_dtype), B: T.Tensor((M, N), in_dtype),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            start_x = bx * block_N
            start_y = by * block_M
            for local_y, local_x in T.Parallel(block_M, block_N):
                y = start_y + local_y
                x = start_x + local_x
                C[y, x] = A[y, x] + B[y, x]

    return main


register(Case(
    "elementwise_add", "elementwise", ("prim_func", "jit", "parallel"),
    factory=elementwise_add,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["N"])), "float32"),
                           (rng.standard_normal((s["M"], s["N"])), "float32")],
    reference=lambda x, s: x[0] + x[1],
    cpu={"M": 100, "N": 70}, gpu={"M": 8192, "N": 8192, "block_M": 64, "block_N": 128,
                                  "threads": 256},
    work=lambda s: ("bytes", 3 * 4 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.add(x[0], x[1]))))


@tiled.jit(out_idx=[-1])
def tiled_copy_scale(N, block=1024, dtype="float16", threads=256):
    Ndyn = T.dyn("N")

    @T.prim_func
    def scale(X: T.Tensor((Ndyn,), dtype), Y: T.Tensor((Ndyn,), dtype)):
        with T.Kernel(T.ceildiv(Ndyn, block), threads=threads) as bx:
            tile = T.alloc_shared((block,), dtype)
            T.copy(X[bx * block:(bx + 1) * block], tile)
            for i in T.Parallel(block, coalesced_width=8):
                tile[i] = tile[i] * 2
            for v in T.vectorized(8):  # the first 8 elements once more, as one vector
                tile[v] = tile[v] + 1
            T.copy(tile, Y[bx * block:(bx + 1) * block])

    return scale


def _copy_scale_ref(x, s):
    y = x[0] * 2
    for b in range(0, len(y), 1024):
        y[b:b + 8] += 1
    return y


register(Case(
    "tiled_copy_scale", "elementwise",
    ("slice", "copy_g2s", "copy_s2g", "coalesced_width", "vectorized", "symbolic", "jit"),
    factory=tiled_copy_scale,
    inputs=lambda rng, s: [(rng.standard_normal(s["N"]), "float16")],
    reference=_copy_scale_ref, tol=1e-3,
    cpu={"N": 3000}, gpu={"N": 1 << 26},
    work=lambda s: ("bytes", 2 * 2 * s["N"]),
    torch_op=lambda torch, x, s: (lambda: _copy_scale_torch(x[0]))))


def _copy_scale_torch(x):
    """What a torch user writes for tiled_copy_scale: x * 2, then + 1 on the first 8 of each
    1024 elements."""
    y = x * 2
    full = y.shape[0] // 1024 * 1024
    y[:full].view(-1, 1024)[:, :8] += 1
    y[full:full + 8] += 1
    return y


@tiled.jit(out_idx=[-1])
def silu_and_mul(M, N, block_M=4, block_N=1024, dtype="float16", threads=128):
    Mdyn = T.dyn("M")

    @T.prim_func
    def main(X: T.Tensor((Mdyn, 2 * N), dtype), Y: T.Tensor((Mdyn, N), dtype)):
        with T.Kernel(T.ceildiv(Mdyn, block_M), T.ceildiv(N, block_N), threads=threads) as (
                bx, by):
            for i, j in T.Parallel(block_M, block_N):
                row, col = bx * block_M + i, by * block_N + j
                gate = T.cast(X[row, col], "float32")
                up = T.cast(X[row, N + col], "float32")
                Y[row, col] = T.cast(gate * T.sigmoid(gate) * up, dtype)

    return main


register(Case(
    "silu_and_mul", "elementwise", ("parallel", "symbolic", "jit"),
    factory=silu_and_mul,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], 2 * s["N"])), "float16")],
    reference=lambda x, s: (x[0][:, :s["N"]] / (1 + np.exp(-x[0][:, :s["N"]]))
                            * x[0][:, s["N"]:]),
    tol=2e-3, cpu={"M": 7, "N": 1000}, gpu={"M": 4096, "N": 14336},
    work=lambda s: ("bytes", 3 * 2 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.nn.functional.silu(x[0][:, :s["N"]])
                                  * x[0][:, s["N"]:])))
