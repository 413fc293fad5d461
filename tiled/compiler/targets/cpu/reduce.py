"""Reductions and scans for the `cpu` lowering (lower.py), a mixin of its CpuLowering: a
reduction along the contiguous last dim keeps `reduce_lanes` partial results side by side
(vector lanes), and one that reads a block's rows a second time prefetches the next block's
as it goes (prefetch.next_block_line); a scan is a serial running sum."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.targets.cpu import forward, prefetch
from tiled.compiler.targets.cpu.prefetch import next_block_line
from tiled.compiler.tir import FP8_DTYPES, saturating_abs, scan_acc_dtype, static_shape
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

_IDENTITY = {pb.REDUCE_SUM: lambda dt: tirx.const(0, dt),
             pb.REDUCE_MAX: lambda dt: tirx.min_value(dt),
             pb.REDUCE_MIN: lambda dt: tirx.max_value(dt),
             pb.REDUCE_ABSMAX: lambda dt: tirx.const(0, dt)}
_COMBINE = {pb.REDUCE_SUM: lambda a, b: a + b, pb.REDUCE_MAX: tirx.Max, pb.REDUCE_MIN: tirx.Min,
            pb.REDUCE_ABSMAX: lambda a, b: tirx.Max(a, saturating_abs(b))}


@contextlib.contextmanager
def loop_nest(extents, kind=T.serial):
    """Opens nested loops over `extents`; yields their variables."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(kind(0, e)) for e in extents]


@dataclass
class Reduction:
    """How one T.reduce_* lowers: the kept dims' extents, the reduced one's, the accumulator
    dtype, the partial results kept side by side, whether their loop is TVM-vectorized, and
    (tile, copy in) whose next block's rows it prefetches."""
    r: pb.Reduce
    keep: list[int]
    n: int
    acc: str
    lanes: int
    vector: bool
    ahead: tuple[int, pb.Copy] | None


class ReduceLowering:
    """T.reduce_* and T.cumsum on a CPU (CpuLowering's tile buffers, casts and elements)."""

    def stmt_reduce(self, r, _s):
        red = self.reduction(r)
        with loop_nest(red.keep or [1]) as outer:
            self.reduce_row(red, outer if red.keep else [])

    def reduction(self, r: pb.Reduce, claim: bool = True) -> Reduction:
        """What lowering reduction `r` takes (and, once, the choice of whether it prefetches
        the next block's rows; `claim=False`: only says, as rereads)."""
        shape = static_shape(self.buffers[r.src])
        src_dt, dst_dt = self.ir_dtype(r.src), self.ir_dtype(r.dst)
        acc = "float32" if self.bits_float(dst_dt) else dst_dt  # float8, bfloat16: in float32
        n = shape[r.dim]
        lanes = self.lanes(r, acc) if r.dim == len(shape) - 1 else 1
        lanes = lanes if n >= 2 * lanes else 1
        # float8's conversions bind values with Let, which the lane loop would vectorize.
        emulated = bool(FP8_DTYPES & {src_dt, dst_dt})
        ahead = self.rereads(r, shape, claim) if lanes > 1 and prefetch.NEXT_BLOCK != "off" \
            else None
        # A computed element (forward.py) may bind values with Let (vmath's formulas,
        # bfloat16 rounding), which this lowering keeps out of TVM's vectorizer (as in
        # _vectorizable); LLVM vectorizes the serial lane loop itself.
        vector = not (emulated or lanes == 1 or r.src in self.computed)
        return Reduction(r, [d for i, d in enumerate(shape) if i != r.dim], n, acc, lanes,
                         vector, ahead)

    def reduce_row(self, red: Reduction, outer: list, also=None) -> None:
        """Reduction `red` at the kept indices `outer` (all of them: one result). `also(k)`,
        where given, emits more work into its pass, in the loop that reduces element k, after
        it (skew.py)."""
        r, dst = red.r, self.tir_buffers[red.r.dst]
        src_dt, dst_dt = self.ir_dtype(r.src), self.ir_dtype(r.dst)
        acc, n, lanes, combine = red.acc, red.n, red.lanes, _COMBINE[r.kind]
        out_idx = outer or [0]

        def at(k):
            """The source tile's indices of element k along the reduced dim."""
            idx = list(outer)
            idx.insert(r.dim, k)
            return idx

        def element(k):
            v = self.cast(self.element(r.src, at(k)), dst_dt, src_dt)
            return self.cast(v, acc, dst_dt)

        part = T.alloc_buffer((lanes,), acc)
        # `also`'s statements are for LLVM's vectorizer, as the lane loop is then.
        lane_loop = T.vectorized if red.vector and also is None else T.serial
        with lane_loop(0, lanes) as lane:
            T.buffer_store(part, _IDENTITY[r.kind](acc), [lane])

        with T.serial(0, n // lanes) as ko:
            if red.ahead is not None:  # this step's lines of the next block's rows
                tile, cp = red.ahead
                next_block_line(self, cp, forward.tile_coords(self.buffers[tile],
                                                              at(ko * lanes)), lanes)
            with lane_loop(0, lanes) as lane:
                T.buffer_store(part, combine(part[lane], element(ko * lanes + lane)), [lane])
                if also is not None:
                    also(ko * lanes + lane)
        if n % lanes:
            with T.serial(0, n % lanes) as k:
                T.buffer_store(part, combine(part[0], element(n - n % lanes + k)), [0])
                if also is not None:
                    also(n - n % lanes + k)
        if lanes > 1:
            with T.serial(1, lanes) as lane:
                T.buffer_store(part, combine(part[0], part[lane]), [0])
        init = _IDENTITY[r.kind](acc) if r.clear else \
            self.cast(dst[tuple(out_idx)], acc, dst_dt)
        T.buffer_store(dst, self.cast(combine(init, part[0]), dst_dt, acc), out_idx)

    def lanes(self, r: pb.Reduce, acc: str) -> int:
        """How many partial results a reduction along the contiguous last dim keeps side by
        side (vector lanes) instead of one serial chain, which waits out an add's latency per
        element: two vector registers (`reduce_lanes`); one where each element takes a long
        math function, whose own latency hides the add's and whose constants then stay in
        registers (softmax's exponentials over 16 lanes on AVX2 reloaded 9 of them from
        memory each step; float32 softmax, skewed, took 1.09-1.29x as long with two vectors:
        benchmarks/cpu/skew_stores.py, results/cpu_skew_stores_run4.json)."""
        if self._long_math(r):
            return max(4, self.vector_bytes // dtypes.nbytes(acc))
        return self.reduce_lanes

    def _long_math(self, r: pb.Reduce) -> bool:
        """Whether `r` computes its elements (forward.py) with a long math function."""
        if r.src not in self.computed:
            return False
        return prefetch.long_math(pb.Stmt(store=self.computed[r.src][1]))

    def rereads(self, r: pb.Reduce, shape: list[int],
                claim: bool = True) -> tuple[int, pb.Copy] | None:
        """(tile, its copy in) where reduction `r` computes its elements with a long math
        function (softmax's exponentials) from a tile copied in from global rows that an earlier
        statement has read already (so they are in the caches), and no pass prefetches that
        tile's next block yet: `r` prefetches it (prefetch.next_block_line). Only a region
        whose last dim is the tile's last (`r` reduces along it: stmt_reduce asks only then).
        A pass of plain arithmetic is not slow enough for the prefetches to arrive without
        queueing: LayerNorm's sum of squares measured 0.93x with them in float32
        (benchmarks/cpu/next_block_prefetch.py, `any`). `claim=False`: only says (the tile
        is not marked prefetched)."""
        if r.src not in self.computed:
            return None
        if prefetch.NEXT_BLOCK == "math" and not self._long_math(r):
            return None
        for tile in (ld.buffer for ld in forward.loads(pb.Stmt(store=self.computed[r.src][1]))):
            cp = self.copied_in.get(tile)
            if cp is not None and tile in self.streamed and tile not in self.prefetched and \
                    static_shape(self.buffers[tile]) == shape and cp.src.extents[-1] != 1:
                if claim:
                    self.prefetched.add(tile)
                return tile, cp
        return None

    def stmt_scan(self, sc, _s):
        src, dst = self.tir_buffers[sc.src], self.tir_buffers[sc.dst]
        shape = static_shape(self.buffers[sc.src])
        keep = [d for i, d in enumerate(shape) if i != sc.dim]
        n = shape[sc.dim]
        # 16- and 8-bit floats keep the running sum in float32 and round each output once.
        dt, acc = self.ir_dtype(sc.src), scan_acc_dtype(self.buffers[sc.src].dtype)
        with loop_nest(keep or [1]) as outer:
            run = T.alloc_buffer((1,), acc)
            T.buffer_store(run, tirx.const(0, acc), [0])
            # src[k] is read before dst[k] is written, so src and dst may be one buffer.
            with T.serial(0, n) as k:
                pos = n - 1 - k if sc.reverse else k
                idx = list(outer) if keep else []
                idx.insert(sc.dim, pos)
                T.buffer_store(run, run[0] + self.cast(src[tuple(idx)], acc, dt), [0])
                T.buffer_store(dst, self.cast(run[0], dt, acc), idx)
