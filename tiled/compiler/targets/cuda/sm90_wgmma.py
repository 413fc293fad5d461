"""wgmma for T.gemm in the explicit sm_90a path (sm90_explicit.py): which gemms take it, where
their shared tiles live, and the calls that load and multiply them (tiled_sm90_explicit.h).

A T.gemm takes wgmma when the kernel's regions run one warpgroup (128 threads; every T.ws
region does), A and B are 16-bit shared tiles (one dtype), A not transposed, C a float32
fragment [BM, BN] with BM, BN multiples of 64 (at most 256) and at most 128 accumulator
floats per thread, and K a multiple of 64 (at most 256); and its tiles are *panel tiles*:
written by nothing but T.tma_copy and read by nothing but such gemms, and its accumulator is
the accumulator of no other kind of gemm. Decided together (`find_wgmma`, a fixed point);
every other gemm and tile keeps the generic lowering (dense tiles, mma.sync).

A panel tile [rows][cols] (per stage) is stored as cols / 64 panels of [rows][64], each row
128 bytes in the 128-byte swizzle (what TMA's CU_TENSOR_MAP_SWIZZLE_128B writes and wgmma's
descriptors read), panels and stages 1024-byte aligned: A [BM][K] is then K-major, B [K][BN]
MN-major (BN / 64 panels of [K][64]) and B [BN][K] (transpose_B) K-major. Its T.tma_copy is
one 64-wide TMA box per panel with the same byte count, so the program's expect_tx holds. The
accumulator takes the wgmma layout (`WgmmaLayout(BM, BN, 1)`); layout inference spreads it
through T.Parallel nests and reductions as usual. Each gemm is fenced, issued, committed and
waited for (wait_group 0) before the program's next statement, so a following arrive that
releases the stage comes after wgmma's reads, and every wait stays static for ptxas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import ravel
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.layouts import WgmmaLayout, infer_layouts
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.walk import stmt_exprs, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb

PANEL = 64  # 16-bit elements per swizzled row: 128 bytes
ALIGN = 1024  # the 128-byte swizzle repeats every 8 rows; tiles start on that period
MAX_ACC = 128  # accumulator floats per thread (the rest of the 255 registers run the loop)
MAX_BOX = 256  # TMA box rows


@dataclass
class WgmmaPlan:
    tiles: dict[int, int] = field(default_factory=dict)  # panel tile -> byte offset in region
    accumulators: dict[int, WgmmaLayout] = field(default_factory=dict)
    region_offset: int = 0  # the region's start in the pool (aligned up at run time)
    region_bytes: int = 0  # its tiles, and ALIGN bytes of slack for that alignment


def _shape(b: pb.Buffer) -> list[int]:
    return [d.size for d in b.shape]


def _static_ok(g: pb.Gemm, buffers: dict[int, pb.Buffer]) -> bool:
    """Whether gemm `g` fits wgmma by dtypes and shapes alone."""
    a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
    dt = {dtypes.canonical_name(a.dtype), dtypes.canonical_name(b.dtype)}
    if a.scope != pb.SHARED or b.scope != pb.SHARED or c.scope != pb.FRAGMENT or \
            len(dt) != 1 or not dt <= {"float16", "bfloat16"} or g.transpose_a or \
            dtypes.canonical_name(c.dtype) != "float32" or len(c.shape) != 2 or \
            len(a.shape) < 2 or len(b.shape) < 2:
        return False
    BM, BN = _shape(c)
    am, ak = _shape(a)[-2:]
    bk, bn = _shape(b)[-2:][::-1] if g.transpose_b else _shape(b)[-2:]
    return (am == BM and bn == BN and ak == bk and ak % PANEL == 0 and ak <= MAX_BOX
            and BM % 64 == 0 and BM <= MAX_BOX and BN % 64 == 0 and BN <= 256
            and BM // 64 * BN // 2 <= MAX_ACC)


def _uses(st: pb.Stmt) -> tuple[set[int], set[int]]:
    """(buffers statement `st` itself writes by TMA, buffers it touches any other way than
    as a TMA destination or a gemm operand)."""
    kind = st.WhichOneof("kind")
    node = getattr(st, kind)
    tma, other = set(), set()
    if kind == "copy":
        if node.HasField("tma"):
            tma.add(node.dst.buffer)
            other.add(node.src.buffer)
        else:
            other |= {node.src.buffer, node.dst.buffer}
    elif kind == "fill":
        other.add(node.dst.buffer)
    elif kind == "reduce":
        other |= {node.src, node.dst}
    elif kind in ("store", "atomic_add"):
        other.add(node.buffer)
    elif kind == "gemm":
        exprs = list(node.a_index) + list(node.b_index)
        other |= {x.load.buffer for e in exprs for x in subexprs(e)
                  if x.WhichOneof("kind") == "load"}
    other |= {x.load.buffer for e in stmt_exprs(st) for x in subexprs(e)
              if x.WhichOneof("kind") == "load"}
    return tma, other


def find_wgmma(view: pb.Program, buffers: dict[int, pb.Buffer]
               ) -> tuple[WgmmaPlan, dict[int, object] | None]:
    """The panel tiles and wgmma accumulators of `view` (the program as one warpgroup sees
    it, sm90_explicit.warpgroup_view), and the fragment layouts with those accumulators (None
    when nothing takes wgmma, or when the wgmma layout would clash with another fragment's
    in a T.Parallel nest: then nothing does). Never raises for a program that does not fit."""
    plan = WgmmaPlan()
    if view.kernel.threads != 128:
        return plan, None
    gemms, tma, other = [], set(), set()
    for st in walk(view.kernel.body):
        if st.WhichOneof("kind") == "gemm":
            gemms.append(st.gemm)
        t, o = _uses(st)
        tma |= t
        other |= o
    ok = [g for g in gemms if _static_ok(g, buffers)]
    while True:
        # A panel tile or a wgmma accumulator may not meet any other kind of gemm; a panel
        # tile may not meet any other statement but its TMA copies either.
        mma = {x for g in gemms if g not in ok for x in (g.a, g.b, g.c)}
        keep = [g for g in ok if g.a in tma and g.b in tma and not {g.a, g.b} & other
                and not {g.a, g.b, g.c} & mma]
        if len(keep) == len(ok):
            break
        ok = keep
    if not ok:
        return plan, None
    accs = {g.c: WgmmaLayout(*_shape(buffers[g.c]), 1) for g in ok}
    try:
        layouts = infer_layouts(view, accs)
    except CompileError:
        return plan, None
    offset = 0
    for bid in sorted({x for g in ok for x in (g.a, g.b)}):
        plan.tiles[bid] = offset
        offset += _tile_bytes(buffers[bid])
    plan.accumulators = accs
    plan.region_bytes = ALIGN + offset
    return plan, layouts


def _stage_bytes(b: pb.Buffer) -> int:
    rows, cols = _shape(b)[-2:]
    return rows * cols * 2  # a multiple of 8 rows x 64 columns: of 1024 bytes


def _tile_bytes(b: pb.Buffer) -> int:
    n = 1
    for d in _shape(b)[:-2]:
        n *= d
    return n * _stage_bytes(b)


# -- lowering (called by sm90_explicit.ExplicitLowering, `low`) ------------------------------

def region(low):
    return T.address_of(low.pool[low.wgmma.region_offset])


def stage_offset(low, bid: int, lead: list):
    """Byte offset in the region of the stage `lead` (the tile's leading indices) names."""
    b = low.buffers[bid]
    stage = ravel(lead, _shape(b)[:-2]) if lead else tirx.const(0, "int32")
    return low.wgmma.tiles[bid] + stage * _stage_bytes(b)


def tma_panels(low, c: pb.Copy, tmap) -> None:
    """T.tma_copy into a panel tile: one 64-wide box per panel, issued by one thread."""
    rows, cols = c.src.extents
    lead = len(low.buffers[c.dst.buffer].shape) - 2
    off = stage_offset(low, c.dst.buffer, [low.expr(o) for o in c.dst.offsets[:lead]])
    row, col = (low.expr(o) for o in c.src.offsets)
    with low.single_thread():
        low.call(f"tma_load_panels<{cols // PANEL}, {rows * 128}>", region(low), off, tmap,
                 low.barrier(c.tma), col, row)


def wgmma_gemm(low, g: pb.Gemm) -> None:
    """acc (+)= A @ B on wgmma, retired before the program's next statement."""
    a, c = low.buffers[g.a], low.buffers[g.c]
    BM, BN = _shape(c)
    K = _shape(a)[-1]
    acc = low.tir[g.c]
    if g.clear_accum:
        with low.loop(low.layouts[g.c].local_size) as idx:
            T.buffer_store(acc, tirx.const(0, acc.dtype), [idx])
    oa = stage_offset(low, g.a, [low.expr(i) for i in g.a_index])
    ob = stage_offset(low, g.b, [low.expr(i) for i in g.b_index])
    ct = CTYPE[dtypes.canonical_name(a.dtype)]
    low.call(f"wgmma_tile<{ct}, {BM}, {BN}, {K}, {str(g.transpose_b).lower()}>", region(low),
             oa, ob, T.address_of(acc[0]))
