"""FlashAttention forward: O = softmax(Q K^T * scale [+ causal mask]) V, one block per block_M
query rows of one (batch, head), an online softmax over block_N-key tiles (running max and sum,
the output rescaled when the max grows), fp32 accumulation.

Layout: Q and O are [batch, heads, seq_q, dim], K and V are [batch, kv_heads, seq_kv, dim]
(torch SDPA's layout, contiguous). GQA: query head h reads kv head h // (heads // kv_heads).
The causal mask is top-left aligned (query i sees keys j <= i), as torch's is_causal.

Run: python examples/flash_attention.py [--target cpu|cuda:sm_90a]   (cuda needs a GPU to run)
"""

import math

import tiled
import tiled.lang as T

LOG2E = 1.4426950408889634


def flash_attention(batch, heads, kv_heads, seq_q, seq_kv, dim, causal=False, dtype="float16",
                    block_M=64, block_N=64, threads=128, num_stages=2):
    """seq_q and seq_kv may be ints or T.dyn names. On cuda:sm_90a, d 64 or 128 with
    block_M = 64 * (threads / 128) and block_N 64 or 128 take the warp-specialized attention
    path (TMA, wgmma, ping-ponged warpgroups; 128 x 128 tiles with 256 threads are the fast
    configuration), symbolic lengths included. Elsewhere (sm_80, other tiles) the kernel runs
    the generic tensor-core path, where a symbolic seq loses cp.async for the K / V copies."""
    if heads % kv_heads:
        raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads})")
    group = heads // kv_heads
    # exp(x * scale) == exp2(x * scale * log2(e)). The scores stay raw (q . k) until exp2
    # takes them, the scale folded into its argument: a pass that only scales them costs
    # 15% on sm_90a's per-op path (benchmarks/results/fa_example_probe_h200.json).
    qk_scale = LOG2E / math.sqrt(dim)
    neg_inf = -T.infinity("float32")

    @tiled.kernel
    def flash_attn(Q: T.Tensor((batch, heads, seq_q, dim), dtype),
                   K: T.Tensor((batch, kv_heads, seq_kv, dim), dtype),
                   V: T.Tensor((batch, kv_heads, seq_kv, dim), dtype),
                   Out: T.Tensor((batch, heads, seq_q, dim), dtype)):
        with T.Kernel(T.ceildiv(seq_q, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_s = T.alloc_shared((block_M, dim), dtype)
            K_s = T.alloc_shared((block_N, dim), dtype)
            V_s = T.alloc_shared((block_N, dim), dtype)
            # T.gemm on cuda reads both operands from shared memory: P goes through P_s.
            P_s = T.alloc_shared((block_M, block_N), dtype)
            S = T.alloc_fragment((block_M, block_N), "float32")
            acc = T.alloc_fragment((block_M, dim), "float32")
            row_max = T.alloc_fragment((block_M,), "float32")  # of the raw scores so far
            row_sum = T.alloc_fragment((block_M,), "float32")  # of exp2((s - row_max) * scale)
            alpha = T.alloc_fragment((block_M,), "float32")    # old max, then the rescale
            kv_head = by // group

            T.copy(Q[bz, by, bx * block_M, 0], Q_s)
            T.clear(acc)
            T.fill(row_max, neg_inf)
            T.clear(row_sum)
            n_tiles = T.ceildiv(seq_kv, block_N)
            if causal:  # tiles past the block's last query row are fully masked: skip them
                n_tiles = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N))
            for k in T.Pipelined(n_tiles, num_stages=num_stages):
                T.copy(K[bz, kv_head, k * block_N, 0], K_s)
                T.copy(V[bz, kv_head, k * block_N, 0], V_s)
                T.clear(S)
                T.gemm(Q_s, K_s, S, transpose_B=True)
                # Keys past seq_kv (read as zero) and, if causal, keys after the query are
                # masked. Key 0 is never masked, so every row's max is finite after tile 0.
                # Only a tile reaching past seq_kv or (causal) past the block's first query
                # row has masked keys; the others are left as they are.
                whole = (k + 1) * block_N <= seq_kv
                if causal:
                    whole = T.all_of(whole, (k + 1) * block_N <= bx * block_M + 1)
                if not whole:
                    for i, j in T.Parallel(block_M, block_N):
                        keep = k * block_N + j < seq_kv
                        if causal:
                            keep = T.all_of(keep, bx * block_M + i >= k * block_N + j)
                        S[i, j] = T.if_then_else(keep, S[i, j], neg_inf)
                for i in T.Parallel(block_M):
                    alpha[i] = row_max[i]
                T.reduce_max(S, row_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    # exp2(-inf) = 0 on the first tile
                    alpha[i] = T.exp2(alpha[i] * qk_scale - row_max[i] * qk_scale)
                    row_sum[i] = row_sum[i] * alpha[i]
                for i, j in T.Parallel(block_M, block_N):
                    S[i, j] = T.exp2(S[i, j] * qk_scale - row_max[i] * qk_scale)
                T.reduce_sum(S, row_sum, dim=1, clear=False)
                for i, j in T.Parallel(block_M, dim):
                    acc[i, j] = acc[i, j] * alpha[i]
                T.copy(S, P_s)
                T.gemm(P_s, V_s, acc)
            for i, j in T.Parallel(block_M, dim):
                acc[i, j] = acc[i, j] / row_sum[i]
            T.copy(acc, Out[bz, by, bx * block_M, 0])

    return flash_attn


def reference(q, k, v, causal):
    """float64 numpy attention on [batch, heads, seq, dim] arrays (GQA by repeating K/V)."""
    import numpy as np

    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, skv), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def main(target="cpu", batch=1, heads=2, kv_heads=1, seq=100, dim=64, dtype="float16"):
    import numpy as np

    rng = np.random.default_rng(0)
    for causal in (False, True):
        kernel = tiled.compile(flash_attention(batch, heads, kv_heads, seq, seq, dim, causal,
                                               dtype), target=target)
        q = rng.standard_normal((batch, heads, seq, dim)).astype(dtype)
        k, v = (rng.standard_normal((batch, kv_heads, seq, dim)).astype(dtype) for _ in "kv")
        o = np.full(q.shape, np.nan, dtype)
        kernel(q, k, v, o)
        ref = reference(q, k, v, causal)
        err = np.linalg.norm(o.astype(np.float64) - ref) / np.linalg.norm(ref)
        print(f"flash attention b{batch} h{heads}/{kv_heads} s{seq} d{dim} causal={causal} "
              f"{dtype} on {target}: relative error {err:.2e}")
        assert err < 1e-2, err


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--target", default="cpu")
    main(p.parse_args().target)
