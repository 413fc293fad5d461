"""Scans and atomic reductions: a row-wise cumulative sum (T.cumsum on fragments and on shared
tiles, forward and reverse), and column max / min over all rows with T.atomic_max /
T.atomic_min into outputs initialised by the kernel's caller."""

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register, zeros_like_inputs


@tiled.jit(out_idx=[1, 2])
def cumsum_rows(M, N, blk_m=4, threads=128):
    Mdyn = T.dyn("M")

    @T.prim_func
    def cumsum(X: T.Tensor((Mdyn, N), "float32"), Fwd: T.Tensor((Mdyn, N), "float32"),
               Rev: T.Tensor((Mdyn, N), "float32")):
        with T.Kernel(T.ceildiv(Mdyn, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            s = T.alloc_shared((blk_m, N), "float32")
            T.copy(X[bx * blk_m, 0], x)
            T.copy(x, s)
            T.cumsum(x, dim=1)
            T.cumsum(s, dim=1, reverse=True)
            T.copy(x, Fwd[bx * blk_m, 0])
            T.copy(s, Rev[bx * blk_m, 0])

    return cumsum


register(Case(
    "cumsum_rows", "cumsum", ("cumsum", "copy_g2f", "copy_s2f", "copy_f2g", "copy_s2g",
                              "symbolic", "jit", "prim_func"),
    factory=cumsum_rows,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["N"])), "float32")],
    reference=lambda x, s: [np.cumsum(x[0], axis=1),
                            np.cumsum(x[0][:, ::-1], axis=1)[:, ::-1]],
    tol=1e-5, cpu={"M": 10, "N": 64}, gpu={"M": 16384, "N": 1024},
    work=lambda s: ("bytes", 3 * 4 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.cumsum(x[0], dim=1))))


@tiled.jit
def column_extrema(M, N, blk_m=32, blk_n=64, threads=128):
    @T.prim_func
    def extrema(X: T.Tensor((M, N), "float32"), Hi: T.Tensor((N,), "float32"),
                Lo: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, blk_n), T.ceildiv(M, blk_m), threads=threads) as (bx, by):
            hi = T.alloc_fragment((blk_n,), "float32")
            lo = T.alloc_fragment((blk_n,), "float32")
            T.fill(hi, T.min_value("float32"))
            T.fill(lo, T.max_value("float32"))
            for j in T.Parallel(blk_n):
                for i in T.serial(blk_m):
                    if by * blk_m + i < M:
                        hi[j] = T.max(hi[j], X[by * blk_m + i, bx * blk_n + j])
                        lo[j] = T.min(lo[j], X[by * blk_m + i, bx * blk_n + j])
            for j in T.Parallel(blk_n):
                T.atomic_max(Hi[bx * blk_n + j], hi[j])
                T.atomic_min(Lo[bx * blk_n + j], lo[j])

    return extrema


def _extrema_call(kernel, x, s):
    """The outputs start at the identities of max and min (the kernel only joins into them)."""
    hi = zeros_like_inputs(x, (s["N"],), "float32")
    lo = zeros_like_inputs(x, (s["N"],), "float32")
    hi[:] = -np.inf
    lo[:] = np.inf
    kernel(x[0], hi, lo)
    return [hi, lo]


register(Case(
    "column_extrema", "reduction", ("atomic_max_min", "max_min_value", "if", "parallel",
                                    "jit", "prim_func"),
    factory=column_extrema, call=_extrema_call,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["N"])), "float32")],
    reference=lambda x, s: [x[0].max(axis=0), x[0].min(axis=0)],
    tol=0.0, cpu={"M": 100, "N": 130}, gpu={"M": 65536, "N": 4096},
    work=lambda s: ("bytes", 4 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.aminmax(x[0], dim=0)[::-1])))  # (max, min)
