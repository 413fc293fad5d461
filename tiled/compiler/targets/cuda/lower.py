"""Lowers a Tile IR program to a CUDA kernel in TIR (classic style: explicit threads).

Execution model: every thread of the block runs the statements outside T.Parallel (so they must
be uniform: the same for all threads); a T.Parallel nest is split over the threads, following
the layout of the fragment it writes (passes/layout.py); tile ops are lowered to cooperative
code or to calls into the headers of include/, one module per op family: parallel (nests,
T.fill), copy, gemm (mma.sync) and gemm_sm90 (wgmma), reduce, scan (T.cumsum), pipeline
(T.Pipelined as a cp.async multi-stage pipeline) and, on sm_90a, ws_loop (T.Pipelined fed by
a TMA producer warpgroup, its wgmma waits placed by wgmma_waits). kernel.py builds the
PrimFunc around this walk (parameters, launch, buffers).
Shared memory is one dynamic pool, laid out by pool.py (pipelined tiles get `num_stages`
copies, a producer's ring its stages and mbarriers, then one scratch area that the ops moving
fragments through shared memory share, one op at a time); tiled inserts the barriers itself.
"""

from __future__ import annotations

import contextlib
import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.barriers import SyncTracker, shared_effects
from tiled.compiler.passes.layout_kinds import unravel
from tiled.compiler.passes.resources import SharedTile
from tiled.compiler.passes.vectorize import vector_lanes_ok
from tiled.compiler.targets.cuda.access import BufferAccess
from tiled.compiler.targets.cuda.atomic import lower_atomic
from tiled.compiler.targets.cuda.copy import (
    async_vector,
    convert_fp8_tile,
    copy_by_vectors,
    copy_element,
    copy_scratch_bytes,
    issue_async_copy,
    lower_fragment_copy,
)
from tiled.compiler.targets.cuda.epilogue import store_accumulator
from tiled.compiler.targets.cuda.gemm import (
    lower_gemm,
    stage_bytes,
)
from tiled.compiler.targets.cuda.gemm_sm90 import (
    chains_wgmma,
    lower_wgmma,
    sync_next_iteration,
)
from tiled.compiler.targets.cuda.grid_walk import grid_dependency
from tiled.compiler.targets.cuda.layouts import (
    ROWS_LAYOUTS,
    CudaAnchors,
    MmaLayout,
    infer_layouts,
)
from tiled.compiler.targets.cuda.limits import MAX_SMEM
from tiled.compiler.targets.cuda.parallel import lower_fill, lower_parallel
from tiled.compiler.targets.cuda.paths import choose_paths
from tiled.compiler.targets.cuda.pipeline import lower_pipeline
from tiled.compiler.targets.cuda.pool import plan_pool, uses_scratch
from tiled.compiler.targets.cuda.reduce import lower_reduce
from tiled.compiler.targets.cuda.scan import lower_scan
from tiled.compiler.targets.cuda.sm90_attn import (
    lower_attn_loop,
    stmt_q_copy,
    store_attn_tile,
)
from tiled.compiler.targets.cuda.ws_loop import lower_ring_consumer, lower_ws_body, wait_head
from tiled.compiler.targets.cuda.ws_producer import declare_ring_maps
from tiled.compiler.tir import (
    ExprLowering,
    loc_of,
)
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.walk import element_accesses, expr_vars, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb

UNROLL_LIMIT = 256
VECTOR_LIMIT = 16  # a T.vectorized loop that cannot take vector lanes unrolls up to this extent


class CudaLowering(BufferAccess, ExprLowering):
    select_as_if = True  # ExprLowering.select_as_if
    explicit = False  # the explicit sm_90a path (sm90_explicit.ExplicitLowering)
    tid_base = 0  # the first thread running the current statement (a T.ws region's)
    turn = False  # a wgmma gemm issued on its warpgroup's turn (ws_loop.py, pingpong)
    in_flight = False  # a wgmma gemm left in flight (wgmma_waits.py)
    zero_init = False  # a wgmma gemm that sets its accumulator, C = A @ B (ws_rotate.py)
    k_tiles = 1  # a wgmma gemm over this many K tiles of its merged ring stage (ws_pairs.py)
    # What the op modules (reduce, parallel) ask of the target; ROCm's lowering (a subclass,
    # targets/rocm/lower.py) brings its own.
    warp_size = 32  # lanes of a warp
    rows_layouts = ROWS_LAYOUTS  # layouts replicated over a few lanes (row vectors)
    mma_layouts: tuple[type, ...] = (MmaLayout,)  # accumulators whose operand tiles get padded
    max_vector = CudaAnchors.max_vector  # the longest run of a thread in a cyclic layout
    pool_scope = "shared.dyn"  # the TIR scope of the shared pool (Metal's is static: "shared")
    max_stages = 1 << 30  # the most shared buffers a T.Pipelined copy gets (Metal: 2)
    overlays = True  # tiles of disjoint lifetimes may share bytes where needed (pool.py)
    shuffle_dtypes = frozenset({"float32", "float64", "int32", "uint32", "int64", "uint64"})

    def __init__(self, program: Program, arch: str = "sm_80", warp_specialize: bool = True,
                 whole_kernel: bool = True, ring_tables: int = 0):
        super().__init__(program)
        p = self.program
        self.arch = arch
        self.ring_tables = ring_tables  # the compile option (ws_plan.plan_ws_loop)
        self.threads = p.kernel.threads  # the program's threads (consumers on the sm90 path)
        self.tensor_maps: dict[str, dict] = {}  # kernel parameter -> tensor_map recipe
        self.param_of = {prm.buffer: i for i, prm in enumerate(p.params)  # tensor -> param #
                         if prm.WhichOneof("kind") == "buffer"}
        choose_paths(self, arch == "sm_90a" and warp_specialize, whole_kernel)
        self.tir: dict[int, tirx.Buffer] = {}
        self.shared: dict[int, SharedTile] = {}
        self.reuses: dict[int, set[int]] = {}  # tile -> earlier tiles whose bytes it takes
        self.stage: dict[int, tirx.PrimExpr] = {}  # shared bid -> current stage index
        # ring tile -> (rows, columns) before this iteration's tile in a stage of merged
        # iterations (ws_loop.py)
        self.panel_shift: dict[int, tuple] = {}
        self.frag_bind: dict[int, tirx.PrimExpr] = {}  # fragment bid -> local slot in a nest
        self.frag_row = None  # (anchor layout, its slot) of the T.Parallel nest being lowered
        self.nest_slot = None  # the same for any anchor (X[k, i] over a stacked X: frag_slot)
        self.replica = None  # in a nest over a rows layout: true in one lane of each quad
        self.nest_vars: list[int] = []
        self.sync = self.block_sync()
        self.tx = None
        self.pool = None
        self.pool_bytes = 0
        self.atomic_slot = 0  # pool offset of an atomic's previous value (pool.plan_pool)
        self.scratch_offset = 0
        self.pipelines: dict[int, tuple[int, list[int]]] = {}  # For var -> (stages, producers)
        self.gathers: dict = {}  # a producer gather nest's outer var -> gather.Gather
        self.lane_index: dict = {}  # scalar local -> the vector lane indexing it (parallel.py)
        self.vec_plan: dict[tuple, int] = {}

    def infer_layouts(self, p: pb.Program, accumulators: dict | None) -> dict[int, object]:
        """Every fragment's layout, from the target's instruction anchors (layouts.py)."""
        return infer_layouts(p, accumulators)

    def block_sync(self) -> SyncTracker:
        """Barrier placement for the program's threads: __syncthreads(), or the consumers'
        named barrier when a producer runs beside them (an sm_90a path)."""
        producer = self.attn is not None or self.wsloop is not None
        if producer and self.wsloop is not None and self.wsloop.groups > 1:
            return SyncTracker(f"tiled::sm90::group_sync<{self.threads}>")
        return SyncTracker(f"tiled::sm90::consumer_sync<{self.threads}>" if producer else None)

    @property
    def requires(self) -> list:
        """Launch preconditions (manifest expressions that must evaluate to 0) of the TMA
        descriptors the kernel takes (tma)."""
        plan = self.attn or self.wsloop
        return list(plan.requires) if plan is not None else []

    # -- planning ------------------------------------------------------------------------------
    def copy_vector(self, c: pb.Copy) -> int:
        return async_vector(self, c)

    def statements(self):
        """Every statement of the kernel body, in program order."""
        return walk(self.program.kernel.body)

    def plan(self) -> None:
        """Lays out the shared pool (pool.plan_pool)."""
        plan_pool(self)

    def gemm_scratch_bytes(self, _low, g: pb.Gemm) -> int:
        """Shared scratch bytes T.gemm `g` needs (its staged and converted operands)."""
        return stage_bytes(self, g)

    def copy_scratch_bytes(self, _low, c: pb.Copy) -> int:
        """Shared scratch bytes T.copy `c` needs (a fragment moved between layouts)."""
        return copy_scratch_bytes(self, c)

    def shfl_xor(self, dtype: str, value, mask: int):
        """`value` of lane (lane ^ mask) of the calling thread's warp (every lane calls)."""
        return T.call_extern(dtype, "__shfl_xor_sync", tirx.const(0xFFFFFFFF, "uint32"), value,
                             mask)

    def shfl_idx(self, dtype: str, value, lane):
        """`value` of lane `lane` of the calling thread's warp (every lane calls)."""
        return T.call_extern(dtype, "__shfl_sync", tirx.const(0xFFFFFFFF, "uint32"), value,
                             lane)

    def warp_allreduce(self, kind: int, part, combine) -> None:
        """Combines local buffer `part` (one element) over the lanes of each warp with
        `combine` (a reduction of `kind`): an xor butterfly; every lane gets the result."""
        for mask in (self.warp_size >> k for k in range(1, self.warp_size.bit_length())):
            T.buffer_store(part, combine(part[0], self.shfl_xor(part.dtype, part[0], mask)), [0])

    def scratch(self, dtype: str, numel: int, offset: int = 0, shape=None):
        """A view of the shared scratch area (`offset` bytes in) as `numel` elements, or as a
        tile of `shape`. Its users go through the SyncTracker like any shared access."""
        return T.decl_buffer(shape or (numel,), dtype, data=self.pool.data,
                             elem_offset=(self.scratch_offset + offset) // dtypes.nbytes(dtype))

    def uses_scratch(self, st: pb.Stmt) -> bool:
        """Whether tile op `st` reads and writes the shared scratch area (beyond its operands)."""
        return uses_scratch(self, st)

    # -- statements --------------------------------------------------------------------------
    def stmt(self, s: pb.Stmt) -> None:
        kind = s.WhichOneof("kind")
        try:
            getattr(self, "stmt_" + kind)(getattr(s, kind), s)
        except CompileError as e:
            if not e.loc and loc_of(s):
                raise CompileError(e.message, loc_of(s)) from None
            raise

    def placed_elsewhere(self) -> set[int]:
        """Shared tiles the pool plan leaves out (the explicit path's panel tiles)."""
        return set()

    def declare_tensor_maps(self) -> None:
        """Declares kernel parameters beyond the program's: the TMA descriptors of the
        T.Pipelined ring (ws_loop.py; the explicit path declares its own)."""
        if self.wsloop is not None:
            declare_ring_maps(self)

    @property
    def smem_limit(self) -> int:
        """Bytes of shared memory a block may use."""
        return MAX_SMEM[self.arch]

    def lower_body(self) -> None:
        if self.wsloop is not None:
            return lower_ws_body(self, [self.expr(g) for g in self.program.kernel.grid])
        return self.lower_statements()

    def lower_statements(self) -> None:
        """The kernel body's statements, a barrier before each where tiles start that take
        the bytes of tiles used before it (pool.place_tiles, overlaid)."""
        body = self.program.kernel.body
        if not self.reuses or body.WhichOneof("kind") != "seq":
            return self.stmt(body)
        self.stmt_list(body.seq.stmts, {self.lifetimes[bid][0] for bid in self.reuses})

    def effects(self, s: pb.Stmt) -> tuple[bool, bool]:
        return shared_effects(s, self.buffers, self.uses_scratch)

    def stmt_seq(self, seq, _s):
        self.stmt_list(seq.stmts)

    def stmt_list(self, sts, barrier_before: set[int] = frozenset()) -> None:
        """Statements in order, a barrier before those at `barrier_before`; a wgmma gemm
        that the next one continues (chains_wgmma) is left in flight for that one's wait."""
        for i, st in enumerate(sts):
            if i in barrier_before:
                self.sync.sync()
            chained = self.wsloop is None and not self.in_flight and i + 1 < len(sts) and \
                i + 1 not in barrier_before and chains_wgmma(self, st, sts[i + 1])
            self.in_flight = chained  # the next gemm's wait retires this one too
            try:
                self.stmt(st)
            finally:
                self.in_flight = False

    def uniform_stmt(self, s: pb.Stmt) -> None:
        self.sync.before(*self.effects(s))

    def stmt_for_(self, f, s):
        if f.kind == pb.PARALLEL:
            self.uniform_stmt(s)
            self.sync.suspended += 1
            try:
                return lower_parallel(self, s)
            finally:
                self.sync.suspended -= 1
        if f.var in self.pipelines:
            return lower_pipeline(self, f, s)
        if self.wsloop is not None and f.var == self.wsloop.loop.var:
            return lower_ring_consumer(self, f)
        if self.attn is not None and f.var == self.attn.loop.var:
            return lower_attn_loop(self, f)
        extent = self.expr(f.extent)
        kind = T.unroll if f.kind == pb.UNROLL and isinstance(extent, tirx.IntImm) else T.serial
        if f.kind == pb.VECTORIZED and isinstance(extent, tirx.IntImm):
            kind = T.vectorized if self.vectorizable(f, extent.value) else \
                T.unroll if extent.value <= VECTOR_LIMIT else T.serial
        reads, writes = self.effects(f.body)
        tracker = self.sync
        if (writes and (tracker.pending_read or tracker.pending_write)) or \
                (reads and tracker.pending_write):
            tracker.sync()  # once before the loop, not in every iteration of its body
        with kind(0, extent) as v:
            self.vars[f.var] = v
            self.stmt(f.body)
            if writes:
                sync_next_iteration(self)
        if not self.sync.suspended:
            if writes:
                self.sync.pending_read = self.sync.pending_write = False
            self.sync.pending_read |= reads

    def vectorizable(self, f: pb.For, lanes: int) -> bool:
        """Whether T.vectorized loop `f` becomes vector lanes (passes.vectorize.vector_lanes_ok, and
        the rows of the shared tiles it widens are whole vectors; no barrier inside)."""
        if not vector_lanes_ok(f, lanes, self.buffers):
            return False
        if self.effects(f.body)[1] and not self.sync.suspended:
            return False
        return all(self.buffers[bid].scope != pb.SHARED or f.var not in expr_vars(idx)
                   or self.shared[bid].stride % lanes == 0
                   for bid, idx in element_accesses(f.body))

    def stmt_if_then_else(self, node, s):
        with T.If(self.expr(node.cond)):
            with T.Then():
                saved = (self.sync.pending_read, self.sync.pending_write)
                self.stmt(node.then_body)
                after_then = (self.sync.pending_read, self.sync.pending_write)
            if node.HasField("else_body"):
                with T.Else():
                    self.sync.pending_read, self.sync.pending_write = saved
                    self.stmt(node.else_body)
        self.sync.pending_read |= after_then[0] or saved[0]
        self.sync.pending_write |= after_then[1] or saved[1]

    def stmt_store(self, st, s):
        self.uniform_stmt(s)
        scope = self.buffers[st.buffer].scope
        # Outside T.Parallel every thread runs a statement. A shared element, or a global one
        # the value reads back (`Out[bx] += v`), is then updated by one thread, as the
        # program means: the threads of a read-modify-write would race. (A global element
        # stored with a value that does not read it gets the same value from each thread.)
        once = not self.nest_vars and not self.sync.suspended and (
            scope == pb.SHARED or (scope == pb.GLOBAL and any(
                e.WhichOneof("kind") == "load" and e.load.buffer == st.buffer
                for e in subexprs(st.value))))
        with self.single_thread() if once else contextlib.nullcontext():
            self.store(st.buffer, self.expr(st.value), [self.expr(i) for i in st.indices],
                       list(st.indices))
        if once and scope == pb.GLOBAL:  # the other threads may read it next
            self.sync.sync()

    def stmt_atomic_add(self, st, s):
        lower_atomic(self, st, s)

    @contextlib.contextmanager
    def single_thread(self):
        """Where one thread runs what follows: thread 0 outside T.Parallel; in a nest over a
        rows layout, whose 4 lanes of a quad each run every row they hold, one of them."""
        if self.nest_vars:
            with self.maybe_if(self.replica):
                yield
        else:
            with T.If(self.tx == 0), T.Then():
                yield

    @contextlib.contextmanager
    def loop(self, extent):
        """A loop over per-thread slots: unrolled when short and constant (register arrays
        must be indexed by constants to stay in registers)."""
        if isinstance(extent, int):
            extent = tirx.const(extent, "int32")
        kind = T.unroll if isinstance(extent, tirx.IntImm) and extent.value <= UNROLL_LIMIT \
            else T.serial
        with kind(0, extent) as v:
            yield v

    @contextlib.contextmanager
    def maybe_if(self, cond):
        if cond is None:
            yield
        else:
            with T.If(cond), T.Then():
                yield

    # -- tile ops ---------------------------------------------------------------------------
    def stmt_copy(self, c, s):
        if self.wsloop is not None and c.dst.buffer in self.wsloop.head_index:
            return wait_head(self, c.dst.buffer)  # the producer loads it (ws_loop.py)
        self.uniform_stmt(s)
        src_b, dst_b = self.buffers[c.src.buffer], self.buffers[c.dst.buffer]
        if self.attn is not None and c.dst.buffer == self.attn.q:
            return stmt_q_copy(self)
        if self.attn is not None and c.src.buffer == self.attn.o and store_attn_tile(self, c):
            return
        if store_accumulator(self, c):
            return
        vec = self.copy_vector(c)
        if vec:
            issue_async_copy(self, c, vec)
            T.evaluate(T.call_extern("void", "tiled::cp_async_commit"))
            T.evaluate(T.call_extern("void", "tiled::cp_async_wait<0>"))
            return
        if pb.FRAGMENT in (src_b.scope, dst_b.scope):
            return lower_fragment_copy(self, c)
        if convert_fp8_tile(self, c) or copy_by_vectors(self, c):
            return
        tile_shape = [e for e in c.src.extents if e != 1] or [1]
        numel = math.prod(tile_shape)
        n_iter = -(-numel // self.threads)
        with self.loop(n_iter) as it:
            flat = it * self.threads + self.tx
            tile = unravel(flat, tile_shape) if any(e != 1 for e in c.src.extents) else []
            with self.maybe_if(None if numel % self.threads == 0 else flat < numel):
                copy_element(self, c, tile)

    def stmt_fill(self, f, s):
        lower_fill(self, f, s)

    def stmt_grid_dependency(self, g, _s):
        """T.pdl_trigger / T.pdl_sync. A producer beside the program's threads waits at its
        own start (grid_walk.producer_waits_for_grid)."""
        grid_dependency(g.trigger)

    def stmt_gemm(self, g, s):
        if g.c in self.wgmma_ops.accumulators:
            return lower_wgmma(self, g, s)
        lower_gemm(self, g, s)

    def stmt_reduce(self, r, _s):
        lower_reduce(self, r)

    def stmt_scan(self, sc, _s):
        lower_scan(self, sc)

    # -- T.Pipelined ----------------------------------------------------------------------
