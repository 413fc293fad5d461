"""Vectorization of element loops: which T.vectorized loops may become vector lanes, with the
alignment proofs they need."""

from __future__ import annotations

from tiled.compiler.passes.stmts import multiple_of
from tiled.compiler.tir import FP8_DTYPES, tvm_dtype
from tiled.ir import dtypes
from tiled.ir.walk import (
    element_accesses,
    expr_vars,
    lanes_independent,
    stmt_exprs,
    subexprs,
    walk,
)
from tiled.v1 import tile_ir_pb2 as pb

_VECTOR_DTYPES = {pb.FLOAT32, pb.FLOAT16, pb.INT32}


def vector_lanes_ok(f: pb.For, lanes: int, buffers) -> bool:
    """Whether T.vectorized loop `f` of `lanes` constant iterations can become TVM vector
    lanes safely. TVM widens `buf[base + v]` into one vector access without proving it
    aligned (a misaligned vector access faults), so every element access that depends on
    the loop var must be `base + v` in its last dim with `base` a provable multiple of the
    lanes and rows of a whole number of vectors (static shape, or a shared tile's padded
    stride that keeps it: the lowering checks shared tiles), 4 to 16 bytes of a float32,
    float16 or int32 buffer, and not a fragment spread over threads; the body holds element
    stores (under conditions) only, each to an element of its own iteration, and reads a
    buffer it stores to only at the element it stores (the loop is serial in the Tile IR:
    lanes must not see each other's writes). Anything else runs as an unrolled loop."""
    if lanes not in (2, 4, 8, 16):
        return False
    for st in walk(f.body):
        kind = st.WhichOneof("kind")
        if kind not in ("seq", "store", "if_then_else"):
            return False
    if not lanes_independent(f):
        return False
    v = f.var
    for bid, idx in element_accesses(f.body):
        if not idx or v not in expr_vars(idx):
            continue
        b = buffers[bid]
        if b.dtype not in _VECTOR_DTYPES or lanes * dtypes.nbytes(b.dtype) not in (4, 8, 16):
            return False
        if b.scope == pb.FRAGMENT or v in expr_vars(idx[:-1]):
            return False
        last = idx[-1]
        if last.WhichOneof("kind") == "var" and last.var == v:
            base = None
        elif last.WhichOneof("kind") == "binary" and last.binary.op == pb.ADD:
            a, c = last.binary.a, last.binary.b
            if a.WhichOneof("kind") == "var" and a.var == v:
                base = c
            elif c.WhichOneof("kind") == "var" and c.var == v:
                base = a
            else:
                return False
            if v in expr_vars([base]) or not multiple_of(base, lanes):
                return False
        else:
            return False
        if b.scope != pb.SHARED and len(b.shape) > 1 and (
                b.shape[-1].WhichOneof("kind") != "size" or b.shape[-1].size % lanes):
            return False
    return True


VECTOR_BYTES = 16  # the widest vector: TVM's CUDA vectors of 8 float32 lanes mis-broadcast


def lane_cap(dtype) -> int:
    """The most vector lanes of `dtype`: none past VECTOR_BYTES, and one for float8 (converted
    by integer code full of selects where the target has no conversion)."""
    if tvm_dtype(dtype) in FP8_DTYPES:
        return 1
    return max(1, VECTOR_BYTES // dtypes.nbytes(dtype))


def rows_keep_runs(b: pb.Buffer, vec: int, shared_stride=None) -> bool:
    """Whether every row of `b` starts on a whole number of `vec`-element runs: a 1-D or
    static last dim that `vec` divides, or a shared tile whose padded `shared_stride(bid)`
    `vec` divides."""
    if b.scope == pb.SHARED:
        return shared_stride is not None and shared_stride(b.id) % vec == 0
    return len(b.shape) == 1 or (b.shape[-1].WhichOneof("kind") == "size"
                                 and b.shape[-1].size % vec == 0)


def run_lanes(body: pb.Stmt, var: int, vec: int, buffers, shared_stride=None) -> int:
    """How many consecutive iterations of `var` (the innermost variable of a T.Parallel nest
    over a cyclic layout whose runs are `vec` long) the body can run as vector lanes: `vec`,
    or a divisor of it, or 1 (no vectors). Every access that moves with `var` must be `var`
    or `var + base` in its last dim, `base` a provable multiple of `vec`, on rows of whole
    runs (a static last dim, or a shared tile whose padded `shared_stride(bid)` keeps them);
    fragments are indexed by the nest (their slots are the run). Lanes are capped so no
    vector is wider than 16 bytes; the body must hold element stores only, under conditions
    the same for every lane (a guard on the row). (Lanes need not
    be proven independent: the iterations of a T.Parallel nest are, by its definition.)"""
    if vec < 2:
        return 1
    lanes = vec
    for st in walk(body):
        kind = st.WhichOneof("kind")
        if kind not in ("seq", "store", "if_then_else") or (
                kind == "if_then_else" and var in expr_vars([st.if_then_else.cond])):
            return 1
        # Intermediate values count too; a select whose condition differs by lane stays scalar.
        for e in stmt_exprs(st):
            for sub in subexprs(e):
                if sub.dtype:
                    lanes = min(lanes, lane_cap(sub.dtype))
                if sub.WhichOneof("kind") == "select" and var in expr_vars([sub.select.cond]):
                    return 1
    for bid, idx in element_accesses(body):
        b = buffers[bid]
        lanes = min(lanes, lane_cap(b.dtype))
        if not idx or var not in expr_vars(idx) or b.scope == pb.FRAGMENT:
            continue
        if var in expr_vars(idx[:-1]) or not _run_index(idx[-1], var, vec) or \
                not rows_keep_runs(b, vec, shared_stride):
            return 1
    return lanes if lanes >= 2 else 1


def _run_index(last: pb.Expr, var: int, vec: int) -> bool:
    """Whether `last` is var plus terms free of var that are multiples of `vec` (a sum in any
    order and nesting)."""
    kind = last.WhichOneof("kind")
    if kind == "var":
        return last.var == var
    if kind == "binary" and last.binary.op == pb.ADD:
        a, c = last.binary.a, last.binary.b
        for x, base in ((a, c), (c, a)):
            if var in expr_vars([x]):
                return var not in expr_vars([base]) and multiple_of(base, vec) and \
                    _run_index(x, var, vec)
    return False
