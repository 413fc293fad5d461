"""The CUDA target's fragment layouts, the anchors of layout inference (passes/layout.py):

- `MmaLayout`: the accumulator layout of mma.sync m16n8k16 over a grid of warps (the layout
  tiled_cuda.h's gemm_ss writes). Chosen for the C operand of a tensor-core T.gemm, with the
  warp grid its GemmWarpPolicy asks for (`choose_warps`). With one warp column (warp_n 1) the
  layout of two adjacent n8 tiles is the m16k16 A-operand layout of mma.sync, so a 16-bit
  fragment in it (`T.copy(acc_s, acc_s_cast)`) is the A operand of a gemm from registers.
- A columns layout (`AccumulatorCols`): a vector over the columns of such a tile, each
  thread holding the columns it holds in it (replicated over the lanes and warps that share
  them): chosen for a vector read as v[j] inside a loop over (i, j) over that tile.
- A rows layout (`WgmmaRows`, `MmaRows`): a vector over the rows of a 2-D layout whose rows
  each live in one quad of lanes of a warp (the wgmma accumulator's), or of each of the
  warp_n warps of a warp row (an mma accumulator's): thread t holds the rows it holds in the
  2-D tile, replicated across its quad (and those warps). Chosen for the row reductions
  (dim 1) of such a tile, so a reduction is a per-thread combine and two quad shuffles (and
  with several warp columns one exchange of partials through shared memory), and `m[i]`
  inside a loop over (i, j) over that tile is a register read.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from tiled.compiler.passes import layout as generic
from tiled.compiler.passes.layout_kinds import CyclicLayout, CyclicRows
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class MmaLayout:
    M: int
    N: int
    warp_m: int
    warp_n: int

    @property
    def local_size(self) -> int:
        return (self.M // self.warp_m // 16) * (self.N // self.warp_n // 8) * 4

    def coords(self, tx, idx):
        wm_, wn_ = self.M // self.warp_m, self.N // self.warp_n
        nt_count = wn_ // 8
        warp, lane = tirx.floordiv(tx, 32), tirx.floormod(tx, 32)
        wm, wn = tirx.floordiv(warp, self.warp_n), tirx.floormod(warp, self.warp_n)
        r = tirx.floormod(idx, 4)
        tile = tirx.floordiv(idx, 4)
        mt, nt = tirx.floordiv(tile, nt_count), tirx.floormod(tile, nt_count)
        row = wm * wm_ + mt * 16 + tirx.floordiv(lane, 4) + 8 * tirx.floordiv(r, 2)
        col = wn * wn_ + nt * 8 + tirx.floormod(lane, 4) * 2 + tirx.floormod(r, 2)
        return [row, col], None

    def template_args(self) -> str:
        return f"{self.warp_m}, {self.warp_n}"

    def rows(self):
        """The rows layout (MmaRows): a row lives in a quad of each of its warp row's
        warp_n warps."""
        return MmaRows(self.M, self.warp_m, self.warp_n)

    def row_slot(self, idx):
        """The MmaRows slot of the row that slot `idx` of this layout lies in."""
        nt_count = self.N // self.warp_n // 8
        return tirx.floordiv(tirx.floordiv(idx, 4), nt_count) * 2 + \
            tirx.floordiv(tirx.floormod(idx, 4), 2)

    def cols(self):
        """The columns layout: a column lives in 8 lanes of each warp of its warp column."""
        return AccumulatorCols(self.N, self.warp_n, 32)

    def col_slot(self, idx):
        """The cols() slot of the column that slot `idx` of this layout lies in."""
        nt_count = self.N // self.warp_n // 8
        return tirx.floormod(tirx.floordiv(idx, 4), nt_count) * 2 + tirx.floormod(idx, 2)

    def row_members(self, slot: int) -> list[int]:
        """This layout's slots (in one thread) whose elements lie in row slot `slot`."""
        mt, half = divmod(slot, 2)
        nt_count = self.N // self.warp_n // 8
        return [(mt * nt_count + nt) * 4 + 2 * half + c for nt in range(nt_count)
                for c in (0, 1)]


@dataclass(frozen=True)
class WgmmaRows:
    """The rows of `WgmmaLayout(M, *, nwg, wg_n)`: warpgroup w holds rows [(w / wg_n) * M /
    wg_m, ...) (wg_m = nwg / wg_n), in M / wg_m / 64 blocks of 64; thread t of a warpgroup
    holds rows 16 * (t / 32) + (t % 32) / 4 and 8 more of each block (slots 2h and 2h + 1), as
    do the other 3 lanes of its quad and, with wg_n > 1, the same threads of the other
    warpgroups of its warpgroup row (each holding its own columns of the rows)."""

    M: int
    nwg: int
    wg_n: int = 1

    QUAD_MASKS = (1, 2)  # lane xor masks that reach the other holders of a row
    REPLICAS = 4  # lanes holding each row

    @property
    def split(self) -> int:
        """Column parts each row's partials come in (reduce.py): its warpgroups."""
        return self.wg_n

    def column(self, tx):
        return tirx.floormod(tirx.floordiv(tx, 128), self.wg_n)

    @property
    def local_size(self) -> int:
        return self.M // (self.nwg // self.wg_n) // 64 * 2

    def coords(self, tx, slot):
        wm, t = tirx.floordiv(tirx.floordiv(tx, 128), self.wg_n), tirx.floormod(tx, 128)
        row = (wm * (self.M // (self.nwg // self.wg_n)) + tirx.floordiv(slot, 2) * 64
               + 16 * tirx.floordiv(t, 32) + tirx.floordiv(tirx.floormod(t, 32), 4)
               + 8 * tirx.floormod(slot, 2))
        return [row], None

    def leader(self, tx):
        """Whether thread tx is the one holder of its rows that writes them out (lane 0 of
        its quad, in its warpgroup row's first warpgroup)."""
        lane0 = tirx.floormod(tx, self.REPLICAS) == 0
        if self.wg_n == 1:
            return lane0
        return tirx.all(self.column(tx) == 0, lane0)


@dataclass(frozen=True)
class WgmmaLayout:
    """wgmma's accumulator over `nwg` warpgroups in a grid of wg_m = nwg / wg_n rows by wg_n
    columns: warpgroup w holds rows [(w / wg_n) * M / wg_m, ...) and columns [(w % wg_n) * N /
    wg_n, ...), as M / wg_m / 64 blocks of m64 x N / wg_n, each N / wg_n / 2 floats per thread
    in wgmma's order. wg_n is 1 (the warpgroups split M) unless a FullCol gemm splits N."""

    M: int
    N: int
    nwg: int
    wg_n: int = 1

    @property
    def wm_rows(self) -> int:
        """Rows per warpgroup."""
        return self.M // (self.nwg // self.wg_n)

    @property
    def wn_cols(self) -> int:
        """Columns per warpgroup."""
        return self.N // self.wg_n

    @property
    def local_size(self) -> int:
        return self.wm_rows // 64 * (self.wn_cols // 2)

    def coords(self, tx, idx):
        half = self.wn_cols // 2
        wg, t = tirx.floordiv(tx, 128), tirx.floormod(tx, 128)
        wm, wn = tirx.floordiv(wg, self.wg_n), tirx.floormod(wg, self.wg_n)
        h, i = tirx.floordiv(idx, half), tirx.floormod(idx, half)
        row = (wm * self.wm_rows + h * 64 + 16 * tirx.floordiv(t, 32)
               + tirx.floordiv(tirx.floormod(t, 32), 4) + 8 * tirx.floormod(tirx.floordiv(i, 2), 2))
        col = (wn * self.wn_cols + 8 * tirx.floordiv(i, 4) + 2 * tirx.floormod(t, 4)
               + tirx.floormod(i, 2))
        return [row, col], None

    def rows(self):
        return WgmmaRows(self.M, self.nwg, self.wg_n)

    def cols(self):
        """The columns layout: a column lives in 32 lanes of each warpgroup of its column."""
        return AccumulatorCols(self.N, self.wg_n, 128)

    def col_slot(self, idx):
        """The cols() slot of the column that slot `idx` of this layout lies in."""
        i = tirx.floormod(idx, self.wn_cols // 2)
        return tirx.floordiv(i, 4) * 2 + tirx.floormod(i, 2)

    def row_slot(self, idx):
        """The WgmmaRows slot of the row that slot `idx` of this layout lies in."""
        half = self.wn_cols // 2
        return tirx.floordiv(idx, half) * 2 + tirx.floormod(tirx.floordiv(idx, 2), 2)

    def row_members(self, slot: int) -> list[int]:
        """This layout's slots (in one thread) whose elements lie in row slot `slot`."""
        h, which = divmod(slot, 2)
        half = self.wn_cols // 2
        return [h * half + i for i in range(half) if (i // 2) % 2 == which]


@dataclass(frozen=True)
class MmaRows:
    """The rows of `MmaLayout(M, *, warps, warp_n)`: warp w holds rows [(w / warp_n) * M /
    warps, ...), in M / warps / 16 blocks of 16 (the warp_n warps of a warp row hold the same
    rows, each its own columns); lane l holds rows l / 4 and l / 4 + 8 of each block (slots
    2 mt and 2 mt + 1), as do the other 3 lanes of its quad."""

    M: int
    warps: int  # warp rows (the accumulator's warp_m)
    warp_n: int = 1

    QUAD_MASKS = (1, 2)
    REPLICAS = 4  # lanes of a warp holding each row

    @property
    def split(self) -> int:
        """Column parts each row's partials come in (reduce.py): its warp row's warps."""
        return self.warp_n

    def column(self, tx):
        return tirx.floormod(tirx.floordiv(tx, 32), self.warp_n)

    @property
    def local_size(self) -> int:
        return self.M // self.warps // 8

    def coords(self, tx, slot):
        warp, lane = tirx.floordiv(tx, 32), tirx.floormod(tx, 32)
        row = (tirx.floordiv(warp, self.warp_n) * (self.M // self.warps)
               + tirx.floordiv(slot, 2) * 16 + tirx.floordiv(lane, 4)
               + 8 * tirx.floormod(slot, 2))
        return [row], None

    def leader(self, tx):
        """Whether thread tx is the one holder of its rows that writes them out (lane 0 of
        its quad, in its warp row's first warp)."""
        lane0 = tirx.floormod(tx, self.REPLICAS) == 0
        if self.warp_n == 1:
            return lane0
        return tirx.all(tirx.floormod(tirx.floordiv(tx, 32), self.warp_n) == 0, lane0)


@dataclass(frozen=True)
class AccumulatorCols:
    """The columns of a wgmma (`unit` 128: a warpgroup) or mma.sync (`unit` 32: a warp)
    accumulator whose units split its N columns `split` ways (wg_n, warp_n): thread t of unit
    u holds columns (u % split) * N / split + 8 c + 2 (t % 4) + {0, 1} for c < N / split / 8
    (slots 2c and 2c + 1), as do the lanes of its unit with the same t % 4 and the same
    threads of the units of its unit column. A vector read as v[j] over the accumulator is
    then the thread's own registers (a bias, a per-channel scale, a key mask)."""

    N: int
    split: int
    unit: int

    @property
    def local_size(self) -> int:
        return self.N // self.split // 4

    def coords(self, tx, slot):
        part = tirx.floormod(tirx.floordiv(tx, self.unit), self.split)
        col = (part * (self.N // self.split) + 8 * tirx.floordiv(slot, 2)
               + 2 * tirx.floormod(tx, 4) + tirx.floormod(slot, 2))
        return [col], None

    def leader(self, tx):
        """Whether thread tx is the one holder of its columns that writes them out (the
        first quad of its unit, in the first unit row)."""
        return tirx.all(tirx.floordiv(tx, self.unit * self.split) == 0,
                        tirx.floordiv(tirx.floormod(tx, self.unit), 4) == 0)


ROWS_LAYOUTS = (WgmmaRows, MmaRows, CyclicRows)  # layouts replicated over a few lanes


def choose_warps(M: int, N: int, threads: int, policy: int = pb.POLICY_SQUARE
                 ) -> tuple[int, int] | None:
    """The warp grid (warp_m, warp_n) for an mma.sync tile of M x N, or None when none fits.
    `policy` (a GemmWarpPolicy): POLICY_SQUARE makes the warps' tiles as square as the warp
    count allows, POLICY_FULL_ROW puts as many warps along M as fit (each warp then holds
    whole rows: row reductions stay in a quad of lanes), POLICY_FULL_COL as many along N."""
    if threads % 32:
        return None
    warps = threads // 32
    fits = []
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if M % (16 * wm) or N % (8 * wn):
            continue
        if (M // wm // 16) * (N // wn // 8) * 4 > 256:
            continue
        fits.append((wm, wn))
    if not fits:
        return None
    if policy == pb.POLICY_FULL_ROW:
        return max(fits)
    if policy == pb.POLICY_FULL_COL:
        return min(fits)
    return min(fits, key=lambda w: abs(M / w[0] - N / w[1]))  # ties: fewer warps along M


def mma_eligible(a: pb.Buffer, b: pb.Buffer, c: pb.Buffer) -> bool:
    ab = {dtypes.canonical_name(a.dtype), dtypes.canonical_name(b.dtype)}
    if dtypes.canonical_name(c.dtype) != "float32":
        return False
    # float8 tiles in shared memory are converted to half first (gemm.converted).
    if ab <= {"float8_e4m3", "float8_e5m2"}:
        return a.scope == b.scope == pb.SHARED
    # A fragment operand is read from registers or staged through shared memory (gemm).
    return (len(ab) == 1 and ab <= {"float16", "bfloat16"}
            and {a.scope, b.scope} <= {pb.SHARED, pb.FRAGMENT})


def a_operand_layout(g: pb.Gemm, buffers, c_layout) -> MmaLayout | None:
    """The layout in which fragment A of gemm `g` is mma.sync's A operand in registers: the
    accumulator layout of C's warps over (M, K) with one warp column, since two adjacent n8
    accumulator tiles hold an m16k16 A tile. None when no such layout serves (a transposed
    A, C not an mma accumulator with one warp column, K not a multiple of 16)."""
    a = buffers[g.a]
    if a.scope != pb.FRAGMENT or g.transpose_a or g.a_index or len(a.shape) != 2 or \
            not isinstance(c_layout, MmaLayout) or c_layout.warp_n != 1:
        return None
    M, K = (d.size for d in a.shape)
    if M != c_layout.M or K % 16:
        return None
    return MmaLayout(M, K, c_layout.warp_m, 1)




class CudaAnchors:
    """The CUDA instruction layouts layout inference starts from."""

    rows_layouts = ROWS_LAYOUTS
    max_vector = 8  # 16 bytes of a 16-bit tile per access

    @staticmethod
    def accumulator(g: pb.Gemm, buffers, threads: int):
        a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
        M, N = c.shape[0].size, c.shape[1].size
        warps = choose_warps(M, N, threads, g.policy) if mma_eligible(a, b, c) else None
        return MmaLayout(M, N, *warps) if warps else CyclicLayout((M, N), threads)

    @staticmethod
    def a_operand(g: pb.Gemm, buffers, c_layout):
        """mma.sync reads a 16-bit A from registers in a_operand_layout; wgmma (RS) in the
        wgmma accumulator layout of an M x K tile over C's warpgroups."""
        a = buffers[g.a]
        if dtypes.nbytes(a.dtype) != 2:
            return None
        if isinstance(c_layout, WgmmaLayout):
            if a.scope != pb.FRAGMENT or g.transpose_a or g.a_index or len(a.shape) != 2 or \
                    c_layout.wg_n != 1:  # each warpgroup's A is whole rows of C's
                return None
            M, K = (d.size for d in a.shape)
            return WgmmaLayout(M, K, c_layout.nwg) if M == c_layout.M and K % 16 == 0 \
                else None
        return a_operand_layout(g, buffers, c_layout)


def infer_layouts(program: pb.Program, accumulators: dict[int, object] | None = None
                  ) -> dict[int, object]:
    """Every fragment's layout on CUDA; `accumulators` fixes some gemm accumulators' layouts
    (the sm_90a paths use the wgmma layout)."""
    return generic.infer_layouts(program, CudaAnchors, accumulators)
