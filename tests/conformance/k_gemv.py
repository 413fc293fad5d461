"""GEMV y = A @ x the two ways TileLang's gemv examples do it: one output element per thread
with a scalar accumulator (T.alloc_var) walking K, and a block tile of A in a fragment reduced
along K (T.reduce_sum)."""

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[-1])
def gemv_scalar(N, K, block_N=128, block_K=64, dtype="float16"):
    @T.prim_func
    def gemv(A: T.Tensor((N, K), dtype), x: T.Tensor((K,), dtype), y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=block_N) as bn:
            for tn in T.Parallel(block_N):
                acc = T.alloc_var("float32")
                acc = 0.0
                for ko in T.serial(T.ceildiv(K, block_K)):
                    for tk in T.serial(block_K):
                        k = ko * block_K + tk
                        acc += T.cast(A[bn * block_N + tn, k], "float32") * \
                            T.cast(x[k], "float32")
                y[bn * block_N + tn] = T.cast(acc, dtype)

    return gemv


register(Case(
    "gemv_scalar", "gemv", ("alloc_var", "inplace", "parallel", "jit", "prim_func"),
    factory=gemv_scalar,
    inputs=lambda rng, s: [(rng.standard_normal((s["N"], s["K"])), "float16"),
                           (rng.standard_normal(s["K"]), "float16")],
    reference=lambda v, s: v[0] @ v[1], tol=2e-3,
    cpu={"N": 200, "K": 160}, gpu={"N": 14336, "K": 4096},
    work=lambda s: ("bytes", 2 * s["N"] * s["K"]),
    torch_op=lambda torch, v, s: (lambda: torch.mv(v[0], v[1]))))


@tiled.jit(out_idx=[-1])
def gemv_tile(N, K, block_N=8, block_K=256, dtype="float16", threads=128):
    @T.prim_func
    def gemv(A: T.Tensor((N, K), dtype), x: T.Tensor((K,), dtype), y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=threads) as bn:
            a = T.alloc_fragment((block_N, block_K), "float32")
            xs = T.alloc_shared((block_K,), dtype)
            part = T.alloc_fragment((block_N,), "float32")
            acc = T.alloc_fragment((block_N,), "float32")
            T.clear(acc)
            for ko in T.serial(T.ceildiv(K, block_K)):
                T.copy(A[bn * block_N, ko * block_K], a)
                T.copy(x[ko * block_K], xs)
                for i, j in T.Parallel(block_N, block_K):
                    a[i, j] *= T.cast(xs[j], "float32")
                T.reduce_sum(a, part, dim=1)
                for i in T.Parallel(block_N):
                    acc[i] += part[i]
            for i in T.Parallel(block_N):
                y[bn * block_N + i] = T.cast(acc[i], dtype)

    return gemv


register(Case(
    "gemv_tile", "gemv", ("copy_g2f", "copy_g2s", "reduce", "inplace", "jit", "prim_func"),
    factory=gemv_tile,
    inputs=lambda rng, s: [(rng.standard_normal((s["N"], s["K"])), "float16"),
                           (rng.standard_normal(s["K"]), "float16")],
    reference=lambda v, s: v[0] @ v[1], tol=2e-3,
    cpu={"N": 40, "K": 600}, gpu={"N": 14336, "K": 4096},
    work=lambda s: ("bytes", 2 * s["N"] * s["K"]),
    torch_op=lambda torch, v, s: (lambda: torch.mv(v[0], v[1]))))
