"""tiled.ops.grouped_linear (this module, tiled.ops.grouped): the GEMM of a mixture of experts,
every expert in one launch. x [T, K] holds the tokens sorted by expert, w [E, N, K] the experts'
weights in F.linear's layout, and expert_offsets [E + 1] the cumulative row counts: rows
offsets[e]:offsets[e + 1] of x go through w[e], y[r] = x[r] @ w[e].T.

The kernel covers y with BM x BN tiles, a grid of (N tiles, M tiles). The M tiles come from a
tile table [tiles, 3] int32, row i = (expert, first row, rows) of M tile i, built on the device
by torch ops from the offsets (`tile_table`), so no launch waits for the host to read them:
each expert's rows are cut into ceildiv(count, BM) tiles, which needs at most
(T + E * (BM - 1)) // BM tiles whatever the routing; the table has that many rows, the unused
ones (0, 0, 0). A tile loads BM rows from its first row on (rows past T read as zero) and
stores only its own `rows`; an unused tile runs its K loop zero times and stores nothing.

An expert of BM rows or more has no partial tile: its last tile ends at the expert's end,
overlapping the tile before it, so that every one of its tiles stores whole with the
accumulator's vectorized store rather than per-element stores (on the H200 skewed routings
ran 5-19% faster so than with a partial last tile; benchmarks/gpu/grouped.py). The rows two
tiles share are computed twice from the same data by the same instructions and written twice
(bitwise equal from both tiles in that benchmark's smoke run). Only an expert of fewer than
BM rows has a partial tile, whose loads run into the next experts' rows (never stored).

T is symbolic (one compile serves every batch), E, N and K are not. On sm_90a the tiles take
the warp-specialized GEMM path (TMA loads, wgmma, a persistent grid walked in groups of 8 M
tiles for L2 reuse).

Tuned by tiled.autotune per (bucket of T, E, N, K, dtype), timed on a balanced routing with
the table's construction included (`_run`).
"""

import itertools

import tiled
import tiled.lang as T
from tiled.ops.tuned import TunedOp, pow2_bucket

BK = 64
MAX_BUCKET = 32768  # token counts past it share one tuning

# Compiled with the guard pass (tiled.compiler.passes.guards), which proves the Tiles[by, ...]
# loads in bounds (a block var stays below its grid dim, `tiles`) and leaves them alone: a
# guarded load there would put `tiles` into the copies' offsets and keep the kernel off the
# sm_90a warp-specialized path. The H200 numbers of benchmarks/results/grouped_h200.json were
# measured before, compiled without the pass (`safe_access=False`).
COMPILE_OPTIONS: dict = {}

# Tile shapes of the sm_90a GEMM path; on the H200 (benchmarks/gpu/grouped.py) 64 x 128 and
# 64 x 256 won at 256 routed rows and at 8192 over 64 experts, 128 x 256 and 128 x 128 at 8192
# and more rows over 8 experts and at 32768 over 64; a 64 x 64 tile never won and is left out.
CUDA_SPACE = [
    {"BM": 128, "BN": 256, "threads": 256},
    {"BM": 128, "BN": 128, "threads": 256},
    {"BM": 64, "BN": 256, "threads": 128},
    {"BM": 64, "BN": 128, "threads": 128},
    # Few rows per expert (decode; 256 routed rows over 8 experts is 32 each): swapped tiles of
    # 16 / 32 / 64 rows against 64 or 128 rows of w, all on the WS path (wgmma n16 .. n64).
    *({"kind": "swap", "BM": bx, "BN": bw, "threads": t, "stages": 8}
      for bx in (16, 32, 64) for bw, t in ((64, 128), (128, 256))),
]
# CPU: the 64 x 128, 128 x 128 and 256 x 128 tiles where experts average as many rows as the
# tile's (`min_rows`): bf16, 8 experts, N = K = 2048 on the 2-core Zen 3, 64 x 128 read 76
# GFLOP/s at 64 rows per expert where 32 x 32 read 48, 256 x 128 114 at 256 rows where 32 x 32
# read 37 (benchmarks/results/cpu_grouped.json); fewer rows keep the small tiles and the swap.
CPU_SPACE = [
    *({"BM": bm, "BN": 128, "threads": 128, "min_rows": bm} for bm in (64, 128, 256)),
    {"BM": 32, "BN": 32, "threads": 128},
    {"BM": 16, "BN": 64, "threads": 128},
    {"kind": "swap", "BM": 16, "BN": 32, "threads": 128},
]


def token_bucket(tokens: int, E: int, N: int, K: int, dtype: str):
    """The token counts (rows of x, all experts together) one tuning serves: powers of two up to
    MAX_BUCKET, then everything past it."""
    return pow2_bucket(tokens, MAX_BUCKET), E, N, K, dtype


def _fits(cfg: dict, tokens: int, E: int) -> bool:
    """Which configs a token count is tuned over, decided by its bucket (a tuning builds its
    candidates at the bucket's count and its winner serves every count of the bucket): swap
    configs for few rows per expert (at most 2 BM on average), tiles for any, a config with
    `min_rows` for experts of that many rows on average."""
    tokens = pow2_bucket(tokens, MAX_BUCKET)
    if tokens < cfg.get("min_rows", 0) * E:
        return False
    return cfg.get("kind", "tile") != "swap" or tokens <= 2 * cfg["BM"] * E


def grouped_kernel(tokens, E, N, K, dtype, BM=128, BN=128, threads=256, stages=4,
                   kind="tile", min_rows=0):
    """The kernel of one config (`tokens` only selects the tuning: the kernel's T is symbolic).
    Arguments: X [T, K], W [E * N, K] (w viewed flat), Tiles [tiles, 3] int32, Y [T, N].
    kind "swap" computes y^T = w[e] @ x^T per tile: BN rows of w[e] fill the MMA's M side,
    the tile's BM rows of x its N side (16 .. 64: wgmma's n16 / n32 / n64), for experts of
    few rows, where a tile of 64 or more rows would mostly multiply padding."""
    if not _fits({"kind": kind, "BM": BM, "min_rows": min_rows}, tokens, E):
        raise ValueError(f"config {kind} {BM}x{BN} is not for {tokens} rows over {E} experts")
    Td, tiles = T.dyn("tokens"), T.dyn("tiles")
    steps = -(-K // BK)
    if kind == "swap":
        return _grouped_swap(Td, tiles, E, N, K, dtype, BM, BN, threads, stages, steps)

    @tiled.kernel
    def grouped_tile(X: T.Tensor((Td, K), dtype), W: T.Tensor((E * N, K), dtype),
                     Tiles: T.Tensor((tiles, 3), "int32"), Y: T.Tensor((Td, N), dtype)):
        with T.Kernel(T.ceildiv(N, BN), tiles, threads=threads) as (bx, by):
            expert, first, rows = Tiles[by, 0], Tiles[by, 1], Tiles[by, 2]
            xs = T.alloc_shared((BM, BK), dtype)
            ws = T.alloc_shared((BN, BK), dtype)
            acc = T.alloc_fragment((BM, BN), "float32")
            T.clear(acc)
            # An unused tile leaves by its loop's extent, not by an `if` around the loop: the
            # sm_90a warp-specialized path takes only a loop at the kernel's top level.
            for k in T.Pipelined(T.if_then_else(rows > 0, steps, 0), num_stages=stages):
                T.copy(X[first, k * BK], xs)
                # A W tile past N holds the next expert's rows: its columns lie past Y's N,
                # where the stores below are dropped.
                T.copy(W[expert * N + bx * BN, k * BK], ws)
                T.gemm(xs, ws, acc, transpose_B=True)
            # Whatever the table holds, no store leaves Y: the element stores test its bounds
            # (and the guard pass adds their lower end), T.copy guards its region's ends.
            if rows == BM and first >= 0:
                T.copy(acc, Y[first, bx * BN])
            else:  # an expert of fewer than BM rows: its rows only, the next are not ours
                for i, j in T.Parallel(BM, BN):
                    if i < rows and 0 <= first + i < Td and (N % BN == 0 or bx * BN + j < N):
                        Y[first + i, bx * BN + j] = acc[i, j]

    return grouped_tile


def _grouped_swap(Td, tiles, E, N, K, dtype, BX, BW, threads, stages, steps):
    @tiled.kernel
    def grouped_swap(X: T.Tensor((Td, K), dtype), W: T.Tensor((E * N, K), dtype),
                     Tiles: T.Tensor((tiles, 3), "int32"), Y: T.Tensor((Td, N), dtype)):
        with T.Kernel(T.ceildiv(N, BW), tiles, threads=threads) as (bx, by):
            expert, first, rows = Tiles[by, 0], Tiles[by, 1], Tiles[by, 2]
            ws = T.alloc_shared((BW, BK), dtype)
            xs = T.alloc_shared((BX, BK), dtype)
            acc = T.alloc_fragment((BW, BX), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.if_then_else(rows > 0, steps, 0), num_stages=stages):
                T.copy(W[expert * N + bx * BW, k * BK], ws)  # past N: dropped below
                T.copy(X[first, k * BK], xs)
                T.gemm(ws, xs, acc, transpose_B=True)
            for i, j in T.Parallel(BW, BX):  # the tile's own rows, transposed back
                if j < rows and 0 <= first + j < Td and (N % BW == 0 or bx * BW + i < N):
                    Y[first + j, bx * BW + i] = acc[i, j]

    return grouped_swap


def table_rows(tokens: int, experts: int, BM: int) -> int:
    """The tile table's length: the most M tiles any routing of `tokens` rows over `experts`
    needs, sum(ceildiv(count_e, BM)) <= (tokens + experts * (BM - 1)) // BM."""
    return (tokens + experts * (BM - 1)) // BM


def tile_table(offsets, tokens: int, BM: int):
    """The [table_rows, 3] int32 tile table (module docstring) of `offsets` [E + 1] on its own
    device, by torch ops that never wait for the device (nothing is read back)."""
    import torch

    off = offsets.to(torch.int64)
    E = off.numel() - 1
    counts = off[1:] - off[:-1]
    per_expert = (counts + BM - 1).div(BM, rounding_mode="floor")
    ends = torch.cumsum(per_expert, 0)  # one past each expert's last tile
    i = torch.arange(table_rows(tokens, E, BM), device=off.device)
    e = torch.searchsorted(ends, i, right=True)  # E for the unused tiles
    used = e < E
    e = e.clamp(max=E - 1)
    first = off[e] + (i - (ends[e] - per_expert[e])) * BM
    # An expert's last tile ends at its end when the expert has BM rows or more: whole, it
    # overlaps the tile before it (module docstring).
    first = torch.minimum(first, torch.maximum(off[e + 1] - BM, off[e]))
    rows = (off[e + 1] - first).clamp(0, BM)
    table = torch.stack([e, first, rows], 1) * used[:, None]
    return table.to(torch.int32)


def _inputs(tokens, E, N, K, dtype, **config):
    """x, w, a balanced routing's offsets, y: what a candidate is checked and timed on."""
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt = _torch_dtype(torch, dtype)
    x = torch.randn(tokens, K, device=dev, generator=g).to(dt)
    w = (torch.randn(E * N, K, device=dev, generator=g) / K ** 0.5).to(dt)
    offsets = (torch.arange(E + 1, device=dev) * tokens).div(E, rounding_mode="floor")
    return [x, w, offsets, torch.zeros(tokens, N, device=dev, dtype=dt)]


def _run(kernel, config, args):
    """A candidate as grouped_linear runs it: the tile table built, then the kernel."""
    x, w, offsets, y = args
    kernel(x, w, tile_table(offsets, x.shape[0], config["BM"]), y)


def _check(x, w, offsets) -> str:
    """The dtype name of a valid call's x; raises ValueError / TypeError naming the problem."""
    from tiled.ops import _dtype

    op = "tiled.ops.grouped_linear"
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2]:
        raise ValueError(f"{op}: x {tuple(x.shape)} and w {tuple(w.shape)} are not x [T, K] and "
                         "w [E, N, K] with one K")
    if w.shape[0] < 1:
        raise ValueError(f"{op}: w {tuple(w.shape)} has no experts")
    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"{op}: x is {x.dtype} on {x.device}, w {w.dtype} on {w.device}")
    dtype = _dtype(x, "grouped_linear")
    if dtype == "float32":
        raise TypeError(f"{op}: float32 inputs are not supported (bf16 or fp16)")
    if offsets.dim() != 1 or offsets.shape[0] != w.shape[0] + 1:
        raise ValueError(f"{op}: expert_offsets has shape {tuple(offsets.shape)}, expected "
                         f"({w.shape[0] + 1},): E + 1 cumulative row counts for w's "
                         f"{w.shape[0]} experts")
    if str(offsets.dtype) not in ("torch.int32", "torch.int64"):
        raise TypeError(f"{op}: expert_offsets is {offsets.dtype}, expected int32 or int64")
    if offsets.device != x.device and offsets.device.type != "cpu":
        raise ValueError(f"{op}: expert_offsets is on {offsets.device}, x on {x.device}")
    if w.numel() > (1 << 31) - 1:
        raise ValueError(f"{op}: w {tuple(w.shape)} has {w.numel()} elements; kernels index "
                         "tensors with 32-bit integers (at most 2**31 - 1 elements): split the "
                         "experts over several calls")
    if offsets.device.type == "cpu":  # on the host the values cost nothing to check
        o = offsets.tolist()
        if o[0] != 0 or o[-1] != x.shape[0] or any(a > b for a, b in itertools.pairwise(o)):
            raise ValueError(f"{op}: expert_offsets {o} must rise from 0 to T = {x.shape[0]}")
    return dtype


GROUPED = TunedOp("grouped_linear", grouped_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                  key=["tokens", "E", "N", "K", "dtype"], bucket=token_bucket, inputs=_inputs,
                  run=_run, **COMPILE_OPTIONS)


def grouped_linear(x, w, expert_offsets):
    """y [T, N] in x's dtype, y[r] = x[r] @ w[e].T for the rows offsets[e] <= r < offsets[e + 1]
    (module docstring). x [T, K] and w [E, N, K] are bf16 or fp16; expert_offsets [E + 1] is
    int32 or int64, on x's device or the CPU. Raises ValueError / TypeError for shapes, dtypes
    or devices that do not fit; offsets on the CPU are checked too, on the GPU they are not (a
    check would wait for the device): bad ones there give wrong rows, never an access outside
    the tensors. The kernel is chosen by tiled.autotune per bucket of T, then kept; inside a
    CUDA graph capture a bucket not tuned yet raises RuntimeError."""
    import torch

    dtype = _check(x, w, expert_offsets)
    tokens, K = x.shape
    E, N = w.shape[:2]
    y = torch.empty(tokens, N, device=x.device, dtype=x.dtype)
    if tokens == 0:
        return y
    tuned = GROUPED.tuned(x, tokens, E, N, K, dtype)
    table = tile_table(expert_offsets.to(x.device), tokens, tuned.config["BM"])
    tuned.compiled(x.contiguous(), w.contiguous().view(E * N, K), table, y)
    return y
