"""tiled.ops.mla_decode (this module, tiled.ops.mla): DeepSeek's multi-head latent attention at
decode, laid out as FlashMLA's.

    mla_decode(q, kv_cache, block_tables, seq_lens, head_dim_v=512, scale=None) -> out
        q [batch, q_len, heads, d] (d = kv_lora_rank + rope dim: 512 + 64 = 576 for
        DeepSeek-V2/V3, the absorbed weights' form); kv_cache [num_blocks, block_size, 1, d]
        (one latent head: keys are whole rows, values their first head_dim_v lanes);
        block_tables int32 [batch, max_blocks]; seq_lens int32 [batch] (the cache's tokens,
        the q_len new ones included); out [batch, q_len, heads, head_dim_v] in q's dtype.
        Query token t of q_len sees the first seq_len - q_len + t + 1 tokens (causal), as
        speculative decoding needs. `scale` defaults to d ** -0.5 (FlashMLA's default).

It is tiled.ops.paged's decode kernel with one kv head, 16 to 64 query heads per block (64:
the cache is read once per 64 heads, not once per 16) and values narrower than keys; tuned
by tiled.autotune on its own space per (batch bucket, table width bucket). The q_len
query tokens become q_len rows of the batch (their table rows repeated, their lengths
computed on the device: no host read).
"""

from tiled.ops.paged import _run, cache_problem, decode_kernel
from tiled.ops.tuned import TunedOp, pow2_bucket

ROWS_MLA = 64
# (query heads a block, threads) x splits, 32 tokens a step. Both gemms take FullRow warp
# grids (paged.decode_kernel), so the scores and the 512-wide output share one: 4 x 2 warps
# at 64 heads keep o at 128 floats a thread; fewer heads a block read the cache more often
# but hold less.
CUDA_SPACE = [{"BN": 32, "threads": t, "rows": r, "splits": s, "stages": 2}
              for r, t in ((64, 256), (32, 256), (32, 128), (16, 128))
              for s in (1, 2, 4, 8, 16)]
# On sm_90a: both gemms FullCol (`cols`), so that the two warpgroups split the scores' and
# the 512 output columns of 64 heads (BN / 2 and 256 each) and take wgmma, the
# probabilities passing through shared memory; elsewhere they are mma.sync configs. With
# `latent` each step copies the cache rows once (512 value lanes read by both gemms, 64 rope
# lanes), which leaves room for 64-token steps or a third stage.
CUDA_SPACE += [{"BN": bn, "threads": 256, "rows": 64, "splits": s, "stages": st, "cols": True,
                **({"latent": True} if latent else {})}
               for bn, st, latent in ((32, 2, False), (32, 2, True), (32, 3, True),
                                      (64, 2, True))
               for s in (1, 2, 4, 8, 16)]
CPU_SPACE = [{"BN": 16, "threads": 32, "splits": 1}, {"BN": 16, "threads": 32, "splits": 2}]


def mla_kernel(B, H, D, DV, block_size, dtype, MB, scale, BN=32, threads=128, splits=1,
               stages=2, rows=ROWS_MLA, cols=False, latent=False):
    """decode_kernel for MLA: one kv head, up to `rows` query heads a block, DV-wide
    values."""
    return decode_kernel(B, H, 1, D, block_size, dtype, dtype, MB, scale, BN=BN,
                         threads=threads, splits=splits, stages=stages,
                         rows=min(rows, 16 * -(-H // 16)), dv=DV, cols=cols, latent=latent)


def _bucket(B, H, D, DV, block_size, dtype, MB, scale):
    return pow2_bucket(B, 1024), H, D, DV, block_size, dtype, pow2_bucket(MB, 1 << 20), scale


def _inputs(B, H, D, DV, block_size, dtype, MB, scale, **config):
    return cache_problem(B, H, 1, D, block_size, dtype, dtype, MB, dv=DV, shared=True)


MLA = TunedOp("mla_decode", mla_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
              key=["B", "H", "D", "DV", "block_size", "dtype", "MB", "scale"], bucket=_bucket,
              inputs=_inputs, run=_run)


def mla_decode(q, kv_cache, block_tables, seq_lens, head_dim_v: int = 512, scale=None):
    """MLA decode attention (module docstring)."""
    import torch

    from tiled.ops import _dtype
    from tiled.ops.paged import _kv_scales, check_table

    op = "mla_decode"
    dtype = _dtype(q, op)
    if q.dim() != 4 or kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or \
            kv_cache.shape[3] != q.shape[3]:
        raise ValueError(f"tiled.ops.{op}: q {tuple(q.shape)} must be [batch, q_len, heads, d] "
                         f"and kv_cache {tuple(kv_cache.shape)} [num_blocks, block_size, 1, d]")
    B, QL, H, D = q.shape
    block_size = kv_cache.shape[1]
    if not isinstance(head_dim_v, int) or not 0 < head_dim_v <= D:
        raise ValueError(f"tiled.ops.{op}: head_dim_v {head_dim_v!r} is not in 1 .. {D}")
    if kv_cache.dtype != q.dtype:
        raise TypeError(f"tiled.ops.{op}: kv_cache is {kv_cache.dtype}, expected q's {q.dtype}")
    scale = check_table(op, q, B, block_tables, seq_lens, scale, D, kv_cache=kv_cache)
    MB = block_tables.shape[1]
    out = torch.empty(B * QL, H, head_dim_v, device=q.device, dtype=q.dtype)
    if not B or not QL or not MB:
        return out.zero_().view(B, QL, H, head_dim_v)
    qf = q.reshape(B * QL, H, D).contiguous()
    if QL == 1:
        bt, seq = block_tables.contiguous(), seq_lens.contiguous()
    else:  # query token t sees seq_len - QL + t + 1 tokens
        bt = block_tables.repeat_interleave(QL, 0).contiguous()
        ahead = torch.arange(QL - 1, -1, -1, device=q.device, dtype=torch.int32)
        seq = (seq_lens[:, None] - ahead[None, :]).clamp_min(0).reshape(-1).contiguous()
    tuned = MLA.tuned(q, B * QL, H, D, head_dim_v, block_size, dtype, MB, scale)
    kv = kv_cache.contiguous()
    _run(tuned.compiled, tuned.config, [qf, kv, kv, bt, seq, _kv_scales(q, None, None), out])
    return out.view(B, QL, H, head_dim_v)
