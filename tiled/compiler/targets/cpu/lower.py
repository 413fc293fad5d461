"""Tile IR -> TIR for the `cpu` backend (tiled.compiler.targets.cpu.backend).

Semantics on a CPU: the grid becomes one parallel loop over all blocks (TVM's parallel launch,
served by tiled's shim); within a block there is one thread, so every tile is a plain array,
T.Parallel is a serial loop nest, tile ops are loop nests, and T.Pipelined is a serial loop.
T.vectorized becomes TVM's vectorized loop where its body is plain stores over a short constant
extent, else a serial loop (which LLVM may still vectorize). T.Pipelined prefetches the tiles
its copies read later (prefetch.py); T.gemm calls the shim's microkernel (gemm.c); exp, exp2
and sigmoid are arithmetic that vectorizes (vmath.py), bfloat16 conversions bit operations
(bf16.py). Copies between a global tensor and a whole tile, and a tile computed only to be
reduced, are folded into the loops around them where that changes no value (forward.py).
Reductions and scans are reduce.py's; a reduction that reads a block's rows a second time
prefetches the next block's as it goes (prefetch.py). Atomics go through the shim (blocks run
on several threads).
"""

from __future__ import annotations

import contextlib
import functools

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.stmts import body_statements
from tiled.compiler.targets.cpu import forward, prefetch, skew, stream_out, vmath
from tiled.compiler.targets.cpu.native_bf16 import ATTR as NATIVE_BF16_ATTR
from tiled.compiler.targets.cpu.native_bf16 import to_bits as native_bf16_bits
from tiled.compiler.targets.cpu.prefetch import prefetch_ahead, prefetch_plan
from tiled.compiler.targets.cpu.reduce import ReduceLowering, loop_nest
from tiled.compiler.tir import (
    ExprLowering,
    declare_params,
    global_extent,
    loc_of,
    source_name,
    static_shape,
    tvm_dtype,
)
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.verify_ws import explicit_statement
from tiled.ir.walk import lanes_independent, stmt_exprs, subexprs
from tiled.v1 import tile_ir_pb2 as pb

# The dtypes the shim's atomics take (cpu_shim.c).
_ATOMIC_DTYPES = {
    pb.ATOMIC_ADD: ("float32", "float64", "int32", "int64"),
    pb.ATOMIC_MAX: ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                    "float16", "bfloat16", "float32", "float64"),
}
_ATOMIC_DTYPES[pb.ATOMIC_MIN] = _ATOMIC_DTYPES[pb.ATOMIC_MAX]
_VMATH = {pb.EXP: vmath.exp, pb.EXP2: vmath.exp2, pb.SIGMOID: vmath.sigmoid}
_ATOMIC_NAME = {pb.ATOMIC_ADD: "add", pb.ATOMIC_MAX: "max", pb.ATOMIC_MIN: "min"}
# Operand dtypes of the shim's float32-accumulating gemm (gemm.c's dtype codes).
_GEMM_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
_VECTOR_LANES = 64  # the longest T.vectorized loop lowered as TVM vector lanes
_EMULATED = (pb.BFLOAT16, pb.FLOAT8_E4M3, pb.FLOAT8_E5M2)  # floats lowered as their bits


def _vectorizable(f: pb.For) -> bool:
    """Whether TVM's vectorizer may run a T.vectorized loop as vector lanes with the loop's
    serial results. TVM's vectorizer assumes no dependence between iterations, so this holds
    only for bodies of plain stores (no guards, atomics or loops; no fp8 or bfloat16, whose
    conversions bind values with Let) whose iterations touch disjoint elements
    (tiled.ir.walk.lanes_independent). Anything else stays a serial loop."""
    body = f.body.seq.stmts if f.body.WhichOneof("kind") == "seq" else [f.body]
    return all(st.WhichOneof("kind") == "store" and not any(
        x.dtype in _EMULATED for e in stmt_exprs(st) for x in subexprs(e)) for st in body) \
        and lanes_independent(f)


class CpuLowering(ReduceLowering, ExprLowering):
    exact_fp8 = True  # TVM's LLVM float8 legalization misreads subnormals and NaN
    exact_bf16 = True  # its bfloat16 legalization misses conversions inside a Let's value

    def __init__(self, program: Program, vector_bytes: int = 16, vector_ldexp: bool = False,
                 native_bf16: bool = False):
        super().__init__(program)
        self.vector_ldexp = vector_ldexp  # vmath's 2^n through ldexp (levels.Codegen)
        self.native_bf16 = native_bf16  # float32 -> bfloat16 by instruction (native_bf16.py)
        self.used_native_bf16 = False
        self.tir_buffers: dict[int, tirx.Buffer] = {}
        # Partial results of a reduction: two vector registers of float32 on the target, one
        # where each element takes a long math function (reduce.py, ReduceLowering.lanes).
        self.reduce_lanes = max(4, vector_bytes // 2)
        self.vector_bytes = vector_bytes
        # Tiles read through the copy that filled them, stored through the copy that empties
        # them (forward.py): tile id -> that copy.
        self.copied_in: dict[int, pb.Copy] = {}
        self.copied_out: dict[int, pb.Copy] = {}
        # Tiles a reduction computes from the store of the loop that would have written them:
        # tile id -> (that loop's variables, its store, whether the tile is stored too).
        self.computed: dict[int, tuple[list[int], pb.Store, bool]] = {}
        # Copied-in tiles by how far their reads have got: read by a statement still being
        # lowered, by an earlier one (its rows are in the caches now), and those whose next
        # block's rows a pass has prefetched (prefetch.next_block_line).
        self.touched: set[int] = set()
        self.streamed: set[int] = set()
        self.prefetched: set[int] = set()
        # Block variable -> its value in the block after this one (lower_cpu).
        self.next_vars: dict[int, tirx.PrimExpr] = {}
        # Outputs that may stream (stream_out.py): buffer id -> the call's test; top-level
        # position -> the outputs its statement streams; the TBAA names of the aliases the
        # streaming statements store through.
        self.stream_ok: dict[int, tirx.Var] = {}
        self.stream_plan: dict[int, set[int]] = {}  # stream_out.plan
        self.stream_tags: list[str] = []

    @contextlib.contextmanager
    def next_block(self):
        """Expressions built inside read the block variables as the next block's."""
        saved = {v: self.vars[v] for v in self.next_vars}
        self.vars.update(self.next_vars)
        try:
            yield
        finally:
            self.vars.update(saved)

    def load(self, bid, indices):
        return self.element(bid, indices)

    def element(self, bid: int, indices: list) -> tirx.PrimExpr:
        """Element `indices` of buffer `bid`, as its TIR buffer holds it; a tile that is
        being read through its copy in reads the copy's source (0 out of its bounds)."""
        if bid in self.computed:
            # The loop's value reads the tile as it was (its own element, forward.full_write).
            loop_vars, st, keep = computed = self.computed.pop(bid)
            self.vars.update(zip(loop_vars, indices, strict=True))
            value = self.cast(self.expr(st.value), self.ir_dtype(bid), tvm_dtype(st.value.dtype))
            self.computed[bid] = computed
            if not keep:
                return value
            # Stored, then read back: LLVM forwards the value (one computation, one store).
            T.buffer_store(self.tir_buffers[bid], value, indices)
            return self.tir_buffers[bid][tuple(indices)]
        cp = self.copied_in.get(bid)
        if cp is None:
            return self.tir_buffers[bid][tuple(indices)]
        self.touched.add(bid)
        coords = forward.tile_coords(self.buffers[bid], indices)
        idx, ok = self.global_index(cp.src, coords)
        src = self.tir_buffers[cp.src.buffer]
        value = src[tuple(idx)]
        if ok is not None:
            value = tirx.if_then_else(ok, value, tirx.const(0, src.dtype))
        return self.cast(value, self.ir_dtype(bid), self.ir_dtype(cp.src.buffer))

    def global_index(self, region: pb.Region, coords: list):
        """region_index of a global region at tile coordinates, less the bounds it keeps
        whatever the block (a constant offset whose extent fits a static dim): a vector
        loop over the tile keeps a condition that does not depend on its lanes."""
        idx, _ = self.region_index(region, coords)
        buf = self.buffers[region.buffer]
        conds = []
        for d, (i, off, ext, dim) in enumerate(zip(idx, region.offsets, region.extents,
                                                   buf.shape, strict=True)):
            static = off.WhichOneof("kind") == "int_value" and dim.WhichOneof("kind") == "size"
            if static and off.int_value >= 0 and off.int_value + ext <= dim.size:
                continue
            if not self.nonnegative(off):
                conds.append(i >= 0)
            conds.append(i < global_extent(self, buf, d))
        return idx, self.guarded(conds)

    def call(self, op, args, dt):
        """exp, exp2 and sigmoid of 32- and 16-bit floats in arithmetic that vectorizes
        (vmath); the rest as TVM lowers them."""
        fn = _VMATH.get(op)
        if fn is None or dt not in ("float32", "float16", "bfloat16"):
            return super().call(op, args, dt)
        return self.cast(fn(self.cast(args[0], "float32", dt), self.vector_ldexp), dt, "float32")

    def bits_of_float32(self, f32, dt: str):
        if self.native_bf16 and dt == "bfloat16":
            self.used_native_bf16 = True
            return native_bf16_bits(f32)
        return super().bits_of_float32(f32, dt)

    def ir_dtype(self, bid: int) -> str:
        """The TVM name of buffer `bid`'s Tile IR dtype (its TIR buffer holds float8 as
        uint8 and bfloat16 as uint16: tir_dtype)."""
        return tvm_dtype(self.buffers[bid].dtype)

    def store(self, bid: int, value, indices, src: str | None = None) -> None:
        """buf[indices] = value, converted from `src` (value's Tile IR dtype, as a TVM name;
        default: its TIR dtype) to the buffer's."""
        T.buffer_store(self.tir_buffers[bid], self.cast(value, self.ir_dtype(bid), src),
                       indices)

    def guarded(self, conds):
        cond = None
        for c in conds:
            cond = c if cond is None else tirx.And(cond, c)
        return cond

    # -- statements ----------------------------------------------------------------------------
    def stmt(self, s: pb.Stmt) -> None:
        kind = s.WhichOneof("kind")
        try:
            getattr(self, "stmt_" + kind)(getattr(s, kind), s)
        except CompileError as e:
            if not e.loc and loc_of(s):
                raise type(e)(e.message, loc_of(s)) from None
            raise

    def stmt_seq(self, seq, _s):
        for st in seq.stmts:
            self.stmt(st)

    def stmt_for_(self, f, _s):
        extent = self.expr(f.extent)
        kind = T.serial
        if f.kind == pb.UNROLL and isinstance(extent, tirx.IntImm):
            kind = T.unroll
        if f.kind == pb.VECTORIZED and isinstance(extent, tirx.IntImm) and \
                1 <= extent.value <= _VECTOR_LANES and _vectorizable(f):
            kind = T.vectorized
        ahead = prefetch.element_plan(self, f, extent) if kind is T.serial else None
        if ahead:
            prefetch.element_loop(self, f, extent.value, ahead)
            return
        with kind(0, extent) as v:
            self.vars[f.var] = v
            at, copies = prefetch_plan(self, f) if f.kind == pb.PIPELINED else (0, [])
            if not copies:
                self.stmt(f.body)
            else:  # the body's statements, the prefetches after its copies
                stmts = body_statements(f.body)
                for st in stmts[:at]:
                    self.stmt(st)
                prefetch_ahead(self, f, v, copies)
                for st in stmts[at:]:
                    self.stmt(st)

    def stmt_if_then_else(self, node, _s):
        with T.If(self.expr(node.cond)):
            with T.Then():
                self.stmt(node.then_body)
            if node.HasField("else_body"):
                with T.Else():
                    self.stmt(node.else_body)

    def stmt_store(self, st, _s):
        value, idx = self.expr(st.value), [self.expr(i) for i in st.indices]
        cp = self.copied_out.get(st.buffer)
        if cp is None:
            self.store(st.buffer, value, idx, tvm_dtype(st.value.dtype))
            return
        # Into the copy's destination: rounded to the tile's dtype, then converted as the
        # copy would have, where the copy would have stored.
        tile_dt = self.ir_dtype(st.buffer)
        value = self.cast(value, tile_dt, tvm_dtype(st.value.dtype))
        dst_idx, ok = self.global_index(cp.dst, forward.tile_coords(self.buffers[st.buffer],
                                                                    idx))
        if ok is None:
            self.store(cp.dst.buffer, value, dst_idx, tile_dt)
        else:
            with T.If(ok), T.Then():
                self.store(cp.dst.buffer, value, dst_idx, tile_dt)

    def body(self, body: pb.Stmt) -> None:
        """The kernel body, with the copies forward.plan folds folded."""
        plan = forward.plan(self.program)
        stmts = forward.top_level(body)
        skews = skew.plan(self.program, plan) if skew.ENABLED else {}
        skewed: set[int] = set()  # positions lowered inside an earlier one's (skew.py)
        ends: dict[int, list[int]] = {}
        for pos, st in enumerate(stmts):
            if pos in plan.copy_in:
                tile, cp, end = plan.copy_in[pos]
                self.copied_in[tile] = cp
                if end in plan.into_reduce:  # the loop that ends it runs in the reduction
                    end += 1
                ends.setdefault(end, []).append(tile)
            if pos in plan.copy_out:
                tile, cp = plan.copy_out[pos]
                self.copied_out[tile] = cp
            if pos in plan.into_reduce:
                tile, keep = plan.into_reduce[pos]
                self.computed[tile] = (forward.loop_vars(st), forward.innermost(st).store, keep)
            if pos not in plan.skip and pos not in skewed:
                emit = functools.partial(self.stmt, st)
                last = pos
                sk = skews.get(pos)
                if sk is not None and skew.worth(self, st.reduce, plan.copy_out[sk.store][1]):
                    last = sk.store
                    hide = {t for k in range(pos, last) for t in ends.get(k, [])}
                    emit = functools.partial(skew.lower_skewed, self, stmts, pos, sk,
                                             plan.copy_out[last], hide)
                    skewed |= {*sk.maps, last}
                streamed = self.stream_plan.get(last, set()) & set(self.stream_ok)
                if streamed:
                    stream_out.lower_streamed(self, emit, streamed)
                else:
                    emit()
                self.streamed |= self.touched
                self.touched.clear()
            self.copied_out.pop(plan.copy_out.get(pos, (None,))[0], None)
            self.computed.pop(plan.into_reduce.get(pos - 1, (None,))[0], None)
            for tile in ends.pop(pos, []):
                del self.copied_in[tile]

    def stmt_atomic_add(self, st, _s):
        # Blocks run in parallel on CPU threads, so a global update must be atomic (shim CAS);
        # a shared tile belongs to one block, which runs on one thread: a plain update is.
        # A memory order other than relaxed fences around the update (tiled_fence); the block
        # is one thread, so its own accesses are ordered already.
        buf = self.tir_buffers[st.buffer]
        dt = self.ir_dtype(st.buffer)  # bfloat16 / float8 buffers hold their bits
        idx = [self.expr(i) for i in st.indices]
        op = _ATOMIC_NAME[st.op]
        zero = [tirx.const(0, "int32")]
        if self.buffers[st.buffer].scope != pb.GLOBAL:
            calc = "float32" if self.bits_float(dt) else dt
            old = self.cast(buf[tuple(idx)], calc, dt)
            value = self.cast(self.expr(st.value), calc, tvm_dtype(st.value.dtype))
            if st.op == pb.ATOMIC_ADD:
                new = old + value
            else:  # the shim's rule: the value replaces old when it compares past it
                wins = value > old if st.op == pb.ATOMIC_MAX else value < old
                new = tirx.Select(wins, value, old)
            if st.has_prev:
                self.store(st.prev, old, zero, calc)
            self.store(st.buffer, new, idx, calc)
            return
        if dt not in _ATOMIC_DTYPES[st.op]:
            raise CompileError(f"T.atomic_{op} on cpu supports "
                               f"{'/'.join(_ATOMIC_DTYPES[st.op])}, not {dt}")
        value = self.expr(st.value)
        # The shim's max / min take a float's bits (a 16-bit float has no C type common to
        # LLVM and the shim's compiler); a bfloat16 value is its bits already.
        bits = st.op != pb.ATOMIC_ADD and dt.startswith("float")
        if bits:
            value = tirx.reinterpret(f"uint{dtypes.bits(dt)}", value)
        if st.order != pb.ORDER_RELAXED:
            T.evaluate(T.call_extern("void", "tiled_fence"))
        update = T.call_extern(str(value.ty) if st.has_prev else "void",
                               f"tiled_atomic_{op}_{dt}", T.address_of(buf[tuple(idx)]), value)
        if not st.has_prev:
            T.evaluate(update)
        else:
            prev = self.tir_buffers[st.prev]
            T.buffer_store(prev, tirx.reinterpret(prev.dtype, update) if bits else update, zero)
        if st.order != pb.ORDER_RELAXED:
            T.evaluate(T.call_extern("void", "tiled_fence"))

    def stmt_copy(self, c, _s):
        tile = [e for e in c.src.extents if e != 1]
        with loop_nest(tile) as vs:
            src_idx, src_conds = self.region_index(c.src, vs)
            dst_idx, dst_conds = self.region_index(c.dst, vs)
            src_buf = self.tir_buffers[c.src.buffer]
            value = self.element(c.src.buffer, src_idx)
            src_ok = self.guarded(src_conds)
            if src_ok is not None:  # 0 is also float8's bits of +0.0
                value = tirx.if_then_else(src_ok, value, tirx.const(0, src_buf.dtype))
            dt = self.ir_dtype(c.src.buffer)
            dst_ok = self.guarded(dst_conds)
            if dst_ok is None:
                self.store(c.dst.buffer, value, dst_idx, dt)
            else:
                with T.If(dst_ok), T.Then():
                    self.store(c.dst.buffer, value, dst_idx, dt)

    def stmt_fill(self, f, _s):
        tile = [e for e in f.dst.extents if e != 1] or [1]
        with loop_nest(tile) as vs:
            vs = vs if any(e != 1 for e in f.dst.extents) else []
            idx, conds = self.region_index(f.dst, vs)
            ok = self.guarded(conds)
            value, dt = self.expr(f.value), tvm_dtype(f.value.dtype)
            if ok is None:
                self.store(f.dst.buffer, value, idx, dt)
            else:
                with T.If(ok), T.Then():
                    self.store(f.dst.buffer, value, idx, dt)

    def stmt_gemm(self, g, _s):
        A, B, C = (self.tir_buffers[x] for x in (g.a, g.b, g.c))
        M, N = static_shape(self.buffers[g.c])
        a_dims, b_dims = (static_shape(self.buffers[x])[-2:] for x in (g.a, g.b))
        K = a_dims[0 if g.transpose_a else 1]
        # A staged operand (A_s[s, :, :]) is the tile at its leading indices.
        ia, ib = ([self.expr(i) for i in index] for index in (g.a_index, g.b_index))
        acc = self.ir_dtype(g.c)
        a_dt, b_dt = self.ir_dtype(g.a), self.ir_dtype(g.b)
        if g.clear_accum:
            with loop_nest([M, N]) as (i, j):
                self.store(g.c, tirx.const(0, "float32"), [i, j], "float32")
        if acc == "float32" and a_dt in _GEMM_DTYPES and b_dt in _GEMM_DTYPES:
            # The shim's register-blocked microkernel (gemm.c); strides say where (i, k) of A
            # and (k, j) of B are in their row-major tiles.
            a_rs, a_cs = (1, a_dims[1]) if g.transpose_a else (a_dims[1], 1)
            b_rs, b_cs = (1, b_dims[1]) if g.transpose_b else (b_dims[1], 1)
            zeros = [tirx.const(0, "int32")] * 2
            T.evaluate(T.call_extern(
                "void", "tiled_gemm_f32", T.address_of(C[0, 0]), N,
                T.address_of(A[(*ia, *zeros)]), a_rs, a_cs, _GEMM_DTYPES[a_dt],
                T.address_of(B[(*ib, *zeros)]), b_rs, b_cs, _GEMM_DTYPES[b_dt], M, N, K))
            return
        # Other dtypes: i-k-j order, the inner loop walks rows of B and C contiguously.
        calc = "float32" if self.bits_float(acc) else acc
        with loop_nest([M, K]) as (i, k):
            a = A[(*ia, k, i)] if g.transpose_a else A[(*ia, i, k)]
            with T.serial(0, N) as j:
                b = B[(*ib, j, k)] if g.transpose_b else B[(*ib, k, j)]
                self.store(g.c, self.cast(C[i, j], calc, acc) + self.cast(a, calc, a_dt) *
                           self.cast(b, calc, b_dt), [i, j], calc)

    def stmt_grid_dependency(self, _g, _s):
        """T.pdl_sync / T.pdl_trigger: a launch returns when its blocks are done; nothing to
        do."""


def lower_cpu(program: Program, vector_bytes: int = 16, vector_ldexp: bool = False,
              native_bf16: bool = False, streaming: bool = False) -> tvm.IRModule:
    """The kernel as a TIR module for a CPU whose vector registers hold `vector_bytes` (whose
    ldexp is a vector instruction, and which converts to bfloat16 by instruction:
    levels.Codegen); with `streaming`, the statements stream_out.plan names may stream."""
    p = program.proto
    found = explicit_statement(p)
    if found is not None:
        raise CompileError(f"{found[0]} is part of the explicit Hopper path (mbarriers, TMA, "
                           "warpgroups): it compiles for cuda:sm_90a only, not cpu",
                           loc_of(found[1]))
    lower = CpuLowering(program, vector_bytes, vector_ldexp, native_bf16)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(p.name)
            T.func_attr({"tirx.noalias": True, "global_symbol": p.name})
            lower.tir_buffers.update(declare_params(program, lower))
            if streaming:
                lower.stream_plan = stream_out.plan(p)
                stream_out.check_outputs(lower, p, set().union(*lower.stream_plan.values()))
            grid = [lower.expr(g) for g in p.kernel.grid]
            total = grid[0]
            for g in grid[1:]:
                total = total * g
            with T.parallel(0, total) as fused:
                for into, first in ((lower.vars, fused), (lower.next_vars, fused + 1)):
                    rest = first
                    for i, vid in enumerate(p.kernel.block_vars):
                        last = i == len(grid) - 1
                        into[vid] = rest if last else tirx.floormod(rest, grid[i])
                        rest = tirx.floordiv(rest, grid[i])
                for b in p.buffers:
                    if b.scope != pb.GLOBAL:
                        lower.tir_buffers[b.id] = source_name(b, T.alloc_buffer(
                            static_shape(b), lower.tir_dtype(b.dtype)))
                lower.body(p.kernel.body)
    mod = tvm.IRModule({p.name: ib.get()})
    if lower.stream_tags:
        mod = mod.with_attr(stream_out.ATTR, ",".join(lower.stream_tags))
    return mod.with_attr(NATIVE_BF16_ATTR, True) if lower.used_native_bf16 else mod
