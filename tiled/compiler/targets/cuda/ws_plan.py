"""The plan of a T.Pipelined loop fed by a TMA producer on sm_90a (ws_loop.py says what the
path is and lowers it): which copies become ring copies and their TMA boxes, the ring's
stages and the blocks per SM, the producer's threads and registers, whether the blocks walk
the grid persistently."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tvm import tirx

from tiled.compiler.passes.pipeline import RunAhead, gathers, run_ahead
from tiled.compiler.passes.stmts import body_statements
from tiled.compiler.targets.cuda.gather import Gather, find_gather
from tiled.compiler.targets.cuda.gemm_sm90 import PANEL_BYTES, panel_row_bytes
from tiled.compiler.targets.cuda.tma import tma_requirements
from tiled.compiler.targets.cuda.wgmma_waits import wgmma_gemm
from tiled.compiler.targets.cuda.ws_pairs import merged_axes
from tiled.ir import dtypes
from tiled.ir.walk import expr_vars, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb

PRODUCER_THREADS = 128  # a producer warpgroup
PRODUCER_REGS = 40  # its registers after setmaxnreg
# A producer that gathers (a ring copy that is a gather nest) computes each of its rows'
# source address (an im2col row's image, pixel and bounds) and keeps them across the steps:
# at 40 registers tiled.ops.conv2d's 128 x 128 tile (8 rows a thread) spilled (20 LDL / STL
# in its SASS); at 96 none does, and two consumer warpgroups keep 200 each.
GATHER_PRODUCER_REGS = 96
# Ring stages a loop gets where shared memory holds them. The seed's 128x128x32, 3-stage
# GEMM (K tiles merged in pairs) on the H200 at 4096^3 fp16, through the whole-kernel GEMM
# path of the time (sm90_gemm.py, since retired: paths.py): 3 ring
# stages 0.76x cuBLAS, 4 stages 0.91x, 6 stages 0.88x (one run, interleaved); through this
# path, 4 stages 0.88x against 0.77-0.81x with 3 (merged_ring_h200_stages.json).
MIN_RING = 4
MAX_BOX = 256  # TMA's boxDim limit, elements per dim
MAX_RANK = 5
MAX_REGS = 240  # consumers' setmaxnreg ceiling here
REGISTER_FILE = 65536
SM_SMEM = 228 * 1024  # shared memory per SM; each resident block reserves 1 KiB of it
PRODUCER_WARP = 32
MIN_BLOCKS = 2  # blocks per SM a one-warpgroup program keeps (its latency hiding)
# Tiles per head copy where blocks walk the grid: with 2 the producer may load the next
# block's Q while this one still reads its own (the whole-kernel attention path's schedule,
# sm90_attn.py), at the cost of a ring stage where shared memory is tight. 2 is lowered and
# tested for its code (test_ws_loop.py) but not yet timed on the H200 (the device was not
# lent when it was written), so the measured 1 stays.
HEAD_SLOTS = 1


@dataclass
class RingCopy:
    """A ring copy: a T.copy the producer issues as TMA boxes, or a gather nest
    (targets/cuda/gather.py) its threads issue as cp.async vectors (`gather`; no box)."""
    pos: int  # position in the loop body
    copy: pb.Copy | None
    release: int  # the body position after which its stage is free
    box: list[int]  # TMA box, innermost dim first
    swizzle: int  # bytes: 128 for a panel tile, 0 for a dense one
    boxes: int  # boxes per stage (panels of a panel tile)
    box_cols: int  # tile columns per box
    nbytes: int  # bytes per stage
    row_dim: int  # the source dim along the tile's rows
    gather: Gather | None = None

    @property
    def tile(self) -> int:
        return self.gather.tile if self.gather is not None else self.copy.dst.buffer


@dataclass
class WsLoop:
    run: RunAhead
    copies: list[RingCopy]
    requires: tuple
    consumer_threads: int
    stages: int = 2
    bar_offset: int = 0
    maps: dict = field(default_factory=dict)  # copy index -> tensor map parameter
    min_blocks: int = 1  # the launch bounds' blocks per SM
    pingpong: bool = False  # the consumer warpgroups take turns issuing their gemms
    rebuilt: bool = False  # one gemm, its accumulator rebuilt every step: turns by default
    in_flight: bool = True  # gemms may stay in flight past their statement (wgmma_waits.py)
    persistent: bool = False  # min(blocks, SMs) blocks walk the program's blocks
    merge: int = 1  # loop iterations per ring stage (2: K tiles paired, ws_pairs.py)
    merged: dict = field(default_factory=dict)  # merged ring tile -> its K axis (0 / 1)
    gemms: int = 0  # wgmma gemms in the loop's body
    heads: list[RingCopy] = field(default_factory=list)  # head copies (pos: in the kernel body)
    head_slots: int = 1  # tiles per head copy: 2 walking the grid, where they fit
    head_maps: dict = field(default_factory=dict)  # head index -> tensor map parameter
    groups: int = 1  # consumer warpgroups taking the walk's blocks in turn (alternate_choice)

    @property
    def producer_threads(self) -> int:
        """A warpgroup beside two or more consumer warpgroups, or where it gathers (one warp
        issuing a whole tile's vectors kept a row's addresses for 32 rows, and spilled);
        else a warp."""
        return PRODUCER_THREADS if self.consumer_threads >= 256 or self.gathers \
            else PRODUCER_WARP

    @property
    def producer_regs(self) -> int:
        return GATHER_PRODUCER_REGS if self.gathers else PRODUCER_REGS

    @property
    def gathers(self) -> bool:
        """Whether a ring copy is a gather: the producer's threads all issue, not one."""
        return any(rc.gather is not None for rc in self.copies)

    @property
    def stage_bytes(self) -> int:
        """Shared memory bytes one more ring stage takes (its tiles and barriers)."""
        return sum(rc.nbytes for rc in self.copies) + 16 * len(self.copies)

    def block_budget(self, pool_bytes: int) -> int:
        """Shared memory bytes the block may take, its pool `pool_bytes` now: a
        one-warpgroup program keeps to half an SM (two blocks per SM) where its ring reaches
        MIN_RING stages there; where it does not and the loop has a wgmma gemm, MIN_RING
        stages at one block per SM are worth more than a second block: 128 x 128 tiles with
        32 KiB a stage (the seed's GEMM, its 32-wide K tiles merged) read 0.88x cuBLAS with 4
        stages at one block per SM against 0.77-0.81x with 3 at two
        (benchmarks/results/merged_ring_h200_stages.json)."""
        whole = SM_SMEM - 1024
        half = SM_SMEM // MIN_BLOCKS - 1024
        if self.consumer_threads >= 256:
            return whole
        if not self.gemms:  # measured on GEMM loops only; others keep two blocks per SM
            return half
        at_min_ring = pool_bytes + max(0, MIN_RING - self.stages) * self.stage_bytes
        return half if at_min_ring <= half or at_min_ring > whole else whole

    def fit_blocks(self, pool_bytes: int) -> None:
        """The launch bounds' blocks per SM for a pool of `pool_bytes`."""
        self.min_blocks = MIN_BLOCKS if self.consumer_threads < 256 and \
            pool_bytes <= SM_SMEM // MIN_BLOCKS - 1024 else 1

    @property
    def loop(self) -> pb.For:
        return self.run.loop

    @property
    def reused(self) -> bool:
        """Whether the ring runs on after the loop: into the next program block's loop
        (persistent) or the loop's next run (a loop inside serial loops, nested)."""
        return self.persistent or self.run.nested

    @property
    def tiles(self) -> set[int]:
        return {rc.tile for rc in self.copies}

    @property
    def head_index(self) -> dict[int, int]:
        """Head copy tile -> its index."""
        return {rc.tile: h for h, rc in enumerate(self.heads)}

    @property
    def barriers(self) -> int:
        return 2 * len(self.copies) * self.stages + 2 * len(self.heads) * self.head_slots

    @property
    def barrier_bytes(self) -> int:
        return 8 * self.barriers

    def full(self, i: int, stage):
        return i * self.stages + stage

    def empty(self, i: int, stage):
        return (len(self.copies) + i) * self.stages + stage

    def head_full(self, h: int, slot=0):
        return 2 * len(self.copies) * self.stages + h * self.head_slots + slot

    def head_empty(self, h: int, slot=0):
        return 2 * len(self.copies) * self.stages + (len(self.heads) + h) * self.head_slots + \
            slot


def _ring_copy(p: pb.Program, buffers, panels: set[int], pos: int, release: int,
               c: pb.Copy) -> tuple[RingCopy, list] | None:
    """The ring copy for copy `c` with its launch preconditions, or None when TMA cannot do
    it (module docstring)."""
    src, dst = buffers[c.src.buffer], buffers[c.dst.buffer]
    ext = list(c.src.extents)
    if len(dst.shape) not in (1, 2) or len(ext) > MAX_RANK or len(ext) < 2 or \
            dtypes.canonical_name(src.dtype) != dtypes.canonical_name(dst.dtype):
        return None
    size = dtypes.nbytes(dst.dtype)
    nonunit = [j for j, e in enumerate(ext) if e != 1]
    if len(dst.shape) == 1:  # one row of the source's last dim (a float8 GEMM's row scales)
        rows, cols = 1, dst.shape[0].size
        if nonunit != [len(ext) - 1] or dst.id in panels:
            return None
    else:
        rows, cols = (d.size for d in dst.shape)
        if rows == 1 or cols == 1 or len(nonunit) != 2 or nonunit[1] != len(ext) - 1 or \
                rows > MAX_BOX:
            return None
    req = tma_requirements(p, src)
    if req is None:
        return None
    if dst.id in panels:  # a box per panel, in the panel's swizzle (gemm_sm90.py)
        swizzle = panel_row_bytes(dst)
        box_cols = swizzle // size
        if cols % box_cols or rows % 8:
            return None
    else:
        box_cols = cols
        if cols > MAX_BOX or (cols * size) % 16 or (rows * cols * size) % 128:
            return None
        swizzle = 0
    box = [box_cols if d == len(ext) - 1 else rows if d == nonunit[0] else 1
           for d in reversed(range(len(ext)))]
    return RingCopy(pos, c, release, box, swizzle, cols // box_cols, box_cols,
                    rows * cols * size, nonunit[0]), req


def _wgmma_loop(low, loop: pb.Stmt) -> bool:
    """Whether T.Pipelined `loop` has gemms and all of them take wgmma: its copies may read a
    tile table and still feed the ring. MLA decode's wgmma forms on the H100 (2026-12-05,
    `mla_paths_h100.json`): 1.03-1.30x faster so, in all 8 rows (latent forms, batch 64 /
    128, 4k / 16k tokens); loops of mma.sync gemms never take the ring (their padded tiles)."""
    gemms = [st.gemm for st in walk(loop) if st.WhichOneof("kind") == "gemm"]
    return bool(gemms) and all(g.c in low.wgmma_ops.accumulators for g in gemms)


def plan_ws_loop(low) -> WsLoop | None:
    """The warp-specialized plan of the kernel's T.Pipelined loop (module docstring), or
    None when it has no ring copy."""
    p = low.program
    if low.threads % 128 or low.threads > 512:
        return None
    run = run_ahead(p, tables_anywhere=lambda loop: low.ring_tables == 2 or
                    (low.ring_tables == 0 and _wgmma_loop(low, loop)))
    if run is None:
        return None
    buffers = low.buffers
    body = body_statements(run.loop.body)
    copies, requires = [], []
    ring = set(run.copies)
    if any(gathers(st, buffers) for i, st in enumerate(body) if i not in ring):
        return None  # the consumers load tiles themselves: more blocks per SM hide that
    mma_operands = {x for st in walk(p.kernel.body) if st.WhichOneof("kind") == "gemm"
                    and st.gemm.c not in low.wgmma_ops.accumulators
                    for x in (st.gemm.a, st.gemm.b)}
    for pos, release in zip(run.copies, run.release, strict=True):
        if pos in run.gathers:
            g = find_gather(low, body[pos])
            if g is None or g.tile in mma_operands:
                return None  # not as cp.async vectors: the consumers gather, as written
            size = g.rows * g.cols * dtypes.nbytes(buffers[g.tile].dtype)
            copies.append(RingCopy(pos, None, release, [], 0, 0, 0, size, 0, gather=g))
            continue
        if body[pos].copy.dst.buffer in mma_operands:
            return None  # mma.sync reads padded rows, which TMA does not write
        found = _ring_copy(p, buffers, low.wgmma_ops.panels, pos, release, body[pos].copy)
        if found is None:
            return None  # the cp.async pipeline runs every copy ahead, not only some
        copies.append(found[0])
        requires += [r for r in found[1] if r not in requires]
    heads = []
    top = body_statements(p.kernel.body)
    for pos, release in zip(run.heads, run.head_release, strict=True):
        c = top[pos].copy
        found = None if c.dst.buffer in mma_operands else \
            _ring_copy(p, buffers, low.wgmma_ops.panels, pos, release, c)
        if found is not None:  # else the consumers copy it themselves, as written
            heads.append(found[0])
            requires += [r for r in found[1] if r not in requires]
    gemms = [st for st in body if wgmma_gemm(st, low.wgmma_ops.accumulators)]
    # Turns may pay where a warpgroup has work besides its gemms in each step for the
    # other's gemm to meet: two gemms (attention's softmax between them: the `pingpong`
    # option, measured no faster), or one that builds its accumulator afresh every step
    # (clear_accum), which the step then reads: a float8 block-scaled GEMM's rescale into
    # its running sum, 3-8% faster with turns on an H100 (fp8_turns_probe_h100.json), so
    # those take turns by default.
    rebuilt = len(gemms) == 1 and gemms[0].gemm.clear_accum
    w = WsLoop(run, copies, tuple(requires), low.threads, stages=max(2, run.loop.num_stages),
               pingpong=low.threads == 256 and (len(gemms) >= 2 or rebuilt), rebuilt=rebuilt,
               gemms=len(gemms), heads=heads)
    axes = merged_axes(p, buffers, w, gemms)
    if axes:
        w.merge, w.merged = 2, axes
        for rc in copies:  # both iterations' tiles in one stage: 128-byte rows
            if axes[rc.tile] == 1:  # K along the rows: one box twice as wide
                rc.box = [2 * rc.box_cols, *rc.box[1:]]
                rc.swizzle, rc.box_cols = PANEL_BYTES, 2 * rc.box_cols
            else:  # K down the columns: boxes twice as tall
                rc.box = [x * 2 if d == len(rc.box) - 1 - rc.row_dim else x
                          for d, x in enumerate(rc.box)]
            rc.nbytes *= 2
    return w


def grow_stages(w: WsLoop, pool_bytes: int, budget: int) -> bool:
    """Deepens the ring by one stage when it has fewer than MIN_RING and the pool (of
    `pool_bytes` now) still fits `budget` and the block budget; whether it did."""
    more = w.stage_bytes
    if w.stages >= MIN_RING or pool_bytes + more > min(budget, w.block_budget(pool_bytes)):
        return False
    w.stages += 1
    return True


def longest_first(low, grid: list) -> int | None:
    """The grid axis to walk backwards, or None: the one whose block index the loop's trip
    count grows with, judged at the axis' first and last block (static grid and extent;
    the other block indices at 0). Launch order is not observable (blocks are independent),
    so this is a schedule, not a change of meaning."""
    from tvm.sym import Analyzer

    if low.wsloop.run.nested:  # the author's own walk (stream-K): nothing to reorder
        return None
    block_vars = list(low.program.kernel.block_vars)
    ana = Analyzer()

    def extent_at(axis: int, index: int):
        with low.bound({v: tirx.const(index if a == axis else 0, "int32")
                        for a, v in enumerate(block_vars)}):
            return ana.simplify(low.expr(low.wsloop.loop.extent))

    for axis, g in enumerate(grid):
        if not isinstance(g, tirx.IntImm) or g.value < 2:
            continue
        first, last = extent_at(axis, 0), extent_at(axis, g.value - 1)
        if isinstance(first, tirx.IntImm) and isinstance(last, tirx.IntImm) and \
                last.value > first.value:
            return axis
    return None


def walk_group(low, grid: list) -> int:
    """Rows of y a persistent walk takes together (grid_walk.bind_block): 8 where the ring
    copies' tiles move with x (a GEMM's: A rows and B columns shared in L2), 1 where none
    does (attention's K / V tiles are the same for every x: x fastest, so that the blocks
    running together read the same ones)."""
    x = low.program.kernel.block_vars[0]
    offsets = [o for rc in low.wsloop.copies for o in (
        rc.copy.src.offsets if rc.gather is None else (*rc.gather.indices, *rc.gather.conds))]
    return 8 if len(grid) < 2 or x in expr_vars(offsets) else 1


def consumer_regs(threads: int, producer_regs: int = PRODUCER_REGS) -> int | None:
    """Registers per consumer thread after setmaxnreg, the producer warpgroup keeping
    `producer_regs`; None below two consumer warpgroups (the launch's own budget is then
    already the ceiling)."""
    if threads < 256:
        return None
    # The block starts with the launch's registers a thread (the file over its threads, in
    # steps of 8), and setmaxnreg.inc waits until the producer's dec has freed what the
    # consumers take: asking for more than that hangs the block (it did, at 208 beside a
    # 96-register producer where the launch gave 168 a thread).
    launch = threads + PRODUCER_THREADS
    pool = REGISTER_FILE // launch // 8 * 8 * launch
    return min(MAX_REGS, (pool - PRODUCER_THREADS * producer_regs) // threads // 8 * 8)


# -- lowering (called by lower.CudaLowering, `low`) ------------------------------------


# The plan's choice of persistent walks (the compile option `persistent` = 0): on for loops
# whose trip count is the same in every block. On the H200 with it on for every loop of one
# wgmma gemm, every conformance kernel stayed correct and moved by -0.6..+1.9 points against
# torch (benchmarks/results/conformance_h200_persistent_on.json beside _persistent_off.json,
# one run each), and the generic path's y = x W^T GEMMs ran 1.00-1.41x as fast as one block
# per program block (linear_perop_h200.json, `per_op_*_p1` / `_p2`). Attention's two-gemm
# loops read 0.95x SDPA walked against 1.05x at S = 16384 while the walk took groups of 8
# heads (tl_attention_h200_persistent_default.json: 64 MiB of K / V for the blocks running
# together, more than L2); walked x fastest (`walk_group`) with Q a head copy, TileLang-style
# attention read 0.985 / 1.051 / 0.977 / 1.026x cuDNN (bf16 and fp16, S = 4096 / 16384, not
# causal) against 0.960 / 1.030 / 0.959 / 1.017x with one block per program block, the
# repo's example 0.994 / 1.034 / 0.998 / 1.054x against 0.955 / 1.017 / 0.980 / 1.035x
# (tl_attention_h200_heads.json, attn_paths_h200_heads.json). Causal loops (trip count by
# block) are left to the hardware's block order, longest first, which balanced them better
# (walked, they lost 6-18% in the first run, 7-13% in the last).
PERSISTENT_BY_DEFAULT = True


def persistent_choice(low, option: int) -> bool:
    """Whether the kernel walks its blocks persistently: the compile option `persistent`
    (1 off, 2 on), or for 0 the plan's choice: PERSISTENT_BY_DEFAULT for a loop of wgmma
    gemms that every block runs the same number of times (a causal loop's blocks differ,
    and the hardware's block scheduler, longest first, balances them better than a fixed
    walk), off for a loop inside serial loops (the kernel walks its work itself: stream-K)
    and for a ring with a gather: tiled.ops.conv2d's kernels, 7 configs at 4 layers on an
    H100, ran as fast or faster one block per program block in 20 of 28 (up to 1.38x),
    0.95-0.99x in the other 8 (benchmarks/results/conv_probe_h100.json, `blocks` / `ring`)."""
    if option or low.wsloop.run.nested:  # a nested loop's kernel walks its own work
        return option == 2
    if low.wsloop.gathers:
        return False
    block_vars = set(low.program.kernel.block_vars)
    gemms = [st for st in body_statements(low.wsloop.loop.body)
             if wgmma_gemm(st, low.wgmma_ops.accumulators) is not None]
    return PERSISTENT_BY_DEFAULT and bool(gemms) and \
        not _direct_vars(low.wsloop.loop.extent) & block_vars


def _direct_vars(e: pb.Expr) -> set[int]:
    """The variables of `e` outside the indices of its loads: a trip count that a block index
    reaches only through a table (a grouped GEMM's, whose unused tiles run 0 steps) is the
    same in every block for the walk's purposes; one computed from it (a causal bound) is
    not."""
    kind = e.WhichOneof("kind")
    if kind == "var":
        return {e.var}
    if kind == "load":
        return set()
    if kind == "binary":
        return _direct_vars(e.binary.a) | _direct_vars(e.binary.b)
    if kind == "call":
        return set().union(*(_direct_vars(a) for a in e.call.args))
    if kind == "cast":
        return _direct_vars(e.cast.value)
    if kind == "select":
        return _direct_vars(e.select.cond) | _direct_vars(e.select.true_value) | \
            _direct_vars(e.select.false_value)
    return set()


# Two consumer warpgroups taking a one-warpgroup program's blocks in turn (the compile option
# `alternate` = 0). The seed's GEMM (128 x 128 tiles, one consumer warpgroup, a ring of 4
# stages that takes the SM) on an H100 read 0.910x / 0.886x cuBLAS (fp16 / bf16) as written
# and 0.955x / 0.925x with its tiles computed but not stored
# (benchmarks/results/seed_epilogue_probe_h100.json): the epilogue, which nothing overlaps
# with the MMAs there, is about 5% of its time. With the blocks taken in turn, same process,
# H100 (alternate_probe_h100.json, alternate_probe_rings_h100.json): the seed 0.889 -> 0.908x
# and 0.872 -> 0.908x fp16, 0.879 -> 0.895x and 0.875 -> 0.889x bf16, at 4000 / 1000 / 256
# rows of a symbolic M +2.8 / +1.7 / +0.6% and +3.0 / +1.2 / -0.7%; tiled.ops.linear's 64 x
# 256 tile on 128 threads (memory-bound at 64 / 128 tokens) within 0.4%. Conformance, two
# runs (conformance_alternate_off_h100.json / _on_): gemm_fp8_e4m3 1093 -> 1119 TFLOP/s,
# gemm_rs 611 -> 619, gemm_splitk 535 -> 563, all correct. A 5- or 6-stage ring in its place
# read 0.75-0.80x (as without turns: seed_ring_probe_h200.json). The tiled.ops configs it
# takes (linear's 64 x 64 swap tiles on 8-stage rings, float8's per-tensor 64 x 256 tile):
# within the noise of 15-55 us kernels, 0.96-1.02x (alternate_ops_probe_h100*.json).
ALTERNATE_BY_DEFAULT = True
# Fragment registers a thread may hold for turns: nvcc gave the float8 block-scaled GEMM's
# 64 x 256 tile (two float32 accumulators, 256 floats a thread) 168 registers and 664
# LDL / STL under the 288-thread launch bounds (255 and 83 in its own block); the seed's
# 128 accumulators took 156, none spilled.
ALTERNATE_FRAGMENT_REGS = 128


def alternate_choice(low, option: int) -> bool:
    """Whether a second consumer warpgroup runs every other program block of the walk, so
    that one's main loop meets the other's epilogue (ws_loop.py): the compile option
    `alternate` (1 off, 2 where it applies), or for 0 ALTERNATE_BY_DEFAULT where it applies.
    It applies to a one-warpgroup program walking the grid one block per SM (where two
    blocks fit an SM, the second block overlaps the two already) whose loop is one wgmma
    gemm, not rebuilt every step, run the same number of times in every block (each
    warpgroup skips the other's ring steps by that count), with no head copy or gather,
    nothing in shared memory but the ring (the two warpgroups run their code outside the
    loop at the same time), and fragments of at most ALTERNATE_FRAGMENT_REGS words a
    thread (the block's registers are shared by one more warpgroup)."""
    w = low.wsloop
    if option == 1 or (option == 0 and not ALTERNATE_BY_DEFAULT):
        return False
    if not (w.persistent and w.min_blocks == 1 and low.threads == 128 and w.gemms == 1 and
            not (w.heads or w.gathers or w.pingpong or w.run.nested or w.rebuilt)):
        return False
    words = sum(math.prod(d.size for d in b.shape) * dtypes.nbytes(b.dtype) // 4
                for b in low.program.buffers if b.scope == pb.FRAGMENT and
                all(d.WhichOneof("kind") == "size" for d in b.shape))
    if words > ALTERNATE_FRAGMENT_REGS * low.threads:
        return False
    shared = {b.id for b in low.program.buffers if b.scope == pb.SHARED}
    p = low.program
    launch = {prm.scalar for prm in p.params if prm.WhichOneof("kind") == "scalar"} | \
        {d.var for b in p.buffers for d in b.shape if d.WhichOneof("kind") == "var"}
    return shared <= w.tiles and low.pool_bytes == low.scratch_offset and \
        _uniform(w.loop.extent, launch)


def _uniform(e: pb.Expr, launch: set[int]) -> bool:
    """Whether `e` is the same in every program block: constants and vars bound at launch
    (symbolic dims, scalar arguments) only."""
    kinds = [(x.WhichOneof("kind"), x) for x in subexprs(e)]
    return all(k != "load" and (k != "var" or x.var in launch) for k, x in kinds)
