"""A hand-scheduled warp-specialized GEMM for Hopper (cuda:sm_90a): C = A @ B, fp16 or bf16
inputs, fp32 accumulation.

Warpgroup 1 is the producer: for each K tile it waits until stage s of the shared ring is empty,
announces the stage's bytes on `full[s]` and issues two TMA copies into it. Warpgroup 0 is the
consumer: it waits until stage s is full, multiplies it into its accumulator (T.gemm) and hands
the stage back by arriving on `empty[s]`; then it writes its tile of C. The ring's phases
alternate parity every `stages` tiles; a fresh barrier counts as having completed parity 1, so
the producer's first pass over the empty barriers does not wait.

Run: python examples/gemm_ws_explicit.py [--target cuda:sm_90a] [--dtype bfloat16]
(it needs a Hopper GPU to run; `cpu` and `cuda:sm_80` refuse the explicit path's statements.)
"""

import tiled
import tiled.lang as T


def matmul(M=4096, N=4096, K=4096, block_M=128, block_N=128, block_K=64, stages=4,
           dtype="float16", accum_dtype="float32", out_dtype=None):
    """M, N and K may be ints or T.dyn(...) dims; tails past them read as zeros (TMA) and are
    not written."""
    out_dtype = out_dtype or dtype
    stage_bytes = (block_M * block_K + block_K * block_N) * 2  # 16-bit A and B tiles

    @tiled.kernel
    def gemm_ws(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_s = T.alloc_shared((stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((stages, block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            full = T.alloc_barrier(stages, arrive_count=128)   # the producer warpgroup arrives
            empty = T.alloc_barrier(stages, arrive_count=128)  # the consumer warpgroup arrives
            k_tiles = T.ceildiv(K, block_K)
            with T.ws(1, regs=40):  # producer: one thread issues the copies
                for k in T.serial(k_tiles):
                    s = k % stages
                    T.mbarrier_wait_parity(empty[s], 1 - (k // stages) % 2)
                    T.mbarrier_expect_tx(full[s], stage_bytes)
                    T.tma_copy(A[by * block_M, k * block_K], A_s[s, :, :], full[s])
                    T.tma_copy(B[k * block_K, bx * block_N], B_s[s, :, :], full[s])
                    T.mbarrier_arrive(full[s])
            with T.ws(0):  # consumer
                T.clear(C_local)
                for k in T.serial(k_tiles):
                    s = k % stages
                    T.mbarrier_wait_parity(full[s], (k // stages) % 2)
                    T.gemm(A_s[s, :, :], B_s[s, :, :], C_local)
                    T.mbarrier_arrive(empty[s])
                T.copy(C_local, C[by * block_M, bx * block_N])

    return gemm_ws


def reference(a, b):
    """C in float64 from the same inputs (numpy arrays)."""
    import numpy as np

    return a.astype(np.float64) @ b.astype(np.float64)


def main(target="cuda:sm_90a", M=1000, N=1000, K=1000, dtype="float16"):
    if not target.startswith("cuda:sm_90"):
        raise SystemExit(f"gemm_ws_explicit uses T.ws, mbarriers and TMA: it compiles for "
                         f"cuda:sm_90a only, not {target}")
    import torch

    kernel = tiled.compile(matmul(M, N, K, dtype=dtype), target=target)
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(M, K, device="cuda").to(torch_dtype)
    b = torch.randn(K, N, device="cuda").to(torch_dtype)
    c = torch.zeros(M, N, device="cuda", dtype=torch_dtype)
    kernel(a, b, c)
    torch.cuda.synchronize()
    ref = reference(a.float().cpu().numpy(), b.float().cpu().numpy())
    got = c.double().cpu().numpy()
    err = ((got - ref) ** 2).sum() ** 0.5 / (ref ** 2).sum() ** 0.5
    print(f"gemm_ws_explicit {M}x{N}x{K} {dtype} on {target}: relative error {err:.2e}")
    assert err < 1e-2, err


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--target", default="cuda:sm_90a")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = p.parse_args()
    main(args.target, dtype=args.dtype)
