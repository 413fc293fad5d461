"""float8 e4m3 in tiled.ops (this module, tiled.ops.fp8): activation quantization and the two
scaled GEMMs serving stacks use, each a DSL kernel with the token count symbolic.

    quantize_fp8(x, block=128)     -> (q, scales): q e4m3 like x; scales float32 [..., K / block],
                                      one per 1 x block group of the last dim (DeepSeek-V3's
                                      activation scaling); block=None: one scale for the tensor
    fp8_linear(x, w, x_scale, w_scale, bias=None, out_dtype=torch.bfloat16)
                                   -> (x @ w.T) dequantized: x [..., K] and w [N, K] e4m3;
                                      per-tensor scales (one element each), or block scales:
                                      x_scale [..., K / 128] (1 x 128 groups), w_scale
                                      [N / 128, K / 128] (128 x 128 blocks)

A scale s dequantizes: value = q * s (so quantize divides by s = amax / 448). The GEMMs are
tuned by tiled.autotune per token-count bucket, as tiled.ops.linear is.
"""


import tiled
import tiled.lang as T
from tiled.ops.gemm import token_bucket
from tiled.ops.tuned import TunedOp

E4M3 = "float8_e4m3"
E4M3_MAX = 448.0
SCALE_BLOCK = 128  # DeepSeek-V3's block: 1 x 128 activation groups, 128 x 128 weight blocks

# Tile configs: BM x BN output tiles over BK = 128 (one scale block per K step). 128 x 224
# tiles (per-tensor only: a block-scaled tile's columns must share or fill 128-row weight
# blocks) put N = 7168 in 32 tiles a row, so 512 tokens are 128 tiles, one wave of 132 SMs,
# where 128 x 128 tiles are 224 (1.7 waves). The paired
# block-scaled form (scaled_gemm_kernel's `paired`; per-tensor keys skip it) with and without
# the consumer warpgroups taking turns: on an H100 the turns read 0.97-1.04x the form without
# them, shape by shape (fp8_scales_probe_forms_h100.json), so both are candidates.
CUDA_SPACE = [
    {"BM": 128, "BN": 128, "threads": 256, "stages": 4},
    {"BM": 128, "BN": 256, "threads": 256, "stages": 3},
    {"BM": 128, "BN": 224, "threads": 256, "stages": 3},
    {"BM": 64, "BN": 128, "threads": 128, "stages": 4},
    {"BM": 64, "BN": 256, "threads": 128, "stages": 4},
    {"BM": 128, "BN": 128, "threads": 256, "stages": 4, "paired": True},
    {"BM": 128, "BN": 128, "threads": 256, "stages": 4, "paired": True,
     "compile_options": {"pingpong": True}},
]
# (A form that took the activation scales M-major through the producer's ring, one TMA row
# a K step, is gone: ncu had put 12% of this form's stall samples on its scale loads, but on
# an H100 the ring form read 0.94-1.07x this form's time at K = 18432 and 1.01-1.13x at K =
# 2048 (128 x 128 tiles), and the paired form beat both at every M >= 512: the candidates
# of fp8_ring2_h100.json. tests/compiler/test_ring_rows.py keeps such a kernel.)
CPU_SPACE = [{"BM": 16, "BN": 64, "threads": 128, "stages": 2},
             {"BM": 32, "BN": 32, "threads": 128, "stages": 2}]
BK = 128


def quantize_group_kernel(N: int, dtype: str, rows: int = 8, threads: int = 128):
    """Rows of N values (a group each) to e4m3 with one float32 scale per row: s = amax / 448
    (at least 1e-12 / 448: an all-zero row keeps s > 0), q = x / s. (8 rows of 128 a block
    read 1104 GB/s at M = 4096 x 7168 on the H200, 32 rows 625: fp8_h200_run1 / fp8_h200.)"""
    R = T.dyn("R")

    @tiled.kernel
    def quantize_fp8_groups(X: T.Tensor((R, N), dtype), Q: T.Tensor((R, N), E4M3),
                            S: T.Tensor((R,), "float32")):
        with T.Kernel(T.ceildiv(R, rows), threads=threads) as bx:
            x = T.alloc_fragment((rows, N), "float32")
            amax = T.alloc_fragment((rows,), "float32")
            for i, j in T.Parallel(rows, N):
                x[i, j] = T.cast(X[bx * rows + i, j], "float32")
            T.reduce_absmax(x, amax, dim=1)
            for i in T.Parallel(rows):
                amax[i] = T.max(amax[i], 1e-12) / E4M3_MAX
                S[bx * rows + i] = amax[i]
            for i, j in T.Parallel(rows, N):
                Q[bx * rows + i, j] = T.cast(x[i, j] / amax[i], E4M3)

    return quantize_fp8_groups


def absmax_kernel(N: int, dtype: str, rows: int = 4, threads: int = 128):
    """S[0] = max(S[0], max |X| / 448) over rows of N (S zeroed first): a tensor's scale. Each
    block reduces its rows in chunks of the widest of 1024 / 512 / 256 / 128 that divides N
    (a whole row held in registers spilled at N = 7168 on the H200: 26 GB/s)."""
    R = T.dyn("R")
    C = next((c for c in (1024, 512, 256, 128) if N % c == 0), N)

    @tiled.kernel
    def tensor_absmax(X: T.Tensor((R, N), dtype), S: T.Tensor((1,), "float32")):
        with T.Kernel(T.ceildiv(R, rows), threads=threads) as bx:
            x = T.alloc_fragment((rows, C), "float32")
            part = T.alloc_fragment((rows,), "float32")
            amax = T.alloc_fragment((rows,), "float32")
            T.fill(amax, 0.0)
            for c in T.serial(N // C):
                for i, j in T.Parallel(rows, C):  # rows past R read as 0
                    x[i, j] = T.if_then_else(
                        bx * rows + i < R, T.abs(T.cast(X[bx * rows + i, c * C + j], "float32")),
                        0.0)
                T.reduce_absmax(x, part, dim=1)
                for i in T.Parallel(rows):
                    amax[i] = T.max(amax[i], part[i])
            for i in T.Parallel(rows):
                T.atomic_max(S[0], T.max(amax[i], 1e-12) / E4M3_MAX)

    return tensor_absmax


def quantize_scaled_kernel(N: int, dtype: str, threads: int = 128):
    """Q = X / S[0] in e4m3 (values past +-448 saturate to +-448), a block per chunk of a row
    (the widest of 1024 / 512 / 256 / 128 dividing N): with a block per 8 whole rows, 128
    rows of 7168 were 16 blocks, 102 us on the H200 (fp8_h200.json)."""
    R = T.dyn("R")
    C = next((c for c in (1024, 512, 256, 128) if N % c == 0), N)

    @tiled.kernel
    def quantize_fp8_scaled(X: T.Tensor((R, N), dtype), S: T.Tensor((1,), "float32"),
                            Q: T.Tensor((R, N), E4M3)):
        with T.Kernel(N // C, R, threads=threads) as (bx, r):
            inv = 1.0 / S[0]
            for j in T.Parallel(C):
                v = T.cast(X[r, bx * C + j], "float32") * inv
                Q[r, bx * C + j] = T.cast(T.min(T.max(v, -E4M3_MAX), E4M3_MAX), E4M3)

    return quantize_fp8_scaled


def scaled_gemm_kernel(M, N, K, out_dtype, block_scaled, BM=128, BN=128, threads=256,
                       stages=4, paired=False):
    """Y = (A @ B^T) dequantized, A [M, K] and B [N, K] e4m3 (M symbolic; `M` only names the
    bucket). Per-tensor: one scale each, applied once to the float32 accumulator. Block-scaled:
    each 128-deep K step's product is scaled by its row's activation scale SA[m, k] and its
    weight block's SB[n / 128, k] before it is added (so BN divides 128 or is a multiple).
    `paired` (block-scaled, BN <= 128, an even number of K steps): two K steps an iteration,
    each into its own product (_paired_blockscaled; `stages` then counts K steps, two a
    ring stage)."""
    Md = T.dyn("M")
    steps = -(-K // BK)
    if paired and not block_scaled:
        raise ValueError("paired fp8 GEMM: block-scaled only (per-tensor products chain)")
    if not block_scaled:
        @tiled.kernel
        def fp8_gemm(A: T.Tensor((Md, K), E4M3), B: T.Tensor((N, K), E4M3),
                     SA: T.Tensor((1,), "float32"), SB: T.Tensor((1,), "float32"),
                     Y: T.Tensor((Md, N), out_dtype)):
            with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
                a_s = T.alloc_shared((BM, BK), E4M3)
                b_s = T.alloc_shared((BN, BK), E4M3)
                acc = T.alloc_fragment((BM, BN), "float32")
                T.clear(acc)
                for k in T.Pipelined(steps, num_stages=stages):
                    T.copy(A[by * BM, k * BK], a_s)
                    T.copy(B[bx * BN, k * BK], b_s)
                    T.gemm(a_s, b_s, acc, transpose_B=True)
                scale = SA[0] * SB[0]
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] *= scale
                T.copy(acc, Y[by * BM, bx * BN])
        return fp8_gemm

    if BN % SCALE_BLOCK and SCALE_BLOCK % BN:
        raise ValueError(f"block-scaled fp8 GEMM: BN = {BN} neither divides nor is a multiple "
                         f"of the {SCALE_BLOCK}-row weight scale blocks")
    G = steps
    NB = -(-N // SCALE_BLOCK)
    one_block = BN <= SCALE_BLOCK  # a tile's columns share one weight scale block
    if paired:
        if not one_block or steps % 2:
            raise ValueError(f"paired block-scaled fp8 GEMM: needs BN <= {SCALE_BLOCK} (got "
                             f"{BN}) and an even number of {BK}-deep K steps (got {steps})")
        return _paired_blockscaled(Md, N, K, out_dtype, BM, BN, threads, stages, steps, NB)

    @tiled.kernel
    def fp8_gemm_blockscaled(A: T.Tensor((Md, K), E4M3), B: T.Tensor((N, K), E4M3),
                             SA: T.Tensor((Md, G), "float32"),
                             SB: T.Tensor((NB, G), "float32"),
                             Y: T.Tensor((Md, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a_s = T.alloc_shared((BM, BK), E4M3)
            b_s = T.alloc_shared((BN, BK), E4M3)
            part = T.alloc_fragment((BM, BN), "float32")
            acc = T.alloc_fragment((BM, BN), "float32")
            sa = T.alloc_fragment((BM,), "float32")
            T.clear(acc)
            for k in T.Pipelined(steps, num_stages=stages):
                T.copy(A[by * BM, k * BK], a_s)
                T.copy(B[bx * BN, k * BK], b_s)
                # The row scales are loaded before the MMA, so their latency hides behind it
                # (read after it, they cost a global round trip per K step: 0.22-0.29x
                # _scaled_mm in fp8_h200_before_ws.json); with BN <= 128 one weight block
                # covers the tile and is folded in too. (Loading them a whole step ahead, or
                # two K steps per iteration, measured the same: fp8_h200_prefetch_pair.json.)
                for i in T.Parallel(BM):
                    sa[i] = SA[by * BM + i, k] * (SB[bx * BN // SCALE_BLOCK, k] if one_block
                                                  else 1.0)
                T.gemm(a_s, b_s, part, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] += part[i, j] * sa[i] * (
                        1.0 if one_block else SB[(bx * BN + j) // SCALE_BLOCK, k])
            T.copy(acc, Y[by * BM, bx * BN])
    return fp8_gemm_blockscaled


def _paired_blockscaled(Md, N, K, out_dtype, BM, BN, threads, stages, steps, NB):
    """scaled_gemm_kernel's `paired` form: two K steps an iteration, each into its own
    product (p0, p1); p1 is added into the sum in the next iteration, after that one's first
    MMA. On an H100 at N = 7168, K = 2048 / 18432, M = 512-4096 it ran 0.74-0.84x
    torch._scaled_mm per-tensor where one product a step ran 0.68-0.78x (128 x 128 tiles,
    fp8_scales_probe_forms_h100.json: fewer instructions a step; issuing both MMAs before
    the first rescale, so that it meets the second MMA, measured no faster). `steps`: the
    K steps (one scale column each, the last past K read as zeros)."""
    G = steps

    @tiled.kernel
    def fp8_gemm_blockscaled_paired(A: T.Tensor((Md, K), E4M3), B: T.Tensor((N, K), E4M3),
                                    SA: T.Tensor((Md, G), "float32"),
                                    SB: T.Tensor((NB, G), "float32"),
                                    Y: T.Tensor((Md, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a0 = T.alloc_shared((BM, BK), E4M3)
            b0 = T.alloc_shared((BN, BK), E4M3)
            a1 = T.alloc_shared((BM, BK), E4M3)
            b1 = T.alloc_shared((BN, BK), E4M3)
            p0 = T.alloc_fragment((BM, BN), "float32")
            p1 = T.alloc_fragment((BM, BN), "float32")
            acc = T.alloc_fragment((BM, BN), "float32")
            s0 = T.alloc_fragment((BM,), "float32")
            s1 = T.alloc_fragment((BM,), "float32")
            s_last = T.alloc_fragment((BM,), "float32")  # p1's scales, for the next iteration
            T.clear(acc)
            T.clear(p1)
            T.clear(s_last)
            for k in T.Pipelined(steps // 2, num_stages=max(2, stages // 2)):
                T.copy(A[by * BM, 2 * k * BK], a0)
                T.copy(B[bx * BN, 2 * k * BK], b0)
                T.copy(A[by * BM, (2 * k + 1) * BK], a1)
                T.copy(B[bx * BN, (2 * k + 1) * BK], b1)
                for i in T.Parallel(BM):
                    s0[i] = SA[by * BM + i, 2 * k] * SB[bx * BN // SCALE_BLOCK, 2 * k]
                    s1[i] = SA[by * BM + i, 2 * k + 1] * SB[bx * BN // SCALE_BLOCK, 2 * k + 1]
                T.gemm(a0, b0, p0, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] += p1[i, j] * s_last[i]
                T.gemm(a1, b1, p1, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] += p0[i, j] * s0[i]
                for i in T.Parallel(BM):
                    s_last[i] = s1[i]
            for i, j in T.Parallel(BM, BN):
                acc[i, j] += p1[i, j] * s_last[i]
            T.copy(acc, Y[by * BM, bx * BN])
    return fp8_gemm_blockscaled_paired


# -- the ops -----------------------------------------------------------------------------------
def _fp8_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def quantize_fp8(x, block: int | None = 128):
    """(q, scales) for x [..., K] (bf16 / fp16 / fp32): q e4m3 of x's shape with x = q * s.
    `block`: groups of that many consecutive values of the last dim, one float32 scale each
    (scales [..., K / block]); None: one scale for the whole tensor (scales of shape [1])."""
    import torch

    from tiled.ops import _dtype, _kernel, _rows

    op = "quantize_fp8"
    dtype = _dtype(x, op)
    x2 = _rows(x.contiguous(), op)
    M, K = x2.shape
    q = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    if block is None:
        s = torch.zeros(1, device=x.device, dtype=torch.float32)
        if x2.numel():
            _kernel("fp8_absmax", x, N=K, dtype=dtype)(x2, s)
            _kernel("quantize_fp8_scaled", x, N=K, dtype=dtype)(x2, s, q.view(M, K))
        return q, s
    if not isinstance(block, int) or block < 1 or K % block:
        raise ValueError(f"tiled.ops.{op}: block {block!r} does not divide the last dim {K}")
    s = torch.empty(*x.shape[:-1], K // block, device=x.device, dtype=torch.float32)
    if x2.numel():
        _kernel("quantize_fp8_groups", x, N=block, dtype=dtype)(
            x2.view(-1, block), q.view(-1, block), s.view(-1))
    return q, s


def fp8_linear(x, w, x_scale, w_scale, bias=None, out_dtype=None):
    """(x @ w.T) * scales (+ bias) for e4m3 x [..., K] and w [N, K], in `out_dtype` (default
    bfloat16): per-tensor scales (x_scale, w_scale of one element each) or DeepSeek-style
    block scales (x_scale [..., K / 128], w_scale [ceil(N / 128), K / 128])."""
    import torch

    from tiled.ops import _rows

    op = "fp8_linear"
    for name, t in (("x", x), ("w", w)):
        if _fp8_name(t) != "float8_e4m3fn":
            raise TypeError(f"tiled.ops.{op}: {name} is {t.dtype}, expected float8_e4m3fn")
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"tiled.ops.{op}: x {tuple(x.shape)} and w {tuple(w.shape)} do not "
                         "multiply as x @ w.T")
    odt = out_dtype or torch.bfloat16
    out_name = str(odt).removeprefix("torch.")
    if out_name not in ("bfloat16", "float16", "float32"):
        raise TypeError(f"tiled.ops.{op}: out_dtype {odt} is not bfloat16, float16 or float32")
    x2 = _rows(x.contiguous(), op)
    M, K = x2.shape
    N = w.shape[0]
    G, NB = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    if x_scale.numel() == 1 and w_scale.numel() == 1:
        block_scaled = False
        sa, sb = x_scale.reshape(1), w_scale.reshape(1)
    elif tuple(x_scale.shape) == (*x.shape[:-1], G) and tuple(w_scale.shape) == (NB, G):
        block_scaled = True
        sa, sb = x_scale.reshape(M, G), w_scale
    else:
        raise ValueError(
            f"tiled.ops.{op}: scales {tuple(x_scale.shape)} and {tuple(w_scale.shape)} are "
            f"neither per-tensor (one element each) nor blocks (x_scale {(*x.shape[:-1], G)}, "
            f"w_scale {(NB, G)})")
    for name, t in (("x_scale", sa), ("w_scale", sb)):
        if t.dtype != torch.float32 or t.device != x.device:
            raise ValueError(f"tiled.ops.{op}: {name} is {t.dtype} on {t.device}, expected "
                             f"float32 on {x.device}")
    if w.device != x.device:
        raise ValueError(f"tiled.ops.{op}: x is on {x.device}, w on {w.device}")
    tuned = FP8_LINEAR.tuned(x, M, N, K, out_name, block_scaled)
    y = torch.empty(M, N, device=x.device, dtype=odt)
    if M:
        tuned.compiled(x2, w.contiguous(), sa.contiguous(), sb.contiguous(), y)
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], N)


def _bucket(M, N, K, out_dtype, block_scaled):
    m = token_bucket(M, N, K, "float8_e4m3", out_dtype)[0]
    return m, N, K, out_dtype, block_scaled


def _inputs(M, N, K, out_dtype, block_scaled, **config):
    """Random e4m3 operands with scales (so the candidates' outputs compare at bf16 scale)."""
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(M, K, device=dev, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(N, K, device=dev, generator=g).to(torch.float8_e4m3fn)
    G, NB = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    if block_scaled:
        sa = torch.rand(M, G, device=dev, generator=g) / K ** 0.5 + 1e-3
        sb = torch.rand(NB, G, device=dev, generator=g) + 0.5
    else:
        sa = torch.full((1,), K ** -0.5, device=dev)
        sb = torch.full((1,), 1.0, device=dev)
    return [a, b, sa, sb, torch.zeros(M, N, device=dev, dtype=_torch_dtype(torch, out_dtype))]


FP8_LINEAR = TunedOp("fp8_linear", scaled_gemm_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                     key=["M", "N", "K", "out_dtype", "block_scaled"], bucket=_bucket,
                     inputs=_inputs)
