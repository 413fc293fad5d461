"""T.reduce_* on the CUDA lowering (lower.py): sum, max, min and absmax (max of |x|,
whose identity is 0) along one dim of a shared or fragment tile into a fragment.

- Into a rows layout (the lowering's rows_layouts: the row reduction of an accumulator whose
  rows each live in a quad of lanes): each thread combines the elements of its rows (a
  balanced tree), then the quad exchanges partials with two xor shuffles; no shared memory,
  unless the rows are split over several warps or warpgroups (an mma accumulator's warp
  columns, a FullCol wgmma accumulator's warpgroups: the rows layout's `split`): then one
  lane of each quad leaves its part's partials in the scratch area and every holder of a
  row combines the parts in the same order.
- From a replicated fragment (or a local tile): every thread reduces its own copy.
- Over dim 0 of a tile stacked on the destination's layout (StackedLayout: each of its rows
  laid out as the destination): every thread combines its slots of each column, with no
  exchange at all.
- Along the last dim of a cyclic fragment whose rows each span whole rounds of the block
  (the last dim a multiple of threads x run length, as a row-per-block norm or softmax has):
  which slots hold which row is the same in every thread, so each thread combines its slots
  of each row, a warp combines with five xor shuffles, and the warps' partials meet in the
  scratch area, where every thread combines them in the same order (the destination is
  replicated).
- Otherwise through the shared scratch area: a spread fragment is written out by its layout,
  one thread per output element combines along the dim, and every thread reads the results
  (the destination is replicated).
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import (
    CyclicLayout,
    ReplicatedLayout,
    ravel,
    rows_of,
    stacked_on,
    unravel,
)
from tiled.compiler.tir import saturating_abs
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

IDENTITY = {pb.REDUCE_SUM: lambda dt: tirx.const(0, dt),
            pb.REDUCE_MAX: lambda dt: tirx.min_value(dt),
            pb.REDUCE_MIN: lambda dt: tirx.max_value(dt),
            pb.REDUCE_ABSMAX: lambda dt: tirx.const(0, dt)}
COMBINE = {pb.REDUCE_SUM: lambda a, b: a + b, pb.REDUCE_MAX: tirx.Max, pb.REDUCE_MIN: tirx.Min,
           pb.REDUCE_ABSMAX: tirx.Max}


def _element(kind: int, v):
    """What an element contributes: |x| for absmax, x itself otherwise."""
    return saturating_abs(v) if kind == pb.REDUCE_ABSMAX else v


def reduce_scratch_bytes(low, r: pb.Reduce) -> int:
    """Shared scratch bytes reduction `r` needs (0 when it needs none)."""
    src, dst = low.buffers[r.src], low.buffers[r.dst]
    if _along_rows(low, r):
        rows = low.layouts[dst.id]
        split = getattr(rows, "split", 1)
        return 0 if split == 1 else split * rows.M * max(4, dtypes.nbytes(dst.dtype))
    if isinstance(low.layouts.get(src.id), ReplicatedLayout) or _down_columns(low, r):
        return 0
    if _whole_rounds(low, r):
        return low.threads // low.warp_size * math.prod(d.size for d in dst.shape) * \
            max(4, dtypes.nbytes(dst.dtype))
    n = math.prod(d.size for d in dst.shape)
    if src.scope == pb.FRAGMENT:  # the spread fragment goes out to the area first
        n += math.prod(d.size for d in src.shape)
    return n * max(4, dtypes.nbytes(dst.dtype))


def _along_rows(low, r: pb.Reduce) -> bool:
    """Whether `r` reduces a tile's rows into its rows layout (reduce_rows). (A destination
    may hold another tile's rows layout, one it is read with: then the general path.)"""
    dst = low.layouts.get(r.dst)
    return isinstance(dst, low.rows_layouts) and rows_of(low.layouts.get(r.src)) == dst


def _down_columns(low, r: pb.Reduce) -> bool:
    """Whether `r` reduces dim 0 of a tile stacked on the destination's layout."""
    return r.dim == 0 and stacked_on(low.layouts.get(r.src), low.layouts.get(r.dst))


def reduce_columns(low, r: pb.Reduce) -> None:
    """Dim 0 of a stacked tile into the vector it is stacked on: per thread, per slot of the
    vector, its column's slots combined as a balanced tree (the rows are few: unrolled)."""
    src, dst = low.tir[r.src], low.tir[r.dst]
    lay = low.layouts[r.src]
    combine, dt = COMBINE[r.kind], dst.dtype
    with low.loop(lay.inner.local_size) as s:
        vals = [_element(r.kind, tirx.Cast(dt, src[lay.slot(k, s)]) if src.dtype != dt
                         else src[lay.slot(k, s)]) for k in range(lay.count)]
        v = _tree(combine, vals)
        T.buffer_store(dst, v if r.clear else combine(dst[s], v), [s])


def _whole_rounds(low, r: pb.Reduce) -> bool:
    """Whether `r` reduces the last dim of a cyclic fragment whose rows span whole rounds of
    the block (module docstring), on a block of whole warps."""
    src = low.buffers[r.src]
    lay = low.layouts.get(r.src)
    last = len(src.shape) - 1
    return (src.scope == pb.FRAGMENT and isinstance(lay, CyclicLayout) and
            r.dim in (last, -1) and low.threads % low.warp_size == 0 and
            src.shape[-1].size % (low.threads * lay.vec) == 0)


def lower_reduce(low, r: pb.Reduce) -> None:
    src_b = low.buffers[r.src]
    shape = [d.size for d in src_b.shape]
    keep = [d for i, d in enumerate(shape) if i != r.dim]
    n_out, depth = math.prod(keep), shape[r.dim]
    dst = low.tir[r.dst]
    acc_dt = dst.dtype
    src_lay = low.layouts.get(r.src)
    combine = COMBINE[r.kind]

    if _along_rows(low, r):
        return reduce_rows(low, r)
    if _down_columns(low, r):
        return reduce_columns(low, r)
    if _whole_rounds(low, r):
        return reduce_rounds(low, r)

    def src_index(o, k):
        coords = unravel(o, keep) if keep else []
        coords.insert(r.dim, k)
        return coords

    if (src_b.scope == pb.FRAGMENT and not isinstance(src_lay, ReplicatedLayout)) or \
            src_b.scope == pb.SHARED:
        low.sync.before(True, True)
        spilled = n_out * depth if src_b.scope == pb.FRAGMENT else 0  # the source's elements
        scratch = low.scratch(acc_dt, spilled + n_out)
        if src_b.scope == pb.FRAGMENT:
            with low.loop(src_lay.local_size) as idx:
                coords, valid = src_lay.coords(low.tx, idx)
                with low.maybe_if(valid):
                    T.buffer_store(scratch, tirx.Cast(acc_dt, low.tir[r.src][idx]),
                                   [ravel(coords, shape)])
            low.sync.sync()
            read = lambda o, k: scratch[ravel(src_index(o, k), shape)]  # noqa: E731
        else:
            read = lambda o, k: tirx.Cast(acc_dt, low.load(r.src, src_index(o, k)))  # noqa: E731
        with low.loop(-(-n_out // low.threads)) as it:
            o = it * low.threads + low.tx
            with low.maybe_if(None if n_out % low.threads == 0 else o < n_out):
                tmp = T.alloc_buffer((1,), acc_dt, scope="local")
                T.buffer_store(tmp, IDENTITY[r.kind](acc_dt), [0])
                with T.serial(0, depth) as k:
                    T.buffer_store(tmp, combine(tmp[0], _element(r.kind, read(o, k))), [0])
                T.buffer_store(scratch, tmp[0], [spilled + o])
        low.sync.sync()
        dst_lay = low.layouts.get(r.dst)
        if dst_lay is not None and not isinstance(dst_lay, ReplicatedLayout):
            for slot in range(dst_lay.local_size):  # each thread takes the elements it holds
                coords, valid = dst_lay.coords(low.tx, slot)
                with low.maybe_if(valid):
                    v = scratch[spilled + ravel(coords, keep)]
                    T.buffer_store(dst, v if r.clear else combine(dst[slot], v), [slot])
        else:
            with low.loop(n_out) as o:
                v = scratch[spilled + o]
                T.buffer_store(dst, v if r.clear else combine(dst[o], v), [o])
        low.sync.pending_read = True
        return
    # Replicated (or local) source: every thread reduces on its own copy.
    with low.loop(n_out) as o:
        tmp = T.alloc_buffer((1,), acc_dt, scope="local")
        T.buffer_store(tmp, IDENTITY[r.kind](acc_dt) if r.clear else dst[o], [0])
        with T.serial(0, depth) as k:
            v = low.tir[r.src][ravel(src_index(o, k), shape)]
            T.buffer_store(tmp, combine(tmp[0], _element(r.kind, tirx.Cast(acc_dt, v))), [0])
        T.buffer_store(dst, tmp[0], [o])


def reduce_rows(low, r: pb.Reduce) -> None:
    """A row reduction into a rows layout: each thread combines the elements of its rows
    it holds (a balanced tree), then the quad holding each row exchanges partials, then
    (rows split over warp columns) the warps of a warp row through the scratch area."""
    src, dst = low.tir[r.src], low.tir[r.dst]
    lay, rows = low.layouts[r.src], low.layouts[r.dst]
    combine, dt = COMBINE[r.kind], dst.dtype
    split = getattr(rows, "split", 1)
    parts = []
    for slot in range(rows.local_size):
        vals = [_element(r.kind, tirx.Cast(dt, src[i]) if src.dtype != dt else src[i])
                for i in lay.row_members(slot)]
        part = T.alloc_buffer((1,), dt, scope="local")
        T.buffer_store(part, _tree(combine, vals), [0])
        for mask in rows.QUAD_MASKS:
            T.buffer_store(part, combine(part[0], low.shfl_xor(dt, part[0], mask)), [0])
        if split == 1:  # the row's total
            T.buffer_store(dst, part[0] if r.clear else combine(dst[slot], part[0]), [slot])
        parts.append(part[0])
    if split > 1:  # the row's parts meet in the scratch area: [column][row]
        low.sync.before(True, True)
        scratch = low.scratch(dt, split * rows.M)
        column = rows.column(low.tx)
        with T.If(tirx.floormod(low.tx, rows.REPLICAS) == 0), T.Then():
            for slot, part in enumerate(parts):
                row = rows.coords(low.tx, slot)[0][0]
                T.buffer_store(scratch, part, [column * rows.M + row])
        low.sync.sync()
        parts = [_tree(combine, [scratch[w * rows.M + rows.coords(low.tx, slot)[0][0]]
                                 for w in range(split)])
                 for slot in range(rows.local_size)]
        low.sync.pending_read = True
        for slot, part in enumerate(parts):
            T.buffer_store(dst, part if r.clear else combine(dst[slot], part), [slot])


def _tree(combine, vals):
    while len(vals) > 1:
        vals = [combine(vals[j], vals[j + 1]) if j + 1 < len(vals) else vals[j]
                for j in range(0, len(vals), 2)]
    return vals[0]


def reduce_rounds(low, r: pb.Reduce) -> None:
    """A last-dim reduction of a cyclic fragment whose rows span whole rounds (module
    docstring): per thread, per warp by shuffles, across warps through the scratch area."""
    src, dst = low.tir[r.src], low.tir[r.dst]
    lay = low.layouts[r.src]
    combine, dt = COMBINE[r.kind], dst.dtype
    n = low.buffers[r.src].shape[-1].size
    rows = lay.numel // n
    per_row = lay.local_size // rows  # this thread's slots of each row, consecutive
    warps = low.threads // low.warp_size
    parts = []
    for row in range(rows):
        vals = [_element(r.kind, tirx.Cast(dt, src[i]) if src.dtype != dt else src[i])
                for i in range(row * per_row, (row + 1) * per_row)]
        part = T.alloc_buffer((1,), dt, scope="local")
        T.buffer_store(part, _tree(combine, vals), [0])
        low.warp_allreduce(r.kind, part, combine)
        parts.append(part)
    if warps == 1:
        totals = [p[0] for p in parts]
    else:
        low.sync.before(True, True)
        scratch = low.scratch(dt, warps * rows)
        warp, lane = tirx.floordiv(low.tx, low.warp_size), tirx.floormod(low.tx, low.warp_size)
        with T.If(lane == 0), T.Then():
            for row, part in enumerate(parts):
                T.buffer_store(scratch, part[0], [warp * rows + row])
        low.sync.sync()
        totals = [_tree(combine, [scratch[w * rows + row] for w in range(warps)])
                  for row in range(rows)]
        low.sync.pending_read = True
    for row, v in enumerate(totals):
        T.buffer_store(dst, v if r.clear else combine(dst[row], v), [row])
