"""Accumulators kept in simdgroup matrices for the whole kernel (Metal).

A gemm accumulator that only T.gemm (as C, on simdgroup matrices), T.fill / T.clear and
T.copy to threadgroup or device memory touch never needs an element in a thread: it can live
in `simdgroup_float8x8` registers (TVM's "metal.simdgroup" scope) from the first gemm to the
epilogue, with no round trip through threadgroup memory per gemm (gemm.py's general path).
Simdgroup s holds the 8x8 tiles s, s + S, ... of its (M / 8) x (N / 8) grid, row-major
(S simdgroups). T.fill is `make_filled_simdgroup_matrix`; T.copy out stores the tiles into
the threadgroup scratch area with `simdgroup_store` (in row chunks when the whole tile does
not fit beside the other tiles), then every thread moves elements from there to the
destination (guarded, converted to its dtype) as any copy does. A fragment read or written
any other way (FlashAttention's scores, a reduction, a T.Parallel nest) keeps the cyclic
layout and gemm.py's round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import unravel
from tiled.compiler.targets.metal.layouts import (
    MSL_ELEMENT,
    SIMD_WIDTH,
    TILE,
    chunk_rows,
    simdgroup_eligible,
)
from tiled.compiler.tir import and_all
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.walk import stmt_exprs, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class SimdgroupTiles:
    """The layout of a resident accumulator (module docstring): `tiles` 8x8 matrices per
    thread's simdgroup, allocated as 64 elements each in the metal.simdgroup scope."""

    M: int
    N: int
    simdgroups: int

    scope = "metal.simdgroup"

    @property
    def tiles(self) -> int:
        return -(-(self.M // TILE) * (self.N // TILE) // self.simdgroups)

    @property
    def local_size(self) -> int:
        return self.tiles * TILE * TILE

    def coords(self, tx, idx):
        raise CompileError("an accumulator kept in simdgroup matrices has no element in a "
                           "thread (a tiled bug: it was chosen for a fragment read elementwise)")


def _whole(region: pb.Region, buf: pb.Buffer) -> bool:
    return [e for e in region.extents] == [d.size for d in buf.shape]


def resident_accumulators(program: pb.Program, arch: str) -> dict[int, SimdgroupTiles]:
    """The fragments that can live in simdgroup matrices (module docstring) -> their layout."""
    buffers = {b.id: b for b in program.buffers}
    threads = program.kernel.threads
    candidates = {}
    for st in walk(program.kernel.body):
        if st.WhichOneof("kind") == "gemm":
            c = buffers[st.gemm.c]
            if c.scope == pb.FRAGMENT and simdgroup_eligible(st.gemm, buffers, arch, threads):
                M, N = (d.size for d in c.shape)
                candidates[c.id] = SimdgroupTiles(M, N, threads // SIMD_WIDTH)
    refused = set()
    for st in walk(program.kernel.body):
        kind = st.WhichOneof("kind")
        node = getattr(st, kind)
        loads = {sub.load.buffer for e in stmt_exprs(st) for sub in subexprs(e)
                 if sub.WhichOneof("kind") == "load"}
        refused |= loads
        if kind == "gemm":
            refused |= {node.a, node.b}
            if not simdgroup_eligible(node, buffers, arch, threads):
                refused.add(node.c)
        elif kind == "fill":
            if not _whole(node.dst, buffers[node.dst.buffer]):
                refused.add(node.dst.buffer)
        elif kind == "copy":
            refused.add(node.dst.buffer)
            src = buffers[node.src.buffer]
            dst = buffers[node.dst.buffer]
            squeezed = [e for e in node.dst.extents if e != 1]
            if not _whole(node.src, src) or dst.scope not in (pb.GLOBAL, pb.SHARED) or \
                    squeezed != [d.size for d in src.shape if d.size != 1]:
                refused.add(node.src.buffer)
        elif kind in ("store", "atomic_add"):
            refused.add(node.buffer)
        elif kind in ("reduce", "scan"):
            refused |= {node.src, node.dst}
    return {bid: lay for bid, lay in candidates.items() if bid not in refused}


def copy_out_bytes(low, c: pb.Copy) -> int:
    """Scratch bytes of a T.copy out of a resident accumulator: a chunk of its rows."""
    lay, buf = low.layouts[c.src.buffer], low.buffers[c.src.buffer]
    row = lay.N * dtypes.nbytes(buf.dtype)
    return chunk_rows(low, lay.M, row) * row


def lower_fill(low, f: pb.Fill, s: pb.Stmt) -> None:
    low.uniform_stmt(s)
    lay, acc = low.layouts[f.dst.buffer], low.tir[f.dst.buffer]
    value = low.expr(f.value)
    if str(value.ty) != acc.dtype:
        value = tirx.Cast(acc.dtype, value)
    T.evaluate(T.call_extern("void", f"tiled::fill_simdgroup<{lay.tiles}>",
                             T.address_of(acc[0]), value))


def lower_copy_out(low, c: pb.Copy, s: pb.Stmt) -> None:
    """T.copy(acc, dst): the tiles through the scratch area to `dst`, a chunk of rows at a
    time (module docstring)."""
    low.uniform_stmt(s)
    lay, buf, acc = low.layouts[c.src.buffer], low.buffers[c.src.buffer], low.tir[c.src.buffer]
    dt = dtypes.canonical_name(buf.dtype)
    rows = chunk_rows(low, lay.M, lay.N * dtypes.nbytes(buf.dtype))
    tile = low.scratch(dt, rows * lay.N, 0, shape=(rows, lay.N))
    for r0 in range(0, lay.M, rows):
        low.sync.before(False, True)  # the scratch area: every earlier reader is done
        T.evaluate(T.call_extern(
            "void", f"tiled::store_simdgroup<{MSL_ELEMENT[dt]}, {lay.M}, {lay.N}, "
            f"{lay.simdgroups}, {rows}>", T.address_of(acc[0]), T.address_of(tile[0, 0]),
            tirx.const(r0, "int32"), tirx.floordiv(low.tx, SIMD_WIDTH)))
        low.sync.sync()  # the chunk is in threadgroup memory
        numel = rows * lay.N
        with low.loop(-(-numel // low.threads)) as it:
            flat = it * low.threads + low.tx
            with low.maybe_if(None if numel % low.threads == 0 else flat < numel):
                r, col = unravel(flat, [rows, lay.N])
                # (the destination region's extents other than 1 are M, N: resident_*)
                dst_idx, conds = low.region_index(c.dst, [r + r0, col])
                with low.maybe_if(and_all(conds)):
                    low.store(c.dst.buffer, tile[r, col], dst_idx)
        low.sync.pending_read = True
    # The chunks' syncs cleared what the statement's own accounting recorded: a threadgroup
    # destination's writes are pending again (the next reader of it waits for them).
    low.sync.pending_write |= low.buffers[c.dst.buffer].scope == pb.SHARED
