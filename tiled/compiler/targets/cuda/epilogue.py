"""Accumulator fragments to memory on the CUDA lowering: a whole fragment in a tensor-core
layout (a float32 accumulator, or a 16-bit fragment cast from one in its layout: TileLang's
C_local -> C_cast) to a global tile, or to a whole shared tile of its shape with plain rows
(an epilogue staged through shared memory, `T.copy(acc_o, O_shared)`), by the headers'
vector stores instead of one element per slot:

- WgmmaLayout (wgmma's m64nN accumulators): tiled_sm90.h's WgmmaTile::store;
- MmaLayout (mma.sync's m16n8 tiles over a warp grid): tiled_cuda.h's MmaTile::store.

Both write each warp's 16 rows with store_acc_warp: for 16-bit outputs a quad transposes its
words so each lane stores 8 consecutive columns (16 bytes), for float32 pairs (8 bytes).
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.stmts import whole_region
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.layouts import MmaLayout, WgmmaLayout
from tiled.compiler.tir import global_extent
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

STORED = ("float32", "float16", "bfloat16")  # fragment and destination dtypes taken


def store_acc_tile(low, c: pb.Copy, template: str, acc: int, rows: int, cols: int,
                   *extra) -> bool:
    """The whole fragment `acc` (rows x cols) in a tensor-core layout to a global tile (fp16,
    bf16 or float32) of one row dim and the last dim, every other dim of extent 1 (Out[b, h,
    rows, :]; or Out[b, rows, h, :], the dims between static), with `template`::store's
    vector stores; False when the copy is not that (it is then lowered generically)."""
    dst = low.buffers[c.dst.buffer]
    dt = dtypes.canonical_name(dst.dtype)
    ext = list(c.dst.extents)
    rank = len(dst.shape)
    if dst.scope != pb.GLOBAL or rank < 2 or dt not in STORED or ext[-1] != cols or \
            any(o.WhichOneof("kind") != "int_value" or o.int_value for o in c.src.offsets):
        return False
    wide = [d for d, e in enumerate(ext[:-1]) if e != 1]  # the row dim (none: one row)
    r = wide[0] if wide else rank - 2
    if len(wide) > 1 or ext[r] != rows:
        return False
    between = list(dst.shape)[r + 1:]
    if r < rank - 2 and any(d.WhichOneof("kind") != "size" for d in between):
        return False
    offsets = [low.expr(o) for o in c.dst.offsets]
    m, n = global_extent(low, dst, r), global_extent(low, dst, rank - 1)
    ld = tirx.Cast("int64", n) if r == rank - 2 else \
        tirx.const(math.prod(d.size for d in between), "int64")
    zero = tirx.const(0, "int32")
    base = T.address_of(low.tir[dst.id][tuple(zero if d in (r, rank - 1) else o
                                              for d, o in enumerate(offsets))])
    _call_store(template, dt, T.address_of(low.tir[acc][0]), base, ld, offsets[r], offsets[-1],
                m, n, *extra)
    return True


def _call_store(template: str, dt: str, *args) -> None:
    """`template`::store<dt>(fragment, C, ldc, row0, col0, m, n, ...) (the headers' tiles)."""
    T.evaluate(T.call_extern("void", f"{template}::store<{CTYPE[dt]}>", *args))


def _tile_of(lay) -> tuple[str, tirx.PrimExpr] | None:
    """The header's tile type for fragment layout `lay` and the calling thread's part of the
    fragment's threads (warpgroup or warp); None for other layouts."""
    if isinstance(lay, WgmmaLayout):
        wgn = f", {lay.wg_n}" if lay.wg_n > 1 else ""
        return f"tiled::sm90::WgmmaTile<{lay.M}, {lay.N}, {lay.nwg}{wgn}>", 128
    if isinstance(lay, MmaLayout):
        return f"tiled::MmaTile<{lay.M}, {lay.N}, {lay.warp_m}, {lay.warp_n}>", 32
    return None


def store_accumulator(low, c: pb.Copy) -> bool:
    """A whole WgmmaLayout or MmaLayout fragment to a global tile or to a whole plain shared
    tile of its shape (module docstring); False when the copy is not that."""
    src = low.buffers[c.src.buffer]
    lay = low.layouts.get(src.id) if src.scope == pb.FRAGMENT else None
    tile = _tile_of(lay)
    if tile is None or dtypes.canonical_name(src.dtype) not in STORED:
        return False
    template, threads = tile
    part = tirx.floordiv(low.tx, threads)
    dst = low.buffers[c.dst.buffer]
    dt = dtypes.canonical_name(dst.dtype)
    if dst.scope == pb.SHARED:
        if dst.id in low.wgmma_ops.panels or dt not in STORED or len(dst.shape) != 2 or \
                [d.size for d in dst.shape] != [lay.M, lay.N] or \
                not whole_region(c.dst, dst) or not whole_region(c.src, src):
            return False
        zero = tirx.const(0, "int32")
        _call_store(template, dt, T.address_of(low.tir[src.id][0]),
                    low.addr(dst.id, [zero, zero]), tirx.const(low.shared_stride(dst.id), "int64"),
                    zero, zero, lay.M, lay.N, part)
        return True
    return store_acc_tile(low, c, template, src.id, lay.M, lay.N, part)
