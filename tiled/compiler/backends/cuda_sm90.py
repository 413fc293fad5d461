"""The sm_90a warp-specialized GEMM path: which programs take it, and its fragment layout.

A kernel takes the path on `cuda:sm_90a` when its body holds, at top level, a T.Pipelined loop
whose body is exactly "copy an A tile and a B tile from global to shared, T.gemm them into a
float32 fragment", with 16-bit A and B, A not transposed, a 64-wide K tile, tiles the wgmma
shapes fit, and 128 or 256 threads; the two shared tiles may be used by nothing else. Then:

- the block gets one more warpgroup (128 threads, the producer): its first thread issues TMA
  loads into a STAGES-deep ring of 128B-swizzled shared tiles; the program's own threads (the
  consumers) run the kernel body, where the loop becomes wgmma on that ring (tiled_sm90.h,
  `tiled::sm90::WsGemm`), synchronized by full / empty mbarriers per stage;
- the accumulator uses the wgmma layout (`WgmmaLayout`), and barriers among the program's
  threads become named barriers the producer never joins;
- the kernel takes two TMA descriptors, built by the runtime from the manifest's recipe
  (kernel_args of kind "tensor_map").

Everything else, and every program that does not match, is lowered as for sm_80.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from tiled.compiler.backends.cuda_layout import MmaLayout, stmt_exprs, subexprs, walk
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

PRODUCER_THREADS = 128
BK = 64  # 64 16-bit elements: one 128-byte swizzle row
PRODUCER_REGS, CONSUMER_REGS = 40, 232
RING_SLACK = 1024  # the ring is aligned to 1024 bytes inside the dynamic pool


@dataclass(frozen=True)
class WgmmaLayout:
    """The accumulator of `WsGemm`: consumer warpgroup w holds rows [w * M / nwg, ...) as
    M / nwg / 64 blocks of m64 x N, each N / 2 floats per thread in wgmma's order."""

    M: int
    N: int
    nwg: int

    @property
    def local_size(self) -> int:
        return self.M // self.nwg // 64 * (self.N // 2)

    def coords(self, tx, idx):
        half = self.N // 2
        wg, t = tirx.floordiv(tx, 128), tirx.floormod(tx, 128)
        h, i = tirx.floordiv(idx, half), tirx.floormod(idx, half)
        row = (wg * (self.M // self.nwg) + h * 64 + 16 * tirx.floordiv(t, 32)
               + tirx.floordiv(tirx.floormod(t, 32), 4) + 8 * tirx.floormod(tirx.floordiv(i, 2), 2))
        col = 8 * tirx.floordiv(i, 4) + 2 * tirx.floormod(t, 4) + tirx.floormod(i, 2)
        return [row, col], None


@dataclass(frozen=True)
class WsGemmPlan:
    loop_var: int  # the T.Pipelined loop's var
    copy_a: pb.Copy
    copy_b: pb.Copy
    a: int  # shared tile ids
    b: int
    c: int  # accumulator fragment id
    dtype: str  # float16 | bfloat16
    BM: int
    BN: int
    stages: int
    nwg: int
    b_kmajor: bool
    consumers: int  # the program's threads

    @property
    def stage_bytes(self) -> int:
        return (self.BM + self.BN) * BK * 2

    @property
    def ring_bytes(self) -> int:
        return RING_SLACK + self.stages * self.stage_bytes + 16 * self.stages

    @property
    def layout(self) -> WgmmaLayout:
        return WgmmaLayout(self.BM, self.BN, self.nwg)

    def template(self, ctype: str) -> str:
        return (f"tiled::sm90::WsGemm<{ctype}, {self.BM}, {self.BN}, {self.stages}, {self.nwg}, "
                f"{str(self.b_kmajor).lower()}>")


def _vars(exprs) -> set[int]:
    return {x.var for e in exprs for x in subexprs(e) if x.WhichOneof("kind") == "var"}


def _touching(body: pb.Stmt, tiles: set[int]) -> int:
    """How many tile ops in `body` read or write one of `tiles`."""
    count = 0
    for st in walk(body):
        kind = st.WhichOneof("kind")
        node = getattr(st, kind)
        if kind == "copy":
            ids = {node.src.buffer, node.dst.buffer}
        elif kind == "gemm":
            ids = {node.a, node.b, node.c}
        elif kind == "reduce":
            ids = {node.src, node.dst}
        elif kind == "fill":
            ids = {node.dst.buffer}
        elif kind in ("store", "atomic_add"):
            ids = {node.buffer}
        else:
            continue
        count += bool(ids & tiles)
    return count


def _loaded(body: pb.Stmt) -> set[int]:
    return {x.load.buffer for st in walk(body) for e in stmt_exprs(st) for x in subexprs(e)
            if x.WhichOneof("kind") == "load"}


def find_ws_gemm(p: pb.Program, layouts: dict[int, object]) -> WsGemmPlan | None:
    """The plan for `p`'s warp-specialized GEMM loop, or None when `p` does not match (see the
    module docstring); never raises for a program that merely does not match."""
    buffers = {b.id: b for b in p.buffers}
    top = list(p.kernel.body.seq.stmts) if p.kernel.body.WhichOneof("kind") == "seq" \
        else [p.kernel.body]
    loops = [s.for_ for s in top if s.WhichOneof("kind") == "for_"
             and s.for_.kind == pb.PIPELINED and s.for_.num_stages >= 2]
    if len(loops) != 1 or p.kernel.threads not in (128, 256) or len(p.kernel.grid) > 2:
        return None
    f = loops[0]
    body = list(f.body.seq.stmts) if f.body.WhichOneof("kind") == "seq" else [f.body]
    if len(body) != 3 or [s.WhichOneof("kind") for s in body] != ["copy", "copy", "gemm"]:
        return None
    g = body[2].gemm
    copies = {s.copy.dst.buffer: s.copy for s in body[:2]}
    if set(copies) != {g.a, g.b} or g.transpose_a or g.clear_accum:
        return None
    a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
    dt = {dtypes.canonical_name(a.dtype), dtypes.canonical_name(b.dtype)}
    if len(dt) != 1 or not dt <= {"float16", "bfloat16"} or c.scope != pb.FRAGMENT or \
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
        if not _vars(cp.src.offsets) <= set(p.kernel.block_vars) | {f.var}:
            return None
    BM, k_a = (d.size for d in a.shape)
    rows_b, cols_b = (d.size for d in b.shape)
    BN, k_b = (rows_b, cols_b) if g.transpose_b else (cols_b, rows_b)
    nwg = p.kernel.threads // 128
    if k_a != BK or k_b != BK or BN % 64 or BN > 256 or BM % (64 * nwg) or BM > 256 or \
            list(d.size for d in c.shape) != [BM, BN] or BM // nwg // 64 * BN // 2 > 128:
        return None
    # The shared tiles feed this loop only (the accumulator may be used anywhere).
    if _touching(p.kernel.body, {g.a, g.b}) != 3:  # the two copies and the gemm
        return None
    if _loaded(p.kernel.body) & {g.a, g.b}:  # element loads of the shared tiles
        return None
    stages = min(f.num_stages, max(2, (200 * 1024) // ((BM + BN) * BK * 2)))
    return WsGemmPlan(f.var, copies[g.a], copies[g.b], g.a, g.b, g.c, dt.pop(), BM, BN, stages,
                      nwg, bool(g.transpose_b), p.kernel.threads)
