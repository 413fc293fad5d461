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

from tiled.compiler.passes.stmts import tile_op_uses, whole_region
from tiled.ir.program import Program
from tiled.ir.walk import walk
from tiled.v1 import tile_ir_pb2 as pb


def _foldable(buffers, first: pb.Stmt, second: pb.Stmt, uses: dict, touched: set) -> bool:
    if first.WhichOneof("kind") != "copy" or second.WhichOneof("kind") != "copy":
        return False
    a, b = first.copy, second.copy
    src, mid = buffers[a.src.buffer], buffers[a.dst.buffer]
    shape = [d.size for d in mid.shape]
    return src.scope == pb.FRAGMENT and mid.scope == pb.FRAGMENT and \
        b.src.buffer == mid.id and buffers[b.dst.buffer].scope == pb.GLOBAL and \
        [d.size for d in src.shape] == shape and whole_region(a.src, src) and \
        whole_region(a.dst, mid) and whole_region(b.src, mid) and \
        len(uses.get(mid.id, ())) == 2 and mid.id not in touched


def fold_cast_stores(program: Program) -> Program:
    """`program` with each foldable cast-then-store pair (module docstring) made one copy,
    or `program` itself when it has none."""
    p = pb.Program()
    p.CopyFrom(program.proto)
    buffers = {b.id: b for b in p.buffers}
    uses, touched = tile_op_uses(p.kernel.body)
    folded = False
    for s in walk(p.kernel.body):
        if s.WhichOneof("kind") != "seq":
            continue
        stmts = s.seq.stmts
        i = 0
        while i < len(stmts) - 1:
            if _foldable(buffers, stmts[i], stmts[i + 1], uses, touched):
                stmts[i + 1].copy.src.buffer = stmts[i].copy.src.buffer
                del stmts[i]
                folded = True
            i += 1
    return Program(p) if folded else program
