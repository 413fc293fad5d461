"""Walks over Tile IR: the statements nested in one, the expressions in them, the element
accesses they make, the buffers a statement writes, and a rule for T.vectorized loops. Pure
Tile IR (no TVM): the lowerings use it, and so does the DSL's tracer (tiled.lang.binding)."""

from __future__ import annotations

from tiled.v1 import tile_ir_pb2 as pb


def walk(s: pb.Stmt):
    """`s` and every statement nested in it, in program order."""
    yield s
    kind = s.WhichOneof("kind")
    if kind == "seq":
        for x in s.seq.stmts:
            yield from walk(x)
    elif kind == "for_":
        yield from walk(s.for_.body)
    elif kind == "if_then_else":
        yield from walk(s.if_then_else.then_body)
        if s.if_then_else.HasField("else_body"):
            yield from walk(s.if_then_else.else_body)


def waits_on_grid(body: pb.Stmt) -> bool:
    """Whether `body` holds a T.pdl_sync: the kernel may be launched before the kernels ahead
    of it in its stream end (tiled.lang.pdl)."""
    return any(st.WhichOneof("kind") == "grid_dependency" and not st.grid_dependency.trigger
               for st in walk(body))


def stmt_exprs(s: pb.Stmt):
    """Expressions directly in statement `s` (not in nested statements)."""
    kind = s.WhichOneof("kind")
    node = getattr(s, kind)
    if kind == "store" or kind == "atomic_add":
        yield from node.indices
        yield node.value
    elif kind == "if_then_else":
        yield node.cond
    elif kind == "for_":
        yield node.extent
    elif kind in ("copy",):
        yield from node.src.offsets
        yield from node.dst.offsets
    elif kind == "fill":
        yield from node.dst.offsets
        yield node.value


def written(st: pb.Stmt) -> set[int]:
    """Buffers statement `st` itself writes (nested statements not included)."""
    kind = st.WhichOneof("kind")
    node = getattr(st, kind)
    if kind in ("copy", "fill"):
        return {node.dst.buffer}
    if kind == "store":
        return {node.buffer}
    if kind == "atomic_add":
        return {node.buffer, node.prev} if node.has_prev else {node.buffer}
    if kind == "gemm":
        return {node.c}
    if kind in ("reduce", "scan"):
        return {node.dst}
    return set()


def subexprs(e: pb.Expr):
    """`e` and every expression nested in it."""
    yield e
    kind = e.WhichOneof("kind")
    if kind == "binary":
        yield from subexprs(e.binary.a)
        yield from subexprs(e.binary.b)
    elif kind == "call":
        for a in e.call.args:
            yield from subexprs(a)
    elif kind == "cast":
        yield from subexprs(e.cast.value)
    elif kind == "select":
        yield from subexprs(e.select.cond)
        yield from subexprs(e.select.true_value)
        yield from subexprs(e.select.false_value)
    elif kind == "load":
        for i in e.load.indices:
            yield from subexprs(i)


def expr_vars(exprs) -> set[int]:
    """The ids of the variables `exprs` use."""
    return {x.var for e in exprs for x in subexprs(e) if x.WhichOneof("kind") == "var"}


def _element_writes(st: pb.Stmt):
    """(buffer id, index exprs) of the elements statement `st` itself writes: a store's, an
    atomic's and the local receiving an atomic's previous value."""
    kind = st.WhichOneof("kind")
    if kind in ("store", "atomic_add"):
        node = getattr(st, kind)
        yield node.buffer, list(node.indices)
        if kind == "atomic_add" and node.has_prev:
            yield node.prev, [pb.Expr(dtype=pb.INT32, int_value=0)]


def element_accesses(body: pb.Stmt):
    """(buffer id, index exprs) of every element load / store / atomic in `body`."""
    for st in walk(body):
        yield from _element_writes(st)
        for e in stmt_exprs(st):
            for sub in subexprs(e):
                if sub.WhichOneof("kind") == "load":
                    yield sub.load.buffer, list(sub.load.indices)


def stores(body: pb.Stmt):
    """(buffer id, index exprs) of every element store / atomic in `body`."""
    for st in walk(body):
        yield from _element_writes(st)


def set_before_read(body: pb.Stmt) -> set[int]:
    """Buffers whose first access in `body`, in program order, is a store (the loads of a
    store's own value and indices come before it): in a loop body, values each iteration
    sets for itself before it reads them (a scalar `x = A[i]` the DSL keeps in a local)."""
    seen: set[int] = set()
    first_store: set[int] = set()
    for st in walk(body):
        for e in stmt_exprs(st):
            for sub in subexprs(e):
                if sub.WhichOneof("kind") == "load":
                    seen.add(sub.load.buffer)
        updated = st.atomic_add.buffer if st.WhichOneof("kind") == "atomic_add" else None
        for bid, _ in _element_writes(st):  # an atomic reads the element it updates
            if bid not in seen and bid != updated:
                first_store.add(bid)
            seen.add(bid)
    return first_store


def lanes_independent(f: pb.For) -> bool:
    """Whether the iterations of loop `f` touch disjoint elements, so running them as vector
    lanes gives the serial results: every store writes an element of its own iteration (its
    last index is v, e + v or v + e with e and the other indices free of the loop var v),
    each buffer is stored at one index, and a buffer the body stores is read only there (an
    iteration reads only what it writes itself)."""
    v = f.var
    stored: dict[int, list] = {}
    for bid, idx in stores(f.body):
        if not idx or not _unit_stride(idx[-1], v) or v in expr_vars(idx[:-1]) or \
                stored.setdefault(bid, idx) != idx:
            return False
    return all(bid not in stored or idx == stored[bid] for bid, idx in element_accesses(f.body))


def _unit_stride(e: pb.Expr, var: int) -> bool:
    """Whether `e` is var, e' + var or var + e' (e' free of var)."""
    if e.WhichOneof("kind") == "var":
        return e.var == var
    if e.WhichOneof("kind") != "binary" or e.binary.op != pb.ADD:
        return False
    a, b = e.binary.a, e.binary.b
    return (a.WhichOneof("kind") == "var" and a.var == var and var not in expr_vars([b])) or \
        (b.WhichOneof("kind") == "var" and b.var == var and var not in expr_vars([a]))
