"""`T.alloc_var`: a per-thread scalar variable that reads like a value.

It is a LOCAL buffer of one element. Inside a kernel or macro whose source tiled rewrites,
`x = v` and `x += v` on a name bound to one store into it, as TileLang's parser does; other
assignments keep their Python meaning. `x[0] = v` always works (also where the source is not
available). Reading `x` reads the element where the reading expression is used.
"""

from __future__ import annotations

from tiled.ir import dtypes
from tiled.lang.builder import current, definition_error
from tiled.lang.expr import BufferRef, Element, cast, const
from tiled.v1 import tile_ir_pb2 as pb


class LocalVar(Element, BufferRef):
    """The value of a T.alloc_var (an Element of its buffer) and the buffer itself, so tile
    operations take it too (`T.clear(x)`, `T.fill(x, 0)`)."""

    def __init__(self, bid: int, name: str, dtype: str):
        BufferRef.__init__(self, bid, name, dtype, (1,), pb.LOCAL)
        node = pb.Expr(dtype=dtypes.to_enum(dtype))
        node.load.buffer = bid
        zero = const(0, "int32")
        node.load.indices.add().CopyFrom(zero.node)
        Element.__init__(self, node, dtype, self, [zero])

    def __repr__(self):
        return self.name

    def store(self, value) -> None:
        """Emits `x = value` (cast to the var's dtype)."""
        stmt = pb.Stmt()
        stmt.store.buffer = self.bid
        stmt.store.indices.add().CopyFrom(self.indices[0].node)
        stmt.store.value.CopyFrom(cast(value, self.dtype).node)
        current().emit(stmt)


def alloc_var(dtype, *args, init=None, scope: str = "local.var", name: str | None = None):
    """A per-thread scalar variable, optionally initialized; assign it like a Python name.

    >>> row = T.alloc_var(T.int32, init=0)
    >>> for i in T.serial(n):
    ...     row += sizes[i]
    >>> m = T.alloc_var("float32")
    >>> m = -T.infinity("float32")
    """
    # TileLang's positional forms: (dtype, init), (dtype, scope), (dtype, init, scope).
    if len(args) > 2:
        raise definition_error(f"T.alloc_var takes (dtype, init, scope), got {len(args) + 1} "
                               "positional arguments")
    for a in args:
        if isinstance(a, str):
            scope = a
        elif init is not None:
            raise definition_error("T.alloc_var: the initial value is given twice")
        else:
            init = a
    if scope not in ("local.var", "local"):
        raise definition_error(f"T.alloc_var: scope {scope!r} is not supported; variables are "
                               "per-thread (\"local.var\")")
    b = current()
    if not b.kernel_open:
        raise definition_error("allocate variables inside `with T.Kernel(...)`")
    try:
        dt = dtypes.canonical_name(dtype)
    except ValueError as e:
        raise definition_error(str(e)) from None
    buf = b.new_buffer(name or f"var{len(b.program.buffers)}", dt, [1], pb.LOCAL,
                       generated=name is None)
    buf.loc.CopyFrom(b.location())
    var = LocalVar(buf.id, buf.name, dt)
    var.owner = b
    if init is not None:
        var.store(init)
    return var
