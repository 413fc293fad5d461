"""Tiles the cpu lowering need not stage: copies between a global tensor and a whole
block-local tile, and tiles computed only to be reduced, folded into the loops around them.

A kernel like RMSNorm copies a row block into a fragment, computes on it, and copies it back.
On a CPU each such copy is a pass over the tile through the caches, on top of the passes that
compute; for a memory-bound kernel they are most of its time. Three folds, all on statements
at the top level of the kernel body (so their region offsets are fixed for the block):

- copy in: `T.copy(G[region], F)` onto the whole tile F, where G is never written by the
  kernel. Until F is next written, a load of F[idx] reads G at the matching element (zero
  out of bounds, as the copy would have stored); the copy is dropped. The write that ends it
  must be a whole-tile loop (`full_write`), or none.
- copy out: `T.copy(F, G[region])` of the whole tile F, right after a whole-tile loop that
  writes F and does not touch G, with F not used again. That loop stores into G directly
  (in bounds only, as the copy would have); the copy is dropped.
- into a reduction: a whole-tile loop that only stores the tile, right before a reduction of
  that tile whose result it does not read. The reduction computes each element as the loop
  would have stored it, and stores it too where the tile is used again; the loop is dropped
  (RMSNorm's squares never reach memory, softmax's exponentials are summed as stored).

Pure Tile IR: `plan` says what to fold, by position in the body's top-level statements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiled.ir.walk import stmt_exprs, subexprs, walk, written
from tiled.v1 import tile_ir_pb2 as pb


@dataclass
class Plan:
    skip: set[int] = field(default_factory=set)  # top-level statements folded away
    # top-level position of a copy in -> (tile, copy, end): the tile reads through the copy
    # until the statement at position `end` has run (len(statements): to the end).
    copy_in: dict[int, tuple[int, pb.Copy, int]] = field(default_factory=dict)
    # top-level position of a whole-tile loop -> (tile, copy out) its stores go through
    copy_out: dict[int, tuple[int, pb.Copy]] = field(default_factory=dict)
    # top-level position of a whole-tile loop (skipped) -> (the tile the reduction after it
    # computes from the loop's store, whether it stores the tile too)
    into_reduce: dict[int, tuple[int, bool]] = field(default_factory=dict)


def top_level(body: pb.Stmt) -> list[pb.Stmt]:
    return list(body.seq.stmts) if body.WhichOneof("kind") == "seq" else [body]


def plan(program: pb.Program) -> Plan:
    """What the cpu lowering folds in `program` (see the module docstring)."""
    stmts = top_level(program.kernel.body)
    bufs = {b.id: b for b in program.buffers}
    ever_written = {b for st in walk(program.kernel.body) for b in written(st)}
    out = Plan()
    for c, st in enumerate(stmts):
        if st.WhichOneof("kind") != "copy":
            continue
        cp = st.copy
        src, dst = bufs[cp.src.buffer], bufs[cp.dst.buffer]
        if src.scope == pb.GLOBAL and dst.scope != pb.GLOBAL and src.id not in ever_written \
                and _whole(cp.dst, dst) and _same_tile(cp):
            end = _reads_until(stmts, c + 1, dst)
            if end is not None:
                out.skip.add(c)
                out.copy_in[c] = (dst.id, cp, end)
        if src.scope != pb.GLOBAL and dst.scope == pb.GLOBAL and c > 0 and \
                _whole(cp.src, src) and _same_tile(cp) and \
                full_write(stmts[c - 1], src) and not _uses(stmts[c - 1], dst.id) and \
                not any(_uses(s, src.id) for s in stmts[c + 1:]):
            out.skip.add(c)
            out.copy_out[c - 1] = (src.id, cp)
    for c, st in enumerate(stmts[:-1]):
        red = stmts[c + 1]
        if red.WhichOneof("kind") != "reduce" or c in out.copy_out or c + 1 in out.skip:
            continue
        tile = bufs[red.reduce.src]
        if tile.scope != pb.GLOBAL and red.reduce.dst != tile.id and \
                full_write(st, tile) and len(top_level(innermost(st))) == 1 and \
                not _loads(st, red.reduce.dst):
            out.skip.add(c)
            out.into_reduce[c] = (tile.id, any(_uses(s, tile.id) for s in stmts[c + 2:]))
    return out


def innermost(st: pb.Stmt) -> pb.Stmt:
    """The body inside a nest of loops."""
    while st.WhichOneof("kind") == "for_":
        st = st.for_.body
    return st


def loop_vars(st: pb.Stmt) -> list[int]:
    """The variables of a nest of loops, outermost first."""
    out = []
    while st.WhichOneof("kind") == "for_":
        out.append(st.for_.var)
        st = st.for_.body
    return out


def tile_coords(tile: pb.Buffer, indices: list) -> list:
    """A whole-tile copy's loop coordinates at element `indices` of the tile: its indices
    along the dims longer than 1 (what tiled.compiler.tir.region_index takes)."""
    return [i for i, d in zip(indices, tile.shape, strict=True) if d.size != 1]


def full_write(st: pb.Stmt, tile: pb.Buffer) -> bool:
    """Whether `st` is a loop nest over exactly `tile`'s shape whose body is stores only, one
    of them to tile[loop vars] and after every load of the tile, each of those loads at the
    same element: each iteration reads at most its own element before it writes it, so
    reading the tile's source instead, or storing elsewhere, changes no value read."""
    loop_vars = []
    for d in tile.shape:
        if st.WhichOneof("kind") != "for_" or st.for_.kind == pb.PIPELINED or \
                st.for_.extent.WhichOneof("kind") != "int_value" or \
                st.for_.extent.int_value != d.size or d.size == 0:
            return False
        loop_vars.append(st.for_.var)
        st = st.for_.body
    body = top_level(st)
    if not all(s.WhichOneof("kind") == "store" for s in body):
        return False
    mine = [k for k, s in enumerate(body) if s.store.buffer == tile.id]
    if len(mine) != 1 or not at_vars(body[mine[0]].store.indices, loop_vars):
        return False
    for k, s in enumerate(body):
        exprs = [*s.store.indices, s.store.value]
        for e in exprs:
            for x in subexprs(e):
                if x.WhichOneof("kind") == "load" and x.load.buffer == tile.id and \
                        (k > mine[0] or not at_vars(x.load.indices, loop_vars)):
                    return False
    return True


def at_vars(indices, loop_vars) -> bool:
    """Whether `indices` are exactly the variables `loop_vars`, in order."""
    return len(indices) == len(loop_vars) and all(
        i.WhichOneof("kind") == "var" and i.var == v for i, v in zip(indices, loop_vars,
                                                                      strict=True))


def _whole(region: pb.Region, buf: pb.Buffer) -> bool:
    return len(region.extents) == len(buf.shape) and all(
        o.WhichOneof("kind") == "int_value" and o.int_value == 0
        for o in region.offsets) and all(
        d.WhichOneof("kind") == "size" and e == d.size
        for e, d in zip(region.extents, buf.shape, strict=True))


def _same_tile(cp: pb.Copy) -> bool:
    return [e for e in cp.src.extents if e != 1] == [e for e in cp.dst.extents if e != 1]


def _reads_until(stmts: list[pb.Stmt], start: int, tile: pb.Buffer) -> int | None:
    """Where the tile copied in before `start` is next written: the position of a whole-tile
    loop (len(stmts): never), or None when something else writes it or needs it in memory
    (a gemm's operand, a scan's source) first."""
    for j in range(start, len(stmts)):
        if full_write(stmts[j], tile):
            return j
        for s in walk(stmts[j]):
            kind = s.WhichOneof("kind")
            if tile.id in written(s) or (kind == "gemm" and tile.id in (s.gemm.a, s.gemm.b)) \
                    or (kind == "scan" and s.scan.src == tile.id):
                return None
    return len(stmts)


def loads(st: pb.Stmt) -> list[pb.Load]:
    """Every element load in `st`."""
    return [x.load for s in walk(st) for e in stmt_exprs(s) for x in subexprs(e)
            if x.WhichOneof("kind") == "load"]


def _loads(st: pb.Stmt, buf: int) -> bool:
    return any(ld.buffer == buf for ld in loads(st))


def _uses(st: pb.Stmt, buf: int) -> bool:
    return any(buf in written(s) for s in walk(st)) or reads(st, buf)


def reads(st: pb.Stmt, buf: int) -> bool:
    """Whether `st` reads buffer `buf` anywhere: a load, a copy's source, a gemm's operand, a
    reduction's or a scan's source."""
    for s in walk(st):
        kind = s.WhichOneof("kind")
        node = getattr(s, kind)
        if _loads(s, buf):
            return True
        if kind == "copy" and node.src.buffer == buf:
            return True
        if kind == "gemm" and buf in (node.a, node.b):
            return True
        if kind in ("reduce", "scan") and node.src == buf:
            return True
    return False
