"""Element gathers as cp.async producers of the CUDA generic path's T.Pipelined pipeline
(pipeline.py): a T.Parallel nest that fills a whole shared tile from a global tensor, row by
row, from rows it computes (an im2col tile, a row gather through an index),

    for i, c in T.Parallel(R, C):
        tile[i, c] = T.if_then_else(cond(i), X[idx(i)..., base(i) + c], 0)   (or = X[...])

is issued as 16 / 8 / 4-byte cp.async vectors of `c`, the vector's zero fill (a source size
of 0) where `cond` is false, so it runs stages ahead of its use as a T.copy does, where an
element loop loads every element synchronously. The nest qualifies when:

- its loops cover the tile exactly (extents = the tile's shape, the store at [i, c]) and its
  body is that one store, of the tile's dtype, to a tile nothing else writes;
- the value is a load of a global tensor the kernel never writes, under any number of
  `select(cond, ., 0)` (the memory-safety pass adds its own), `cond` and every index but the
  last free of `c`, the last `base + c` with `base` free of `c` and a provable multiple of the
  vector, the tensor's inner dims static with the last a multiple of the vector (so every
  vector is aligned, as async_vector asks of copies);
- nothing in it reads shared memory, fragments or locals (another iteration's values).

Functions take the lowering (`low`: a CudaLowering).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.pipeline import gather_nest
from tiled.compiler.passes.stmts import multiple_of
from tiled.compiler.tir import and_all
from tiled.ir import dtypes
from tiled.ir.walk import expr_vars, subexprs, walk, written
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class Gather:
    tile: int  # the shared tile filled
    src: int  # the global tensor read
    row_var: int
    col_var: int
    rows: int
    cols: int
    indices: tuple  # of the load (pb.Expr); the last is base + col_var
    conds: tuple  # pb.Expr, all true for the element to be read (else 0)
    vec: int  # elements per cp.async


def _base(e: pb.Expr, col: int) -> pb.Expr | None:
    """`base` of an index `base + col` (either order), or None."""
    if e.WhichOneof("kind") != "binary" or e.binary.op != pb.ADD:
        return None
    a, b = e.binary.a, e.binary.b
    if b.WhichOneof("kind") == "var" and b.var == col:
        return a
    if a.WhichOneof("kind") == "var" and a.var == col:
        return b
    return None


def find_gather(low, st: pb.Stmt) -> Gather | None:
    """The gather plan of statement `st`, or None when it does not qualify (module
    docstring)."""
    g = gather_nest(st, low.buffers)
    if g is None:
        return None
    i, c = g.row_var, g.col_var
    tile, src = low.buffers[g.tile], low.buffers[g.src]
    rows, cols = (d.size for d in tile.shape)
    conds, idx = list(g.conds), list(g.indices)
    if any(c in expr_vars([e]) for e in conds + idx[:-1]):
        return None
    base = _base(idx[-1], c)
    if base is None or c in expr_vars([base]):
        return None
    # Loads of global tensors only (an index table), of none the kernel writes.
    body = low.program.kernel.body
    writes = {b for s in walk(body) for b in written(s)}
    for e in conds + idx:
        for x in subexprs(e):
            if x.WhichOneof("kind") == "load" and (
                    low.buffers[x.load.buffer].scope != pb.GLOBAL or x.load.buffer in writes):
                return None
    if g.src in writes or any(d.WhichOneof("kind") == "var" for d in list(src.shape)[1:]):
        return None
    if sum(1 for s in walk(body) if g.tile in written(s)) != 1:
        return None  # (walk yields the nest's loops too: `written` counts the store once)
    esize = dtypes.nbytes(tile.dtype)
    for nbytes in (16, 8, 4):
        vec = nbytes // esize
        if vec >= 1 and nbytes % esize == 0 and cols % vec == 0 and \
                src.shape[-1].size % vec == 0 and multiple_of(base, vec):
            return Gather(g.tile, g.src, i, c, rows, cols, tuple(idx), tuple(conds), vec)
    return None


def issue_async_gather(low, g: Gather, pred=None, threads: int | None = None, tx=None) -> None:
    """The calling thread's cp.async vectors of gather `g`, none read where its conditions
    (or `pred`: a pipeline stage past the loop's end) are false (zero-filled); the vectors
    are dealt over the program's threads, or `threads` threads, the caller being `tx`
    among them (a ring producer's, ws_loop.py)."""
    threads = low.threads if threads is None else threads
    tx = low.tx if tx is None else tx
    per_row = g.cols // g.vec
    nvec = g.rows * per_row
    nbytes = g.vec * dtypes.nbytes(low.buffers[g.tile].dtype)
    with low.loop(-(-nvec // threads)) as it:
        v = it * threads + tx
        with low.maybe_if(None if nvec % threads == 0 else v < nvec):
            row, col = tirx.truncdiv(v, per_row), tirx.truncmod(v, per_row) * g.vec
            low.vars[g.row_var], low.vars[g.col_var] = row, col
            idx = [low.expr(e) for e in g.indices]
            ok = and_all([low.expr(e) for e in g.conds] + ([pred] if pred is not None else []))
            T.evaluate(T.call_extern(
                "void", f"tiled::cp_async<{nbytes}>", low.addr(g.tile, [row, col]),
                low.addr(g.src, idx), ok if ok is not None else tirx.const(True, "bool")))
