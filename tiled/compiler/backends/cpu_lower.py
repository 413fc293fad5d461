"""Tile IR -> TIR for the `cpu` backend (tiled.compiler.backends.cpu).

Semantics on a CPU: the grid becomes one parallel loop over all blocks (TVM's parallel launch,
served by tiled's shim); within a block there is one thread, so every tile is a plain array,
T.Parallel is a serial loop nest, tile ops are loop nests, and T.Pipelined is a serial loop.
"""

from __future__ import annotations

import contextlib

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tiled.compiler.tir import ExprLowering, declare_params, loc_of, static_shape, tvm_dtype
from tiled.errors import CompileError
from tiled.ir.program import Program
from tiled.ir.verify_ws import explicit_statement
from tiled.v1 import tile_ir_pb2 as pb

_IDENTITY = {pb.REDUCE_SUM: lambda dt: tirx.const(0, dt),
             pb.REDUCE_MAX: lambda dt: tirx.min_value(dt),
             pb.REDUCE_MIN: lambda dt: tirx.max_value(dt)}
_COMBINE = {pb.REDUCE_SUM: lambda a, b: a + b, pb.REDUCE_MAX: tirx.Max, pb.REDUCE_MIN: tirx.Min}


@contextlib.contextmanager
def loop_nest(extents, kind=T.serial):
    """Opens nested loops over `extents`; yields their variables."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(kind(0, e)) for e in extents]


class CpuLowering(ExprLowering):
    def __init__(self, program: Program):
        super().__init__(program)
        self.tir_buffers: dict[int, tirx.Buffer] = {}

    def load(self, bid, indices):
        return self.tir_buffers[bid][tuple(indices)]

    def store(self, bid: int, value, indices) -> None:
        buf = self.tir_buffers[bid]
        T.buffer_store(buf, tirx.Cast(buf.dtype, value) if str(value.ty) != buf.dtype else value,
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
        with kind(0, extent) as v:
            self.vars[f.var] = v
            self.stmt(f.body)

    def stmt_if_then_else(self, node, _s):
        with T.If(self.expr(node.cond)):
            with T.Then():
                self.stmt(node.then_body)
            if node.HasField("else_body"):
                with T.Else():
                    self.stmt(node.else_body)

    def stmt_store(self, st, _s):
        self.store(st.buffer, self.expr(st.value), [self.expr(i) for i in st.indices])

    def stmt_atomic_add(self, st, _s):
        # Blocks run in parallel on CPU threads, so a global add must be atomic (shim CAS loop).
        buf = self.tir_buffers[st.buffer]
        dt = buf.dtype
        idx = [self.expr(i) for i in st.indices]
        if dt not in ("float32", "float64", "int32", "int64"):
            raise CompileError(f"T.atomic_add on cpu supports float32/float64/int32/int64, "
                               f"not {dt}")
        T.evaluate(T.call_extern("void", f"tiled_atomic_add_{dt}",
                                 T.address_of(buf[tuple(idx)]), self.expr(st.value)))

    def stmt_copy(self, c, _s):
        tile = [e for e in c.src.extents if e != 1]
        with loop_nest(tile) as vs:
            src_idx, src_conds = self.region_index(c.src, vs)
            dst_idx, dst_conds = self.region_index(c.dst, vs)
            src_buf = self.tir_buffers[c.src.buffer]
            value = src_buf[tuple(src_idx)]
            src_ok = self.guarded(src_conds)
            if src_ok is not None:
                value = tirx.if_then_else(src_ok, value, tirx.const(0, src_buf.dtype))
            dst_ok = self.guarded(dst_conds)
            if dst_ok is None:
                self.store(c.dst.buffer, value, dst_idx)
            else:
                with T.If(dst_ok), T.Then():
                    self.store(c.dst.buffer, value, dst_idx)

    def stmt_fill(self, f, _s):
        tile = [e for e in f.dst.extents if e != 1] or [1]
        with loop_nest(tile) as vs:
            vs = vs if any(e != 1 for e in f.dst.extents) else []
            idx, conds = self.region_index(f.dst, vs)
            ok = self.guarded(conds)
            value = self.expr(f.value)
            if ok is None:
                self.store(f.dst.buffer, value, idx)
            else:
                with T.If(ok), T.Then():
                    self.store(f.dst.buffer, value, idx)

    def stmt_gemm(self, g, _s):
        A, B, C = (self.tir_buffers[x] for x in (g.a, g.b, g.c))
        M, N = static_shape(self.buffers[g.c])
        K = static_shape(self.buffers[g.a])[-2 if g.transpose_a else -1]
        # A staged operand (A_s[s, :, :]) is the tile at its leading indices.
        ia, ib = ([self.expr(i) for i in index] for index in (g.a_index, g.b_index))
        acc = C.dtype
        if g.clear_accum:
            with loop_nest([M, N]) as (i, j):
                T.buffer_store(C, tirx.const(0, acc), [i, j])
        # i-k-j order: the inner loop walks rows of B and C contiguously.
        with loop_nest([M, K]) as (i, k):
            a = A[(*ia, k, i)] if g.transpose_a else A[(*ia, i, k)]
            with T.serial(0, N) as j:
                b = B[(*ib, j, k)] if g.transpose_b else B[(*ib, k, j)]
                T.buffer_store(C, C[i, j] + tirx.Cast(acc, a) * tirx.Cast(acc, b), [i, j])

    def stmt_reduce(self, r, _s):
        src, dst = self.tir_buffers[r.src], self.tir_buffers[r.dst]
        shape = static_shape(self.buffers[r.src])
        keep = [d for i, d in enumerate(shape) if i != r.dim]
        acc = dst.dtype
        with loop_nest(keep or [1]) as outer:
            out_idx = outer if keep else [0]
            tmp = T.alloc_buffer((1,), acc)
            init = _IDENTITY[r.kind](acc) if r.clear else dst[tuple(out_idx)]
            T.buffer_store(tmp, init, [0])
            with T.serial(0, shape[r.dim]) as k:
                src_idx = list(outer) if keep else []
                src_idx.insert(r.dim, k)
                v = tirx.Cast(acc, src[tuple(src_idx)])
                T.buffer_store(tmp, _COMBINE[r.kind](tmp[0], v), [0])
            T.buffer_store(dst, tmp[0], out_idx)


def lower_cpu(program: Program) -> tvm.IRModule:
    p = program.proto
    found = explicit_statement(p)
    if found is not None:
        raise CompileError(f"{found[0]} is part of the explicit Hopper path (mbarriers, TMA, "
                           "warpgroups): it compiles for cuda:sm_90a only, not cpu",
                           loc_of(found[1]))
    lower = CpuLowering(program)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(p.name)
            T.func_attr({"tirx.noalias": True, "global_symbol": p.name})
            lower.tir_buffers.update(declare_params(program, lower))
            grid = [lower.expr(g) for g in p.kernel.grid]
            total = grid[0]
            for g in grid[1:]:
                total = total * g
            with T.parallel(0, total) as fused:
                rest = fused
                for i, vid in enumerate(p.kernel.block_vars):
                    last = i == len(grid) - 1
                    lower.vars[vid] = rest if last else tirx.floormod(rest, grid[i])
                    rest = tirx.floordiv(rest, grid[i])
                for b in p.buffers:
                    if b.scope != pb.GLOBAL:
                        lower.tir_buffers[b.id] = T.alloc_buffer(static_shape(b),
                                                                 tvm_dtype(b.dtype))
                lower.stmt(p.kernel.body)
    return tvm.IRModule({p.name: ib.get()})
