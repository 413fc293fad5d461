"""tiled.ops.attention (this module, tiled.ops.prefill): prefill attention for the layouts
servers use.

    attention(q, k, v, causal=False, cu_seqlens_q=None, cu_seqlens_k=None, window=None,
              softcap=None, scale=None, return_lse=False, layout="bshd",
              max_seqlen_q=None, max_seqlen_k=None) -> out (, lse)
        dense: q [batch, Sq, heads, d] ("bshd") or [batch, heads, Sq, d] ("bhsd"), k / v with
        kv_heads heads and Sk rows; varlen (cu_seqlens_q / cu_seqlens_k int32 [batch + 1], as
        FlashAttention's varlen API): q [total_q, heads, d], k / v [total_k, kv_heads, d], each
        sequence's rows packed one after another. GQA / MQA: query head i reads kv head
        i // (heads / kv_heads). `causal` aligns the last query with the last key (query i of
        a sequence sees keys j <= i + Sk - Sq); `window` (tokens) also hides keys older than
        window - 1 before that diagonal; `softcap` applies cap * tanh(s / cap) to the scaled
        scores; `scale` defaults to d ** -0.5. `return_lse`: also the rows' natural-log
        log-sum-exp of the (capped) scores, float32 [batch, heads, Sq] (varlen: [heads,
        total_q]). `max_seqlen_q` / `max_seqlen_k` (varlen): the longest sequences, which size
        the grid; without them they are read from cu_seqlens (a device-to-host copy, so not
        inside a CUDA graph capture). d = 64, 128 or 256; bf16 / fp16 (fp32 on the CPU).

One block per (BM query rows, head, sequence): the rows' tile copied once, then K and V tiles
copied BN at a time (leading copies: the pipeline issues them ahead), S = Q K^T, the mask and
the softcap applied, an online softmax in base 2, O += P V. Causal and windowed blocks walk
only the key tiles they can see. Tuned by tiled.autotune per (layout, heads, kv heads, d,
dtype, the mask's options, Sq bucket).
"""

import tiled
import tiled.lang as T
from tiled.ops.paged import softmax_scale
from tiled.ops.tuned import TunedOp, pow2_bucket

LOG2E = 1.4426950408889634
NEG_INF = float("-inf")

# P: the probabilities staged through a shared tile ("shared": the whole-kernel sm_90a
# attention path takes the kernel) or cast into a 16-bit fragment that the second gemm reads
# from registers ("regs": the per-op path, software-pipelined, ws_rotate.py).
CUDA_SPACE = [{"BM": bm, "BN": bn, "threads": t, "stages": 2, "P": p}
              for p in ("shared", "regs") for bm, t in ((64, 128), (128, 256))
              for bn in (64, 128)]
# CPU: a 128 x 64 tile for query lengths past 64 (`min_seq`: buckets of 128 and up), 16 x 16
# for the rest: bf16, 8 heads of 128, 1024 tokens on the 2-core Zen 3, 128 x 64 read 103-114
# GFLOP/s (causal 89-93) where 16 x 16 read 38 (39), beside torch's CPU SDPA at 114-134
# (79-85) (benchmarks/results/cpu_attention.json).
CPU_SPACE = [{"BM": 128, "BN": 64, "threads": 128, "stages": 2, "min_seq": 128},
             {"BM": 16, "BN": 16, "threads": 32, "stages": 2}]


def prefill_kernel(H, KVH, D, dtype, layout, causal, window, softcap, scale, varlen, lse,
                   S_bucket=None, BM=64, BN=64, threads=128, stages=2, P="shared",
                   min_seq=0):
    """The kernel of one config (`S_bucket` only selects: every length is symbolic; a config
    with `min_seq` serves query lengths from that many). Params
    Q, K, V, CQ, CK (cu_seqlens; one-element placeholders when dense), Out, LSE (a
    placeholder without return_lse), Grid (varlen: a [max_seqlen_q] tensor whose length
    sizes the grid, as launch grids come from tensor shapes; a placeholder when dense)."""
    if H % KVH:
        raise ValueError(f"attention: {H} heads do not group over {KVH} kv heads")
    if P not in ("shared", "regs"):
        raise ValueError(f"attention: P={P!r}, expected 'shared' or 'regs'")
    if S_bucket is not None and seq_bucket(S_bucket) < min_seq:  # decided by the bucket
        raise ValueError(f"attention: config {BM}x{BN} is not for {S_bucket} query rows "
                         f"(from {min_seq})")
    G = H // KVH
    Bd, SQ, SK, B1, MQ = T.dyn("B"), T.dyn("SQ"), T.dyn("SK"), T.dyn("B1"), T.dyn("MQ")
    if varlen:
        q_t, kv_t = T.Tensor((SQ, H, D), dtype), T.Tensor((SK, KVH, D), dtype)
        lse_t = T.Tensor((H, SQ), "float32")
    elif layout == "bshd":
        q_t, kv_t = T.Tensor((Bd, SQ, H, D), dtype), T.Tensor((Bd, SK, KVH, D), dtype)
        lse_t = T.Tensor((Bd, H, SQ), "float32")
    else:
        q_t, kv_t = T.Tensor((Bd, H, SQ, D), dtype), T.Tensor((Bd, KVH, SK, D), dtype)
        lse_t = T.Tensor((Bd, H, SQ), "float32")
    cu_t = T.Tensor((B1,), "int32")  # batch + 1 offsets
    unused_t = T.Tensor((1,), "int32")  # a parameter this variant does not read or write

    # Scores enter the softmax as log2 exponents. Dense ones without a softcap stay raw
    # (q . k) until exp2 takes them, their scale folded into its argument (`c`), so a tile
    # that masks nothing costs no pass of its own (H200: 4k 0.95x -> 1.00x SDPA). Softcapped
    # and varlen ones get a pass: varlen's cu_seqlens loads keep more values live, and the
    # folded form made ptxas spill (84 bytes at the 168-register cap of the sm_90a path,
    # 6% slower causal on the H200, attention_h200.json's varlen rows).
    fold = not softcap and not varlen
    c = scale * LOG2E if fold else 1.0

    def score(x):
        """A score as the softmax compares it: raw when folded, else the log2 exponent."""
        if softcap:
            return softcap * LOG2E * T.tanh(x * (scale / softcap))
        return x if fold else x * (scale * LOG2E)

    def rows(X, b, h, start, n):
        """[n, D] rows start.. of head h of sequence b (varlen: `start` is absolute)."""
        if varlen:
            return X[start:start + n, h, :]
        if layout == "bshd":
            return X[b, start:start + n, h, :]
        return X[b, h, start:start + n, :]

    @tiled.kernel
    def attention_fwd(Q: q_t, K: kv_t, V: kv_t, CQ: cu_t if varlen else unused_t,
                      CK: cu_t if varlen else unused_t, Out: q_t,
                      LSE: lse_t if lse else unused_t,
                      Grid: T.Tensor((MQ,), "int8") if varlen else unused_t):
        with T.Kernel(T.ceildiv(MQ if varlen else SQ, BM), H, B1 - 1 if varlen else Bd,
                      threads=threads) as (bx, h, b):
            q0 = CQ[b] if varlen else 0  # the sequence's first row in the packed tensors
            k0 = CK[b] if varlen else 0
            n_q = CQ[b + 1] - q0 if varlen else SQ
            n_k = CK[b + 1] - k0 if varlen else SK
            off = n_k - n_q  # causal: query i sees keys up to i + off
            q = T.alloc_shared((BM, D), dtype)
            k = T.alloc_shared((BN, D), dtype)
            v = T.alloc_shared((BN, D), dtype)
            sc = T.alloc_fragment((BM, BN), "float32")
            p = T.alloc_shared((BM, BN), dtype) if P == "shared" else \
                T.alloc_fragment((BM, BN), dtype)
            o = T.alloc_fragment((BM, D), "float32")
            m = T.alloc_fragment((BM,), "float32")
            m_prev = T.alloc_fragment((BM,), "float32")
            alpha = T.alloc_fragment((BM,), "float32")
            m_use = T.alloc_fragment((BM,), "float32")
            total = T.alloc_fragment((BM,), "float32")
            T.copy(rows(Q, b, h, q0 + bx * BM, BM), q)
            T.fill(o, 0)
            T.fill(total, 0)
            T.fill(m, NEG_INF)
            hi = T.ceildiv(n_k, BN)  # key tiles this block may see: [lo, hi)
            lo = 0
            if causal:
                hi = T.max(T.min(hi, T.ceildiv((bx + 1) * BM + off, BN)), 0)
                if window:
                    lo = T.max(bx * BM + off - window + 1, 0) // BN
            # varlen: blocks past a short sequence's rows walk nothing. Dense, the grid covers
            # the rows exactly, and without a mask every block walks the same count (which
            # lets sm_90a's attention path make the grid persistent).
            n = T.if_then_else(bx * BM < n_q, T.max(hi - lo, 0), 0) if varlen else \
                T.max(hi - lo, 0)
            for step in T.Pipelined(n, num_stages=stages):
                T.copy(rows(K, b, h // G, k0 + (lo + step) * BN, BN), k)
                if P == "shared":
                    T.copy(rows(V, b, h // G, k0 + (lo + step) * BN, BN), v)
                T.clear(sc)
                T.gemm(q, k, sc, transpose_B=True)
                # Only a tile reaching past the keys, or (causal) past the block's first
                # row's diagonal or before its last row's window, masks keys: the others are
                # only scaled (softcapped), or left raw when the scale is folded.
                t0 = (lo + step) * BN
                partial = t0 + BN > n_k
                if causal:
                    partial = partial | (t0 + BN - 1 > bx * BM + off)
                    if window:
                        partial = partial | (t0 <= bx * BM + BM - 1 + off - window)
                if not fold and not partial:
                    for i, t in T.Parallel(BM, BN):
                        sc[i, t] = score(sc[i, t])
                if partial:
                    for i, t in T.Parallel(BM, BN):
                        j = t0 + t
                        seen = j < n_k
                        if causal:
                            seen = seen & (j <= bx * BM + i + off)
                            if window:
                                seen = seen & (j > bx * BM + i + off - window)
                        sc[i, t] = T.if_then_else(seen, score(sc[i, t]), NEG_INF)
                T.copy(m, m_prev)
                T.reduce_max(sc, m, dim=1, clear=False)
                for i in T.Parallel(BM):
                    # A row that has seen no key yet (a mask) has m = -inf: subtracting 0
                    # instead keeps its exponentials 0, not NaN.
                    m_use[i] = T.if_then_else(m[i] == NEG_INF, 0.0, m[i] * c)
                    alpha[i] = T.exp2(m_prev[i] * c - m_use[i])
                    total[i] = total[i] * alpha[i]
                for i, t in T.Parallel(BM, BN):
                    sc[i, t] = T.exp2(sc[i, t] * c - m_use[i])
                T.reduce_sum(sc, total, dim=1, clear=False)
                T.copy(sc, p)
                for i, d in T.Parallel(BM, D):
                    o[i, d] *= alpha[i]
                if P == "regs":  # waited for just before P V: its load has the softmax's time
                    T.copy(rows(V, b, h // G, k0 + (lo + step) * BN, BN), v)
                T.gemm(p, v, o)
            for i, d in T.Parallel(BM, D):
                o[i, d] = o[i, d] / T.max(total[i], 1e-30)
            # A whole tile leaves by T.copy (sm_90a: 16-byte row stores; the copy stops at
            # the tensor's end). Varlen rows past the sequence's are the next sequence's:
            # a tile that reaches past them is written row by row.
            if varlen:
                if bx * BM + BM <= n_q:
                    T.copy(o, rows(Out, b, h, q0 + bx * BM, BM))
                else:
                    for i, d in T.Parallel(BM, D):
                        if bx * BM + i < n_q:
                            Out[q0 + bx * BM + i, h, d] = T.cast(o[i, d], dtype)
            else:
                T.copy(o, rows(Out, b, h, bx * BM, BM))
            if lse:
                for i in T.Parallel(BM):
                    if bx * BM + i < n_q:
                        if varlen:
                            LSE[h, q0 + bx * BM + i] = (T.log2(total[i]) + m[i] * c) / LOG2E
                        else:
                            LSE[b, h, bx * BM + i] = (T.log2(total[i]) + m[i] * c) / LOG2E

    return attention_fwd


def _bucket(H, KVH, D, dtype, layout, causal, window, softcap, scale, varlen, lse, S_bucket):
    return H, KVH, D, dtype, layout, causal, window, softcap, scale, varlen, lse, \
        seq_bucket(S_bucket)


def seq_bucket(S: int) -> int:
    """The query lengths one tuning serves: 64 and below, then powers of two to 16384+."""
    return pow2_bucket(S, 16384, least=64)


def _inputs(H, KVH, D, dtype, layout, causal, window, softcap, scale, varlen, lse, S_bucket,
            **config):
    """One dense (or one-sequence varlen) problem of the bucket's length."""
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt = _torch_dtype(torch, dtype)
    S = S_bucket
    if varlen:
        shape_q, shape_kv = (S, H, D), (S, KVH, D)
    elif layout == "bshd":
        shape_q, shape_kv = (1, S, H, D), (1, S, KVH, D)
    else:
        shape_q, shape_kv = (1, H, S, D), (1, KVH, S, D)
    q = torch.randn(*shape_q, device=dev, generator=g).to(dt)
    k = torch.randn(*shape_kv, device=dev, generator=g).to(dt)
    v = torch.randn(*shape_kv, device=dev, generator=g).to(dt)
    cu = torch.tensor([0, S], device=dev, dtype=torch.int32) if varlen else \
        torch.zeros(1, device=dev, dtype=torch.int32)
    lse_t = torch.zeros((H, S) if varlen else (1, H, S), device=dev) if lse else \
        torch.zeros(1, device=dev, dtype=torch.int32)
    grid = torch.empty(S if varlen else 1, device=dev, dtype=torch.int8 if varlen else
                       torch.int32)
    return [q, k, v, cu, cu, torch.zeros_like(q), lse_t, grid]


ATTENTION = TunedOp("attention", prefill_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                    key=["H", "KVH", "D", "dtype", "layout", "causal", "window", "softcap",
                         "scale", "varlen", "lse", "S_bucket"], bucket=_bucket, inputs=_inputs)


def attention(q, k, v, causal: bool = False, cu_seqlens_q=None, cu_seqlens_k=None,
              window: int | None = None, softcap: float | None = None, scale=None,
              return_lse: bool = False, layout: str = "bshd", max_seqlen_q=None,
              max_seqlen_k=None):
    """Prefill attention (module docstring)."""
    import torch

    from tiled.ops import _dtype

    op = "attention"
    dtype = _dtype(q, op)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"tiled.ops.{op}: layout {layout!r} is not 'bshd' or 'bhsd'")
    if k.shape != v.shape or k.dtype != q.dtype or v.dtype != q.dtype or \
            k.device != q.device or v.device != q.device:
        raise ValueError(f"tiled.ops.{op}: k {tuple(k.shape)} {k.dtype} and v {tuple(v.shape)} "
                         f"{v.dtype} must share a shape, and q's dtype ({q.dtype}) and device")
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None or q.dim() != 3 or k.dim() != 3:
            raise ValueError(f"tiled.ops.{op}: varlen takes both cu_seqlens and q [total_q, "
                             f"heads, d], k / v [total_k, kv_heads, d]; got q "
                             f"{tuple(q.shape)}, k {tuple(k.shape)}")
        for name, c in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if c.dtype != torch.int32 or c.dim() != 1 or c.device != q.device:
                raise ValueError(f"tiled.ops.{op}: {name} must be int32 [batch + 1] on "
                                 f"{q.device}, not {c.dtype} {tuple(c.shape)} on {c.device}")
        if cu_seqlens_q.shape != cu_seqlens_k.shape:
            raise ValueError(f"tiled.ops.{op}: cu_seqlens_q and cu_seqlens_k differ in length")
        B = cu_seqlens_q.shape[0] - 1
        (_, H, D), KVH = q.shape, k.shape[1]
        if max_seqlen_q is None:  # a device-to-host read (not inside a graph capture)
            max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if B > 0 else 0
        S_bucket = max_seqlen_q
    else:
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(f"tiled.ops.{op}: q {tuple(q.shape)} and k {tuple(k.shape)} must "
                             f"be 4-D ({layout})")
        if layout == "bshd":
            B, S_bucket, H, D = q.shape
            KVH = k.shape[2]
        else:
            B, H, S_bucket, D = q.shape
            KVH = k.shape[1]
        if k.shape[0] != B:
            raise ValueError(f"tiled.ops.{op}: q has batch {B}, k {k.shape[0]}")
    if k.shape[-1] != D or H % KVH:
        raise ValueError(f"tiled.ops.{op}: q has {H} heads of {D}, k {KVH} heads of "
                         f"{k.shape[-1]}: head dims must match and heads divide into kv heads")
    if D not in (64, 128, 256) and q.device.type == "cuda":
        raise ValueError(f"tiled.ops.{op}: head dim {D} is not 64, 128 or 256")
    if window is not None and (not isinstance(window, int) or window < 1 or not causal):
        raise ValueError(f"tiled.ops.{op}: window {window!r} must be a positive int, with "
                         "causal=True (a window before the diagonal)")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0):
        raise ValueError(f"tiled.ops.{op}: softcap {softcap!r} is not a positive float")
    scale = softmax_scale(op, scale, D)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse_shape = (H, q.shape[0]) if varlen else (B, H, S_bucket)
    unused = torch.empty(1, device=q.device, dtype=torch.int32)  # the variant's unread params
    lse = torch.empty(lse_shape, device=q.device, dtype=torch.float32) if return_lse else unused
    if out.numel() and S_bucket:
        tuned = ATTENTION.tuned(q, H, KVH, D, dtype, layout, bool(causal), window or 0,
                                float(softcap or 0.0), scale, varlen, bool(return_lse),
                                S_bucket)
        cq = cu_seqlens_q.contiguous() if varlen else unused
        ck = cu_seqlens_k.contiguous() if varlen else unused
        grid = torch.empty(int(S_bucket), device=q.device, dtype=torch.int8) if varlen else \
            unused
        tuned.compiled(q.contiguous(), k.contiguous(), v.contiguous(), cq, ck, out, lse, grid)
    elif return_lse:
        lse = torch.full(lse_shape, NEG_INF, device=q.device)
    return (out, lse) if return_lse else out

