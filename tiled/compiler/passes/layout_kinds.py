"""The target-independent fragment layouts (which thread holds which element of a FRAGMENT
tile), used by layout inference (passes/layout.py) and by every target's lowering:

- `CyclicLayout`: runs of consecutive elements (16 bytes, up to the target's longest) dealt
  round-robin over the threads.
- `CyclicRows`: the rows of a 2-D cyclic tile whose rows each take a group of at most 32
  consecutive lanes (a row vector held by its row's lanes), on targets that take it.
- `StackedLayout`: a 2-D tile each of whose rows is laid out as one 1-D fragment layout (the
  columns' layout): element (r, c) sits in the thread(s) holding element c of that layout, so
  a reduction over dim 0 is a per-thread combine and X[k, i] read over a vector of the
  columns' layout is a register of the same thread.
- `ReplicatedLayout`: every thread holds the whole tile.

Targets add their instruction layouts (targets/<target>/layouts.py) beside these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx


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
class CyclicLayout:
    """Runs of `vec` consecutive elements dealt round-robin over the threads: element e
    (row-major) lives in thread (e / vec) % threads, slot (e / (vec * threads)) * vec + e % vec.
    With `vec` dividing the last dim, a thread's run is contiguous in memory wherever the tile
    is (the run of a global row, a shared row), so its accesses can be vectors."""

    shape: tuple[int, ...]
    threads: int
    vec: int = 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def local_size(self) -> int:
        return -(-self.numel // (self.threads * self.vec)) * self.vec

    def coords(self, tx, idx):
        if self.vec == 1:
            e = idx * self.threads + tx
        else:
            e = (tirx.floordiv(idx, self.vec) * (self.threads * self.vec) + tx * self.vec
                 + tirx.floormod(idx, self.vec))
        valid = None if self.numel % (self.threads * self.vec) == 0 else e < self.numel
        return unravel(e, list(self.shape)), valid

    def rows(self):
        """The rows layout (CyclicRows) of a 2-D tile whose rows each take a group of at most
        ROW_GROUP_MAX consecutive lanes (a power of two: each round deals whole rows), else
        None (a long row spans warps: its vectors stay replicated)."""
        if len(self.shape) != 2 or self.shape[1] % self.vec:
            return None
        group = self.shape[1] // self.vec
        if group > ROW_GROUP_MAX or group & (group - 1) or self.threads % group:
            return None
        return CyclicRows(self.shape[0], self.threads, group)

    def cols(self):
        """The columns layout of a 2-D tile whose rows each span whole rounds (the last dim a
        multiple of threads x vec: every thread holds the same columns in each row): the
        cyclic layout of one row; else None."""
        if len(self.shape) != 2 or self.shape[1] % (self.threads * self.vec):
            return None
        return CyclicLayout((self.shape[1],), self.threads, self.vec)

    def col_slot(self, idx):
        """The slot (in `cols()`) of the column that slot `idx` lies in."""
        rounds = self.shape[1] // (self.threads * self.vec)  # a row's runs per thread
        return tirx.floormod(tirx.floordiv(idx, self.vec), rounds) * self.vec + \
            tirx.floormod(idx, self.vec)

    def row_slot(self, idx):
        """The CyclicRows slot of the row that slot `idx` lies in: its round."""
        return tirx.floordiv(idx, self.vec)

    def row_members(self, slot: int) -> list[int]:
        """This layout's slots (in one thread) in row slot `slot`: one run."""
        return [slot * self.vec + c for c in range(self.vec)]


ROW_GROUP_MAX = 32  # lanes a row of a cyclic tile may span and keep a rows layout (a warp)


@dataclass(frozen=True)
class CyclicRows:
    """The rows of `CyclicLayout((M, N), threads, vec)` whose rows take `group` = N / vec
    consecutive lanes each (within a warp): in round k thread t holds row k * R + t / group
    (R = threads / group rows a round), as do the other lanes of its group. A row reduction
    is a per-thread combine and log2(group) xor shuffles; a row vector read over the tile is
    the thread's own slot."""

    M: int
    threads: int
    group: int
    split = 1  # (a row's partials come in one part: reduce.py)

    @property
    def QUAD_MASKS(self) -> tuple[int, ...]:  # (named as the other rows layouts)
        return tuple(1 << k for k in range(self.group.bit_length() - 1))

    @property
    def REPLICAS(self) -> int:
        return self.group

    @property
    def per_round(self) -> int:
        return self.threads // self.group

    @property
    def local_size(self) -> int:
        return -(-self.M // self.per_round)

    def coords(self, tx, slot):
        row = slot * self.per_round + tirx.floordiv(tx, self.group)
        return [row], None if self.M % self.per_round == 0 else row < self.M

    def leader(self, tx):
        """Whether thread tx is the holder of its rows that writes them out (its group's
        first lane)."""
        return tirx.floormod(tx, self.group) == 0


def cyclic_vector(shape: tuple[int, ...], threads: int, max_vec: int) -> int:
    """The run length of a cyclic layout: the longest (up to `max_vec`) that divides the
    last dim and deals whole runs to every thread."""
    numel = math.prod(shape)
    vec = max_vec
    while vec > 1 and (shape[-1] % vec or numel % (threads * vec)):
        vec //= 2
    return vec


SELECT_ROWS_MAX = 16  # rows of a stacked tile read by a choice of registers (StackedLayout.read)


@dataclass(frozen=True)
class StackedLayout:
    """`count` rows, each laid out as the 1-D layout `inner` (a vector of the columns): row
    r's slots follow row r - 1's in every thread, element (r, c) at slot r * L + s where s is
    c's slot in `inner` (L its local size), held by the thread(s) that hold c. A flash-
    decoding combine's log-sum-exps [splits, rows] take it from the rows they are read with,
    so the reduction over the splits is a per-thread combine and `lse[k, i]` a register."""

    inner: object
    count: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.count, self.columns)

    @property
    def columns(self) -> int:
        return self.inner.shape[0] if isinstance(self.inner, CyclicLayout) else self.inner.M

    @property
    def local_size(self) -> int:
        return self.count * self.inner.local_size

    def coords(self, tx, idx):
        n = self.inner.local_size
        (c,), valid = self.inner.coords(tx, tirx.floormod(idx, n))
        return [tirx.floordiv(idx, n), c], valid

    def slot(self, row, inner_slot):
        """The slot of element (row, c) where `inner_slot` is c's slot in `inner`."""
        return row * self.inner.local_size + inner_slot

    def read(self, buf, row, inner_slot):
        """Element (row, c) of a thread's register array `buf` (`inner_slot` c's slot): with a
        row not known at compile time, a choice among the rows' registers (a register array
        indexed by a value the compiler cannot fold goes to local memory)."""
        if isinstance(row, (int, tirx.IntImm)) or self.count > SELECT_ROWS_MAX:
            return buf[self.slot(row, inner_slot)]
        value = buf[self.slot(self.count - 1, inner_slot)]
        for r in reversed(range(self.count - 1)):
            value = tirx.Select(row == r, buf[self.slot(r, inner_slot)], value)
        return value



def columns_of(layout, rows_layouts: tuple[type, ...]):
    """`layout` when a 2-D fragment can be stacked over it (StackedLayout): a 1-D layout that
    splits its elements over the threads, a cyclic vector or one of the target's rows
    layouts (`rows_layouts`); else None."""
    if isinstance(layout, CyclicLayout) and len(layout.shape) == 1:
        return layout
    return layout if isinstance(layout, rows_layouts) else None


def stacked_on(tile_layout, vector_layout) -> bool:
    """Whether a 2-D tile of `tile_layout` is stacked on vectors of `vector_layout`."""
    return isinstance(tile_layout, StackedLayout) and tile_layout.inner == vector_layout


@dataclass(frozen=True)
class ReplicatedLayout:
    shape: tuple[int, ...]

    @property
    def local_size(self) -> int:
        return math.prod(self.shape)

    def coords(self, tx, idx):
        return unravel(idx, list(self.shape)), None


def cols_of(layout):
    """The columns layout of a 2-D fragment layout (a vector over its columns, each thread
    holding the columns it holds in the tile: a target's accumulator layouts give one), or
    None."""
    cols = getattr(layout, "cols", None)
    return cols() if cols is not None else None


def rows_of(layout, allowed: tuple[type, ...] | None = None):
    """The rows layout of a 2-D fragment layout, or None when its rows are spread wider than a
    few lanes (then row vectors over it stay replicated) or, with `allowed` (a target's
    rows_layouts), when the target does not take that rows layout."""
    rows = getattr(layout, "rows", None)
    rows = rows() if rows is not None else None
    return rows if rows is None or allowed is None or isinstance(rows, allowed) else None
