"""`v = <expression that reads a buffer>` binds the value read there, as TileLang's let does,
without costing kernels that never need it.

The name keeps the expression (which later statements inline: the vectorizer sees plain loads)
until a statement writes a buffer the expression reads. From then on the next use of the
name materializes the value: a one-element local variable stored at the assignment's place
(before the write; nothing between wrote what it reads, or the write would have been the
first), and the name reads that variable. A write no use follows costs nothing. Bindings
end with their scope: a use outside it keeps reading the expression.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tiled.ir.walk import subexprs, written
from tiled.lang.expr import Element, Expr, const
from tiled.v1 import tile_ir_pb2 as pb

_SLOT = Expr.__dict__["node"]  # the slot behind Expr.node


@dataclass
class _Binding:
    builder: object
    value: Expr
    name: str
    reads: frozenset[int]
    scope: list
    pos: int
    loc: pb.Location
    stale: bool = False


_LOCAL = threading.local()  # a trace runs in one thread: its bindings are that thread's


def _bound() -> dict[int, _Binding]:
    """id(value) -> its binding (the binding holds the value, so the id stays its own)."""
    d = getattr(_LOCAL, "bound", None)
    if d is None:
        d = _LOCAL.bound = {}
    return d


def _node_get(self):
    b = _bound().get(id(self))
    if b is not None and b.stale:
        _materialize(b)
    return _SLOT.__get__(self)


def _node_set(self, node):
    _SLOT.__set__(self, node)


class BoundExpr(Expr):
    __slots__ = ()
    node = property(_node_get, _node_set)


class BoundElement(Element):
    __slots__ = ()
    node = property(_node_get, _node_set)


def reads(node: pb.Expr) -> frozenset[int]:
    """The buffers an expression loads from."""
    return frozenset(x.load.buffer for x in subexprs(node) if x.WhichOneof("kind") == "load")


def bind(builder, name: str, value):
    """Registers `value` (an Expr or an Element the author assigned to `name`) when it reads
    a buffer; returns it (now a BoundExpr / BoundElement)."""
    if type(value) not in (Expr, Element) or not builder.scopes:
        return value
    read = reads(_SLOT.__get__(value))
    if not read:
        return value
    if getattr(_LOCAL, "builder", None) is not builder:  # a new trace: drop what a trace
        _LOCAL.builder, _LOCAL.bound = builder, {}       # that raised midway left behind
    value.__class__ = BoundExpr if type(value) is Expr else BoundElement
    scope = builder.scopes[-1]
    _bound()[id(value)] = _Binding(builder, value, name, read, scope, len(scope),
                                 builder.location())
    return value


def on_emit(builder, stmt: pb.Stmt) -> None:
    """A statement is about to be emitted: bindings reading what it writes go stale."""
    bound = _bound()
    if not bound:
        return
    w = written(stmt)
    if w:
        for b in bound.values():
            if b.builder is builder and not b.stale and b.reads & w:
                b.stale = True


def on_close(builder, scope: list) -> None:
    """A scope closed: its bindings end (their values keep the expression)."""
    bound = _bound()
    for key in [k for k, b in bound.items() if b.builder is builder and b.scope is scope]:
        del bound[key]


def _materialize(b: _Binding) -> None:
    bound = _bound()
    del bound[id(b.value)]
    builder, node = b.builder, _SLOT.__get__(b.value)
    buf = builder.new_buffer(f"var{len(builder.program.buffers)}", b.value.dtype, [1],
                             pb.LOCAL, generated=True)
    buf.loc.CopyFrom(b.loc)
    builder.name_buffer(buf.id, b.name)
    zero = const(0, "int32").node
    stmt = pb.Stmt(loc=b.loc)
    stmt.store.buffer = buf.id
    stmt.store.indices.add().CopyFrom(zero)
    stmt.store.value.CopyFrom(node)
    b.scope.insert(b.pos, stmt)
    for other in bound.values():
        if other.scope is b.scope and other.pos >= b.pos:
            other.pos += 1
    load = pb.Expr(dtype=node.dtype)
    load.load.buffer = buf.id
    load.load.indices.add().CopyFrom(zero)
    _SLOT.__set__(b.value, load)
