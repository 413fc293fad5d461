"""Resource accounting: where each shared tile lives in the block's shared pool."""

from __future__ import annotations

from dataclasses import dataclass

from tiled.ir import dtypes

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
