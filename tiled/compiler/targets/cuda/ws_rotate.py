"""Software pipelining of the trailing gemm of a T.Pipelined loop on the TMA ring (ws_loop.py):
FlashAttention written as TileLang users write it, `S = Q K^T`, the softmax on S, `O += P V`,
with the tensor cores running `P V` of step k - 1 while the program's statements compute on
the S of step k.

The loop takes this schedule when its body's wgmma gemms are exactly two, the second (D) is
the body's last statement, and nothing before the first (G) touches D's registers or writes
a shared tile D reads but the ring; D's shared operands are ring tiles or tiles the loop
never writes. Then iteration k issues G(k), then the D(k - 1) it deferred (reading the ring
stage of step k - 1), waits for G only (retire<1>: groups retire in issue order) and runs
the statements after G; the first statement that touches D's accumulator or register
operand waits for D(k - 1) and frees its stages. Iteration 0 has no D(k - 1) and is lowered
apart (peeled), so every wgmma wait count is static: ptxas serializes every wgmma of a
kernel whose waits it cannot follow. After the loop the last D runs. Statements between the
two waits may read and write G's registers while D is in flight (the schedule of
FlashAttention-3, and of sm90_attn.py); none touches D's.

With `pingpong` the consumer warpgroups take turns issuing the pair G(k), D(k - 1). A
statement that initializes G's accumulator just before it (a clear, a causal mask) is
folded into G (acc_init.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.pipeline import touched
from tiled.compiler.targets.cuda.acc_init import AccInit, find_acc_init, lower_mask_add
from tiled.compiler.targets.cuda.gemm_sm90 import sync_next_iteration
from tiled.compiler.targets.cuda.wgmma_waits import hold, wgmma_gemm
from tiled.ir.walk import walk, written
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class Rotation:
    first: int  # body position of G
    last: int  # body position of D (the body's last statement)
    init: AccInit | None = None  # G's accumulator initialization, folded into G (acc_init.py)

    def deferred_copies(self, copies) -> list[int]:
        """The ring copies whose stage D is the last to read (freed after D's wait)."""
        return [j for j, rc in enumerate(copies) if rc.release == self.last]


def _registers(g: pb.Gemm, buffers) -> set[int]:
    return {g.c} | ({g.a} if buffers[g.a].scope == pb.FRAGMENT else set())


def _shared_operands(g: pb.Gemm, buffers) -> set[int]:
    return {x for x in (g.a, g.b) if buffers[x].scope == pb.SHARED}


def find_rotation(low, body: list, ring: dict, peeled: set[int]) -> Rotation | None:
    """The rotation of the ring loop's body (module docstring), or None."""
    acc = low.wgmma_ops.accumulators
    gemms = [i for i, st in enumerate(body) if i not in ring and wgmma_gemm(st, acc)]
    if len(gemms) != 2 or gemms[1] != len(body) - 1:
        return None
    first, last = gemms
    g, d = body[first].gemm, body[last].gemm
    buffers = low.buffers
    d_regs = _registers(d, buffers)
    if g.c in d_regs or g.a == d.c or d.a == g.c:
        return None  # the pair depends on itself
    tiles = _shared_operands(d, buffers)
    ring_tiles = {rc.tile for rc in low.wsloop.copies}
    # D reads its shared operands one step late: they must be ring stages (two or more) or
    # tiles nothing in the loop writes.
    if any(written(x) & (tiles - ring_tiles) for i, st in enumerate(body) if i not in ring
           for x in walk(st)):
        return None
    for i, st in enumerate(body[:first]):
        if i in ring or i in peeled:
            continue
        if touched(st) & d_regs or any(written(x) & tiles for x in walk(st)):
            return None
    return Rotation(first, last, find_acc_init(low, body, set(ring) | peeled, first))


def _call(fn: str, *args) -> None:
    T.evaluate(T.call_extern("void", f"tiled::sm90::{fn}", *args))


def lower_rotated_loop(low, f: pb.For, body: list, ring: dict, peeled: set[int],
                       rot: Rotation, base, n, stage_phase, release, wait_full,
                       writes: bool) -> None:
    """The consumers' loop under `rot`: iteration 0, the steady iterations 1..n-1, then the
    last D. `stage_phase(k)` gives ring step k's (stage, phase); `release(j, at)` frees copy
    j's stage of ring step `at`; `wait_full(j, stage, phase)` waits until copy j's stage has
    landed; `writes`: the body's statements write shared memory (a
    barrier ends each iteration, as ws_loop's)."""
    w = low.wsloop
    g_stmt, d_stmt = body[rot.first], body[rot.last]
    d = d_stmt.gemm
    d_regs = _registers(d, low.buffers)
    late = rot.deferred_copies(w.copies)

    def issue(st, k, zero_init=False):
        """Lowers gemm statement `st` of step k, left in flight."""
        stage, _ = stage_phase(base + k)
        old = {rc.tile: low.stage.get(rc.tile) for rc in w.copies}
        for rc in w.copies:
            low.stage[rc.tile] = stage
        low.in_flight, low.zero_init = True, zero_init
        with low.bound({f.var: k}):
            low.stmt(st)
        low.in_flight = low.zero_init = False
        low.stage.update(old)

    def wait_deferred(k):
        """D(k) done: its registers tied here, its late stages freed."""
        _call("retire<0>")
        hold(low, d)
        for j in late:
            release(j, base + k)

    def iteration(k, first: bool) -> None:
        low.vars[f.var] = k
        stage, phase = stage_phase(base + k)
        for rc in w.copies:
            low.stage[rc.tile] = stage
        pending = not first  # D(k - 1) issued and not yet waited for
        for i, st in enumerate(body):
            if i == rot.last or (rot.init is not None and i == rot.init.pos):
                continue
            if pending and i > rot.first and touched(st) & d_regs:
                wait_deferred(k - 1)
                pending = False
            if i in ring:
                wait_full(ring[i], stage, phase)
            elif i == rot.first:
                if w.pingpong:
                    _call("turn_wait")
                issue(g_stmt, k, rot.init is not None)
                if not first:
                    issue(d_stmt, k - 1)
                if w.pingpong:
                    _call("turn_pass")
                _call(f"retire<{0 if first else 1}>")
                hold(low, g_stmt.gemm, d_regs if not first else frozenset())
                if rot.init is not None:
                    lower_mask_add(low, rot.init)
            elif i not in peeled:
                low.stmt(st)
            for j, rc in enumerate(w.copies):
                if rc.release == i:
                    release(j, base + k)
        if pending:
            wait_deferred(k - 1)
        if writes:
            sync_next_iteration(low)

    with T.If(n > 0), T.Then():
        iteration(tirx.const(0, "int32"), True)
        with T.serial(1, n) as k:
            iteration(k, False)
        if w.pingpong:
            _call("turn_wait")
        issue(d_stmt, n - 1)
        if w.pingpong:
            _call("turn_pass")
        wait_deferred(n - 1)
