"""Fragment layout inference, shared by every target.

A FRAGMENT tile belongs to the block but lives in its threads' registers; its layout says
which thread holds which element. Two layouts are target-independent (passes/layout_kinds.py):

- `CyclicLayout`: runs of consecutive elements (16 bytes, up to the target's longest) dealt
  round-robin over the threads.
- `ReplicatedLayout`: every thread holds the whole tile. Chosen for reduction results and for
  tiles indexed other than by the loop variables of a T.Parallel nest (e.g. `m[i]` inside a
  loop over (i, j)), since any thread may then need any element.

A target brings its instruction layouts through `Anchors`: the layout of a gemm accumulator
(an mma or wgmma fragment on CUDA), the layout in which a fragment is a gemm's A operand in
registers, and its rows layouts (a vector over the rows of a 2-D layout whose rows each live
in a few lanes, so a row reduction is a per-thread combine and a few shuffles).

Inference: gemm accumulators first; an accumulator layout spreads to fragments of the same
shape that are indexed exactly by the same T.Parallel nest as such a fragment, or copied
whole to or from one (T.copy between fragments, T.cumsum): a copy between fragments of one
layout is a per-thread move; the row reductions of a tile with rows get its rows layout,
which spreads the same way through 1-D nests, and survives only where every `m[i]` read in an
(i, j) nest is over a tile with the same rows; other reduce outputs and non-identity-indexed
or scalar-accessed fragments become replicated, and so does every fragment of a nest that
writes a replicated one (each thread must then run the whole nest) and a fragment placed by
nothing else that is moved to or from a replicated one; a gemm A operand left without a
layout takes the target's A-operand layout where it has one; the rest are cyclic.

A vector read as v[j] in an (i, j) nest over a tile whose layout has a columns layout (a
target's accumulator: `cols()`) takes it, so each thread holds the columns it holds in the
tile; otherwise it is replicated.

A 2-D tile related row by row to vectors of its columns (reduced over dim 0 into one, a
row copied to or from one, X[k, i] read in a 1-D nest over them: a flash-decoding combine's
log-sum-exps [splits, rows]) is stacked on their layout (`StackedLayout`): each thread holds
its columns of every row, so none of these leaves the thread. The vectors take the layout
their other uses give (a tile's rows, say) or, placed by nothing else, a cyclic one; a tile
read as X[k, i] over vectors it is not stacked on is replicated.

Cyclic tiles have rows too where a row takes a group of at most 32 consecutive lanes
(`CyclicRows`, on targets that take them: CUDA, ROCm): a 2-D tile placed by nothing else
whose rows a reduction or a row vector reads is made cyclic before the row vectors are
placed, so that they take its rows. If that leaves a nest over such rows that also indexes a
replicated fragment by its variables, or a reduction into them from something else, the
layouts are inferred again without cyclic rows (`infer_layouts`).
"""

from __future__ import annotations

from typing import Protocol

from tiled.compiler.passes.layout_kinds import (
    CyclicLayout,
    CyclicRows,
    ReplicatedLayout,
    StackedLayout,
    cols_of,
    columns_of,
    cyclic_vector,
    rows_of,
    stacked_on,
)
from tiled.compiler.passes.stmts import (
    column_link,
    column_read,
    fragment_pair,
    is_identity,
    parallel_nest,
)
from tiled.compiler.passes.vectorize import VECTOR_BYTES
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.walk import element_accesses, stmt_exprs, stores, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb


class Anchors(Protocol):
    """What a target tells layout inference about its instructions."""

    rows_layouts: tuple[type, ...]  # layouts replicated over a few lanes (row vectors)
    max_vector: int  # the longest run of elements a thread of a cyclic layout holds

    def accumulator(self, g: pb.Gemm, buffers, threads: int):
        """The layout of gemm `g`'s accumulator C (a cyclic one where no instruction fits)."""

    def a_operand(self, g: pb.Gemm, buffers, c_layout):
        """The layout in which fragment A of `g` is read from registers, or None."""


def infer_layouts(program: pb.Program, anchors: Anchors,
                  accumulators: dict[int, object] | None = None) -> dict[int, object]:
    """Every fragment's layout. `anchors`: the target's instruction layouts; `accumulators`
    fixes the layouts of some gemm accumulators (a path that issues other instructions);
    others are chosen here."""
    if CyclicRows in anchors.rows_layouts:
        try:
            layouts = _infer_all(program, anchors, accumulators, True, cyclic_rows=True)
            if _cyclic_rows_hold(program, layouts):
                return layouts
        except CompileError:
            pass  # as without cyclic rows
    try:
        return _infer_all(program, anchors, accumulators, row_vectors=True)
    except CompileError:  # row vectors placed by their readers clash: place them as before
        return _infer_all(program, anchors, accumulators, row_vectors=False)


def _infer_all(program, anchors, accumulators, row_vectors: bool,
               cyclic_rows: bool = False) -> dict[int, object]:
    forced: set[int] = set()
    while True:  # a row vector read over a tile with other rows falls back to replicated
        layouts, misfits = _infer(program, anchors, accumulators or {}, forced, row_vectors,
                                  cyclic_rows)
        if not misfits:
            return layouts
        forced |= misfits


def _cyclic_rows_hold(program: pb.Program, layouts: dict[int, object]) -> bool:
    """Whether the CyclicRows that inference gave (if any) serve as meant: each one a
    reduction writes comes from the rows of its source tile, and no T.Parallel nest over one
    also indexes a replicated fragment by its loop variables (each thread would then index
    its replicated copy by its rows: local memory). Otherwise the layouts are inferred again
    without cyclic rows, as they were before them."""
    rows = {b for b, lay in layouts.items() if isinstance(lay, CyclicRows)}
    if not rows:
        return True
    for st in walk(program.kernel.body):
        kind = st.WhichOneof("kind")
        if kind == "reduce" and st.reduce.dst in rows and \
                rows_of(layouts.get(st.reduce.src)) != layouts[st.reduce.dst] and \
                not stacked_on(layouts.get(st.reduce.src), layouts[st.reduce.dst]):
            return False
        if kind == "for_" and st.for_.kind == pb.PARALLEL:
            nest, body = parallel_nest(st)
            loop_vars = {f.var for f in nest}
            accessed = element_accesses(body)
            if any(b in rows for b, _ in accessed) and any(
                    isinstance(layouts.get(b), ReplicatedLayout) and
                    any(i.WhichOneof("kind") == "var" and i.var in loop_vars for i in idx)
                    for b, idx in accessed):
                return False
    return True


def _infer(program: pb.Program, anchors: Anchors, accumulators: dict[int, object],
           forced: set[int], row_vectors: bool, cyclic_rows: bool = False
           ) -> tuple[dict[int, object], set[int]]:
    threads = program.kernel.threads
    buffers = {b.id: b for b in program.buffers}
    frags = {b.id for b in program.buffers if b.scope == pb.FRAGMENT}
    # the rows layouts row vectors may take (cyclic tiles' only when asked: infer_layouts)
    allowed = tuple(t for t in anchors.rows_layouts if cyclic_rows or t is not CyclicRows)
    layouts: dict[int, object] = {}
    replicated: set[int] = set(forced)
    reduces: list[pb.Reduce] = []
    all_stmts = list(walk(program.kernel.body))

    gemms: list[pb.Gemm] = []
    for st in all_stmts:
        if st.WhichOneof("kind") == "gemm":
            g = st.gemm
            gemms.append(g)
            c = buffers[g.c]
            lay = accumulators[g.c] if g.c in accumulators else \
                anchors.accumulator(g, buffers, threads)
            if g.c in layouts and layouts[g.c] != lay:
                raise CompileError(f"fragment {c.name or g.c} is the accumulator of gemms with "
                                   "different layouts")
            layouts[g.c] = lay
        elif st.WhichOneof("kind") == "reduce":
            reduces.append(st.reduce)

    # Parallel nests: identity-indexed fragments share a layout; others must be replicated,
    # except row vectors read as m[i] in an (i, j, ...) nest (checked once layouts are known).
    # Element accesses outside any T.Parallel nest also need every element in every thread.
    nests: list[set[int]] = []
    nest_writes: list[set[int]] = []  # the fragments each nest stores to
    moves: list[set[int]] = []  # fragments moved whole into one another (fragment_pair)
    row_reads: list[tuple[int, int]] = []  # (row vector, index of its nest in `nests`)
    col_reads: list[tuple[int, int]] = []  # (2-D tile read X[k, i] in a 1-D nest, the nest)
    col_vectors: list[tuple[int, int]] = []  # (column vector read v[j] in an (i, j) nest, nest)
    # (2-D tile, vector of its columns): T.copy of one of the tile's rows from or to the
    # vector, a reduction over the tile's dim 0 into it
    col_links: list[tuple[int, int]] = [column_link(st, buffers) for st in all_stmts]
    col_links = [x for x in col_links if x is not None and {*x} <= frags]
    touches: list[set[int]] = []  # what each copy and nest moves: the fragments' run lengths

    def visit(st: pb.Stmt) -> None:
        kind = st.WhichOneof("kind")
        pair = fragment_pair(st, buffers)
        if pair is not None:
            moves.append(set(pair))
        if kind == "copy":
            touches.append({st.copy.src.buffer, st.copy.dst.buffer})
        if kind == "for_" and st.for_.kind == pb.PARALLEL:
            nest, body = parallel_nest(st)
            shape = tuple(f.extent.int_value if f.extent.WhichOneof("kind") == "int_value"
                          else -1 for f in nest)
            loop_vars = [f.var for f in nest]
            written = {bid for bid, _ in stores(body)}
            ident = set()
            for bid, idx in element_accesses(body):
                if bid not in frags:
                    continue
                full = tuple(d.size for d in buffers[bid].shape)
                if is_identity(idx, loop_vars) and full == shape:
                    ident.add(bid)
                elif len(loop_vars) > 1 and is_identity(idx, loop_vars[:1]) and \
                        full == shape[:1] and bid not in written:
                    row_reads.append((bid, len(nests)))
                elif column_read(idx, loop_vars, full, shape) and bid not in written:
                    col_reads.append((bid, len(nests)))
                elif len(loop_vars) == 2 and is_identity(idx, loop_vars[1:]) and \
                        full == shape[1:] and bid not in written:
                    col_vectors.append((bid, len(nests)))
                else:
                    replicated.add(bid)
            nests.append(ident)
            touches.append(ident | {bid for bid, _ in element_accesses(body) if bid not in frags})
            nest_writes.append(written & frags)
            return
        for e in stmt_exprs(st):
            for sub in subexprs(e):
                if sub.WhichOneof("kind") == "load" and sub.load.buffer in frags:
                    replicated.add(sub.load.buffer)
        if kind in ("store", "atomic_add") and getattr(st, kind).buffer in frags:
            replicated.add(getattr(st, kind).buffer)
        if kind == "seq":
            for x in st.seq.stmts:
                visit(x)
        elif kind == "for_":
            visit(st.for_.body)
        elif kind == "if_then_else":
            visit(st.if_then_else.then_body)
            if st.if_then_else.HasField("else_body"):
                visit(st.if_then_else.else_body)

    visit(program.kernel.body)

    def propagate() -> None:
        changed = True
        while changed:
            changed = _spread(nests, moves, reduces, layouts, replicated, buffers, allowed,
                              row_reads if row_vectors else [])
            changed |= _stack(col_links, col_reads, nests, layouts, replicated, buffers,
                              anchors.rows_layouts)
            changed |= _columns(col_vectors, nests, layouts, replicated)

    propagate()
    # An A operand nothing else placed takes the layout its gemm reads from registers.
    placed = False
    for g in gemms:
        lay = anchors.a_operand(g, buffers, layouts.get(g.c))
        if lay is not None and g.a not in layouts and g.a not in replicated:
            layouts[g.a] = lay
            placed = True
    if placed:
        propagate()
    # A 2-D tile placed by nothing else whose rows a reduction or a row vector reads becomes
    # cyclic now, where the target takes CyclicRows and its rows fit in a warp: its row
    # vectors then take those rows instead of a replicated copy in every thread.
    if cyclic_rows:
        wanted = {r.src for r in reduces if r.dim in (1, -1)} | \
            {b for _, n in row_reads for b in nests[n]}
        free = {b for b in wanted if b in frags and b not in layouts and b not in replicated
                and len(buffers[b].shape) == 2}
        runs = _run_lengths(free, touches, buffers, anchors.max_vector) if free else {}
        rowed = False
        for bid in sorted(free):
            lay = _cyclic(buffers[bid], threads, runs[bid])
            if lay.rows() is not None:
                layouts[bid] = lay
                rowed = True
        if rowed:
            propagate()

    # A vector of a 2-D tile's columns placed by nothing else (the splits' log-sum-exps of a
    # flash-decoding combine, reduced over the splits) becomes cyclic, the tile stacked on it;
    # so does a tile placed by nothing else that a column vector is read over (v[j] in its
    # (i, j) nest), which the vector then takes the columns of.
    vectors = {v for _, v in col_links} | {b for _, n in col_reads for b in nests[n]} | \
        {b for _, n in col_vectors for b in nests[n]}
    free = {v for v in vectors if v not in layouts and v not in replicated}
    if free:
        runs = _run_lengths(free, touches, buffers, anchors.max_vector)
        for v in sorted(free):
            layouts[v] = _cyclic(buffers[v], threads, runs[v])
        propagate()

    # Each read over a nest's tiles must find the layout it needs there, or be replicated:
    # X[k, i] a tile stacked on the nest's vectors, m[i] their rows, v[j] their columns.
    misfits = _misfits(col_reads, nests, layouts, replicated, stacked_on) | \
        _misfits(row_reads, nests, layouts, replicated,
                 lambda lay, held: rows_of(held, allowed) == lay) | \
        _misfits(col_vectors, nests, layouts, replicated, lambda lay, held: cols_of(held) == lay)
    if misfits:
        return layouts, misfits
    for r in reduces:
        if r.dst not in layouts:
            replicated.add(r.dst)
    # A nest that writes a replicated fragment runs whole in every thread: every fragment it
    # indexes by its loop variables must be replicated too.
    for group, written in zip(nests, nest_writes, strict=True):
        if written & replicated:
            misfits |= group - replicated
    # A fragment moved whole to or from a replicated one, placed by nothing else, is
    # replicated too (the move is then a per-thread copy).
    for group in moves:
        if group & replicated:
            misfits |= {b for b in group - replicated if b not in layouts}
    if misfits:
        return layouts, misfits

    runs = _run_lengths(frags - replicated - set(layouts), touches, buffers, anchors.max_vector)
    for bid in frags:
        if bid in replicated:
            if bid in layouts and not isinstance(layouts[bid], anchors.rows_layouts):
                b = buffers[bid]
                raise CompileError(
                    f"fragment {b.name} is a gemm accumulator but is also read "
                    "element by element outside its T.Parallel layout (or reduced into); copy it "
                    "to another fragment first",
                    f"{b.loc.file}:{b.loc.line}" if b.HasField("loc") and b.loc.file else "")
            layouts[bid] = ReplicatedLayout(tuple(d.size for d in buffers[bid].shape))
        elif bid not in layouts:
            layouts[bid] = _cyclic(buffers[bid], threads, runs[bid])
    return layouts, set()


def _misfits(reads, nests, layouts, replicated, fits) -> set[int]:
    """The fragments of `reads` ((fragment, its nest) pairs) not replicated whose layout does
    not fit (`fits(layout, held)`) the one layout the nest's tiles hold."""
    out = set()
    for bid, nest in reads:
        held = {layouts[b] for b in nests[nest] if b in layouts and b not in replicated}
        lay = layouts.get(bid)
        if bid not in replicated and not (lay is not None and len(held) == 1 and
                                          fits(lay, next(iter(held)))):
            out.add(bid)
    return out


def _stack(col_links, col_reads, nests, layouts, replicated, buffers, rows_layouts) -> bool:
    """One round of placing 2-D tiles on the vectors of their columns (StackedLayout) and
    such vectors from their tiles; True when a layout was assigned."""
    changed = False
    pairs = list(col_links)
    for bid, nest in col_reads:
        pairs += [(bid, b) for b in nests[nest]]
    for x, v in pairs:
        if x in replicated or v in replicated:
            continue
        lay = layouts.get(x)
        if isinstance(lay, StackedLayout) and v not in layouts:
            layouts[v] = lay.inner
            changed = True
        elif x not in layouts and v in layouts:
            inner = columns_of(layouts[v], rows_layouts)
            if inner is not None:
                layouts[x] = StackedLayout(inner, buffers[x].shape[0].size)
                changed = True
    return changed


def _columns(col_vectors, nests, layouts, replicated) -> bool:
    """One round of placing column vectors read as v[j] over a tile whose layout has a
    columns layout (a target's accumulator: cols()) in it; True when one was placed."""
    changed = False
    for bid, nest in col_vectors:
        if bid in layouts or bid in replicated:
            continue
        held = {layouts[b] for b in nests[nest] if b in layouts and b not in replicated}
        cols = cols_of(next(iter(held))) if len(held) == 1 else None
        if cols is not None:
            layouts[bid] = cols
            changed = True
    return changed


def _cyclic(buf: pb.Buffer, threads: int, run: int) -> CyclicLayout:
    """The cyclic layout of fragment `buf` with runs of at most `run` elements."""
    shape = tuple(d.size for d in buf.shape)
    return CyclicLayout(shape, threads, cyclic_vector(shape, threads, run))


def _run_lengths(free: set[int], touches: list[set[int]], buffers, max_vector: int
                 ) -> dict[int, int]:
    """The longest run each cyclic fragment in `free` may take: 16 bytes of the narrowest
    element among the buffers it is moved with (those a copy or a T.Parallel nest touches
    together with it, transitively), at most `max_vector`. A float32 row read from and
    written to float32 tensors takes runs of 4, so a warp's 16-byte accesses cover 512
    contiguous bytes; a float32 fragment of a 16-bit tensor keeps the tensor's 8 (one 16-byte
    access of it per run)."""
    members = set().union(*touches) | free if touches else set(free)
    parent = {b: b for b in members}

    def root(b: int) -> int:
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        return b

    for group in touches:
        ids = sorted(group)
        for b in ids[1:]:
            parent[root(b)] = root(ids[0])
    widest: dict[int, int] = {}
    for b in members:
        run = max(1, min(max_vector, VECTOR_BYTES // dtypes.nbytes(buffers[b].dtype)))
        widest[root(b)] = max(widest.get(root(b), 1), run)
    return {b: widest[root(b)] for b in free}


def _spread(nests, moves, reduces, layouts, replicated, buffers, allowed, row_reads) -> bool:
    """One round of layout propagation through the nests, the fragment moves, the row
    reductions and the row vectors read over a tile (m[i] in an (i, j) nest: it takes the
    tile's rows layout, so a vector filled element by element in its own nest, such as a
    per-row scale, lives in the rows its readers hold); True when a layout was assigned. A
    move between fragments of different layouts is allowed (it goes through shared memory);
    a nest of them is not."""
    changed = False
    for group in nests + moves:
        known = {layouts[b] for b in group if b in layouts and b not in replicated}
        if len(known) > 1:
            if any(group is m for m in moves):
                continue
            raise CompileError("a T.Parallel loop mixes fragments of different layouts "
                               f"({', '.join(sorted(buffers[b].name for b in group))})")
        if known:
            lay = known.pop()
            for b in group:
                if b not in layouts and b not in replicated:
                    layouts[b] = lay
                    changed = True
    for r in reduces:  # row reductions of a tile with rows take its rows layout
        src = layouts.get(r.src)
        rows = rows_of(src, allowed) if r.src not in replicated else None
        if rows is None or r.dst in layouts or r.dst in replicated or \
                len(buffers[r.src].shape) != 2 or r.dim not in (1, -1) or \
                [d.size for d in buffers[r.dst].shape] != [buffers[r.src].shape[0].size]:
            continue
        layouts[r.dst] = rows
        changed = True
    for bid, nest in row_reads:
        if bid in layouts or bid in replicated:
            continue
        held = {layouts[b] for b in nests[nest] if b in layouts and b not in replicated}
        rows = rows_of(next(iter(held)), allowed) if len(held) == 1 else None
        if rows is not None:  # (a row read's shape is its tile's first dim: see _infer)
            layouts[bid] = rows
            changed = True
    return changed
