"""Fragment operands staged through shared memory (target-independent; the cuda target's
sm_90a lowering applies it, targets/cuda/kernel.py).

TileLang's register-A GEMM copies each K tile of A from global memory straight into a
fragment and hands it to T.gemm:

    for k in T.Pipelined(...):
        T.copy(A[by * BM, k * BK], A_frag)
        T.copy(B[k * BK, bx * BN], B_shared)
        T.gemm(A_frag, B_shared, C_local)

Nothing can load such a copy ahead (a fragment is the threads' own registers), so every
iteration waits for global memory. When the fragment is nothing but that operand, holding
it in shared memory instead changes no value the program computes: `stage_fragment_operands`
turns it into a shared tile, which the T.Pipelined machinery then loads ahead like B (on
sm_90a a TMA ring, and the gemm reads A from shared memory). A fragment qualifies when:

- it is written only by one whole-tile copy from a global tensor of its own dtype, a
  statement of a T.Pipelined loop's body;
- it is read only as A of gemms (not transposed), and accessed by nothing else: no element
  access, reduction or other copy.
"""

from __future__ import annotations

from tiled.compiler.passes.layout import body_statements, tile_op_uses, whole_region
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.walk import walk
from tiled.v1 import tile_ir_pb2 as pb


def _whole_tile_copy(c: pb.Copy, buffers) -> bool:
    src, dst = buffers[c.src.buffer], buffers[c.dst.buffer]
    return src.scope == pb.GLOBAL and dst.scope == pb.FRAGMENT and \
        dtypes.canonical_name(src.dtype) == dtypes.canonical_name(dst.dtype) and \
        whole_region(c.dst, dst) and \
        [e for e in c.src.extents if e != 1] == [d.size for d in dst.shape]


def staged_operands(p: pb.Program) -> set[int]:
    """The fragments of `p` that may live in shared memory instead (module docstring)."""
    buffers = {b.id: b for b in p.buffers}
    found: set[int] = set()
    for st in walk(p.kernel.body):
        if st.WhichOneof("kind") == "for_" and st.for_.kind == pb.PIPELINED:
            for s in body_statements(st.for_.body):
                if s.WhichOneof("kind") == "copy" and _whole_tile_copy(s.copy, buffers):
                    found.add(s.copy.dst.buffer)
    if not found:
        return set()
    uses, touched = tile_op_uses(p.kernel.body)
    staged = set()
    for bid in found:
        sts = uses[bid]
        copies = [s for s in sts if s.WhichOneof("kind") == "copy"]
        gemms = [s.gemm for s in sts if s.WhichOneof("kind") == "gemm"]
        if bid in touched or len(copies) != 1 or copies[0].copy.dst.buffer != bid or \
                len(copies) + len(gemms) != len(sts) or not gemms or \
                any(g.a != bid or bid in (g.b, g.c) or g.transpose_a for g in gemms):
            continue
        staged.add(bid)
    return staged


def stage_fragment_operands(program: Program) -> Program:
    """`program` with its staged operands (staged_operands) in shared memory, or `program`
    itself when it has none."""
    staged = staged_operands(program.proto)
    if not staged:
        return program
    p = pb.Program()
    p.CopyFrom(program.proto)
    for b in p.buffers:
        if b.id in staged:
            b.scope = pb.SHARED
    return Program(p)
