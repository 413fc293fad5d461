"""Questions the compiler's passes ask of Tile IR statements: the statements of a body, the
buffers a tile op touches, a constant's value, a T.Parallel nest and whether an access is
indexed by its variables, whether a region is a whole buffer, and the whole-fragment moves
that make two fragments share a layout (fragment_pair); the statements that relate a 2-D
tile to vectors of its columns row by row (column_read, column_link); and the two
expression builders the rewriting passes share (binary_expr, int_expr) and multiple_of.
Free of TVM: the daemon imports tiled.compiler, whose first passes use these."""

from __future__ import annotations

from tiled.ir.walk import element_accesses, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb


def binary_expr(op: int, a: pb.Expr, b: pb.Expr, dtype: int) -> pb.Expr:
    """The expression `a op b` of `dtype` (copies of a and b)."""
    e = pb.Expr(dtype=dtype)
    e.binary.op = op
    e.binary.a.CopyFrom(a)
    e.binary.b.CopyFrom(b)
    return e


def int_expr(value: int, dtype: int) -> pb.Expr:
    return pb.Expr(dtype=dtype, int_value=value)


def multiple_of(e: pb.Expr, m: int) -> bool:
    """True when `e` is provably a multiple of m (constants, products, sums)."""
    kind = e.WhichOneof("kind")
    if kind == "int_value":
        return e.int_value % m == 0
    if kind == "binary":
        a, b = e.binary.a, e.binary.b
        if e.binary.op == pb.MUL:
            return multiple_of(a, m) or multiple_of(b, m)
        if e.binary.op in (pb.ADD, pb.SUB):
            return multiple_of(a, m) and multiple_of(b, m)
    if kind == "cast":
        return multiple_of(e.cast.value, m)
    return False


def body_statements(s: pb.Stmt) -> list[pb.Stmt]:
    """The statements of a body: a Seq's, or `s` alone."""
    return list(s.seq.stmts) if s.WhichOneof("kind") == "seq" else [s]


def tile_op_buffers(st: pb.Stmt) -> set[int]:
    """The buffers a tile op (copy, gemm, reduce, fill) statement reads or writes; empty for
    any other statement (nested statements not included)."""
    kind = st.WhichOneof("kind")
    node = getattr(st, kind)
    if kind == "copy":
        return {node.src.buffer, node.dst.buffer}
    if kind == "gemm":
        return {node.a, node.b, node.c}
    if kind == "reduce":
        return {node.src, node.dst}
    if kind == "fill":
        return {node.dst.buffer}
    if kind == "scan":
        return {node.src, node.dst}
    return set()


def tile_op_uses(body: pb.Stmt) -> tuple[dict[int, list[pb.Stmt]], set[int]]:
    """(buffer -> the tile op statements under `body` that touch it, in program order; the
    buffers some statement under `body` reads or writes element by element)."""
    uses: dict[int, list[pb.Stmt]] = {}
    for st in walk(body):
        for bid in tile_op_buffers(st):
            uses.setdefault(bid, []).append(st)
    return uses, {bid for bid, _ in element_accesses(body)}


_FOLD = {pb.ADD: lambda a, b: a + b, pb.SUB: lambda a, b: a - b, pb.MUL: lambda a, b: a * b,
         pb.FLOOR_DIV: lambda a, b: a // b if b else None,
         pb.FLOOR_MOD: lambda a, b: a % b if b else None, pb.MIN: min, pb.MAX: max}


def const_int(e: pb.Expr) -> int | None:
    """The value of an integer expression built from constants alone, else None."""
    kind = e.WhichOneof("kind")
    if kind == "int_value":
        return e.int_value
    if kind == "cast":
        return const_int(e.cast.value)
    if kind == "binary" and e.binary.op in _FOLD:
        a, b = const_int(e.binary.a), const_int(e.binary.b)
        return None if a is None or b is None else _FOLD[e.binary.op](a, b)
    return None


def parallel_nest(s: pb.Stmt) -> tuple[list[pb.For], pb.Stmt]:
    """The maximal perfect nest of PARALLEL loops starting at `s`, and its innermost body."""
    nest = []
    while s.WhichOneof("kind") == "for_" and s.for_.kind == pb.PARALLEL:
        nest.append(s.for_)
        s = s.for_.body
    return nest, s


def is_identity(indices, loop_vars: list[int]) -> bool:
    return len(indices) == len(loop_vars) and all(
        i.WhichOneof("kind") == "var" and i.var == v for i, v in zip(indices, loop_vars,
                                                                      strict=True))


def whole_region(r: pb.Region, buf: pb.Buffer) -> bool:
    """Whether region `r` is all of `buf` (offsets 0, full extents)."""
    return list(r.extents) == [d.size for d in buf.shape] and all(
        o.WhichOneof("kind") == "int_value" and o.int_value == 0 for o in r.offsets)


def fragment_pair(st: pb.Stmt, buffers) -> tuple[int, int] | None:
    """(src, dst) of a statement that moves a whole fragment into another of the same shape,
    element for element (T.copy between fragments, T.cumsum), else None: such fragments
    share a layout, so the move is per thread."""
    kind = st.WhichOneof("kind")
    if kind == "copy" and not st.copy.HasField("tma"):
        c = st.copy
        src, dst = buffers[c.src.buffer], buffers[c.dst.buffer]
        if whole_region(c.src, src) and whole_region(c.dst, dst):
            pair = (src, dst)
        else:
            return None
    elif kind == "scan":
        pair = (buffers[st.scan.src], buffers[st.scan.dst])
    else:
        return None
    a, b = pair
    if a.scope != pb.FRAGMENT or b.scope != pb.FRAGMENT or \
            [d.size for d in a.shape] != [d.size for d in b.shape]:
        return None
    return a.id, b.id


def column_read(idx, loop_vars: list[int], full: tuple, shape: tuple) -> bool:
    """Whether `idx` reads X[k, i] in a 1-D nest over i whose extent is X's last dim, k free
    of i (one of X's rows, element for element over a vector of its columns)."""
    if len(loop_vars) != 1 or len(idx) != 2 or len(full) != 2 or full[1:] != shape:
        return False
    v = loop_vars[0]
    last = idx[1].WhichOneof("kind") == "var" and idx[1].var == v
    return last and not any(e.WhichOneof("kind") == "var" and e.var == v
                            for e in subexprs(idx[0]))


def column_link(st: pb.Stmt, buffers) -> tuple[int, int] | None:
    """(2-D tile, 1-D vector of its columns) that statement `st` relates row by row: a
    T.copy of one whole row of the tile to or from the whole vector, a reduction over the
    tile's dim 0 into the vector; else None."""
    kind = st.WhichOneof("kind")
    if kind == "reduce" and st.reduce.dim == 0:
        x, v = buffers[st.reduce.src], buffers[st.reduce.dst]
    elif kind == "copy" and not st.copy.HasField("tma"):
        pair = [(st.copy.src, st.copy.dst), (st.copy.dst, st.copy.src)]
        for tile, vec in pair:
            x, v = buffers[tile.buffer], buffers[vec.buffer]
            if len(x.shape) == 2 and len(v.shape) == 1 and whole_region(vec, v) and \
                    list(tile.extents) == [1, x.shape[1].size] and \
                    const_int(tile.offsets[1]) == 0:
                break
        else:
            return None
    else:
        return None
    if len(x.shape) != 2 or [d.size for d in v.shape] != [x.shape[1].size]:
        return None
    return x.id, v.id
