"""The T.Pipelined ring's bookkeeping that its producer (ws_producer.py) and its consumers
(ws_loop.py) share: the mbarrier of an index, a ring step's stage and phase, the count of ring
steps carried across the loop's runs and program blocks, the head copies' slots."""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.targets.cuda.ws_plan import WsLoop


def call(fn: str, *args) -> None:
    T.evaluate(T.call_extern("void", f"tiled::sm90::{fn}", *args))


def bar(low, index):
    return T.address_of(low.ring_bars[index])


def stage_phase(w: WsLoop, k):
    stage = tirx.floormod(k, w.stages)
    return stage, tirx.Cast("uint32", tirx.floormod(tirx.floordiv(k, w.stages), 2))


def ring_base(low):
    return low.ring_k[0] if low.ring_k is not None else tirx.const(0, "int32")


def ring_advance(low, n) -> None:
    if low.ring_k is not None:
        T.buffer_store(low.ring_k, low.ring_k[0] + n, [0])


def ring_steps(w: WsLoop, n):
    """Ring stages a loop of `n` iterations takes (none for n <= 0: a nested loop's extent
    may be anything)."""
    if w.run.nested:
        n = tirx.max(n, tirx.const(0, "int32"))
    return n if w.merge == 1 else tirx.floordiv(n + w.merge - 1, w.merge)


def head_slot(low) -> tuple:
    """(this program block's head tile slot, its barriers' phase)."""
    slots = low.wsloop.head_slots
    return tirx.floormod(low.walk_it, slots), \
        tirx.Cast("uint32", tirx.floormod(tirx.floordiv(low.walk_it, slots), 2))


def leave_stages(low) -> None:
    for rc in low.wsloop.copies:
        low.stage.pop(rc.tile, None)
        low.panel_shift.pop(rc.tile, None)
