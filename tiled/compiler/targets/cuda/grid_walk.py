"""Persistent grids: a block that runs several of the program's blocks in turn, and the
order it takes them in (the sm_90a paths' persistent walks: ws_loop.py, sm90_attn.py); and
the grid's dependency on the kernels before it (T.pdl_sync / T.pdl_trigger)."""

from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.ir.walk import waits_on_grid


def bind_block(low, linear, grid: list, group: int = 8) -> None:
    """Binds the program's block vars for its block number `linear`. A 2-D grid is walked in
    groups of `group` rows of y before moving along x, so that blocks running together share
    their A rows and B columns in L2 (a bijection of the grid: blocks are independent).
    Every quantity is >= 0, so C's truncating division is the floor division meant here."""
    block_vars = list(low.program.kernel.block_vars)
    if len(grid) == 1:
        low.vars[block_vars[0]] = linear
        return
    if len(grid) == 3:  # z outermost (split-K's splits): each z walks the x-y plane as 2-D
        plane = grid[0] * grid[1]
        low.vars[block_vars[2]] = tirx.truncdiv(linear, plane)
        linear = tirx.truncmod(linear, plane)
    gx, gy = grid[:2]
    per_group = group * gx
    first = tirx.truncdiv(linear, per_group) * group
    rows = tirx.min(gy - first, group)
    low.vars[block_vars[1]] = first + tirx.truncmod(tirx.truncmod(linear, per_group), rows)
    low.vars[block_vars[0]] = tirx.truncdiv(tirx.truncmod(linear, per_group), rows)


def grid_dependency(trigger: bool) -> None:
    """T.pdl_trigger / T.pdl_sync (griddepcontrol, tiled_cuda.h; nothing before sm_90)."""
    fn = "launch_dependents" if trigger else "grid_dependency_wait"
    T.evaluate(T.call_extern("void", f"tiled::{fn}"))


def producer_waits_for_grid(low) -> None:
    """The wait of a producer thread that loads for the program's threads: before its first
    load when the program holds a T.pdl_sync (it never runs the program's own)."""
    if waits_on_grid(low.program.kernel.body):
        grid_dependency(trigger=False)


@contextlib.contextmanager
def persistent_walk(low, blocks, first=0, every: int = 1):
    """A loop over this persistent block's share of `blocks` program blocks: blockIdx.x,
    + gridDim.x, ...; yields (the walk's iteration, the program block's number). With
    `every` > 1, only the iterations first, first + every, ... (consumer warpgroups taking
    the blocks in turn). Sets low.walk_count, the whole walk's length."""
    step = T.call_extern("int32", "tiled::sm90::grid_dim_x")
    low.walk_count = tirx.truncdiv(blocks - low.block_x + step - 1, step)
    if every == 1:
        with T.serial(0, low.walk_count) as it:
            yield it, low.block_x + it * step
        return
    with T.serial(0, tirx.truncdiv(low.walk_count - first + every - 1, every)) as j:
        it = j * every + first
        yield it, low.block_x + it * step
