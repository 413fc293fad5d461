"""The sm_90a whole-kernel GEMM path: which programs take it, and its fragment layout.

Since the per-op path (gemm_sm90.py, ws_loop.py, ws_pairs.py) caught up with it on 16-bit
GEMMs, this path takes float8 GEMMs, the GEMM loops the per-op path cannot feed from a TMA
ring with wgmma (K-major B tiles of 16 or 32 rows, say), and those compiled with the option
cluster=2 (CudaLowering decides, and says why).

A kernel matches the path on `cuda:sm_90a` when its body holds, at top level, a T.Pipelined loop
whose body is exactly "copy an A tile and a B tile from global to shared, T.gemm them into a
float32 fragment", with 16-bit A and B and a 64-wide K tile, or float8 A and B (e4m3 / e5m2,
B transposed: wgmma reads 8-bit operands K-major only) and a 128-wide K tile (one 128-byte
swizzle row either way), A not transposed, tiles the wgmma shapes fit, and 128 or 256
threads; the two shared tiles may be used by nothing else; A's and
B's rows are a multiple of 16 bytes apart, or (symbolic dims) that is a launch precondition
and the kernel ships with a variant for the launches that fail it (tma). A 32-wide
K tile is run two iterations per 64-wide stage when that provably changes nothing (`_merge`).
Then:

- the block gets one more warpgroup (128 threads, the producer): its first thread issues TMA
  loads into a STAGES-deep ring of 128B-swizzled shared tiles; the program's own threads (the
  consumers) run the kernel body, where the loop becomes wgmma on that ring (tiled_sm90.h,
  `tiled::sm90::WsGemm`), synchronized by full / empty mbarriers per stage;
- the accumulator uses the wgmma layout (`WgmmaLayout`), and barriers among the program's
  threads become named barriers the producer never joins;
- the kernel takes two TMA descriptors, built by the runtime from the manifest's recipe
  (kernel_args of kind "tensor_map");
- when adjacent blocks along one grid axis share an operand tile (`_pairing`: A's offsets do
  not use x, or B's do not use y), blocks run in clusters of two (`WsGemmPlan.cluster`, the
  manifest's cluster [2, 1, 1]) that walk the tile pairs; each CTA loads half of the shared
  tile and multicasts it to both (WsGemm's MCAST). The compile option `cluster` picks it: 0
  (default) the plan's choice (DEFAULT_CLUSTER: off for now), 1 off, 2 on where the program
  pairs up (and this path rather than the per-op one).

Everything else, and every program that does not match, is lowered as for sm_80.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout import body_statements, const_int, tile_op_buffers
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.gemm_sm90 import store_acc_tile
from tiled.compiler.targets.cuda.grid_walk import bind_block, persistent_walk
from tiled.compiler.targets.cuda.layouts import MmaLayout, WgmmaLayout
from tiled.compiler.targets.cuda.tma import tma_requirements
from tiled.compiler.targets.cuda.ws_plan import MIN_RING, PRODUCER_REGS
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.walk import element_accesses, expr_vars, walk
from tiled.v1 import tile_ir_pb2 as pb

ROW_BYTES = 128  # a K tile's row: one 128-byte swizzle row (64 16-bit / 128 8-bit elements)
WS_DTYPES = {"float16": 2, "bfloat16": 2, "float8_e4m3": 1, "float8_e5m2": 1}
CONSUMER_REGS = 232
RING_SLACK = 1024  # the ring is aligned to 1024 bytes inside the dynamic pool
# The plan's cluster size where the program's tiles pair up. 1: on the H200 the clustered
# kernel is correct but slower so far (fp16 4096^3: 650 vs 681 TFLOP/s at 128x256;
# benchmarks/results/hopper_gemm_h200_cluster.json), so clusters are opt-in (cluster=2).
DEFAULT_CLUSTER = 1


@dataclass(frozen=True)
class WsGemmPlan:
    loop: pb.For  # the T.Pipelined loop
    merge: int  # program iterations per ring stage (2 for a 32-wide K tile)
    copy_a: pb.Copy
    copy_b: pb.Copy
    a: int  # shared tile ids
    b: int
    c: int  # accumulator fragment id
    dtype: str  # float16 | bfloat16 | float8_e4m3 | float8_e5m2 (WS_DTYPES)
    BM: int
    BN: int
    stages: int
    nwg: int
    b_kmajor: bool
    # (grid axis whose adjacent blocks pair up, the operand they share: 1 A, 2 B), or None
    pairing: tuple[int, int] | None = None
    cluster: int = 1  # CTAs per cluster: 2 runs the pairs with multicast loads
    requires: tuple = ()  # launch preconditions of the TMA descriptors (tma)

    @property
    def loop_var(self) -> int:
        return self.loop.var

    @property
    def mcast(self) -> int:
        """WsGemm's MCAST: 0, or the operand the cluster's two CTAs share (1 A, 2 B)."""
        return self.pairing[1] if self.cluster == 2 and self.pairing else 0

    @property
    def pair_axis(self) -> int:
        return self.pairing[0] if self.mcast else -1

    @property
    def bk(self) -> int:
        """The K elements of one ring stage: one 128-byte row."""
        return ROW_BYTES // WS_DTYPES[self.dtype]

    @property
    def box_a(self) -> list[int]:
        """A's TMA box (K, M): half the rows when each CTA of a pair loads half of A."""
        return [self.bk, self.BM // 2 if self.mcast == 1 else self.BM]

    @property
    def box_b(self) -> list[int]:
        if not self.b_kmajor:
            return [64, 64]  # 64-wide N sub-tiles; a pair splits them between its CTAs
        return [self.bk, self.BN // 2 if self.mcast == 2 else self.BN]

    def with_cluster(self, cluster: int) -> WsGemmPlan:
        """The plan with the compile option `cluster` applied: 0 keeps the plan's choice,
        1 turns clusters off, 2 turns them on where the program pairs up (else stays 1)."""
        if cluster not in (0, 1, 2):
            raise CompileError(f"option cluster={cluster!r}: expected 0 (the plan's choice), "
                               "1 or 2")
        if cluster == 0:
            return self
        return dataclasses.replace(self, cluster=2 if cluster == 2 and self.pairing else 1)

    @property
    def stage_bytes(self) -> int:
        return (self.BM + self.BN) * ROW_BYTES

    @property
    def ring_bytes(self) -> int:
        return RING_SLACK + self.stages * self.stage_bytes + 16 * self.stages

    @property
    def layout(self) -> WgmmaLayout:
        return WgmmaLayout(self.BM, self.BN, self.nwg)

    def template(self, ctype: str) -> str:
        return (f"tiled::sm90::WsGemm<{ctype}, {self.BM}, {self.BN}, {self.stages}, {self.nwg}, "
                f"{str(self.b_kmajor).lower()}, {self.mcast}>")


def tile_ops_on(body: pb.Stmt, tiles: set[int]) -> int:
    """How many tile ops (copy, gemm, reduce, fill) in `body` read or write one of `tiles`."""
    return sum(bool(tile_op_buffers(st) & tiles) for st in walk(body))


def find_ws_gemm(p: pb.Program, layouts: dict[int, object]) -> WsGemmPlan | None:
    """The plan for `p`'s warp-specialized GEMM loop, or None when `p` does not match (see the
    module docstring); never raises for a program that merely does not match."""
    buffers = {b.id: b for b in p.buffers}
    top = body_statements(p.kernel.body)
    loops = [s.for_ for s in top if s.WhichOneof("kind") == "for_"
             and s.for_.kind == pb.PIPELINED and s.for_.num_stages >= 2]
    if len(loops) != 1 or p.kernel.threads not in (128, 256) or len(p.kernel.grid) > 3:
        return None
    f = loops[0]
    if (n := const_int(f.extent)) is not None and n < 1:
        return None  # a loop that never runs has nothing to feed
    body = body_statements(f.body)
    if len(body) != 3 or [s.WhichOneof("kind") for s in body] != ["copy", "copy", "gemm"]:
        return None
    g = body[2].gemm
    copies = {s.copy.dst.buffer: s.copy for s in body[:2]}
    if set(copies) != {g.a, g.b} or g.transpose_a or g.clear_accum:
        return None
    a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
    dt = {dtypes.canonical_name(a.dtype), dtypes.canonical_name(b.dtype)}
    if len(dt) != 1 or not dt <= set(WS_DTYPES) or c.scope != pb.FRAGMENT or \
            dtypes.canonical_name(c.dtype) != "float32" or not isinstance(layouts.get(g.c),
                                                                       MmaLayout):
        return None
    for bid in (g.a, g.b):
        cp, src = copies[bid], buffers[copies[bid].src.buffer]
        if src.scope != pb.GLOBAL or len(src.shape) != 2 or len(buffers[bid].shape) != 2 or \
                dtypes.canonical_name(src.dtype) not in dt or \
                list(cp.src.extents) != [d.size for d in buffers[bid].shape] or \
                any(o.WhichOneof("kind") != "int_value" or o.int_value for o in cp.dst.offsets):
            return None
        if not expr_vars(cp.src.offsets) <= set(p.kernel.block_vars) | {f.var}:
            return None
    BM, k_a = (d.size for d in a.shape)
    rows_b, cols_b = (d.size for d in b.shape)
    BN, k_b = (rows_b, cols_b) if g.transpose_b else (cols_b, rows_b)
    nwg = p.kernel.threads // 128
    esize = WS_DTYPES[next(iter(dt))]
    wide, bk = esize == 2, ROW_BYTES // esize
    merge = bk // k_a if k_a == k_b and k_a in (bk, bk // 2) else 0
    if merge == 2 and not (wide and _merge_is_exact(p, f, copies[g.a], copies[g.b],
                                                    bool(g.transpose_b))):
        merge = 0
    narrow_ok = g.transpose_b and BN in (16, 32) and wide  # K-major B: one box of 16 / 32 rows
    if not merge or (BN % 64 and not narrow_ok) or BN > 256 or BM % (64 * nwg) or BM > 256 or \
            not (wide or g.transpose_b) or \
            list(d.size for d in c.shape) != [BM, BN] or BM // nwg // 64 * BN // 2 > 128:
        return None
    # The shared tiles feed this loop only (the accumulator may be used anywhere).
    if tile_ops_on(p.kernel.body, {g.a, g.b}) != 3:  # the two copies and the gemm
        return None
    if {bid for bid, _ in element_accesses(p.kernel.body)} & {g.a, g.b}:  # element accesses
        return None
    requires = []
    for bid in (g.a, g.b):  # A and B are read by TMA: their strides must suit it
        req = tma_requirements(p, buffers[copies[bid].src.buffer])
        if req is None:
            return None
        requires += [r for r in req if r not in requires]
    # At least MIN_RING stages where shared memory holds them: the loop's num_stages counts
    # its own K tiles, and fewer ring stages starve the consumers.
    stages = min(max(f.num_stages, MIN_RING), max(2, (200 * 1024) // ((BM + BN) * ROW_BYTES)))
    pairing = _pairing(p, f, copies[g.a], copies[g.b], BM, BN, bool(g.transpose_b))
    return WsGemmPlan(f, merge, copies[g.a], copies[g.b], g.a, g.b, g.c, dt.pop(), BM, BN,
                      stages, nwg, bool(g.transpose_b), pairing,
                      DEFAULT_CLUSTER if pairing else 1, tuple(requires))


def _pairing(p: pb.Program, f: pb.For, copy_a: pb.Copy, copy_b: pb.Copy, BM: int, BN: int,
             b_kmajor: bool) -> tuple[int, int] | None:
    """(grid axis, shared operand: 1 A, 2 B) for clusters of two blocks adjacent along that
    axis, or None. Blocks (x, 2j) and (x, 2j + 1) share B when B's offsets do not use y (and
    A's do); (2j, y) and (2j + 1, y) share A when A's do not use x. Of the two, the one that
    shares the larger tile. Both CTAs of a cluster must run the same k-tiles (the multicast
    halves meet in each stage), so the loop's extent may not use the block vars."""
    if len(p.kernel.grid) != 2 or expr_vars([f.extent]) & set(p.kernel.block_vars):
        return None
    bx, by = p.kernel.block_vars
    va, vb = expr_vars(copy_a.src.offsets), expr_vars(copy_b.src.offsets)
    options = []
    if by in va and by not in vb and (b_kmajor or BN % 128 == 0):
        options.append((BN, 1, 2))  # B MN-major: the CTAs split its 64-wide boxes
    if bx in vb and bx not in va:
        options.append((BM, 0, 1))
    return max(options)[1:] if options else None


def _merge_is_exact(p: pb.Program, f: pb.For, copy_a: pb.Copy, copy_b: pb.Copy,
                    b_kmajor: bool) -> bool:
    """Whether iterations 2j and 2j+1 of a 32-wide K-tile loop can run as one 64-wide stage:
    each copy's K offset is exactly 32 * k (the tiles are adjacent) and its other offset does
    not depend on k, and the loop covers the whole K dim of A and B (same dim): with an odd
    count the last stage's second half lies past K, which TMA reads as zeros. Proved with
    TVM's arithmetic analyzer over symbolic dims and block indices, not sampled."""
    from tvm.sym import Analyzer

    from tiled.compiler.tir import ExprLowering
    from tiled.ir.program import Program

    low = ExprLowering(Program(p))
    for v in p.vars:
        low.vars[v.id] = tirx.Var(f"v{v.id}", low.var_dtype[v.id])
    buffers = {b.id: b for b in p.buffers}
    k = low.vars[f.var]
    ana = Analyzer()

    def proves(a, b) -> bool:
        return bool(ana.can_prove_equal(a, b))

    def offset(e, at):  # e with the loop var standing for `at`
        low.vars[f.var] = at
        return low.expr(e)

    def dim(bid: int, d: int):
        s = buffers[bid].shape[d]
        return low.vars[s.var] if s.WhichOneof("kind") == "var" else tirx.const(s.size, "int32")

    ka = dim(copy_a.src.buffer, 1)
    kb = dim(copy_b.src.buffer, 1 if b_kmajor else 0)
    for cp, kdim in ((copy_a, 1), (copy_b, 1 if b_kmajor else 0)):
        for d, e in enumerate(cp.src.offsets):
            step = offset(e, k + 1) - offset(e, k)
            if not proves(step, tirx.const(32 if d == kdim else 0, "int32")):
                return False
            if d == kdim and not proves(offset(e, tirx.const(0, "int32")), 0):
                return False
    extent = low.expr(f.extent)
    if isinstance(extent, tirx.IntImm) and extent.value % 2 == 0:
        return True
    return proves(ka, kb) and proves(extent, tirx.floordiv(ka + 31, 32))


# -- lowering (called by lower.CudaLowering, `low`) ------------------------------------

def ring(low):
    return T.address_of(low.pool[low.ws_offset])

def ws_template(low) -> str:
    return low.ws.template(CTYPE[low.ws.dtype])

def stage_count(low, f: pb.For):
    """Ring stages the loop takes: its extent, or half of it rounded up when merged."""
    n = low.expr(f.extent)
    return n if low.ws.merge == 1 else tirx.floordiv(n + 1, 2)


def lower_ws_consumer(low, f: pb.For) -> None:
    """The loop on the consumers' side: wgmma over the ring, k-tiles numbered from the
    block's running count (`ws_k`) so that the ring's phases continue across tiles."""
    n = stage_count(low, f)
    acc = T.address_of(low.tir[low.ws.c][0])
    base = low.ws_k[0]
    with T.serial(0, n) as k:
        T.evaluate(T.call_extern("void", f"{ws_template(low)}::consume", ring(low),
                                 base + k, k == 0, acc))
    T.evaluate(T.call_extern("void", f"{ws_template(low)}::consume_end", ring(low),
                             base + n - 1, n > 0))
    T.buffer_store(low.ws_k, base + n, [0])

def lower_ws_drain(low) -> None:
    """The consumers' side of a clustered block whose tile lies outside the grid: the loop's
    stages are waited for and released (the partner's multicast halves land here too), with
    no wgmma and none of the program's body."""
    n = stage_count(low, low.ws.loop)
    base = low.ws_k[0]
    with T.serial(0, n) as k:
        T.evaluate(T.call_extern("void", f"{ws_template(low)}::drain", ring(low), base + k))
    T.buffer_store(low.ws_k, base + n, [0])

def lower_ws_producer(low, tmap_a, tmap_b) -> None:
    """The producer warpgroup's part: its first thread feeds the ring."""
    ws = low.ws
    n = stage_count(low, ws.loop)
    base = low.ws_k[0]
    with T.serial(0, n) as k:
        low.vars[ws.loop_var] = k * ws.merge  # the first of the iterations this stage holds
        a = [low.expr(o) for o in ws.copy_a.src.offsets]
        b = [low.expr(o) for o in ws.copy_b.src.offsets]
        T.evaluate(T.call_extern("void", f"{ws_template(low)}::produce", ring(low),
                                 base + k, tmap_a, tmap_b, a[1], a[0], b[1], b[0]))
    T.buffer_store(low.ws_k, base + n, [0])

def store_ws_tile(low, c: pb.Copy) -> bool:
    """The GEMM accumulator to a 2-D global tile with WsGemm::store (store_acc_tile)."""
    return len(low.buffers[c.dst.buffer].shape) == 2 and \
        store_acc_tile(low, c, ws_template(low), low.ws.c, low.ws.BM, low.ws.BN)


@contextlib.contextmanager
def program_blocks(low, grid: list):
    """The persistent block's walk over the program's blocks blockIdx.x, + gridDim.x, ...:
    binds the block vars for each; `low.ws_k` counts k-tiles through the ring."""
    low.ws_k = T.alloc_buffer((1,), "int32", scope="local")
    T.buffer_store(low.ws_k, tirx.const(0, "int32"), [0])
    low.ws_valid = None
    if low.ws.cluster == 2:
        yield from _cluster_blocks(low, grid)
        return
    blocks = math.prod(grid)
    with persistent_walk(low, blocks) as (_, linear):
        bind_block(low, linear, grid)
        yield


def _cluster_blocks(low, grid: list):
    """The walk of a clustered block: cluster c takes tile pairs c, c + clusters, ... of the
    grid halved (rounded up) along the pair axis, grouped as bind_block does (4 pairs = 8
    tiles deep along y); its rank-r CTA takes tile 2 * j + r of pair j along that axis. Both
    CTAs walk the same pairs; `low.ws_valid` says whether this CTA's tile is in the grid."""
    axis = low.ws.pair_axis
    pairs = list(grid)
    pairs[axis] = tirx.truncdiv(grid[axis] + 1, 2)
    cluster = T.call_extern("int32", "tiled::sm90::cluster_id_x")
    step = T.call_extern("int32", "tiled::sm90::cluster_count_x")
    rank = T.call_extern("int32", "tiled::sm90::cluster_rank")
    var = low.program.kernel.block_vars[axis]
    with T.serial(0, tirx.truncdiv(pairs[0] * pairs[1] - cluster + step - 1, step)) as it:
        bind_block(low, cluster + it * step, pairs, group=4 if axis == 1 else 8)
        low.vars[var] = low.vars[var] * 2 + rank
        low.ws_valid = low.vars[var] < grid[axis]
        yield


def lower_ws_kernel(low, tmaps: list, grid: list) -> None:
    """The warp-specialized kernel: barriers initialized, then the program's threads run its
    body (consumers) while the extra warpgroup feeds the ring (producer)."""
    clustered = low.ws.cluster == 2
    with T.If(low.tx == 0), T.Then():
        T.evaluate(T.call_extern("void", f"{ws_template(low)}::init", ring(low)))
    T.evaluate(T.tvm_storage_sync("shared"))
    if clustered:  # the partner's barriers are initialized before anyone arrives on them
        T.evaluate(T.call_extern("void", "tiled::sm90::cluster_sync"))
    with T.If(low.tx < low.threads):
        with T.Then():
            T.evaluate(T.call_extern("void", f"tiled::sm90::setmaxnreg_inc<{CONSUMER_REGS}>"))
            with program_blocks(low, grid):
                if not clustered:
                    low.stmt(low.program.kernel.body)
                else:
                    with T.If(low.ws_valid):
                        with T.Then():
                            low.stmt(low.program.kernel.body)
                        with T.Else():
                            lower_ws_drain(low)
        with T.Else():
            T.evaluate(T.call_extern("void", f"tiled::sm90::setmaxnreg_dec<{PRODUCER_REGS}>"))
            with T.If(low.tx == low.threads), T.Then(), program_blocks(low, grid):
                lower_ws_producer(low, *tmaps)
    if clustered:  # the partner may still arrive on this CTA's barriers until it gets here
        T.evaluate(T.call_extern("void", "tiled::sm90::cluster_sync"))
