"""T.gemm on Metal: 8x8 simdgroup_matrix multiply-accumulate where the dtypes and shape allow
(layouts.simdgroup_eligible), else a SIMT gemm; both in include/tiled_metal.h.

Simdgroup path. The accumulator is a cyclic fragment (layouts.py says why no register
layout is used), so each T.gemm:
1. stages fragment operands (FlashAttention's P) into the threadgroup scratch area, row by
   row (cuda/gemm.py's staging), and writes the accumulator there by its layout's
   coordinates (skipped when the gemm clears it);
2. a barrier; then simdgroup s loads the C tiles s, s + S, ... (S simdgroups) with
   `simdgroup_load`, multiply-accumulates A and B 8x8 tiles read from threadgroup memory
   over K, and stores them back with `simdgroup_store`;
3. a barrier; every thread reads its accumulator elements back.
The round trip of C through threadgroup memory is the price of an undocumented lane mapping:
two barriers per gemm, and scratch for the accumulator. Where the threadgroup memory left
beside the tiles cannot hold all of C, the three steps run over chunks of its rows
(chunk_rows), so the gemm fits in Apple's 32 KiB at the cost of more barriers.
SIMT path: `tiled::gemm_simt` (thread t owns elements t + i * threads of C).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.resources import align_up
from tiled.compiler.targets.cuda.gemm import (
    stage_bytes,
    stage_fragment,
    stage_stride,
    staged_operands,
)
from tiled.compiler.targets.metal.layouts import (
    MSL_ELEMENT,
    SIMD_WIDTH,
    chunk_rows,
    simdgroup_eligible,
)
from tiled.compiler.targets.metal.resident import SimdgroupTiles
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


def _simd(low, g: pb.Gemm) -> bool:
    return simdgroup_eligible(g, low.buffers, low.arch, low.threads)


def c_chunk_rows(low, g: pb.Gemm) -> int:
    """Rows of the accumulator one round of the simdgroup path stages (layouts.chunk_rows:
    all M where they fit beside the tiles and the staged operands)."""
    c = low.buffers[g.c]
    return chunk_rows(low, c.shape[0].size, stage_stride(c) * dtypes.nbytes(c.dtype),
                      stage_bytes(low, g))


def gemm_scratch_bytes(low, g: pb.Gemm) -> int:
    """Scratch bytes of T.gemm `g`: its staged fragment operands, and on the simdgroup path
    a chunk of the accumulator (c_chunk_rows); none for a resident accumulator."""
    total = stage_bytes(low, g)
    if _simd(low, g) and not isinstance(low.layouts.get(g.c), SimdgroupTiles):
        c = low.buffers[g.c]
        total = align_up(total) + \
            c_chunk_rows(low, g) * stage_stride(c) * dtypes.nbytes(c.dtype)
    return total


def _element(buf: pb.Buffer) -> str:
    name = dtypes.canonical_name(buf.dtype)
    if name not in MSL_ELEMENT:
        raise CompileError(f"T.gemm on metal does not take {name} tiles")
    return MSL_ELEMENT[name]


def _move_rows(low, g: pb.Gemm, tile, r0: int, rows: int, to_tile: bool) -> None:
    """Between the accumulator's rows [r0, r0 + rows) and `tile` (their copy in threadgroup
    memory), by the accumulator's layout: each thread moves the elements it holds."""
    lay, acc = low.layouts[g.c], low.tir[g.c]
    M = low.buffers[g.c].shape[0].size
    with low.loop(lay.local_size) as idx:
        (row, col), valid = lay.coords(low.tx, idx)
        conds = [c for c in (valid, row >= r0 if r0 else None,
                             row < r0 + rows if r0 + rows < M else None) if c is not None]
        cond = conds[0] if conds else None
        for c in conds[1:]:
            cond = tirx.And(cond, c)
        with low.maybe_if(cond):
            if to_tile:
                T.buffer_store(tile, acc[idx], [row - r0, col])
            else:
                T.buffer_store(acc, tile[row - r0, col], [idx])


def lower_metal_gemm(low, g: pb.Gemm, s: pb.Stmt) -> None:
    a, b, c = (low.buffers[x] for x in (g.a, g.b, g.c))
    simd = _simd(low, g)
    resident = isinstance(low.layouts[g.c], SimdgroupTiles)
    if resident and not staged_operands(low, g):
        low.uniform_stmt(s)  # reads its operands where they lie; writes no shared memory
    else:
        low.sync.before(True, True)  # reads the operands; writes the scratch area
    operand, offset = {}, 0  # role -> (pointer, leading dimension)
    for role in staged_operands(low, g):
        bid = getattr(g, role)
        buf = low.buffers[bid]
        offset = align_up(offset)
        tile = stage_fragment(low, bid, offset)
        operand[role] = (tile, stage_stride(buf))
        offset += buf.shape[0].size * stage_stride(buf) * dtypes.nbytes(buf.dtype)
    for role, index in (("a", g.a_index), ("b", g.b_index)):
        bid = getattr(g, role)
        if role not in operand:  # a shared tile, from its leading indices (A_s[stage, :, :])
            lead = [low.expr(i) for i in index]
            operand[role] = (lambda r, c, bid=bid, lead=lead: low.addr(bid, [*lead, r, c]),
                             low.shared[bid].stride)
        else:
            tile = operand[role][0]
            operand[role] = (lambda r, c, tile=tile: T.address_of(tile[r, c]), operand[role][1])
    M, N = (d.size for d in c.shape)
    K = (a.shape[-2] if g.transpose_a else a.shape[-1]).size
    ta, tb = str(g.transpose_a).lower(), str(g.transpose_b).lower()
    (at_a, lda), (at_b, ldb) = operand["a"], operand["b"]
    zero = tirx.const(0, "int32")
    lay, acc = low.layouts[g.c], low.tir[g.c]
    et = [_element(x) for x in (a, b, c)]
    if not simd:
        if g.clear_accum:
            with low.loop(lay.local_size) as idx:
                T.buffer_store(acc, tirx.const(0, acc.dtype), [idx])
        if staged_operands(low, g):
            low.sync.sync()  # the staged tiles are visible to every thread
        name = (f"tiled::gemm_simt<{et[0]}, {et[1]}, {et[2]}, {M}, {N}, {K}, {low.threads}, "
                f"{ta}, {tb}, {lda}, {ldb}>")
        T.evaluate(T.call_extern("void", name, at_a(zero, zero), at_b(zero, zero),
                                 T.address_of(acc[0]), low.tx))
        low.sync.pending_read = True
        return
    if resident:  # the accumulator lives in simdgroup matrices (resident.py)
        if staged_operands(low, g):
            low.sync.sync()  # the staged operands are visible to every simdgroup
        name = (f"tiled::gemm_simdgroup_acc<{et[0]}, {et[1]}, {et[2]}, {M}, {N}, {K}, "
                f"{lay.simdgroups}, {ta}, {tb}, {lda}, {ldb}, {str(g.clear_accum).lower()}>")
        T.evaluate(T.call_extern("void", name, at_a(zero, zero), at_b(zero, zero),
                                 T.address_of(acc[0]), tirx.floordiv(low.tx, SIMD_WIDTH)))
        low.sync.pending_read = True  # the operands are read until every simdgroup is done
        return
    rows, ldc = c_chunk_rows(low, g), stage_stride(c)
    c_tile = low.scratch(dtypes.canonical_name(c.dtype), rows * ldc, align_up(offset),
                         shape=(rows, ldc))
    for r0 in range(0, M, rows):
        if r0:
            low.sync.sync()  # every thread has read the previous chunk back
        if not g.clear_accum:
            _move_rows(low, g, c_tile, r0, rows, to_tile=True)
        low.sync.sync()  # staged operands and the chunk are visible to every simdgroup
        # Rows r0.. of op(A): rows of A, or columns of a transposed A.
        pa = at_a(zero, tirx.const(r0, "int32")) if g.transpose_a else \
            at_a(tirx.const(r0, "int32"), zero)
        name = (f"tiled::gemm_simdgroup<{et[0]}, {et[1]}, {et[2]}, {rows}, {N}, {K}, "
                f"{low.threads // SIMD_WIDTH}, {ta}, {tb}, {lda}, {ldb}, {ldc}, "
                f"{str(g.clear_accum).lower()}>")
        T.evaluate(T.call_extern("void", name, pa, at_b(zero, zero),
                                 T.address_of(c_tile[0, 0]), tirx.floordiv(low.tx, SIMD_WIDTH)))
        low.sync.sync()  # every simdgroup's C tiles are stored
        _move_rows(low, g, c_tile, r0, rows, to_tile=False)
    low.sync.pending_read = True
