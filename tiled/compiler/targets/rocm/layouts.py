"""The ROCm target's fragment layouts, the anchors of layout inference (passes/layout.py).

Every MFMA instruction tiled issues is a 16 x 16 output tile per wavefront (64 lanes), and
all of them (f16, bf16, f32, int8, fp8) share one accumulator layout, AMD's documented D
layout of the 16x16 family (tests/compiler/data/mfma_layouts.json, from AMD's matrix
instruction calculator): lane l, register r holds D[4 * (l / 16) + r][l % 16]. So a row
of a 16 x 16 tile lives in 16 lanes (l % 16 = its column), one register each.

- `MfmaLayout`: the accumulator of a T.gemm over a grid of wavefronts (warp_m x warp_n),
  each holding (M / warp_m / 16) x (N / warp_n / 16) such tiles, 4 registers per tile.
- `MfmaRows`: a vector over the rows of an MfmaLayout with one wavefront column: lane l
  holds rows 4 * (l / 16) + r of each of its 16-row tiles, replicated over the 16 lanes
  that share l / 16 (a row reduction is a per-thread combine and four xor shuffles).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from tiled.compiler.passes import layout as generic
from tiled.compiler.passes.layout_kinds import CyclicLayout, CyclicRows
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

WAVE = 64  # lanes of a wavefront on CDNA (gfx90a, gfx942)
TILE = 16  # the MFMA output tile: 16 x 16


@dataclass(frozen=True)
class MfmaRows:
    """The rows of `MfmaLayout(M, *, waves, 1)`: wave w holds rows [w * M / waves, ...) in
    blocks of 16; lane l holds rows 4 * (l / 16) + r (r < 4, slot 4 * block + r) of each."""

    M: int
    waves: int

    QUAD_MASKS = (1, 2, 4, 8)  # lane xor masks that reach the other holders of a row
    REPLICAS = 16  # lanes holding each row

    @property
    def local_size(self) -> int:
        return self.M // self.waves // TILE * 4

    def coords(self, tx, slot):
        wave, lane = tirx.floordiv(tx, WAVE), tirx.floormod(tx, WAVE)
        row = (wave * (self.M // self.waves) + tirx.floordiv(slot, 4) * TILE
               + 4 * tirx.floordiv(lane, TILE) + tirx.floormod(slot, 4))
        return [row], None

    def leader(self, tx):
        """Whether thread tx is the one holder of its rows that writes them out."""
        return tirx.floormod(tx, self.REPLICAS) == 0


@dataclass(frozen=True)
class MfmaCols:
    """The columns of `MfmaLayout(*, N, *, warp_n)`: lane l of wave w holds column
    (w % warp_n) * N / warp_n + 16 t + l % 16 of each tile column t of its wave (slot t), as
    do the lanes of its wave with the same l % 16 and the waves of its wave column."""

    N: int
    warp_n: int

    @property
    def local_size(self) -> int:
        return self.N // self.warp_n // TILE

    def coords(self, tx, slot):
        wn = tirx.floormod(tirx.floordiv(tx, WAVE), self.warp_n)
        col = wn * (self.N // self.warp_n) + slot * TILE + tirx.floormod(tx, TILE)
        return [col], None

    def leader(self, tx):
        """Whether thread tx is the one holder of its columns that writes them out (the
        first 16 lanes of its wave, in the first wave row)."""
        return tirx.all(tirx.floordiv(tx, WAVE * self.warp_n) == 0,
                        tirx.floordiv(tirx.floormod(tx, WAVE), TILE) == 0)


@dataclass(frozen=True)
class MfmaLayout:
    """The 16x16 MFMA accumulator over warp_m x warp_n wavefronts (module docstring): slot
    idx of a thread is register idx % 4 of tile idx / 4, tiles row-major over its wave's
    (M / warp_m / 16) x (N / warp_n / 16) grid."""

    M: int
    N: int
    warp_m: int
    warp_n: int

    @property
    def local_size(self) -> int:
        return (self.M // self.warp_m // TILE) * (self.N // self.warp_n // TILE) * 4

    def coords(self, tx, idx):
        wm_, wn_ = self.M // self.warp_m, self.N // self.warp_n
        nt_count = wn_ // TILE
        wave, lane = tirx.floordiv(tx, WAVE), tirx.floormod(tx, WAVE)
        wm, wn = tirx.floordiv(wave, self.warp_n), tirx.floormod(wave, self.warp_n)
        r, tile = tirx.floormod(idx, 4), tirx.floordiv(idx, 4)
        mt, nt = tirx.floordiv(tile, nt_count), tirx.floormod(tile, nt_count)
        row = wm * wm_ + mt * TILE + 4 * tirx.floordiv(lane, TILE) + r
        col = wn * wn_ + nt * TILE + tirx.floormod(lane, TILE)
        return [row, col], None

    def template_args(self) -> str:
        return f"{self.warp_m}, {self.warp_n}"

    def rows(self):
        """The rows layout (MfmaRows), or None when a row is spread over several waves."""
        return MfmaRows(self.M, self.warp_m) if self.warp_n == 1 else None

    def cols(self):
        """The columns layout (MfmaCols): a column lives in 4 lanes of each wave of its wave
        column."""
        return MfmaCols(self.N, self.warp_n)

    def col_slot(self, idx):
        """The MfmaCols slot of the column that slot `idx` of this layout lies in."""
        return tirx.floormod(tirx.floordiv(idx, 4), self.N // self.warp_n // TILE)

    def row_slot(self, idx):
        """The MfmaRows slot of the row that slot `idx` of this layout lies in."""
        nt_count = self.N // TILE
        return tirx.floordiv(tirx.floordiv(idx, 4), nt_count) * 4 + tirx.floormod(idx, 4)

    def row_members(self, slot: int) -> list[int]:
        """This layout's slots (in one thread) whose elements lie in row slot `slot`."""
        mt, r = divmod(slot, 4)
        nt_count = self.N // TILE
        return [(mt * nt_count + nt) * 4 + r for nt in range(nt_count)]


ROWS_LAYOUTS = (MfmaRows, CyclicRows)


def mfma_k_step(a: str, b: str, c: str, arch: str) -> int | None:
    """K of the 16x16 MFMA instruction for operand dtypes a, b and accumulator c on `arch`,
    or None when no MFMA takes them (tiled_hip.h's Mfma<...> issues the instruction):
    f16 / bf16 -> f32: 16; f32 -> f32: 4; int8 -> int32: 16 (gfx90a) or 32 (gfx942);
    fp8 / bf8 -> f32: 32 on gfx942 (gfx90a has no fp8 MFMA)."""
    if c == "float32":
        if a == b and a in ("float16", "bfloat16"):
            return 16
        if a == b == "float32":
            return 4
        if {a, b} <= {"float8_e4m3", "float8_e5m2"}:
            return 32 if arch == "gfx942" else None
    if c == "int32" and a == b == "int8":
        return 32 if arch == "gfx942" else 16
    return None


def choose_waves(M: int, N: int, threads: int, policy: int = pb.POLICY_SQUARE
                 ) -> tuple[int, int] | None:
    """The wavefront grid (warp_m, warp_n) for an MFMA tile of M x N, or None when none
    fits (the block is not whole wavefronts, or M, N do not split into 16 x 16 tiles per
    wave). Policies as for CUDA's mma grid (cuda/layouts.choose_warps), but a square tie
    puts more waves along M."""
    if threads % WAVE:
        return None
    waves = threads // WAVE
    fits = []
    for wm in range(1, waves + 1):
        if waves % wm:
            continue
        wn = waves // wm
        if M % (TILE * wm) or N % (TILE * wn):
            continue
        if (M // wm // TILE) * (N // wn // TILE) * 4 > 256:  # registers per thread
            continue
        fits.append((wm, wn))
    if not fits:
        return None
    if policy == pb.POLICY_FULL_ROW:
        return max(fits)
    if policy == pb.POLICY_FULL_COL:
        return min(fits)
    # Ties go to more waves along M: each wave then holds whole rows (a row reduction stays
    # in registers instead of crossing waves through LDS).
    return min(fits, key=lambda w: (abs(M / w[0] - N / w[1]), -w[0]))


def mfma_eligible(g: pb.Gemm, buffers, arch: str) -> bool:
    """Whether T.gemm `g` runs on MFMA: operand and accumulator dtypes an instruction takes,
    K a multiple of its K step, operands in LDS or fragments (staged through LDS)."""
    a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
    names = [dtypes.canonical_name(x.dtype) for x in (a, b, c)]
    step = mfma_k_step(*names, arch)
    K = (a.shape[-2] if g.transpose_a else a.shape[-1]).size
    return step is not None and K % step == 0 and \
        {a.scope, b.scope} <= {pb.SHARED, pb.FRAGMENT} and len(c.shape) == 2


class RocmAnchors:
    """The ROCm instruction layouts layout inference starts from (one per arch: which
    MFMA dtypes exist depends on it)."""

    rows_layouts = ROWS_LAYOUTS
    max_vector = 8  # 16 bytes of a 16-bit tile per access (global_load_dwordx4, ds_read_b128)

    def __init__(self, arch: str):
        self.arch = arch

    def accumulator(self, g: pb.Gemm, buffers, threads: int):
        c = buffers[g.c]
        M, N = c.shape[0].size, c.shape[1].size
        waves = choose_waves(M, N, threads, g.policy) if mfma_eligible(g, buffers, self.arch) \
            else None
        return MfmaLayout(M, N, *waves) if waves else CyclicLayout((M, N), threads)

    @staticmethod
    def a_operand(g: pb.Gemm, buffers, c_layout):
        """None: a fragment A operand is staged through LDS (MFMA's A-operand layout is the
        transpose of its accumulator's, so a previous gemm's result is not one in place)."""
        return None


def infer_layouts(program: pb.Program, arch: str) -> dict[int, object]:
    """Every fragment's layout on ROCm `arch`."""
    return generic.infer_layouts(program, RocmAnchors(arch))
