"""T.Parallel nests and T.fill on the CUDA lowering: a nest is split over the threads by the
layout of the fragment it indexes by its loop variables (its anchor); without one, flat over
the threads (or whole in every thread when it writes a replicated tile).

Over a cyclic layout with runs (passes/layout_kinds.CyclicLayout.vec), each thread's slots come in
runs of consecutive elements of the last dim; the run is one vectorized TIR loop where every
access that moves with it is contiguous and aligned (passes/vectorize.run_lanes), so loads and
stores of global and shared tiles are up to 16 bytes wide.
"""

from __future__ import annotations

import contextlib
import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import (
    CyclicLayout,
    ReplicatedLayout,
    cyclic_vector,
    unravel,
)
from tiled.compiler.passes.stmts import is_identity, parallel_nest
from tiled.compiler.passes.vectorize import run_lanes
from tiled.compiler.targets.cuda.halves import lower_halves
from tiled.compiler.tir import and_all, steps_along, unravel_dyn
from tiled.ir.walk import element_accesses, set_before_read, stores
from tiled.v1 import tile_ir_pb2 as pb


def lower_parallel(low, s: pb.Stmt) -> None:
    nest, body = parallel_nest(s)
    loop_vars = [f.var for f in nest]
    extents = [low.expr(f.extent) for f in nest]
    if any(isinstance(e, tirx.IntImm) and e.value <= 0 for e in extents):
        return  # a nest that never runs (its extent folds to 0)
    static = [f.extent.int_value if f.extent.WhichOneof("kind") == "int_value" else None
              for f in nest]
    anchor = None
    ident = []
    for bid, idx in element_accesses(body):
        if low.buffers[bid].scope == pb.FRAGMENT and is_identity(idx, loop_vars) and \
                not isinstance(low.layouts[bid], ReplicatedLayout):
            anchor = anchor or low.layouts[bid]
            if bid not in ident:
                ident.append(bid)
    outer_vars = low.nest_vars
    if anchor is not None and (_paired_atomics(low, anchor, body, loop_vars, ident) or
                               lower_halves(low, anchor, body, loop_vars, ident)):
        low.nest_vars = outer_vars
        return
    if anchor is not None:
        with _slots(low, anchor, body, loop_vars[-1]) as idx:
            coords, valid = anchor.coords(low.tx, idx)
            for v, c in zip(loop_vars, coords, strict=True):
                low.vars[v] = c
            low.frag_bind = {b: idx for b in ident}
            low.nest_vars = loop_vars
            low.frag_row = (anchor, idx) if hasattr(anchor, "row_slot") else None
            low.nest_slot = (anchor, idx)
            low.replica = anchor.leader(low.tx) if hasattr(anchor, "leader") else None
            with low.maybe_if(valid):
                low.stmt(body)
            low.frag_bind, low.nest_vars, low.frag_row = {}, outer_vars, None
            low.replica, low.nest_slot = None, None
        return
    # A local the body sets before it reads it (a scalar it names) is each iteration's own:
    # every thread keeps its own copy, so it does not make the nest run whole in each.
    private = set_before_read(body)
    writes_replicated = any(
        low.buffers[b].scope == pb.FRAGMENT or
        (low.buffers[b].scope == pb.LOCAL and b not in private)
        for b, _ in stores(body))
    if writes_replicated:
        # Every thread needs the values (replicated tiles): each runs the whole nest.
        with contextlib.ExitStack() as stack:
            for v, e in zip(loop_vars, extents, strict=True):
                low.vars[v] = stack.enter_context(T.serial(0, e))
            low.stmt(body)
        return
    total = extents[0]
    for e in extents[1:]:
        total = total * e
    lanes = _flat_lanes(low, body, loop_vars[-1], static, private)
    n_iter = tirx.floordiv(total + low.threads * lanes - 1, low.threads * lanes)
    exact = all(x is not None for x in static) and \
        math.prod(static) % (low.threads * lanes) == 0
    with _flat(low, n_iter, lanes) as (flat, lane):
        for v, c in zip(loop_vars, unravel_dyn(flat, extents), strict=True):
            low.vars[v] = c
        low.nest_vars = loop_vars
        with low.maybe_if(None if exact else flat < total), _lane_locals(low, body, lane, lanes):
            low.stmt(body)
        low.nest_vars = outer_vars


def _single(body: pb.Stmt) -> pb.Stmt:
    while body.WhichOneof("kind") == "seq" and len(body.seq.stmts) == 1:
        body = body.seq.stmts[0]
    return body


def _paired_atomics(low, anchor, body: pb.Stmt, loop_vars: list[int], ident: list) -> bool:
    """A nest that is one relaxed float32 atomic add into a global tensor, over a wgmma
    accumulator (slots 2p and 2p + 1 of a thread are the same row's adjacent columns), whose
    element index moves by exactly one along the tensor's last dim when the nest's last
    variable does (proved, not sampled): lowered as one paired add per two slots
    (tiled::atomic_add_f32x2, a vector reduction on sm_90). The add may sit under an `if`
    without an else (a bounds guard: stream-K's adds into its tile of the workspace, whose
    tile index no bound proves): a pair whose guards both hold takes the paired add, else
    each slot its own guarded one. Whether it was."""
    from tiled.compiler.targets.cuda.layouts import WgmmaLayout

    body = _single(body)
    guard = None
    if body.WhichOneof("kind") == "if_then_else" and \
            not body.if_then_else.HasField("else_body"):
        guard, body = body.if_then_else.cond, _single(body.if_then_else.then_body)
    if not isinstance(anchor, WgmmaLayout) or body.WhichOneof("kind") != "atomic_add":
        return False
    st = body.atomic_add
    dst = low.buffers[st.buffer]
    if st.op != pb.ATOMIC_ADD or st.order != pb.ORDER_RELAXED or st.has_prev or \
            dst.scope != pb.GLOBAL or dst.dtype != pb.FLOAT32 or anchor.local_size % 2:
        return False
    saved = {v: low.vars.get(v) for v in loop_vars}
    try:
        for i, v in enumerate(loop_vars):
            low.vars[v] = tirx.Var(f"nest{i}", "int32")
        steps = steps_along(low, st.indices, loop_vars[-1])
    finally:
        for v, x in saved.items():
            if x is None:
                low.vars.pop(v, None)
            else:
                low.vars[v] = x
    if steps != [int(d == len(steps) - 1) for d in range(len(steps))]:
        return False
    low.nest_vars = loop_vars
    with low.loop(anchor.local_size // 2) as pair:
        parts = []
        for slot in (pair * 2, pair * 2 + 1):
            coords, _ = anchor.coords(low.tx, slot)
            for v, c in zip(loop_vars, coords, strict=True):
                low.vars[v] = c
            low.frag_bind = {b: slot for b in ident}
            low.frag_row = (anchor, slot)
            parts.append((low.addr(st.buffer, [low.expr(i) for i in st.indices]),
                          low.expr(st.value), None if guard is None else low.expr(guard)))
        paired = T.call_extern("void", "tiled::atomic_add_f32x2", parts[0][0], parts[0][1],
                               parts[1][1])
        if guard is None:
            T.evaluate(paired)
        else:
            with T.If(tirx.And(parts[0][2], parts[1][2])):
                with T.Then():
                    T.evaluate(paired)
                with T.Else():
                    for addr, value, ok in parts:
                        with T.If(ok), T.Then():
                            T.evaluate(T.call_extern("float32", "atomicAdd", addr, value))
    low.frag_bind, low.frag_row = {}, None
    return True


@contextlib.contextmanager
def _slots(low, anchor, body: pb.Stmt, inner: int):
    """A loop over the calling thread's slots of `anchor`: over runs, each a vectorized loop of
    its lanes, where the anchor is a cyclic layout with runs and the body's accesses allow."""
    lanes = run_lanes(body, inner, anchor.vec, low.buffers, low.shared_stride) \
        if isinstance(anchor, CyclicLayout) and anchor.numel % (anchor.threads * anchor.vec) == 0 \
        and not _sets_locals(low, body) else 1
    with slot_runs(low, anchor.local_size, lanes) as idx:
        yield idx


@contextlib.contextmanager
def slot_runs(low, size: int, lanes: int):
    """A loop over the calling thread's `size` fragment slots; with `lanes` >= 2, runs of
    that many consecutive slots, each a vectorized loop."""
    if lanes < 2:
        with low.loop(size) as idx:
            yield idx
        return
    with low.loop(size // lanes) as run, T.vectorized(0, lanes) as lane:
        yield run * lanes + lane


def _sets_locals(low, body: pb.Stmt) -> bool:
    """Whether the body stores to a local: one element per thread, which vector lanes would
    share, each lane reading the value another lane left (seen on the H200: the rotary
    kernel's x1 / x2 broadcast from one lane, relative error 0.71)."""
    return any(low.buffers[b].scope == pb.LOCAL for b, _ in stores(body))


def _lane_scalars(low, body: pb.Stmt, private: set) -> bool:
    """Whether every local the body stores is a one-element scalar it sets before reading
    (`private`): those can become one element per lane (_lane_locals)."""
    return all(b in private and math.prod(d.size for d in low.buffers[b].shape) == 1
               for b, _ in stores(body) if low.buffers[b].scope == pb.LOCAL)


def _flat_lanes(low, body: pb.Stmt, inner: int, static: list, private: set) -> int:
    """Vector lanes for a nest dealt flat over the threads: runs of consecutive iterations of
    the innermost loop, where its extent and the nest's size allow whole runs per thread, and
    its locals, if any, are scalars each lane can keep (module docstring of _lane_locals)."""
    if any(x is None for x in static) or not _lane_scalars(low, body, private):
        return 1
    vec = cyclic_vector(tuple(static), low.threads, low.max_vector)
    return run_lanes(body, inner, vec, low.buffers, low.shared_stride)


@contextlib.contextmanager
def _lane_locals(low, body: pb.Stmt, lane, lanes: int):
    """Within a vectorized nest, each scalar local the body sets gets one element per lane
    (a [lanes] local indexed by the lane: a vector register), instead of the one element
    every lane would share."""
    locals_ = sorted({b for b, _ in stores(body) if low.buffers[b].scope == pb.LOCAL})
    if lanes < 2 or not locals_:
        yield
        return
    saved = {b: low.tir[b] for b in locals_}
    for b in locals_:
        low.tir[b] = T.alloc_buffer((lanes,), saved[b].dtype, scope="local")
        low.lane_index[b] = lane
    try:
        yield
    finally:
        for b in locals_:
            low.tir[b] = saved[b]
            low.lane_index.pop(b, None)


@contextlib.contextmanager
def _flat(low, n_iter, lanes: int):
    """(The flat element index of each of the calling thread's iterations, the vector lane
    or None)."""
    with low.loop(n_iter) as it:
        if lanes < 2:
            yield it * low.threads + low.tx, None
            return
        with T.vectorized(0, lanes) as lane:
            yield (it * low.threads + low.tx) * lanes + lane, lane


def lower_fill(low, f: pb.Fill, s: pb.Stmt) -> None:
    """T.fill / T.clear: a fragment slot by slot, a local tile whole, else over threads."""
    low.uniform_stmt(s)
    b = low.buffers[f.dst.buffer]
    value = low.expr(f.value)
    if b.scope == pb.FRAGMENT:
        buf = low.tir[b.id]
        with low.loop(low.layouts[b.id].local_size) as idx:
            T.buffer_store(buf, value, [idx])
        return
    if b.scope == pb.LOCAL:
        shape = [e for e in f.dst.extents if e != 1] or [1]
        with contextlib.ExitStack() as stack:
            vs = [stack.enter_context(T.serial(0, e)) for e in shape]
            vs = vs if any(e != 1 for e in f.dst.extents) else []
            idx, _ = low.region_index(f.dst, vs)
            low.store(b.id, value, idx)
        return
    shape = [e for e in f.dst.extents if e != 1] or [1]
    numel = math.prod(shape)
    with low.loop(-(-numel // low.threads)) as it:
        flat = it * low.threads + low.tx
        with low.maybe_if(None if numel % low.threads == 0 else flat < numel):
            tile = unravel(flat, shape) if any(e != 1 for e in f.dst.extents) else []
            idx, conds = low.region_index(f.dst, tile)
            with low.maybe_if(and_all(conds)):
                low.store(b.id, value, idx)
