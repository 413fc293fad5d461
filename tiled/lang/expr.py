"""Expressions of the DSL: `Expr` wraps a Tile IR expression node and overloads Python's
operators; `BufferRef` is a buffer handle whose subscripts load, store and name tile corners."""

from __future__ import annotations

from tiled.ir import dtypes
from tiled.ir.printer import format_expr
from tiled.lang.builder import active, current, definition_error
from tiled.lang.linear import constant_difference
from tiled.v1 import tile_ir_pb2 as pb


class Expr:
    """A traced scalar expression with a dtype. Python control flow cannot branch on it:
    use `if` inside a @tiled.kernel (rewritten to an IR conditional) or `T.if_then_else`."""

    __slots__ = ("dtype", "node", "program")

    def __init__(self, node: pb.Expr, dtype: str):
        self.node, self.dtype = node, dtype
        # The program being traced: its tables name the vars and buffers when this prints,
        # also after the trace (an error's locals, a debugger).
        b = active()
        self.program = b.program if b is not None else None

    def __bool__(self):
        raise definition_error(
            "a traced value has no Python truth value here: use `if` directly in the kernel body "
            "(not in a helper function), `T.if_then_else(c, a, b)`, or `&` / `|` instead of "
            "`and` / `or`")

    def __index__(self):
        raise definition_error("a traced value cannot be used where Python needs an int "
                               "(range(), shapes); use T.serial / T.Parallel for traced extents")

    __hash__ = object.__hash__

    def __repr__(self):
        """The expression as source, `bx * 128 + i`, with the names of its trace."""
        return format_expr(self.node, self.program)

    def __add__(self, o): return binary(pb.ADD, self, o)
    def __radd__(self, o): return binary(pb.ADD, o, self)
    def __sub__(self, o): return binary(pb.SUB, self, o)
    def __rsub__(self, o): return binary(pb.SUB, o, self)
    def __mul__(self, o): return binary(pb.MUL, self, o)
    def __rmul__(self, o): return binary(pb.MUL, o, self)
    def __truediv__(self, o): return binary(pb.DIV, self, o)
    def __rtruediv__(self, o): return binary(pb.DIV, o, self)
    def __floordiv__(self, o): return binary(pb.FLOOR_DIV, self, o)
    def __rfloordiv__(self, o): return binary(pb.FLOOR_DIV, o, self)
    def __mod__(self, o): return binary(pb.FLOOR_MOD, self, o)
    def __rmod__(self, o): return binary(pb.FLOOR_MOD, o, self)
    def __lt__(self, o): return binary(pb.LT, self, o)
    def __le__(self, o): return binary(pb.LE, self, o)
    def __gt__(self, o): return binary(pb.GT, self, o)
    def __ge__(self, o): return binary(pb.GE, self, o)
    def __eq__(self, o): return binary(pb.EQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return binary(pb.NE, self, o)  # type: ignore[override]
    def __and__(self, o): return binary(pb.AND if self.dtype == "bool" else pb.BIT_AND, self, o)
    def __rand__(self, o): return binary(pb.AND if self.dtype == "bool" else pb.BIT_AND, o, self)
    def __or__(self, o): return binary(pb.OR if self.dtype == "bool" else pb.BIT_OR, self, o)
    def __ror__(self, o): return binary(pb.OR if self.dtype == "bool" else pb.BIT_OR, o, self)
    def __xor__(self, o): return binary(pb.BIT_XOR, self, o)
    def __rxor__(self, o): return binary(pb.BIT_XOR, o, self)
    def __lshift__(self, o): return binary(pb.SHL, self, o)
    def __rlshift__(self, o): return binary(pb.SHL, o, self)
    def __rshift__(self, o): return binary(pb.SHR, self, o)
    def __rrshift__(self, o): return binary(pb.SHR, o, self)
    def __neg__(self): return call(pb.NEG, self)
    def __invert__(self): return call(pb.NOT, self) if self.dtype == "bool" else self ^ -1
    def __pos__(self): return self

    def astype(self, dtype) -> Expr:
        return cast(self, dtype)


class Dim:
    """A symbolic dimension (`T.dyn("M")`): a tensor extent known only at launch. Inside the
    kernel it is an int32 value usable in expressions (grid sizes, bounds)."""

    def __init__(self, name: str):
        if not name.isidentifier():
            raise definition_error(f"dim name {name!r} is not an identifier")
        self.name = name

    def expr(self) -> Expr:
        b = current()
        if self.name not in b.dims:
            raise definition_error(f"symbolic dim {self.name} is not in any parameter's shape")
        return Expr(pb.Expr(dtype=pb.INT32, var=b.dims[self.name]), "int32")

    def __repr__(self):
        return self.name

    def __add__(self, o): return self.expr() + o
    def __radd__(self, o): return o + self.expr()
    def __sub__(self, o): return self.expr() - o
    def __rsub__(self, o): return o - self.expr()
    def __mul__(self, o): return self.expr() * o
    def __rmul__(self, o): return o * self.expr()
    def __floordiv__(self, o): return self.expr() // o
    def __rfloordiv__(self, o): return o // self.expr()
    def __mod__(self, o): return self.expr() % o
    def __rmod__(self, o): return o % self.expr()
    def __lt__(self, o): return self.expr() < o
    def __le__(self, o): return self.expr() <= o
    def __gt__(self, o): return self.expr() > o
    def __ge__(self, o): return self.expr() >= o


def const(value, dtype: str) -> Expr:
    if isinstance(value, bool) or dtype == "bool":
        return Expr(pb.Expr(dtype=pb.BOOL, int_value=int(bool(value))), "bool")
    if dtypes.is_float(dtype):
        return Expr(pb.Expr(dtype=dtypes.to_enum(dtype), float_value=float(value)), dtype)
    if isinstance(value, float):
        raise definition_error(f"float constant {value} used where {dtype} is needed")
    return Expr(pb.Expr(dtype=dtypes.to_enum(dtype), int_value=int(value)), dtype)


def as_expr(value, like: str | None = None) -> Expr:
    """Converts Python numbers, Dims and Exprs to an Expr; `like` types a bare constant."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, Dim):
        return value.expr()
    if isinstance(value, bool):
        return const(value, "bool")
    if isinstance(value, int):
        if like is not None and like != "bool":
            return const(value, like)
        return const(value, "int32" if -(2**31) <= value < 2**31 else "int64")
    if isinstance(value, float):
        return const(value, like if like is not None and dtypes.is_float(like) else "float32")
    raise definition_error(f"cannot use {type(value).__name__} {value!r} as a kernel value")


def promote(a: str, b: str) -> str:
    """The common dtype of a binary operation (as TileLang / C: float wins, then width)."""
    if a == b:
        return a
    fa, fb = dtypes.is_float(a), dtypes.is_float(b)
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    if fa and fb:
        if {a, b} == {"float16", "bfloat16"}:
            return "float32"
        return a if dtypes.bits(a) >= dtypes.bits(b) else b
    if a == "bool":
        return b
    if b == "bool":
        return a
    return a if dtypes.bits(a) >= dtypes.bits(b) else b


_COMPARE = {pb.EQ, pb.NE, pb.LT, pb.LE, pb.GT, pb.GE}
_LOGICAL = {pb.AND, pb.OR}


def binary(op: int, a, b) -> Expr:
    if not isinstance(a, (Expr, Dim)) and not isinstance(b, (Expr, Dim)):
        raise definition_error("binary operation on two Python values")
    ea = a if isinstance(a, (Expr, Dim)) else None
    eb = b if isinstance(b, (Expr, Dim)) else None
    ea = as_expr(a, as_expr(eb).dtype if ea is None else None)
    eb = as_expr(b, ea.dtype if eb is None else None)
    dt = promote(ea.dtype, eb.dtype)
    if op in _LOGICAL:
        dt = "bool"
    ea, eb = cast(ea, dt), cast(eb, dt)
    out = "bool" if op in _COMPARE or op in _LOGICAL else dt
    node = pb.Expr(dtype=dtypes.to_enum(out))
    node.binary.op = op
    node.binary.a.CopyFrom(ea.node)
    node.binary.b.CopyFrom(eb.node)
    return Expr(node, out)


def call(op: int, *args) -> Expr:
    es = [as_expr(a) for a in args]
    dt = es[0].dtype
    for e in es[1:]:
        dt = promote(dt, e.dtype)
    es = [cast(e, dt) for e in es]
    node = pb.Expr(dtype=dtypes.to_enum(dt))
    node.call.op = op
    for e in es:
        node.call.args.add().CopyFrom(e.node)
    return Expr(node, dt)


def cast(value, dtype) -> Expr:
    """`value` converted to `dtype` (also TileLang's T.Cast; calling a dtype is the same:
    `T.float16(x)`). `T.cast(acc[i, j], "float16")`"""
    dtype = dtypes.canonical_name(dtype)
    e = as_expr(value, dtype if not isinstance(value, (Expr, Dim)) else None)
    if e.dtype == dtype:
        return e
    node = pb.Expr(dtype=dtypes.to_enum(dtype))
    node.cast.value.CopyFrom(e.node)
    return Expr(node, dtype)


def select(cond, a, b) -> Expr:
    c = as_expr(cond)
    if c.dtype != "bool":
        c = c != 0
    ea = a if isinstance(a, (Expr, Dim)) else None
    eb = b if isinstance(b, (Expr, Dim)) else None
    if ea is None and eb is None:
        ea = as_expr(a)
    ea = as_expr(a, as_expr(eb).dtype if ea is None else None)
    eb = as_expr(b, ea.dtype if eb is None else None)
    dt = promote(ea.dtype, eb.dtype)
    node = pb.Expr(dtype=dtypes.to_enum(dt))
    node.select.cond.CopyFrom(c.node)
    node.select.true_value.CopyFrom(cast(ea, dt).node)
    node.select.false_value.CopyFrom(cast(eb, dt).node)
    return Expr(node, dt)


def index_expr(value) -> Expr:
    e = as_expr(value)
    if not dtypes.is_int(e.dtype):
        raise definition_error(f"an index must be an integer, got {e.dtype}")
    return cast(e, "int32") if e.dtype != "int32" else e


SCOPE_NAMES = {pb.GLOBAL: "global", pb.SHARED: "shared", pb.FRAGMENT: "fragment",
               pb.LOCAL: "local", pb.BARRIER: "barrier"}


class BufferRef:
    """A buffer in a kernel: a tensor parameter (global) or an allocation. `buf[i, j]` loads an
    element; `buf[i, j] = v` stores one; inside T.copy, `buf[i, j]` names a tile's corner."""

    # No __slots__: T.alloc_var's LocalVar is both an Element (a value) and a BufferRef.

    def __init__(self, bid: int, name: str, dtype: str, shape: tuple, scope: int):
        self.bid, self.name, self.dtype, self.shape, self.scope = bid, name, dtype, shape, scope

    def __repr__(self):
        return f"<{SCOPE_NAMES[self.scope]} buffer {self.name} {self.shape} {self.dtype}>"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _indices(self, key) -> list[Expr]:
        key = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, slice) for k in key):
            raise definition_error(f"{self.name}[...]: slices are only allowed in tile operations")
        if len(key) != self.ndim:
            raise definition_error(
                f"{self.name} has {self.ndim} dims but was indexed with {len(key)}")
        return [index_expr(k) for k in key]

    def __getitem__(self, key) -> Element:
        if (isinstance(key, tuple) and any(isinstance(k, slice) for k in key)) or \
                isinstance(key, slice):
            return RegionRef(self, key if isinstance(key, tuple) else (key,))  # type: ignore
        idx = self._indices(key)
        node = pb.Expr(dtype=dtypes.to_enum(self.dtype))
        node.load.buffer = self.bid
        for i in idx:
            node.load.indices.add().CopyFrom(i.node)
        return Element(node, self.dtype, self, idx)

    def __setitem__(self, key, value) -> None:
        idx = self._indices(key)
        v = cast(value, self.dtype)
        stmt = pb.Stmt()
        stmt.store.buffer = self.bid
        for i in idx:
            stmt.store.indices.add().CopyFrom(i.node)
        stmt.store.value.CopyFrom(v.node)
        current().emit(stmt)


class Element(Expr):
    """A loaded element; tile operations read it as the corner of a region."""

    __slots__ = ("buffer", "indices")

    def __init__(self, node, dtype, buffer: BufferRef, indices: list[Expr]):
        super().__init__(node, dtype)
        self.buffer, self.indices = buffer, indices


def source(x) -> str:
    """A subscript part as the author wrote it: an Expr as source, an int as itself."""
    if isinstance(x, slice):
        parts = ["" if v is None else source(v) for v in (x.start, x.stop)]
        return ":".join(parts) + ("" if x.step is None else f":{source(x.step)}")
    return repr(x) if isinstance(x, (Expr, Dim)) else str(x)


def subscript_source(buffer: BufferRef, key: tuple) -> str:
    return f"{buffer.name}[{', '.join(source(k) for k in key)}]"


class RegionRef:
    """`buf[a:b, c:d]`: a tile of a buffer, for tile operations. An index names one element of
    its dim; a slice's extent `stop - start` must be a constant the arithmetic proves
    (`x:x + 64`, `bx * 64:(bx + 1) * 64`, `0:32`); `:` is the whole dim when its size is
    static."""

    def __init__(self, buffer: BufferRef, key: tuple):
        if len(key) != buffer.ndim:
            raise definition_error(
                f"{buffer.name} has {buffer.ndim} dims but was sliced with {len(key)}")
        self.buffer, self.key, self.offsets, self.extents = buffer, key, [], []
        for n, (k, dim) in enumerate(zip(key, buffer.shape, strict=True)):
            if not isinstance(k, slice):
                self.offsets.append(index_expr(k))
                self.extents.append(1)
                continue
            where = f"{subscript_source(buffer, key)}: the slice {source(k)}"
            if k.step not in (None, 1):
                raise definition_error(f"{where} has a step; tile slices have step 1")
            if k.stop is None and isinstance(dim, Dim):
                raise definition_error(
                    f"{where} spans dim {n} of {buffer.name}, whose size {dim.name} is only "
                    "known at launch; a tile slice needs a constant extent: write "
                    f"`start:start + n` with an int n (the tile's size)")
            start = index_expr(0 if k.start is None else k.start)
            stop = index_expr(dim if k.stop is None else k.stop)
            ext = constant_difference(stop.node, start.node)
            if ext is None:
                raise definition_error(
                    f"{where} has no constant extent: ({source(stop)}) - ({source(start)}) "
                    "depends on the values of the kernel; a tile slice needs a constant one: "
                    f"write `{source(start)}:{source(start)} + n` with an int n")
            if ext <= 0:
                raise definition_error(f"{where} has extent {ext}; a tile slice needs a "
                                       "positive extent")
            self.offsets.append(start)
            self.extents.append(ext)

    def __repr__(self):
        return subscript_source(self.buffer, self.key)
