"""T.Pipelined on a CPU: the loop runs in order on one thread, and its stages become software
prefetches. Each iteration, after its own copies and before its compute, asks for the global
tiles that the loop's copies will read `num_stages - 1` iterations later (at least one), one
prefetch per cache line into L2, so the copy finds them nearer than DRAM: copy loops over
tiles whose rows lie pages apart are what the hardware's own prefetchers follow worst.
Issued before the copies, the burst of prefetches competed with the copies' own loads for the
core's miss buffers (the copies took 16.5% of a 2048^3 gemm's time that way, 13.9% after).

Row-block kernels (RMSNorm, softmax) have no T.Pipelined loop: a block reads its rows from
memory in its first pass and then computes on them in the caches while the memory idles. A
reduction that reads such rows a second time (softmax's exponentials) asks, one prefetch per
cache line as it goes, for the rows the next block will read (`next_block_line`): the grid
is split into runs of consecutive blocks per thread (the shim), so the next block is
usually this thread's next. Spread over the pass, these overlap the next block's loads with
this one's arithmetic; issued as one burst after the first pass (tried, not kept:
benchmarks/results/cpu_next_block_prefetch.diff) they measured no gain.

Element loops that read global rows and store a long math function of them (SiLU-and-mul:
an exponential and a division per element) do the same (`element_plan`): the innermost
loop steps a cache line at a time, each step prefetching that line of each row it reads as
the next block will read it. Without, such a loop overlapped its arithmetic with its loads
only partly, and fell furthest behind a copy when the memory was fastest.

A prefetch never faults and changes no value, so unlike the run-ahead copies of the cuda target
(tiled.compiler.passes.pipeline) the only requirement is that the copy's offsets can be
computed up front: built from the loop variable, block indices, dims and scalar parameters.
"""

from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.pipeline import uniform_vars
from tiled.compiler.passes.stmts import body_statements
from tiled.compiler.targets.cpu import forward
from tiled.ir import dtypes
from tiled.ir.walk import expr_vars, stmt_exprs, subexprs
from tiled.v1 import tile_ir_pb2 as pb

CACHE_LINE = 64
# Math functions that take many instructions an element (vmath's, or libm calls).
LONG_MATH = {pb.EXP, pb.EXP2, pb.LOG, pb.LOG2, pb.TANH, pb.SIGMOID, pb.POW, pb.ERF, pb.SIN,
             pb.COS}
# Whether element loops prefetch the next block's rows (element_plan); off only to measure
# the choice (benchmarks/cpu/element_prefetch.py).
ELEMENTS = True
# Which reductions prefetch the next block's rows (next_block_line): "math", those whose
# elements take a long math function (reduce.py, rereads); "any" and "off" only to measure
# the choice (benchmarks/cpu/next_block_prefetch.py).
NEXT_BLOCK = "math"
_LOCALITY_L2 = 2  # llvm.prefetch locality 2: x86 prefetcht1, into L2 and the levels below


def _pure(offsets, allowed: set[int]) -> bool:
    return not any(x.WhichOneof("kind") == "load" for e in offsets for x in subexprs(e)) and \
        expr_vars(offsets) <= allowed


def _prefetch(buf, idx) -> None:
    # An address past the tensor is fine: a prefetch never faults.
    T.evaluate(tirx.call_llvm_intrin(
        "void", "llvm.prefetch.p0", T.address_of(buf[tuple(idx)]),
        tirx.const(0, "int32"), tirx.const(_LOCALITY_L2, "int32"), tirx.const(1, "int32")))


def next_block_line(lower, copy: pb.Copy, coords: list, elements: int) -> None:
    """Prefetches the cache lines holding `elements` consecutive elements (along the last
    dim) from tile coordinates `coords` of the global region `copy` reads, as the next
    block (lower.next_block) will read it."""
    buf = lower.tir_buffers[copy.src.buffer]
    per_line = max(1, CACHE_LINE // dtypes.nbytes(lower.buffers[copy.src.buffer].dtype))
    with lower.next_block():
        for at in range(0, elements, per_line):
            idx, _ = lower.region_index(copy.src, [*coords[:-1], coords[-1] + at])
            _prefetch(buf, idx)


def _region(lower, region: pb.Region) -> None:
    """Prefetches every cache line of global `region` (its last extent contiguous)."""
    buf = lower.tir_buffers[region.buffer]
    size = dtypes.nbytes(lower.buffers[region.buffer].dtype)
    tile = [e for e in region.extents if e != 1]
    lines = (tile[-1] * size + CACHE_LINE - 1) // CACHE_LINE + 1  # a row may straddle one more
    with contextlib.ExitStack() as stack:
        rows = [stack.enter_context(T.serial(0, e)) for e in tile[:-1]]
        line = stack.enter_context(T.serial(0, lines))
        idx, _ = lower.region_index(region, [*rows, line * max(1, CACHE_LINE // size)])
        _prefetch(buf, idx)


def _global(lower, region: pb.Region, allowed: set[int]) -> bool:
    return lower.buffers[region.buffer].scope == pb.GLOBAL and region.extents[-1] != 1 and \
        _pure(region.offsets, allowed)


def prefetch_plan(lower, f: pb.For) -> tuple[int, list[pb.Copy]]:
    """For T.Pipelined loop `f`: the global-reading copies among its top-level statements
    (body_statements) whose regions to prefetch `num_stages - 1` iterations ahead, and how
    many of those statements to lower before the prefetches: they go after the iteration's
    own copies, so that they travel during the compute that follows instead of queueing in
    front of those copies' loads ((0, []): nothing to prefetch)."""
    allowed = uniform_vars(lower.program) | {f.var}
    stmts = body_statements(f.body)
    at = [i for i, s in enumerate(stmts)
          if s.WhichOneof("kind") == "copy" and _global(lower, s.copy.src, allowed)]
    return (at[-1] + 1, [stmts[i].copy for i in at]) if at else (0, [])


def prefetch_ahead(lower, f: pb.For, var, copies: list[pb.Copy]) -> None:
    """Emits the prefetches of `copies`' source regions as T.Pipelined loop `f` (loop
    variable `var`, its TIR variable) will read them `num_stages - 1` iterations later."""
    lower.vars[f.var] = var + max(1, f.num_stages - 1)
    try:
        for c in copies:
            _region(lower, c.src)
    finally:
        lower.vars[f.var] = var


def long_math(st: pb.Stmt) -> bool:
    """Whether statement `st` itself (not the statements inside it) calls a LONG_MATH
    function."""
    return any(x.WhichOneof("kind") == "call" and x.call.op in LONG_MATH
               for e in stmt_exprs(st) for x in subexprs(e))


def element_plan(lower, f: pb.For, extent) -> list[pb.Load]:
    """For an element loop `f` (T.Parallel's innermost: one store, perhaps under a guard)
    that stores a long math function of global rows along its variable: those rows' loads,
    whose lines it prefetches as the next block reads them (element_loop). Only where the
    extent is a constant of whole lines, four or more, and the loads' addresses depend on
    the block (else the next block reads the same lines). [] where none."""
    body = f.body
    if body.WhichOneof("kind") == "if_then_else" and not body.if_then_else.HasField(
            "else_body"):
        body = body.if_then_else.then_body
    if not ELEMENTS or not lower.next_vars or f.kind != pb.PARALLEL or \
            body.WhichOneof("kind") != "store" or not isinstance(extent, tirx.IntImm) or \
            not long_math(body):
        return []
    blocks = set(lower.program.kernel.block_vars)
    loads = {}  # one per address: a value used twice is two loads in the IR
    for ld in forward.loads(body):
        if lower.buffers[ld.buffer].scope == pb.GLOBAL and \
                f.var in expr_vars([ld.indices[-1]]) and expr_vars(list(ld.indices)) & blocks:
            loads.setdefault((ld.buffer, *(i.SerializeToString() for i in ld.indices)), ld)
    loads = list(loads.values())
    if not loads:
        return []
    step = _line_elements(lower, loads)
    return loads if extent.value % step == 0 and extent.value >= 4 * step else []


def _line_elements(lower, loads: list[pb.Load]) -> int:
    return CACHE_LINE // min(dtypes.nbytes(lower.buffers[ld.buffer].dtype) for ld in loads)


def element_loop(lower, f: pb.For, extent: int, loads: list[pb.Load]) -> None:
    """Element loop `f` a cache line at a time (element_plan), each step prefetching its
    line of each of `loads` as the next block will read it."""
    step = _line_elements(lower, loads)
    with T.serial(0, extent // step) as ko:
        lower.vars[f.var] = ko * step
        with lower.next_block():
            for ld in loads:
                _prefetch(lower.tir_buffers[ld.buffer], [lower.expr(i) for i in ld.indices])
        with T.serial(0, step) as ki:
            lower.vars[f.var] = ko * step + ki
            lower.stmt(f.body)
