"""tiled.ops.linear's stream-K form (this module, tiled.ops.gemm_streamk): y = x @ w.T by `units`
persistent blocks that share the work of the tiles a whole number of waves leaves over.

With T = ceil(M / BM) * ceil(N / BN) output tiles of I = ceil(K / 64) K steps each and U units,
T mod U tiles (`sk` of them: fewer than U) would fill a partial last wave. The first sk tiles
of the tile order (groups of GROUP tile rows, down a group's rows first, so that the units
of a wave share the w columns they read) are shared: their sk * I (tile, K step) iterations
are split into U contiguous runs of equal length (the first few one step longer), one per
unit, each crossing at most two tiles; then every unit takes whole tiles of the (T - sk) / U
full waves, as TileLang's gemm_streamk example orders them.

A unit's run that covers only part of a tile adds its float32 partial tile into the
workspace P[tile] and then adds its step count into the tile's counter C[tile] (acq_rel);
the unit whose steps complete the count (`done + steps == I`) reads the sum back and writes
that tile of y. Whole tiles go straight to y. P and C are zeroed per call for the sk tiles
(`run_stream_k`): sk * BM * BN floats, 6.8 MB for 52 tiles of 128 x 256, and no second
kernel. The count of units is a config value (132: the H100 / H200 SXM's SMs); another SM
count only balances the runs less evenly, every unit still finishes without waiting on
another.
"""

import tiled
import tiled.lang as T

BK = 64
GROUP = 8  # tile rows per group of the tile order


def stream_k_kernel(Md, N, K, dtype, out_dtype, BM, BN, threads, units, stages=4):
    """The stream-K kernel of a linear config (module docstring): X [Md, K], Wt [N, K],
    Y [Md, N], workspace P [units, BM, BN] float32 and counters C [units] int32."""
    tiles_n = -(-N // BN)
    k_steps = -(-K // BK)
    runs = 2  # a run of at most k_steps steps crosses at most two tiles (sk < units)

    @tiled.kernel
    def linear_streamk(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype),
                       Y: T.Tensor((Md, N), out_dtype),
                       P: T.Tensor((units, BM, BN), "float32"),
                       C: T.Tensor((units,), "int32")):
        with T.Kernel(units, threads=threads) as pid:
            tiles = T.ceildiv(Md, BM) * tiles_n
            sk = tiles % units  # the tiles of the partial last wave
            waves = (tiles - sk) // units
            per_unit = sk * k_steps // units
            extra = sk * k_steps % units  # units that take one step more
            xs = T.alloc_shared((BM, BK), dtype)
            ws = T.alloc_shared((BN, BK), dtype)
            acc = T.alloc_fragment((BM, BN), "float32")
            start = T.alloc_var("int32")
            tile = T.alloc_var("int32")
            kb = T.alloc_var("int32")
            ke = T.alloc_var("int32")
            start = pid * per_unit + T.min(pid, extra)
            last = (pid + 1) * per_unit + T.min(pid + 1, extra)
            for s in T.serial(runs + waves):
                if s < runs:  # this unit's run, one tile's part at a time
                    tile = start // k_steps
                    kb = start % k_steps
                    ke = T.min(kb + last - start, k_steps)
                    start = start + ke - kb
                else:  # a whole tile of the full waves
                    tile = sk + (s - runs) * units + pid
                    kb = 0
                    ke = k_steps
                if kb < ke:
                    # tiles in groups of GROUP rows, down a group's rows first: the units
                    # of a wave share the w columns they read (L2), as grid_walk orders
                    # the tile kernels' blocks
                    first = tile // (GROUP * tiles_n) * GROUP
                    rows = T.min(T.ceildiv(Md, BM) - first, GROUP)
                    ty = first + tile % (GROUP * tiles_n) % rows
                    tx = tile % (GROUP * tiles_n) // rows
                    T.clear(acc)
                    for k in T.Pipelined(ke - kb, num_stages=stages):
                        T.copy(X[ty * BM, (kb + k) * BK], xs)
                        T.copy(Wt[tx * BN, (kb + k) * BK], ws)
                        T.gemm(xs, ws, acc, transpose_B=True)
                    if kb == 0 and ke == k_steps:
                        T.copy(acc, Y[ty * BM, tx * BN])
                    else:  # a part: into the tile's sum, then its count
                        for i, j in T.Parallel(BM, BN):
                            T.atomic_add(P[tile, i, j], acc[i, j])
                        done = T.atomic_add(C[tile], ke - kb, memory_order="acq_rel",
                                            return_prev=True)
                        if done + ke - kb == k_steps:  # the tile's last part: write it
                            for i, j in T.Parallel(BM, BN):  # rows past M: guards drop them
                                Y[ty * BM + i, tx * BN + j] = P[tile, i, j]
    return linear_streamk


def partial_tiles(M: int, N: int, BM: int, BN: int, units: int) -> int:
    """How many tiles the stream-K runs share (the kernel's `sk`) at M tokens."""
    return (-(-M // BM) * -(-N // BN)) % units


def run_stream_k(kernel, config: dict, x, w, y):
    """y = x @ w.T by stream-K `kernel` of `config`: its workspace and counters, zeroed for
    the tiles the runs share."""
    import torch

    BM, BN, units = config["BM"], config["BN"], config["units"]
    sk = partial_tiles(x.shape[0], w.shape[0], BM, BN, units)
    P = torch.empty(units, BM, BN, device=y.device, dtype=torch.float32)
    P[:sk].zero_()
    C = torch.zeros(units, device=y.device, dtype=torch.int32)
    kernel(x, w, y, P, C)
    return y
