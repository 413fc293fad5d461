"""Memory-safety guards (ARCHITECTURE.md, Memory safety): a Tile IR -> Tile IR pass shared by
every target.

A global element access whose index may leave its tensor is rewritten so that it cannot:

    Y[i] = v          ->  if 0 <= i and i < N: Y[i] = v           (a store outside is skipped)
    T.atomic_add(...) ->  the same guard
    X[i]              ->  select(0 <= i and i < N, X[clamp(i, 0, N - 1)], 0)
                                                                  (a load outside reads 0)

The load keeps an in-bounds address (clamped) so that every backend may evaluate both sides of
the select (LLVM and CUDA do, for speed): the guard costs a compare and a min/max, never a
branch. Only the sides that may fail get a test, and only accesses the analysis cannot prove
in bounds are touched, so tile loops that cover an exact shape compile exactly as before.

The analysis is the verifier's own (tiled.ir.verifier._Verifier: integer intervals of every
index under its enclosing loops, block vars and guards), plus two facts intervals cannot hold
about symbolic dims: an index that is a loop var over `range(N)`, or the block var of a grid
dim of N blocks, stays below N, and so does an index `e` inside `if e < N:` (or the true side
of a select on it).

T.copy / T.fill regions are not rewritten here: their ragged tails are the lowering's
(tiled.compiler.tir.ExprLowering.region_index guards each element against both ends).
`safe_access=False` (a compile option, in the cache key) skips this pass.
"""

from __future__ import annotations

from dataclasses import replace

from google.protobuf.message import Message

from tiled.compiler.passes.stmts import binary_expr, int_expr
from tiled.ir.program import Program
from tiled.ir.verifier import Limits, _render, _Verifier
from tiled.v1 import tile_ir_pb2 as pb

# The program was verified under the real limits; the analysis walks it once more.
_ANALYSIS_LIMITS = Limits(max_nodes=1 << 62, max_shared_bytes=1 << 62, max_local_bytes=1 << 62,
                          max_block_bytes=1 << 62)
_UNSIGNED = {pb.UINT8, pb.UINT16, pb.UINT32, pb.UINT64}


class _Analysis(_Verifier):
    """Walks the program as the verifier does and records, per global index (by its path in
    the program), which ends are not proved: {path: (may be < 0, may be >= the dim)}."""

    def __init__(self, program: pb.Program):
        super().__init__(program, _ANALYSIS_LIMITS)
        self.unsafe: dict[str, tuple[bool, bool]] = {}
        self.loop_extent: dict[int, pb.Expr] = {}
        self.below: list[tuple[bytes, int]] = []  # (index expr bytes, dim var) known below it

    def kernel(self) -> None:
        # A block var stays below its grid dim, as a loop var below its extent: `Tiles[by]`
        # under a grid of `tiles` blocks, Tiles [tiles, ...], needs no guard.
        k = self.p.kernel
        for vid, extent in zip(k.block_vars, k.grid, strict=False):
            self.loop_extent[vid] = extent
        super().kernel()

    def s_for_(self, f: pb.For, path: tuple, depth: int) -> None:
        self.loop_extent[f.var] = f.extent
        super().s_for_(f, path, depth)

    def var_iv(self, vid: int):
        # The verifier takes symbolic dims as >= 1; at launch one may be 0 (an empty tensor),
        # and `X[N - 1]` must then be guarded below too.
        iv = super().var_iv(vid)
        if vid not in self.env and self.bound.get(vid) == "dim":
            return replace(iv, lo=0, lo_exact=False)
        return iv

    def s_if_then_else(self, s: pb.IfThenElse, path: tuple, depth: int) -> None:
        # The then-branch knows its condition's `e < N` atoms; the else-branch knows nothing
        # more (the verifier's intervals already hold what constant guards say).
        facts = _below_facts(s.cond)
        if not facts or not s.HasField("then_body") or s.HasField("else_body"):
            return super().s_if_then_else(s, path, depth)
        self.below += facts
        try:
            super().s_if_then_else(s, path, depth)
        finally:
            del self.below[len(self.below) - len(facts):]

    def index(self, b: pb.Buffer, i: int, idx: pb.Expr, ipath: tuple, depth: int):
        iv = super().index(b, i, idx, ipath, depth)
        if b.scope != pb.GLOBAL:
            return iv
        if iv is None:  # code the verifier knows never runs (or no interval): guard it
            iv = self.expr(idx, ipath, depth + 1) if not self.dead else None
        dim = self.shape[b.id][i]
        if iv is None:
            low, high = idx.dtype not in _UNSIGNED, True
        else:
            low = iv.lo < 0
            high = iv.hi > dim - 1 if isinstance(dim, int) else \
                not self.below_dim(idx, b.shape[i].var)
        if low or high:
            self.unsafe[_render(ipath)] = (low, high)
        return iv

    def below_dim(self, idx: pb.Expr, dim_var: int) -> bool:
        """Whether `idx` is provably below the symbolic dim `dim_var`."""
        if idx.WhichOneof("kind") == "var":
            ext = self.loop_extent.get(idx.var)
            if ext is not None and ext.WhichOneof("kind") == "var" and ext.var == dim_var:
                return True
        key = idx.SerializeToString(deterministic=True)
        return any(k == key and d == dim_var for k, d in self.below)


def _below_facts(cond: pb.Expr) -> list[tuple[bytes, int]]:
    """The `e < N` atoms (N a var) of a conjunction: e is known to be below N where it holds."""
    out, stack = [], [cond]
    while stack and len(out) < 64:
        e = stack.pop()
        if e.WhichOneof("kind") != "binary":
            continue
        b = e.binary
        if b.op == pb.AND:
            stack += [b.a, b.b]
        elif b.op == pb.LT and b.b.WhichOneof("kind") == "var":
            out.append((b.a.SerializeToString(deterministic=True), b.b.var))
        elif b.op == pb.GT and b.a.WhichOneof("kind") == "var":
            out.append((b.b.SerializeToString(deterministic=True), b.a.var))
    return out


def guard_program(program: Program) -> Program:
    """`program` (verified) with every global element access that may leave its tensor
    guarded (module docstring); the same object when nothing needs a guard. The result
    verifies and has the same parameters; its digest differs (callers key on the original).
    Stores are guarded first, then the program is analysed again: a load under its store's
    guard (`Y[i] = X[i] * 2`) is then proved in bounds and left alone."""
    out = program
    for kinds in (("store", "atomic_add"), ("load",)):
        analysis = _Analysis(out.proto)
        analysis.tables()
        analysis.kernel()
        if analysis.unsafe:
            p = pb.Program()
            p.CopyFrom(out.proto)
            _Rewriter(p, analysis.unsafe, kinds).stmt(p.kernel.body, "kernel.body")
            out = Program(p)
    return out


class _Rewriter:
    """Applies the guards at the paths the analysis recorded, to the access kinds given.
    Paths are the verifier's: the field names from the program down, `[i]` for repeated
    fields."""

    def __init__(self, program: pb.Program, unsafe: dict[str, tuple[bool, bool]],
                 kinds: tuple[str, ...]):
        self.unsafe, self.kinds = unsafe, kinds
        self.bufs = {b.id: b for b in program.buffers}

    def stmt(self, s: pb.Stmt, path: str) -> None:
        kind = s.WhichOneof("kind")
        if kind is None:
            return
        body = getattr(s, kind)
        kpath = f"{path}.{kind}"
        self.children(body, kpath)
        if kind in ("store", "atomic_add") and kind in self.kinds:
            cond = self.in_bounds(body, kpath)
            if cond is not None:
                inner = pb.Stmt()
                inner.CopyFrom(s)
                s.ClearField(kind)
                s.if_then_else.cond.CopyFrom(cond)
                s.if_then_else.then_body.CopyFrom(inner)

    def expr(self, e: pb.Expr, path: str) -> None:
        kind = e.WhichOneof("kind")
        if kind not in ("binary", "call", "cast", "select", "load"):
            return
        body = getattr(e, kind)
        kpath = f"{path}.{kind}"
        self.children(body, kpath)
        if kind != "load" or kind not in self.kinds:
            return
        cond = self.in_bounds(body, kpath)
        if cond is None:
            return
        load = pb.Expr()
        load.CopyFrom(e)
        for i, idx in enumerate(load.load.indices):
            low, high = self.unsafe.get(f"{kpath}.indices[{i}]", (False, False))
            if high:
                last = _dim_minus_one(self.bufs[body.buffer], i, idx.dtype)
                idx.CopyFrom(binary_expr(pb.MIN, idx, last, idx.dtype))
            if low:
                idx.CopyFrom(binary_expr(pb.MAX, idx, int_expr(0, idx.dtype), idx.dtype))
        guarded = pb.Expr(dtype=e.dtype)
        guarded.select.cond.CopyFrom(cond)
        guarded.select.true_value.CopyFrom(load)
        guarded.select.false_value.CopyFrom(_zero(e.dtype))
        e.CopyFrom(guarded)

    def children(self, msg: Message, path: str) -> None:
        """Rewrites every Stmt and Expr below `msg` (a statement's or expression's body)."""
        for fd, value in msg.ListFields():
            if fd.message_type is None:
                continue
            items = value if fd.is_repeated else [value]
            for j, item in enumerate(items):
                sub = f"{path}.{fd.name}[{j}]" if fd.is_repeated else \
                    f"{path}.{fd.name}"
                if isinstance(item, pb.Stmt):
                    self.stmt(item, sub)
                elif isinstance(item, pb.Expr):
                    self.expr(item, sub)
                elif not isinstance(item, pb.Location):
                    self.children(item, sub)

    def in_bounds(self, access, path: str) -> pb.Expr | None:
        """The conjunction of the tests the access's unproved indices need, or None."""
        cond = None
        for i, idx in enumerate(access.indices):
            low, high = self.unsafe.get(f"{path}.indices[{i}]", (False, False))
            tests = []
            if low:
                tests.append(binary_expr(pb.GE, idx, int_expr(0, idx.dtype), pb.BOOL))
            if high:
                size = _dim(self.bufs[access.buffer], i, idx.dtype)
                tests.append(binary_expr(pb.LT, idx, size, pb.BOOL))
            for t in tests:
                cond = t if cond is None else binary_expr(pb.AND, cond, t, pb.BOOL)
        return cond


def _zero(dtype: int) -> pb.Expr:
    from tiled.ir import ops

    return pb.Expr(dtype=dtype, float_value=0.0) if dtype in ops.FLOAT_DTYPES else \
        pb.Expr(dtype=dtype, int_value=0)


def _dim(buf: pb.Buffer, i: int, dtype: int) -> pb.Expr:
    """Dim i of `buf` as an expression of `dtype` (the index's)."""
    d = buf.shape[i]
    if d.WhichOneof("kind") == "size":
        return int_expr(d.size, dtype)
    var = pb.Expr(dtype=pb.INT32, var=d.var)
    if dtype == pb.INT32:
        return var
    cast = pb.Expr(dtype=dtype)
    cast.cast.value.CopyFrom(var)
    return cast


def _dim_minus_one(buf: pb.Buffer, i: int, dtype: int) -> pb.Expr:
    d = buf.shape[i]
    if d.WhichOneof("kind") == "size":
        return int_expr(d.size - 1, dtype)
    return binary_expr(pb.SUB, _dim(buf, i, dtype), int_expr(1, dtype), dtype)
