"""Manifest expressions: the grid, block and `requires` entries of a launch manifest (an int, a
dim name, or `[op, a, b]` with op one of `OPS`), checked when a manifest is read and evaluated
with the dims each call binds. Separate from the Manifest class because the launch path
(tiled.runtime.launch, tiled.runtime.cuda) and the emulators evaluate them on every call and
need nothing else of the schema.
"""

from __future__ import annotations

from collections.abc import Callable

from tiled.errors import LaunchError
from tiled.runtime.manifest_base import _fail, _ident, _is_int

OPS = ("add", "sub", "mul", "floordiv", "floormod", "ceildiv", "min", "max")

Expr = int | str | tuple  # an int, a dim name, or (op, a, b); lists in JSON


def expr_names(expr: Expr) -> set[str]:
    """The dim names an expression reads."""
    if isinstance(expr, str):
        return {expr}
    if isinstance(expr, list | tuple) and len(expr) == 3:
        return expr_names(expr[1]) | expr_names(expr[2])
    return set()


# A name a manifest expression may use besides the dims: the CUDA runtime binds it to the
# device's multiprocessor count (a persistent kernel's grid is min(blocks, k x the SM count),
# k its blocks per SM).
SM_COUNT_DIM = "tiled_sm_count"


def check_expr(expr: object, where: str) -> Expr:
    """Checks the expression's form (not its names); returns it with nodes as tuples."""
    if _is_int(expr):
        return expr  # type: ignore[return-value]
    if isinstance(expr, str):
        return _ident(expr, where)
    if isinstance(expr, list | tuple) and len(expr) == 3:
        if expr[0] not in OPS:
            raise _fail(where, f"unknown operator {expr[0]!r}; known: {', '.join(OPS)}")
        return (expr[0], check_expr(expr[1], where), check_expr(expr[2], where))
    raise _fail(where, f"expected an int, a dim name or [op, a, b], got {expr!r}")


def eval_expr(expr: Expr, dims: dict[str, int]) -> int:
    """Evaluates a manifest expression with the dims bound by a call. floordiv / floormod round
    toward negative infinity (Python's // and %), ceildiv up. Raises LaunchError on an unknown
    operator or name, a malformed node, or a division by zero."""
    if _is_int(expr):
        return expr  # type: ignore[return-value]
    if isinstance(expr, str):
        if expr not in dims:
            known = ", ".join(sorted(dims)) or "none"
            raise LaunchError(f"expression uses dim {expr!r}, which no argument binds "
                              f"(bound: {known})")
        return dims[expr]
    if not (isinstance(expr, list | tuple) and len(expr) == 3):
        raise LaunchError(f"malformed expression {expr!r}: expected int, name or [op, a, b]")
    op, a, b = expr[0], eval_expr(expr[1], dims), eval_expr(expr[2], dims)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    if op in ("floordiv", "floormod", "ceildiv"):
        if b == 0:
            raise LaunchError(f"division by zero evaluating {expr!r} with {dims}")
        return a // b if op == "floordiv" else a % b if op == "floormod" else -(-a // b)
    raise LaunchError(f"unknown operator {op!r} in {expr!r}; known: {', '.join(OPS)}")


_OP_FUNCS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "min": min, "max": max, "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
    "ceildiv": lambda a, b: -(-a // b),
}


def compile_expr(expr: Expr) -> Callable[[dict[str, int]], int]:
    """A function of the dims that computes eval_expr(expr, dims), errors included, without
    walking the expression on every call. `expr` must have passed check_expr."""
    if _is_int(expr):
        return lambda dims: expr  # type: ignore[return-value]
    if isinstance(expr, str):
        def name(dims: dict[str, int]) -> int:
            v = dims.get(expr)
            return v if v is not None else eval_expr(expr, dims)
        return name
    f, a, b = _OP_FUNCS[expr[0]], compile_expr(expr[1]), compile_expr(expr[2])
    if expr[0] in ("floordiv", "floormod", "ceildiv"):
        def div(dims: dict[str, int]) -> int:
            y = b(dims)
            return f(a(dims), y) if y else eval_expr(expr, dims)  # raises: division by zero
        return div
    return lambda dims: f(a(dims), b(dims))


def _expr_json(e: Expr) -> Expr:
    """The JSON form of a checked expression: its tuple nodes back as lists."""
    return [e[0], _expr_json(e[1]), _expr_json(e[2])] if isinstance(e, list | tuple) else e
