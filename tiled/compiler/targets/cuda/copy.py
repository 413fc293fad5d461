"""T.copy with a fragment on one side or both, for the CUDA lowering (lower.py).

A fragment's elements live in the threads its layout names (passes/layout.py), so such a copy
is a loop over each thread's slots of the fragment side, with the dtype cast of the
destination:

- fragment -> fragment of one layout, both whole (`T.copy(acc_s, acc_s_cast)`,
  `T.copy(scores_max, scores_max_prev)`; layout inference gives them one layout): slot to
  slot, in registers;
- from a replicated fragment: every thread holds the source, so it reads it where it needs;
- fragment -> fragment otherwise (other layouts, parts of tiles): the source's threads write
  the elements to the shared scratch area, a barrier, the destination's threads read them;
- fragment <-> shared / global / local: each thread moves the elements it holds, the
  fragment's region (a part of the tile or all of it) selecting the slots. Global elements
  past the tensor's end read as 0 and are not written, as for every T.copy.

Functions take the lowering (`low`: a CudaLowering) and emit TIR through its IR builder.
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import (
    SELECT_ROWS_MAX,
    CyclicLayout,
    ReplicatedLayout,
    ravel,
    stacked_on,
    unravel,
)
from tiled.compiler.passes.stmts import column_link, multiple_of, whole_region
from tiled.compiler.passes.vectorize import lane_cap, rows_keep_runs
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.parallel import slot_runs
from tiled.compiler.tir import and_all
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


def tile_shape(region: pb.Region) -> list[int]:
    """The squeezed shape of a copy region (its extents other than 1)."""
    return [e for e in region.extents if e != 1] or [1]


def _spread(low, bid: int) -> bool:
    """Whether fragment `bid` is split over threads (not every thread holds all of it)."""
    return not isinstance(low.layouts[bid], ReplicatedLayout)


def copy_uses_scratch(low, c: pb.Copy) -> bool:
    """Whether copy `c` moves its elements through the shared scratch area."""
    src, dst = low.buffers[c.src.buffer], low.buffers[c.dst.buffer]
    if src.scope != pb.FRAGMENT or dst.scope != pb.FRAGMENT or not _spread(low, src.id):
        return False
    return not same_slots(low, c) and stacked_row(low, c) is None


def copy_scratch_bytes(low, c: pb.Copy) -> int:
    if not copy_uses_scratch(low, c):
        return 0
    src = low.buffers[c.src.buffer]
    return math.prod(tile_shape(c.src)) * dtypes.nbytes(src.dtype)


def same_slots(low, c: pb.Copy) -> bool:
    """A copy between whole fragments of one layout: slot i of the source is slot i of the
    destination in every thread."""
    src, dst = low.buffers[c.src.buffer], low.buffers[c.dst.buffer]
    return src.scope == dst.scope == pb.FRAGMENT and \
        low.layouts[src.id] == low.layouts[dst.id] and \
        whole_region(c.src, src) and whole_region(c.dst, dst)


def stacked_row(low, c: pb.Copy):
    """(the stacked tile's region, whether it is the source) of a copy between one row of a
    tile stacked on a vector's layout (passes/layout.column_link) and such a vector, else
    None: slot s of the vector is the row's slot s in every thread."""
    link = column_link(_as_stmt(c), low.buffers)
    for tile, vec, from_tile in ((c.src, c.dst, True), (c.dst, c.src, False)):
        if link == (tile.buffer, vec.buffer) and \
                low.buffers[tile.buffer].scope == low.buffers[vec.buffer].scope == pb.FRAGMENT \
                and stacked_on(low.layouts[tile.buffer], low.layouts[vec.buffer]):
            return tile, from_tile
    return None


def _as_stmt(c: pb.Copy) -> pb.Stmt:
    st = pb.Stmt()
    st.copy.CopyFrom(c)
    return st


def for_fragment_slots(low, bid: int, region: pb.Region, body, other: pb.Region | None = None
                       ) -> None:
    """Calls body(tile coords, slot) for each slot of the calling thread that holds an
    element of `region` of fragment `bid` (tile coords: squeezed, relative to the region),
    under the condition that the slot holds such an element. `other`: the region on the
    copy's other side; where the fragment's runs are contiguous and aligned there too, each
    run is a vectorized loop (16-byte accesses)."""
    lay = low.layouts[bid]
    shape = [d.size for d in low.buffers[bid].shape]
    with slot_runs(low, lay.local_size, run_lanes_of_copy(low, bid, region, other)) as idx:
        coords, valid = lay.coords(low.tx, idx)
        conds, tile = [valid], []
        for x, off, ext, dim in zip(coords, region.offsets, region.extents, shape, strict=True):
            if ext == dim:  # the whole dim (an in-bounds region starts at 0 then)
                t = x
            else:
                o = low.expr(off)
                t = x - o
                conds += [x >= o, x < o + ext]
            if ext != 1:
                tile.append(t)
        with low.maybe_if(and_all(conds)):
            body(tile, idx)


def _store_slot(low, bid: int, idx, value) -> None:
    buf = low.tir[bid]
    T.buffer_store(buf, value if str(value.ty) == buf.dtype else tirx.Cast(buf.dtype, value),
                   [idx])


def _read(low, region: pb.Region, tile: list):
    """The element of `region` at squeezed tile coords (0 past a global tensor's end)."""
    idx, conds = low.region_index(region, tile)
    value = low.load(region.buffer, idx)
    ok = and_all(conds)
    return value if ok is None else tirx.if_then_else(ok, value,
                                                        tirx.const(0, str(value.ty)))


def lower_fragment_copy(low, c: pb.Copy) -> None:
    """A T.copy with a fragment on one side or both (module docstring)."""
    src, dst = low.buffers[c.src.buffer], low.buffers[c.dst.buffer]
    if dst.scope == pb.FRAGMENT:
        if same_slots(low, c):
            with low.loop(low.layouts[dst.id].local_size) as idx:
                _store_slot(low, dst.id, idx, low.tir[src.id][idx])
            return
        row = stacked_row(low, c)
        if row is not None:  # one row of a stacked tile from or to a vector of its columns
            tile, from_tile = row
            lay = low.layouts[tile.buffer]
            k = low.expr(tile.offsets[0])
            with low.loop(lay.inner.local_size) as s:
                if from_tile:
                    _store_slot(low, dst.id, s, lay.read(low.tir[src.id], k, s))
                elif isinstance(k, tirx.IntImm) or lay.count > SELECT_ROWS_MAX:
                    _store_slot(low, dst.id, lay.slot(k, s), low.tir[src.id][s])
                else:  # the row's registers chosen by k (StackedLayout.read)
                    for r in range(lay.count):
                        with T.If(k == r), T.Then():
                            _store_slot(low, dst.id, lay.slot(r, s), low.tir[src.id][s])
            return
        if src.scope == pb.FRAGMENT and _spread(low, src.id):
            return _through_scratch(low, c)
        for_fragment_slots(low, dst.id, c.dst,
                           lambda tile, idx: _store_slot(low, dst.id, idx, _read(low, c.src, tile)),
                           c.src)
        return
    if _spread(low, src.id):
        def put(tile, idx):
            dst_idx, conds = low.region_index(c.dst, tile)
            with low.maybe_if(and_all(conds)):
                low.store(dst.id, low.tir[src.id][idx], dst_idx)

        return for_fragment_slots(low, src.id, c.src, put, c.dst)
    # A replicated source: the threads share the elements out.
    shape = tile_shape(c.src)
    numel = math.prod(shape)
    with low.loop(-(-numel // low.threads)) as it:
        flat = it * low.threads + low.tx
        tile = unravel(flat, shape) if any(e != 1 for e in c.src.extents) else []
        with low.maybe_if(None if numel % low.threads == 0 else flat < numel):
            dst_idx, conds = low.region_index(c.dst, tile)
            with low.maybe_if(and_all(conds)):
                low.store(dst.id, _read(low, c.src, tile), dst_idx)


def _through_scratch(low, c: pb.Copy) -> None:
    """Fragment to fragment of another layout: out to shared memory by the source's layout,
    back in by the destination's."""
    src = low.buffers[c.src.buffer]
    shape = tile_shape(c.src)
    scratch = low.scratch(dtypes.canonical_name(src.dtype), math.prod(shape))

    def out(tile, idx):
        T.buffer_store(scratch, low.tir[src.id][idx], [ravel(tile or [0], shape)])

    def back(tile, idx):
        _store_slot(low, c.dst.buffer, idx, scratch[ravel(tile or [0], shape)])

    low.sync.before(False, True)
    for_fragment_slots(low, src.id, c.src, out)
    low.sync.before(True, False)
    for_fragment_slots(low, c.dst.buffer, c.dst, back)


def run_lanes_of_copy(low, bid: int, region: pb.Region, other: pb.Region | None) -> int:
    """Vector lanes for the slots of fragment `bid` in a copy between `region` (all of it) and
    `other`: the fragment is cyclic with whole runs, the regions agree on the last dim, and
    the other side's rows and offset keep runs aligned; else 1."""
    lay, frag = low.layouts[bid], low.buffers[bid]
    if other is None or not isinstance(lay, CyclicLayout) or lay.vec < 2 or \
            lay.numel % (lay.threads * lay.vec) or not whole_region(region, frag):
        return 1
    buf = low.buffers[other.buffer]
    vec = lay.vec
    if other.extents[-1] != frag.shape[-1].size or not multiple_of(other.offsets[-1], vec):
        return 1
    if buf.scope not in (pb.SHARED, pb.GLOBAL) or \
            not rows_keep_runs(buf, vec, low.shared_stride):
        return 1
    lanes = min(vec, lane_cap(frag.dtype), lane_cap(buf.dtype))
    return lanes if lanes >= 2 else 1


# -- global <-> shared, element by element or by cp.async ------------------------------

def async_vector(low, c: pb.Copy) -> int:
    """Elements per 16/8/4-byte async copy for a global->shared copy, or 0 when the copy
    cannot be done with aligned vectors (then it is an element-wise synchronous copy)."""
    src, dst = low.buffers[c.src.buffer], low.buffers[c.dst.buffer]
    if src.scope != pb.GLOBAL or dst.scope != pb.SHARED or src.dtype != dst.dtype:
        return 0
    if c.src.extents[-1] == 1 or c.dst.extents[-1] == 1:
        return 0
    esize = dtypes.nbytes(src.dtype)
    for nbytes in (16, 8, 4):
        vec = nbytes // esize
        if vec < 1 or nbytes % esize:
            continue
        if c.src.extents[-1] % vec == 0 and _rows_hold_vectors(low, src, c.src, vec) \
                and multiple_of(c.dst.offsets[-1], vec):
            return vec
    return 0


def _rows_hold_vectors(low, b: pb.Buffer, region: pb.Region, vec: int) -> bool:
    """Whether every `vec` run of `region`'s last dim that starts at a multiple of `vec` is
    an aligned vector of `b`: a global tensor's rows (static trailing dims, the last a
    multiple of vec; tensors are 16-byte aligned) or a shared tile's padded rows (never a
    swizzled panel, whose shared_stride is 1), the region's last offset a multiple too."""
    if not multiple_of(region.offsets[-1], vec):
        return False
    if b.scope == pb.GLOBAL:
        return all(d.WhichOneof("kind") == "size" for d in list(b.shape)[1:]) and \
            b.shape[-1].size % vec == 0
    return b.scope == pb.SHARED and low.shared_stride(b.id) % vec == 0


def sync_vector(low, c: pb.Copy) -> int:
    """Elements per 16 / 8 / 4-byte vector for a synchronous copy between shared and global
    memory (or within one) of one dtype, where both sides hold the runs as aligned vectors
    (at most the target's max_vector lanes: Metal's 4); 1 for an element-wise copy."""
    src, dst = low.buffers[c.src.buffer], low.buffers[c.dst.buffer]
    scopes = {pb.SHARED, pb.GLOBAL}
    if src.scope not in scopes or dst.scope not in scopes or src.dtype != dst.dtype or \
            c.src.extents[-1] != c.dst.extents[-1]:
        return 1
    esize = dtypes.nbytes(src.dtype)
    for nbytes in (16, 8, 4):
        vec = nbytes // esize
        if 2 <= vec <= low.max_vector and c.src.extents[-1] % vec == 0 and \
                _rows_hold_vectors(low, src, c.src, vec) and \
                _rows_hold_vectors(low, dst, c.dst, vec):
            return vec
    return 1


def copy_by_vectors(low, c: pb.Copy) -> bool:
    """A shared <-> global copy (sync_vector) by whole vectors, each thread taking the next
    one in turn; False where it is element-wise. A vector lies in one row of each side, so
    its first element's bounds are all its lanes' (global elements past the tensor's end
    read as 0 and are not written)."""
    vec = sync_vector(low, c)
    if vec < 2:
        return False
    shape = [e for e in c.src.extents if e != 1]
    vshape = [*shape[:-1], shape[-1] // vec]
    numel = math.prod(vshape)
    with low.loop(-(-numel // low.threads)) as it:
        flat = it * low.threads + low.tx
        tile = unravel(flat, vshape)
        tile[-1] = tile[-1] * vec
        with low.maybe_if(None if numel % low.threads == 0 else flat < numel):
            _, src_conds = low.region_index(c.src, tile)
            _, dst_conds = low.region_index(c.dst, tile)
            ok = and_all(src_conds)
            with low.maybe_if(and_all(dst_conds)), T.vectorized(0, vec) as lane:
                run = [*tile[:-1], tile[-1] + lane]
                value = low.load(c.src.buffer, low.region_index(c.src, run)[0])
                if ok is not None:
                    value = tirx.if_then_else(ok, value, tirx.const(0, str(value.ty)))
                low.store(c.dst.buffer, value, low.region_index(c.dst, run)[0])
    return True


def copy_element(low, c: pb.Copy, tile) -> None:
    """One element of copy `c` at squeezed tile coords (0 read past a global tensor's end)."""
    src_idx, src_conds = low.region_index(c.src, tile)
    dst_idx, dst_conds = low.region_index(c.dst, tile)
    value = low.load(c.src.buffer, src_idx)
    ok = and_all(src_conds)
    if ok is not None:
        value = tirx.if_then_else(ok, value, tirx.const(0, str(value.ty)))
    with low.maybe_if(and_all(dst_conds)):
        low.store(c.dst.buffer, value, dst_idx)


FP8_NAMES = ("float8_e4m3", "float8_e5m2")


def convert_fp8_tile(low, c: pb.Copy) -> bool:
    """A whole 2-D shared float8 tile into a whole 16-bit shared tile of its shape (a float8
    KV block converted for the MMA) with tiled_cuda.h's fp8_tile_convert: four elements per
    32-bit load and paired conversions, where an element loop converts one at a time. False
    (the copy is lowered element by element) for anything else, swizzled panel tiles
    included."""
    src, dst = low.buffers[c.src.buffer], low.buffers[c.dst.buffer]
    s_dt, d_dt = dtypes.canonical_name(src.dtype), dtypes.canonical_name(dst.dtype)
    if src.scope != pb.SHARED or dst.scope != pb.SHARED or s_dt not in FP8_NAMES or \
            d_dt not in ("float16", "bfloat16") or len(src.shape) != 2 or \
            [d.size for d in src.shape] != [d.size for d in dst.shape] or \
            not whole_region(c.src, src) or not whole_region(c.dst, dst):
        return False
    rows, cols = (d.size for d in src.shape)
    lds, ldd = low.shared_stride(src.id), low.shared_stride(dst.id)
    if cols % 4 or lds % 4 or ldd % 2 or min(lds, ldd) < cols:  # (panels: stride 1)
        return False
    zero = [tirx.const(0, "int32")] * 2
    T.evaluate(T.call_extern(
        "void", f"tiled::fp8_tile_convert<{CTYPE[s_dt]}, {CTYPE[d_dt]}, {rows}, {cols}, "
        f"{lds}, {ldd}, {low.threads}>", low.addr(src.id, zero), low.addr(dst.id, zero)))
    return True


def issue_async_copy(low, c: pb.Copy, vec: int, pred=None) -> None:
    """The calling thread's cp.async vectors of global -> shared copy `c` (`vec` elements
    each), under `pred` where given (a pipeline stage past the loop's end)."""
    src = low.buffers[c.src.buffer]
    nbytes = vec * dtypes.nbytes(src.dtype)
    tile_shape = [e for e in c.src.extents if e != 1]
    numel = math.prod(tile_shape)
    nvec = numel // vec
    n_iter = -(-nvec // low.threads)
    with low.loop(n_iter) as it:
        v = it * low.threads + low.tx
        with low.maybe_if(None if nvec % low.threads == 0 else v < nvec):
            tile = unravel(v * vec, tile_shape)
            src_idx, conds = low.region_index(c.src, tile)
            dst_idx, _ = low.region_index(c.dst, tile)
            ok = and_all(conds + ([pred] if pred is not None else []))
            T.evaluate(T.call_extern(
                "void", f"tiled::cp_async<{nbytes}>", low.addr(c.dst.buffer, dst_idx),
                T.address_of(low.tir[c.src.buffer][tuple(src_idx)]),
                ok if ok is not None else tirx.const(True, "bool")))
