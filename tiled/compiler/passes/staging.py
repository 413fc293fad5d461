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

The other way round, `unstage_register_operands`: the repo's FlashAttention example (and
older TileLang kernels) hand P to the second gemm through shared memory,

    T.copy(S, P_shared)          # the scores' accumulator, cast to 16 bits
    T.gemm(P_shared, V_shared, acc)

which costs a round trip through shared memory and a block barrier per iteration where
wgmma could take A straight from the registers that hold S (FlashAttention's RS form). A
shared tile qualifies for becoming a fragment when:

- it is written only by one whole-tile copy from a fragment of its shape that is the
  accumulator of a gemm (so that layout inference gives it the accumulator's layout, which
  is wgmma's A-operand layout);
- it is read only as A of gemms (not transposed), none of them FullCol (whose warps, or
  warpgroups on sm_90a, split the output's columns: each needs all of A's rows, not the
  part of them its own accumulator holds), and accessed by nothing else.

A shared tile every thread sees and a fragment each thread holds its part of then give the
same values to the same gemm: the copy is the tile's only writer and the gemm its only
reader.
"""

from __future__ import annotations

from tiled.compiler.passes.stmts import body_statements, tile_op_uses, whole_region
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


def _operand_only(bid: int, sts: list[pb.Stmt], touched: set[int]) -> pb.Copy | None:
    """The one copy that writes tile `bid`, when that copy and gemms reading it as A (not
    transposed, nowhere else) are all that touch it (`sts`: the tile ops on it; `touched`:
    the buffers accessed element by element); else None."""
    copies = [s.copy for s in sts if s.WhichOneof("kind") == "copy"]
    gemms = [s.gemm for s in sts if s.WhichOneof("kind") == "gemm"]
    if bid in touched or len(copies) != 1 or copies[0].dst.buffer != bid or not gemms or \
            len(copies) + len(gemms) != len(sts) or \
            any(g.a != bid or bid in (g.b, g.c) or g.transpose_a for g in gemms):
        return None
    return copies[0]


def _with_scope(program: Program, bids: set[int], scope) -> Program:
    """`program` with buffers `bids` in `scope`, or `program` itself when `bids` is empty."""
    if not bids:
        return program
    p = pb.Program()
    p.CopyFrom(program.proto)
    for b in p.buffers:
        if b.id in bids:
            b.scope = scope
    return Program(p)


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
    return {bid for bid in found if _operand_only(bid, uses[bid], touched) is not None}


def stage_fragment_operands(program: Program) -> Program:
    """`program` with its staged operands (staged_operands) in shared memory, or `program`
    itself when it has none."""
    return _with_scope(program, staged_operands(program.proto), pb.SHARED)


def unstaged_operands(p: pb.Program) -> set[int]:
    """The shared tiles of `p` that may live in registers instead (module docstring)."""
    buffers = {b.id: b for b in p.buffers}
    accumulators = {st.gemm.c for st in walk(p.kernel.body) if st.WhichOneof("kind") == "gemm"}
    uses, touched = tile_op_uses(p.kernel.body)
    found = set()
    for bid, sts in uses.items():
        b = buffers[bid]
        c = _operand_only(bid, sts, touched) if b.scope == pb.SHARED else None
        if c is None or any(s.gemm.policy == pb.POLICY_FULL_COL for s in sts
                            if s.WhichOneof("kind") == "gemm"):
            continue
        src = buffers[c.src.buffer]
        if src.scope == pb.FRAGMENT and src.id in accumulators and whole_region(c.dst, b) and \
                whole_region(c.src, src) and \
                [d.size for d in src.shape] == [d.size for d in b.shape]:
            found.add(bid)
    return found


def unstage_register_operands(program: Program) -> Program:
    """`program` with its unstaged operands (unstaged_operands) in registers, or `program`
    itself when it has none."""
    return _with_scope(program, unstaged_operands(program.proto), pb.FRAGMENT)
