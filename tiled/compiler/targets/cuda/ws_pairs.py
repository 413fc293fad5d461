"""Two K tiles per ring stage in a TMA-fed T.Pipelined loop (ws_loop.py), and the GEMM main
loop's schedule over such pairs.

TileLang's GEMMs often take 32-wide K tiles of 16-bit data: rows of 64 bytes, half of a
128-byte swizzle row. One ring stage per iteration then moves 64-byte rows, waits on and
releases its barriers once per 32 elements of K, and retires its wgmma group every 4
instructions (128 x 128 tiles). `merged_axes` decides when iterations 2j and 2j + 1 may
share one stage instead: the stage holds the two tiles side by side along K (a K-major pair
as one panel of 128-byte rows, iteration 2j + 1's at byte 64 of each row, where wgmma's
descriptors start it; an MN-major pair, B given K x N, as panels of 2 x 32 K rows), filled
by the same number of TMA boxes, waited for at even iterations and released after odd ones.
Every access of the tile goes through gemm_sm90.panel_index, which adds the iteration's half
(`low.panel_shift`), so copies and element reads see the logical tile as before.

A loop whose body is nothing but its ring copies and that one gemm, A and B from shared
memory (the GEMM main loop, `pair_gemm`), runs a pair of iterations as one gemm over the
stage's whole 64-wide K (`lower_pair_loop`): one wait, one wgmma fence and one group of
twice the instructions per stage, the group before retired (`retire<1>`) and its stage
released; an odd count's last iteration runs alone on the first half of its stage. Issued
one iteration at a time, each group opened with its own fence, the same loop kept the
tensor cores 65% busy on the H200 against 87% for one group per 64-wide K (ncu; 0.75x
against 0.90x cuBLAS; benchmarks/results/merged_ring_h200.json). Other bodies keep the
general plan of wgmma_waits.py over merged stages, one iteration at a time.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.pipeline import offset_steps
from tiled.compiler.targets.cuda.gemm_sm90 import NARROW_BYTES
from tiled.compiler.targets.cuda.wgmma_waits import hold, wgmma_gemm
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


def merged_axes(p: pb.Program, buffers, w, gemms: list) -> dict[int, int]:
    """{ring tile: its K axis (0 rows, 1 columns)} when iterations 2j and 2j + 1 of the
    ring loop `w` (ws_plan.WsLoop) share a stage, else {}: the loop's one wgmma gemm has
    16-bit operands and A's K tile is 64 bytes, every ring copy fills one of its operands
    and its shared operands are all ring copies, and each copy's K offset moves by exactly
    the tile's K extent per iteration while its other offsets stay (offset_steps: proved,
    not sampled). With an odd trip count the last stage's second half reads past the last
    tile: data no gemm reads (zeros past the tensor's end)."""
    if len(gemms) != 1 or not w.copies or w.gathers:
        return {}
    g = gemms[0].gemm
    a = buffers[g.a]
    operands = {x for x in (g.a, g.b) if buffers[x].scope == pb.SHARED}
    if operands != w.tiles or a.shape[-1].size * dtypes.nbytes(a.dtype) != NARROW_BYTES or \
            dtypes.nbytes(buffers[g.b].dtype) != 2:
        return {}
    axes = {}
    for rc in w.copies:
        tile = buffers[rc.tile]
        axis = 1 if rc.tile == g.a or g.transpose_b else 0
        if len(tile.shape) != 2:
            return {}
        steps = offset_steps(p, w.loop, rc.copy)
        k_dim = len(steps) - 1 if axis == 1 else rc.row_dim
        if any(s != (tile.shape[axis].size if d == k_dim else 0) for d, s in enumerate(steps)):
            return {}
        axes[rc.tile] = axis
    return axes


def pair_gemm(low, body: list, ring: dict, peeled: set[int]) -> int | None:
    """The body position of the merged loop's gemm when the body is its ring copies and
    that one wgmma gemm, A and B from shared memory (module docstring), else None."""
    w = low.wsloop
    rest = [i for i in range(len(body)) if i not in ring]
    if w.merge != 2 or not w.in_flight or peeled or len(rest) != 1:
        return None
    g = wgmma_gemm(body[rest[0]], low.wgmma_ops.accumulators)
    if g is None or g.clear_accum or low.buffers[g.a].scope != pb.SHARED:
        return None
    return rest[0]


def _call(fn: str, *args) -> None:
    T.evaluate(T.call_extern("void", f"tiled::sm90::{fn}", *args))


def lower_pair_loop(low, f: pb.For, st: pb.Stmt, base, n, enter, wait_full, release,
                    issued=None) -> None:
    """The consumers' GEMM main loop over merged stages (module docstring), then the groups
    still in flight retired. `base`: the ring's stage count before the loop; `enter(k)` points
    the ring tiles at iteration k and returns (stage, phase); `wait_full(j, stage, phase)`
    and `release(j, at)` wait for copy j's stage and free it at ring count `at`; `issued()`,
    if given, runs once the last group is issued, before the wait for it."""
    w = low.wsloop
    copies = range(len(w.copies))
    pairs = tirx.floordiv(n, 2)

    def issue(k, k_tiles: int) -> None:  # iteration k's stage: one wait, one wgmma group
        low.vars[f.var] = k
        stage, phase = enter(k)
        for j in copies:
            wait_full(j, stage, phase)
        low.in_flight, low.k_tiles = True, k_tiles
        low.stmt(st)
        low.in_flight, low.k_tiles = False, 1

    with T.serial(0, pairs) as p:
        issue(2 * p, 2)  # iterations 2p and 2p + 1: the stage's whole 64-wide K
        _call("retire<1>")  # the pairs before p done
        with T.If(p >= 1), T.Then():
            for j in copies:
                release(j, base + p - 1)
    with T.If(tirx.floormod(n, 2) == 1), T.Then():
        issue(n - 1, 1)  # an odd count's last iteration: the first half of its stage
    if issued is not None:
        issued()
    _call("retire<0>")
    hold(low, st.gemm)
    if not w.reused:
        return  # the producer has issued its last stage; nothing waits for these
    with T.If(pairs > 0), T.Then():  # the last pair's stage, and an odd count's last one
        for j in copies:
            release(j, base + pairs - 1)
    with T.If(tirx.floormod(n, 2) == 1), T.Then():
        for j in copies:
            release(j, base + pairs)
