"""Row-skewed stores for the cpu lowering: a block's last pass, the one that stores its rows
to a global output, runs inside the reduction before it, one row behind.

A row-block kernel like softmax reduces each row of its tile (the sum of the exponentials,
which reads the block's next rows from memory through prefetches), maps the row results
(1 / sum), then stores the normalized rows (a copy-out fold). Run in that order the memory
reads while the reduction runs and only writes while the stores run. Skewed, one loop over
the row's elements reduces row r and stores row r - 1, so reads and writes overlap as in a
copy (the C forms of benchmarks/cpu/softmax_forms.c measured the same overlap across blocks
at 1.11-1.20x the blocked form). The rows' order of work changes, no value does: the store
of row r - 1 reads only row r - 1 of the tile and the row results, complete by then.

Which statements (top level, pure Tile IR in `plan`):
- a reduction along the last dim of a [rows, n] tile into a [rows] buffer, its elements
  computed or loaded;
- then any number of row maps: a loop over the rows storing a [rows] buffer at the row, from
  [rows] buffers at the row, scalars and constants, nothing the reduction reads;
- then the store loop: a whole-tile loop over [rows, n] whose stores go out through a copy
  (forward.py's copy-out fold), reading [rows, n] tiles at its element, [rows] buffers at
  its row and global tensors the kernel never writes.
Lowered skewed only where the reduction's pass reads memory: it prefetches the next block's
rows (`worth`). float32 softmax over 4096 x 4096 on the 2-core AVX2 VM, both builds in one
process: skewed 1.04-1.22x the unskewed build, per-round medians, in four runs
(benchmarks/cpu/skew_stores.py, results/cpu_skew_stores_run{1,2,3,4}.json).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.targets.cpu import forward
from tiled.compiler.tir import static_shape
from tiled.ir import dtypes
from tiled.ir.walk import walk, written
from tiled.v1 import tile_ir_pb2 as pb

# Off only to measure the choice (benchmarks/cpu/skew_stores.py).
ENABLED = True


@dataclass
class Skew:
    maps: list[int]  # top-level positions of the row maps
    store: int  # the store loop's


def plan(program: pb.Program, folds: forward.Plan) -> dict[int, Skew]:
    """Top-level position of a reduction -> the statements that run skewed inside it."""
    stmts = forward.top_level(program.kernel.body)
    bufs = {b.id: b for b in program.buffers}
    ever_written = {b for st in walk(program.kernel.body) for b in written(st)}
    out = {}
    for p, st in enumerate(stmts):
        if st.WhichOneof("kind") != "reduce" or p in folds.skip:
            continue
        r = st.reduce
        shape = static_shape(bufs[r.src])  # tiles' shapes are static
        if len(shape) != 2 or r.dim != 1 or shape[0] < 2 or \
                static_shape(bufs[r.dst]) != [shape[0]]:
            continue
        rows = shape[0]
        reduced = _reduction_loads(stmts, p, folds)
        maps, q = [], p + 1
        while q < len(stmts) and q not in folds.skip and \
                _row_map(stmts[q], rows, bufs, reduced):
            maps.append(q)
            q += 1
        if q < len(stmts) and q in folds.copy_out and \
                folds.copy_out[q][1].dst.buffer not in reduced and \
                _store_loop(stmts[q], shape, bufs, ever_written, folds.copy_out[q][0]):
            out[p] = Skew(maps, q)
    return out


def _reduction_loads(stmts, p: int, folds: forward.Plan) -> set[int]:
    """The buffers reduction `p` reads: its source and, where a folded loop computes its
    elements, that loop's loads."""
    out = {stmts[p].reduce.src}
    if p - 1 in folds.into_reduce:
        out |= {ld.buffer for ld in forward.loads(stmts[p - 1])}
    return out


def _row_map(st: pb.Stmt, rows: int, bufs, reduced: set[int]) -> bool:
    """A loop over the rows whose body stores one [rows] buffer at the row, from [rows]
    buffers at the row, scalars and constants; the buffer not read by the reduction."""
    if st.WhichOneof("kind") != "for_" or st.for_.kind == pb.PIPELINED or \
            st.for_.extent.WhichOneof("kind") != "int_value" or st.for_.extent.int_value != rows:
        return False
    var, body = st.for_.var, st.for_.body
    if body.WhichOneof("kind") != "store":
        return False

    def row_buf(b: int) -> bool:
        return bufs[b].scope != pb.GLOBAL and static_shape(bufs[b]) == [rows]

    s = body.store
    if not row_buf(s.buffer) or s.buffer in reduced or not forward.at_vars(s.indices, [var]):
        return False
    return all(row_buf(ld.buffer) and forward.at_vars(ld.indices, [var])
               for ld in forward.loads(body))


def _store_loop(st: pb.Stmt, shape: list[int], bufs, ever_written: set[int],
                tile: int) -> bool:
    """The whole-tile loop of a copy-out fold (of `tile`), reading [rows, n] tiles at its
    element, [rows] buffers at its row and global tensors the kernel never writes."""
    vars_ = forward.loop_vars(st)
    if len(vars_) != 2 or not forward.full_write(st, bufs[tile]):
        return False
    body = forward.top_level(forward.innermost(st))
    if len(body) != 1:
        return False
    for ld in forward.loads(st):
        b = bufs[ld.buffer]
        if b.scope == pb.GLOBAL:
            if ld.buffer in ever_written:
                return False
        elif static_shape(b) == shape:
            if not forward.at_vars(ld.indices, vars_):
                return False
        elif static_shape(b) == [shape[0]]:
            if not forward.at_vars(ld.indices, vars_[:1]):
                return False
        else:
            return False
    return True


def worth(lower, r: pb.Reduce, out: pb.Copy) -> bool:
    """Whether skewing reduction `r` (stores through copy `out`) overlaps reads with the
    stores: only where its pass reads memory, prefetching the next block's rows
    (ReduceLowering.rereads: softmax's exponentials), and the stores take no conversion to
    a 16-bit float. A pass over rows in the caches has no reads to overlap (LayerNorm's
    variance); bfloat16 softmax, bound by its arithmetic on AVX2, ran 0.93-0.94x skewed
    (benchmarks/results/cpu_skew_stores_run1.json)."""
    if dtypes.nbytes(lower.buffers[out.dst.buffer].dtype) < 4:
        return False
    return lower.reduction(r, claim=False).ahead is not None


def lower_skewed(lower, stmts: list[pb.Stmt], p: int, sk: Skew, out: tuple[int, pb.Copy],
                 hide: set[int]) -> None:
    """Reduction `p` with its row maps and store loop `sk`, skewed: row 0's reduction; for
    each next row, its reduction with the previous row's stores in its passes; the last
    row's stores. `out`: the store loop's (tile, copy out); `hide`: the tiles copied in that
    the store loop reads from memory (their copies end before it)."""
    red = lower.reduction(stmts[p].reduce)
    rows = red.keep[0]
    store = stmts[sk.store]
    loop_vars = forward.loop_vars(store)
    body = forward.innermost(store)
    tile, cp = out

    @contextlib.contextmanager
    def storing():
        """The lowering's state as at the store loop: its copy out on, the reduction's
        computed tile and the copies that end before it off."""
        computed = dict(lower.computed)
        hidden = {t: lower.copied_in.pop(t) for t in hide if t in lower.copied_in}
        lower.computed.clear()
        lower.copied_out[tile] = cp
        try:
            yield
        finally:
            lower.copied_out.pop(tile, None)
            lower.computed.update(computed)
            lower.copied_in.update(hidden)

    def stores(row):
        def also(k):
            with storing():
                lower.vars[loop_vars[0]] = row
                lower.vars[loop_vars[1]] = k
                lower.stmt(body)
        return also

    def reduce(row, also=None):
        lower.reduce_row(red, [row], also)
        for m in sk.maps:
            lower.vars[stmts[m].for_.var] = row
            lower.stmt(stmts[m].for_.body)

    def in_bounds(row, stored):
        """Whether row `row`'s reads through copies and the row `stored` its stores write
        are in their tensors' bounds: the conditions the elements and stores test, tested
        once before the row's loop, so that in it LLVM finds them true, has no branch left and
        vectorizes (it left the loop scalar, 4x slower, with them inside)."""
        j = tirx.Var("j", "int32")
        conds = []
        if row is not None:
            for t, c in lower.copied_in.items():
                if static_shape(lower.buffers[t]) == [rows, red.n]:
                    conds.append(lower.global_index(c.src, [row, j])[1])
        if stored is not None:
            conds.append(lower.global_index(cp.dst, [stored, j])[1])
        conds = [c for c in conds if c is not None]
        if any(v.same_as(j) for c in conds for v in tirx.analysis.undefined_vars(c, [])):
            return None
        return lower.guarded(conds)

    def versioned(row, stored, emit):
        cond = in_bounds(row, stored)
        if cond is None:
            emit()
            return
        with T.If(cond):
            with T.Then():
                emit()
            with T.Else():
                emit()

    zero, last = tirx.const(0, "int32"), tirx.const(rows - 1, "int32")
    versioned(zero, None, lambda: reduce(zero))
    with T.serial(1, rows) as row:
        versioned(row, row - 1, lambda: reduce(row, stores(row - 1)))

    def last_row():
        with storing(), T.serial(0, red.n) as j:
            lower.vars[loop_vars[0]] = last
            lower.vars[loop_vars[1]] = j
            lower.stmt(body)
    versioned(None, last, last_row)
