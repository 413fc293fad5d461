"""A cast through a fragment folded into the store that follows it (target-independent; the
cuda target's sm_90a lowering applies it, targets/cuda/kernel.py).

TileLang's GEMMs often end with

    T.copy(C_local, C_cast)                  # float32 accumulator -> 16-bit fragment
    T.copy(C_cast, C[by * BM, bx * BN])      # -> global

A copy converts as it goes, so the two are one copy from C_local to C with C_cast never
materialized: the same rounding (float32 to the 16-bit type once), the same values.
`fold_cast_stores` rewrites such a pair into that one copy when C_cast is a fragment of
C_local's shape that nothing else touches and the two copies are adjacent statements of
one body. On sm_90a this keeps the epilogue's vector stores reading the accumulator
directly; the cast written out as its own loop made ptxas serialize every wgmma of the
main loop (its remark C7514, reading accumulator registers), which halved the per-op
path's speed on TileLang's gemm_rs.
"""

from __future__ import annotations

from tiled.compiler.passes.layout import tile_op_buffers
from tiled.ir.program import Program
from tiled.ir.walk import element_accesses, walk
from tiled.v1 import tile_ir_pb2 as pb


def _whole(c: pb.Copy, side: str, shape: list[int]) -> bool:
    region = getattr(c, side)
    return all(o.WhichOneof("kind") == "int_value" and not o.int_value
               for o in region.offsets) and list(region.extents) == shape


def _foldable(p: pb.Program, buffers, first: pb.Stmt, second: pb.Stmt, uses: dict) -> bool:
    if first.WhichOneof("kind") != "copy" or second.WhichOneof("kind") != "copy":
        return False
    a, b = first.copy, second.copy
    src, mid = buffers[a.src.buffer], buffers[a.dst.buffer]
    shape = [d.size for d in mid.shape]
    return src.scope == pb.FRAGMENT and mid.scope == pb.FRAGMENT and \
        b.src.buffer == mid.id and buffers[b.dst.buffer].scope == pb.GLOBAL and \
        [d.size for d in src.shape] == shape and _whole(a, "src", shape) and \
        _whole(a, "dst", shape) and _whole(b, "src", shape) and uses.get(mid.id) == 2


def fold_cast_stores(program: Program) -> Program:
    """`program` with each foldable cast-then-store pair (module docstring) made one copy,
    or `program` itself when it has none."""
    p0 = program.proto
    buffers = {b.id: b for b in p0.buffers}
    uses: dict[int, int] = {}
    for st in walk(p0.kernel.body):
        for bid in tile_op_buffers(st):
            uses[bid] = uses.get(bid, 0) + 1
    for bid, _ in element_accesses(p0.kernel.body):
        uses[bid] = uses.get(bid, 0) + 100  # touched element by element: never folded
    found = any(_foldable(p0, buffers, s.seq.stmts[i], s.seq.stmts[i + 1], uses)
                for s in walk(p0.kernel.body) if s.WhichOneof("kind") == "seq"
                for i in range(len(s.seq.stmts) - 1))
    if not found:
        return program
    p = pb.Program()
    p.CopyFrom(p0)
    for s in walk(p.kernel.body):
        if s.WhichOneof("kind") != "seq":
            continue
        stmts = s.seq.stmts
        i = 0
        while i < len(stmts) - 1:
            if _foldable(p, buffers, stmts[i], stmts[i + 1], uses):
                stmts[i + 1].copy.src.buffer = stmts[i].copy.src.buffer
                del stmts[i]
            i += 1
    return Program(p)
