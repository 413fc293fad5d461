"""Guard refinement for the verifier, a mixin of `_Verifier` (tiled.ir.verifier): the var
ranges (and whether code is dead) on each side of an `if` or a `select`. A conjunction of
`var op constant` narrows its vars and keeps their attained ends; any other guard narrows what
it can but makes the vars it mentions inexact, so guarded code is never rejected wrongly. Each
analysis visits at most _GUARD_WORK expression nodes.
"""

from __future__ import annotations

from dataclasses import replace

from tiled.ir import ops
from tiled.ir.intervals import _const, _Iv
from tiled.ir.verify_base import Rules
from tiled.v1 import tile_ir_pb2 as pb

_GUARD_WORK = 256  # expression nodes one guard analysis may visit
_NEGATE = {pb.LT: pb.GE, pb.LE: pb.GT, pb.GT: pb.LE, pb.GE: pb.LT, pb.EQ: pb.NE, pb.NE: pb.EQ}
_MIRROR = {pb.LT: pb.GT, pb.LE: pb.GE, pb.GT: pb.LT, pb.GE: pb.LE, pb.EQ: pb.EQ, pb.NE: pb.NE}


class GuardRefinement(Rules):
    """Ranges under a guard (module docstring)."""

    def refined(self, cond: pb.Expr, negate: bool) -> tuple[dict, bool]:
        """Var ranges and deadness where `cond` (or its negation) holds. `cond` was verified.
        A conjunction of `var op constant` keeps attained ends exact (the guarded set is a box);
        any other guard leaves the ranges it narrows sound but makes its vars inexact."""
        env, dead, box = dict(self.env), self.dead, True
        atoms, stack = [], [(cond, negate)]
        while stack:
            if len(atoms) + len(stack) > _GUARD_WORK:
                return _blurred(env, env), dead
            e, neg = stack.pop()
            kind = e.WhichOneof("kind")
            if kind == "binary" and e.binary.op == (pb.OR if neg else pb.AND):
                stack += [(e.binary.a, neg), (e.binary.b, neg)]
            elif kind == "binary" and e.binary.op in ops.COMPARISON_OPS:
                atoms.append((e.binary, neg))
            elif kind == "call" and e.call.op == pb.NOT:
                stack.append((e.call.args[0], not neg))
            elif kind == "int_value":
                dead |= (e.int_value != 0) == neg
            else:
                box = False
        for b, neg in atoms:
            op = _NEGATE[b.op] if neg else b.op
            ka, kb = b.a.WhichOneof("kind"), b.b.WhichOneof("kind")
            a, c = self.side(b.a), self.side(b.b)
            if ka == "var" and b.a.var in env and c is not None:
                vid = b.a.var
            elif kb == "var" and b.b.var in env and a is not None:
                vid, op, c = b.b.var, _MIRROR[op], a
            elif a is not None and c is not None and _const(a) is not None \
                    and _const(c) is not None:
                x, y = _const(a), _const(c)
                dead |= not {pb.LT: x < y, pb.LE: x <= y, pb.GT: x > y, pb.GE: x >= y,
                             pb.EQ: x == y, pb.NE: x != y}[op]
                continue
            else:
                box = False
                continue
            box &= _const(c) is not None and op != pb.NE
            iv, whole = env[vid], env[vid].lo_exact and env[vid].hi_exact
            lo, hi, lo_e, hi_e = iv.lo, iv.hi, iv.lo_exact, iv.hi_exact
            if op in (pb.LT, pb.LE, pb.EQ):
                bound = c.hi - (op == pb.LT)
                if bound < hi:
                    hi, hi_e = bound, whole and bound >= lo
            if op in (pb.GT, pb.GE, pb.EQ):
                bound = c.lo + (op == pb.GT)
                if bound > lo:
                    lo, lo_e = bound, whole and bound <= hi
            env[vid] = replace(iv, lo=lo, hi=hi, lo_exact=lo_e, hi_exact=hi_e)
        if not box:
            env = _blurred(env, _vars_of(cond, env))
        dead |= any(iv.lo > iv.hi for iv in env.values())
        return env, dead

    def side(self, e: pb.Expr) -> _Iv | None:
        """The range of a comparison operand that is a constant or an integer var, else None.
        Reads the enclosing ranges: atoms of one guard are applied independently."""
        kind = e.WhichOneof("kind")
        if kind == "int_value" and e.dtype in ops.INT_DTYPES:
            return _Iv(e.int_value, e.int_value, True, True)
        if kind == "var" and e.dtype in ops.INT_DTYPES:
            return self.var_iv(e.var)
        return None


def _blurred(env: dict, vids) -> dict:
    """`env` with the ranges of `vids` kept but no longer attained."""
    return {v: replace(iv, lo_exact=False, hi_exact=False) if v in vids else iv
            for v, iv in env.items()}


def _vars_of(e: pb.Expr, env: dict):
    """The vars `e` mentions; all of `env` when `e` is too large to look through, which keeps
    guard analysis linear (nested guards would otherwise rescan each other's conditions)."""
    found, stack, work = set(), [e], 0
    while stack:
        work += 1
        if work > _GUARD_WORK:
            return env
        e = stack.pop()
        kind = e.WhichOneof("kind")
        if kind == "var":
            found.add(e.var)
        elif kind == "binary":
            stack += [e.binary.a, e.binary.b]
        elif kind == "call":
            stack += list(e.call.args)
        elif kind == "cast":
            stack.append(e.cast.value)
        elif kind == "select":
            stack += [e.select.cond, e.select.true_value, e.select.false_value]
        elif kind == "load":
            stack += list(e.load.indices)
    return found
