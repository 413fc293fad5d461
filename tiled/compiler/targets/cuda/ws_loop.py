"""T.Pipelined on sm_90a: a TMA producer warpgroup feeding the program's threads through an
mbarrier ring (automatic warp specialization of the generic lowering).

When every copy of the loop that may run ahead (passes/pipeline.run_ahead) is one TMA can
do (a whole 2-D tile of a global tensor of rank <= 5, its row the tensor's last dim;
strides multiples of 16 bytes, or that as a launch precondition with a variant without TMA
beside it; a tile no mma.sync gemm reads, whose padded rows TMA does not write), and the
loop's other statements move no global data into shared memory themselves (an im2col
gather: its latency is better hidden by more blocks per SM than by a producer), they
become *ring copies*; otherwise the loop stays a cp.async pipeline (pipeline.py):

- the block gets a producer after the program's threads: one more warpgroup when the
  program has two or more (it gives its registers to them, setmaxnreg; one block per SM),
  one more warp when it has one warpgroup (registers are allocated per launch, so a
  producer warpgroup would halve the blocks an SM holds: the ring is then kept small
  enough for two blocks per SM where it can be, MIN_BLOCKS). Its first thread walks
  the loop's iterations and, per ring copy, waits until the copy's stage k % stages is free
  (its empty barrier), arrives on its full barrier expecting the tile's bytes, and issues
  the TMA boxes: one box per panel for a panel tile, in its swizzle (128 bytes, or 64 for
  a narrow panel of 64-byte rows; the layouts wgmma reads, gemm_sm90.py), one dense box of
  the tile otherwise;
- the program's threads (the consumers) run the kernel body as written; in the loop a ring
  copy becomes a wait on its full barrier, every statement after it reads its stage, and
  after the last statement that touches the tile each consumer warp releases the stage
  (empty barrier, one arrival per warp);
- barriers among the consumers are a named barrier the producer never joins;
- with two consumer warpgroups and two or more wgmma gemms in the loop's body (attention:
  S = Q K^T, then O += P V), the compile option `pingpong` makes the warpgroups take turns
  issuing the gemms (so that one's softmax meets the other's gemm). Off by default: on the
  H200 it changed TileLang-style attention by -1.6..+0.4% before the loop was
  software-pipelined and by -2.5..+0.4% after (benchmarks/results/
  tl_attention_h200_before_rotation.json, tl_attention_h200.json, the `_pingpong` rows);
- a body of two wgmma gemms that ends with the second (attention) is software-pipelined
  (ws_rotate.py);
- when the loop's trip count grows with a block index (a causal mask), blocks are launched
  longest first along that axis (`longest_first`): the hardware hands blocks out about in
  launch order, and the short ones then fill the tail instead of the long ones (not
  measured apart from the rest of this path);
- the body's wgmma gemms run on until a statement needs them (wgmma_waits.py);
- min(blocks, SMs) blocks walk the program's blocks, the ring's stages and phases carried
  from one to the next (`_blocks`): by default where every block runs the loop alike
  (PERSISTENT_BY_DEFAULT says why), or as the compile option `persistent` says.

Copies of adjacent 32-wide K tiles of 16-bit data share a stage between two iterations
(ws_pairs.py). The ring has the loop's num_stages stages, at least 2, and up to MIN_RING
where shared memory holds them (half of it for a one-warpgroup program, unless MIN_RING
stages of a GEMM loop do not fit there: WsLoop.block_budget); where two stages do not fit,
the loop is not pipelined (the lowering plans again without the producer). The tiles'
elements outside the tensor read as zeros (TMA's fill), as T.copy's do.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout import body_statements
from tiled.compiler.passes.pipeline import RunAhead, gathers, run_ahead
from tiled.compiler.targets.cuda.gemm_sm90 import PANEL_BYTES, panel_row_bytes
from tiled.compiler.targets.cuda.grid_walk import bind_block, persistent_walk
from tiled.compiler.targets.cuda.tma import tma_requirements
from tiled.compiler.targets.cuda.wgmma_waits import (
    first_step_fills,
    plan_waits,
    retire,
    retire_after_loop,
    wgmma_gemm,
)
from tiled.compiler.targets.cuda.ws_pairs import lower_pair_loop, merged_axes, pair_gemm
from tiled.compiler.targets.cuda.ws_rotate import find_rotation, lower_rotated_loop
from tiled.ir import dtypes
from tiled.ir.walk import expr_vars, walk
from tiled.v1 import tile_ir_pb2 as pb

PRODUCER_THREADS = 128  # a producer warpgroup
PRODUCER_REGS = 40  # its registers after setmaxnreg
# Ring stages a loop gets where shared memory holds them. The seed's 128x128x32, 3-stage
# GEMM (K tiles merged in pairs) on the H200 at 4096^3 fp16, through sm90_gemm.py: 3 ring
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


@dataclass
class RingCopy:
    pos: int  # position in the loop body
    copy: pb.Copy
    release: int  # the body position after which its stage is free
    box: list[int]  # TMA box, innermost dim first
    swizzle: int  # bytes: 128 for a panel tile, 0 for a dense one
    boxes: int  # boxes per stage (panels of a panel tile)
    box_cols: int  # tile columns per box
    nbytes: int  # bytes per stage
    row_dim: int  # the source dim along the tile's rows

    @property
    def tile(self) -> int:
        return self.copy.dst.buffer


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
    in_flight: bool = True  # gemms may stay in flight past their statement (wgmma_waits.py)
    persistent: bool = False  # min(blocks, SMs) blocks walk the program's blocks
    merge: int = 1  # loop iterations per ring stage (2: K tiles paired, ws_pairs.py)
    merged: dict = field(default_factory=dict)  # merged ring tile -> its K axis (0 / 1)
    gemms: int = 0  # wgmma gemms in the loop's body

    @property
    def producer_threads(self) -> int:
        return PRODUCER_THREADS if self.consumer_threads >= 256 else PRODUCER_WARP

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
    def tiles(self) -> set[int]:
        return {rc.tile for rc in self.copies}

    @property
    def barrier_bytes(self) -> int:
        return 16 * len(self.copies) * self.stages

    def full(self, i: int, stage):
        return i * self.stages + stage

    def empty(self, i: int, stage):
        return (len(self.copies) + i) * self.stages + stage


def _ring_copy(p: pb.Program, buffers, panels: set[int], pos: int, release: int,
               c: pb.Copy) -> tuple[RingCopy, list] | None:
    """The ring copy for copy `c` with its launch preconditions, or None when TMA cannot do
    it (module docstring)."""
    src, dst = buffers[c.src.buffer], buffers[c.dst.buffer]
    ext = list(c.src.extents)
    if len(dst.shape) != 2 or len(ext) > MAX_RANK or len(ext) < 2 or \
            dtypes.canonical_name(src.dtype) != dtypes.canonical_name(dst.dtype):
        return None
    rows, cols = (d.size for d in dst.shape)
    nonunit = [j for j, e in enumerate(ext) if e != 1]
    if rows == 1 or cols == 1 or len(nonunit) != 2 or nonunit[1] != len(ext) - 1 or \
            rows > MAX_BOX:
        return None
    req = tma_requirements(p, src)
    if req is None:
        return None
    size = dtypes.nbytes(dst.dtype)
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


def plan_ws_loop(low) -> WsLoop | None:
    """The warp-specialized plan of the kernel's T.Pipelined loop (module docstring), or
    None when it has no ring copy."""
    p = low.program
    if low.threads % 128 or low.threads > 512:
        return None
    run = run_ahead(p)
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
        if body[pos].copy.dst.buffer in mma_operands:
            return None  # mma.sync reads padded rows, which TMA does not write
        found = _ring_copy(p, buffers, low.wgmma_ops.panels, pos, release, body[pos].copy)
        if found is None:
            return None  # the cp.async pipeline runs every copy ahead, not only some
        copies.append(found[0])
        requires += [r for r in found[1] if r not in requires]
    gemms = [st for st in body if wgmma_gemm(st, low.wgmma_ops.accumulators)]
    w = WsLoop(run, copies, tuple(requires), low.threads, stages=max(2, run.loop.num_stages),
               pingpong=low.threads == 256 and len(gemms) >= 2, gemms=len(gemms))
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


def consumer_regs(threads: int) -> int | None:
    """Registers per consumer thread after setmaxnreg, None below two consumer warpgroups
    (the launch's own budget is then already the ceiling)."""
    if threads < 256:
        return None
    return min(MAX_REGS, (REGISTER_FILE - PRODUCER_THREADS * PRODUCER_REGS) // threads // 8 * 8)


# -- lowering (called by lower.CudaLowering, `low`) ------------------------------------

def _call(fn: str, *args) -> None:
    T.evaluate(T.call_extern("void", f"tiled::sm90::{fn}", *args))


def declare_ring_maps(low) -> None:
    """One TMA descriptor parameter per (tensor, box, swizzle) the ring copies use."""
    w = low.wsloop
    by_key: dict = {}
    for i, rc in enumerate(w.copies):
        param = low.param_of[rc.copy.src.buffer]
        key = (param, tuple(rc.box), rc.swizzle)
        if key not in by_key:
            name = f"tiled_tmap_r{len(by_key)}"
            by_key[key] = T.arg(name, T.handle())
            low.tensor_maps[name] = {"kind": "tensor_map", "param": param, "box": rc.box,
                                     "swizzle": rc.swizzle}
        w.maps[i] = by_key[key]


def _bar(low, index):
    return T.address_of(low.ring_bars[index])


def _stage_phase(w: WsLoop, k):
    stage = tirx.floormod(k, w.stages)
    return stage, tirx.Cast("uint32", tirx.floormod(tirx.floordiv(k, w.stages), 2))


# The plan's choice of persistent walks (the compile option `persistent` = 0): on, for
# loops of one wgmma gemm whose trip count is the same in every block. On the H200 with it
# on for every such loop, every conformance kernel stayed correct and moved by -0.6..+1.9
# points against torch (benchmarks/results/conformance_h200_persistent_on.json beside
# _persistent_off.json, one run each), and the generic path's y = x W^T GEMMs ran
# 1.00-1.41x as fast as one block per program block (linear_perop_h200.json, `per_op_*_p1`
# / `_p2`); but TileLang-style attention at S = 16384 read 0.95x SDPA walked against 1.05x
# with one block per program block (tl_attention_h200_persistent_default.json; at S = 4096
# within the run's noise), so loops of two gemms keep one block per program block. Causal
# loops (trip count by block) are left to the hardware's block order, longest first, which
# balanced them better (walked, they lost 6-18% in that run).
PERSISTENT_BY_DEFAULT = True


def persistent_choice(low, option: int) -> bool:
    """Whether the kernel walks its blocks persistently: the compile option `persistent`
    (1 off, 2 on), or for 0 the plan's choice: PERSISTENT_BY_DEFAULT for a loop of one
    wgmma gemm (a GEMM's) that every block runs the same number of times (a causal loop's
    blocks differ, and the hardware's block scheduler, longest first, balances them better
    than a fixed walk; attention's two-gemm loops ran slower walked)."""
    if option:
        return option == 2
    block_vars = set(low.program.kernel.block_vars)
    gemms = [st for st in body_statements(low.wsloop.loop.body)
             if wgmma_gemm(st, low.wgmma_ops.accumulators) is not None]
    return PERSISTENT_BY_DEFAULT and len(gemms) == 1 and \
        not expr_vars([low.wsloop.loop.extent]) & block_vars


@contextlib.contextmanager
def _blocks(low, grid: list):
    """The program blocks this block runs: itself, or (persistent) blockIdx.x, +
    gridDim.x, ... with the block vars bound for each (bind_block: an x-y plane walked in
    groups of 8 rows, z outermost, as the GEMM path does); `low.ring_k` counts the ring's
    steps across them, so that stages and phases continue from block to block."""
    if not low.wsloop.persistent:
        low.ring_k = None
        yield
        return
    low.ring_k = T.alloc_buffer((1,), "int32", scope="local")
    T.buffer_store(low.ring_k, tirx.const(0, "int32"), [0])
    blocks = grid[0]
    for g in grid[1:]:
        blocks = blocks * g
    with persistent_walk(low, blocks) as (_, linear):
        bind_block(low, linear, grid)
        # Each block index computed once per program block: inside the ring loops nvcc
        # recomputed the grouped walk's divisions at every step (it may not hoist a division
        # out of a loop that might not run), a dozen instructions on the producer's path.
        for v in low.program.kernel.block_vars:
            index = T.alloc_buffer((1,), "int32", scope="local")
            T.buffer_store(index, low.vars[v], [0])
            low.vars[v] = index[0]
        yield


def _ring_base(low):
    return low.ring_k[0] if low.ring_k is not None else tirx.const(0, "int32")


def _ring_advance(low, n) -> None:
    if low.ring_k is not None:
        T.buffer_store(low.ring_k, low.ring_k[0] + n, [0])


def lower_ws_body(low, grid: list) -> None:
    """The kernel body with the producer warpgroup beside the program's threads."""
    w = low.wsloop
    n = 2 * len(w.copies) * w.stages
    low.ring_bars = T.decl_buffer((n,), "uint64", data=low.pool.data,
                                  elem_offset=w.bar_offset // 8)
    warps = low.threads // 32
    with T.If(low.tx == 0), T.Then():
        with T.serial(0, len(w.copies) * w.stages) as i:
            _call("bar_init", _bar(low, i), tirx.const(1, "uint32"))
            _call("bar_init", _bar(low, i + len(w.copies) * w.stages),
                  tirx.const(warps, "uint32"))
        _call("fence_barrier_init")
    T.evaluate(T.tvm_storage_sync("shared"))
    regs = consumer_regs(low.threads)
    with T.If(low.tx < low.threads):
        with T.Then():
            if regs:
                _call(f"setmaxnreg_inc<{regs}>")
            with _blocks(low, grid):
                low.stmt(low.program.kernel.body)
                if w.persistent:  # the next block's writes wait for this one's reads
                    low.sync.sync()
                    low.sync.pending_read = low.sync.pending_write = False
        with T.Else():
            if regs:
                _call(f"setmaxnreg_dec<{PRODUCER_REGS}>")
            with T.If(low.tx == low.threads), T.Then(), _blocks(low, grid):
                _lower_producer(low)


def _lower_producer(low) -> None:
    w = low.wsloop
    f = w.loop
    n = low.expr(f.extent)
    base = _ring_base(low)
    with T.serial(0, _ring_steps(w, n)) as k:
        low.vars[f.var] = k * w.merge  # the first of the iterations this stage holds
        stage, phase = _stage_phase(w, base + k)
        for i, rc in enumerate(w.copies):
            low.stage[rc.tile] = stage
            _call("bar_wait", _bar(low, w.empty(i, stage)), tirx.const(1, "uint32") - phase)
            full = _bar(low, w.full(i, stage))
            _call("ring_fill", full, tirx.const(rc.nbytes, "uint32"))
            coords = [low.expr(o) for o in rc.copy.src.offsets][::-1]  # innermost first
            zero = tirx.const(0, "int32")
            for b in range(rc.boxes):
                col = b * rc.box_cols
                dst = low.addr(rc.tile, [zero, tirx.const(col, "int32")])
                _call("tma_load", dst, w.maps[i], full, coords[0] + col, *coords[1:])
    _ring_advance(low, _ring_steps(w, n))
    _leave_stages(low)


def _ring_steps(w: WsLoop, n):
    """Ring stages a loop of `n` iterations takes."""
    return n if w.merge == 1 else tirx.floordiv(n + w.merge - 1, w.merge)


def _enter_stage(low, k, base) -> tuple:
    """Points the ring tiles at iteration k's stage (and, merged, its half of it); returns
    the stage and its phase."""
    w = low.wsloop
    stage, phase = _stage_phase(w, base + (k if w.merge == 1 else tirx.floordiv(k, w.merge)))
    for rc in w.copies:
        low.stage[rc.tile] = stage
        if w.merge > 1:
            axis = w.merged[rc.tile]
            half = tirx.floormod(k, w.merge) * low.buffers[rc.tile].shape[axis].size
            zero = tirx.const(0, "int32")
            low.panel_shift[rc.tile] = (zero, half) if axis else (half, zero)
    return stage, phase


def _leave_stages(low) -> None:
    for rc in low.wsloop.copies:
        low.stage.pop(rc.tile, None)
        low.panel_shift.pop(rc.tile, None)


def lower_ring_consumer(low, f: pb.For) -> None:
    """The loop on the consumers' side (module docstring)."""
    w = low.wsloop
    body = body_statements(f.body)
    ring = {rc.pos: i for i, rc in enumerate(w.copies)}
    if low.sync.pending_write:  # shared writes before the loop, made visible once
        _call("fence_proxy_async_shared")
        low.sync.sync()
    reads = writes = False
    for i, st in enumerate(body):
        if i not in ring:
            r, wr = low.effects(st)
            reads, writes = reads or r, writes or wr
    if w.pingpong:
        _call("turn_first")
    peeled = first_step_fills(body, f.var, low.buffers) if w.in_flight else set()
    n = low.expr(f.extent)
    if peeled:  # `if k == 0: T.clear(acc)`, run once before the loop
        with T.If(n > 0), T.Then():
            for i in sorted(peeled):
                low.stmt(body[i].if_then_else.then_body)
    pair = pair_gemm(low, body, ring, peeled)
    rot = find_rotation(low, body, ring, peeled) if w.in_flight and w.merge == 1 else None
    waits = plan_waits(low, body, peeled) if w.in_flight and rot is None and pair is None \
        else None
    base = _ring_base(low)
    if pair is not None:
        def wait_full(j, stage, phase):
            _call("bar_wait", _bar(low, w.full(j, stage)), phase)

        def release(j, at):  # copy j's stage at ring count `at`
            _call("ring_release", _bar(low, w.empty(j, tirx.floormod(at, w.stages))))

        lower_pair_loop(low, f, body[pair], base, n, lambda k: _enter_stage(low, k, base),
                        wait_full, release)
    elif rot is not None:
        def release_at(j, at):  # copy j's stage of ring step `at`
            _call("ring_release", _bar(low, w.empty(j, tirx.floormod(at, w.stages))))
        lower_rotated_loop(low, f, body, ring, peeled, rot, base, n,
                           lambda k: _stage_phase(w, k), release_at, writes)
    else:
        _lower_loop(low, f, body, ring, peeled, waits, base, n, writes)
    _ring_advance(low, _ring_steps(w, n))
    if waits is not None:
        def release_last(j):  # the ring's count is past the loop's last step now
            with T.If(n > 0), T.Then():
                at = tirx.floormod(_ring_base(low) - 1, w.stages)
                _call("ring_release", _bar(low, w.empty(j, at)))
        retire_after_loop(low, waits, body, release_last if w.persistent else None)
    if w.pingpong:
        _call("turn_last")
    _leave_stages(low)
    if writes:
        low.sync.pending_read = low.sync.pending_write = False
    low.sync.pending_read |= reads


def _lower_loop(low, f: pb.For, body: list, ring: dict, peeled: set[int], waits, base, n,
                writes: bool) -> None:
    """The consumers' loop as written, its gemms retired where `waits` says (else each
    before the next statement)."""
    w = low.wsloop
    with T.serial(0, n) as k:
        low.vars[f.var] = k
        stage, phase = _enter_stage(low, k, base)

        def release(j, back=0):  # copy j's stage of this step (back=1: of the one before)
            at = k - back
            if w.merge == 1:
                _call("ring_release", _bar(low, w.empty(j, tirx.floormod(base + at,
                                                                         w.stages))))
                return
            bar = _bar(low, w.empty(j, tirx.floormod(base + tirx.floordiv(at, w.merge),
                                                      w.stages)))
            with T.If(tirx.Or(tirx.floormod(at, w.merge) == w.merge - 1, at == n - 1)):
                with T.Then():  # the stage's last iteration
                    _call("ring_release", bar)

        for i, st in enumerate(body):
            if waits is not None and i in waits.before:
                retire(low, waits, body, waits.before[i], k, release)
            if i in ring:
                if w.merge == 1:
                    _call("bar_wait", _bar(low, w.full(ring[i], stage)), phase)
                else:  # the stage's first iteration
                    with T.If(tirx.floormod(k, w.merge) == 0), T.Then():
                        _call("bar_wait", _bar(low, w.full(ring[i], stage)), phase)
            elif i in peeled:
                pass
            else:
                low.turn = w.pingpong and \
                    wgmma_gemm(st, low.wgmma_ops.accumulators) is not None
                low.in_flight = waits is not None and i in waits.in_flight
                low.stmt(st)
                low.turn = low.in_flight = False
            if waits is not None and i in waits.after:
                retire(low, waits, body, waits.after[i], k, release)
            freed = waits.releases.get(i, []) if waits is not None else \
                [j for j, rc in enumerate(w.copies) if rc.release == i]
            for j in freed:
                release(j)
        if writes:
            low.sync.sync()
