"""What the rewritten source of a kernel or macro calls at trace time (`__tiled_rt.*`).

tiled.lang.rewrite turns the author's statements into calls of these helpers, which give the
trace the names the author wrote and the meaning TileLang's parser gives some statements:

    A_s = T.alloc_shared(...)   ->  A_s = rt.assign("A_s", rt.mark(), T.alloc_shared(...))
    x += v                      ->  x = rt.augassign(x, "+=", v)
    for k in T.Pipelined(...):  ->  for k in rt.loop(("k",), T.Pipelined(...)):
    with T.Kernel(...) as bx:   ->  with rt.bind(("bx",), T.Kernel(...)) as bx:
    if c: ...                   ->  T.If / T.Else when c is traced, else the Python `if`
    while c: ...                ->  while rt.while_cond(c):  (a traced c is refused)
    a and b / not a / x if c else y / lo <= i < hi  ->  IR logic / a select when traced
    for i in range(n):          ->  range(n), or T.serial(n) when n is traced

Every helper is a no-op on values that are not the trace's (a Python `x = 3` stays that).
"""

from __future__ import annotations

import builtins
import operator
import sys

from tiled.lang import binding, loops
from tiled.lang.builder import active, definition_error
from tiled.lang.expr import BufferRef, Dim, Expr, as_expr, binary, select
from tiled.lang.localvar import LocalVar, alloc_var
from tiled.v1 import tile_ir_pb2 as pb

_INPLACE = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul,
            "/=": operator.itruediv, "//=": operator.ifloordiv, "%=": operator.imod,
            "**=": operator.ipow, "<<=": operator.ilshift, ">>=": operator.irshift,
            "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
            "@=": operator.imatmul}
_BINARY = {"+=": operator.add, "-=": operator.sub, "*=": operator.mul, "/=": operator.truediv,
           "//=": operator.floordiv, "%=": operator.mod, "**=": operator.pow,
           "<<=": operator.lshift, ">>=": operator.rshift, "&=": operator.and_,
           "|=": operator.or_, "^=": operator.xor}
_COMPARE = {"Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt, "GtE": operator.ge,
            "Eq": operator.eq, "NotEq": operator.ne, "Is": operator.is_,
            "IsNot": operator.is_not, "In": lambda a, b: a in b,
            "NotIn": lambda a, b: a not in b}
_UNBOUND = object()


def _logic(op: int, terms) -> Expr:
    """The IR and / or of `terms`; a term that is not bool means `term != 0`."""
    out = None
    for t in terms:
        e = as_expr(t)
        e = e if e.dtype == "bool" else e != 0
        out = e if out is None else binary(op, out, e)
    return out


def _is_traced(x) -> bool:
    return isinstance(x, (Expr, Dim))


class Runtime:
    """The `__tiled_rt` namespace of rewritten functions."""

    If = loops.If
    Else = loops.Else
    is_traced = staticmethod(_is_traced)

    @staticmethod
    def mark():
        b = active()
        return b.mark() if b is not None else None

    @staticmethod
    def assign(names, mark, value):
        """`names = value`: names what the value allocated (after `mark`) and turns an
        assignment to a name bound to a T.alloc_var into a store."""
        b = active()
        if b is None or mark is None:
            return value
        frame_locals = sys._getframe(1).f_locals
        if isinstance(names, str):
            return _assign_one(b, names, mark, value, frame_locals.get(names, _UNBOUND))
        if isinstance(value, (tuple, list)) and len(value) == len(names):
            out = [_assign_one(b, n, mark, v, frame_locals.get(n, _UNBOUND))
                   for n, v in zip(names, value, strict=True)]
            return type(value)(out) if isinstance(value, tuple) else out
        return value

    @staticmethod
    def augassign(old, op: str, value):
        """`x op= value` for a name x: a store into a T.alloc_var, else Python's in-place op."""
        if isinstance(old, LocalVar) and op in _BINARY and active() is not None:
            old.store(_BINARY[op](old, value))
            return old
        return _INPLACE[op](old, value)

    @staticmethod
    def loop(names, iterable):
        b = active()
        return iterable if b is None else _NamedLoop(b, names, iterable)

    @staticmethod
    def bind(names, manager):
        b = active()
        return manager if b is None else _NamedWith(b, names, manager)

    @staticmethod
    def range(range_, *args):
        """`range(...)` in a `for`: TileLang reads a traced bound as T.serial."""
        if range_ is builtins.range and any(_is_traced(a) for a in args):
            return loops.serial(*args)
        return range_(*args)

    @staticmethod
    def bool_op(op: str, first, *rest):
        """`first and rest...` / `or`: Python's short-circuit until an operand is traced;
        from there on every operand is evaluated and the result is their IR and / or."""
        value = first
        for i, thunk in enumerate((None, *rest)):
            if i:
                value = thunk()
            if _is_traced(value):
                terms = [value, *(t() for t in rest[i:])]
                return _logic(pb.AND if op == "and" else pb.OR, terms)
            if (op == "and") != bool(value) or i == len(rest):
                return value
        return value

    @staticmethod
    def not_(value):
        if not _is_traced(value):
            return not value
        e = as_expr(value)
        return ~e if e.dtype == "bool" else e == 0

    @staticmethod
    def compare_chain(ops, left, *thunks):
        """`a < b <= c`: `a < b and b <= c`, each operand evaluated once."""
        terms, a = [], left
        for op, thunk in zip(ops, thunks, strict=True):
            b = thunk()
            t = _COMPARE[op](a, b)
            if not _is_traced(t) and not terms:
                if not t:
                    return t
            else:
                terms.append(t)
            a = b
        if not terms:
            return True
        return _logic(pb.AND, terms) if len(terms) > 1 else terms[0]

    @staticmethod
    def if_exp(cond, then, other):
        if _is_traced(cond):
            return select(cond, then(), other())
        return then() if cond else other()

    @staticmethod
    def while_cond(cond):
        if _is_traced(cond):
            raise definition_error(
                "TileLang feature `while` on a traced condition is not supported by tiled: the "
                "Tile IR has no loop of unknown trip count; loop `for k in T.serial(bound)` "
                "and guard the body with `if cond:`")
        return cond


def _assign_one(b, name: str, mark, value, old):
    fresh = isinstance(value, BufferRef) and value.bid >= mark[0]
    if isinstance(old, LocalVar) and old.owner is b and not fresh:
        old.store(value)  # `x = v` on a variable: a store, and x stays the variable
        return old
    if isinstance(value, LocalVar) and not fresh and value.owner is b:
        # `y = x` takes x's value now (TileLang binds `y = x[0]`), not an alias that would
        # see x's later stores.
        value = alloc_var(value.dtype, init=value)
        fresh = True
    elif b.kernel_open:  # `v = A[i]`: the value read here, once A is written (binding.py)
        value = binding.bind(b, name, value)
    if fresh:
        given = b.name_buffer(value.bid, name)
        if given is not None:
            value.name = given
    return value


def _loop_var(value, first_new: int) -> int | None:
    """The id of the fresh loop var behind a yielded value (`v`, or `v + start`)."""
    if not isinstance(value, Expr):
        return None
    node = value.node
    if node.WhichOneof("kind") == "binary":
        node = node.binary.a
    if node.WhichOneof("kind") == "var" and node.var >= first_new:
        return node.var
    return None


def _name_vars(b, names, value, first_new: int) -> None:
    values = value if isinstance(value, tuple) and len(names) > 1 else (value,)
    if len(values) != len(names):
        return
    for name, v in zip(names, values, strict=True):
        vid = _loop_var(v, first_new)
        if vid is not None:
            b.name_var(vid, name)


class _NamedLoop:
    """Iterates `iterable`, naming the loop vars its first item binds after the `for`
    targets. The body of a tiled loop runs once, so only the first item binds vars."""

    def __init__(self, b, names, iterable):
        self.b, self.names, self.it, self.first = b, names, iter(iterable), True

    def __iter__(self):
        return self

    def __next__(self):
        if not self.first:
            return next(self.it)
        self.first = False
        first_new = len(self.b.program.vars)
        value = next(self.it)
        _name_vars(self.b, self.names, value, first_new)
        return value


class _NamedWith:
    """Enters `manager`, naming the block vars it binds after the `as` targets."""

    def __init__(self, b, names, manager):
        self.b, self.names, self.manager = b, names, manager

    def __enter__(self):
        first_new = len(self.b.program.vars)
        value = self.manager.__enter__()
        # a `with T.Kernel` block that this trace does not record binds its vars in a
        # scratch builder (loops.Kernel), which starts from a copy of these tables
        _name_vars(active() or self.b, self.names, value, first_new)
        return value

    def __exit__(self, et, ev, tb):
        return self.manager.__exit__(et, ev, tb)
