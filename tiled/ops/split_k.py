"""Split-K for tiled.ops' GEMMs (this module, tiled.ops.split_k): the K loop of one output tile
split over a third grid axis, split s writing its float32 partial into P[s] of a [splits, M,
N] workspace, and two ways of adding the partials up into y (`run_split` runs a config by
its `sum`):

- `sum="kernel"` (`run_split_k`): one `splitk_sum` kernel (tiled.ops.kernels) reads P and
  writes y, launched programmatically (the GEMM runs T.pdl_trigger after its main loop, the
  sum starts with T.pdl_sync): two launches, no atomics, no zeroing;
- `sum="last"` (`add_up_last`, `run_last_sum`): after writing its partial each block adds 1
  to its tile's counter C[tile] (acq_rel, returning the count before), and the block that
  brings the count to `splits` reads the tile's partials back from P (L2), writes y and
  sets the counter back to 0. One launch: the sum of each tile starts when its last split
  ends, while other tiles still compute, where a `splitk_sum` costs 1.6-2.1 us more at
  4096 x 4096 and 16-64 tokens on the H200 (benchmarks/results/splitk_probe_h200.json).

The counters are zero between launches: every launch brings each count it touches back to 0,
so a buffer is zeroed once, when it is made (`counters`), and then serves every launch that
cannot run beside another one using it. Eager launches take a buffer kept per device and
stream: launches on one stream run one after another, and a launch that failed leaves its
context unusable (CUDA errors are sticky), so no later launch sees a count it left. Launches
captured into a CUDA graph take a buffer per capture and capturing stream (the driver's
capture id: two graphs may replay side by side, one graph's launches on one stream never),
a slice of a pool zeroed outside any capture by the device's eager launches, so the graph
holds no memset; a pool half used is renewed by the next eager launch, and kept, as every
slice a graph holds must be (a few hundred ints a capture). Captured with no pool room (or
no pool yet), the counters are made and zeroed inside the capture: right, but the graph
replays the zeroing.
"""

import tiled.lang as T

_COUNTERS: dict = {}  # (device, stream) -> int32 counters, zero between launches
_CAPTURED: dict = {}  # (device, stream) -> (capture id, counters) of its latest capture
_POOLS: dict = {}  # device -> [zeroed int32 pool for captured launches, next free index]
_KEPT: list = []  # renewed pools and in-capture counters: graphs may replay them any time
POOL_INTS = 1 << 20  # a device's pool for captured launches: 4 MiB, renewed when half used


@T.macro
def add_up_last(P, C, Y, tile, r0, c0, rows: int, cols: int, splits: int, dtype: str):
    """The block's part of `sum="last"` once its partial is in P[split]: count it into C[tile],
    and if it is the tile's last, write Y[r0:r0 + rows, c0:c0 + cols] as the sum of the tile's
    partials in `dtype` (rows and columns past Y's: the guards drop them) and zero the count."""
    done = T.atomic_add(C[tile], 1, memory_order="acq_rel", return_prev=True)
    if done == splits - 1:
        # all of a thread's loads first (rows past Y's read its last, so they need no
        # guard and can all be in flight at once), then the tile's guarded stores
        total = T.alloc_fragment((rows, cols), "float32")
        last_row = Y.shape[0] - 1
        for i, j in T.Parallel(rows, cols):
            r = T.min(r0 + i, last_row)
            total[i, j] = P[0, r, c0 + j]
            for s in range(1, splits):
                total[i, j] += P[s, r, c0 + j]
        T.copy(total, Y[r0, c0])
        C[tile] = 0


def counters(device, tiles: int):
    """Zeroed int32 counters for `tiles` output tiles on `device` (module docstring): the
    current stream's buffer, or while a CUDA graph is captured the capture's own."""
    import torch

    if device.type != "cuda":
        key = (str(device), None)
    else:
        key = (str(device), torch.cuda.current_stream(device).cuda_stream)
        if torch.cuda.is_current_stream_capturing():
            capture = _capture_id(key[1])
            have = _CAPTURED.get(key)
            if have is None or have[0] != capture or have[1].numel() < tiles:
                have = _CAPTURED[key] = (capture, _from_pool(device, -(-tiles // 256) * 256))
            return have[1]
        pool = _POOLS.get(str(device))
        if pool is None or pool[1] > pool[0].numel() // 2:
            if pool is not None:
                _KEPT.append(pool[0])
            _POOLS[str(device)] = [torch.zeros(POOL_INTS, device=device, dtype=torch.int32), 0]
    have = _COUNTERS.get(key)
    if have is None or have.numel() < tiles:
        have = _COUNTERS[key] = torch.zeros(max(tiles, 1024), device=device, dtype=torch.int32)
    return have


def _capture_id(stream: int) -> int:
    """The driver's id of the capture under way on `stream`."""
    from tiled.runtime.cuda import driver

    d = driver()
    return int(d.call("cuStreamGetCaptureInfo", d.cu.CUstream(stream))[1])


def _from_pool(device, size: int):
    """`size` zeroed counters from the device's pool, or made (and zeroed) in the capture."""
    import torch

    pool = _POOLS.get(str(device))
    if pool is None or pool[1] + size > pool[0].numel():
        made = torch.zeros(size, device=device, dtype=torch.int32)  # the graph zeroes it
        _KEPT.append(made)
        return made
    start, pool[1] = pool[1], pool[1] + size
    return pool[0][start:start + size]


def run_split(y, config: dict, launch):
    """y [M, N] by `launch(*outputs)` of a kernel of `config` (its `splits`, `sum`, BM x BN
    output tiles): launch(y) without splits; with them launch(P) of float32 [splits, M, N]
    partials then `splitk_sum` (sum="kernel"), or launch(y, P, C) with the counters C of the
    tiles (sum="last")."""
    splits = config.get("splits", 1)
    if splits > 1 and config.get("sum") == "last":
        return run_last_sum(y, splits, config["BM"], config["BN"], launch)
    return run_split_k(y, splits, launch)


def run_split_k(y, splits: int, launch):
    """y [M, N] by `launch(out)`: out is y itself, or with `splits` > 1 a float32 [splits, M,
    N] workspace of split-K partials that tiled.ops' `splitk_sum` kernel adds up into y
    (sum_params)."""
    import torch

    import tiled.ops as ops

    if splits == 1:
        launch(y)
        return y
    M, N = y.shape
    partials = torch.empty(splits, M, N, device=y.device, dtype=torch.float32)
    launch(partials)
    ops._kernel("splitk_sum", y, **sum_params(N, splits, str(y.dtype).removeprefix("torch.")))(
        partials, y)
    return y


def run_last_sum(y, splits: int, BM: int, BN: int, launch):
    """y [M, N] by `launch(y, P, C)` of a `sum="last"` kernel of BM x BN output tiles: P its
    float32 [splits, M, N] partials, C the tiles' counters."""
    import torch

    M, N = y.shape
    partials = torch.empty(splits, M, N, device=y.device, dtype=torch.float32)
    launch(y, partials, counters(y.device, -(-M // BM) * -(-N // BN)))
    return y


def sum_params(N: int, splits: int, dtype: str) -> dict:
    """The `splitk_sum` kernel's parameters run_split_k asks tiled.ops for (what a bundle
    built elsewhere installs): launched programmatically after the GEMM."""
    return {"N": N, "splits": splits, "dtype": dtype, "pdl": True}
