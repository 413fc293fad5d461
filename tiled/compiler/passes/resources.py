"""Resource accounting: where each shared tile lives in the block's shared pool, and which
tiles may share bytes because their lifetimes do not meet (`overlay`)."""

from __future__ import annotations

from dataclasses import dataclass

from tiled.compiler.passes.pipeline import touched
from tiled.compiler.passes.stmts import body_statements
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

POOL_ALIGN = 128


@dataclass
class SharedTile:
    """Where a shared tile lives in the pool: `rows` x `cols` logical (leading dims flattened
    into rows), each row padded to `stride` elements, `stages` copies back to back."""

    rows: int
    cols: int
    stride: int
    stages: int
    offset: int  # bytes from the pool start
    dtype: str

    @property
    def stage_elems(self) -> int:
        return self.rows * self.stride

    @property
    def nbytes(self) -> int:
        return self.stages * self.stage_elems * dtypes.nbytes(self.dtype)


def align_up(n: int, a: int = POOL_ALIGN) -> int:
    return -(-n // a) * a


def lifetimes(p: pb.Program) -> dict[int, tuple[int, int]]:
    """Each buffer's first and last top-level statement of the kernel body that touches it
    (a loop counts whole: a tile used in any of its iterations lives through all of them)."""
    life: dict[int, tuple[int, int]] = {}
    for i, st in enumerate(body_statements(p.kernel.body)):
        for bid in touched(st):
            first, _ = life.get(bid, (i, i))
            life[bid] = (first, i)
    return life


@dataclass
class Slot:
    """A tile to place: `life` its lifetime (lifetimes), `early` whether something may write
    it before its lifetime starts (a producer warpgroup's ring, a TMA or cp.async stage
    issued ahead): such a tile never takes the bytes of a tile that lives before it."""

    bid: int
    nbytes: int
    align: int
    life: tuple[int, int]
    early: bool


def _apart(a: Slot, b: Slot) -> bool:
    """Whether a and b may take the same bytes: their lifetimes do not meet, and the later
    one is not written early."""
    if a.life[1] < b.life[0]:
        return not b.early
    if b.life[1] < a.life[0]:
        return not a.early
    return False


def end_to_end(slots: list[Slot]) -> dict[int, int]:
    """Offsets for `slots` (bid -> bytes from 0) one after another in their order, each on
    its alignment."""
    offsets, at = {}, 0
    for s in slots:
        offsets[s.bid] = at = align_up(at, s.align)
        at = align_up(at + s.nbytes)
    return offsets


def overlay(slots: list[Slot]) -> tuple[dict[int, int], dict[int, set[int]]]:
    """Offsets for `slots` (bid -> bytes from 0) where tiles whose lifetimes do not meet may
    take the same bytes (largest first, each at the lowest offset clear of the tiles it must
    not share with), and for each tile the earlier tiles whose bytes it reuses: a barrier
    must separate their last use from its first."""
    offsets: dict[int, int] = {}
    placed: list[Slot] = []
    for s in sorted(slots, key=lambda s: -s.nbytes):  # stable: ties keep program order
        taken = sorted((offsets[o.bid], offsets[o.bid] + o.nbytes)
                       for o in placed if not _apart(s, o))
        at = 0
        for lo, hi in taken:
            if at + s.nbytes <= lo:
                break
            at = max(at, align_up(hi, s.align))
        offsets[s.bid] = at
        placed.append(s)
    reuses: dict[int, set[int]] = {}
    for s in slots:
        for o in slots:
            if o.life[1] < s.life[0] and offsets[o.bid] < offsets[s.bid] + s.nbytes and \
                    offsets[s.bid] < offsets[o.bid] + o.nbytes:
                reuses.setdefault(s.bid, set()).add(o.bid)
    return offsets, reuses
