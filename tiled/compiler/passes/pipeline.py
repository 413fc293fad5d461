"""Pipeline planning: which global -> shared copies of a T.Pipelined loop may run ahead of
the loop's other statements (target-independent; the cuda target turns them into a TMA
producer warpgroup, targets/cuda/ws_loop.py).

A copy at position i of the loop body runs ahead when issuing it any number of iterations
early, into a stage of its own, changes nothing the program can observe:

- it is a statement of the body itself (not under a condition or an inner loop), copies a
  region of a global tensor the kernel never writes into a whole shared tile;
- its offsets, and the loop's extent, are built from the loop variable, the block indices,
  the tensors' dims and the scalar parameters only (no loads, no variables the body binds),
  so another thread can compute them before the body runs;
- the tile is written by no other statement, and accessed only inside the loop, after the
  copy (a read before it in the body would see the previous iteration's tile).

The copy's stage may be reused once the last body statement that touches its tile is done
(`release`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiled.compiler.passes.layout import body_statements, tile_op_buffers
from tiled.ir.walk import element_accesses, expr_vars, subexprs, walk, written
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class RunAhead:
    loop: pb.For
    copies: tuple[int, ...]  # positions in the loop body of the copies that run ahead
    release: tuple[int, ...]  # per copy: the body position after which its tile is free


def touched(s: pb.Stmt) -> set[int]:
    """Buffers `s` and the statements nested in it read or write."""
    out: set[int] = set()
    for st in walk(s):
        out |= tile_op_buffers(st) | written(st)
    out |= {bid for bid, _ in element_accesses(s)}
    return out


def gathers(s: pb.Stmt, buffers) -> bool:
    """Whether `s` (or a statement in it) moves global data into shared memory itself: a
    global -> shared copy, or an element store into a shared tile of a value it loads from
    a global tensor (an im2col gather)."""
    for st in walk(s):
        kind = st.WhichOneof("kind")
        if kind == "copy" and buffers[st.copy.src.buffer].scope == pb.GLOBAL and \
                buffers[st.copy.dst.buffer].scope == pb.SHARED:
            return True
        if kind == "store" and buffers[st.store.buffer].scope == pb.SHARED and any(
                x.WhichOneof("kind") == "load" and buffers[x.load.buffer].scope == pb.GLOBAL
                for x in subexprs(st.store.value)):
            return True
    return False


def _pure(exprs, allowed: set[int]) -> bool:
    """Whether `exprs` load nothing and use only the variables `allowed`."""
    exprs = list(exprs)
    if any(x.WhichOneof("kind") == "load" for e in exprs for x in subexprs(e)):
        return False
    return expr_vars(exprs) <= allowed


def uniform_vars(p: pb.Program) -> set[int]:
    """Variables every thread of a block knows from the start: the block indices, the
    tensors' symbolic dims and the scalar parameters."""
    out = set(p.kernel.block_vars)
    for b in p.buffers:
        out |= {d.var for d in b.shape if d.WhichOneof("kind") == "var"}
    out |= {prm.scalar for prm in p.params if prm.WhichOneof("kind") == "scalar"}
    return out


def run_ahead(p: pb.Program) -> RunAhead | None:
    """The first top-level T.Pipelined loop of `p` with copies that may run ahead (module
    docstring), or None."""
    buffers = {b.id: b for b in p.buffers}
    params = {prm.buffer for prm in p.params if prm.WhichOneof("kind") == "buffer"}
    writes_anywhere: dict[int, int] = {}
    for st in walk(p.kernel.body):
        for bid in written(st):
            writes_anywhere[bid] = writes_anywhere.get(bid, 0) + 1
    top = body_statements(p.kernel.body)
    uniform = uniform_vars(p)
    for index, s in enumerate(top):
        if s.WhichOneof("kind") != "for_" or s.for_.kind != pb.PIPELINED:
            continue
        f = s.for_
        if not _pure([f.extent], uniform):
            continue
        outside = set()
        for j, other in enumerate(top):
            if j != index:
                outside |= touched(other)
        body = body_statements(f.body)
        uses = [touched(x) for x in body]  # buffers each body statement touches
        copies, release = [], []
        for i, st in enumerate(body):
            if st.WhichOneof("kind") != "copy" or st.copy.HasField("tma"):
                continue
            c = st.copy
            src, dst = buffers[c.src.buffer], buffers[c.dst.buffer]
            if src.scope != pb.GLOBAL or dst.scope != pb.SHARED or src.id not in params or \
                    writes_anywhere.get(src.id) or writes_anywhere.get(dst.id) != 1 or \
                    dst.id in outside or any(dst.id in u for u in uses[:i]):
                continue
            if not _pure(c.src.offsets, uniform | {f.var}) or \
                    any(e.WhichOneof("kind") != "int_value" or e.int_value
                        for e in c.dst.offsets) or \
                    [e for e in c.src.extents if e != 1] != \
                    [d.size for d in dst.shape if d.size != 1]:
                continue
            last = max(j for j, u in enumerate(uses) if dst.id in u)
            copies.append(i)
            release.append(last)
        if copies:
            return RunAhead(f, tuple(copies), tuple(release))
    return None



def offset_steps(p: pb.Program, f: pb.For, c: pb.Copy) -> list[int | None]:
    """Per source offset of copy `c` in loop `f`: by how many elements it moves from one
    iteration to the next, proved for every value of the dims, block indices and scalars
    (TVM's arithmetic analyzer, not sampled), or None where that is not one constant."""
    from tvm import tirx
    from tvm.sym import Analyzer

    from tiled.compiler.tir import ExprLowering
    from tiled.ir.program import Program

    low = ExprLowering(Program(p))
    for v in p.vars:
        low.vars[v.id] = tirx.Var(f"v{v.id}", low.var_dtype[v.id])
    k = low.vars[f.var]
    ana = Analyzer()
    steps: list[int | None] = []
    for e in c.src.offsets:
        low.vars[f.var] = k + 1
        after = low.expr(e)
        low.vars[f.var] = k
        step = ana.simplify(after - low.expr(e))
        steps.append(int(step.value) if isinstance(step, tirx.IntImm) else None)
    return steps
