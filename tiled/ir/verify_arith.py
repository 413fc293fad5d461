"""Verifier rules of arithmetic, a mixin of `_Verifier` (tiled.ir.verifier): integer
operations undefined where they provably happen (a shift by an amount outside [0, bits), a
division or modulo by 0, a signed overflow; unsigned arithmetic wraps, as defined), and
constants the compiler folds but no dtype holds (`uint8(-1)`, `float16(1e6)`, `1 << 31` in
int32, `0 - 1` in uint8). "Provably" reads the intervals of tiled.ir.intervals: a constant, an
attained end, or the whole interval outside. (A float division by constant 0.0 is refused in
tiled.ir.verify_exprs, with the binary's other rules.)
"""

from __future__ import annotations

import math

from tiled.ir import dtypes, ops
from tiled.ir.intervals import _const, _Iv
from tiled.ir.verify_base import Rules, _dt
from tiled.v1 import tile_ir_pb2 as pb


class ArithRules(Rules):
    """Undefined integer operations and unfoldable constants (module docstring)."""

    def cast_value(self, value: pb.Expr, iv: _Iv | None, dt: int, path: tuple) -> None:
        """Rejects a cast of a constant the target dtype cannot hold (`uint8(-1)`, `bool(5)`,
        `int32(inf)`, `float16(1e6)`): the compiler folds casts of constants, and TVM refuses
        a folded value outside the dtype (C leaves float-to-int overflow undefined)."""
        src = value.dtype
        if dt == src:
            return
        if iv is not None and _const(iv) is not None and (not self.dead or not iv.deps):
            c, what = _const(iv), f"{_const(iv)}"
        elif src in ops.FLOAT_DTYPES and (f := _float_const(value)) is not None:
            c, what = f, f"{f:g}"
        else:
            return
        if dt in ops.FLOAT_DTYPES:
            ok = not math.isfinite(c) or abs(c) <= ops.FLOAT_MAX[dt]
            valid = f"largest finite value {ops.FLOAT_MAX[dt]:g}"
        else:
            lo, hi = ops.INT_RANGE[dt]
            ok = math.isfinite(c) and lo <= math.trunc(c) <= hi
            valid = f"{lo}..{hi}"
        if not ok:
            hint = "; compare instead (x != 0)" if dt == pb.BOOL else \
                "; mask or clamp it first" if dt not in ops.FLOAT_DTYPES else ""
            self.fail(f"cast of constant {what} to {_dt(dt)}: {_dt(dt)} holds {valid}{hint}",
                      path)

    def signed_overflow(self, sym: str, r: _Iv, dt: int, path: tuple) -> None:
        """Signed overflow is undefined (C, LLVM's nsw): rejected where it provably happens,
        at an attained end or on every execution. Unsigned arithmetic wraps, as defined."""
        lo, hi = ops.INT_RANGE[dt]
        if r.hi < lo or r.lo > hi:
            value = r.lo if r.lo == r.hi else f"{r.lo}..{r.hi}"
        elif r.lo_exact and r.lo < lo:
            value = r.lo
        elif r.hi_exact and r.hi > hi:
            value = r.hi
        else:
            return
        self.fail(f"{_dt(dt)} arithmetic overflows: {sym} reaches {value}, outside {lo}..{hi} "
                  "(signed overflow is undefined); compute in a wider dtype", path)

    def int_fold(self, op: int, sym: str, a: int, b: int, dt: int, path: tuple) -> None:
        """Constant operands are folded by the compiler, and TVM refuses the folds that leave
        the dtype where C would shift into the sign bit or wrap an unsigned difference."""
        lo, hi = ops.INT_RANGE[dt]
        if op == pb.SHL and dt not in ops.UNSIGNED_DTYPES and 0 <= b < dtypes.bits(dt) \
                and not lo <= a << b <= hi:
            self.fail(f"constant shift {a} << {b} overflows {_dt(dt)} ({lo}..{hi})", path)
        if op == pb.SUB and dt in ops.UNSIGNED_DTYPES and a < b:
            self.fail(f"constant {a} - {b} wraps below 0 in {_dt(dt)}", path)

    def int_operand(self, op: int, sym: str, b: _Iv, dt: int, path: tuple) -> None:
        """Rejects a shift amount outside [0, bits) or an integer divisor 0, when the value
        is certain (a constant) or reached at an attained end: the result is undefined there
        (C and LLVM), and a constant one stops TVM's folding."""
        if op in (pb.SHL, pb.SHR):
            bits = dtypes.bits(dt)
            if b.hi < 0 or b.lo >= bits:
                amount = b.lo if b.lo == b.hi else f"in {b.lo}..{b.hi}"
            elif b.lo_exact and b.lo < 0:
                amount = b.lo
            elif b.hi_exact and b.hi >= bits:
                amount = b.hi
            else:
                return
            self.fail(f"shift {sym} by {amount} on {_dt(dt)}: the amount must be in "
                      f"0..{bits - 1} (the width of {_dt(dt)} is {bits} bits)", path)
        if op in (pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD) and (
                (b.lo == b.hi == 0) or (b.lo_exact and b.lo == 0) or (b.hi_exact and b.hi == 0)):
            what = "constant 0" if b.lo == b.hi else f"a value in {b.lo}..{b.hi} that reaches 0"
            self.fail(f"integer {sym} by {what} ({_dt(dt)}): division by zero is undefined; "
                      "guard the divisor or use max(divisor, 1)", path)


    def int_min_operand(self, op: int, sym: str, b: pb.Binary, dt: int, path: tuple) -> None:
        """Rejects the signed minimum (-2^31 in int32) as a literal operand of * / // % or as
        the subtrahend of -: TVM's simplifier negates such constants, which no dtype of that
        width holds."""
        if op not in (pb.MUL, pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD, pb.SUB) or \
                dt in ops.UNSIGNED_DTYPES:
            return
        lo = ops.INT_RANGE[dt][0]
        for side in ("b",) if op == pb.SUB else ("a", "b"):
            x = getattr(b, side)
            if x.WhichOneof("kind") == "int_value" and x.int_value == lo:
                self.fail(f"constant {lo} (the {_dt(dt)} minimum) as an operand of {sym}: the "
                          f"compiler negates it, which {_dt(dt)} cannot hold; compute in a "
                          "wider dtype", (path, "." + side))


def _float_const(e: pb.Expr) -> float | None:
    """The value of a float expression that is a constant (a literal, under negations and
    casts), else None: what the compiler folds before TVM sees it."""
    sign = 1.0
    for _ in range(8):
        kind = e.WhichOneof("kind")
        if kind == "float_value":
            return sign * e.float_value
        if kind == "int_value":
            return sign * e.int_value
        if kind == "call" and e.call.op == pb.NEG and len(e.call.args) == 1:
            sign, e = -sign, e.call.args[0]
        elif kind == "cast" and e.cast.HasField("value"):
            e = e.cast.value
        else:
            return None
    return None
