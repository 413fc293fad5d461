"""Integer division by a constant of `base + v`, where v is a loop variable that stays below
the divisor's grain (target-independent; the first lowering pass, tiled.compiler).

TileLang's convolution example gathers its operand tile as

    for i, j in T.Parallel(block_M, block_K):
        k = k_iter * block_K + j
        ... k // (KW * C) ... k // C % KW ... data[..., k % C]   (and k < taps)

With block_K dividing C, a row's block_K columns are consecutive channels of one tap, but
written this way every index depends on j, so the gather is an element loop. For v a loop
variable running over [0, E), base a provable multiple of E and K a constant multiple of E,
base + v never crosses a multiple of K, so exactly (floor semantics, any sign of base):

    (base + v) // K   ==  base // K
    (base + v) %  K   ==  (base // E) % (K / E) * E + v
    base + v <  K     ==  base < K          (and >= likewise)

`split_aligned_divmod` rewrites those forms (v on either side of the sum), innermost first,
so `k // C % KW` becomes free of j too. The tap, the row's bounds test and the channel base
are then free of j: the CUDA gather moves whole vectors (targets/cuda/gather.py), other
targets divide once a row. The mod's form keeps the channel's range provable (at most
K - E + E - 1), so the memory-safety guards still see the load in bounds.
"""

from __future__ import annotations

from google.protobuf.message import Message

from tiled.compiler.passes.stmts import binary_expr, const_int, int_expr, multiple_of
from tiled.ir.program import Program
from tiled.v1 import tile_ir_pb2 as pb

_OPS = (pb.FLOOR_DIV, pb.FLOOR_MOD, pb.LT, pb.GE)


def split_aligned_divmod(program: Program) -> Program:
    """`program` with those divisions rewritten; the same object when there are none."""
    p = pb.Program()
    p.CopyFrom(program.proto)
    return Program(p) if _visit(p.kernel.body, {}) else program


def _visit(msg: Message, ranges: dict[int, int]) -> bool:
    changed = False
    for field, value in msg.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        for m in (value if field.is_repeated else (value,)):
            changed |= _node(m, ranges)
    return changed


def _node(m: Message, ranges: dict[int, int]) -> bool:
    if isinstance(m, pb.For):
        changed = _node(m.extent, ranges)
        extent = const_int(m.extent)
        inner = ranges if extent is None or extent < 2 else {**ranges, m.var: extent}
        return _node(m.body, inner) | changed
    changed = _visit(m, ranges)
    if isinstance(m, pb.Expr):
        changed |= _rewrite(m, ranges)
    return changed


def _split(e: pb.Expr, ranges: dict[int, int], K: int):
    """(base, v, E) of e = base + v (either order) with v a loop variable over [0, E), base a
    multiple of E and K one of E; else None."""
    if e.WhichOneof("kind") != "binary" or e.binary.op != pb.ADD:
        return None
    for base, v in ((e.binary.a, e.binary.b), (e.binary.b, e.binary.a)):
        if v.WhichOneof("kind") == "var" and v.var in ranges:
            E = ranges[v.var]
            if K % E == 0 and multiple_of(base, E):
                return base, v, E
    return None


def _rewrite(e: pb.Expr, ranges: dict[int, int]) -> bool:
    if e.WhichOneof("kind") != "binary" or e.binary.op not in _OPS:
        return False
    K = const_int(e.binary.b)
    if K is None or K <= 0:
        return False
    found = _split(e.binary.a, ranges, K)
    if found is None:
        return False
    base, v, E = found
    dt = e.binary.a.dtype
    op = e.binary.op
    if op == pb.FLOOR_DIV:
        new = binary_expr(pb.FLOOR_DIV, base, int_expr(K, dt), dt)
    elif op == pb.FLOOR_MOD:
        chunk = binary_expr(pb.FLOOR_MOD, binary_expr(pb.FLOOR_DIV, base, int_expr(E, dt), dt),
                            int_expr(K // E, dt), dt)
        new = binary_expr(pb.ADD, binary_expr(pb.MUL, chunk, int_expr(E, dt), dt), v, dt)
    else:  # LT, GE: base + v crosses no multiple of E, and K is one
        new = binary_expr(op, base, int_expr(K, dt), e.dtype)
    e.CopyFrom(new)
    return True
