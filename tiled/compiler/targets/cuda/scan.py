"""T.cumsum (Stmt.scan) on the CUDA lowering: an inclusive prefix sum along one dim of a
shared or fragment tile (from the far end when `reverse`); the destination may be the source.

One thread walks each line along the dim, in a running sum (float32 for 16- and 8-bit floats,
else the source's dtype); lines are shared out over the block's threads. A shared tile is
scanned where it lies; a fragment spread over threads goes out to the shared scratch area by
its layout first (and the result comes back by the destination's layout), so any layout
works. Replicated fragments are scanned by every thread on its own copy, without barriers.
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout import ReplicatedLayout, ravel, unravel
from tiled.compiler.tir import scan_acc_dtype
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


def _acc_dtype(low, sc: pb.Scan) -> str:
    """The running sum's dtype: float32 for 16- and 8-bit floats (each output rounded once),
    else the source's (as the cpu backend sums)."""
    return scan_acc_dtype(low.buffers[sc.src].dtype)


def _replicated(low, bid: int) -> bool:
    return isinstance(low.layouts.get(bid), ReplicatedLayout)


def _per_thread(low, sc: pb.Scan) -> bool:
    return _replicated(low, sc.src) and _replicated(low, sc.dst)


def scan_scratch_bytes(low, sc: pb.Scan) -> int:
    """Shared scratch bytes scan `sc` needs (0 when it needs none)."""
    frag = any(low.buffers[b].scope == pb.FRAGMENT for b in (sc.src, sc.dst))
    if not frag or _per_thread(low, sc):
        return 0
    numel = math.prod(d.size for d in low.buffers[sc.src].shape)
    return numel * dtypes.nbytes(_acc_dtype(low, sc))


def scan_uses_scratch(low, sc: pb.Scan) -> bool:
    return scan_scratch_bytes(low, sc) > 0


def lower_scan(low, sc: pb.Scan) -> None:
    src, dst = low.buffers[sc.src], low.buffers[sc.dst]
    shape = [d.size for d in src.shape]
    keep = [d for i, d in enumerate(shape) if i != sc.dim]
    lines, depth = math.prod(keep), shape[sc.dim]
    acc_dt = _acc_dtype(low, sc)

    def index(o, k):
        coords = unravel(o, keep) if keep else []
        coords.insert(sc.dim, k)
        return coords

    def scan_line(o, read, write):
        run = T.alloc_buffer((1,), acc_dt, scope="local")
        T.buffer_store(run, tirx.const(0, acc_dt), [0])
        with T.serial(0, depth) as k:
            kk = depth - 1 - k if sc.reverse else k
            T.buffer_store(run, run[0] + read(index(o, kk)), [0])
            write(index(o, kk), run[0])

    if _per_thread(low, sc):
        s_buf, d_buf = low.tir[sc.src], low.tir[sc.dst]
        with low.loop(lines) as o:
            scan_line(o, lambda ix: tirx.Cast(acc_dt, s_buf[ravel(ix, shape)]),
                      lambda ix, v: T.buffer_store(d_buf, tirx.Cast(d_buf.dtype, v),
                                                   [ravel(ix, shape)]))
        return
    low.sync.before(True, True)
    scratch = low.scratch(acc_dt, math.prod(shape)) if scan_uses_scratch(low, sc) else None
    if src.scope == pb.FRAGMENT:
        _spill(low, sc.src, scratch, shape)
        low.sync.sync()
        read = lambda ix: scratch[ravel(ix, shape)]  # noqa: E731
    else:
        read = lambda ix: tirx.Cast(acc_dt, low.load(sc.src, ix))  # noqa: E731
    if dst.scope == pb.FRAGMENT:
        write = lambda ix, v: T.buffer_store(scratch, v, [ravel(ix, shape)])  # noqa: E731
    else:
        write = lambda ix, v: low.store(sc.dst, v, ix)  # noqa: E731
    with low.loop(-(-lines // low.threads)) as it:
        o = it * low.threads + low.tx
        with low.maybe_if(None if lines % low.threads == 0 else o < lines):
            scan_line(o, read, write)
    low.sync.sync()
    if dst.scope == pb.FRAGMENT:
        lay, d_buf = low.layouts[sc.dst], low.tir[sc.dst]
        with low.loop(lay.local_size) as idx:
            coords, valid = lay.coords(low.tx, idx)
            with low.maybe_if(valid):
                T.buffer_store(d_buf, tirx.Cast(d_buf.dtype, scratch[ravel(coords, shape)]),
                               [idx])
        low.sync.pending_read = True
    else:
        low.sync.pending_read = low.sync.pending_write = True


def _spill(low, bid: int, scratch, shape: list[int]) -> None:
    """Fragment `bid` into the scratch area, row-major, in the scratch dtype."""
    lay, frag = low.layouts[bid], low.tir[bid]
    if isinstance(lay, ReplicatedLayout):  # the threads share the writes out
        numel = math.prod(shape)
        with low.loop(-(-numel // low.threads)) as it:
            flat = it * low.threads + low.tx
            with low.maybe_if(None if numel % low.threads == 0 else flat < numel):
                T.buffer_store(scratch, tirx.Cast(scratch.dtype, frag[flat]), [flat])
        return
    with low.loop(lay.local_size) as idx:
        coords, valid = lay.coords(low.tx, idx)
        with low.maybe_if(valid):
            T.buffer_store(scratch, tirx.Cast(scratch.dtype, frag[idx]), [ravel(coords, shape)])
