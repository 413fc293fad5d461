"""DeepSeek MLA decode (multi-head latent attention with absorbed weights), written as
TileLang's deepseek_mla example writes it: one query token per sequence, `heads` query heads
over one latent kv head whose `dim` lanes are both keys and values, plus `pe_dim` rotary
lanes that only the scores read. A block takes block_H heads of one sequence; per block_N-token
step the scores are two gemms (latent lanes, then rope lanes) and an online softmax rescales
the output (base 2, fp32 accumulation).

    Q [batch, heads, dim], Q_pe [batch, heads, pe_dim], KV [batch, seqlen, 1, dim],
    K_pe [batch, seqlen, 1, pe_dim] -> Output [batch, heads, dim]

On cuda:sm_90a, 64 heads a block on 256 threads: the gemms are FullCol, so the two
warpgroups split the columns of the scores and of the 512-wide output and every gemm takes
wgmma (one warpgroup could not hold 64 x 512 floats); P passes through S_shared, which each
warpgroup reads whole. tiled.ops.mla_decode is the serving op over a paged cache.

Run: python examples/mla_decode.py [--target cpu|cuda:sm_90a]   (cuda needs a GPU to run)
"""

import tiled
import tiled.lang as T

LOG2E = 1.4426950408889634


def mla_decode(batch, heads, seqlen, dim, pe_dim, block_N=32, block_H=64, threads=256,
               num_stages=2, dtype="bfloat16"):
    """The kernel for static sizes; `seqlen` a multiple of block_N, `heads` of block_H. At
    DeepSeek-V3's dims (512 + 64) with 2 stages: block_N 32, or 64 as TileLang runs it (O_shared
    then shares the key ring's bytes: it lives after the loop)."""
    if seqlen % block_N or heads % block_H:
        raise ValueError(f"seqlen {seqlen} and heads {heads} must be multiples of block_N "
                         f"{block_N} and block_H {block_H}")
    scale = (dim + pe_dim) ** -0.5 * LOG2E
    acc = "float"

    @tiled.kernel
    def mla_decode_kernel(Q: T.Tensor([batch, heads, dim], dtype),
                          Q_pe: T.Tensor([batch, heads, pe_dim], dtype),
                          KV: T.Tensor([batch, seqlen, 1, dim], dtype),
                          K_pe: T.Tensor([batch, seqlen, 1, pe_dim], dtype),
                          Output: T.Tensor([batch, heads, dim], dtype)):
        with T.Kernel(batch, heads // block_H, threads=threads) as (bx, by):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            Q_pe_shared = T.alloc_shared([block_H, pe_dim], dtype)
            KV_shared = T.alloc_shared([block_N, dim], dtype)
            K_pe_shared = T.alloc_shared([block_N, pe_dim], dtype)
            S_shared = T.alloc_shared([block_H, block_N], dtype)
            O_shared = T.alloc_shared([block_H, dim], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], acc)
            acc_o = T.alloc_fragment([block_H, dim], acc)
            scores_max = T.alloc_fragment([block_H], acc)
            scores_max_prev = T.alloc_fragment([block_H], acc)
            scores_scale = T.alloc_fragment([block_H], acc)
            scores_sum = T.alloc_fragment([block_H], acc)
            logsum = T.alloc_fragment([block_H], acc)
            T.copy(Q[bx, by * block_H:(by + 1) * block_H, :], Q_shared)
            T.copy(Q_pe[bx, by * block_H:(by + 1) * block_H, :], Q_pe_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(acc))
            for k in T.Pipelined(seqlen // block_N, num_stages=num_stages):
                T.copy(KV[bx, k * block_N:(k + 1) * block_N, 0, :], KV_shared)
                T.copy(K_pe[bx, k * block_N:(k + 1) * block_N, 0, :], K_pe_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True,
                       policy=T.GemmWarpPolicy.FullCol)
                T.gemm(Q_pe_shared, K_pe_shared, acc_s, transpose_B=True,
                       policy=T.GemmWarpPolicy.FullCol)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(acc))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                T.copy(acc_s, S_shared)
                for i in T.Parallel(block_H):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                for i, j in T.Parallel(block_H, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.gemm(S_shared, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullCol)
            for i, j in T.Parallel(block_H, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bx, by * block_H:(by + 1) * block_H, :])

    return mla_decode_kernel


def reference(q, q_pe, kv, k_pe):
    """The same attention in numpy, float64."""
    import numpy as np

    q, q_pe, kv, k_pe = (np.asarray(t, np.float64) for t in (q, q_pe, kv, k_pe))
    logits = (np.einsum("bhd,bsd->bhs", q, kv[:, :, 0]) +
              np.einsum("bhp,bsp->bhs", q_pe, k_pe[:, :, 0])) / np.sqrt(q.shape[-1] +
                                                                         q_pe.shape[-1])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhs,bsd->bhd", p / p.sum(-1, keepdims=True), kv[:, :, 0])


def main(target="cpu", batch=2, heads=64, seqlen=96, dim=64, pe_dim=16):
    import numpy as np

    kernel = tiled.compile(mla_decode(batch, heads, seqlen, dim, pe_dim, dtype="float32"),
                           target=target)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, heads, dim), np.float32)
    q_pe = rng.standard_normal((batch, heads, pe_dim), np.float32)
    kv = rng.standard_normal((batch, seqlen, 1, dim), np.float32)
    k_pe = rng.standard_normal((batch, seqlen, 1, pe_dim), np.float32)
    out = np.zeros((batch, heads, dim), np.float32)
    kernel(q, q_pe, kv, k_pe, out)
    np.testing.assert_allclose(out, reference(q, q_pe, kv, k_pe), rtol=1e-4, atol=1e-5)
    print(f"mla_decode {batch} x {heads} heads x {seqlen} tokens on {target}: ok")


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--target", default="cpu")
    main(p.parse_args().target)
