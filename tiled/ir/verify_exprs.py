"""Verifier rules of expressions, a mixin of `_Verifier` (tiled.ir.verifier): dtypes of
constants, vars, operators, intrinsic calls, casts, selects and loads agree; a var is used only
where it is bound; the grid uses only what the launch manifest can evaluate. `expr` returns the
interval of each integer expression (tiled.ir.intervals), narrowed on the sides of a select by
its condition (tiled.ir.verify_guards); the operations undefined on those intervals are
tiled.ir.verify_arith's.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tiled.ir import dtypes, ops
from tiled.ir.intervals import _binary_exact, _binary_iv, _const, _fit, _full, _Iv
from tiled.ir.verify_arith import _float_const
from tiled.ir.verify_base import _MAX_DIM, Rules, _dt
from tiled.v1 import tile_ir_pb2 as pb

# What the launch manifest can evaluate (tiled.compiler.manifest.expr_json).
_GRID_OPS = frozenset({pb.ADD, pb.SUB, pb.MUL, pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD, pb.MIN,
                       pb.MAX})
_GRID_RULE = ("the launch manifest computes the grid from tensor shapes: it may use only "
              "symbolic dims, constants, casts and + - * / // % min max")


class ExprRules(Rules):
    """Expressions (module docstring); each method checks one and returns its interval (None
    unless its dtype is an integer)."""

    def int_expr(self, e: pb.Expr, path: tuple, depth: int, what: str) -> _Iv:
        iv = self.expr(e, path, depth)
        if e.dtype not in ops.INT_DTYPES:
            self.fail(f"{what} has dtype {_dt(e.dtype)}; it must be an integer", path)
        return iv

    def expr(self, e: pb.Expr, path: tuple, depth: int, launch: bool = False) -> _Iv | None:
        """Checks `e` and returns its interval (None unless its dtype is an integer)."""
        self.count(path)
        self.deep(depth, path)
        dt = e.dtype
        if dt not in ops.DTYPES:
            self.fail(f"expression has {'no dtype' if dt == 0 else f'unknown dtype {dt}'}", path)
        kind = e.WhichOneof("kind")
        if kind is None:
            self.fail("empty expression: it has no value, var or operator", path)
        is_int = dt in ops.INT_DTYPES
        if kind == "int_value":
            if dt not in ops.INT_RANGE:
                self.fail(f"integer constant {e.int_value} has dtype {_dt(dt)}; use float_value",
                          path)
            lo, hi = ops.INT_RANGE[dt]
            if not lo <= e.int_value <= hi:
                self.fail(f"constant {e.int_value} does not fit in {_dt(dt)}", path)
            return _Iv(e.int_value, e.int_value, True, True) if is_int else None
        if kind == "float_value":
            if dt not in ops.FLOAT_DTYPES:
                self.fail(f"float constant {e.float_value} has dtype {_dt(dt)}; use int_value",
                          path)
            if math.isfinite(e.float_value) and abs(e.float_value) > ops.FLOAT_MAX[dt]:
                self.fail(f"float constant {e.float_value:g} does not fit in {_dt(dt)} (largest "
                          f"finite value {ops.FLOAT_MAX[dt]:g}); use inf for an infinity", path)
            return None
        if kind == "var":
            return self.var_use(e, path, launch)
        sub = getattr(e, kind)
        spath = (path, "." + kind)
        if launch and kind in ("call", "select"):
            self.fail(f"the grid uses a {kind}; {_GRID_RULE}", spath)
        if kind == "binary":
            return self.binary(e, sub, spath, depth, launch)
        if kind == "call":
            return self.call(e, sub, spath, depth, launch)
        if kind == "cast":
            if not sub.HasField("value"):
                self.fail(f"cast to {_dt(dt)} has no value", (spath, ".value"))
            iv = self.expr(sub.value, (spath, ".value"), depth + 1, launch)
            self.cast_value(sub.value, iv, dt, (spath, ".value"))
            src = sub.value.dtype
            if not is_int:
                return None
            if src in ops.INT_DTYPES:
                return _fit(iv, dt)
            return replace(_full(dt), lo=0, hi=1) if src == pb.BOOL else _full(dt)
        if kind == "select":
            return self.select(e, sub, spath, depth, launch)
        # load
        if launch:
            self.fail(f"the grid cannot load from buffers; {_GRID_RULE}", spath)
        b = self.buffer(sub.buffer, (spath, ".buffer"))
        self.indices(b, sub.indices, spath, depth)
        if dt != b.dtype:
            self.fail(f"load from {_dt(b.dtype)} buffer {self.bname(b.id)} is typed "
                      f"{_dt(dt)}; add a cast", path)
        return _full(dt) if is_int else None

    def var_use(self, e: pb.Expr, path: tuple, launch: bool) -> _Iv | None:
        v = self.var(e.var, (path, ".var"))
        name = self.vname(e.var)
        if launch and e.var in self.in_scope and self.bound.get(e.var) == "scalar":
            self.fail(f"the grid uses scalar parameter {name}; {_GRID_RULE}", (path, ".var"))
        if e.var not in self.in_scope:
            if launch:
                self.fail(f"the grid uses {name}; {_GRID_RULE}", (path, ".var"))
            self.fail(f"{name} is used where it is not defined (a loop var is visible only "
                      "inside its loop body)", (path, ".var"))
        if v.dtype != e.dtype:
            self.fail(f"{name} is {_dt(v.dtype)} but used as {_dt(e.dtype)}; add a cast", path)
        return self.var_iv(e.var) if e.dtype in ops.INT_DTYPES else None

    def var_iv(self, vid: int) -> _Iv:
        """The range of an integer var in scope. Dims and scalars stay out of `env`, which is
        copied at every loop and guard: its size must not grow with the parameter count."""
        iv = self.env.get(vid)
        if iv is not None:
            return iv
        if self.bound.get(vid) == "dim":
            return _Iv(1, _MAX_DIM, deps=frozenset([vid]))
        return replace(_full(self.vars[vid].dtype), deps=frozenset([vid]))

    def binary(self, e: pb.Expr, b: pb.Binary, path: tuple, depth: int, launch: bool):
        op = b.op
        if op not in ops.BINARY_OPS:
            self.fail(f"binary expression has "
                      f"{'no operator' if op == 0 else f'unknown operator {op}'}", (path, ".op"))
        sym = (ops.BINARY_SYMBOL.get(op) or (ops.BINARY_FUNCTION[op],))[0]
        for side in ("a", "b"):
            if not b.HasField(side):
                self.fail(f"operator {sym} has no operand {side}", (path, "." + side))
        if launch and op not in _GRID_OPS:
            self.fail(f"the grid uses {sym}; {_GRID_RULE}", path)
        ia = self.expr(b.a, (path, ".a"), depth + 1, launch)
        ib = self.expr(b.b, (path, ".b"), depth + 1, launch)
        ta, dt = b.a.dtype, e.dtype
        if ta != b.b.dtype:
            self.fail(f"operands of {sym} have different dtypes, {_dt(ta)} and "
                      f"{_dt(b.b.dtype)}; cast one of them", path)
        if op in ops.COMPARISON_OPS:
            if dt != pb.BOOL:
                self.fail(f"comparison {sym} gives bool, not {_dt(dt)}", path)
            return None
        if op in ops.LOGICAL_OPS:
            if ta != pb.BOOL or dt != pb.BOOL:
                self.fail(f"logical {sym} takes and gives bool, not {_dt(ta)} -> {_dt(dt)}", path)
            return None
        if op in ops.INT_ONLY_OPS and ta not in ops.INT_DTYPES:
            self.fail(f"operator {sym} works on integers, not {_dt(ta)}", path)
        if ta == pb.BOOL:
            self.fail(f"arithmetic {sym} on bool operands", path)
        if dt != ta:
            self.fail(f"{sym} of {_dt(ta)} operands gives {_dt(ta)}, not {_dt(dt)}", path)
        if dt not in ops.INT_DTYPES:
            if op == pb.DIV and _float_const(b.b) == 0:
                self.fail(f"{_dt(dt)} division by constant 0: TVM refuses to fold it; write "
                          "inf (or nan) for the value you mean, or guard the divisor",
                          (path, ".b"))
            return None
        if not self.dead or not ib.deps:  # a constant is wrong even in code that never runs
            self.int_operand(op, sym, ib, dt, (path, ".b"))
            self.int_min_operand(op, sym, b, dt, path)
            if _const(ia) is not None and _const(ib) is not None and not (self.dead and ia.deps):
                self.int_fold(op, sym, _const(ia), _const(ib), dt, path)
        exact = _binary_exact(op, ia, ib)
        if exact is not None and dt not in ops.UNSIGNED_DTYPES and \
                (not self.dead or not exact.deps):
            self.signed_overflow(sym, exact, dt, path)
        return _binary_iv(op, ia, ib, dt)

    def call(self, e: pb.Expr, c: pb.Call, path: tuple, depth: int, launch: bool):
        op, dt = c.op, e.dtype
        if op not in ops.INTRINSIC_ARITY:
            self.fail(f"call of {'no intrinsic' if op == 0 else f'unknown intrinsic {op}'}",
                      (path, ".op"))
        name = ops.INTRINSIC_NAME[op]
        if len(c.args) != ops.INTRINSIC_ARITY[op]:
            self.fail(f"{name} takes {ops.INTRINSIC_ARITY[op]} argument(s), got {len(c.args)}",
                      (path, ".args"))
        if op == pb.REINTERPRET:
            return self.reinterpret(c, dt, path, depth, launch)
        ivs = []
        for i, a in enumerate(c.args):
            ivs.append(self.expr(a, (path, f".args[{i}]"), depth + 1, launch))
            if a.dtype != dt:
                self.fail(f"{name} of {_dt(a.dtype)} argument gives {_dt(a.dtype)}, "
                          f"not {_dt(dt)}", (path, f".args[{i}]"))
        if op in ops.FLOAT_INTRINSICS and dt not in ops.FLOAT_DTYPES:
            self.fail(f"{name} works on floats, not {_dt(dt)}; cast the argument", path)
        if op in ops.BOOL_INTRINSICS and dt != pb.BOOL:
            self.fail(f"{name} works on bool, not {_dt(dt)}", path)
        if op in ops.NUMERIC_INTRINSICS and dt == pb.BOOL:
            self.fail(f"{name} does not work on bool", path)
        if dt not in ops.INT_DTYPES:
            return None
        a = ivs[0]
        c = _const(a) if not self.dead or not a.deps else None
        if c is not None and op == pb.NEG and dt in ops.UNSIGNED_DTYPES and c != 0:
            self.fail(f"neg of constant {c} wraps below 0 in {_dt(dt)}", path)
        if c is not None and op == pb.ABS and c == ops.INT_RANGE[dt][0]:
            self.fail(f"abs of constant {c} overflows {_dt(dt)}", path)
        if op == pb.NEG:
            return _fit(_Iv(-a.hi, -a.lo, a.hi_exact, a.lo_exact, a.deps), dt)
        if op == pb.ABS and a.lo >= 0:
            return a
        return _full(dt)

    def reinterpret(self, c: pb.Call, dt: int, path: tuple, depth: int, launch: bool):
        """The argument's bits as `dt`: another dtype of the same width, neither bool."""
        a = c.args[0]
        self.expr(a, (path, ".args[0]"), depth + 1, launch)
        width = [dtypes.BITS.get(_dt(d)) for d in (a.dtype, dt)]
        if pb.BOOL in (a.dtype, dt) or a.dtype == dt or None in width or width[0] != width[1]:
            self.fail(f"reinterpret of {_dt(a.dtype)} as {_dt(dt)}: it takes a non-bool "
                      "value to another non-bool dtype of the same width", path)
        if {a.dtype, dt} & {pb.FLOAT8_E4M3, pb.FLOAT8_E5M2}:
            self.fail(f"reinterpret of {_dt(a.dtype)} as {_dt(dt)}: float8 values are not "
                      "reinterpreted yet (tiled computes float8 through float32)", path)
        return _full(dt) if dt in ops.INT_DTYPES else None

    def select(self, e: pb.Expr, s: pb.Select, path: tuple, depth: int, launch: bool):
        for part in ("cond", "true_value", "false_value"):
            if not s.HasField(part):
                self.fail(f"select has no {part}", (path, "." + part))
        self.expr(s.cond, (path, ".cond"), depth + 1, launch)
        if s.cond.dtype != pb.BOOL:
            self.fail(f"select condition has dtype {_dt(s.cond.dtype)}; it must be bool",
                      (path, ".cond"))
        saved = self.env, self.dead
        ivs, dead = [], []
        for part, negate in (("true_value", False), ("false_value", True)):
            self.env, self.dead = self.refined(s.cond, negate)
            dead.append(self.dead and not saved[1])
            ivs.append(self.expr(getattr(s, part), (path, "." + part), depth + 1, launch))
            self.env, self.dead = saved
            if getattr(s, part).dtype != e.dtype:
                self.fail(f"select {part} is {_dt(getattr(s, part).dtype)} but the select is "
                          f"{_dt(e.dtype)}", (path, "." + part))
        if e.dtype not in ops.INT_DTYPES:
            return None
        t, f = ivs
        if dead[0] != dead[1]:  # the condition is decided: the select is its live side
            return f if dead[0] else t
        return _Iv(min(t.lo, f.lo), max(t.hi, f.hi), deps=t.deps | f.deps)
