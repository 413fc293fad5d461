"""Pipeline planning: which global -> shared copies of a T.Pipelined loop may run ahead of
the loop's other statements (target-independent; the cuda target turns them into a TMA
producer warpgroup, targets/cuda/ws_loop.py).

A copy at position i of the loop body runs ahead when issuing it any number of iterations
early, into a stage of its own, changes nothing the program can observe:

- it is a statement of the body itself (not under a condition or an inner loop), copies a
  region of a global tensor the kernel never writes into a whole shared tile;
- its offsets, and the loop's extent, are built from the loop variable, the block indices,
  the tensors' dims and the scalar parameters, the variables of the serial loops around the
  loop and the block's *uniform scalars* only (in a loop of nothing but copies, gather nests
  and gemms, elements of tensors the kernel never writes too: a grouped GEMM's tile table, a
  gather's row indices), so another
  thread can compute them before the body runs;
- the tile is written by no other statement, and accessed only inside the loop, after the
  copy (a read before it in the body would see the previous iteration's tile).

A *gather nest* runs ahead on the same terms: a T.Parallel nest over a whole shared tile whose
one statement stores `tile[i, c] = X[...]` under any number of `select(cond, ., 0)` (an im2col
tile; rows found through an index table), X a global tensor the kernel never writes, its
indices and conditions built as a copy's offsets are (and from the nest's own variables).

The loop may sit inside serial loops and `if`s (a persistent kernel's walk over its tiles,
stream-K's segments) whose extents and conditions are built the same way: the producer then
runs that skeleton of the program (those loops and `if`s, and the stores to the uniform
scalars) around its copies. A uniform scalar is a one-element local (`T.alloc_var`) every
store of which sits only under such loops and `if`s, outside any T.Pipelined loop, with a
value built the same way: every thread holds the same value, and the producer can keep it
too.

The copy's stage may be reused once the last body statement that touches its tile is done
(`release`).

A loop that is a statement of the kernel body itself may also have *head copies*: copies
before it in the body, of a region of a global tensor the kernel never writes into a whole
shared tile no other statement writes, at offsets built from the block indices, the dims and
the scalar parameters only (attention's Q tile). Another thread may issue them as soon as
the block starts (or, when blocks walk the grid, as soon as the previous block's last
statement touching the tile is done: `head_release`, a position in the kernel body).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tiled.compiler.passes.stmts import body_statements, tile_op_buffers
from tiled.ir.walk import element_accesses, expr_vars, stmt_exprs, subexprs, walk, written
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class GatherNest:
    """A gather nest's parts (module docstring): tile[row, col] = select(conds, X[indices],
    0)."""
    tile: int  # the shared tile it fills
    src: int  # the global tensor X
    row_var: int
    col_var: int
    indices: tuple  # of the load of X (pb.Expr)
    conds: tuple  # pb.Expr, all true for the element to be read (else 0)


@dataclass(frozen=True)
class RunAhead:
    loop: pb.For
    copies: tuple[int, ...]  # positions in the loop body of the copies that run ahead
    release: tuple[int, ...]  # per copy: the body position after which its tile is free
    nested: bool = False  # inside serial loops / ifs (the producer runs the skeleton)
    scalars: frozenset[int] = frozenset()  # the uniform scalars (module docstring)
    heads: tuple[int, ...] = ()  # kernel body positions of the head copies
    head_release: tuple[int, ...] = ()  # per head copy: the position after which it is free
    gathers: frozenset[int] = frozenset()  # the positions among `copies` of gather nests


def is_loop(s: pb.Stmt, var: int) -> bool:
    """Whether `s` is the loop of variable `var`."""
    return s.WhichOneof("kind") == "for_" and s.for_.var == var


def holds_loop(s: pb.Stmt, var: int) -> bool:
    """Whether `s` is, or has inside it, the loop of variable `var`."""
    return any(is_loop(st, var) for st in walk(s))


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


def _zero(e: pb.Expr) -> bool:
    kind = e.WhichOneof("kind")
    if kind == "cast":
        return _zero(e.cast.value)
    return (kind == "int_value" and e.int_value == 0) or \
        (kind == "float_value" and e.float_value == 0)


def gather_nest(s: pb.Stmt, buffers) -> GatherNest | None:
    """The parts of `s` if it is a gather nest's form (module docstring: a T.Parallel nest
    over a whole shared tile storing a global tensor's element or 0), else None; whether it
    may run ahead is run_ahead's question, how it is issued the target's."""
    if s.WhichOneof("kind") != "for_" or s.for_.kind != pb.PARALLEL:
        return None
    outer = s.for_
    if outer.body.WhichOneof("kind") != "for_" or outer.body.for_.kind != pb.PARALLEL:
        return None
    inner = outer.body.for_
    if inner.body.WhichOneof("kind") != "store":
        return None
    store = inner.body.store
    tile = buffers.get(store.buffer)
    if tile is None or tile.scope != pb.SHARED or len(tile.shape) != 2 or \
            [x.WhichOneof("kind") for x in store.indices] != ["var", "var"] or \
            [x.var for x in store.indices] != [outer.var, inner.var]:
        return None
    ext = [outer.extent, inner.extent]
    if any(x.WhichOneof("kind") != "int_value" for x in ext) or \
            [x.int_value for x in ext] != [d.size for d in tile.shape]:
        return None
    conds, value = [], store.value
    while value.WhichOneof("kind") == "select" and _zero(value.select.false_value):
        conds.append(value.select.cond)
        value = value.select.true_value
    if value.WhichOneof("kind") != "load" or value.dtype != tile.dtype:
        return None
    src = buffers[value.load.buffer]
    if src.scope != pb.GLOBAL or src.dtype != tile.dtype or \
            len(value.load.indices) != len(src.shape):
        return None
    return GatherNest(store.buffer, value.load.buffer, outer.var, inner.var,
                      tuple(value.load.indices), tuple(conds))


def _pure(exprs, allowed: set[int], scalars: set[int] | frozenset = frozenset()) -> bool:
    """Whether `exprs` load nothing but the buffers `scalars` (uniform scalars; in a GEMM
    loop, tensors the kernel never writes too) and use only the variables `allowed`."""
    exprs = list(exprs)
    if any(x.WhichOneof("kind") == "load" and x.load.buffer not in scalars
           for e in exprs for x in subexprs(e)):
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


def _skeleton_stmts(s: pb.Stmt, outer: tuple = ()):
    """(statement, the For / IfThenElse statements around it) for every statement of `s`
    outside T.Parallel / vectorized nests and T.ws regions (walk's order)."""
    yield s, outer
    kind = s.WhichOneof("kind")
    if kind == "seq":
        for x in s.seq.stmts:
            yield from _skeleton_stmts(x, outer)
    elif kind == "for_" and s.for_.kind in (pb.SERIAL, pb.UNROLL, pb.PIPELINED):
        yield from _skeleton_stmts(s.for_.body, (*outer, s))
    elif kind == "if_then_else":
        yield from _skeleton_stmts(s.if_then_else.then_body, (*outer, s))
        if s.if_then_else.HasField("else_body"):
            yield from _skeleton_stmts(s.if_then_else.else_body, (*outer, s))


def _control_ok(outer, allowed: set[int], scalars) -> bool:
    """Whether every loop / if of `outer` is a serial loop or an `if` whose extent or
    condition the producer can compute (`allowed` vars, `scalars` loads)."""
    for o in outer:
        if o.WhichOneof("kind") == "for_":
            if o.for_.kind not in (pb.SERIAL, pb.UNROLL):
                return False
            if not _pure([o.for_.extent], allowed | _loop_vars(outer), scalars):
                return False
        elif not _pure([o.if_then_else.cond], allowed | _loop_vars(outer), scalars):
            return False
    return True


def _loop_vars(outer) -> set[int]:
    return {o.for_.var for o in outer if o.WhichOneof("kind") == "for_"}


def uniform_scalars(p: pb.Program, uniform: set[int],
                    constant: frozenset[int] = frozenset()) -> frozenset[int]:
    """The block's uniform scalars (module docstring); `constant`: the tensors the kernel
    never writes, whose elements their values may load."""
    found = {b.id for b in p.buffers if b.scope == pb.LOCAL and len(b.shape) == 1
             and b.shape[0].WhichOneof("kind") == "size" and b.shape[0].size == 1}
    stores = [(st, outer) for st, outer in _skeleton_stmts(p.kernel.body)
              if st.WhichOneof("kind") == "store"]
    # Every write a store under loops and ifs only (not in a nest, not an atomic's value):
    anywhere = Counter(bid for st in walk(p.kernel.body) for bid in written(st))
    placed = Counter(st.store.buffer for st, _ in stores)
    found = {bid for bid in found if anywhere[bid] == placed[bid]}
    while True:  # a scalar built from another that is not uniform is not either
        bad = {st.store.buffer for st, outer in stores if st.store.buffer in found and not (
            _control_ok(outer, uniform, found | constant) and  # nor in a T.Pipelined loop
            _pure([*st.store.indices, st.store.value], uniform | _loop_vars(outer),
                  found | constant))}
        if not bad:
            return frozenset(found)
        found -= bad


def touched_outside(s: pb.Stmt, f: pb.For) -> set[int]:
    """Buffers the statements of `s` outside loop `f` read or write (the loops and ifs
    around `f` count by their extents and conditions only)."""
    kind = s.WhichOneof("kind")
    if is_loop(s, f.var):
        return set()
    if not holds_loop(s, f.var):
        return touched(s)
    if kind == "seq":
        return set().union(*(touched_outside(x, f) for x in s.seq.stmts))
    out = {x.load.buffer for e in stmt_exprs(s) for x in subexprs(e)
           if x.WhichOneof("kind") == "load"}
    if kind == "for_":
        return out | touched_outside(s.for_.body, f)
    out |= touched_outside(s.if_then_else.then_body, f)
    if s.if_then_else.HasField("else_body"):
        out |= touched_outside(s.if_then_else.else_body, f)
    return out


def run_ahead(p: pb.Program, tables_anywhere=False) -> RunAhead | None:
    """The first T.Pipelined loop of `p` with copies that may run ahead (module docstring),
    or None. `tables_anywhere`: table loads in any loop, not only a GEMM loop's; a bool, or a
    predicate of the loop statement (the target's choice per loop)."""
    buffers = {b.id: b for b in p.buffers}
    params = {prm.buffer for prm in p.params if prm.WhichOneof("kind") == "buffer"}
    writes_anywhere: dict[int, int] = {}
    for st in walk(p.kernel.body):
        for bid in written(st):
            writes_anywhere[bid] = writes_anywhere.get(bid, 0) + 1
    uniform = uniform_vars(p)
    # Tensors the kernel never writes (a tile table): another thread loading the same
    # element early reads what the body would.
    constant = frozenset(bid for bid in params if buffers[bid].scope == pb.GLOBAL
                         and not writes_anywhere.get(bid))
    found_scalars: dict[bool, frozenset[int]] = {}
    for s, outer in _skeleton_stmts(p.kernel.body):
        if s.WhichOneof("kind") != "for_" or s.for_.kind != pb.PIPELINED:
            continue
        # Table loads in a GEMM loop (copies and gemms: grouped GEMMs' tile tables), and in
        # the loops the target's `tables_anywhere` admits (cuda: loops whose gemms all take
        # wgmma, as MLA decode's, measured faster so; the compile option ring_tables, every
        # loop).
        anywhere = tables_anywhere(s) if callable(tables_anywhere) else tables_anywhere
        body = body_statements(s.for_.body)
        nests = [gather_nest(x, buffers) for x in body]  # each statement's, or None
        tables_allowed = anywhere or all(x.WhichOneof("kind") in ("copy", "gemm") or
                                         g is not None for x, g in zip(body, nests, strict=True))
        tables = constant if tables_allowed else frozenset()
        scalars = frozenset()
        if outer:
            if tables_allowed not in found_scalars:
                found_scalars[tables_allowed] = uniform_scalars(p, uniform, tables)
            scalars = found_scalars[tables_allowed]
        known = scalars | tables
        if outer and not _control_ok(outer, uniform, known):
            continue
        f = s.for_
        allowed = uniform | _loop_vars(outer)
        if not _pure([f.extent], allowed, known):
            continue
        outside = touched_outside(p.kernel.body, f)
        uses = [touched(x) for x in body]  # buffers each body statement touches
        copies, release, gathered = [], [], set()
        for i, (st, g) in enumerate(zip(body, nests, strict=True)):
            c = _whole_tile_copy(st, buffers, params, writes_anywhere)
            if c is not None:
                tile, ok = c.dst.buffer, _pure(c.src.offsets, allowed | {f.var}, known)
            elif g is not None:
                tile = g.tile
                ok = g.src in params and not writes_anywhere.get(g.src) and \
                    writes_anywhere.get(tile) == 1 and \
                    _pure([*g.indices, *g.conds], allowed | {f.var, g.row_var, g.col_var},
                          known)
            else:
                continue
            if not ok or tile in outside or any(tile in u for u in uses[:i]):
                continue
            copies.append(i)
            release.append(max(j for j, u in enumerate(uses) if tile in u))
            if c is None:
                gathered.add(i)
        if copies:
            heads = () if outer else _head_copies(p, s, buffers, params, writes_anywhere,
                                                   uniform)
            return RunAhead(f, tuple(copies), tuple(release), bool(outer), scalars,
                            tuple(h for h, _ in heads), tuple(r for _, r in heads),
                            frozenset(gathered))
    return None


def _head_copies(p: pb.Program, loop: pb.Stmt, buffers, params, writes_anywhere,
                 uniform) -> list[tuple[int, int]]:
    """(position, release position) in the kernel body of each head copy of `loop`, a
    T.Pipelined loop outside any other loop or if (module docstring)."""
    top = body_statements(p.kernel.body)
    at = next((i for i, st in enumerate(top) if is_loop(st, loop.for_.var)), None)
    if at is None:  # inside a block of its own: left as written
        return []
    uses = [touched(x) for x in top]
    out = []
    for i, st in enumerate(top[:at]):
        c = _whole_tile_copy(st, buffers, params, writes_anywhere)
        if c is None or any(c.dst.buffer in u for u in uses[:i]) or \
                not _pure(c.src.offsets, uniform):
            continue
        out.append((i, max(j for j, u in enumerate(uses) if c.dst.buffer in u)))
    return out


def _whole_tile_copy(st: pb.Stmt, buffers, params, writes_anywhere) -> pb.Copy | None:
    """`st`'s copy if it copies a region of a global tensor the kernel never writes into a
    whole shared tile that no other statement writes (not a TMA copy), else None."""
    if st.WhichOneof("kind") != "copy" or st.copy.HasField("tma"):
        return None
    c = st.copy
    src, dst = buffers[c.src.buffer], buffers[c.dst.buffer]
    if src.scope != pb.GLOBAL or dst.scope != pb.SHARED or src.id not in params or \
            writes_anywhere.get(src.id) or writes_anywhere.get(dst.id) != 1 or \
            any(e.WhichOneof("kind") != "int_value" or e.int_value for e in c.dst.offsets) or \
            [e for e in c.src.extents if e != 1] != [d.size for d in dst.shape if d.size != 1]:
        return None
    return c


def offset_steps(p: pb.Program, f: pb.For, c: pb.Copy) -> list[int | None]:
    """Per source offset of copy `c` in loop `f`: by how many elements it moves from one
    iteration to the next, proved for every value of the dims, block indices and scalars
    (TVM's arithmetic analyzer, not sampled), or None where that is not one constant. A
    load (of a uniform scalar: run_ahead's offsets load nothing else) is an unknown value
    the loop does not change."""
    from tvm import tirx

    from tiled.compiler.tir import ExprLowering, steps_along
    from tiled.ir.program import Program

    class Steps(ExprLowering):
        def load(self, bid: int, indices: list) -> tirx.PrimExpr:
            if bid not in loaded:
                loaded[bid] = tirx.Var(f"b{bid}", self.tir_dtype(self.buffers[bid].dtype))
            return loaded[bid]

    loaded: dict[int, tirx.Var] = {}
    low = Steps(Program(p))
    for v in p.vars:
        low.vars[v.id] = tirx.Var(f"v{v.id}", low.var_dtype[v.id])
    return steps_along(low, c.src.offsets, f.var)
