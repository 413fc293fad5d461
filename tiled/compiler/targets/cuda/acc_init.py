"""An accumulator's initialization folded into its wgmma gemm (sm_90a loops on the TMA ring).

FlashAttention as TileLang writes it sets the scores before `S = Q K^T` accumulates into them:
`T.clear(S)`, or a mask nest `S[i, j] = T.if_then_else(keep(i, j), 0, -inf)`. Written so, the
statement defines wgmma accumulator registers in ordinary instructions on every step. Instead
the gemm sets its accumulator (the first wgmma's zero scale-d: `S = Q K^T`) and the mask is
added afterwards, `S[i, j] += mask(i, j)`, which gives the same values: its entries are 0 or
infinite, and x + 0 and x + inf are exact. The addition runs with the softmax, after the gemm
is waited for, and only in tiles the mask does not keep whole: where `keep` is a conjunction
of comparisons affine in the nest's indices (a causal diagonal, a sequence's end), it holds
over the whole tile exactly when it holds at the tile's corners (the set it keeps is convex),
which a block tests at run time before the nest.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.pipeline import touched
from tiled.ir.walk import subexprs
from tiled.v1 import tile_ir_pb2 as pb

_NEGATE = {pb.LT: pb.GE, pb.LE: pb.GT, pb.GT: pb.LE, pb.GE: pb.LT}


@dataclass
class AccInit:
    pos: int  # body position of the initializing statement
    add: pb.Stmt | None  # the nest that adds the mask after the gemm (None: the init is 0)
    nest: list[tuple[int, int]]  # (var, extent) of the mask nest's loops
    keep: list[pb.Expr]  # comparisons whose conjunction holding everywhere makes `add` a no-op


def _constant(e: pb.Expr) -> float | None:
    kind = e.WhichOneof("kind")
    if kind in ("int_value", "float_value"):
        return float(getattr(e, kind))
    if kind == "cast":
        return _constant(e.cast.value)
    if kind == "call" and e.call.op == pb.NEG and len(e.call.args) == 1:
        v = _constant(e.call.args[0])
        return None if v is None else -v
    return None


def _exact_addend(e: pb.Expr) -> bool:
    """Whether every value `e` takes is 0 or infinite (a select tree over such constants)."""
    if e.WhichOneof("kind") == "select":
        return _exact_addend(e.select.true_value) and _exact_addend(e.select.false_value)
    v = _constant(e)
    return v is not None and (v == 0 or math.isinf(v))


def _nest(st: pb.Stmt) -> tuple[list[tuple[int, int]], pb.Store] | None:
    """The loops and store of `for i0, i1.. in T.Parallel(...): C[i0, i1..] = value`."""
    loops = []
    while st.WhichOneof("kind") == "for_" and st.for_.kind == pb.PARALLEL:
        ext = _constant(st.for_.extent)
        if ext is None:
            return None
        loops.append((st.for_.var, int(ext)))
        st = st.for_.body
        if st.WhichOneof("kind") == "seq" and len(st.seq.stmts) == 1:
            st = st.seq.stmts[0]
    if not loops or st.WhichOneof("kind") != "store":
        return None
    idx = st.store.indices
    if len(idx) != len(loops) or any(x.WhichOneof("kind") != "var" or x.var != v
                                     for x, (v, _) in zip(idx, loops, strict=True)):
        return None
    return loops, st.store


def _affine(e: pb.Expr, nest_vars: set[int]) -> bool:
    """Whether integer expression `e` is affine in the nest's variables."""
    uses = {x.var for x in subexprs(e) if x.WhichOneof("kind") == "var"} & nest_vars
    if not uses:
        return True
    kind = e.WhichOneof("kind")
    if kind == "var":
        return True
    if kind == "binary" and e.binary.op in (pb.ADD, pb.SUB):
        return _affine(e.binary.a, nest_vars) and _affine(e.binary.b, nest_vars)
    if kind == "binary" and e.binary.op == pb.MUL:
        return any(_affine(x, nest_vars) and not (
            {s.var for s in subexprs(y) if s.WhichOneof("kind") == "var"} & nest_vars)
            for x, y in ((e.binary.a, e.binary.b), (e.binary.b, e.binary.a)))
    return False


def _comparisons(cond: pb.Expr, nest_vars: set[int]) -> list[pb.Expr] | None:
    """The affine comparisons whose conjunction `cond` is, or None."""
    kind = cond.WhichOneof("kind")
    if kind == "binary" and cond.binary.op == pb.AND:
        a = _comparisons(cond.binary.a, nest_vars)
        b = _comparisons(cond.binary.b, nest_vars)
        return None if a is None or b is None else a + b
    if kind == "binary" and cond.binary.op in _NEGATE and \
            _affine(cond.binary.a, nest_vars) and _affine(cond.binary.b, nest_vars):
        return [cond]
    return None


def _negated(cmp: pb.Expr) -> pb.Expr:
    out = pb.Expr()
    out.CopyFrom(cmp)
    out.binary.op = _NEGATE[cmp.binary.op]
    return out


def _keep(value: pb.Expr, nest_vars: set[int]) -> list[pb.Expr]:
    """Comparisons under which the mask `value` is 0 over the whole tile (empty: unknown)."""
    if value.WhichOneof("kind") != "select":
        return []
    sel = value.select
    cmps = _comparisons(sel.cond, nest_vars)
    if cmps is None:
        return []
    if _constant(sel.true_value) == 0:
        return cmps
    if _constant(sel.false_value) == 0 and len(cmps) == 1:
        return [_negated(cmps[0])]  # not (a < b) is a >= b: still convex
    return []


def find_acc_init(low, body: list, skip: set[int], first: int) -> AccInit | None:
    """The statement before the gemm at `first` that initializes its whole accumulator with
    values the gemm can take over exactly (module docstring), or None. `skip`: positions
    lowered elsewhere (ring copies, peeled statements)."""
    c = body[first].gemm.c
    pos = next((i for i in reversed(range(first)) if i not in skip and c in touched(body[i])),
               None)
    if pos is None:
        return None
    st = body[pos]
    shape = [d.size for d in low.buffers[c].shape]
    if st.WhichOneof("kind") == "fill":
        f = st.fill
        whole = f.dst.buffer == c and list(f.dst.extents) == shape and all(
            _constant(o) == 0 for o in f.dst.offsets)
        return AccInit(pos, None, [], []) if whole and _constant(f.value) == 0 else None
    found = _nest(st)
    if found is None:
        return None
    loops, store = found
    reads_c = any(x.WhichOneof("kind") == "load" and x.load.buffer == c
                  for x in subexprs(store.value))
    if store.buffer != c or [e for _, e in loops] != shape or reads_c or \
            store.value.dtype != low.buffers[c].dtype or not _exact_addend(store.value):
        return None
    if _constant(store.value) == 0:
        return AccInit(pos, None, [], [])
    add = pb.Stmt()
    add.CopyFrom(st)
    inner = add
    while inner.WhichOneof("kind") != "store":
        inner = inner.for_.body if inner.WhichOneof("kind") == "for_" else inner.seq.stmts[0]
    total = pb.Expr(dtype=store.value.dtype)
    total.binary.op = pb.ADD
    total.binary.a.dtype = store.value.dtype
    total.binary.a.load.buffer = c
    total.binary.a.load.indices.extend(store.indices)
    total.binary.b.CopyFrom(store.value)
    inner.store.value.CopyFrom(total)
    return AccInit(pos, add, loops, _keep(store.value, {v for v, _ in loops}))


def lower_mask_add(low, init: AccInit) -> None:
    """After the gemm: the mask added, skipped by a block whose tile it keeps whole."""
    if init.add is None:
        return
    if not init.keep:
        low.stmt(init.add)
        return
    whole = None
    for corner in itertools.product(*[(0, e - 1) for _, e in init.nest]):
        with low.bound({v: tirx.const(x, "int32")
                        for (v, _), x in zip(init.nest, corner, strict=True)}):
            for cmp in init.keep:
                holds = low.expr(cmp)
                whole = holds if whole is None else tirx.And(whole, holds)
    with T.If(tirx.Not(whole)), T.Then():
        low.stmt(init.add)
