"""Linear forms of Tile IR integer expressions: enough arithmetic to prove a slice's extent.

A linear form is `c0 + c1 * t1 + c2 * t2 + ...` with int coefficients over terms; a term is a
var, or any subexpression that is not linear (`bx // 2`, `A[i]`, `x * y`), compared by its
serialized node. `(bx + 1) * 64 - bx * 64` is then the constant 64:

>>> constant_difference(stop.node, start.node)   # stop = (bx + 1) * 64, start = bx * 64
64

Only rewrites that hold for every value of the terms are made (no overflow reasoning: the
forms are exact over the integers, as the author's arithmetic is).
"""

from __future__ import annotations

from tiled.ir import ops
from tiled.v1 import tile_ir_pb2 as pb

Form = dict  # term key (None for the constant) -> int coefficient

_MAX_DEPTH = 64


def linear_form(e: pb.Expr, depth: int = 0) -> Form:
    """The linear form of integer expression `e`; never fails (an opaque node is a term)."""
    kind = e.WhichOneof("kind")
    if kind == "int_value" and e.dtype in ops.INT_DTYPES:
        return {None: e.int_value} if e.int_value else {}
    if depth > _MAX_DEPTH:
        return _term(e)
    d = depth + 1
    if kind == "var":
        return {("var", e.var): 1}
    if kind == "cast" and e.dtype in ops.INT_DTYPES and e.cast.value.dtype in ops.INT_DTYPES:
        return linear_form(e.cast.value, d)
    if kind == "call" and e.call.op == pb.NEG and len(e.call.args) == 1:
        return _scale(linear_form(e.call.args[0], d), -1)
    if kind == "binary" and e.dtype in ops.INT_DTYPES:
        op, a, b = e.binary.op, e.binary.a, e.binary.b
        if op in (pb.ADD, pb.SUB):
            return _add(linear_form(a, d), _scale(linear_form(b, d), 1 if op == pb.ADD else -1))
        if op == pb.MUL:
            fa, fb = linear_form(a, d), linear_form(b, d)
            if _is_constant(fa):
                return _scale(fb, fa.get(None, 0))
            if _is_constant(fb):
                return _scale(fa, fb.get(None, 0))
        if op == pb.SHL:
            fb = linear_form(b, d)
            if _is_constant(fb) and 0 <= fb.get(None, 0) < 63:
                return _scale(linear_form(a, d), 1 << fb.get(None, 0))
        if op == pb.FLOOR_DIV:
            # Exact when the divisor divides every coefficient and the constant.
            fa, fb = linear_form(a, d), linear_form(b, d)
            n = fb.get(None, 0) if _is_constant(fb) else 0
            if n and all(c % n == 0 for c in fa.values()):
                return {k: c // n for k, c in fa.items()}
    return _term(e)


def constant_value(e: pb.Expr) -> int | None:
    """The int `e` always equals, or None."""
    f = linear_form(e)
    return f.get(None, 0) if _is_constant(f) else None


def constant_difference(stop: pb.Expr, start: pb.Expr) -> int | None:
    """`stop - start` when it is the same int for every value of the vars, else None."""
    f = _add(linear_form(stop), _scale(linear_form(start), -1))
    return f.get(None, 0) if _is_constant(f) else None


def _term(e: pb.Expr) -> Form:
    return {("node", e.SerializeToString(deterministic=True)): 1}


def _is_constant(f: Form) -> bool:
    return all(k is None for k in f)


def _scale(f: Form, c: int) -> Form:
    return {k: v * c for k, v in f.items()} if c else {}


def _add(a: Form, b: Form) -> Form:
    out = dict(a)
    for k, v in b.items():
        s = out.get(k, 0) + v
        if s:
            out[k] = s
        else:
            out.pop(k, None)
    return out
