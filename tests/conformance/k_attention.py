"""FlashAttention forward the way TileLang's flash_attention examples build it: macros for the
two gemms, the online softmax and the rescale, fragment-to-fragment copies (the previous row
max, the probabilities cast to 16 bits), the P @ V gemm with P in registers, in-place rescaling,
and the output staged through shared memory. One factory covers the layouts (BSHD / BHSD),
GQA, causal masking and the software-pipelined loop hints of the wgmma variant."""

import math

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[3])
def flash_attention(batch, heads, seq_len, dim, kv_heads=None, causal=False, layout="bshd",
                    block_M=64, block_N=64, threads=128, num_stages=1, pipeline_hints=False,
                    dtype="float16"):
    kv_heads = kv_heads or heads
    group = heads // kv_heads
    acc = "float"
    scale = 1.44269504 / math.sqrt(dim)  # log2(e) / sqrt(d): the softmax runs in base 2

    def shape(h):
        return [batch, seq_len, h, dim] if layout == "bshd" else [batch, h, seq_len, dim]

    def rows(t, b, h, start, n):  # the [n, dim] tile of rows start.. of head h in batch b
        if layout == "bshd":
            return t[b, start:start + n, h, :]
        return t[b, h, start:start + n, :]

    @T.macro
    def scores(K: T.Tensor(shape(kv_heads), dtype), q_tile: T.SharedBuffer([block_M, dim], dtype),
               k_tile: T.SharedBuffer([block_N, dim], dtype),
               s: T.FragmentBuffer([block_M, block_N], acc), step, bx, by, bz):
        T.copy(rows(K, bz, by // group, step * block_N, block_N), k_tile)
        if causal:
            for i, j in T.Parallel(block_M, block_N):
                s[i, j] = T.if_then_else(bx * block_M + i >= step * block_N + j, 0,
                                         -T.infinity(acc))
        else:  # keys past the sequence's end (a ragged last tile) get no weight
            for i, j in T.Parallel(block_M, block_N):
                s[i, j] = T.if_then_else(step * block_N + j >= seq_len, -T.infinity(acc), 0)
        T.gemm(q_tile, k_tile, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def online_softmax(s, s_cast, m, m_prev, alpha, row_sum, logsum):
        T.copy(m, m_prev)
        T.fill(m, -T.infinity(acc))
        T.reduce_max(s, m, dim=1, clear=False)
        for i in T.Parallel(block_M):
            alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
        for i, j in T.Parallel(block_M, block_N):
            s[i, j] = T.exp2(s[i, j] * scale - m[i] * scale)
        T.reduce_sum(s, row_sum, dim=1)
        for i in T.Parallel(block_M):
            logsum[i] = logsum[i] * alpha[i] + row_sum[i]
        T.copy(s, s_cast)

    @T.macro
    def rescale(o, alpha):
        for i, j in T.Parallel(block_M, dim):
            o[i, j] *= alpha[i]

    @T.macro
    def accumulate(V, v_tile, s_cast, o, step, by, bz):
        T.copy(rows(V, bz, by // group, step * block_N, block_N), v_tile)
        T.gemm(s_cast, v_tile, o, policy=T.GemmWarpPolicy.FullRow)

    @T.prim_func
    def attention(Q: T.Tensor(shape(heads), dtype), K: T.Tensor(shape(kv_heads), dtype),
                  V: T.Tensor(shape(kv_heads), dtype), Out: T.Tensor(shape(heads), dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            q_tile = T.alloc_shared([block_M, dim], dtype)
            k_tile = T.alloc_shared([block_N, dim], dtype)
            v_tile = T.alloc_shared([block_N, dim], dtype)
            o_tile = T.alloc_shared([block_M, dim], dtype)
            s = T.alloc_fragment([block_M, block_N], acc)
            s_cast = T.alloc_fragment([block_M, block_N], dtype)
            o = T.alloc_fragment([block_M, dim], acc)
            m = T.alloc_fragment([block_M], acc)
            m_prev = T.alloc_fragment([block_M], acc)
            alpha = T.alloc_fragment([block_M], acc)
            row_sum = T.alloc_fragment([block_M], acc)
            logsum = T.alloc_fragment([block_M], acc)

            T.copy(rows(Q, bz, by, bx * block_M, block_M), q_tile)
            T.fill(o, 0)
            T.fill(logsum, 0)
            T.fill(m, -T.infinity(acc))
            steps = T.ceildiv(seq_len, block_N)
            if causal:
                steps = T.min(steps, T.ceildiv((bx + 1) * block_M, block_N))
            if pipeline_hints:  # the wgmma-pipelined example's schedule: hints to tiled
                loop = T.Pipelined(steps, num_stages=num_stages, order=[-1, 0, 3, 1, -1, 2],
                                   stage=[-1, 0, 0, 1, -1, 1],
                                   group=[[0], [1, 2], [3, 4, 5, 6, 7, 8, 9, 10], [11], [12],
                                          [13]])
            else:
                loop = T.Pipelined(steps, num_stages=num_stages)
            for step in loop:
                scores(K, q_tile, k_tile, s, step, bx, by, bz)
                online_softmax(s, s_cast, m, m_prev, alpha, row_sum, logsum)
                rescale(o, alpha)
                accumulate(V, v_tile, s_cast, o, step, by, bz)
            for i, j in T.Parallel(block_M, dim):
                o[i, j] /= logsum[i]
            T.copy(o, o_tile)
            T.copy(o_tile, rows(Out, bz, by, bx * block_M, block_M))

    return attention


def _attn_inputs(rng, s):
    h, kvh = s["heads"], s.get("kv_heads") or s["heads"]
    b, n, d = s["batch"], s["seq_len"], s["dim"]
    bshd = s.get("layout", "bshd") == "bshd"
    shape = (lambda heads: (b, n, heads, d)) if bshd else (lambda heads: (b, heads, n, d))
    return [(rng.standard_normal(shape(h)), "float16"), (rng.standard_normal(shape(kvh)),
                                                         "float16"),
            (rng.standard_normal(shape(kvh)), "float16")]


def _attn_ref(x, s):
    q, k, v = x
    if s.get("layout", "bshd") == "bshd":  # to [b, h, n, d]
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if s.get("causal"):
        n = q.shape[2]
        logits = np.where(np.tril(np.ones((n, n), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ v
    return out.transpose(0, 2, 1, 3) if s.get("layout", "bshd") == "bshd" else out


def _attn_work(s):
    flop = 4 * s["batch"] * s["heads"] * s["seq_len"] ** 2 * s["dim"]
    return "flop", flop // 2 if s.get("causal") else flop


def _sdpa(torch, x, s):
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v = x
    bshd = s.get("layout", "bshd") == "bshd"
    if bshd:  # SDPA takes [b, h, n, d]; the transposes are views (their cost is the copy
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # SDPA makes, as a BSHD user pays)
    gqa = k.shape[1] != q.shape[1]

    def call():
        o = sdpa(q, k, v, is_causal=bool(s.get("causal")), enable_gqa=gqa)
        return o.transpose(1, 2) if bshd else o
    return call


ATTN_IDIOMS = ("macro", "annotations", "slice", "full_slice", "copy_g2s", "copy_f2f_cast",
               "gemm_rs", "gemm_ss", "gemm_policy", "transpose", "reduce", "inplace",
               "infinity", "copy_s2f", "copy_s2g", "pipelined", "parallel", "if", "prim_func",
               "jit")
GPU = {"batch": 8, "heads": 16, "seq_len": 4096, "dim": 128, "block_M": 128, "block_N": 128,
       "threads": 256}

for name, cpu, gpu in [
        ("mha_fwd_bshd", {}, {}),
        ("mha_fwd_bhsd", {"layout": "bhsd"}, {"layout": "bhsd"}),
        ("gqa_fwd_bshd", {"heads": 4, "kv_heads": 2}, {"kv_heads": 4}),
        ("mha_fwd_bshd_causal", {"causal": True}, {"causal": True}),
        ("mha_fwd_bhsd_wgmma_pipelined", {"layout": "bhsd", "pipeline_hints": True,
                                          "num_stages": 2},
         {"layout": "bhsd", "pipeline_hints": True, "num_stages": 2})]:
    register(Case(
        name, "flash_attention", ATTN_IDIOMS, factory=flash_attention, inputs=_attn_inputs,
        reference=_attn_ref, tol=2e-3,
        cpu={"batch": 1, "heads": 2, "seq_len": 100, "dim": 64, **cpu}, gpu={**GPU, **gpu},
        work=_attn_work, torch_op=_sdpa))
