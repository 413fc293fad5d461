"""T.cumsum (Stmt.scan) on the CUDA lowering: an inclusive prefix sum along one dim of a
shared or fragment tile (from the far end when `reverse`); the destination may be the source.

The running sum is float32 for 16- and 8-bit floats, else the source's dtype. A shared tile
is scanned where it lies; a fragment spread over threads goes out to the shared scratch area
by its layout first (and the result comes back by the destination's layout), so any layout
works. Replicated fragments are scanned by every thread on its own copy, without barriers.

Where the block has at least two threads a line (a few long rows: TileLang's cumsum over a
4 x 1024 tile on 128 threads), each line is scanned by a team of lanes of one warp (a power
of two, at most the warp): the team takes its line a chunk of `team` consecutive elements at
a time (conflict-free for the last dim), scans the chunk by lane shuffles (Hillis-Steele:
log2(team) steps) and adds the carry, the running total, which its last lane hands on.
Otherwise (as many lines as threads, or a running-sum dtype the target cannot shuffle) one
thread walks each line.
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import ReplicatedLayout, ravel, unravel
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
    team = team_width(low, acc_dt, lines, depth)
    if team > 1:
        _scan_by_teams(low, sc, acc_dt, team, lines, depth, index, read, write)
    else:
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


def team_width(low, acc_dt: str, lines: int, depth: int) -> int:
    """Lanes that scan each line together: the largest power of two with every line a team
    (at most the warp, at most the line's length rounded up to a power of two); 1 where the
    block is not whole warps (a partial warp cannot shuffle) or `acc_dt` cannot be
    shuffled."""
    if acc_dt not in low.shuffle_dtypes or low.threads % low.warp_size:
        return 1
    team = 1
    while team * 2 <= min(low.threads // lines, low.warp_size) and team < depth:
        team *= 2
    return team


def _scan_by_teams(low, sc: pb.Scan, acc_dt: str, team: int, lines: int, depth: int, index,
                   read, write) -> None:
    """Each line scanned by `team` lanes in running sums of `acc_dt` (module docstring).
    Every lane runs every shuffle: lanes past the line's end, or of a team without a line in
    the last round, scan zeros and store nothing."""
    teams = low.threads // team
    zero = tirx.const(0, acc_dt)
    lane = tirx.floormod(low.tx, low.warp_size)
    member = tirx.floormod(low.tx, team)
    last = lane - member + (team - 1)
    with low.loop(-(-lines // teams)) as it:
        o = it * teams + tirx.floordiv(low.tx, team)
        carry = T.alloc_buffer((1,), acc_dt, scope="local")
        T.buffer_store(carry, zero, [0])
        with T.serial(0, -(-depth // team)) as c:
            k = c * team + member
            kk = depth - 1 - k if sc.reverse else k
            ok = [cond for cond, exact in ((k < depth, depth % team == 0),
                                           (o < lines, lines % teams == 0)) if not exact]
            ok = tirx.all(*ok) if ok else None
            v = T.alloc_buffer((1,), acc_dt, scope="local")
            T.buffer_store(v, zero, [0])
            with low.maybe_if(ok):
                T.buffer_store(v, read(index(o, kk)), [0])
            got = T.alloc_buffer((1,), acc_dt, scope="local")
            step = 1
            while step < team:  # the shuffle stands alone: inside a ?: some lanes skip it
                T.buffer_store(got, low.shfl_idx(acc_dt, v[0], tirx.Select(
                    member >= step, lane - step, lane)), [0])
                T.buffer_store(v, v[0] + tirx.Select(member >= step, got[0], zero), [0])
                step *= 2
            T.buffer_store(v, v[0] + carry[0], [0])
            with low.maybe_if(ok):
                write(index(o, kk), v[0])
            T.buffer_store(carry, low.shfl_idx(acc_dt, v[0], last), [0])


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
