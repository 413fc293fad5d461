"""GEMM C = A @ B: 128x128x32 tiles, a 3-stage pipelined K loop, tensor cores where present.

Run: python examples/gemm.py [--target cpu|cuda:sm_90a]   (cuda needs a GPU to run)
"""

import tiled
import tiled.lang as T


def matmul(M=4096, N=4096, K=4096, block_M=128, block_N=128, block_K=32, num_stages=3,
           dtype="float16", accum_dtype="float32", out_dtype=None, threads=128):
    """M may be an int or T.dyn("M")."""
    out_dtype = out_dtype or dtype

    @tiled.kernel
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return gemm


def main(target="cpu", M=1000, N=1000, K=1000, dtype="float16"):
    import numpy as np

    kernel = tiled.compile(matmul(M, N, K, dtype=dtype), target=target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    c = np.zeros((M, N), dtype)
    kernel(a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref)
    print(f"gemm {M}x{N}x{K} {dtype} on {target}: relative error {err:.2e}")
    assert err < 1e-2, err


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--target", default="cpu")
    main(p.parse_args().target)
