"""The producer side of the T.Pipelined ring (ws_loop.py says what the path is): the TMA
descriptors its copies take, its head copies, and the loop that fills the ring's stages, TMA
boxes from the producer's first thread and a gather's cp.async vectors from all its threads,
inside the skeleton of the program around the loop where the loop is nested."""

from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.pipeline import holds_loop, is_loop
from tiled.compiler.targets.cuda.gather import issue_async_gather
from tiled.compiler.targets.cuda.ws_plan import RingCopy
from tiled.compiler.targets.cuda.ws_ring import (
    bar,
    call,
    head_slot,
    leave_stages,
    ring_advance,
    ring_base,
    ring_steps,
    stage_phase,
)
from tiled.ir.walk import walk
from tiled.v1 import tile_ir_pb2 as pb


def declare_ring_maps(low) -> None:
    """One TMA descriptor parameter per (tensor, box, swizzle) the ring copies use."""
    w = low.wsloop
    by_key: dict = {}

    def tensor_map(rc: RingCopy):
        param = low.param_of[rc.copy.src.buffer]
        key = (param, tuple(rc.box), rc.swizzle)
        if key not in by_key:
            name = f"tiled_tmap_r{len(by_key)}"
            by_key[key] = T.arg(name, T.handle())
            low.tensor_maps[name] = {"kind": "tensor_map", "param": param, "box": rc.box,
                                     "swizzle": rc.swizzle}
        return by_key[key]

    for i, rc in enumerate(w.copies):
        if rc.gather is None:
            w.maps[i] = tensor_map(rc)
    for h, rc in enumerate(w.heads):
        w.head_maps[h] = tensor_map(rc)


def _producer_heads(low) -> None:
    """The head copies of this program block, issued before its ring steps (module
    docstring); walking the grid, each waits until the block before that used its slot
    freed it."""
    w = low.wsloop
    slot, phase = head_slot(low)
    for h, rc in enumerate(w.heads):
        if w.persistent:
            call("bar_wait", bar(low, w.head_empty(h, slot)), tirx.const(1, "uint32") - phase)
        full = bar(low, w.head_full(h, slot))
        low.stage[rc.tile] = slot
        with _issuer(low):
            call("ring_fill", full, tirx.const(rc.nbytes, "uint32"))
            _tma_boxes(low, rc, w.head_maps[h], full)


@contextlib.contextmanager
def _issuer(low):
    """The producer thread that issues TMA (its first), where all its threads run the
    loop (a ring with a gather)."""
    if not low.wsloop.gathers:
        yield
        return
    with T.If(low.tx == low.threads), T.Then():
        yield


def _tma_boxes(low, rc: RingCopy, tmap, full) -> None:
    """The TMA boxes of copy `rc` into its tile (its current stage), completing on `full`."""
    coords = [low.expr(o) for o in rc.copy.src.offsets][::-1]  # innermost first
    zero = tirx.const(0, "int32")
    for b in range(rc.boxes):
        col = b * rc.box_cols
        at = [tirx.const(col, "int32")]
        dst = low.addr(rc.tile, at if len(low.buffers[rc.tile].shape) == 1 else [zero, *at])
        call("tma_load", dst, tmap, full, coords[0] + col, *coords[1:])


def lower_producer(low) -> None:
    """The producer's thread (all its threads where a ring copy gathers): the ring loop,
    inside the skeleton of the program around it when the loop is nested
    (passes/pipeline.py): the serial loops and ifs that hold the loop or a store to a
    uniform scalar, and those stores."""
    w = low.wsloop
    if not w.run.nested:
        _producer_heads(low)
        return _producer_loop(low)
    scalars = w.run.scalars

    def holds(s: pb.Stmt) -> bool:
        return holds_loop(s, w.loop.var) or any(
            st.WhichOneof("kind") == "store" and st.store.buffer in scalars for st in walk(s))

    def skeleton(s: pb.Stmt) -> None:
        kind = s.WhichOneof("kind")
        if kind == "seq":
            for x in s.seq.stmts:
                skeleton(x)
        elif kind == "store" and s.store.buffer in scalars:
            low.stmt(s)
        elif is_loop(s, w.loop.var):
            _producer_loop(low)
        elif kind == "for_" and holds(s):
            with T.serial(0, low.expr(s.for_.extent)) as v:
                low.vars[s.for_.var] = v
                skeleton(s.for_.body)
        elif kind == "if_then_else" and holds(s):
            node = s.if_then_else
            with T.If(low.expr(node.cond)):
                with T.Then():
                    skeleton(node.then_body)
                if node.HasField("else_body") and holds(node.else_body):
                    with T.Else():
                        skeleton(node.else_body)

    skeleton(low.program.kernel.body)


def _producer_loop(low) -> None:
    w = low.wsloop
    f = w.loop
    n = low.expr(f.extent)
    base = ring_base(low)
    with T.serial(0, ring_steps(w, n)) as k:
        low.vars[f.var] = k * w.merge  # the first of the iterations this stage holds
        stage, phase = stage_phase(w, base + k)
        for i, rc in enumerate(w.copies):
            low.stage[rc.tile] = stage
            call("bar_wait", bar(low, w.empty(i, stage)), tirx.const(1, "uint32") - phase)
            full = bar(low, w.full(i, stage))
            if rc.gather is not None:  # every producer thread: its vectors, then its arrival
                issue_async_gather(low, rc.gather, threads=w.producer_threads,
                                   tx=low.tx - low.threads)
                call("ring_gathered", full)
                continue
            with _issuer(low):
                call("ring_fill", full, tirx.const(rc.nbytes, "uint32"))
                _tma_boxes(low, rc, w.maps[i], full)
    ring_advance(low, ring_steps(w, n))
    leave_stages(low)
