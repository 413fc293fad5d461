"""T.gemm on wgmma in the generic sm_90a lowering, decided per op (not per kernel shape).

A gemm takes wgmma when A and B are shared tiles of one dtype (fp16 / bf16; float8 e4m3 /
e5m2 and float32, as tf32, and int8 into an int32 C, with B given N x K, the only form wgmma
has for them) or A a 16-bit fragment (RS), A not transposed, C a float32 fragment (int32 for
int8) [BM, BN] with BN a multiple of 64 (or of 16 for 16-bit operands with B given N x K:
its 64s, then one wgmma n16 / n32 or both: the x tiles of tiled.ops.linear's 16-row swaps,
the 160-wide filter tiles tiled.ops.conv2d fills the GPU with) and BM a multiple of 64
per warpgroup (the block's threads are whole warpgroups, which split M; a FullCol gemm with
too few rows for that has them split N instead, each warpgroup holding all BM rows of its
BN / warpgroups columns, which must then fit those rules), K a whole number of
128-byte panel rows, at most 128 accumulator floats per thread; its A and B tiles are
written by anything but TMA (cp.async copies, element stores) and read by no gemm that does
not take wgmma; its C is the accumulator of no other kind of gemm. Decided together
(`plan_wgmma`, a fixed point).

Such tiles are *panel tiles*: a tile [rows][cols] (per stage) is stored as panels of
[rows][128 bytes], each row in the 128-byte swizzle (16-byte chunk c of row r at chunk
c ^ (r % 8)), or, for a K-major tile whose rows are 64 bytes (TileLang's block_K = 32 in 16
bits), as one panel of 64-byte rows in the 64-byte swizzle (chunk c at c ^ (r / 2 % 4)),
stages and the tile 1024-byte aligned: what wgmma's descriptors read (the
explicit path's panel tiles, sm90_wgmma.py, written there by TMA). A ring tile whose stage
holds two iterations' tiles (ws_pairs.py) is placed as that stage: two narrow K-major tiles
make one panel of 128-byte rows, two MN-major ones panels of twice the K rows, and the
iteration's half is `low.panel_shift`. Every access goes through `panel_index`, so copies,
cp.async (16-byte chunks stay whole) and element accesses all see the logical tile. The
accumulator takes the wgmma layout (`WgmmaLayout(BM, BN, nwg)`), which
layout inference spreads through T.Parallel nests, copies and row reductions as usual.

Each wgmma gemm is preceded by a proxy fence of the threads' own shared writes and a barrier
(writes by ordinary instructions and cp.async are not visible to wgmma's async proxy without
it), issued by every warpgroup for its rows, and retired (wait_group 0) before the next
statement, except in a loop fed by a TMA producer, where wgmma_waits.py lets it run on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import ravel
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.layouts import WgmmaLayout
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.walk import walk
from tiled.v1 import tile_ir_pb2 as pb

PANEL_BYTES = 128  # one swizzled row
NARROW_BYTES = 64  # a K-major tile whose rows are 64 bytes: one panel in the 64-byte swizzle
CHUNK_BYTES = 16  # the swizzle permutes 16-byte chunks
# The operand dtypes wgmma takes here (float32 as tf32), with float32 accumulation, and
# int8 with int32 accumulation.
WGMMA_DTYPES = ("float16", "bfloat16", "float8_e4m3", "float8_e5m2", "float32", "int8")


def accumulator_dtype(operand: str) -> str:
    return "int32" if operand == "int8" else "float32"
PANEL_ALIGN = 1024  # the 128-byte swizzle's period: 8 rows of 128 bytes
MAX_ACC = 128  # accumulator floats per thread


@dataclass
class WgmmaOps:
    accumulators: dict[int, WgmmaLayout] = field(default_factory=dict)
    panels: set[int] = field(default_factory=set)  # shared tiles in the panel layout

    def __bool__(self) -> bool:
        return bool(self.accumulators)


def panel_elems(dtype) -> int:
    """Elements per 128-byte panel row."""
    return PANEL_BYTES // dtypes.nbytes(dtype)


def panel_row_bytes(b: pb.Buffer) -> int:
    """Bytes per swizzled row of panel tile `b`: NARROW_BYTES for a tile whose rows are that
    long (K-major with K = 32 16-bit elements, the only narrow tiles _fits admits: the
    64-byte swizzle, 8-row groups 512 bytes apart), else PANEL_BYTES."""
    return NARROW_BYTES if _shape(b)[-1] * dtypes.nbytes(b.dtype) == NARROW_BYTES \
        else PANEL_BYTES


def _shape(b: pb.Buffer) -> list[int]:
    return [d.size for d in b.shape]


def _kmajor_width(wn: int, dtype) -> bool:
    """Whether a warpgroup's `wn` columns of a K-major B that are not whole 64-column steps
    split into wgmma widths the device header has (tiled_sm90_explicit.h's cols_width):
    16-bit operands any multiple of 16 (the tail taking n16 / n32), float8, tf32 and int8
    multiples of 32 from 96 (n96, n160, n224 and the tails of wider ones)."""
    if dtypes.nbytes(dtype) == 2:
        return wn % 16 == 0
    return wn % 32 == 0 and wn >= 96


def _fits(g: pb.Gemm, buffers, threads: int) -> int | None:
    """Whether gemm `g` fits wgmma by dtypes and shapes (SS, or RS with A a fragment): the
    warpgroup columns its accumulator splits N into (`WgmmaLayout.wg_n`: 1, the
    warpgroups splitting M, where each gets whole m64 blocks; else, for a FullCol gemm, the
    block's warpgroup count, as MLA's 64-row tile over two warpgroups needs), or None."""
    a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
    dt = {dtypes.canonical_name(a.dtype), dtypes.canonical_name(b.dtype)}
    if a.scope not in (pb.SHARED, pb.FRAGMENT) or b.scope != pb.SHARED or \
            c.scope != pb.FRAGMENT or len(dt) != 1 or not dt <= set(WGMMA_DTYPES) or \
            g.transpose_a or dtypes.canonical_name(c.dtype) != accumulator_dtype(min(dt)) or \
            len(c.shape) != 2 or len(a.shape) < 2 or len(b.shape) < 2 or threads % 128 or \
            (a.scope == pb.FRAGMENT and (len(a.shape) != 2 or g.a_index)):
        return None
    if dtypes.nbytes(a.dtype) != 2 and (a.scope != pb.SHARED or not g.transpose_b):
        return None  # float8, tf32, int8 wgmma: A and B from shared memory, both K-major
    nwg = threads // 128
    BM, BN = _shape(c)
    am, ak = _shape(a)[-2:]
    bk, bn = _shape(b)[-2:][::-1] if g.transpose_b else _shape(b)[-2:]
    # K: whole 64-wide panels where a panel tile holds it (or, for 16-bit operands, one
    # narrow panel of 64-byte rows: the form run on the H200), whole k16 slices otherwise.
    k_unit = panel_elems(a.dtype) if a.scope == pb.SHARED or g.transpose_b else 16
    narrow = dtypes.nbytes(a.dtype) == 2 and ak * 2 == NARROW_BYTES
    if not (am == BM and bn == BN and ak == bk and (ak % k_unit == 0 or narrow) and
            bk % 8 == 0):
        return None

    def fits(wg_n: int) -> bool:
        wm, wn = BM // (nwg // wg_n), BN // wg_n
        return (BM % (64 * (nwg // wg_n)) == 0 and BN % wg_n == 0 and wn <= 256
                and (wn % 64 == 0 or (g.transpose_b and _kmajor_width(wn, a.dtype)))
                and wm // 64 * wn // 2 <= MAX_ACC)

    # The M split first (the form every other gemm here has run in); a FullCol gemm whose
    # rows are too few for it splits N. A fragment A (RS) holds whole rows of the
    # warpgroup's A: only an M split reads it.
    order = [1, nwg] if g.policy == pb.POLICY_FULL_COL and a.scope == pb.SHARED else [1]
    return next((wg_n for wg_n in order if fits(wg_n)), None)


def plan_wgmma(program: pb.Program, infer) -> tuple[WgmmaOps, dict | None]:
    """The gemms of `program` that take wgmma (module docstring), as their accumulators'
    layouts and the panel tiles they read, and the fragment layouts with them (`infer`:
    layout inference given accumulator layouts); (empty, None) when none does. An RS gemm
    keeps wgmma only where inference puts its A in the wgmma A-operand layout (the layout
    of an accumulator of the same warpgroups, as FlashAttention's P is)."""
    buffers = {b.id: b for b in program.buffers}
    threads = program.kernel.threads
    gemms, tma = [], set()
    for st in walk(program.kernel.body):
        kind = st.WhichOneof("kind")
        if kind == "gemm":
            gemms.append(st.gemm)
        elif kind == "copy" and st.copy.HasField("tma"):
            tma.add(st.copy.dst.buffer)
    nwg = threads // 128
    split = {id(g): _fits(g, buffers, threads) for g in gemms}
    ok = [g for g in gemms if split[id(g)] and not {g.a, g.b} & tma]
    while True:
        others = {x for g in gemms if g not in ok for x in (g.a, g.b, g.c)}
        keep = [g for g in ok if not {g.a, g.b, g.c} & others]
        if len(keep) != len(ok):
            ok = keep
            continue
        if not ok:
            return WgmmaOps(), None
        accs = {g.c: WgmmaLayout(*_shape(buffers[g.c]), nwg, split[id(g)]) for g in ok}
        try:
            layouts = infer(program, accs)
        except CompileError:  # a wgmma layout clashes with another fragment's: none
            return WgmmaOps(), None
        bad = [g for g in ok if buffers[g.a].scope == pb.FRAGMENT and
               layouts.get(g.a) != WgmmaLayout(*_shape(buffers[g.a]), nwg)]
        if not bad:
            panels = {x for g in ok for x in (g.a, g.b) if buffers[x].scope == pb.SHARED}
            return WgmmaOps(accs, panels), layouts
        ok = [g for g in ok if g not in bad]


def panel_index(low, bid: int, indices: list):
    """The flat element index of logical element `indices` of panel tile `bid` (its leading
    indices and the current pipeline stage select a stage; in a stage of two merged ring
    iterations, ws_loop.py, the iteration's half of its 128-byte rows)."""
    tile = low.shared[bid]  # rows: all leading dims flattened (one pipeline stage)
    shape = _shape(low.buffers[bid])
    rows, cols = shape[-2], shape[-1]
    lead = ravel(indices[:-2], shape[:-2]) * (rows * cols) if len(shape) > 2 else \
        tirx.const(0, "int32")
    stage = low.stage.get(bid)
    if stage is not None:
        lead = lead + stage * (tile.rows * tile.cols)
    r, c = indices[-2], indices[-1]
    if len(shape) == 2:  # as placed: a merged ring tile's stage holds two tiles (ws_loop.py)
        rows = tile.rows
    shift = low.panel_shift.get(bid)
    if shift is not None:  # this iteration's tile in such a stage
        r, c = r + shift[0], c + shift[1]
    row_bytes = tile_row_bytes(tile)
    size = dtypes.nbytes(tile.dtype)
    row, unit = row_bytes // size, CHUNK_BYTES // size
    # 16-byte chunk c of row r at chunk c ^ (r % 8) (128-byte rows), c ^ (r / 2 % 4) (64-byte)
    phase = tirx.floormod(r, 8) if row_bytes == PANEL_BYTES else \
        tirx.floormod(tirx.floordiv(r, 2), 4)
    chunk = tirx.bitwise_xor(tirx.floordiv(tirx.floormod(c, row), unit), phase)
    return (lead + tirx.floordiv(c, row) * (rows * row) + r * row
            + chunk * unit + tirx.floormod(c, unit))


def tile_row_bytes(tile) -> int:
    """Bytes per swizzled row of a placed panel tile (passes/resources.SharedTile): 64 for a
    narrow panel, 128 otherwise (also for two narrow tiles merged into one stage)."""
    return NARROW_BYTES if tile.cols * dtypes.nbytes(tile.dtype) == NARROW_BYTES else \
        PANEL_BYTES


def fence_shared_writes(low) -> None:
    """Before a wgmma (or a loop of them) reads shared memory: the threads' writes not yet
    synchronized or not yet fenced for the async proxy get `fence.proxy.async` and a barrier
    (a barrier the tracker placed since, for another read, orders them for the threads
    only)."""
    if low.sync.pending_write or low.sync.unfenced:
        T.evaluate(T.call_extern("void", "tiled::sm90::fence_proxy_async_shared"))
        low.sync.sync()
        low.sync.unfenced = False


def sync_next_iteration(low) -> None:
    """The barrier at the end of a loop iteration that wrote shared memory, so the next one may
    read or overwrite it: where the kernel has wgmma gemms, the threads' writes are fenced for
    the async proxy first (a wgmma early in the next iteration reads what this one wrote late,
    which the tracker, walking the body once, cannot see at that wgmma)."""
    if low.sync.unfenced and low.wgmma_ops.accumulators:
        T.evaluate(T.call_extern("void", "tiled::sm90::fence_proxy_async_shared"))
        low.sync.unfenced = False
    low.sync.sync()


def lower_wgmma(low, g: pb.Gemm, s: pb.Stmt) -> None:
    """acc (+)= A @ B on wgmma (module docstring)."""
    fence_shared_writes(low)
    low.uniform_stmt(s)
    a, c = low.buffers[g.a], low.buffers[g.c]
    lay = low.layouts[g.c]
    BM, BN = _shape(c)
    K = _shape(a)[-1] * low.k_tiles
    WM, WN = lay.wm_rows, lay.wn_cols  # this warpgroup's part of C
    acc = low.tir[g.c]
    # C = A @ B takes the first wgmma's zero scale-d, every operand type: no instruction
    # writes the accumulator registers (a float8 block-scaled GEMM clears its 64 a thread
    # every K step), which ptxas would also have to order against wgmmas in flight.
    # `low.zero_init`: a gemm whose C the caller folded an initialization of into it
    # (ws_rotate.py).
    zero_init = g.clear_accum or low.zero_init
    zero = tirx.const(0, "int32")
    wg = tirx.floordiv(low.tx, 128)  # low.tx counts from a T.ws region's first thread
    wm, col = wg, zero  # the warpgroup's row of C and first column of B
    if lay.wg_n > 1:
        wm, col = tirx.floordiv(wg, lay.wg_n), tirx.floormod(wg, lay.wg_n) * WN
    b_idx = [low.expr(i) for i in g.b_index] + ([col, zero] if g.transpose_b else [zero, col])
    pb_ = T.address_of(low.tir[g.b][panel_index(low, g.b, b_idx)])
    ct = CTYPE[dtypes.canonical_name(a.dtype)]
    kmajor = str(g.transpose_b).lower()
    # The template's last flags, trailing defaults left out: TURN (issued on its warpgroup's
    # turn, ws_loop.py), ZERO, KS (the K a stage of two merged K tiles holds, ws_pairs.py),
    # BP (a K-major B's panel rows, where this warpgroup reads WN of its BN).
    ks = 2 * _shape(a)[-1] if g.b in low.panel_shift else None
    flags = [bool(low.turn), zero_init, ks, BN if WN != BN and g.transpose_b else None]
    while flags and flags[-1] in (False, None):
        flags.pop()
    if len(flags) == 4 and flags[2] is None:
        flags[2] = K  # KS's default, spelled out before BP
    turn = "".join(f", {str(f).lower()}" for f in flags)
    issue = "_issue" if low.in_flight else ""  # left in flight, retired by wgmma_waits.py
    if a.scope == pb.FRAGMENT:  # RS: A's words from registers, in the wgmma layout
        pa = T.address_of(low.tir[g.a][0])
        name = f"tiled::sm90::wgmma_rows_rs{issue}<{ct}, {WM}, {WN}, {K}, {kmajor}{turn}>"
    else:
        a_idx = [low.expr(i) for i in g.a_index] + [wm * WM, zero]
        pa = T.address_of(low.tir[g.a][panel_index(low, g.a, a_idx)])
        name = f"tiled::sm90::wgmma_rows{issue}<{ct}, {WM}, {BM}, {WN}, {K}, {kmajor}{turn}>"
    T.evaluate(T.call_extern("void", name, pa, pb_, T.address_of(acc[0])))


def chains_wgmma(low, a: pb.Stmt, b: pb.Stmt) -> bool:
    """Whether statement `a` is a wgmma gemm that `b`, the next statement, continues: a wgmma
    gemm accumulating into the same C with the same instruction (S = Q K^T + Q_pe K_pe^T, as
    MLA writes its scores). `a` may then be left in flight, its group retired by `b`'s wait:
    the hardware orders wgmmas on one accumulator and needs no fence between them."""
    if a.WhichOneof("kind") != "gemm" or b.WhichOneof("kind") != "gemm":
        return False
    ga, gb = a.gemm, b.gemm
    accs = low.wgmma_ops.accumulators
    if ga.c not in accs or gb.c != ga.c or gb.clear_accum or \
            low.buffers[ga.a].scope != low.buffers[gb.a].scope:
        return False
    dt = {dtypes.canonical_name(low.buffers[x].dtype) for x in (ga.a, ga.b, gb.a, gb.b)}
    return len(dt) == 1 and ga.transpose_b == gb.transpose_b
