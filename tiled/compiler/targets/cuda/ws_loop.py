"""T.Pipelined on sm_90a: a TMA producer warpgroup feeding the program's threads through an
mbarrier ring (automatic warp specialization of the generic lowering). The plan (which
copies, how many stages, how many blocks per SM, persistent or not) is ws_plan.py's; this
module lowers the kernel body around it and the consumers' loop, ws_producer.py the
producer's side, ws_ring.py the bookkeeping both share.

When every copy of the loop that may run ahead (passes/pipeline.run_ahead) is one TMA can
do (a whole 2-D tile of a global tensor of rank <= 5, its row the tensor's last dim;
strides multiples of 16 bytes, or that as a launch precondition with a variant without TMA
beside it; a tile no mma.sync gemm reads, whose padded rows TMA does not write) or a gather
nest that cp.async vectors can issue (gather.py: an implicit-GEMM convolution's im2col
tile), and the loop's other statements move no global data into shared memory themselves
(a gather of elements is better hidden by more blocks per SM than by a producer), they
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
- a ring with a gather takes a producer warpgroup (whatever the program's threads), every
  thread of which walks the loop: the first issues the TMA copies as above; for the gather
  each thread issues its share of the tile's cp.async vectors into the free stage (zeros
  where the gather's conditions fail) and arrives on the stage's full barrier when they
  land (cp.async.mbarrier.arrive.noinc; the barrier counts the producer's threads); the
  consumers fence a gathered stage for wgmma's proxy after waiting for it. The producer
  keeps 96 registers (ws_plan.GATHER_PRODUCER_REGS), its rows' addresses across the steps;
- the program's threads (the consumers) run the kernel body as written; in the loop a ring
  copy becomes a wait on its full barrier, every statement after it reads its stage, and
  after the last statement that touches the tile each consumer warp releases the stage
  (empty barrier, one arrival per warp);
- barriers among the consumers are a named barrier the producer never joins;
- with two consumer warpgroups and two or more wgmma gemms in the loop's body (attention:
  S = Q K^T, then O += P V), the compile option `pingpong` makes the warpgroups take turns
  issuing the gemms (so that one's softmax meets the other's gemm); a loop of one gemm that
  rebuilds its accumulator every step (a block-scaled float8 GEMM, which then rescales it
  into its sum) takes turns regardless: 3-8% faster on an H100 at 128 x 128 tiles
  (benchmarks/results/fp8_turns_probe_h100.json). The option is off by default: on the
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
- the loop's head copies (passes/pipeline.py: attention's Q tile, copied before the loop)
  are the producer's too: it issues them before the block's first ring step, each on a
  full barrier of its own that the consumers wait on where the program copies;
- min(blocks, SMs) blocks walk the program's blocks, the ring's stages and phases carried
  from one to the next (`_blocks`): by default where every block runs the loop alike
  (ws_plan.PERSISTENT_BY_DEFAULT says why), or as the compile option `persistent` says.
  Walking, the consumer warps free a head copy's tile after the last statement touching
  it (an empty barrier), and the producer loads the next block's into it while they finish
  this one. The walk takes the blocks in groups of 8 rows of y, or x fastest where the
  ring's tiles do not move with x (ws_plan.walk_group);
- a one-warpgroup program walking one block per SM (its ring takes the SM) gets a second
  consumer warpgroup, and the two take the walk's program blocks in turn (the option
  `alternate`; ws_plan.alternate_choice says where it applies and what it measured): each
  runs the program as threads tx & 127, syncs on a named barrier of its own, and counts the
  ring's steps of the other's blocks as its own (every block takes the same number), so
  stages and phases stay right; the other's turn starts once a warpgroup has issued its
  loop's last MMAs (a named barrier; waiting on a stage's full barrier before then could
  see the phase of the stage's previous fill), so one's MMAs meet the other's epilogue.

Copies of adjacent 32-wide K tiles of 16-bit data share a stage between two iterations
(ws_pairs.py). The ring has the loop's num_stages stages, at least 2, and up to MIN_RING
where shared memory holds them (half of it for a one-warpgroup program, unless MIN_RING
stages of a GEMM loop do not fit there: ws_plan.WsLoop.block_budget); where two stages
do not fit, the loop is not pipelined (the lowering plans again without the producer). The tiles'
elements outside the tensor read as zeros (TMA's fill), as T.copy's do.
"""

from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.stmts import body_statements
from tiled.compiler.targets.cuda.gemm_sm90 import fence_shared_writes, sync_next_iteration
from tiled.compiler.targets.cuda.grid_walk import (
    bind_block,
    persistent_walk,
    producer_waits_for_grid,
)
from tiled.compiler.targets.cuda.wgmma_waits import (
    first_step_fills,
    plan_waits,
    retire,
    retire_after_loop,
    wgmma_gemm,
)
from tiled.compiler.targets.cuda.ws_pairs import lower_pair_loop, pair_gemm
from tiled.compiler.targets.cuda.ws_plan import WsLoop, consumer_regs, walk_group
from tiled.compiler.targets.cuda.ws_producer import lower_producer
from tiled.compiler.targets.cuda.ws_ring import (
    bar,
    call,
    head_slot,
    leave_stages,
    ring_advance,
    ring_base,
    ring_steps,
    stage_phase,
)
from tiled.compiler.targets.cuda.ws_rotate import find_rotation, lower_rotated_loop
from tiled.v1 import tile_ir_pb2 as pb


@contextlib.contextmanager
def _blocks(low, grid: list, group=None):
    """The program blocks this block runs: itself, or (persistent) blockIdx.x, +
    gridDim.x, ... with the block vars bound for each (bind_block: an x-y plane walked in
    groups of 8 rows, z outermost, as the GEMM path does); `low.ring_k` counts the ring's
    steps across them, so that stages and phases continue from block to block. `group`:
    the consumer warpgroup of several taking the walk's blocks in turn (it runs every
    w.groups-th, from its own number)."""
    w = low.wsloop
    low.ring_k = None
    low.walk_it = tirx.const(0, "int32")
    if w.reused:
        low.ring_k = T.alloc_buffer((1,), "int32", scope="local")
        T.buffer_store(low.ring_k, tirx.const(0, "int32"), [0])
    if not w.persistent:
        yield
        return
    blocks = grid[0]
    for g in grid[1:]:
        blocks = blocks * g
    turns = (group, w.groups) if group is not None else (0, 1)
    with persistent_walk(low, blocks, *turns) as (it, linear):
        low.walk_it = it
        bind_block(low, linear, grid, group=walk_group(low, grid))
        # Each block index computed once per program block: inside the ring loops nvcc
        # recomputed the grouped walk's divisions at every step (it may not hoist a division
        # out of a loop that might not run), a dozen instructions on the producer's path.
        for v in low.program.kernel.block_vars:
            index = T.alloc_buffer((1,), "int32", scope="local")
            T.buffer_store(index, low.vars[v], [0])
            low.vars[v] = index[0]
        yield


def _full_arrivals(w: WsLoop, j):
    """The arrive count of ring copy j's full barriers: a TMA stage completes with its one
    arrival and its bytes, a gathered one once every producer thread's vectors have landed
    (ring_gathered)."""
    count = tirx.const(1, "uint32")
    for i, rc in enumerate(w.copies):
        if rc.gather is not None:
            count = tirx.Select(j == i, tirx.const(w.producer_threads, "uint32"), count)
    return count


def lower_ws_body(low, grid: list) -> None:
    """The kernel body with the producer warpgroup beside the program's threads."""
    w = low.wsloop
    low.ring_bars = T.decl_buffer((w.barriers,), "uint64", data=low.pool.data,
                                  elem_offset=w.bar_offset // 8)
    warps = low.threads // 32
    with T.If(low.tx == 0), T.Then():
        with T.serial(0, len(w.copies) * w.stages) as i:
            call("bar_init", bar(low, i), _full_arrivals(w, tirx.floordiv(i, w.stages)))
            call("bar_init", bar(low, i + len(w.copies) * w.stages),
                  tirx.const(warps, "uint32"))
        for h in range(len(w.heads)):
            for slot in range(w.head_slots):
                call("bar_init", bar(low, w.head_full(h, slot)), tirx.const(1, "uint32"))
                call("bar_init", bar(low, w.head_empty(h, slot)),
                      tirx.const(warps, "uint32"))
        call("fence_barrier_init")
    T.evaluate(T.tvm_storage_sync("shared"))
    regs = consumer_regs(low.threads, w.producer_regs)
    tid, consumers = low.tx, low.threads * w.groups
    with T.If(tid < consumers):
        with T.Then():
            if regs:
                call(f"setmaxnreg_inc<{regs}>")
            group = None
            if w.groups > 1:  # each warpgroup runs the program as its threads 0 .. 127
                group, low.tx = tirx.floordiv(tid, low.threads), tirx.floormod(tid, low.threads)
            with _blocks(low, grid, group):
                _lower_consumers(low)
                if w.persistent:  # the next block's writes wait for this one's reads
                    low.sync.sync()
                    low.sync.pending_read = low.sync.pending_write = False
            low.tx = tid
        with T.Else():
            if regs:
                call(f"setmaxnreg_dec<{w.producer_regs}>")
            # One thread issues TMA boxes; a gather takes all the producer's threads.
            with T.If(tirx.const(True, "bool") if w.gathers else tid == consumers):
                with T.Then():
                    producer_waits_for_grid(low)
                    with _blocks(low, grid):
                        lower_producer(low)


def _lower_consumers(low) -> None:
    """The program's body on the consumers' side; where blocks walk the grid, each warp
    frees the head copies' tiles after the last statement touching them (the producer loads
    the next block's into them)."""
    w = low.wsloop
    if not (w.heads and w.persistent):
        return low.lower_statements()
    slot, _ = head_slot(low)
    for rc in w.heads:
        low.stage[rc.tile] = slot
    for i, st in enumerate(body_statements(low.program.kernel.body)):
        low.stmt(st)
        for h, rc in enumerate(w.heads):
            if rc.release == i:
                call("ring_release", bar(low, w.head_empty(h, slot)))


def wait_head(low, tile: int) -> None:
    """The consumers' side of a head copy: wait until its tile has landed."""
    w = low.wsloop
    slot, phase = head_slot(low)
    call("bar_wait", bar(low, w.head_full(w.head_index[tile], slot)), phase)


def _enter_stage(low, k, base) -> tuple:
    """Points the ring tiles at iteration k's stage (and, merged, its half of it); returns
    the stage and its phase."""
    w = low.wsloop
    stage, phase = stage_phase(w, base + (k if w.merge == 1 else tirx.floordiv(k, w.merge)))
    for rc in w.copies:
        low.stage[rc.tile] = stage
        if w.merge > 1:
            axis = w.merged[rc.tile]
            half = tirx.floormod(k, w.merge) * low.buffers[rc.tile].shape[axis].size
            zero = tirx.const(0, "int32")
            low.panel_shift[rc.tile] = (zero, half) if axis else (half, zero)
    return stage, phase


def lower_ring_consumer(low, f: pb.For) -> None:
    """The loop on the consumers' side (module docstring)."""
    w = low.wsloop
    body = body_statements(f.body)
    ring = {rc.pos: i for i, rc in enumerate(w.copies)}
    fence_shared_writes(low)  # shared writes before the loop, made visible once
    reads = writes = False
    for i, st in enumerate(body):
        if i not in ring:
            r, wr = low.effects(st)
            reads, writes = reads or r, writes or wr
    if w.pingpong:
        call("turn_first")
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
    if w.groups > 1:  # the other warpgroup's block before this one: its steps, its turn
        first = low.walk_it == 0
        ring_advance(low, tirx.Select(first, tirx.const(0, "int32"), ring_steps(w, n)))
        with T.If(tirx.Not(first)), T.Then():
            call("turn_wait_group")
    base = ring_base(low)
    def wait_full(j, stage, phase):
        _wait_full(low, j, stage, phase)

    def pass_turn():  # every wait on this block's stages issued: the other may start
        if w.groups > 1:
            with T.If(low.walk_it + 1 < low.walk_count), T.Then():
                call("turn_pass_group")

    if pair is not None:
        def release(j, at):  # copy j's stage at ring count `at`
            call("ring_release", bar(low, w.empty(j, tirx.floormod(at, w.stages))))

        lower_pair_loop(low, f, body[pair], base, n, lambda k: _enter_stage(low, k, base),
                        wait_full, release, pass_turn)
    elif rot is not None:
        def release_at(j, at):  # copy j's stage of ring step `at`
            call("ring_release", bar(low, w.empty(j, tirx.floormod(at, w.stages))))
        lower_rotated_loop(low, f, body, ring, peeled, rot, base, n,
                           lambda k: stage_phase(w, k), release_at, wait_full, writes)
    else:
        _lower_loop(low, f, body, ring, peeled, waits, base, n, writes)
        pass_turn()
    ring_advance(low, ring_steps(w, n))
    if waits is not None:
        def release_last(j):  # the ring's count is past the loop's last step now
            with T.If(n > 0), T.Then():
                at = tirx.floormod(ring_base(low) - 1, w.stages)
                call("ring_release", bar(low, w.empty(j, at)))
        retire_after_loop(low, waits, body, release_last if w.reused else None)
    if w.pingpong:
        call("turn_last")
    leave_stages(low)
    if writes:
        low.sync.pending_read = low.sync.pending_write = False
    low.sync.pending_read |= reads


def _wait_full(low, j: int, stage, phase) -> None:
    """The consumers wait until ring copy j's stage has landed; a gather's vectors came
    through the generic proxy, so a wgmma (the async proxy) reads them after a proxy
    fence."""
    w = low.wsloop
    call("bar_wait", bar(low, w.full(j, stage)), phase)
    if w.copies[j].gather is not None:
        call("fence_proxy_async_shared")


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
                call("ring_release", bar(low, w.empty(j, tirx.floormod(base + at, w.stages))))
                return
            empty = bar(low, w.empty(j, tirx.floormod(base + tirx.floordiv(at, w.merge),
                                                       w.stages)))
            with T.If(tirx.Or(tirx.floormod(at, w.merge) == w.merge - 1, at == n - 1)):
                with T.Then():  # the stage's last iteration
                    call("ring_release", empty)

        for i, st in enumerate(body):
            if waits is not None and i in waits.before:
                retire(low, waits, body, waits.before[i], k, release)
            if i in ring:
                if w.merge == 1:
                    _wait_full(low, ring[i], stage, phase)
                else:  # the stage's first iteration
                    with T.If(tirx.floormod(k, w.merge) == 0), T.Then():
                        _wait_full(low, ring[i], stage, phase)
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
            sync_next_iteration(low)
