"""tiled.ops.linear (this module, tiled.ops.gemm): y = x @ w.T (F.linear's layout, w [N, K]),
tuned by tiled.autotune over the kernel shapes benchmarks/gpu/linear.py measured on the H200,
per bucket of token counts.

Three kernel forms, all with the token count M symbolic (one compile serves a whole bucket):
- `tile`: BM x BN output tiles, x and w tiles copied per 64-wide K step, T.gemm with
  transpose_B (on sm_90a the whole-kernel warp-specialized GEMM path takes it);
- `swap`: y^T = w @ x^T for few tokens, so that w's rows fill the MMA's M side and the tokens
  its N side;
- `gemv`: for 1 .. 4 tokens, no MMA: lanes multiply w's rows by the tokens in float32, one
  cross-lane sum at the end (`_gemv_kernel`);
- `streamk`: `units` persistent blocks share the partial last wave's tiles K step by K step,
  then take the full waves' tiles whole (tiled.ops.gemm_streamk).
Either with `splits` > 1: split-K over a third grid axis, split s writing its float32 partial
into P[s] of a [splits, M, N] workspace, which one `splitk_sum` kernel adds up and casts into
y (no zeroing, no atomics: two launches in all). The GEMM runs T.pdl_trigger after its main
loop and the sum starts with T.pdl_sync, so the sum is launched programmatically: resident
when the GEMM's blocks finish instead of a launch later (4096 x 4096 at 64 tokens 0.82 ->
0.85x F.linear with 2 splits, 0.86 -> 0.90x with 4: benchmarks/results/splitk_pdl_h200.json).
"""

import tiled
import tiled.lang as T
from tiled.ops.gemm_streamk import run_stream_k, stream_k_kernel
from tiled.ops.split_k import add_up_last, run_split
from tiled.ops.tuned import TunedOp, pow2_bucket

BK = 64

# Configs per target kind: tile (BM, BN, threads[, splits]), swap and gemv (BM = tokens per
# block, BN = w rows per block, threads, splits[, stages]). The CUDA space: the candidates of
# benchmarks/results/linear_h200.json, split-K tiles for small grids, and for decode deeper
# pipelines (more bytes in flight per SM), 16-token swaps (wgmma n16 on the warp-specialized
# path at 128 / 256 threads; mma.sync at 64 threads, where N / 32 blocks fill the GPU without
# split-K) and, for 1 .. 4 tokens, gemv blocks of 4 or 8 w rows.
CUDA_SPACE = [
    {"kind": "tile", "BM": 128, "BN": 256, "threads": 256},
    {"kind": "tile", "BM": 128, "BN": 128, "threads": 256},
    {"kind": "tile", "BM": 64, "BN": 128, "threads": 128},
    {"kind": "tile", "BM": 64, "BN": 256, "threads": 128},
    {"kind": "tile", "BM": 128, "BN": 192, "threads": 256},
    {"kind": "tile", "BM": 128, "BN": 224, "threads": 256},
    {"kind": "tile", "BM": 64, "BN": 224, "threads": 128},
    *({"kind": "tile", "BM": bm, "BN": 128, "threads": t, "splits": s}
      for bm, t in ((128, 256), (64, 128)) for s in (2, 4)),
    *({"kind": "swap", "BM": bx, "BN": bw, "threads": t, "splits": s}
      for bx in (64, 128) for bw, t in ((128, 256), (64, 128)) for s in (1, 2, 4)),
    *({"kind": "swap", "BM": 64, "BN": bw, "threads": t, "splits": s, "stages": 8}
      for bw, t in ((128, 256), (64, 128)) for s in (1, 2, 4)),
    *({"kind": "swap", "BM": 16, "BN": bw, "threads": t, "splits": s, "stages": st}
      for bw, t, st in ((64, 128, 8), (32, 64, 8), (128, 256, 8)) for s in (1, 2, 4)),
    *({"kind": "gemv", "BM": bx, "BN": bw, "threads": 128, "splits": s}
      for bx in (1, 2, 4) for bw in (4, 8) for s in (1, 2)),
    # narrow tiles for few tokens: 64 x 32 (wgmma n32) puts 128 blocks on a 4096-row weight
    # without split-K (a second kernel), 64 x 16 256
    *({"kind": "tile", "BM": 64, "BN": 32, "threads": 128, "stages": 8, "splits": s}
      for s in (1, 2, 4)),
    {"kind": "tile", "BM": 64, "BN": 16, "threads": 128, "stages": 8},
    # stream-K (gemm_streamk.py): 132 units share the partial last wave's tiles step by step
    *({"kind": "streamk", "BM": bm, "BN": bn, "threads": t, "units": 132}
      for bm, bn, t in ((128, 256, 256), (128, 128, 256), (64, 128, 128))),
]
# The split-K tiles and swaps with their sum in the GEMM kernel (split_k.py, sum="last"), not
# in the space yet: right on the cpu target, and on sm_90a each tile's last split issues all
# its loads of the partials before adding (32 LDG.128 ahead of the first FADD), but no GPU
# has run them since that change; an earlier form, its loads a row at a time, read 0.72 /
# 0.82x F.linear at 64 / 128 tokens on the H200 where the second kernel read 0.83 / 0.96x
# (docs/ops.md). benchmarks/gpu/probes/split_sum_probe.py times both sums side by side on a
# bundle that AUTOTUNE_LINEAR_LAST=1 benchmarks/gpu/autotune_linear.py build adds them to.
LAST_SUM_CONFIGS = [{**c, "sum": "last"} for c in CUDA_SPACE
                    if c.get("splits", 1) > 1 and c["kind"] in ("tile", "swap")]
# (64-column tiles, 128 x 64 and 64 x 64, never won a bucket on the H200 and are left out:
# benchmarks/results/autotune_linear_h200_run5.json.) 128 x 192 and 224-column tiles are for
# grids that 128 x 256 ones leave a partial last wave of: 14336 columns at 1024 tokens are 448
# such tiles, 3.4 waves of 132 SMs, 600 of 128 x 192 (4.5 waves) and 512 of 128 x 224 (3.9
# waves); at 128 tokens 64 x 224 tiles are 128 blocks, one wave, where 64 x 128 ones are 224
# (1.7). Both widths are one wgmma a K slice (n192, n224: tiled_sm90_explicit.h cols_width).
# The CPU space: tiles of 64 x 128, 128 x 128 and 256 x 128 from as many tokens as their rows
# (`min_tokens`), which keep the shim's microkernel on a panel long enough to pay for packing
# it (bf16, N = K = 4096 on the 2-core Zen 3: 64 x 128 reads 81 GFLOP/s at 64 tokens where
# 32 x 32 reads 47; 256 x 128 133-136 at 256 and 1024 tokens where 32 x 32 reads 50-51:
# benchmarks/results/cpu_linear.json); the small tiles and gemvs for fewer tokens. A CPU gemv
# block is one thread walking K 8 x `threads` lanes a step, its partials one per lane, token
# and row: 4 "threads" (32 lanes) read 14-20 GFLOP/s at one token (N = K = 4096) where 128
# (1024 lanes, 32 KiB of partials for 8 rows) read 10-12.
CPU_SPACE = [
    *({"kind": "tile", "BM": bm, "BN": 128, "threads": 128, "min_tokens": bm}
      for bm in (64, 128, 256)),
    {"kind": "tile", "BM": 32, "BN": 32, "threads": 128},
    {"kind": "tile", "BM": 16, "BN": 64, "threads": 128},
    {"kind": "tile", "BM": 16, "BN": 64, "threads": 128, "splits": 2},
    *({"kind": "gemv", "BM": bx, "BN": 8, "threads": 4} for bx in (1, 2, 4)),
]


def token_bucket(M: int, N: int, K: int, dtype: str, out_dtype: str):
    """The token counts one tuning serves: 1, 2, ... powers of two up to 4096, then 8192+."""
    return tokens_bucket(M), N, K, dtype, out_dtype


def tokens_bucket(M: int) -> int:
    """The bucket of token count M (token_bucket's first value)."""
    return pow2_bucket(M, 8192)


def _fits(cfg: dict, M: int) -> bool:
    """Which configs a token count M is tuned over, decided by M's bucket (a tuning builds
    its candidates at the bucket's count and its winner serves every count of the bucket):
    gemvs of the bucket (1, 2 or 3..4 tokens per block); swaps whose token tile (BM) covers
    it, the 128-token ones only past 16 tokens; tiles from 64 tokens (64-row tiles below
    too); split-K tiles for 64 .. 1024 tokens, where the tiles alone leave SMs idle; none
    below a config's `min_tokens`."""
    M = tokens_bucket(M)
    if cfg.get("min_tokens", 0) > M:
        return False
    if cfg["kind"] == "gemv":
        return cfg["BM"] >= M and cfg["BM"] < 2 * M
    if cfg["kind"] == "swap":
        return cfg["BM"] >= M and (cfg["BM"] <= 64 or M > 16)
    if cfg.get("splits", 1) > 1:
        return 64 <= M <= 1024
    if cfg["kind"] == "streamk":
        return 64 <= M <= 4096
    return M >= 64 or cfg["BM"] == 64 or cfg["BM"] <= 32


def linear_kernel(M, N, K, dtype, out_dtype, kind="tile", BM=128, BN=128, threads=128,
                  splits=1, stages=4, min_tokens=0, trigger=None, units=132, sum="kernel"):
    """The kernel of one config (M only selects: the kernel's M is symbolic; a config serves
    M from `min_tokens`). With `splits` > 1 the K loop is split over a third grid axis and
    split s writes its float32 partial into P[s] ([splits, M, N]), which `splitk_sum` adds
    up and casts (`sum="kernel"`) or the tile's last split to finish adds up in the same
    kernel (`sum="last"`: tiled.ops.split_k). `trigger` (default: with a `splitk_sum`):
    T.pdl_trigger after the main loop, so that the programmatically launched sum may start
    then."""
    if sum not in ("kernel", "last"):
        raise ValueError(f"linear: sum must be 'kernel' or 'last', got {sum!r}")
    last = splits > 1 and sum == "last"
    trigger = splits > 1 and not last if trigger is None else trigger
    if not _fits({"kind": kind, "BM": BM, "splits": splits, "min_tokens": min_tokens}, M):
        raise ValueError(f"config {kind} {BM}x{BN} is not for M = {M}")
    Md = T.dyn("M")
    if kind == "streamk":
        return stream_k_kernel(Md, N, K, dtype, out_dtype, BM, BN, threads, units, stages)
    steps = -(-K // BK)
    per_split = -(-steps // splits)  # K steps per split
    y_t = T.Tensor((Md, N), out_dtype)
    out = y_t if splits == 1 else T.Tensor((splits, Md, N), "float32")
    extra = (splits,) if splits > 1 else ()  # the split axis of the grid

    def split_of(g):
        """(the block's split: 0 without one, Y's leading index for it: none without one)."""
        return (g[2], (g[2],)) if splits > 1 else (0, ())
    if kind == "gemv":
        if last:
            raise ValueError("linear: gemv configs take sum='kernel'")
        return _gemv_kernel(Md, N, K, dtype, BM, BN, threads, splits, out, extra, split_of)
    tiles_n = -(-N // BN)
    c_t = T.Tensor((T.dyn("tiles"),), "int32")  # sum="last": the tiles' counters

    @T.macro
    def product(A, B, acc, a0, b0, bz, rows_a: int, rows_b: int):
        """acc = A's rows_a x K rows from a0 by B's rows_b x K rows from b0, transposed, over
        split bz's K steps (tile: A = X, B = Wt; swap: A = Wt, B = X)."""
        a_s = T.alloc_shared((rows_a, BK), dtype)
        b_s = T.alloc_shared((rows_b, BK), dtype)
        T.clear(acc)
        for k in T.Pipelined(per_split, num_stages=stages):
            T.copy(A[a0, (bz * per_split + k) * BK], a_s)
            T.copy(B[b0, (bz * per_split + k) * BK], b_s)
            T.gemm(a_s, b_s, acc, transpose_B=True)
        if trigger:
            T.pdl_trigger()

    if kind == "tile" and last:
        @tiled.kernel
        def linear_tile_last(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype),
                             Y: y_t, P: out, C: c_t):
            with T.Kernel(tiles_n, T.ceildiv(Md, BM), splits, threads=threads) as (bx, by, bz):
                acc = T.alloc_fragment((BM, BN), "float32")
                product(X, Wt, acc, by * BM, bx * BN, bz, BM, BN)
                T.copy(acc, P[bz, by * BM, bx * BN])
                add_up_last(P, C, Y, by * tiles_n + bx, by * BM, bx * BN, BM, BN, splits,
                            out_dtype)
        return linear_tile_last
    if kind == "tile":
        @tiled.kernel
        def linear_tile(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype), Y: out):
            with T.Kernel(tiles_n, T.ceildiv(Md, BM), *extra, threads=threads) as g:
                (bx, by), (bz, lead) = g[:2], split_of(g)
                acc = T.alloc_fragment((BM, BN), "float32")
                product(X, Wt, acc, by * BM, bx * BN, bz, BM, BN)
                T.copy(acc, Y[*lead, by * BM, bx * BN])
        return linear_tile

    BW, BX = BN, BM  # swap: w rows per block, tokens per block

    if last:
        @tiled.kernel
        def linear_swap_last(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype),
                             Y: y_t, P: out, C: c_t):
            with T.Kernel(tiles_n, T.ceildiv(Md, BX), splits, threads=threads) as (bx, by, bz):
                acc = T.alloc_fragment((BW, BX), "float32")
                product(Wt, X, acc, bx * BW, by * BX, bz, BW, BX)
                for i, j in T.Parallel(BW, BX):  # rows past M or N: the guards drop them
                    P[bz, by * BX + j, bx * BW + i] = acc[i, j]
                add_up_last(P, C, Y, by * tiles_n + bx, by * BX, bx * BW, BX, BW, splits,
                            out_dtype)
        return linear_swap_last

    @tiled.kernel
    def linear_swap(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype), Y: out):
        with T.Kernel(tiles_n, T.ceildiv(Md, BX), *extra, threads=threads) as g:
            (bx, by), (bz, lead) = g[:2], split_of(g)
            acc = T.alloc_fragment((BW, BX), "float32")
            product(Wt, X, acc, bx * BW, by * BX, bz, BW, BX)
            for i, j in T.Parallel(BW, BX):  # rows past M or N: the guards drop them
                Y[*lead, by * BX + j, bx * BW + i] = acc[i, j]
    return linear_swap


def _gemv_kernel(Md, N, K, dtype, BX, BW, threads, splits, out, extra, split_of):
    """The `gemv` form for a few tokens (BX of them per block), without MMA: each block takes
    BW rows of w and walks K 8 x threads lanes at a time, every lane keeping its own float32
    partial products per (token, row), summed across lanes once at the end. Tokens share
    each w vector they load, so w streams from memory once; BW small enough fills the GPU
    with N / BW blocks (split-K when that is not enough). A step is 8 lanes per thread
    (16-byte loads), so every row spans whole rounds of the block and the final sum is
    thread-local, then shuffles (reduce.py's rounds case); K is walked in such steps,
    `per_split` of them per split."""
    width = 8 * threads
    rows = BX * BW
    steps = -(-K // width)
    per_split = -(-steps // splits)

    @tiled.kernel
    def linear_gemv(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype), Y: out):
        with T.Kernel(T.ceildiv(N, BW), T.ceildiv(Md, BX), *extra, threads=threads) as g:
            (bx, by), (bz, lead) = g[:2], split_of(g)
            part = T.alloc_fragment((rows, width), "float32")
            total = T.alloc_fragment((rows,), "float32")
            if BX == 1:  # w through a fragment of its own: 16-byte loads, all rows at once
                wf = T.alloc_fragment((BW, width), dtype)
            T.clear(part)
            for k in T.serial(per_split):
                base = (bz * per_split + k) * width
                if BX == 1:
                    T.copy(Wt[bx * BW, base], wf)
                    for r, j in T.Parallel(rows, width):
                        part[r, j] += T.cast(wf[r, j], "float32") * \
                            T.cast(X[by, base + j], "float32")
                else:  # (a [BW, width] fragment read as wf[r % BW] would be replicated)
                    for r, j in T.Parallel(rows, width):
                        part[r, j] += T.cast(Wt[bx * BW + r % BW, base + j], "float32") * \
                            T.cast(X[by * BX + r // BW, base + j], "float32")
            T.reduce_sum(part, total, dim=1)
            for r in T.Parallel(rows):  # tokens past M, rows past N: the guards drop them
                Y[*lead, by * BX + r // BW, bx * BW + r % BW] = total[r]
    return linear_gemv


def matmul_kernel(M, N, K, dtype, out_dtype, kind="tile", BM=128, BN=128, threads=128,
                  stages=4, min_tokens=0):
    """C = A @ B for A [M, K] and B [K, N] row-major (B's tiles K x N: wgmma's N-major B
    operand), M symbolic; the tile configs of linear's space (`kind` must be "tile"), each
    from its `min_tokens` rows of A."""
    if kind != "tile":
        raise ValueError(f"matmul takes tile configs, not {kind!r}")
    if min_tokens > tokens_bucket(M):
        raise ValueError(f"config tile {BM}x{BN} is not for M = {M}")
    Md = T.dyn("M")

    @tiled.kernel
    def matmul_tile(A: T.Tensor((Md, K), dtype), B: T.Tensor((K, N), dtype),
                    C: T.Tensor((Md, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a_s = T.alloc_shared((BM, BK), dtype)
            b_s = T.alloc_shared((BK, BN), dtype)
            acc = T.alloc_fragment((BM, BN), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=stages):
                T.copy(A[by * BM, k * BK], a_s)
                T.copy(B[k * BK, bx * BN], b_s)
                T.gemm(a_s, b_s, acc)
            T.copy(acc, C[by * BM, bx * BN])
    return matmul_tile


def _matmul_inputs(M, N, K, dtype, out_dtype, **config):
    x, w, y = _inputs(M, N, K, dtype, out_dtype)
    return [x, w.t().contiguous(), y]


def _inputs(M, N, K, dtype, out_dtype, **config):
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt = _torch_dtype(torch, dtype)
    x = torch.randn(M, K, device=dev, generator=g).to(dt)
    w = (torch.randn(N, K, device=dev, generator=g) / K ** 0.5).to(dt)
    return [x, w, torch.zeros(M, N, device=dev, dtype=_torch_dtype(torch, out_dtype))]


def _run(kernel, config, args):
    """y = x @ w.T by `kernel` of `config` into args' y, as linear runs it and so as its
    candidates are timed (split-K through split_k.run_split)."""
    x, w, y = args
    if config.get("kind") == "streamk":
        return run_stream_k(kernel, config, x, w, y)
    return run_split(y, config, lambda *out: kernel(x, w, *out))


def _launch(tuned, x2, w, odt):
    """y = x2 @ w.T in dtype `odt` through the tuned kernel."""
    import torch

    y = torch.empty(x2.shape[0], w.shape[0], device=x2.device, dtype=odt)
    _run(tuned.compiled, tuned.config, [x2, w, y])
    return y


LINEAR = TunedOp("linear", linear_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                 key=["M", "N", "K", "dtype", "out_dtype"], bucket=token_bucket,
                 inputs=_inputs, run=_run)
MATMUL = TunedOp("matmul", matmul_kernel,
                 {kind: [c for c in space if c["kind"] == "tile"]
                  for kind, space in (("cuda", CUDA_SPACE), ("cpu", CPU_SPACE))},
                 key=["M", "N", "K", "dtype", "out_dtype"], bucket=token_bucket,
                 inputs=_matmul_inputs)


def _operands(op: str, x, w, out_dtype):
    """(x as [M, K] rows, its dtype name, the output's torch dtype and name) for a bf16 / fp16
    GEMM of x and w; raises for operands of other dtypes or devices."""
    from tiled.ops import _dtype, _rows

    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"tiled.ops.{op}: the operands are {x.dtype} on {x.device} and "
                         f"{w.dtype} on {w.device}")
    dtype = _dtype(x, op)
    if dtype == "float32":
        raise TypeError(f"tiled.ops.{op}: float32 inputs are not supported (bf16 or fp16)")
    odt = out_dtype or x.dtype
    return _rows(x.contiguous(), op), dtype, odt, str(odt).removeprefix("torch.")


def linear(x, w, bias=None, out_dtype=None):
    """x @ w.T (+ bias) for x [..., K] and w [N, K] (bf16 / fp16), in `out_dtype` (default
    x's). The kernel is chosen by tiled.autotune per token-count bucket, then kept."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"tiled.ops.linear: x {tuple(x.shape)} and w {tuple(w.shape)} do not "
                         "multiply as x @ w.T")
    x2, dtype, odt, out_name = _operands("linear", x, w, out_dtype)
    (M, K), N = x2.shape, w.shape[0]
    if not M:  # nothing to tune or launch for
        import torch

        y = torch.empty(0, N, device=x.device, dtype=odt)
    else:
        y = _launch(LINEAR.tuned(x, M, N, K, dtype, out_name), x2, w.contiguous(), odt)
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], N)


def matmul(a, b, out_dtype=None):
    """a @ b for a [..., K] and a 2-D b [K, N] (bf16 / fp16), in `out_dtype` (default a's),
    by a tile kernel tiled.autotune picks per token-count bucket. A batched b is refused."""
    import torch

    if b.dim() != 2 or a.dim() < 1 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"tiled.ops.matmul: a {tuple(a.shape)} and b {tuple(b.shape)} do not "
                         "multiply as a @ b with a 2-D b")
    a2, dtype, odt, out_name = _operands("matmul", a, b, out_dtype)
    (M, K), N = a2.shape, b.shape[1]
    tuned = MATMUL.tuned(a, M, N, K, dtype, out_name)
    y = torch.empty(M, N, device=a.device, dtype=odt)
    if M:
        tuned.compiled(a2, b.contiguous(), y)
    return y.view(*a.shape[:-1], N)
