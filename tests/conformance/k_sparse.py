"""Sparse attention the way TileLang's deepseek_nsa forward example writes it: each query
token (one block per token and kv head, one warp) attends to the key blocks a block-index
tensor selects. The tile copies start at a value read from that tensor (`i_s = Idx[...] *
BS`, then `K[b, i_s:i_s + BS, h, :]`), a whole step sits under a data-dependent `if`, the
T.Parallel loops reuse the pipelined loop's name `i`, and `pass_configs` carries TileLang's
pass switches."""

import math

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[-1], pass_configs={tiled.PassConfigKey.TL_ENABLE_FAST_MATH: True,
                                       tiled.PassConfigKey.TL_DISABLE_TMA_LOWER: True,
                                       tiled.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})
def sparse_attention(batch, heads, seq_len, dim, groups, selected, block_size=32,
                     causal=True, dtype="float16"):
    acc = "float"
    log2_scale = 1.44269504 / math.sqrt(dim)
    kv_heads = heads // groups
    G, BS, S = groups, block_size, selected
    BK = BV = min(128, 1 << (dim - 1).bit_length())
    q_shape, kv_shape = [batch, seq_len, heads, dim], [batch, seq_len, kv_heads, dim]

    @T.prim_func
    def nsa(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype),
            V: T.Tensor(kv_shape, dtype), Idx: T.Tensor([batch, seq_len, kv_heads, S], "int32"),
            Out: T.Tensor(q_shape, dtype)):
        with T.Kernel(seq_len, T.ceildiv(dim, BV), batch * kv_heads, threads=32) as (t, v, bh):
            q_s = T.alloc_shared([G, BK], dtype)
            k_s = T.alloc_shared([BS, BK], dtype)
            v_s = T.alloc_shared([BS, BV], dtype)
            o_s = T.alloc_shared([G, BV], dtype)
            s = T.alloc_fragment([G, BS], acc)
            p = T.alloc_fragment([G, BS], dtype)
            o = T.alloc_fragment([G, BV], acc)
            m = T.alloc_fragment([G], acc)
            m_prev = T.alloc_fragment([G], acc)
            alpha = T.alloc_fragment([G], acc)
            row_sum = T.alloc_fragment([G], acc)
            denom = T.alloc_fragment([G], acc)
            b, h = bh // kv_heads, bh % kv_heads
            T.copy(Q[b, t, h * G:(h + 1) * G, :], q_s)
            T.fill(o, 0)
            T.fill(denom, 0)
            T.fill(m, -T.infinity(acc))
            for i in T.Pipelined(S, num_stages=2):
                i_s = Idx[b, t, h, i] * BS
                if i_s <= t and i_s >= 0:
                    T.copy(K[b, i_s:i_s + BS, h, :], k_s)
                    if causal:
                        for i, j in T.Parallel(G, BS):
                            s[i, j] = T.if_then_else(t >= i_s + j, 0, -T.infinity(acc))
                    else:
                        T.clear(s)
                    T.gemm(q_s, k_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(m, m_prev)
                    T.fill(m, -T.infinity(acc))
                    T.reduce_max(s, m, dim=1, clear=True)
                    for i in T.Parallel(G):
                        alpha[i] = T.exp2(m_prev[i] * log2_scale - m[i] * log2_scale)
                    for i, j in T.Parallel(G, BS):
                        s[i, j] = T.exp2(s[i, j] * log2_scale - m[i] * log2_scale)
                    T.reduce_sum(s, row_sum, dim=1)
                    for i in T.Parallel(G):
                        denom[i] = denom[i] * alpha[i] + row_sum[i]
                    T.copy(s, p)
                    for i, j in T.Parallel(G, BV):
                        o[i, j] *= alpha[i]
                    T.copy(V[b, i_s:i_s + BS, h, v * BV:(v + 1) * BV], v_s)
                    T.gemm(p, v_s, o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(G, BV):
                o[i, j] /= denom[i]
            T.copy(o, o_s)
            T.copy(o_s, Out[b, t, h * G:(h + 1) * G, v * BV:(v + 1) * BV])

    return nsa


def _sparse_inputs(rng, s):
    b, n, h, d, g, sel, bs = (s[k] for k in ("batch", "seq_len", "heads", "dim", "groups",
                                             "selected", "block_size"))
    kvh = h // g
    idx = np.full((b, n, kvh, sel), n, np.int64)  # past the end: a slot that selects nothing
    for bi in range(b):
        for t in range(n):
            for hi in range(kvh):
                picked = rng.permutation(t // bs + 1)[:sel]  # blocks that start at or before t
                idx[bi, t, hi, :len(picked)] = np.sort(picked)
    return [(rng.standard_normal((b, n, h, d)), "float16"),
            (rng.standard_normal((b, n, kvh, d)), "float16"),
            (rng.standard_normal((b, n, kvh, d)), "float16"),
            (idx, "int32")]


def _sparse_ref(x, s):
    q, k, v, idx = x
    bs, g = s["block_size"], s["groups"]
    b, n, h, d = q.shape
    out = np.zeros_like(q)
    for bi in range(b):
        for t in range(n):
            for hi in range(h):
                kv = hi // g
                keys = [j for blk in idx[bi, t, kv].astype(int) if 0 <= blk * bs <= t
                        for j in range(blk * bs, blk * bs + bs) if j <= t]
                logits = k[bi, keys, kv] @ q[bi, t, hi] / math.sqrt(d)
                p = np.exp(logits - logits.max())
                out[bi, t, hi] = (p / p.sum()) @ v[bi, keys, kv]
    return out


register(Case(
    "nsa_sparse_fwd", "sparse_attention",
    ("prim_func", "jit", "slice", "full_slice", "copy_g2s", "copy_f2f_cast", "copy_s2g",
     "gemm_ss", "gemm_rs", "gemm_policy", "transpose", "reduce", "inplace", "infinity", "if",
     "pipelined", "parallel"),
    factory=sparse_attention, inputs=_sparse_inputs, reference=_sparse_ref, tol=2e-3,
    cpu={"batch": 1, "heads": 16, "seq_len": 96, "dim": 32, "groups": 16, "selected": 2,
         "block_size": 32},
    gpu={"batch": 2, "heads": 64, "seq_len": 4096, "dim": 128, "groups": 16, "selected": 16,
         "block_size": 64}))
