"""Fragment layout inference for the CUDA backend.

A FRAGMENT tile belongs to the block but lives in its threads' registers; its layout says
which thread holds which element. Three layouts exist:

- `MmaLayout`: the accumulator layout of mma.sync m16n8k16 over a grid of warps (the layout
  tiled_cuda.h's gemm_ss writes). Chosen for the C operand of a tensor-core T.gemm, with the
  warp grid its GemmWarpPolicy asks for (`choose_warps`). With one warp column (warp_n 1) the
  layout of two adjacent n8 tiles is the m16k16 A-operand layout of mma.sync, so a 16-bit
  fragment in it (`T.copy(acc_s, acc_s_cast)`) is the A operand of a gemm from registers.
- `CyclicLayout`: element e (row-major) lives in thread e % threads, slot e // threads.
- `ReplicatedLayout`: every thread holds the whole tile. Chosen for reduction results and for
  tiles indexed other than by the loop variables of a T.Parallel nest (e.g. `m[i]` inside a
  loop over (i, j)), since any thread may then need any element.
- A rows layout (`WgmmaRows`, `MmaRows`): a vector over the rows of a 2-D layout whose rows
  each live in one quad of lanes (the wgmma accumulator's, an mma accumulator's with one warp
  column): thread t holds the rows it holds in the 2-D tile, replicated across its quad.
  Chosen for the row reductions (dim 1) of such a tile, so a reduction is a per-thread
  combine and two quad shuffles, and `m[i]` inside a loop over (i, j) over that tile is a
  register read.

Inference: gemm accumulators first; an mma layout spreads to fragments of the same shape that
are indexed exactly by the same T.Parallel nest as an mma fragment, or copied whole to or
from one (T.copy between fragments, T.cumsum): a copy between fragments of one layout is a
per-thread move; the row reductions of a tile with rows get its rows layout, which spreads
the same way through 1-D nests, and survives only where every `m[i]` read in an (i, j) nest
is over a tile with the same rows; other reduce outputs and non-identity-indexed or
scalar-accessed fragments become replicated, and so does every fragment of a nest that
writes a replicated one (each thread must then run the whole nest) and a fragment placed by
nothing else that is moved to or from a replicated one; a 16-bit gemm A operand
left without a layout takes the A-operand layout of its gemm (above); the rest are cyclic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx

from tiled.compiler.irwalk import element_accesses, stmt_exprs, stores, subexprs, walk
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


def unravel(flat, shape: list[int]) -> list:
    out = []
    for d in reversed(shape):
        out.append(tirx.floormod(flat, d) if d != 1 else tirx.const(0, "int32"))
        flat = tirx.floordiv(flat, d) if d != 1 else flat
    return list(reversed(out))


def ravel(indices, shape: list[int]):
    flat = tirx.const(0, "int32")
    for i, d in zip(indices, shape, strict=True):
        flat = flat * d + i
    return flat


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
        """The rows layout (MmaRows), or None when a row is spread over several warps."""
        return MmaRows(self.M, self.warp_m) if self.warp_n == 1 else None

    def row_slot(self, idx):
        """The MmaRows slot of the row that slot `idx` of this layout lies in."""
        nt_count = self.N // 8
        return tirx.floordiv(tirx.floordiv(idx, 4), nt_count) * 2 + \
            tirx.floordiv(tirx.floormod(idx, 4), 2)

    def row_members(self, slot: int) -> list[int]:
        """This layout's slots (in one thread) whose elements lie in row slot `slot`."""
        mt, half = divmod(slot, 2)
        nt_count = self.N // 8
        return [(mt * nt_count + nt) * 4 + 2 * half + c for nt in range(nt_count)
                for c in (0, 1)]


@dataclass(frozen=True)
class CyclicLayout:
    shape: tuple[int, ...]
    threads: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def local_size(self) -> int:
        return -(-self.numel // self.threads)

    def coords(self, tx, idx):
        e = idx * self.threads + tx
        valid = None if self.numel % self.threads == 0 else e < self.numel
        return unravel(e, list(self.shape)), valid


@dataclass(frozen=True)
class ReplicatedLayout:
    shape: tuple[int, ...]

    @property
    def local_size(self) -> int:
        return math.prod(self.shape)

    def coords(self, tx, idx):
        return unravel(idx, list(self.shape)), None


@dataclass(frozen=True)
class WgmmaRows:
    """The rows of `WgmmaLayout(M, *, nwg)`: warpgroup w holds rows [w * M / nwg, ...), in
    M / nwg / 64 blocks of 64; thread t of a warpgroup holds rows 16 * (t / 32) + (t % 32) / 4
    and 8 more of each block (slots 2h and 2h + 1), as do the other 3 lanes of its quad."""

    M: int
    nwg: int

    QUAD_MASKS = (1, 2)  # lane xor masks that reach the other holders of a row

    @property
    def local_size(self) -> int:
        return self.M // self.nwg // 64 * 2

    def coords(self, tx, slot):
        wg, t = tirx.floordiv(tx, 128), tirx.floormod(tx, 128)
        row = (wg * (self.M // self.nwg) + tirx.floordiv(slot, 2) * 64
               + 16 * tirx.floordiv(t, 32) + tirx.floordiv(tirx.floormod(t, 32), 4)
               + 8 * tirx.floormod(slot, 2))
        return [row], None


@dataclass(frozen=True)
class MmaRows:
    """The rows of `MmaLayout(M, *, warps, 1)`: warp w holds rows [w * M / warps, ...), in
    M / warps / 16 blocks of 16; lane l holds rows l / 4 and l / 4 + 8 of each block (slots
    2 mt and 2 mt + 1), as do the other 3 lanes of its quad."""

    M: int
    warps: int

    QUAD_MASKS = (1, 2)

    @property
    def local_size(self) -> int:
        return self.M // self.warps // 8

    def coords(self, tx, slot):
        warp, lane = tirx.floordiv(tx, 32), tirx.floormod(tx, 32)
        row = (warp * (self.M // self.warps) + tirx.floordiv(slot, 2) * 16
               + tirx.floordiv(lane, 4) + 8 * tirx.floormod(slot, 2))
        return [row], None


ROWS_LAYOUTS = (WgmmaRows, MmaRows)  # layouts replicated over the lanes of a quad


def rows_of(layout):
    """The rows layout of a 2-D fragment layout, or None when its rows are spread wider than a
    quad of lanes (then row vectors over it stay replicated)."""
    rows = getattr(layout, "rows", None)
    return rows() if rows is not None else None


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
    # float8 tiles in shared memory are converted to half first (cuda_gemm.converted).
    if ab <= {"float8_e4m3", "float8_e5m2"}:
        return a.scope == b.scope == pb.SHARED
    # A fragment operand is read from registers or staged through shared memory (cuda_gemm).
    return (len(ab) == 1 and ab <= {"float16", "bfloat16"}
            and {a.scope, b.scope} <= {pb.SHARED, pb.FRAGMENT})


def body_statements(s: pb.Stmt) -> list[pb.Stmt]:
    """The statements of a body: a Seq's, or `s` alone."""
    return list(s.seq.stmts) if s.WhichOneof("kind") == "seq" else [s]


def tile_op_buffers(st: pb.Stmt) -> set[int]:
    """The buffers a tile op (copy, gemm, reduce, fill) statement reads or writes; empty for
    any other statement (nested statements not included)."""
    kind = st.WhichOneof("kind")
    node = getattr(st, kind)
    if kind == "copy":
        return {node.src.buffer, node.dst.buffer}
    if kind == "gemm":
        return {node.a, node.b, node.c}
    if kind == "reduce":
        return {node.src, node.dst}
    if kind == "fill":
        return {node.dst.buffer}
    if kind == "scan":
        return {node.src, node.dst}
    return set()


_FOLD = {pb.ADD: lambda a, b: a + b, pb.SUB: lambda a, b: a - b, pb.MUL: lambda a, b: a * b,
         pb.FLOOR_DIV: lambda a, b: a // b if b else None,
         pb.FLOOR_MOD: lambda a, b: a % b if b else None, pb.MIN: min, pb.MAX: max}


def const_int(e: pb.Expr) -> int | None:
    """The value of an integer expression built from constants alone, else None."""
    kind = e.WhichOneof("kind")
    if kind == "int_value":
        return e.int_value
    if kind == "cast":
        return const_int(e.cast.value)
    if kind == "binary" and e.binary.op in _FOLD:
        a, b = const_int(e.binary.a), const_int(e.binary.b)
        return None if a is None or b is None else _FOLD[e.binary.op](a, b)
    return None


def parallel_nest(s: pb.Stmt) -> tuple[list[pb.For], pb.Stmt]:
    """The maximal perfect nest of PARALLEL loops starting at `s`, and its innermost body."""
    nest = []
    while s.WhichOneof("kind") == "for_" and s.for_.kind == pb.PARALLEL:
        nest.append(s.for_)
        s = s.for_.body
    return nest, s


def is_identity(indices, loop_vars: list[int]) -> bool:
    return len(indices) == len(loop_vars) and all(
        i.WhichOneof("kind") == "var" and i.var == v for i, v in zip(indices, loop_vars,
                                                                      strict=True))


def infer_layouts(program: pb.Program, accumulators: dict[int, object] | None = None
                  ) -> dict[int, object]:
    """Every fragment's layout. `accumulators` fixes the layouts of gemm accumulators (the
    sm_90a paths use the wgmma layout); others are chosen here."""
    forced: set[int] = set()
    while True:  # a row vector read over a tile with other rows falls back to replicated
        layouts, misfits = _infer(program, accumulators or {}, forced)
        if not misfits:
            return layouts
        forced |= misfits


def whole_region(r: pb.Region, buf: pb.Buffer) -> bool:
    """Whether region `r` is all of `buf` (offsets 0, full extents)."""
    return list(r.extents) == [d.size for d in buf.shape] and all(
        o.WhichOneof("kind") == "int_value" and o.int_value == 0 for o in r.offsets)


def fragment_pair(st: pb.Stmt, buffers) -> tuple[int, int] | None:
    """(src, dst) of a statement that moves a whole fragment into another of the same shape,
    element for element (T.copy between fragments, T.cumsum), else None: such fragments
    share a layout, so the move is per thread."""
    kind = st.WhichOneof("kind")
    if kind == "copy" and not st.copy.HasField("tma"):
        c = st.copy
        src, dst = buffers[c.src.buffer], buffers[c.dst.buffer]
        if whole_region(c.src, src) and whole_region(c.dst, dst):
            pair = (src, dst)
        else:
            return None
    elif kind == "scan":
        pair = (buffers[st.scan.src], buffers[st.scan.dst])
    else:
        return None
    a, b = pair
    if a.scope != pb.FRAGMENT or b.scope != pb.FRAGMENT or \
            [d.size for d in a.shape] != [d.size for d in b.shape]:
        return None
    return a.id, b.id


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


def _infer(program: pb.Program, accumulators: dict[int, object], forced: set[int]
           ) -> tuple[dict[int, object], set[int]]:
    threads = program.kernel.threads
    buffers = {b.id: b for b in program.buffers}
    frags = {b.id for b in program.buffers if b.scope == pb.FRAGMENT}
    layouts: dict[int, object] = {}
    replicated: set[int] = set(forced)
    reduces: list[pb.Reduce] = []
    all_stmts = list(walk(program.kernel.body))

    gemms: list[pb.Gemm] = []
    for st in all_stmts:
        if st.WhichOneof("kind") == "gemm":
            g = st.gemm
            gemms.append(g)
            a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
            M, N = c.shape[0].size, c.shape[1].size
            if g.c in accumulators:
                lay = accumulators[g.c]
            else:
                warps = choose_warps(M, N, threads, g.policy) if mma_eligible(a, b, c) \
                    else None
                lay = MmaLayout(M, N, *warps) if warps else CyclicLayout((M, N), threads)
            if g.c in layouts and layouts[g.c] != lay:
                raise CompileError(f"fragment {c.name or g.c} is the accumulator of gemms with "
                                   "different layouts")
            layouts[g.c] = lay
        elif st.WhichOneof("kind") == "reduce":
            reduces.append(st.reduce)

    # Parallel nests: identity-indexed fragments share a layout; others must be replicated,
    # except row vectors read as m[i] in an (i, j, ...) nest (checked once layouts are known).
    # Element accesses outside any T.Parallel nest also need every element in every thread.
    nests: list[set[int]] = []
    nest_writes: list[set[int]] = []  # the fragments each nest stores to
    moves: list[set[int]] = []  # fragments moved whole into one another (fragment_pair)
    row_reads: list[tuple[int, int]] = []  # (row vector, index of its nest in `nests`)

    def visit(st: pb.Stmt) -> None:
        kind = st.WhichOneof("kind")
        pair = fragment_pair(st, buffers)
        if pair is not None:
            moves.append(set(pair))
        if kind == "for_" and st.for_.kind == pb.PARALLEL:
            nest, body = parallel_nest(st)
            shape = tuple(f.extent.int_value if f.extent.WhichOneof("kind") == "int_value"
                          else -1 for f in nest)
            loop_vars = [f.var for f in nest]
            written = {bid for bid, _ in stores(body)}
            ident = set()
            for bid, idx in element_accesses(body):
                if bid not in frags:
                    continue
                full = tuple(d.size for d in buffers[bid].shape)
                if is_identity(idx, loop_vars) and full == shape:
                    ident.add(bid)
                elif len(loop_vars) > 1 and is_identity(idx, loop_vars[:1]) and \
                        full == shape[:1] and bid not in written:
                    row_reads.append((bid, len(nests)))
                else:
                    replicated.add(bid)
            nests.append(ident)
            nest_writes.append(written & frags)
            return
        for e in stmt_exprs(st):
            for sub in subexprs(e):
                if sub.WhichOneof("kind") == "load" and sub.load.buffer in frags:
                    replicated.add(sub.load.buffer)
        if kind in ("store", "atomic_add") and getattr(st, kind).buffer in frags:
            replicated.add(getattr(st, kind).buffer)
        if kind == "seq":
            for x in st.seq.stmts:
                visit(x)
        elif kind == "for_":
            visit(st.for_.body)
        elif kind == "if_then_else":
            visit(st.if_then_else.then_body)
            if st.if_then_else.HasField("else_body"):
                visit(st.if_then_else.else_body)

    visit(program.kernel.body)

    def propagate() -> None:
        changed = True
        while changed:
            changed = _spread(nests, moves, reduces, layouts, replicated, buffers)

    propagate()
    # A 16-bit A operand nothing else placed is laid out as mma.sync's A operand (registers).
    placed = False
    for g in gemms:
        lay = a_operand_layout(g, buffers, layouts.get(g.c))
        if lay is not None and g.a not in layouts and g.a not in replicated and \
                dtypes.nbytes(buffers[g.a].dtype) == 2:
            layouts[g.a] = lay
            placed = True
    if placed:
        propagate()

    misfits = set()
    for bid, nest in row_reads:
        anchors = {layouts[b] for b in nests[nest] if b in layouts and b not in replicated}
        lay = layouts.get(bid)
        if bid not in replicated and not (lay is not None and len(anchors) == 1 and
                                          rows_of(anchors.pop()) == lay):
            misfits.add(bid)
    if misfits:
        return layouts, misfits
    for r in reduces:
        if r.dst not in layouts:
            replicated.add(r.dst)
    # A nest that writes a replicated fragment runs whole in every thread: every fragment it
    # indexes by its loop variables must be replicated too.
    for group, written in zip(nests, nest_writes, strict=True):
        if written & replicated:
            misfits |= group - replicated
    # A fragment moved whole to or from a replicated one, placed by nothing else, is
    # replicated too (the move is then a per-thread copy).
    for group in moves:
        if group & replicated:
            misfits |= {b for b in group - replicated if b not in layouts}
    if misfits:
        return layouts, misfits

    for bid in frags:
        if bid in replicated:
            if bid in layouts and not isinstance(layouts[bid], ROWS_LAYOUTS):
                b = buffers[bid]
                raise CompileError(
                    f"fragment {b.name} is a gemm accumulator but is also read "
                    "element by element outside its T.Parallel layout (or reduced into); copy it "
                    "to another fragment first",
                    f"{b.loc.file}:{b.loc.line}" if b.HasField("loc") and b.loc.file else "")
            layouts[bid] = ReplicatedLayout(tuple(d.size for d in buffers[bid].shape))
        elif bid not in layouts:
            layouts[bid] = CyclicLayout(tuple(d.size for d in buffers[bid].shape), threads)
    return layouts, set()


def _spread(nests, moves, reduces, layouts, replicated, buffers) -> bool:
    """One round of layout propagation through the nests, the fragment moves and the row
    reductions; True when a layout was assigned. A move between fragments of different
    layouts is allowed (it goes through shared memory); a nest of them is not."""
    changed = False
    for group in nests + moves:
        known = {layouts[b] for b in group if b in layouts and b not in replicated}
        if len(known) > 1:
            if any(group is m for m in moves):
                continue
            raise CompileError("a T.Parallel loop mixes fragments of different layouts "
                               f"({', '.join(sorted(buffers[b].name for b in group))})")
        if known:
            lay = known.pop()
            for b in group:
                if b not in layouts and b not in replicated:
                    layouts[b] = lay
                    changed = True
    for r in reduces:  # row reductions of a tile with rows take its rows layout
        src = layouts.get(r.src)
        rows = rows_of(src) if r.src not in replicated else None
        if rows is None or r.dst in layouts or r.dst in replicated or \
                len(buffers[r.src].shape) != 2 or r.dim not in (1, -1) or \
                [d.size for d in buffers[r.dst].shape] != [buffers[r.src].shape[0].size]:
            continue
        layouts[r.dst] = rows
        changed = True
    return changed
