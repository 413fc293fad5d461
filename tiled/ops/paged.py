"""tiled.ops.paged_attention (this module, tiled.ops.paged): decode attention over vLLM's paged
KV cache, one query token per sequence.

    paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None, k_scale=None,
                    v_scale=None) -> out
        q [batch, heads, head_dim]; k_cache, v_cache [num_blocks, block_size, kv_heads,
        head_dim]; block_tables [batch, max_blocks] int32 (sequence b's token t lives in
        block block_tables[b, t // block_size], slot t % block_size); seq_lens [batch] int32;
        out [batch, heads, head_dim] in q's dtype. GQA: query head i reads kv head
        i // (heads / kv_heads). The caches may be float8 e4m3 (`k_scale` / `v_scale`
        dequantize them: value = q * scale, floats or one-element float32 tensors).

One block per (kv head, 16 query heads of its group, sequence, split): the group's query rows
as one 16-row MMA tile (rows past the group are computed and dropped), the sequence's tokens
gathered BN at a time through its block table into shared memory (converted to q's dtype on
the way), an online softmax in base 2. With `splits` > 1 each split takes an equal share of
the table's longest possible context and writes a float32 partial output and its log-sum-exp;
`paged_combine` (tiled.ops.kernels style: one more launch) merges them. Tuned by tiled.autotune
per (batch bucket, context bucket): the context bucket is the block table's width, known on
the host without reading seq_lens (no sync, so graph capture works).
"""

import math

import tiled
import tiled.lang as T
from tiled.ops.tuned import TunedOp, pow2_bucket

LOG2E = 1.4426950408889634
ROWS = 16  # query rows per block: one MMA tile
NEG_INF = float("-inf")

# (BN tokens per step, threads, pipeline stages, splits). One warp keeps a row's statistics
# in a quad of lanes (shuffle reductions); 128 threads split the tokens over 4 warps.
CUDA_SPACE = [{"BN": bn, "threads": t, "stages": st, "splits": s}
              for bn, t, st in ((32, 32, 2), (64, 32, 2), (32, 128, 2), (64, 128, 2),
                                (64, 128, 3))
              for s in (1, 2, 4, 8, 16, 32, 64)]
# On a CPU the row tile is the group (rows "group"): the T.gemm microkernel has no 16-row
# MMA shape to fill, and padded rows cost as much as real ones (benchmarks/cpu/paged.py).
CPU_SPACE = [{"BN": 16, "threads": 32, "splits": 1, "rows": "group"},
             {"BN": 16, "threads": 32, "splits": 2, "rows": "group"}]


def decode_kernel(B, H, KVH, D, block_size, dtype, kv_dtype, MB, scale, BN=64, threads=32,
                  splits=1, stages=2, rows=None, dv=None, cols=False, latent=False):
    """The decode kernel of one config (`B` and `MB` only select: batch, cache size and table
    width are symbolic). KVS holds (k_scale, v_scale). splits == 1 writes Out directly;
    otherwise Part [B, H, splits, DV] and LSE [B, H, splits] (base 2) for paged_combine.
    `rows`: query heads per block (ROWS, or more so that a wide group reads the cache once:
    MLA's 128 heads over one latent kv head; "group": the group's head count rounded up to a
    power of two, at most ROWS); `dv`: the value head dim DV, V being the first dv lanes of
    its cache's rows (MLA: 512 of the 576), D by default. `cols`: both gemms FullCol, the
    probabilities staged through shared memory (on sm_90a the warpgroups then split the
    scores' and the output's columns, each holding 64 rows: wgmma for MLA's 64 heads a
    block, whose 512-wide output one warpgroup cannot hold). `latent` (dv < D, Vc the same
    cache as Kc: MLA's): each step copies the cache rows once, as the DV value lanes and the
    D - DV rope lanes, and the scores are two gemms (q's lanes split the same way), the
    values' gemm reading the first tile again (TileLang's MLA example has this form)."""
    if H % KVH:
        raise ValueError(f"paged attention: {H} query heads do not group over {KVH} kv heads")
    if splits > 1 and splits > -(-MB * block_size // BN):
        raise ValueError(f"{splits} splits of a {MB * block_size}-token context leave some "
                         f"without a {BN}-token step")
    G = H // KVH
    if rows == "group":
        rows = min(ROWS, 1 << (G - 1).bit_length())
    rows, DV = rows or ROWS, dv or D
    HT = -(-G // rows)  # row tiles per kv head
    CB = min(BN, block_size)  # tokens per copy: one block's, or the whole step in one block
    if max(BN, block_size) % CB:
        raise ValueError(f"paged attention: {BN}-token steps and {block_size}-token blocks do "
                         "not tile each other")
    copies = BN // CB
    convert = kv_dtype != dtype  # float8 caches: copied as such, converted in shared memory
    if latent and (convert or not 0 < (dv or D) < D):
        raise ValueError("paged attention: a latent cache needs values narrower than keys "
                         "and no float8 conversion")
    Bd, NB, MBd = T.dyn("B"), T.dyn("NB"), T.dyn("MB")
    qk = scale * LOG2E
    policy = T.GemmWarpPolicy.FullCol if cols else T.GemmWarpPolicy.FullRow
    q_t, cache_t = T.Tensor((Bd, H, D), dtype), T.Tensor((NB, block_size, KVH, D), kv_dtype)
    table_t, lens_t = T.Tensor((Bd, MBd), "int32"), T.Tensor((Bd,), "int32")
    scales_t = T.Tensor((2,), "float32")

    @T.macro
    def attend(Q, Kc, Vc, BT, L, KVS, hx, b, s):
        """The block's online softmax over its split's tokens: (o unnormalized, the row
        sums, the row maxima, the base-2 score scale)."""
        h, ht = hx // HT, hx % HT
        row0 = h * G + ht * rows
        q = T.alloc_shared((rows, DV if latent else D), dtype)
        k = T.alloc_shared((BN, DV if latent else D), dtype)
        v = k if latent else T.alloc_shared((BN, DV), dtype)
        if latent:  # the rope lanes of q and of the cache rows
            q_r = T.alloc_shared((rows, D - DV), dtype)
            k_r = T.alloc_shared((BN, D - DV), dtype)
        k_in, v_in = k, v  # the tiles the copies land in: float8 ones of their own
        if convert:
            k_in = T.alloc_shared((BN, D), kv_dtype)
            v_in = T.alloc_shared((BN, DV), kv_dtype)
        sc = T.alloc_fragment((rows, BN), "float32")
        p = T.alloc_shared((rows, BN), dtype) if cols else T.alloc_fragment((rows, BN), dtype)
        o = T.alloc_fragment((rows, DV), "float32")
        m = T.alloc_fragment((rows,), "float32")
        m_prev = T.alloc_fragment((rows,), "float32")
        alpha = T.alloc_fragment((rows,), "float32")
        row_sum = T.alloc_fragment((rows,), "float32")
        total = T.alloc_fragment((rows,), "float32")
        if latent:
            T.copy(Q[b, row0:row0 + rows, 0:DV], q)  # rows past the heads read as zeros
            T.copy(Q[b, row0:row0 + rows, DV:D], q_r)
        else:
            T.copy(Q[b, row0:row0 + rows, :], q)
        T.fill(o, 0)
        T.fill(total, 0)
        T.fill(m, NEG_INF)
        seq = L[b]
        step_scale = qk * KVS[0]
        per = T.ceildiv(T.ceildiv(MBd * block_size, BN), splits)  # steps per split
        lo = s * per
        n = T.max(T.min(per, T.ceildiv(seq, BN) - lo), 0)
        for step in T.Pipelined(n, num_stages=stages):
            # The step's blocks of K and V first, one copy each, so that the pipeline
            # issues them `stages - 1` steps ahead (cp.async). Blocks past the sequence's
            # end read block 0 (always there); their tokens are masked below.
            for c in range(copies):
                j = (lo + step) * BN + c * CB  # the step's c-th run of CB tokens
                page = T.if_then_else(j < seq, BT[b, T.min(j // block_size, MBd - 1)], 0)
                if latent:
                    T.copy(Kc[page, j % block_size:j % block_size + CB, h, 0:DV],
                           k_in[c * CB:(c + 1) * CB, :])
                    T.copy(Kc[page, j % block_size:j % block_size + CB, h, DV:D],
                           k_r[c * CB:(c + 1) * CB, :])
                else:
                    T.copy(Kc[page, j % block_size:j % block_size + CB, h, :],
                           k_in[c * CB:(c + 1) * CB, :])
            for c in range(copies if not latent else 0):
                j = (lo + step) * BN + c * CB
                page = T.if_then_else(j < seq, BT[b, T.min(j // block_size, MBd - 1)], 0)
                T.copy(Vc[page, j % block_size:j % block_size + CB, h, 0:DV],
                       v_in[c * CB:(c + 1) * CB, :])
            if convert:  # (tiled_cuda.h's fp8_tile_convert on CUDA: 4 elements a step)
                T.copy(k_in, k)
                T.copy(v_in, v)
            for i, t in T.Parallel(rows, BN):
                sc[i, t] = T.if_then_else((lo + step) * BN + t < seq, 0, NEG_INF)
            # Both gemms on one warp grid (FullRow, or FullCol with `cols`), so the row
            # statistics of one are the rows of the other (registers, not replicated).
            T.gemm(q, k, sc, transpose_B=True, policy=policy)
            if latent:
                T.gemm(q_r, k_r, sc, transpose_B=True, policy=policy)
            T.copy(m, m_prev)
            T.reduce_max(sc, m, dim=1, clear=False)
            for i in T.Parallel(rows):
                alpha[i] = T.exp2((m_prev[i] - m[i]) * step_scale)
            for i, t in T.Parallel(rows, BN):
                sc[i, t] = T.exp2((sc[i, t] - m[i]) * step_scale)
            T.reduce_sum(sc, row_sum, dim=1)
            for i in T.Parallel(rows):
                total[i] = total[i] * alpha[i] + row_sum[i]
            T.copy(sc, p)
            for i, d in T.Parallel(rows, DV):
                o[i, d] *= alpha[i]
            T.gemm(p, v, o, policy=policy)
        return o, total, m, step_scale

    # A split with no tokens has total 0 and o 0: it writes zeros and a -inf LSE.
    if splits == 1:
        @tiled.kernel
        def paged_decode(Q: q_t, Kc: cache_t, Vc: cache_t, BT: table_t, L: lens_t,
                         KVS: scales_t, Out: T.Tensor((Bd, H, DV), dtype)):
            with T.Kernel(KVH * HT, Bd, 1, threads=threads) as (hx, b, s):
                o, total, _, _ = attend(Q, Kc, Vc, BT, L, KVS, hx, b, s)
                row0, ht = (hx // HT) * G + (hx % HT) * rows, hx % HT
                for i, d in T.Parallel(rows, DV):
                    if ht * rows + i < G:
                        Out[b, row0 + i, d] = T.cast(
                            o[i, d] * KVS[1] / T.max(total[i], 1e-30), dtype)
        return paged_decode

    @tiled.kernel
    def paged_decode_split(Q: q_t, Kc: cache_t, Vc: cache_t, BT: table_t, L: lens_t,
                           KVS: scales_t, Part: T.Tensor((Bd, H, splits, DV), "float32"),
                           LSE: T.Tensor((Bd, H, splits), "float32")):
        with T.Kernel(KVH * HT, Bd, splits, threads=threads) as (hx, b, s):
            o, total, m, step_scale = attend(Q, Kc, Vc, BT, L, KVS, hx, b, s)
            row0, ht = (hx // HT) * G + (hx % HT) * rows, hx % HT
            for i, d in T.Parallel(rows, DV):
                if ht * rows + i < G:
                    Part[b, row0 + i, s, d] = o[i, d] * KVS[1] / T.max(total[i], 1e-30)
            for i in T.Parallel(rows):
                if ht * rows + i < G:
                    LSE[b, row0 + i, s] = T.log2(total[i]) + m[i] * step_scale
    return paged_decode_split


def combine_kernel(H: int, D: int, splits: int, dtype: str, threads: int = 128):
    """Out[b, h] = the splits' partial outputs Part[b, h, s] weighted by 2^(LSE[b, h, s] - max):
    one block per (head, sequence); a sequence with no tokens gets zeros."""
    Bd = T.dyn("B")

    @tiled.kernel
    def paged_combine(Part: T.Tensor((Bd, H, splits, D), "float32"),
                      LSE: T.Tensor((Bd, H, splits), "float32"),
                      Out: T.Tensor((Bd, H, D), dtype)):
        with T.Kernel(H, Bd, threads=threads) as (h, b):
            top = LSE[b, h, 0]
            for s in range(1, splits):
                top = T.max(top, LSE[b, h, s])
            top = T.if_then_else(top == NEG_INF, 0.0, top)
            for d in T.Parallel(D):
                num = Part[b, h, 0, d] * T.exp2(LSE[b, h, 0] - top)
                den = T.exp2(LSE[b, h, 0] - top)
                for s in range(1, splits):
                    w = T.exp2(LSE[b, h, s] - top)
                    num = num + Part[b, h, s, d] * w
                    den = den + w
                Out[b, h, d] = T.cast(num / T.max(den, 1e-30), dtype)

    return paged_combine


def _bucket(B, H, KVH, D, block_size, dtype, kv_dtype, MB, scale):
    """Batch to the next power of two up to 256; table width (context) to the next power of
    two, so one tuning serves contexts within 2x."""
    return (pow2_bucket(B, 256), H, KVH, D, block_size, dtype, kv_dtype,
            pow2_bucket(MB, 1 << 20), scale)


CACHE_BUDGET = 1 << 30  # bytes per cache the tuning inputs may take (pages are reused past it)


def cache_problem(B, H, KVH, D, block_size, dtype, kv_dtype, MB, dv=None, shared=False):
    """A decode kernel's arguments for tuning: full-length sequences over random distinct
    blocks (wrapping past CACHE_BUDGET), out [B, H, dv or D]; `shared`: one cache for keys
    and values (MLA's latent rows)."""
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt, kvt = _torch_dtype(torch, dtype), _torch_dtype(torch, kv_dtype)
    page = block_size * KVH * D * torch.empty((), dtype=kvt).element_size()
    NB = max(1, min(B * MB, CACHE_BUDGET // page))
    q = torch.randn(B, H, D, device=dev, generator=g).to(dt)
    kc = torch.randn(NB, block_size, KVH, D, device=dev, generator=g).to(kvt)
    vc = kc if shared else torch.randn(NB, block_size, KVH, D, device=dev, generator=g).to(kvt)
    bt = (torch.randperm(B * MB, device=dev, generator=g) % NB).to(torch.int32).view(B, MB)
    seq = torch.full((B,), MB * block_size, device=dev, dtype=torch.int32)
    kvs = torch.ones(2, device=dev, dtype=torch.float32)
    return [q, kc, vc, bt, seq, kvs, torch.zeros(B, H, dv or D, device=dev, dtype=dt)]


def _inputs(B, H, KVH, D, block_size, dtype, kv_dtype, MB, scale, **config):
    return cache_problem(B, H, KVH, D, block_size, dtype, kv_dtype, MB)


def _run(kernel, config, args):
    """out = attention by `kernel` of `config`, as paged_attention runs it (and so as the
    candidates are timed): with splits, partials into a workspace, then paged_combine."""
    import torch

    import tiled.ops as ops

    q, kc, vc, bt, seq, kvs, out = args
    splits = config.get("splits", 1)
    if splits == 1:
        kernel(q, kc, vc, bt, seq, kvs, out)
        return out
    (B, H), DV = q.shape[:2], out.shape[-1]
    o = torch.empty(B, H, splits, DV, device=q.device, dtype=torch.float32)
    lse = torch.empty(B, H, splits, device=q.device, dtype=torch.float32)
    kernel(q, kc, vc, bt, seq, kvs, o, lse)
    ops._kernel("paged_combine", q, H=H, D=DV, splits=splits,
                dtype=str(q.dtype).removeprefix("torch."))(o, lse, out)
    return out


PAGED = TunedOp("paged_attention", decode_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                key=["B", "H", "KVH", "D", "block_size", "dtype", "kv_dtype", "MB", "scale"],
                bucket=_bucket, inputs=_inputs, run=_run)
_SCALES: dict[tuple, object] = {}  # (device, k_scale, v_scale) -> the float32 [2] tensor


def _kv_scales(q, k_scale, v_scale):
    """(k_scale, v_scale) as one float32 [2] tensor on q's device: a cached constant for
    floats (made outside any graph capture), else the two tensors' values gathered on the
    device (no host read)."""
    import torch

    from tiled.ops import _capturing

    if all(s is None or isinstance(s, (int, float)) for s in (k_scale, v_scale)):
        key = (str(q.device), float(1.0 if k_scale is None else k_scale),
               float(1.0 if v_scale is None else v_scale))
        t = _SCALES.get(key)
        if t is None:
            if _capturing(q):
                raise RuntimeError("tiled.ops.paged_attention: call it once with these "
                                   "k_scale / v_scale before capturing a CUDA graph")
            t = _SCALES[key] = torch.tensor(key[1:], device=q.device, dtype=torch.float32)
        return t
    parts = []
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None or isinstance(s, (int, float)):
            s = torch.full((1,), 1.0 if s is None else float(s), device=q.device)
        if s.numel() != 1 or s.device != q.device:
            raise ValueError(f"tiled.ops.paged_attention: {name} must be a float or a "
                             f"one-element tensor on {q.device}, not {tuple(s.shape)} on "
                             f"{s.device}")
        parts.append(s.reshape(1).to(torch.float32))
    return torch.cat(parts)


def check_table(op: str, q, B: int, block_tables, seq_lens, scale, D: int, **caches) -> float:
    """Raises for a block table / lengths pair that is not int32 [B, max_blocks] / [B], for
    tensors off q's device, or for a scale that is not a positive float; returns the scale
    (D ** -0.5 for None). Shared by paged_attention and mla_decode."""
    import torch

    if block_tables.dim() != 2 or block_tables.shape[0] != B or \
            block_tables.dtype != torch.int32 or seq_lens.shape != (B,) or \
            seq_lens.dtype != torch.int32:
        raise ValueError(f"tiled.ops.{op}: block_tables {tuple(block_tables.shape)} "
                         f"{block_tables.dtype} and seq_lens {tuple(seq_lens.shape)} "
                         f"{seq_lens.dtype} must be int32 [{B}, max_blocks] and [{B}]")
    for name, t in (*caches.items(), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.device != q.device:
            raise ValueError(f"tiled.ops.{op}: {name} is on {t.device}, q on {q.device}")
    return softmax_scale(op, scale, D)


def softmax_scale(op: str, scale, D: int) -> float:
    """An attention op's score scale: D ** -0.5 for None; raises for one that is not a
    positive float."""
    if scale is None:
        scale = D ** -0.5
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"tiled.ops.{op}: scale {scale!r} is not a positive float")
    return float(scale)


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None, k_scale=None,
                    v_scale=None):
    """Decode attention of q [batch, heads, head_dim] over the paged caches (module
    docstring); `scale` defaults to head_dim ** -0.5."""
    import torch

    from tiled.ops import _dtype

    op = "paged_attention"
    dtype = _dtype(q, op)
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"tiled.ops.{op}: q {tuple(q.shape)} must be [batch, heads, dim] and "
                         f"the caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} one "
                         "[num_blocks, block_size, kv_heads, dim] shape")
    B, H, D = q.shape
    _, block_size, KVH, Dk = k_cache.shape
    if Dk != D or H % KVH:
        raise ValueError(f"tiled.ops.{op}: q has {H} heads of {D}, the caches {KVH} kv heads "
                         f"of {Dk}: head dims must match and heads divide into kv heads")
    kv_dtype = str(k_cache.dtype).removeprefix("torch.")
    if kv_dtype == "float8_e4m3fn":
        kv_dtype = "float8_e4m3"
    elif kv_dtype != dtype or v_cache.dtype != k_cache.dtype:
        raise TypeError(f"tiled.ops.{op}: the caches are {k_cache.dtype} / {v_cache.dtype}; "
                        f"expected {q.dtype} (q's) or torch.float8_e4m3fn")
    scale = check_table(op, q, B, block_tables, seq_lens, scale, D,
                        k_cache=k_cache, v_cache=v_cache)
    MB = block_tables.shape[1]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if not B or not MB:
        return out.zero_()
    tuned = PAGED.tuned(q, B, H, KVH, D, block_size, dtype, kv_dtype, MB, scale)
    kvs = _kv_scales(q, k_scale, v_scale)
    return _run(tuned.compiled, tuned.config,
                [q.contiguous(), k_cache.contiguous(), v_cache.contiguous(),
                 block_tables.contiguous(), seq_lens.contiguous(), kvs, out])
