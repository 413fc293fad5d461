"""T.Pipelined on the CUDA lowering's generic path: a multi-stage cp.async pipeline. The
loop's leading global -> shared copies and gather nests (its producers, found by lower.plan;
gather.py) write stage k % stages of their tiles `stages - 1` iterations ahead: the first
stages are issued before the loop; each iteration issues the copies of iteration
k + stages - 1, waits for those of iteration k (cp.async.wait_group), fences them for wgmma's
async proxy where a wgmma gemm reads them, synchronizes, and runs the rest of the body on
stage k % stages.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.stmts import body_statements
from tiled.compiler.targets.cuda.copy import async_vector, issue_async_copy
from tiled.compiler.targets.cuda.gather import issue_async_gather
from tiled.v1 import tile_ir_pb2 as pb


def _issue(low, ps: pb.Stmt, pred) -> None:
    """A producer's cp.async vectors: a T.copy's, or a gather nest's (gather.py)."""
    if ps.WhichOneof("kind") == "copy":
        issue_async_copy(low, ps.copy, async_vector(low, ps.copy), pred=pred)
    else:
        issue_async_gather(low, low.gathers[ps.for_.var], pred=pred)


def lower_pipeline(low, f: pb.For, s: pb.Stmt) -> None:
    """A T.Pipelined loop whose leading copies run `stages - 1` iterations ahead (module
    docstring)."""
    stages, producers = low.pipelines[f.var]
    body = body_statements(f.body)
    prod_stmts, rest = body[:len(producers)], body[len(producers):]
    n = low.expr(f.extent)
    # The first stages are in flight before the loop starts.
    low.sync.before(False, True)
    with T.unroll(0, stages - 1) as st:
        low.vars[f.var] = st
        for bid in producers:
            low.stage[bid] = st
        for ps in prod_stmts:
            _issue(low, ps, pred=st < n)
        T.evaluate(T.call_extern("void", "tiled::cp_async_commit"))
    with T.serial(0, n) as k:
        ahead = k + (stages - 1)
        low.vars[f.var] = ahead
        for bid in producers:
            low.stage[bid] = tirx.floormod(ahead, stages)
        for ps in prod_stmts:
            _issue(low, ps, pred=ahead < n)
        T.evaluate(T.call_extern("void", "tiled::cp_async_commit"))
        T.evaluate(T.call_extern("void", f"tiled::cp_async_wait<{stages - 1}>"))
        if set(producers) & low.wgmma_ops.panels:  # wgmma reads them: async proxy
            T.evaluate(T.call_extern("void", "tiled::sm90::fence_proxy_async_shared"))
        low.sync.sync()
        low.vars[f.var] = k
        for bid in producers:
            low.stage[bid] = tirx.floormod(k, stages)
        low.stmt_list(rest)
        # The next iteration overwrites the stage read here.
        low.sync.sync()
    for bid in producers:
        low.stage.pop(bid, None)
    T.evaluate(T.call_extern("void", "tiled::cp_async_wait<0>"))
    low.sync.pending_read = low.sync.pending_write = False
