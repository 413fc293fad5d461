"""Fragment layout inference for the CUDA backend.

A FRAGMENT tile belongs to the block but lives in its threads' registers; its layout says
which thread holds which element. Three layouts exist:

- `MmaLayout`: the accumulator layout of mma.sync m16n8k16 over a grid of warps (the layout
  tiled_cuda.h's gemm_ss writes). Chosen for the C operand of a tensor-core T.gemm.
- `CyclicLayout`: element e (row-major) lives in thread e % threads, slot e // threads.
- `ReplicatedLayout`: every thread holds the whole tile. Chosen for reduction results and for
  tiles indexed other than by the loop variables of a T.Parallel nest (e.g. `m[i]` inside a
  loop over (i, j)), since any thread may then need any element.
- A rows layout (`WgmmaRows`): a vector over the rows of a 2-D layout whose rows each live in
  one quad of lanes (the wgmma accumulator's): thread t holds the rows it holds in the 2-D
  tile, replicated across its quad. Chosen for the row reductions (dim 1) of such a tile, so a
  reduction is a per-thread combine and two quad shuffles, and `m[i]` inside a loop over
  (i, j) over that tile is a register read.

Inference: gemm accumulators first; an mma layout spreads to fragments of the same shape that
are indexed exactly by the same T.Parallel nest as an mma fragment; the row reductions of a
tile with rows get its rows layout, which spreads the same way through 1-D nests, and
survives only where every `m[i]` read in an (i, j) nest is over a tile with the same rows;
other reduce outputs and non-identity-indexed or scalar-accessed fragments become replicated;
the rest are cyclic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx

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


def rows_of(layout):
    """The rows layout of a 2-D fragment layout, or None when its rows are spread wider than a
    quad of lanes (then row vectors over it stay replicated)."""
    rows = getattr(layout, "rows", None)
    return rows() if rows is not None else None


def choose_warps(M: int, N: int, threads: int) -> tuple[int, int] | None:
    """The warp grid for an mma.sync tile of M x N, or None when none fits."""
    if threads % 32:
        return None
    warps = threads // 32
    best = None
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if M % (16 * wm) or N % (8 * wn):
            continue
        per_thread = (M // wm // 16) * (N // wn // 8) * 4
        if per_thread > 256:
            continue
        score = abs(M / wm - N / wn)
        if best is None or score < best[0]:
            best = (score, wm, wn)
    return None if best is None else (best[1], best[2])


def mma_eligible(a: pb.Buffer, b: pb.Buffer, c: pb.Buffer) -> bool:
    ab = {dtypes.canonical_name(a.dtype), dtypes.canonical_name(b.dtype)}
    return (len(ab) == 1 and ab <= {"float16", "bfloat16"}
            and dtypes.canonical_name(c.dtype) == "float32"
            and a.scope == pb.SHARED and b.scope == pb.SHARED)


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
    return set()


def expr_vars(exprs) -> set[int]:
    """The ids of the variables `exprs` use."""
    return {x.var for e in exprs for x in subexprs(e) if x.WhichOneof("kind") == "var"}


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


def walk(s: pb.Stmt):
    """`s` and every statement nested in it, in program order."""
    yield s
    kind = s.WhichOneof("kind")
    if kind == "seq":
        for x in s.seq.stmts:
            yield from walk(x)
    elif kind == "for_":
        yield from walk(s.for_.body)
    elif kind == "if_then_else":
        yield from walk(s.if_then_else.then_body)
        if s.if_then_else.HasField("else_body"):
            yield from walk(s.if_then_else.else_body)


def stmt_exprs(s: pb.Stmt):
    """Expressions directly in statement `s` (not in nested statements)."""
    kind = s.WhichOneof("kind")
    node = getattr(s, kind)
    if kind == "store" or kind == "atomic_add":
        yield from node.indices
        yield node.value
    elif kind == "if_then_else":
        yield node.cond
    elif kind == "for_":
        yield node.extent
    elif kind in ("copy",):
        yield from node.src.offsets
        yield from node.dst.offsets
    elif kind == "fill":
        yield from node.dst.offsets
        yield node.value


def subexprs(e: pb.Expr):
    yield e
    kind = e.WhichOneof("kind")
    if kind == "binary":
        yield from subexprs(e.binary.a)
        yield from subexprs(e.binary.b)
    elif kind == "call":
        for a in e.call.args:
            yield from subexprs(a)
    elif kind == "cast":
        yield from subexprs(e.cast.value)
    elif kind == "select":
        yield from subexprs(e.select.cond)
        yield from subexprs(e.select.true_value)
        yield from subexprs(e.select.false_value)
    elif kind == "load":
        for i in e.load.indices:
            yield from subexprs(i)


def parallel_nest(s: pb.Stmt) -> tuple[list[pb.For], pb.Stmt]:
    """The maximal perfect nest of PARALLEL loops starting at `s`, and its innermost body."""
    nest = []
    while s.WhichOneof("kind") == "for_" and s.for_.kind == pb.PARALLEL:
        nest.append(s.for_)
        s = s.for_.body
    return nest, s


def element_accesses(body: pb.Stmt):
    """(buffer id, index exprs) of every element load / store / atomic in `body`."""
    for st in walk(body):
        kind = st.WhichOneof("kind")
        if kind in ("store", "atomic_add"):
            node = getattr(st, kind)
            yield node.buffer, list(node.indices)
        for e in stmt_exprs(st):
            for sub in subexprs(e):
                if sub.WhichOneof("kind") == "load":
                    yield sub.load.buffer, list(sub.load.indices)


def stores(body: pb.Stmt):
    """(buffer id, index exprs) of every element store / atomic in `body`."""
    for st in walk(body):
        kind = st.WhichOneof("kind")
        if kind in ("store", "atomic_add"):
            node = getattr(st, kind)
            yield node.buffer, list(node.indices)


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


def _infer(program: pb.Program, accumulators: dict[int, object], forced: set[int]
           ) -> tuple[dict[int, object], set[int]]:
    threads = program.kernel.threads
    buffers = {b.id: b for b in program.buffers}
    frags = {b.id for b in program.buffers if b.scope == pb.FRAGMENT}
    layouts: dict[int, object] = {}
    replicated: set[int] = set(forced)
    reduces: list[pb.Reduce] = []
    all_stmts = list(walk(program.kernel.body))

    for st in all_stmts:
        if st.WhichOneof("kind") == "gemm":
            g = st.gemm
            a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
            M, N = c.shape[0].size, c.shape[1].size
            if g.c in accumulators:
                lay = accumulators[g.c]
            else:
                warps = choose_warps(M, N, threads) if mma_eligible(a, b, c) else None
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
    row_reads: list[tuple[int, int]] = []  # (row vector, index of its nest in `nests`)

    def visit(st: pb.Stmt) -> None:
        kind = st.WhichOneof("kind")
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

    changed = True
    while changed:
        changed = False
        for group in nests:
            known = {layouts[b] for b in group if b in layouts and b not in replicated}
            if len(known) > 1:
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

    for bid in frags:
        if bid in replicated:
            if bid in layouts and not isinstance(layouts[bid], WgmmaRows):
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
