"""Integer intervals for the verifier's static bounds checks (see tiled.ir.verifier): each
integer expression gets [lo, hi] plus whether each end is attained."""

from __future__ import annotations

from dataclasses import dataclass

from tiled.ir import ops
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True, slots=True)
class _Iv:
    """Integer interval [lo, hi]; `lo_exact`/`hi_exact`: that end is attained (see the module
    docstring). `deps`: the vars the value depends on; attained ends combine only over
    distinct vars (`i - i` is 0, not -127..127)."""

    lo: int
    hi: int
    lo_exact: bool = False
    hi_exact: bool = False
    deps: frozenset = frozenset()


def _full(dtype: int) -> _Iv:
    lo, hi = ops.INT_RANGE[dtype]
    return _Iv(lo, hi)


def _fit(iv: _Iv, dtype: int) -> _Iv:
    """An interval that leaves the dtype's range may wrap: it then says nothing."""
    lo, hi = ops.INT_RANGE[dtype]
    return iv if lo <= iv.lo and iv.hi <= hi else _full(dtype)


def _const(iv: _Iv | None) -> int | None:
    return iv.lo if iv is not None and iv.lo == iv.hi else None


def _tdiv(x: int, c: int) -> int:
    q = abs(x) // abs(c)
    return q if (x >= 0) == (c > 0) else -q


def _binary_iv(op: int, a: _Iv, b: _Iv, dtype: int) -> _Iv:
    """The interval of `a op b` in `dtype`: the full range where it may wrap."""
    r = _binary_exact(op, a, b)
    return _full(dtype) if r is None else _fit(r, dtype)


def _binary_exact(op: int, a: _Iv, b: _Iv) -> _Iv | None:
    """The interval of `a op b` over the integers (before any wrap), or None where it is not
    tracked."""
    indep = not (a.deps & b.deps)
    deps = a.deps | b.deps
    if op == pb.ADD:
        r = _Iv(a.lo + b.lo, a.hi + b.hi, indep and a.lo_exact and b.lo_exact,
                indep and a.hi_exact and b.hi_exact, deps)
    elif op == pb.SUB:
        r = _Iv(a.lo - b.hi, a.hi - b.lo, indep and a.lo_exact and b.hi_exact,
                indep and a.hi_exact and b.lo_exact, deps)
    elif op == pb.MUL:
        corners = [(x * y, indep and xe and ye) for x, xe in ((a.lo, a.lo_exact),
                                                              (a.hi, a.hi_exact))
                   for y, ye in ((b.lo, b.lo_exact), (b.hi, b.hi_exact))]
        lo, hi = min(c[0] for c in corners), max(c[0] for c in corners)
        r = _Iv(lo, hi, any(e for v, e in corners if v == lo),
                any(e for v, e in corners if v == hi), deps)
    elif op in (pb.MIN, pb.MAX):
        # min's low end is the lower operand's low end whatever the other does; its high end
        # needs both operands high at once. Dually for max.
        if op == pb.MIN:
            lo, hi = min(a.lo, b.lo), min(a.hi, b.hi)
            lo_e = (a.lo == lo and a.lo_exact) or (b.lo == lo and b.lo_exact)
            hi_e = indep and a.hi_exact and b.hi_exact
        else:
            lo, hi = max(a.lo, b.lo), max(a.hi, b.hi)
            hi_e = (a.hi == hi and a.hi_exact) or (b.hi == hi and b.hi_exact)
            lo_e = indep and a.lo_exact and b.lo_exact
        r = _Iv(lo, hi, lo_e, hi_e, deps)
    elif op in (pb.FLOOR_DIV, pb.DIV, pb.SHR) and _const(b) is not None:
        c = _const(b)
        if op == pb.SHR:
            if not 0 <= c < 64:
                return None
            c, op = 1 << c, pb.FLOOR_DIV  # arithmetic shift right: floor division
        if c == 0:
            return None
        div = (lambda x: x // c) if op == pb.FLOOR_DIV else (lambda x: _tdiv(x, c))
        if c > 0:  # monotone: ends map to ends
            r = _Iv(div(a.lo), div(a.hi), a.lo_exact, a.hi_exact, a.deps)
        else:
            r = _Iv(div(a.hi), div(a.lo), a.hi_exact, a.lo_exact, a.deps)
    elif op == pb.SHL and _const(b) is not None and 0 <= _const(b) < 64:
        return _binary_exact(pb.MUL, a, _Iv(1 << _const(b), 1 << _const(b), True, True))
    elif op == pb.FLOOR_MOD and _const(b) is not None and _const(b) != 0:
        c = _const(b)
        if c > 0 and a.lo // c == a.hi // c:
            r = _Iv(a.lo % c, a.hi % c, a.lo_exact, a.hi_exact, a.deps)
        else:
            r = _Iv(0, c - 1, deps=deps) if c > 0 else _Iv(c + 1, 0, deps=deps)
    elif op == pb.BIT_AND and a.lo >= 0 and b.lo >= 0:
        r = _Iv(0, min(a.hi, b.hi), deps=deps)
    elif op in (pb.BIT_OR, pb.BIT_XOR) and a.lo >= 0 and b.lo >= 0:
        r = _Iv(0, (1 << max(a.hi, b.hi).bit_length()) - 1, deps=deps)
    else:
        return None
    return r
