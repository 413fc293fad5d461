"""Which wgmma gemms of a loop fed by a TMA producer (ws_loop.py) stay in flight, and where
they are retired.

Outside such loops every wgmma gemm is waited for before the next statement (gemm_sm90.py).
Inside, a gemm of the loop body's own statements is issued and left running while the
statements after it do not need it: its group is retired (wgmma.wait_group) just before the
first statement that touches its accumulator or its register A operand (or the accumulator
of any other wgmma of the loop: ptxas; the register operand of a gemm issued later may be
filled beside it, as a mixed-input GEMM unpacks its next slice), or writes a shared
tile it reads (an `if k == 0:` clearing the accumulator runs only when nothing is carried
over the back edge), or when the next wgmma is issued (`retire<1>` after the issue keeps at most
one group in flight). Two gemms on one accumulator may be in flight together (the hardware
runs them in order) unless the later one clears it. The first thread that is not a gemm of
the loop may thus run beside the gemm's tensor-core work; the loop's back edge is crossed
too: in a GEMM main loop, iteration k's wgmma runs while iteration k + 1 waits for its
tiles; in FlashAttention, O += P V of step k runs while step k + 1 computes S = Q K^T.

A ring stage a gemm in flight reads is released when its group retires, not after its last
statement (a group carried over the back edge releases the previous iteration's stage).
After retiring, the group's registers are tied to that point (`hold_*`), so that the
compiler neither reads the accumulator early nor reuses the operand's registers.

The plan is found by walking the body twice: once from an empty pipeline, then from what
was in flight at the end of that walk; the two ends must agree (a steady state), or no gemm
is left in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.pipeline import touched
from tiled.ir import dtypes
from tiled.ir.walk import walk, written
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class Group:
    pos: int  # body position of the gemm
    carried: bool  # issued in the previous iteration


@dataclass(frozen=True)
class Retire:
    n: int  # retire<n>: at most n groups stay in flight
    groups: list[Group]  # the groups it retires
    live: tuple[int, ...] = ()  # gemm positions still in flight after it


@dataclass
class WaitPlan:
    in_flight: set[int] = field(default_factory=set)  # gemm positions issued, not waited
    before: dict[int, Retire] = field(default_factory=dict)  # body position -> its retire
    after: dict[int, Retire] = field(default_factory=dict)
    releases: dict[int, list[int]] = field(default_factory=dict)  # after position: copies
    held: dict[int, list[int]] = field(default_factory=dict)  # gemm pos -> copies it frees
    carried: list[int] = field(default_factory=list)  # in flight across the back edge


def wgmma_gemm(st: pb.Stmt, accumulators) -> pb.Gemm | None:
    """The gemm of statement `st` when it is one that takes wgmma (its C in
    `accumulators`), else None."""
    if st.WhichOneof("kind") == "gemm" and st.gemm.c in accumulators:
        return st.gemm
    return None


def _registers(g: pb.Gemm, buffers) -> set[int]:
    return {g.c} | ({g.a} if buffers[g.a].scope == pb.FRAGMENT else set())


def _conflicts(st: pb.Stmt, g: pb.Gemm, buffers, accumulators, wgmma_accs: set) -> bool:
    """Whether statement `st` may not run while gemm `g` is in flight. Other wgmmas: the
    same accumulator chains, unless cleared. Other statements: none may touch g's own
    registers, nor the accumulator of any wgmma of the loop (`wgmma_accs`), not only g's:
    ptxas serializes every wgmma of a kernel where ordinary code touches an accumulator while
    a wgmma is in flight (its remark C7514), S = Q K^T's mask included, or waits for it
    (C7517, reading another product carried over the back edge; reading one beside the
    next MMA's flight within an iteration is clean, but measured no faster for the float8
    block-scaled steps: results/wgmma_reads_beside_flight.diff, `pair`). The register
    operand of a gemm not yet issued may be filled beside it: a second set of registers,
    unpacked while the first set's MMA runs."""
    h = wgmma_gemm(st, accumulators)
    regs = _registers(g, buffers)
    if h is not None:
        return h.a == g.c or (h.c in regs and h.c != g.c) or (h.c == g.c and h.clear_accum)
    tiles = {x for x in (g.a, g.b) if buffers[x].scope == pb.SHARED}
    return bool(touched(st) & (regs | wgmma_accs)) or any(written(x) & tiles for x in walk(st))


def _first_step_only(st: pb.Stmt, loop_var: int) -> bool:
    """Whether `st` is `if k == 0: ...` over the loop variable `k` (TileLang's
    clear_accum=k == 0): it runs in the first iteration, where nothing is carried over."""
    if st.WhichOneof("kind") != "if_then_else" or st.if_then_else.HasField("else_body"):
        return False
    c = st.if_then_else.cond
    if c.WhichOneof("kind") != "binary" or c.binary.op != pb.EQ:
        return False
    a, b = c.binary.a, c.binary.b
    return any(x.WhichOneof("kind") == "var" and x.var == loop_var and
               y.WhichOneof("kind") == "int_value" and y.int_value == 0
               for x, y in ((a, b), (b, a)))


def defines_registers(st: pb.Stmt, regs: set[int]) -> bool:
    """Whether ordinary code of `st` writes one of the fragments `regs`."""
    return any(written(x) & regs for x in walk(st))


def first_step_fills(body, loop_var: int, buffers) -> set[int]:
    """Positions of `if k == 0:` statements that only fill fragments no earlier statement
    of the body touches (TileLang's clear_accum=k == 0 as `if k == 0: T.clear(acc)`): they
    may run once before the loop instead (when it runs at all), which keeps a predicated
    clear of an accumulator out of the loop, where ptxas would wait for the wgmma in flight
    before it on every step."""
    out = set()
    for i, st in enumerate(body):
        if not _first_step_only(st, loop_var):
            continue
        inner = [x for x in walk(st.if_then_else.then_body) if x.WhichOneof("kind") != "seq"]
        if not inner or any(x.WhichOneof("kind") != "fill" or
                            buffers[x.fill.dst.buffer].scope != pb.FRAGMENT or
                            x.fill.value.WhichOneof("kind") not in ("int_value", "float_value")
                            for x in inner):
            continue
        frags = {x.fill.dst.buffer for x in inner}
        if not any(touched(x) & frags for x in body[:i]):
            out.add(i)
    return out


def _walk(body, ring: dict, copies, buffers, accumulators, wgmma_accs: set[int],
          top: list[int], loop_var: int, skip: set[int]):
    plan = WaitPlan()
    pending = [Group(p, True) for p in top]
    for i, st in enumerate(body):
        if i not in ring and i not in skip:
            first = _first_step_only(st, loop_var)
            if any(_conflicts(st, wgmma_gemm(body[g.pos], accumulators), buffers, accumulators,
                              wgmma_accs)
                   for g in pending if not (first and g.carried)):
                plan.before[i] = Retire(0, pending)
                pending = []
            if wgmma_gemm(st, accumulators) is not None:
                plan.in_flight.add(i)
                if pending:
                    plan.after[i] = Retire(1, pending, (i,))
                pending = [Group(i, False)]
        for j, rc in enumerate(copies):
            if rc.release != i:
                continue
            holder = next((g for g in reversed(pending) if not g.carried and rc.tile in
                           {body[g.pos].gemm.a, body[g.pos].gemm.b}), None)
            if holder is None:
                plan.releases.setdefault(i, []).append(j)
            else:
                plan.held.setdefault(holder.pos, []).append(j)
    return plan, [g.pos for g in pending]


def plan_waits(low, body: list, skip: set[int]) -> WaitPlan | None:
    """The steady-state plan for the ring loop's body (module docstring; `skip`: positions
    lowered elsewhere), or None when its gemms are waited for as everywhere else. Nothing
    is carried over the back edge when ordinary code of the body writes a wgmma's
    registers (FlashAttention's mask into S): the compiler may hoist that code to the top
    of the loop, into the carried gemm's flight (ptxas then serializes every wgmma, C7515);
    the last gemm's group is then retired at the end of the body."""
    w = low.wsloop
    ring = {rc.pos: i for i, rc in enumerate(w.copies)}
    accumulators = low.wgmma_ops.accumulators
    if not any(wgmma_gemm(st, accumulators) for st in body):
        return None
    gemms = [g for st in body if (g := wgmma_gemm(st, accumulators)) is not None]
    regs = {r for g in gemms for r in _registers(g, low.buffers)}
    args = (body, ring, w.copies, low.buffers, accumulators, {g.c for g in gemms})
    plan, end = _walk(*args, [], w.loop.var, skip)
    if not end:
        return plan
    if any(defines_registers(st, regs) for i, st in enumerate(body)
           if i not in ring and i not in skip and wgmma_gemm(st, accumulators) is None):
        last = len(body) - 1
        older = plan.after[last].groups if last in plan.after else []
        groups = older + [Group(p, False) for p in end if p not in {g.pos for g in older}]
        plan.after[last] = Retire(0, groups)
        return plan
    plan, again = _walk(*args, end, w.loop.var, skip)
    if again != end:
        return None
    plan.carried = end
    return plan


def _call(fn: str, *args) -> None:
    T.evaluate(T.call_extern("void", f"tiled::sm90::{fn}", *args))


def hold(low, g: pb.Gemm, live: set[int] = frozenset()) -> None:
    """Ties the registers of a retired gemm to this point, but for those a wgmma still in
    flight writes (`live`: buffers): touching them would make ptxas wait for it (C7517)."""
    if g.c not in live:
        _call(f"hold_f32<{low.layouts[g.c].local_size}>", T.address_of(low.tir[g.c][0]))
    a = low.buffers[g.a]
    if a.scope == pb.FRAGMENT and g.a not in live:
        words = low.layouts[g.a].local_size * dtypes.nbytes(a.dtype) // 4
        _call(f"hold_words<{words}>", T.address_of(low.tir[g.a][0]))


def retire(low, plan: WaitPlan, body: list, action: Retire, k, release) -> None:
    """Emits `action`'s retire<N>, holds the registers of the groups it retires and frees
    the ring stages they held; `release(j, back)` frees copy j's stage of this iteration
    (back=0) or of the one before (1); `k`: the loop variable."""
    _call(f"retire<{action.n}>")
    live = {body[p].gemm.c for p in action.live}
    for g in action.groups:
        hold(low, body[g.pos].gemm, live)
    for g in action.groups:
        for j in plan.held.get(g.pos, []):
            if g.carried:  # the previous iteration's stage; there is none before k = 0
                with T.If(k > 0), T.Then():
                    release(j, 1)
            else:
                release(j)


def retire_after_loop(low, plan: WaitPlan, body: list, release_last=None) -> None:
    """The groups still in flight when the loop ends. The ring stages they hold are freed by
    `release_last(j)` (copy j's stage of the loop's last step) where the ring runs on into
    another block's loop (a persistent walk); else the producer has issued its last tile
    and nothing waits for them (release_last None)."""
    if plan.carried:
        _call("retire<0>")
        for pos in plan.carried:
            hold(low, body[pos].gemm)
        if release_last is not None:
            for pos in plan.carried:
                for j in plan.held.get(pos, []):
                    release_last(j)

