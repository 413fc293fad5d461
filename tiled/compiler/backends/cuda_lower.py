"""Lowers a Tile IR program to a CUDA kernel in TIR (classic style: explicit threads).

Execution model: every thread of the block runs the statements outside T.Parallel (so they must
be uniform: the same for all threads); a T.Parallel nest is split over the threads, following
the layout of the fragment it writes (cuda_layout.py); tile ops are lowered to cooperative code
or to calls into tiled_cuda.h. Shared memory is one dynamic pool; tiled places every shared
tile in it (pipelined tiles get `num_stages` copies) and inserts the barriers itself.
"""

from __future__ import annotations

import contextlib
import math

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tiled.compiler.backends.cuda_layout import (
    MmaLayout,
    ReplicatedLayout,
    WgmmaRows,
    body_statements,
    infer_layouts,
    is_identity,
    parallel_nest,
    ravel,
    stores,
    unravel,
    walk,
)
from tiled.compiler.backends.cuda_plan import (
    CTYPE,
    SharedTile,
    SyncTracker,
    align_up,
    and_all,
    multiple_of,
    shared_effects,
    unravel_dyn,
)
from tiled.compiler.backends.cuda_sm90 import (
    PRODUCER_THREADS,
    find_ws_gemm,
    lower_ws_consumer,
    lower_ws_kernel,
    store_ws_tile,
)
from tiled.compiler.backends.cuda_sm90_attn import (
    find_ws_attention,
    lower_attn_kernel,
    lower_attn_loop,
    stmt_q_copy,
    store_attn_tile,
    tmap_params,
)
from tiled.compiler.tir import ExprLowering, declare_params, loc_of, tvm_dtype
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.v1 import tile_ir_pb2 as pb

_IDENTITY = {pb.REDUCE_SUM: lambda dt: tirx.const(0, dt),
             pb.REDUCE_MAX: lambda dt: tirx.min_value(dt),
             pb.REDUCE_MIN: lambda dt: tirx.max_value(dt)}
_COMBINE = {pb.REDUCE_SUM: lambda a, b: a + b, pb.REDUCE_MAX: tirx.Max, pb.REDUCE_MIN: tirx.Min}
UNROLL_LIMIT = 256


class CudaLowering(ExprLowering):
    explicit = False  # the explicit sm_90a path (cuda_explicit.ExplicitLowering)
    tid_base = 0  # the first thread running the current statement (a T.ws region's)

    def __init__(self, program: Program, arch: str = "sm_80", warp_specialize: bool = True):
        super().__init__(program)
        p = self.program
        self.threads = p.kernel.threads  # the program's threads (consumers on the sm90 path)
        hopper = arch == "sm_90a" and warp_specialize
        self.attn = find_ws_attention(p) if hopper else None
        self.layouts = infer_layouts(p, self.attn.accumulators() if self.attn else None)
        self.ws = find_ws_gemm(p, self.layouts) if hopper and not self.attn else None
        self.launch_threads = self.threads
        self.tensor_maps: dict[str, dict] = {}  # kernel parameter -> tensor_map recipe
        self.param_of = {prm.buffer: i for i, prm in enumerate(p.params)  # tensor -> param #
                         if prm.WhichOneof("kind") == "buffer"}
        if self.ws is not None:
            mma = self.layouts[self.ws.c]
            for bid, lay in self.layouts.items():  # fragments that followed the accumulator
                if lay == mma:
                    self.layouts[bid] = self.ws.layout
            self.launch_threads = self.threads + PRODUCER_THREADS
            self.ws_offset = 0
        if self.attn is not None:
            self.launch_threads = self.threads + PRODUCER_THREADS
            self.ws_offset = 0
        self.tir: dict[int, tirx.Buffer] = {}
        self.shared: dict[int, SharedTile] = {}
        self.stage: dict[int, tirx.PrimExpr] = {}  # shared bid -> current stage index
        self.frag_bind: dict[int, tirx.PrimExpr] = {}  # fragment bid -> local slot in a nest
        self.frag_row = None  # (anchor layout, its slot) of the T.Parallel nest being lowered
        self.nest_vars: list[int] = []
        self.sync = SyncTracker(None if self.ws is None and self.attn is None else
                                f"tiled::sm90::consumer_sync<{self.threads}>")
        self.tx = None
        self.pool = None
        self.pool_bytes = 0
        self.scratch_offset = 0
        self.pipelines: dict[int, tuple[int, list[int]]] = {}  # For var -> (stages, producers)
        self.vec_plan: dict[tuple, int] = {}

    @property
    def requires(self) -> list:
        """Launch preconditions (manifest expressions that must evaluate to 0) of the TMA
        descriptors the kernel takes (cuda_tma)."""
        plan = self.ws or self.attn
        return list(plan.requires) if plan is not None else []

    # -- planning ------------------------------------------------------------------------------
    def copy_vector(self, c: pb.Copy) -> int:
        """Elements per 16/8/4-byte async copy for a global->shared copy, or 0 when the copy
        cannot be done with aligned vectors (then it is an element-wise synchronous copy)."""
        src, dst = self.buffers[c.src.buffer], self.buffers[c.dst.buffer]
        if src.scope != pb.GLOBAL or dst.scope != pb.SHARED or src.dtype != dst.dtype:
            return 0
        if c.src.extents[-1] == 1 or c.dst.extents[-1] == 1:
            return 0
        if any(d.WhichOneof("kind") == "var" for d in list(src.shape)[1:]):
            return 0
        esize = dtypes.nbytes(src.dtype)
        for nbytes in (16, 8, 4):
            vec = nbytes // esize
            if vec < 1 or nbytes % esize:
                continue
            if (c.src.extents[-1] % vec == 0 and src.shape[-1].size % vec == 0
                    and multiple_of(c.src.offsets[-1], vec)
                    and multiple_of(c.dst.offsets[-1], vec)):
                return vec
        return 0

    def statements(self):
        """Every statement of the kernel body, in program order."""
        return walk(self.program.kernel.body)

    def plan(self) -> None:
        p = self.program
        gemm_operands, tma_tiles = set(), set()
        for st in self.statements():
            kind = st.WhichOneof("kind")
            if kind == "gemm" and isinstance(self.layouts.get(st.gemm.c), MmaLayout):
                gemm_operands |= {st.gemm.a, st.gemm.b}
            if kind == "copy" and st.copy.HasField("tma"):
                tma_tiles.add(st.copy.dst.buffer)
            if kind == "for_" and st.for_.kind == pb.PIPELINED and st.for_.num_stages >= 2 \
                    and not (self.ws and st.for_.var == self.ws.loop_var) \
                    and not (self.attn and st.for_.var == self.attn.loop.var):
                body = st.for_.body
                stmts = body_statements(body)
                producers = []
                for s in stmts:
                    if s.WhichOneof("kind") == "copy" and self.copy_vector(s.copy):
                        producers.append(s.copy.dst.buffer)
                    else:
                        break
                if producers:
                    self.pipelines[st.for_.var] = (st.for_.num_stages, producers)
        stages = {}
        for s_count, producers in self.pipelines.values():
            for bid in producers:
                stages[bid] = max(stages.get(bid, 1), s_count)
        offset = 0
        ring_tiles = {self.ws.a, self.ws.b} if self.ws else \
            self.attn.ring_tiles if self.attn else set()
        for b in p.buffers:
            if b.scope != pb.SHARED or b.id in ring_tiles or b.id in self.placed_elsewhere():
                continue
            shape = [d.size for d in b.shape]
            cols = shape[-1]
            rows = math.prod(shape[:-1])
            # TMA writes dense rows (no swizzle on the explicit path): its tiles get no pad.
            pad = 8 if b.id in gemm_operands and dtypes.nbytes(b.dtype) == 2 and \
                len(shape) >= 2 and b.id not in tma_tiles else 0
            tile = SharedTile(rows, cols, cols + pad, stages.get(b.id, 1), offset,
                              dtypes.canonical_name(b.dtype))
            self.shared[b.id] = tile
            offset = align_up(offset + tile.nbytes)
        if self.ws is not None:
            self.ws_offset, offset = offset, align_up(offset + self.ws.ring_bytes)
        if self.attn is not None:
            self.ws_offset, offset = offset, align_up(offset + self.attn.ring_bytes)
        self.scratch_offset = offset
        scratch = 0
        for st in self.statements():
            if st.WhichOneof("kind") == "reduce":
                src = self.buffers[st.reduce.src]
                dst = self.buffers[st.reduce.dst]
                if not isinstance(self.layouts.get(src.id), ReplicatedLayout) and \
                        not isinstance(self.layouts.get(dst.id), WgmmaRows):
                    n = math.prod(d.size for d in src.shape) + math.prod(d.size for d in dst.shape)
                    scratch = max(scratch, n * 4)
        self.pool_bytes = offset + align_up(scratch) if scratch else offset

    # -- buffers ---------------------------------------------------------------------------
    def shared_index(self, bid: int, indices: list) -> list:
        tile = self.shared[bid]
        shape = [d.size for d in self.buffers[bid].shape]
        row = ravel(indices[:-1], shape[:-1]) if len(shape) > 1 else tirx.const(0, "int32")
        stage = self.stage.get(bid)
        if stage is not None:
            row = row + stage * tile.rows
        return [row, indices[-1]]

    def frag_slot(self, bid: int, indices: list, ir_indices=None):
        lay = self.layouts[bid]
        if bid in self.frag_bind and ir_indices is not None and \
                is_identity(ir_indices, self.nest_vars):
            return self.frag_bind[bid]
        if isinstance(lay, ReplicatedLayout):
            return ravel(indices, list(lay.shape))
        if isinstance(lay, WgmmaRows) and self.frag_row is not None and ir_indices is not None \
                and is_identity(ir_indices, self.nest_vars[:1]):
            anchor, idx = self.frag_row  # m[i] over the anchor's row i: same thread
            if anchor.rows() == lay:
                return anchor.row_slot(idx)
        raise CompileError(f"fragment {self.buffers[bid].name} is spread over threads here; "
                           "it can only be indexed by the variables of its T.Parallel loop")

    def access(self, bid: int, indices: list, ir_indices=None):
        """(TIR buffer, TIR indices) of a logical element access."""
        scope = self.buffers[bid].scope
        if scope == pb.SHARED:
            return self.tir[bid], self.shared_index(bid, indices)
        if scope == pb.FRAGMENT:
            return self.tir[bid], [self.frag_slot(bid, indices, ir_indices)]
        return self.tir[bid], indices

    def load(self, bid, indices, ir_indices=None):
        buf, idx = self.access(bid, indices, ir_indices)
        return buf[tuple(idx)]

    def expr(self, e):
        if e.WhichOneof("kind") == "call" and e.call.op == pb.EXP2 and \
                dtypes.canonical_name(e.dtype) == "float32":
            return T.call_extern("float32", "tiled::exp2_approx", self.expr(e.call.args[0]))
        if e.WhichOneof("kind") == "load":
            return self.load(e.load.buffer, [self.expr(i) for i in e.load.indices],
                             list(e.load.indices))
        return super().expr(e)

    def store(self, bid, value, indices, ir_indices=None):
        buf, idx = self.access(bid, indices, ir_indices)
        if str(value.ty) != buf.dtype:
            value = tirx.Cast(buf.dtype, value)
        T.buffer_store(buf, value, idx)

    def addr(self, bid: int, indices: list):
        buf, idx = self.access(bid, indices)
        return T.address_of(buf[tuple(idx)])

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
        """Declares kernel parameters beyond the program's (the explicit path's TMA maps)."""

    def lower_body(self) -> None:
        self.stmt(self.program.kernel.body)

    def effects(self, s: pb.Stmt) -> tuple[bool, bool]:
        return shared_effects(s, self.buffers)

    def stmt_seq(self, seq, _s):
        for st in seq.stmts:
            self.stmt(st)

    def uniform_stmt(self, s: pb.Stmt) -> None:
        self.sync.before(*self.effects(s))

    def stmt_for_(self, f, s):
        if f.kind == pb.PARALLEL:
            self.uniform_stmt(s)
            self.sync.suspended += 1
            try:
                return self.lower_parallel(s)
            finally:
                self.sync.suspended -= 1
        if f.var in self.pipelines:
            return self.lower_pipeline(f, s)
        if self.ws is not None and f.var == self.ws.loop_var:
            return lower_ws_consumer(self, f)
        if self.attn is not None and f.var == self.attn.loop.var:
            return lower_attn_loop(self, f)
        extent = self.expr(f.extent)
        kind = T.unroll if f.kind == pb.UNROLL and isinstance(extent, tirx.IntImm) else T.serial
        reads, writes = self.effects(f.body)
        with kind(0, extent) as v:
            self.vars[f.var] = v
            self.stmt(f.body)
            if writes:
                self.sync.sync()
        if not self.sync.suspended:
            if writes:
                self.sync.pending_read = self.sync.pending_write = False
            self.sync.pending_read |= reads

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
        self.store(st.buffer, self.expr(st.value), [self.expr(i) for i in st.indices],
                   list(st.indices))

    def stmt_atomic_add(self, st, s):
        self.uniform_stmt(s)
        # Outside T.Parallel every thread runs the statement: only one may add.
        with self.single_thread():
            addr = self.addr(st.buffer, [self.expr(i) for i in st.indices])
            value = self.expr(st.value)
            T.evaluate(T.call_extern(str(value.ty), "atomicAdd", addr, value))

    @contextlib.contextmanager
    def single_thread(self):
        if self.nest_vars:
            yield
        else:
            with T.If(self.tx == 0), T.Then():
                yield

    # -- T.Parallel ---------------------------------------------------------------------------
    def lower_parallel(self, s: pb.Stmt) -> None:
        from tiled.compiler.backends.cuda_layout import element_accesses

        nest, body = parallel_nest(s)
        loop_vars = [f.var for f in nest]
        extents = [self.expr(f.extent) for f in nest]
        if any(isinstance(e, tirx.IntImm) and e.value <= 0 for e in extents):
            return  # a nest that never runs (its extent folds to 0)
        static = [f.extent.int_value if f.extent.WhichOneof("kind") == "int_value" else None
                  for f in nest]
        anchor = None
        ident = []
        for bid, idx in element_accesses(body):
            if self.buffers[bid].scope == pb.FRAGMENT and is_identity(idx, loop_vars) and \
                    not isinstance(self.layouts[bid], ReplicatedLayout):
                anchor = anchor or self.layouts[bid]
                if bid not in ident:
                    ident.append(bid)
        outer_vars = self.nest_vars
        if anchor is not None:
            with self.loop(anchor.local_size) as idx:
                coords, valid = anchor.coords(self.tx, idx)
                for v, c in zip(loop_vars, coords, strict=True):
                    self.vars[v] = c
                self.frag_bind = {b: idx for b in ident}
                self.nest_vars = loop_vars
                self.frag_row = (anchor, idx) if hasattr(anchor, "row_slot") else None
                with self.maybe_if(valid):
                    self.stmt(body)
                self.frag_bind, self.nest_vars, self.frag_row = {}, outer_vars, None
            return
        writes_replicated = any(
            self.buffers[b].scope in (pb.FRAGMENT, pb.LOCAL)
            for b, _ in stores(body))
        if writes_replicated:
            # Every thread needs the values (replicated tiles): each runs the whole nest.
            with contextlib.ExitStack() as stack:
                for v, e in zip(loop_vars, extents, strict=True):
                    self.vars[v] = stack.enter_context(T.serial(0, e))
                self.stmt(body)
            return
        total = extents[0]
        for e in extents[1:]:
            total = total * e
        n_iter = tirx.floordiv(total + self.threads - 1, self.threads)
        exact = all(x is not None for x in static) and math.prod(static) % self.threads == 0
        with self.loop(n_iter) as it:
            flat = it * self.threads + self.tx
            for v, c in zip(loop_vars, unravel_dyn(flat, extents), strict=True):
                self.vars[v] = c
            self.nest_vars = loop_vars
            with self.maybe_if(None if exact else flat < total):
                self.stmt(body)
            self.nest_vars = outer_vars

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
        self.uniform_stmt(s)
        src_b, dst_b = self.buffers[c.src.buffer], self.buffers[c.dst.buffer]
        if self.ws is not None and c.src.buffer == self.ws.c and store_ws_tile(self, c):
            return
        if self.attn is not None and c.dst.buffer == self.attn.q:
            return stmt_q_copy(self)
        if self.attn is not None and c.src.buffer == self.attn.o and store_attn_tile(self, c):
            return
        vec = self.copy_vector(c)
        if vec:
            self.issue_async_copy(c, vec)
            T.evaluate(T.call_extern("void", "tiled::cp_async_commit"))
            T.evaluate(T.call_extern("void", "tiled::cp_async_wait<0>"))
            return
        frag = c.src.buffer if src_b.scope == pb.FRAGMENT else \
            c.dst.buffer if dst_b.scope == pb.FRAGMENT else None
        if frag is not None:
            region = c.src if frag == c.src.buffer else c.dst
            shape = [d.size for d in self.buffers[frag].shape]
            if list(region.extents) != shape or not all(
                    o.WhichOneof("kind") == "int_value" and o.int_value == 0
                    for o in region.offsets):
                raise CompileError("T.copy of part of a fragment is not supported on cuda; "
                                   "copy the whole fragment")
            lay = self.layouts[frag]
            with self.loop(lay.local_size) as idx:
                coords, valid = lay.coords(self.tx, idx)
                tile = [x for x, d in zip(coords, shape, strict=True) if d != 1]
                with self.maybe_if(valid):
                    self.copy_element(c, tile, frag, idx)
            return
        tile_shape = [e for e in c.src.extents if e != 1] or [1]
        numel = math.prod(tile_shape)
        n_iter = -(-numel // self.threads)
        with self.loop(n_iter) as it:
            flat = it * self.threads + self.tx
            tile = unravel(flat, tile_shape) if any(e != 1 for e in c.src.extents) else []
            with self.maybe_if(None if numel % self.threads == 0 else flat < numel):
                self.copy_element(c, tile, None, None)

    def copy_element(self, c, tile, frag, slot):
        src_idx, src_conds = self.region_index(c.src, tile)
        dst_idx, dst_conds = self.region_index(c.dst, tile)
        value = self.tir[frag][slot] if frag == c.src.buffer else \
            self.load(c.src.buffer, src_idx)
        ok = and_all(src_conds)
        if ok is not None:
            value = tirx.if_then_else(ok, value, tirx.const(0, str(value.ty)))
        dst_ok = and_all(dst_conds)
        with self.maybe_if(dst_ok):
            if frag == c.dst.buffer:
                buf = self.tir[frag]
                T.buffer_store(buf, tirx.Cast(buf.dtype, value), [slot])
            else:
                self.store(c.dst.buffer, value, dst_idx)

    def issue_async_copy(self, c: pb.Copy, vec: int, pred=None) -> None:
        src = self.buffers[c.src.buffer]
        nbytes = vec * dtypes.nbytes(src.dtype)
        tile_shape = [e for e in c.src.extents if e != 1]
        numel = math.prod(tile_shape)
        nvec = numel // vec
        n_iter = -(-nvec // self.threads)
        with self.loop(n_iter) as it:
            v = it * self.threads + self.tx
            with self.maybe_if(None if nvec % self.threads == 0 else v < nvec):
                tile = unravel(v * vec, tile_shape)
                src_idx, conds = self.region_index(c.src, tile)
                dst_idx, _ = self.region_index(c.dst, tile)
                ok = and_all(conds + ([pred] if pred is not None else []))
                T.evaluate(T.call_extern(
                    "void", f"tiled::cp_async<{nbytes}>", self.addr(c.dst.buffer, dst_idx),
                    T.address_of(self.tir[c.src.buffer][tuple(src_idx)]),
                    ok if ok is not None else tirx.const(True, "bool")))

    def stmt_fill(self, f, s):
        self.uniform_stmt(s)
        b = self.buffers[f.dst.buffer]
        value = self.expr(f.value)
        if b.scope == pb.FRAGMENT:
            buf = self.tir[b.id]
            with self.loop(self.layouts[b.id].local_size) as idx:
                T.buffer_store(buf, value, [idx])
            return
        if b.scope == pb.LOCAL:
            shape = [e for e in f.dst.extents if e != 1] or [1]
            with contextlib.ExitStack() as stack:
                vs = [stack.enter_context(T.serial(0, e)) for e in shape]
                vs = vs if any(e != 1 for e in f.dst.extents) else []
                idx, _ = self.region_index(f.dst, vs)
                self.store(b.id, value, idx)
            return
        shape = [e for e in f.dst.extents if e != 1] or [1]
        numel = math.prod(shape)
        with self.loop(-(-numel // self.threads)) as it:
            flat = it * self.threads + self.tx
            with self.maybe_if(None if numel % self.threads == 0 else flat < numel):
                tile = unravel(flat, shape) if any(e != 1 for e in f.dst.extents) else []
                idx, conds = self.region_index(f.dst, tile)
                with self.maybe_if(and_all(conds)):
                    self.store(b.id, value, idx)

    def stmt_gemm(self, g, s):
        self.uniform_stmt(s)
        a, b, c = (self.buffers[x] for x in (g.a, g.b, g.c))
        if a.scope != pb.SHARED or b.scope != pb.SHARED:
            raise CompileError("T.gemm on cuda takes A and B from shared memory (copy a "
                               "fragment operand to a T.alloc_shared tile first)")
        lay = self.layouts[g.c]
        acc = self.tir[g.c]
        if g.clear_accum:
            with self.loop(lay.local_size) as idx:
                T.buffer_store(acc, tirx.const(0, acc.dtype), [idx])
        M, N = (d.size for d in c.shape)
        K = a.shape[-2].size if g.transpose_a else a.shape[-1].size
        ta, tb = str(g.transpose_a).lower(), str(g.transpose_b).lower()
        lda, ldb = self.shared[g.a].stride, self.shared[g.b].stride
        # A staged operand (A_s[s, :, :]) starts at its leading indices.
        pa = self.addr(g.a, [self.expr(i) for i in g.a_index] + [tirx.const(0, "int32")] * 2)
        pbuf = self.addr(g.b, [self.expr(i) for i in g.b_index] + [tirx.const(0, "int32")] * 2)
        base = f", {self.tid_base}" if self.tid_base else ""
        pc = T.address_of(acc[0])
        if isinstance(lay, MmaLayout):
            name = (f"tiled::gemm_ss<{CTYPE[dtypes.canonical_name(a.dtype)]}, {M}, {N}, {K}, "
                    f"{lay.warp_m}, {lay.warp_n}, {ta}, {tb}, {lda}, {ldb}{base}>")
        else:
            ct = [CTYPE.get(dtypes.canonical_name(x.dtype)) for x in (a, b, c)]
            if None in ct:
                raise CompileError(f"T.gemm on cuda does not support dtypes "
                                   f"{[dtypes.canonical_name(x.dtype) for x in (a, b, c)]}")
            name = (f"tiled::gemm_ss_simt<{ct[0]}, {ct[1]}, {ct[2]}, {M}, {N}, {K}, "
                    f"{self.threads}, {ta}, {tb}, {lda}, {ldb}{base}>")
        T.evaluate(T.call_extern("void", name, pa, pbuf, pc))

    def stmt_reduce(self, r, s):
        src_b = self.buffers[r.src]
        shape = [d.size for d in src_b.shape]
        keep = [d for i, d in enumerate(shape) if i != r.dim]
        n_out, depth = math.prod(keep), shape[r.dim]
        dst = self.tir[r.dst]
        acc_dt = dst.dtype
        src_lay = self.layouts.get(r.src)

        if isinstance(self.layouts.get(r.dst), WgmmaRows):
            return self.reduce_rows(r)

        def src_index(o, k):
            coords = unravel(o, keep) if keep else []
            coords.insert(r.dim, k)
            return coords

        if (src_b.scope == pb.FRAGMENT and not isinstance(src_lay, ReplicatedLayout)) or \
                src_b.scope == pb.SHARED:
            self.sync.before(True, True)
            scratch = T.decl_buffer((n_out * depth + n_out,), acc_dt, data=self.pool.data,
                                    elem_offset=self.scratch_offset // dtypes.nbytes(acc_dt))
            if src_b.scope == pb.FRAGMENT:
                with self.loop(src_lay.local_size) as idx:
                    coords, valid = src_lay.coords(self.tx, idx)
                    with self.maybe_if(valid):
                        T.buffer_store(scratch, tirx.Cast(acc_dt, self.tir[r.src][idx]),
                                       [ravel(coords, shape)])
                self.sync.sync()
                read = lambda o, k: scratch[ravel(src_index(o, k), shape)]  # noqa: E731
            else:
                read = lambda o, k: tirx.Cast(acc_dt, self.load(r.src, src_index(o, k)))  # noqa: E731
            with self.loop(-(-n_out // self.threads)) as it:
                o = it * self.threads + self.tx
                with self.maybe_if(None if n_out % self.threads == 0 else o < n_out):
                    tmp = T.alloc_buffer((1,), acc_dt, scope="local")
                    T.buffer_store(tmp, _IDENTITY[r.kind](acc_dt), [0])
                    with T.serial(0, depth) as k:
                        T.buffer_store(tmp, _COMBINE[r.kind](tmp[0], read(o, k)), [0])
                    T.buffer_store(scratch, tmp[0], [n_out * depth + o])
            self.sync.sync()
            with self.loop(n_out) as o:
                v = scratch[n_out * depth + o]
                T.buffer_store(dst, v if r.clear else _COMBINE[r.kind](dst[o], v), [o])
            self.sync.pending_read = True
            return
        # Replicated (or local) source: every thread reduces on its own copy.
        with self.loop(n_out) as o:
            tmp = T.alloc_buffer((1,), acc_dt, scope="local")
            T.buffer_store(tmp, _IDENTITY[r.kind](acc_dt) if r.clear else dst[o], [0])
            with T.serial(0, depth) as k:
                v = self.tir[r.src][ravel(src_index(o, k), shape)]
                T.buffer_store(tmp, _COMBINE[r.kind](tmp[0], tirx.Cast(acc_dt, v)), [0])
            T.buffer_store(dst, tmp[0], [o])

    def reduce_rows(self, r: pb.Reduce) -> None:
        """A row reduction into a rows layout: each thread combines the elements of its rows
        it holds (a balanced tree), then the quad holding each row exchanges partials."""
        src, dst = self.tir[r.src], self.tir[r.dst]
        lay, rows = self.layouts[r.src], self.layouts[r.dst]
        combine, dt = _COMBINE[r.kind], dst.dtype
        for slot in range(rows.local_size):
            vals = [tirx.Cast(dt, src[i]) if src.dtype != dt else src[i]
                    for i in lay.row_members(slot)]
            while len(vals) > 1:
                vals = [combine(vals[j], vals[j + 1]) if j + 1 < len(vals) else vals[j]
                        for j in range(0, len(vals), 2)]
            part = T.alloc_buffer((1,), dt, scope="local")
            T.buffer_store(part, vals[0], [0])
            for mask in rows.QUAD_MASKS:
                other = T.call_extern(dt, "__shfl_xor_sync", tirx.const(0xFFFFFFFF, "uint32"),
                                      part[0], mask)
                T.buffer_store(part, combine(part[0], other), [0])
            T.buffer_store(dst, part[0] if r.clear else combine(dst[slot], part[0]), [slot])

    # -- T.Pipelined ----------------------------------------------------------------------
    def lower_pipeline(self, f: pb.For, s: pb.Stmt) -> None:
        stages, producers = self.pipelines[f.var]
        body = body_statements(f.body)
        prod_stmts, rest = body[:len(producers)], body[len(producers):]
        n = self.expr(f.extent)
        # The first stages are in flight before the loop starts.
        self.sync.before(False, True)
        with T.unroll(0, stages - 1) as st:
            self.vars[f.var] = st
            for bid in producers:
                self.stage[bid] = st
            for ps in prod_stmts:
                self.issue_async_copy(ps.copy, self.copy_vector(ps.copy), pred=st < n)
            T.evaluate(T.call_extern("void", "tiled::cp_async_commit"))
        with T.serial(0, n) as k:
            ahead = k + (stages - 1)
            self.vars[f.var] = ahead
            for bid in producers:
                self.stage[bid] = tirx.floormod(ahead, stages)
            for ps in prod_stmts:
                self.issue_async_copy(ps.copy, self.copy_vector(ps.copy), pred=ahead < n)
            T.evaluate(T.call_extern("void", "tiled::cp_async_commit"))
            T.evaluate(T.call_extern("void", f"tiled::cp_async_wait<{stages - 1}>"))
            self.sync.sync()
            self.vars[f.var] = k
            for bid in producers:
                self.stage[bid] = tirx.floormod(k, stages)
            for st_ in rest:
                self.stmt(st_)
            # The next iteration overwrites the stage read here.
            self.sync.sync()
        for bid in producers:
            self.stage.pop(bid, None)
        T.evaluate(T.call_extern("void", "tiled::cp_async_wait<0>"))
        self.sync.pending_read = self.sync.pending_write = False


def lower_cuda(program: Program, arch: str = "sm_80", warp_specialize: bool = True,
               cluster: int = 0) -> tuple[object, CudaLowering]:
    """Returns (IRModule, the lowering) for `program`; the lowering holds the pool size, the
    launch's thread count and the TMA descriptors the kernel takes (sm_90a path). `cluster`:
    the sm_90a path's cluster size, 0 for the plan's choice (WsGemmPlan.with_cluster)."""
    import tvm

    from tiled.compiler.backends.cuda_explicit import ExplicitLowering
    from tiled.ir.verify_ws import explicit_statement

    p = program.proto
    cls = ExplicitLowering if explicit_statement(p) is not None else CudaLowering
    low = cls(program, arch, warp_specialize)
    if low.ws is not None:
        low.ws = low.ws.with_cluster(cluster)
    low.plan()
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(p.name)
            T.func_attr({"tirx.noalias": True, "global_symbol": p.name})
            for bid, buf in declare_params(program, low).items():
                low.tir[bid] = buf
            tmaps = []
            if low.ws is not None:
                ws = low.ws
                for name, cp, box in (("tiled_tmap_a", ws.copy_a, ws.box_a),
                                      ("tiled_tmap_b", ws.copy_b, ws.box_b)):
                    tmaps.append(T.arg(name, T.handle()))
                    low.tensor_maps[name] = {"kind": "tensor_map",
                                             "param": low.param_of[cp.src.buffer],
                                             "box": box,
                                             "swizzle": 128}
            attn_maps = {}
            if low.attn is not None:
                for key, name, recipe in tmap_params(low):
                    attn_maps[key] = T.arg(name, T.handle())
                    low.tensor_maps[name] = recipe
            low.declare_tensor_maps()
            grid = [low.expr(g) for g in p.kernel.grid]
            frames = contextlib.ExitStack()
            with frames:
                if low.ws is None and not (low.attn and low.attn.persistent):
                    for i, (g, vid) in enumerate(zip(grid, p.kernel.block_vars, strict=True)):
                        bv = T.env_thread(("blockIdx.x", "blockIdx.y", "blockIdx.z")[i])
                        frames.enter_context(T.launch_thread(bv, g))
                        low.vars[vid] = bv
                else:  # persistent: one block per SM at most, walking the program's blocks
                    bv = T.env_thread("blockIdx.x")
                    # The real count, min(blocks, SMs), is known only at launch (the runtime
                    # binds tiled_sm_count); TVM needs only an upper bound here.
                    frames.enter_context(T.launch_thread(bv, tirx.const(2**31 - 1, "int32")))
                    low.block_x = bv
                tx = T.env_thread("threadIdx.x")
                frames.enter_context(T.launch_thread(tx, low.launch_threads))
                low.tx = tx
                if low.pool_bytes:
                    low.pool = T.alloc_buffer((low.pool_bytes,), "uint8", scope="shared.dyn")
                for b in p.buffers:
                    if b.scope == pb.SHARED and b.id not in low.shared:
                        continue  # a ring tile of the sm90 path: only TMA and wgmma see it
                    if b.scope == pb.SHARED:
                        tile = low.shared[b.id]
                        low.tir[b.id] = T.decl_buffer(
                            (tile.stages * tile.rows, tile.stride), tvm_dtype(b.dtype),
                            data=low.pool.data,
                            elem_offset=tile.offset // dtypes.nbytes(b.dtype))
                    elif b.scope == pb.FRAGMENT:
                        low.tir[b.id] = T.alloc_buffer((low.layouts[b.id].local_size,),
                                                       tvm_dtype(b.dtype), scope="local")
                    elif b.scope == pb.LOCAL:
                        low.tir[b.id] = T.alloc_buffer([d.size for d in b.shape],
                                                       tvm_dtype(b.dtype), scope="local")
                if low.attn is not None:
                    lower_attn_kernel(low, attn_maps, grid)
                elif low.ws is None:
                    low.lower_body()
                else:
                    lower_ws_kernel(low, tmaps, grid)
    return tvm.IRModule({p.name: ib.get()}), low
