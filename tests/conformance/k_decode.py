"""Split-KV decode attention the way TileLang's flash_decoding GQA example builds it: one
`@T.prim_func` that launches two kernels, each a `@T.macro` opening its own `with T.Kernel`
block. The first runs each split of the keys for a block of query heads (a uint8 mask tile
copied beside each key tile, the heads past the kv group sliced off the output with
`acc_o[:valid, :]`, the split's log-sum-exp stored under an `if`); the second combines the
splits per head: a max over a [splits, 128] fragment, a T.Pipelined loop of scalar loads into
T.alloc_local accumulators, and T.annotate_layout hints on those locals."""

import math

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[-1])
def gqa_decode_split(batch, heads, groups, seqlen_kv, dim, block_N=64, block_H=64, num_split=4,
                     num_stages=2, threads=128, dtype="float16"):
    acc = "float"
    log2_scale = 1.44269504 / math.sqrt(dim)
    per_group = heads // groups
    valid_H = min(block_H, per_group)
    span = seqlen_kv // num_split  # keys per split

    @T.macro
    def splits(Q: T.Tensor([batch, heads, dim], dtype),
               K: T.Tensor([batch, seqlen_kv, groups, dim], dtype),
               V: T.Tensor([batch, seqlen_kv, groups, dim], dtype),
               mask: T.Tensor([batch, seqlen_kv, groups], "uint8"),
               lse: T.Tensor([batch, heads, num_split], dtype),
               partial: T.Tensor([batch, heads, num_split, dim], dtype)):
        with T.Kernel(batch, heads // valid_H, num_split, threads=threads) as (b, hb, sp):
            q_s = T.alloc_shared([block_H, dim], dtype)
            k_s = T.alloc_shared([block_N, dim], dtype)
            v_s = T.alloc_shared([block_N, dim], dtype)
            o_s = T.alloc_shared([valid_H, dim], dtype)
            s = T.alloc_fragment([block_H, block_N], acc)
            p = T.alloc_fragment([block_H, block_N], dtype)
            keep = T.alloc_fragment([block_N], "uint8")
            o = T.alloc_fragment([block_H, dim], acc)
            m = T.alloc_fragment([block_H], acc)
            m_prev = T.alloc_fragment([block_H], acc)
            alpha = T.alloc_fragment([block_H], acc)
            row_sum = T.alloc_fragment([block_H], acc)
            denom = T.alloc_fragment([block_H], acc)
            g = hb // (per_group // valid_H)
            first = span * sp

            T.copy(Q[b, hb * valid_H:hb * valid_H + block_H, :], q_s)
            T.fill(o, 0)
            T.fill(denom, 0)
            T.fill(m, -T.infinity(acc))
            T.fill(k_s, 0)
            for t in T.Pipelined(T.ceildiv(span, block_N), num_stages=num_stages):
                T.copy(K[b, first + t * block_N:first + (t + 1) * block_N, g, :], k_s)
                T.copy(mask[b, first + t * block_N:first + (t + 1) * block_N, g], keep)
                T.clear(s)
                T.gemm(q_s, k_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_H, block_N):
                    s[i, j] = T.if_then_else((keep[j] != 0) & (t * block_N + j < span), s[i, j],
                                             -T.infinity(acc))
                T.copy(m, m_prev)
                T.fill(m, -T.infinity(acc))
                T.reduce_max(s, m, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    alpha[i] = T.exp2((m_prev[i] - m[i]) * log2_scale)
                for i, j in T.Parallel(block_H, block_N):
                    s[i, j] = T.exp2((s[i, j] - m[i]) * log2_scale)
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(block_H):
                    denom[i] = denom[i] * alpha[i] + row_sum[i]
                T.copy(s, p)
                for i, j in T.Parallel(block_H, dim):
                    o[i, j] *= alpha[i]
                T.copy(V[b, first + t * block_N:first + (t + 1) * block_N, g, :], v_s)
                T.gemm(p, v_s, o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_H, dim):
                o[i, j] /= denom[i]
            for i in T.Parallel(block_H):
                denom[i] = T.log2(denom[i]) + m[i] * log2_scale
            for i in T.Parallel(block_H):
                if i < valid_H:
                    lse[b, hb * valid_H + i, sp] = denom[i]
            T.copy(o[:valid_H, :], o_s)
            T.copy(o_s, partial[b, hb * valid_H:(hb + 1) * valid_H, sp, :])

    @T.macro
    def combine(lse: T.Tensor([batch, heads, num_split], dtype),
                partial: T.Tensor([batch, heads, num_split, dim], dtype),
                Out: T.Tensor([batch, heads, dim], dtype)):
        with T.Kernel(heads, batch, threads=128) as (h, b):
            part = T.alloc_fragment([dim], dtype)
            out = T.alloc_fragment([dim], acc)
            lse_all = T.alloc_fragment([num_split, 128], dtype)
            lse_max = T.alloc_fragment([128], acc)
            lse_k = T.alloc_local([1], acc)
            lse_total = T.alloc_local([1], acc)
            weight = T.alloc_local([1], acc)
            T.annotate_layout({
                lse_total: T.Fragment(lse_total.shape, forward_thread_fn=lambda i: i),
                lse_max: T.Fragment(lse_max.shape, forward_thread_fn=lambda i: i),
                lse_all: T.Fragment(lse_all.shape, forward_fn=lambda i, j: (j, i)),
            })
            T.clear(lse_total)
            T.clear(out)
            for k, j in T.Parallel(num_split, 128):
                lse_all[k, j] = lse[b, h, k]
            T.reduce_max(lse_all, lse_max, dim=0, clear=True)
            for k in T.Pipelined(num_split, num_stages=1):
                lse_k[0] = lse[b, h, k]
                lse_total[0] += T.exp2(lse_k[0] - lse_max[0])
            lse_total[0] = T.log2(lse_total[0]) + lse_max[0]
            for k in T.serial(num_split):
                for i in T.Parallel(dim):
                    part[i] = partial[b, h, k, i]
                lse_k[0] = lse[b, h, k]
                weight[0] = T.exp2(lse_k[0] - lse_total[0])
                for i in T.Parallel(dim):
                    out[i] += part[i] * weight[0]
            for i in T.Parallel(dim):
                Out[b, h, i] = out[i]

    @T.prim_func
    def decode(Q: T.Tensor([batch, heads, dim], dtype),
               K: T.Tensor([batch, seqlen_kv, groups, dim], dtype),
               V: T.Tensor([batch, seqlen_kv, groups, dim], dtype),
               mask: T.Tensor([batch, seqlen_kv, groups], "uint8"),
               lse: T.Tensor([batch, heads, num_split], dtype),
               partial: T.Tensor([batch, heads, num_split, dim], dtype),
               Out: T.Tensor([batch, heads, dim], dtype)):
        splits(Q, K, V, mask, lse, partial)
        combine(lse, partial, Out)

    return decode


def _decode_inputs(rng, s):
    b, h, g, n, d, ns = (s[k] for k in ("batch", "heads", "groups", "seqlen_kv", "dim",
                                        "num_split"))
    keep = (rng.random((b, n, g)) < 0.8).astype(np.uint8)
    keep[:, ::n // ns, :] = 1  # every split keeps a key (an empty one has no softmax)
    return [(rng.standard_normal((b, h, d)), "float16"),
            (rng.standard_normal((b, n, g, d)), "float16"),
            (rng.standard_normal((b, n, g, d)), "float16"),
            (keep, "uint8"),
            (np.zeros((b, h, ns)), "float16"),  # scratch the kernel writes: the splits' lse
            (np.zeros((b, h, ns, d)), "float16")]  # and outputs


def _decode_ref(x, s):
    q, k, v, keep = (a.astype(np.float64) for a in x[:4])
    group = q.shape[1] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # [b, n, h, d]
    logits = np.einsum("bhd,bnhd->bhn", q, k) / math.sqrt(q.shape[-1])
    logits = np.where(np.repeat(keep, group, axis=2).transpose(0, 2, 1) != 0, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhn,bnhd->bhd", p / p.sum(-1, keepdims=True), v)


def _decode_work(s):  # the keys and values read
    return "bytes", 2 * 2 * s["batch"] * s["seqlen_kv"] * s["groups"] * s["dim"]


def _sdpa_masked(torch, x, s):
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v, keep = x[:4]
    qh = q[:, :, None, :]  # [b, h, 1, d]
    kh, vh = k.transpose(1, 2), v.transpose(1, 2)  # [b, g, n, d] views
    bias = torch.where(keep.transpose(1, 2)[:, :, None, :] != 0, 0.0, float("-inf")).to(q.dtype)
    group = q.shape[1] // k.shape[2]
    bias = bias.repeat_interleave(group, dim=1)  # [b, h, 1, n]
    return lambda: sdpa(qh, kh, vh, attn_mask=bias, enable_gqa=True)[:, :, 0, :]


register(Case(
    "gqa_decode_split", "flash_decoding",
    ("launches", "macro", "annotations", "slice", "full_slice", "copy_g2s", "copy_g2f",
     "copy_f2f_cast", "copy_s2g", "gemm_ss", "gemm_rs", "gemm_policy", "transpose", "reduce",
     "inplace", "infinity", "if", "pipelined", "parallel", "annotate_layout", "prim_func",
     "jit"),
    factory=gqa_decode_split, inputs=_decode_inputs, reference=_decode_ref, tol=2e-3,
    cpu={"batch": 2, "heads": 16, "groups": 2, "seqlen_kv": 256, "dim": 64, "block_N": 32,
         "num_split": 4},
    gpu={"batch": 64, "heads": 32, "groups": 8, "seqlen_kv": 8192, "dim": 128, "num_split": 8},
    work=_decode_work, torch_op=_sdpa_masked))


@tiled.jit(out_idx=[5])
def mha_split_kv(batch, heads, seqlen_q, seqlen_kv, dim, block_M=64, block_N=64, num_split=4,
                 dtype="float16"):
    """Attention for a short query block over a long cache, the keys split over blocks
    (TileLang's flash_decoding mha_inference form): the splits write rows of log-sum-exps and
    partial outputs, the combine pass reads them back as tiles (`lse[b, h, :, rows]` to a
    fragment, a fragment row per split, partial tiles through shared memory); `disable_tma`
    and swizzle hints as TileLang's example gives them."""
    acc = "float"
    log2_scale = 1.44269504 / math.sqrt(dim)
    span = seqlen_kv // num_split
    q_shape, kv_shape = [batch, seqlen_q, heads, dim], [batch, seqlen_kv, heads, dim]
    lse_shape = [batch, heads, num_split, seqlen_q]
    part_shape = [batch, seqlen_q, heads, num_split, dim]

    @T.macro
    def scores(K: T.Tensor(kv_shape, dtype), q_s: T.SharedBuffer([block_M, dim], dtype),
               k_s: T.SharedBuffer([block_N, dim], dtype),
               s: T.FragmentBuffer([block_M, block_N], acc), t: T.int32, h: T.int32,
               b: T.int32, sp: T.int32):
        T.copy(K[b, span * sp + t * block_N:span * sp + (t + 1) * block_N, h, :], k_s)
        T.clear(s)
        T.gemm(q_s, k_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def splits(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype),
               V: T.Tensor(kv_shape, dtype), lse: T.Tensor(lse_shape, dtype),
               partial: T.Tensor(part_shape, dtype)):
        with T.Kernel(T.ceildiv(seqlen_q, block_M), heads * batch, num_split,
                      threads=128) as (bx, by, sp):
            q_s = T.alloc_shared([block_M, dim], dtype)
            k_s = T.alloc_shared([block_N, dim], dtype)
            v_s = T.alloc_shared([block_N, dim], dtype)
            o_s = T.alloc_shared([block_M, dim], dtype)
            s = T.alloc_fragment([block_M, block_N], acc)
            p = T.alloc_fragment([block_M, block_N], dtype)
            o = T.alloc_fragment([block_M, dim], acc)
            m = T.alloc_fragment([block_M], acc)
            m_prev = T.alloc_fragment([block_M], acc)
            alpha = T.alloc_fragment([block_M], acc)
            row_sum = T.alloc_fragment([block_M], acc)
            denom = T.alloc_fragment([block_M], acc)
            h, b = by % heads, by // heads
            T.copy(Q[b, bx * block_M:(bx + 1) * block_M, h, :], q_s, disable_tma=True)
            T.fill(o, 0)
            T.fill(denom, 0)
            T.fill(m, -T.infinity(acc))
            for t in T.Pipelined(T.ceildiv(span, block_N), num_stages=2):
                scores(K, q_s, k_s, s, t, h, b, sp)
                T.copy(m, m_prev)
                T.fill(m, -T.infinity(acc))
                T.reduce_max(s, m, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    alpha[i] = T.exp2(m_prev[i] * log2_scale - m[i] * log2_scale)
                for i, j in T.Parallel(block_M, block_N):
                    s[i, j] = T.exp2(s[i, j] * log2_scale - m[i] * log2_scale)
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(block_M):
                    denom[i] = denom[i] * alpha[i] + row_sum[i]
                T.copy(s, p)
                for i, j in T.Parallel(block_M, dim):
                    o[i, j] *= alpha[i]
                T.copy(V[b, span * sp + t * block_N:span * sp + (t + 1) * block_N, h, :], v_s)
                T.gemm(p, v_s, o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                o[i, j] /= denom[i]
            for i in T.Parallel(block_M):
                denom[i] = T.log2(denom[i]) + m[i] * log2_scale
            T.copy(denom, lse[b, h, sp, bx * block_M:(bx + 1) * block_M])
            T.copy(o, o_s)
            T.copy(o_s, partial[b, bx * block_M:(bx + 1) * block_M, h, sp, :], disable_tma=True)

    @T.macro
    def combine(lse: T.Tensor(lse_shape, dtype), partial: T.Tensor(part_shape, dtype),
                Out: T.Tensor(q_shape, dtype)):
        with T.Kernel(T.ceildiv(seqlen_q, block_M), heads, batch, threads=128) as (bx, h, b):
            part = T.alloc_fragment([block_M, dim], dtype)
            part_s = T.alloc_shared([block_M, dim], dtype)
            out = T.alloc_fragment([block_M, dim], acc)
            out_s = T.alloc_shared([block_M, dim], dtype)
            lse_all = T.alloc_fragment([num_split, block_M], dtype)
            lse_k = T.alloc_fragment([block_M], acc)
            lse_total = T.alloc_fragment([block_M], acc)
            lse_max = T.alloc_fragment([block_M], acc)
            weight = T.alloc_fragment([block_M], acc)
            T.annotate_layout({
                out: T.Fragment(out.shape, forward_thread_fn=lambda i, j: i),
                out_s: T.make_swizzled_layout(out_s),
                part_s: T.make_swizzled_layout(part_s),
            })
            T.clear(lse_total)
            T.clear(out)
            T.copy(lse[b, h, :, bx * block_M:(bx + 1) * block_M], lse_all)
            # (TileLang's example passes clear=False over a fragment it never fills: a max
            # with whatever the registers held, NaN at times on the cpu target)
            T.reduce_max(lse_all, lse_max, dim=0, clear=True)
            for k in T.Pipelined(num_split):
                T.copy(lse_all[k, :], lse_k)
                for i in T.Parallel(block_M):
                    lse_total[i] += T.exp2(lse_k[i] - lse_max[i])
            for i in T.Parallel(block_M):
                lse_total[i] = T.log2(lse_total[i]) + lse_max[i]
            for k in T.Pipelined(num_split, num_stages=2):
                T.copy(partial[b, bx * block_M:(bx + 1) * block_M, h, k, :], part_s,
                       disable_tma=True)
                T.copy(part_s, part)
                for i in T.Parallel(block_M):
                    lse_k[i] = lse_all[k, i]
                for i in T.Parallel(block_M):
                    weight[i] = T.exp2(lse_k[i] - lse_total[i])
                for i, j in T.Parallel(block_M, dim):
                    out[i, j] += part[i, j] * weight[i]
            T.copy(out, out_s)
            T.copy(out_s, Out[b, bx * block_M:(bx + 1) * block_M, h, :], disable_tma=True)

    @T.prim_func
    def attend(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype),
               V: T.Tensor(kv_shape, dtype), lse: T.Tensor(lse_shape, dtype),
               partial: T.Tensor(part_shape, dtype), Out: T.Tensor(q_shape, dtype)):
        splits(Q, K, V, lse, partial)
        combine(lse, partial, Out)

    return attend


def _split_kv_inputs(rng, s):
    b, h, sq, sk, d, ns = (s[k] for k in ("batch", "heads", "seqlen_q", "seqlen_kv", "dim",
                                          "num_split"))
    return [(rng.standard_normal((b, sq, h, d)), "float16"),
            (rng.standard_normal((b, sk, h, d)), "float16"),
            (rng.standard_normal((b, sk, h, d)), "float16"),
            (np.zeros((b, h, ns, sq)), "float16"),  # the splits' lse and outputs
            (np.zeros((b, sq, h, ns, d)), "float16")]


def _split_kv_ref(x, s):
    q, k, v = x[:3]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)


def _split_kv_work(s):
    return "flop", 4 * s["batch"] * s["heads"] * s["seqlen_q"] * s["seqlen_kv"] * s["dim"]


def _sdpa_bshd(torch, x, s):
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v = (t.transpose(1, 2) for t in x[:3])  # [b, h, n, d] views, as a BSHD user passes
    return lambda: sdpa(q, k, v).transpose(1, 2)


register(Case(
    "mha_split_kv", "flash_decoding",
    ("launches", "macro", "annotations", "slice", "full_slice", "copy_g2s", "copy_g2f",
     "copy_s2f", "copy_f2f_cast", "copy_f2g", "copy_s2g", "gemm_ss", "gemm_rs", "gemm_policy",
     "transpose", "reduce", "inplace", "infinity", "pipelined", "parallel", "annotate_layout",
     "prim_func", "jit"),
    factory=mha_split_kv, inputs=_split_kv_inputs, reference=_split_kv_ref, tol=2e-3,
    cpu={"batch": 1, "heads": 2, "seqlen_q": 64, "seqlen_kv": 256, "dim": 64, "block_M": 32,
         "block_N": 32, "num_split": 4},
    gpu={"batch": 1, "heads": 32, "seqlen_q": 128, "seqlen_kv": 8192, "dim": 128,
         "block_M": 128, "block_N": 64, "num_split": 4},
    work=_split_kv_work, torch_op=_sdpa_bshd))
