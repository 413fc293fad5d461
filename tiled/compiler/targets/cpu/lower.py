"""Tile IR -> TIR for the `cpu` backend (tiled.compiler.targets.cpu.backend).

Semantics on a CPU: the grid becomes one parallel loop over all blocks (TVM's parallel launch,
served by tiled's shim); within a block there is one thread, so every tile is a plain array,
T.Parallel is a serial loop nest, tile ops are loop nests, and T.Pipelined is a serial loop.
T.vectorized becomes TVM's vectorized loop where its body is plain stores over a short constant
extent, else a serial loop (which LLVM may still vectorize). Atomics go through the shim
(blocks run on several threads).
"""

from __future__ import annotations

import contextlib

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tiled.compiler.tir import (
    FP8_DTYPES,
    ExprLowering,
    declare_params,
    loc_of,
    saturating_abs,
    scan_acc_dtype,
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

_IDENTITY = {pb.REDUCE_SUM: lambda dt: tirx.const(0, dt),
             pb.REDUCE_MAX: lambda dt: tirx.min_value(dt),
             pb.REDUCE_MIN: lambda dt: tirx.max_value(dt),
             pb.REDUCE_ABSMAX: lambda dt: tirx.const(0, dt)}
_COMBINE = {pb.REDUCE_SUM: lambda a, b: a + b, pb.REDUCE_MAX: tirx.Max, pb.REDUCE_MIN: tirx.Min,
            pb.REDUCE_ABSMAX: lambda a, b: tirx.Max(a, saturating_abs(b))}
# The dtypes the shim's atomics take (cpu_shim.c).
_ATOMIC_DTYPES = {
    pb.ATOMIC_ADD: ("float32", "float64", "int32", "int64"),
    pb.ATOMIC_MAX: ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                    "float16", "bfloat16", "float32", "float64"),
}
_ATOMIC_DTYPES[pb.ATOMIC_MIN] = _ATOMIC_DTYPES[pb.ATOMIC_MAX]
_ATOMIC_NAME = {pb.ATOMIC_ADD: "add", pb.ATOMIC_MAX: "max", pb.ATOMIC_MIN: "min"}
_VECTOR_LANES = 64  # the longest T.vectorized loop lowered as TVM vector lanes
_EMULATED = (pb.BFLOAT16, pb.FLOAT8_E4M3, pb.FLOAT8_E5M2)  # floats TVM's LLVM path emulates


def _vectorizable(f: pb.For) -> bool:
    """Whether TVM's vectorizer may run a T.vectorized loop as vector lanes with the loop's
    serial results. TVM's vectorizer assumes no dependence between iterations, so this holds
    only for bodies of plain stores (no guards, atomics or loops; no fp8 or bfloat16, which
    TVM legalizes per element, failing on vectors) whose iterations touch disjoint elements
    (tiled.ir.walk.lanes_independent). Anything else stays a serial loop."""
    body = f.body.seq.stmts if f.body.WhichOneof("kind") == "seq" else [f.body]
    return all(st.WhichOneof("kind") == "store" and not any(
        x.dtype in _EMULATED for e in stmt_exprs(st) for x in subexprs(e)) for st in body) \
        and lanes_independent(f)


@contextlib.contextmanager
def loop_nest(extents, kind=T.serial):
    """Opens nested loops over `extents`; yields their variables."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(kind(0, e)) for e in extents]


class CpuLowering(ExprLowering):
    exact_fp8 = True  # TVM's LLVM float8 legalization misreads subnormals and NaN

    def __init__(self, program: Program):
        super().__init__(program)
        self.tir_buffers: dict[int, tirx.Buffer] = {}

    def load(self, bid, indices):
        return self.tir_buffers[bid][tuple(indices)]

    def ir_dtype(self, bid: int) -> str:
        """The TVM name of buffer `bid`'s Tile IR dtype (its TIR buffer holds float8 as
        uint8: tir_dtype)."""
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
        self.store(st.buffer, self.expr(st.value), [self.expr(i) for i in st.indices],
                   tvm_dtype(st.value.dtype))

    def stmt_atomic_add(self, st, _s):
        # Blocks run in parallel on CPU threads, so a global update must be atomic (shim CAS);
        # a shared tile belongs to one block, which runs on one thread: a plain update is.
        buf = self.tir_buffers[st.buffer]
        dt = buf.dtype
        idx = [self.expr(i) for i in st.indices]
        op = _ATOMIC_NAME[st.op]
        if self.buffers[st.buffer].scope != pb.GLOBAL:
            old = buf[tuple(idx)]
            value = self.cast(self.expr(st.value), dt, tvm_dtype(st.value.dtype))
            if st.op == pb.ATOMIC_ADD:
                new = old + value
            else:  # the shim's rule: the value replaces old when it compares past it
                wins = value > old if st.op == pb.ATOMIC_MAX else value < old
                new = tirx.Select(wins, value, old)
            T.buffer_store(buf, new, idx)
            return
        if dt not in _ATOMIC_DTYPES[st.op]:
            raise CompileError(f"T.atomic_{op} on cpu supports "
                               f"{'/'.join(_ATOMIC_DTYPES[st.op])}, not {dt}")
        value = self.expr(st.value)
        if st.op != pb.ATOMIC_ADD and dt == "bfloat16":
            # The shim's max / min take a float's bits (a 16-bit float has no C type common to
            # LLVM and the shim's compiler). TVM computes bfloat16 in float32, where the value
            # is exact: its bits are the float32's upper half.
            bits32 = tirx.reinterpret("uint32", tirx.Cast("float32", value))
            value = tirx.Cast("uint16", tirx.shift_right(bits32, tirx.const(16, "uint32")))
        elif st.op != pb.ATOMIC_ADD and dt.startswith("float"):
            value = tirx.reinterpret(f"uint{dtypes.bits(dt)}", value)
        T.evaluate(T.call_extern("void", f"tiled_atomic_{op}_{dt}",
                                 T.address_of(buf[tuple(idx)]), value))

    def stmt_copy(self, c, _s):
        tile = [e for e in c.src.extents if e != 1]
        with loop_nest(tile) as vs:
            src_idx, src_conds = self.region_index(c.src, vs)
            dst_idx, dst_conds = self.region_index(c.dst, vs)
            src_buf = self.tir_buffers[c.src.buffer]
            value = src_buf[tuple(src_idx)]
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
                T.buffer_store(C, C[i, j] + self.cast(a, acc, self.ir_dtype(g.a)) *
                               self.cast(b, acc, self.ir_dtype(g.b)), [i, j])

    def stmt_reduce(self, r, _s):
        src, dst = self.tir_buffers[r.src], self.tir_buffers[r.dst]
        shape = static_shape(self.buffers[r.src])
        keep = [d for i, d in enumerate(shape) if i != r.dim]
        src_dt, dst_dt = self.ir_dtype(r.src), self.ir_dtype(r.dst)
        acc = "float32" if dst_dt in FP8_DTYPES else dst_dt  # float8 reduces in float32
        with loop_nest(keep or [1]) as outer:
            out_idx = outer if keep else [0]
            tmp = T.alloc_buffer((1,), acc)
            init = _IDENTITY[r.kind](acc) if r.clear else \
                self.cast(dst[tuple(out_idx)], acc, dst_dt)
            T.buffer_store(tmp, init, [0])
            with T.serial(0, shape[r.dim]) as k:
                src_idx = list(outer) if keep else []
                src_idx.insert(r.dim, k)
                v = self.cast(src[tuple(src_idx)], dst_dt, src_dt)
                T.buffer_store(tmp, _COMBINE[r.kind](tmp[0], self.cast(v, acc, dst_dt)), [0])
            T.buffer_store(dst, self.cast(tmp[0], dst_dt, acc), out_idx)

    def stmt_scan(self, sc, _s):
        src, dst = self.tir_buffers[sc.src], self.tir_buffers[sc.dst]
        shape = static_shape(self.buffers[sc.src])
        keep = [d for i, d in enumerate(shape) if i != sc.dim]
        n = shape[sc.dim]
        # 16- and 8-bit floats keep the running sum in float32 and round each output once.
        dt, acc = self.ir_dtype(sc.src), scan_acc_dtype(self.buffers[sc.src].dtype)
        with loop_nest(keep or [1]) as outer:
            run = T.alloc_buffer((1,), acc)
            T.buffer_store(run, tirx.const(0, acc), [0])
            # src[k] is read before dst[k] is written, so src and dst may be one buffer.
            with T.serial(0, n) as k:
                pos = n - 1 - k if sc.reverse else k
                idx = list(outer) if keep else []
                idx.insert(sc.dim, pos)
                T.buffer_store(run, run[0] + self.cast(src[tuple(idx)], acc, dt), [0])
                T.buffer_store(dst, self.cast(run[0], dt, acc), idx)


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
                        lower.tir_buffers[b.id] = source_name(b, T.alloc_buffer(
                            static_shape(b), lower.tir_dtype(b.dtype)))
                lower.stmt(p.kernel.body)
    return tvm.IRModule({p.name: ib.get()})
