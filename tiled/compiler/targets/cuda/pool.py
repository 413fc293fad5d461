"""The shared pool of a CUDA-style lowering (CudaLowering and the ROCm / Metal lowerings built
on it): which T.Pipelined loops become cp.async pipelines and with how many stages, where each
shared tile lies in the one dynamic pool (pipelined tiles `num_stages` times; gemm operand tiles
padded against bank conflicts; TMA destinations and wgmma panels aligned), the sm_90a paths'
rings and mbarriers after them, and one scratch area that the ops moving fragments through
shared memory share (one op at a time). On sm_90a, a T.Pipelined ring (ws_loop.py) whose two
stages do not fit is dropped for the cp.async pipeline, and one that fits grows its stages
while the pool stays within the arch's limit. Where the tiles end to end do not fit, those
whose lifetimes do not meet share bytes (passes/resources.overlay; may_overlay says where).
"""

from __future__ import annotations

import math

from tiled.compiler.passes.resources import (
    POOL_ALIGN,
    SharedTile,
    Slot,
    align_up,
    end_to_end,
    lifetimes,
    overlay,
)
from tiled.compiler.passes.stmts import body_statements
from tiled.compiler.targets.cuda import ws_plan
from tiled.compiler.targets.cuda.copy import copy_uses_scratch
from tiled.compiler.targets.cuda.gather import find_gather
from tiled.compiler.targets.cuda.gemm import converted, staged_operands
from tiled.compiler.targets.cuda.gemm_sm90 import PANEL_ALIGN
from tiled.compiler.targets.cuda.reduce import reduce_scratch_bytes
from tiled.compiler.targets.cuda.scan import scan_scratch_bytes, scan_uses_scratch
from tiled.compiler.targets.cuda.ws_plan import grow_stages
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

RING_ALIGN = 128  # bytes: a TMA destination's alignment


def _pipelined_by_hand(low, f: pb.For) -> bool:
    """T.Pipelined loop `f` is software-pipelined here (cp.async stages), not by one of the
    sm_90a paths' producers."""
    return f.kind == pb.PIPELINED and f.num_stages >= 2 \
        and not (low.attn and f.var == low.attn.loop.var) \
        and not (low.wsloop and f.var == low.wsloop.loop.var)


def _pipeline_producers(low, f: pb.For) -> tuple[list[int], dict]:
    """(the shared tiles that the leading copies (or gathers) of pipelined loop `f` fill, the
    gathers among them by their nest's outer var): they run ahead, one stage per buffer copy;
    the first statement of another kind ends them."""
    producers, gathers = [], {}
    for s in body_statements(f.body):
        if s.WhichOneof("kind") == "copy" and low.copy_vector(s.copy):
            producers.append(s.copy.dst.buffer)
        elif (g := find_gather(low, s)) is not None:  # (gather.py)
            producers.append(g.tile)
            gathers[s.for_.var] = g
        else:
            break
    return producers, gathers


def plan_pool(low) -> None:
    """Plans lowering `low`'s pipelines and lays out its pool: sets low.pipelines,
    low.shared, low.scratch_offset and low.pool_bytes (and the sm_90a plans' offsets)."""
    gemm_operands, tma_tiles = set(), set()
    for st in low.statements():
        kind = st.WhichOneof("kind")
        if kind == "gemm" and isinstance(low.layouts.get(st.gemm.c), low.mma_layouts):
            gemm_operands |= {st.gemm.a, st.gemm.b}
        if kind == "copy" and st.copy.HasField("tma"):
            tma_tiles.add(st.copy.dst.buffer)
        if kind == "for_" and _pipelined_by_hand(low, st.for_):
            producers, gathers = _pipeline_producers(low, st.for_)
            low.gathers.update(gathers)
            if producers:
                low.pipelines[st.for_.var] = (min(st.for_.num_stages, low.max_stages),
                                              producers)
    stages = {}
    for s_count, producers in low.pipelines.values():
        for bid in producers:
            stages[bid] = max(stages.get(bid, 1), s_count)
    if low.wsloop is not None:  # walking the grid, the next block's head tiles beside
        low.wsloop.head_slots = ws_plan.HEAD_SLOTS if low.wsloop.persistent and low.wsloop.heads \
            else 1
    low.lifetimes, low.overlaid = lifetimes(low.program), False
    place_tiles(low, stages, gemm_operands, tma_tiles)
    if low.wsloop is not None and low.wsloop.head_slots > 1 and \
            low.pool_bytes > low.smem_limit:  # one slot each, then
        low.wsloop.head_slots = 1
        place_tiles(low, stages, gemm_operands, tma_tiles)
    if low.pool_bytes > low.smem_limit and may_overlay(low):
        if low.wsloop is not None and low.wsloop.persistent:  # one block per program block
            low.wsloop.persistent, low.wsloop.head_slots = False, 1
        low.overlaid = True
        place_tiles(low, stages, gemm_operands, tma_tiles, overlaid=True)
    if low.wsloop is not None and low.pool_bytes > low.smem_limit:
        # Two ring stages do not fit where the program's own stages did: no producer.
        low.wsloop, low.launch_threads = None, low.threads
        low.sync = low.block_sync()
        return plan_pool(low)
    while low.wsloop is not None and \
            grow_stages(low.wsloop, low.pool_bytes, low.smem_limit):
        place_tiles(low, stages, gemm_operands, tma_tiles, overlaid=low.overlaid)
        if low.pool_bytes > low.smem_limit:  # tiles sharing bytes packed otherwise: back
            low.wsloop.stages -= 1
            place_tiles(low, stages, gemm_operands, tma_tiles, overlaid=low.overlaid)
            break
    if low.wsloop is not None:
        low.wsloop.fit_blocks(low.pool_bytes)


def may_overlay(low) -> bool:
    """Whether tiles of `low` whose lifetimes do not meet may share bytes (taken only where
    the pool does not fit otherwise): not on the whole-kernel attention path or the explicit
    path (T.ws: the author orders the warps), nor where a producer's ring runs on into a
    loop's next run (it loads while the code after the loop runs). A producer that walks
    the grid (it loads the next block's tiles during this one's epilogue) walks it no more
    where tiles share bytes: plan_pool turns the walk off."""
    return low.overlays and low.attn is None and \
        not (low.wsloop is not None and low.wsloop.run.nested)


def place_tiles(low, stages: dict, gemm_operands: set, tma_tiles: set,
                overlaid: bool = False) -> None:
    """Places the shared tiles (`stages`: pipelined tile -> its stage count), the sm90 paths'
    rings and barriers and the scratch area in the pool; `overlaid`: tiles whose lifetimes
    do not meet may share bytes (resources.overlay; low.reuses then says which)."""
    p = low.program
    ring = low.wsloop.tiles if low.wsloop else set()
    heads = set(low.wsloop.head_index) if low.wsloop else set()  # TMA destinations too
    if low.wsloop is not None:
        stages = {**stages, **{bid: low.wsloop.stages for bid in ring},
                  **{bid: low.wsloop.head_slots for bid in heads}}
    ring_tiles = low.attn.ring_tiles if low.attn else set()
    # Tiles something may write ahead of their first statement: the producer's and the
    # pipelines' stages, TMA destinations.
    early = ring | heads | tma_tiles | {bid for _, producers in low.pipelines.values()
                                        for bid in producers}
    slots, tiles = [], {}
    for b in p.buffers:
        if b.scope != pb.SHARED or b.id in ring_tiles or b.id in low.placed_elsewhere():
            continue
        shape = [d.size for d in b.shape]
        if b.id in ring and b.id in low.wsloop.merged:  # a stage holds two tiles along K
            shape[low.wsloop.merged[b.id]] *= low.wsloop.merge
        cols = shape[-1]
        rows = math.prod(shape[:-1])
        # TMA writes dense rows (no swizzle on the explicit path): its tiles get no pad;
        # panel tiles (wgmma's) are swizzled instead, on the swizzle's period.
        pad = 8 if b.id in gemm_operands and dtypes.nbytes(b.dtype) == 2 and \
            len(shape) >= 2 and b.id not in tma_tiles | ring | heads else 0
        align = POOL_ALIGN
        if b.id in ring | heads:  # a TMA destination (a panel tile is aligned further below)
            align = RING_ALIGN
        if b.id in low.wgmma_ops.panels:
            pad, align = 0, PANEL_ALIGN
        tile = SharedTile(rows, cols, cols + pad, stages.get(b.id, 1), 0,
                          dtypes.canonical_name(b.dtype))
        tiles[b.id] = tile
        slots.append(Slot(b.id, tile.nbytes, align, low.lifetimes.get(b.id, (0, 0)),
                          b.id in early))
    at, low.reuses = overlay(slots) if overlaid else (end_to_end(slots), {})
    offset = 0
    for s in slots:
        tiles[s.bid].offset = at[s.bid]
        low.shared[s.bid] = tiles[s.bid]
        offset = max(offset, align_up(at[s.bid] + s.nbytes))
    if low.attn is not None:
        low.ws_offset, offset = offset, align_up(offset + low.attn.ring_bytes)
    if low.wsloop is not None:
        low.wsloop.bar_offset, offset = offset, align_up(offset + low.wsloop.barrier_bytes)
    low.scratch_offset = offset
    scratch = 0
    for st in low.statements():  # the scratch area: one region, used by one op at a time
        kind = st.WhichOneof("kind")
        need = {"reduce": reduce_scratch_bytes, "copy": low.copy_scratch_bytes,
                "gemm": low.gemm_scratch_bytes, "scan": scan_scratch_bytes}.get(kind)
        if kind == "gemm" and st.gemm.c in low.wgmma_ops.accumulators:
            continue  # wgmma reads its operands where they lie
        if need is not None:
            scratch = max(scratch, need(low, getattr(st, kind)))
    low.pool_bytes = offset + align_up(scratch) if scratch else offset
    # An atomic's previous value, outside T.Parallel, goes from the thread that updated to the
    # others through a slot of its own (atomic.py).
    slot = max((dtypes.nbytes(low.buffers[st.atomic_add.buffer].dtype)
                for st in low.statements()
                if st.WhichOneof("kind") == "atomic_add" and st.atomic_add.has_prev), default=0)
    if slot:
        low.atomic_slot = align_up(low.pool_bytes, slot)
        low.pool_bytes = low.atomic_slot + slot


def uses_scratch(low, st: pb.Stmt) -> bool:
    """Whether tile op `st` reads and writes the shared scratch area (beyond its operands)."""
    kind = st.WhichOneof("kind")
    if kind == "copy":
        return copy_uses_scratch(low, st.copy)
    if kind == "gemm":
        return st.gemm.c not in low.wgmma_ops.accumulators and \
            bool(staged_operands(low, st.gemm) or converted(low, st.gemm))
    if kind == "scan":
        return scan_uses_scratch(low, st.scan)
    if kind == "reduce":
        return reduce_scratch_bytes(low, st.reduce) > 0
    return False
