"""The launch and the loops: `T.Kernel`, `T.Parallel`, `T.serial`, `T.unroll`, `T.vectorized`,
`T.Pipelined`.

Loops are Python generators that yield their variables once: the body runs once under trace
and is recorded into the loop's scope, which closes when the `for` statement asks for the next
item. (A `break` out of such a loop is an error: the trace cannot express it.)
"""

from __future__ import annotations

from contextlib import contextmanager

from tiled.lang.builder import current, definition_error, tracing
from tiled.lang.expr import Expr, as_expr, index_expr
from tiled.v1 import tile_ir_pb2 as pb


@contextmanager
def Kernel(*grid, threads: int = 128):
    """Launches the body on a grid of blocks of `threads` threads; binds the block indices.

    >>> with T.Kernel(T.ceildiv(N, 128), T.ceildiv(M, 128), threads=128) as (bx, by):
    ...     pass

    A 1-D grid binds one variable (`as bx`). On `cpu` the grid becomes parallel loops.
    Several `with T.Kernel` blocks one after another (TileLang's split-KV decode and its
    combine step) are launches run in that order: each traces into a program of its own
    (tiled.lang.kernel, `launches`); a trace records one of them, the others trace into a
    scratch builder that is dropped.
    """
    b = current()
    if b.kernel_open:
        raise definition_error("`with T.Kernel(...)` blocks do not nest")
    launch = b.kernels_seen
    b.kernels_seen += 1
    if launch != b.launch:
        with tracing(b.scratch()):
            with Kernel(*grid, threads=threads) as block_vars:
                yield block_vars
        return
    if not 1 <= len(grid) <= 3:
        raise definition_error(f"T.Kernel takes 1 to 3 grid extents, got {len(grid)}")
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 1024:
        raise definition_error(f"threads must be an int in 1..1024, got {threads!r}")
    k = b.program.kernel
    k.threads = threads
    k.loc.CopyFrom(b.location())
    names = ("bx", "by", "bz")
    block_vars = []
    for i, g in enumerate(grid):
        k.grid.add().CopyFrom(index_expr(g).node)
        vid = b.new_var(names[i])
        k.block_vars.append(vid)
        block_vars.append(Expr(pb.Expr(dtype=pb.INT32, var=vid), "int32"))
    b.kernel_open = True
    b.open_scope()
    try:
        yield block_vars[0] if len(block_vars) == 1 else tuple(block_vars)
    finally:
        body = b.close_scope()
        k.body.CopyFrom(body)
        b.kernel_open = False
        b.kernel_done = True


def _loop(extents, kind: int, num_stages: int = 0, names=("i", "j", "k", "l")):
    b = current()
    vars_, stmts = [], []
    for n, ext in enumerate(extents):
        start = 0
        if isinstance(ext, tuple):
            start, ext = ext
            ext = as_expr(ext) - start if not isinstance(ext, int) or \
                not isinstance(start, int) else ext - start
        e = index_expr(ext)
        vid = b.new_var(names[n % len(names)] if len(extents) > 1 else "i")
        stmt = pb.Stmt()
        stmt.loc.CopyFrom(b.location())
        stmt.for_.var = vid
        stmt.for_.extent.CopyFrom(e.node)
        stmt.for_.kind = kind
        stmt.for_.num_stages = num_stages
        stmts.append(stmt)
        v = Expr(pb.Expr(dtype=pb.INT32, var=vid), "int32")
        vars_.append(v + start if not (isinstance(start, int) and start == 0) else v)
        b.open_scope()
    closed = False
    try:
        yield vars_[0] if len(vars_) == 1 else tuple(vars_)
        closed = True
    finally:
        # Close inner loops first; each becomes the body of the one outside it.
        for stmt in reversed(stmts):
            body = b.close_scope()
            stmt.for_.body.CopyFrom(body)
            if stmt is not stmts[0]:
                b.scopes[-1].append(stmt)
        if closed:
            b.emit(stmts[0])
        else:
            # A `break` (or an exception) left the body; the trace reports it when it ends.
            b.broken_loop = b.broken_loop or stmts[0].loc


def _extent_args(args):
    if len(args) == 1:
        return args[0]
    if len(args) == 2:
        return tuple(args)
    raise definition_error("a loop takes (extent) or (start, stop)")


def Parallel(*extents, coalesced_width: int | None = None):
    """Iterations with no order between them, spread over the block's threads.

    `coalesced_width` is TileLang's hint for how many consecutive elements one thread handles;
    tiled checks it (a positive int) and drops it: its lowering derives the per-thread width
    from the fragment layouts and the target, so the hint never changes results or code.

    >>> for i, j in T.Parallel(128, 64):
    ...     C_local[i, j] = C_local[i, j] * 2
    >>> for i, j in T.Parallel(128, 64, coalesced_width=8):
    ...     B_shared[i, j] = A[by * 128 + i, j]
    """
    if not extents:
        raise definition_error("T.Parallel needs at least one extent")
    if coalesced_width is not None and (isinstance(coalesced_width, bool) or not isinstance(
            coalesced_width, int) or coalesced_width < 1):
        raise definition_error(f"T.Parallel: coalesced_width must be a positive int, got "
                               f"{coalesced_width!r}")
    return _loop(list(extents), pb.PARALLEL)


def serial(*args):
    """A sequential loop: `for k in T.serial(n)` or `T.serial(start, stop)`."""
    return _loop([_extent_args(args)], pb.SERIAL)


def unroll(*args):
    """A sequential loop the compiler unrolls: `for k in T.unroll(4)`."""
    return _loop([_extent_args(args)], pb.UNROLL)


def vectorized(*args):
    """A sequential loop whose iterations the target may run as vector lanes: same results as
    T.serial. Its body holds element statements only (stores, atomics, ifs, serial loops);
    `T.vectorized(start, stop)` also works. On `cpu` it becomes TVM's vectorized loop when the
    body is plain stores over at most 64 iterations (a constant extent), else a serial loop.

    >>> for i in T.Parallel(16):
    ...     for v in T.vectorized(8):
    ...         B_local[i * 8 + v] = A_shared[i * 8 + v]
    """
    return _loop([_extent_args(args)], pb.VECTORIZED)


Vectorized = vectorized  # TileLang's alias


def _ints(value) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= -1 for x in value)


def _int_list(value, what: str, nested: bool = False) -> list:
    ok = isinstance(value, (list, tuple)) and all(_ints(x) for x in value) if nested else \
        _ints(value)
    if not ok:
        kind = "a list of lists of ints" if nested else "a list of ints (-1: not scheduled)"
        raise definition_error(f"T.Pipelined: {what} must be {kind}, got {value!r}")
    return list(value)


def Pipelined(*args, num_stages: int | None = None, order=None, stage=None, sync=None,
              group=None):
    """A sequential loop whose global->shared copies run `num_stages` iterations ahead of the
    compute (cp.async on CUDA). Same results as T.serial; num_stages=0 is T.serial, as in
    TileLang.

    `order`, `stage`, `sync` and `group` are TileLang's hand schedule of the body's statements:
    tiled checks their form and drops them (its pipeline planner picks which copies run ahead),
    so they never change results. Without num_stages the depth is max(stage) + 1 when `stage`
    is given (TileLang's rule), else 2.

    >>> for k in T.Pipelined(T.ceildiv(K, 32), num_stages=3):
    ...     T.copy(A[by * 128, k * 32], A_shared)
    >>> for k in T.Pipelined(n, order=[-1, 0, 2, 1], stage=[-1, 0, 1, 1]):
    ...     pass
    """
    order = _int_list(order, "order") if order is not None else []
    stage = _int_list(stage, "stage") if stage is not None else []
    for name, value in (("sync", sync), ("group", group)):
        if value is not None:
            _int_list(value, name, nested=True)
    if order and stage and len(order) != len(stage):
        raise definition_error(f"T.Pipelined: order and stage name the same statements, but "
                               f"order has {len(order)} entries and stage {len(stage)}")
    if num_stages is None:
        num_stages = max(stage) + 1 if stage and max(stage) >= 0 else 2
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or \
            not 0 <= num_stages <= 8:
        raise definition_error(f"num_stages must be an int in 0..8, got {num_stages!r}")
    if num_stages == 0:  # TileLang: no pipelining
        return _loop([_extent_args(args)], pb.SERIAL)
    return _loop([_extent_args(args)], pb.PIPELINED, num_stages)


@contextmanager
def _branch():
    b = current()
    b.open_scope()
    yield


class _If:
    """`with T.If(cond): ...` followed optionally by `with T.Else(): ...`. A Python `if` on a
    traced value inside a @tiled.kernel body is rewritten into these.

    >>> with T.If(j < n):
    ...     Y[j] = X[j]
    >>> with T.Else():
    ...     Y[j] = 0.0
    """

    def __init__(self, cond):
        c = as_expr(cond)
        if c.dtype != "bool":
            c = c != 0
        self.cond = c

    def __enter__(self):
        current().open_scope()

    def __exit__(self, et, ev, tb):
        b = current()
        body = b.close_scope()
        if et is not None:
            return False
        stmt = pb.Stmt()
        stmt.if_then_else.cond.CopyFrom(self.cond.node)
        stmt.if_then_else.then_body.CopyFrom(body)
        b.emit(stmt)
        b.last_if[-1] = b.scopes[-1][-1].if_then_else
        return False


If = _If


class Else:
    """`with T.Else(): ...` directly after a `with T.If(cond):` block: runs where `cond` does
    not hold (see T.If). `with T.Else(): Y[j] = 0.0`"""

    def __enter__(self):
        b = current()
        target = b.last_if[-1]
        if target is None:
            raise definition_error("T.Else() must directly follow a T.If block")
        self.target = target
        b.open_scope()

    def __exit__(self, et, ev, tb):
        b = current()
        body = b.close_scope()
        if et is None:
            self.target.else_body.CopyFrom(body)
            b.last_if[-1] = None
        return False
