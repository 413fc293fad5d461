"""The explicit Hopper path (cuda:sm_90a): warpgroup regions, mbarriers and TMA copies, for
authors who schedule producer / consumer kernels by hand.

Who runs what: a statement runs on every thread of its enclosing region, as everywhere in
tiled; `with T.ws(g):` makes that region warpgroup g (threads 128 * g .. 128 * g + 127), and the
tile ops inside it (T.gemm, T.copy, T.fill, T.Parallel) are shared out over those 128 threads.
On top of that:

- `T.mbarrier_arrive(bar)`: every thread that runs it arrives once, so a barrier that one
  warpgroup arrives on needs `arrive_count=128`;
- `T.mbarrier_expect_tx(bar, n)` and `T.tma_copy(...)`: issued once, by the first thread of the
  region;
- `T.mbarrier_wait_parity(bar, p)`: every thread waits until the phase of parity p completed.

A phase completes when `arrive_count` arrivals happened and every byte announced with
T.mbarrier_expect_tx has landed (TMA copies report theirs). A fresh barrier counts as having
completed a phase of parity 1, so a producer's first wait on an "empty" barrier with parity 1
returns at once. Misuse that can be seen statically (waiting on a buffer that is not a barrier,
waiting on a barrier nothing arrives on, TMA bytes no expect_tx announces, bad warpgroups) is
rejected when the kernel is traced (tiled.ir.verify_ws).
"""

from __future__ import annotations

from contextlib import contextmanager

from tiled.lang.builder import current, definition_error
from tiled.lang.expr import BufferRef, Element, index_expr
from tiled.lang.tileops import copy_stmt
from tiled.v1 import tile_ir_pb2 as pb


def alloc_barrier(num: int, arrive_count: int = 1, name: str | None = None) -> BufferRef:
    """`num` mbarriers in shared memory, each completing a phase after `arrive_count` arrivals;
    initialized by the kernel before its body runs. Index it to name one: `full[s]`.

    >>> full = T.alloc_barrier(3, arrive_count=128)   # one per stage, one warpgroup arrives
    """
    b = current()
    if not b.kernel_open:
        raise definition_error("allocate barriers inside `with T.Kernel(...)`")
    for what, v in (("num", num), ("arrive_count", arrive_count)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise definition_error(f"T.alloc_barrier: {what} must be a positive int, got {v!r}")
    name = name or f"bar{len(b.program.buffers)}"
    buf = b.new_buffer(name, "uint64", [num], pb.BARRIER)
    buf.arrive_count = arrive_count
    buf.loc.CopyFrom(b.location())
    return BufferRef(buf.id, name, "uint64", (num,), pb.BARRIER)


def _barrier_ref(bar, what: str) -> pb.BarrierRef:
    """`bar[i]` (or a whole barrier array of one) as a BarrierRef. Any buffer is accepted here:
    the verifier names the misuse of one that is not a barrier, at the author's line."""
    ref = pb.BarrierRef()
    if isinstance(bar, Element):
        if len(bar.indices) != 1:
            raise definition_error(f"{what}: barriers are 1-d; name one as bar[i]")
        ref.barrier = bar.buffer.bid
        ref.index.CopyFrom(bar.indices[0].node)
    elif isinstance(bar, BufferRef) and bar.shape == (1,):
        ref.barrier = bar.bid
        ref.index.CopyFrom(index_expr(0).node)
    else:
        raise definition_error(f"{what}: expected one barrier, bar[i] (from T.alloc_barrier), "
                               f"got {type(bar).__name__}")
    return ref


def _mbarrier(kind: int, bar, value, what: str) -> None:
    stmt = pb.Stmt()
    op = stmt.mbarrier
    op.kind = kind
    op.barrier.CopyFrom(_barrier_ref(bar, what))
    if value is not None:
        op.value.CopyFrom(index_expr(value).node)
    current().emit(stmt)


def mbarrier_arrive(bar) -> None:
    """Every thread that runs this arrives once on `bar` (release: its earlier shared-memory
    accesses are visible to threads that then see the phase complete).

    >>> T.mbarrier_arrive(empty[k % 3])
    """
    _mbarrier(pb.MBARRIER_ARRIVE, bar, None, "T.mbarrier_arrive")


def mbarrier_wait_parity(bar, parity) -> None:
    """Every thread waits until the phase of `bar` with parity `parity` (0 or 1) completed
    (acquire: TMA data of that phase is visible afterwards).

    >>> T.mbarrier_wait_parity(full[k % 3], (k // 3) % 2)
    """
    _mbarrier(pb.MBARRIER_WAIT_PARITY, bar, parity, "T.mbarrier_wait_parity")


def mbarrier_expect_tx(bar, nbytes) -> None:
    """The first thread of the region announces `nbytes` more bytes (TMA copies) for the current
    phase of `bar`; the phase completes only once they landed. It does not arrive.

    >>> T.mbarrier_expect_tx(full[s], (128 * 64 + 64 * 128) * 2)
    """
    _mbarrier(pb.MBARRIER_EXPECT_TX, bar, nbytes, "T.mbarrier_expect_tx")


def tma_copy(src, dst, barrier) -> None:
    """A TMA copy of a 2-d global tile into a whole shared tile (or one stage of a staged one),
    issued by the first thread of the region; its bytes complete on `barrier`, whose phase must
    expect them (T.mbarrier_expect_tx). Parts past the tensor's end arrive as zeros and count.

    >>> T.tma_copy(A[by * 128, k * 64], A_s[k % 3, :, :], full[k % 3])
    """
    stmt = copy_stmt(src, dst)
    stmt.copy.tma.CopyFrom(_barrier_ref(barrier, "T.tma_copy"))
    current().emit(stmt)


def fence_proxy_async() -> None:
    """Orders the running threads' earlier shared-memory writes before later TMA / async-proxy
    accesses of that memory. `T.fence_proxy_async()`"""
    stmt = pb.Stmt()
    stmt.fence_proxy_async.SetInParent()
    current().emit(stmt)


@contextmanager
def ws(group: int, regs: int = 0):
    """A region run only by warpgroup `group` (threads 128 * group .. 128 * group + 127); the
    kernel's threads must be a multiple of 128. `regs` (24..256, a multiple of 8) resets the
    warpgroup's registers per thread on entry (setmaxnreg): below the launch's budget, 65536 /
    threads rounded down to 8 (at most 256), it gives registers back; above it, it takes them.

    >>> with T.ws(1, regs=40):    # the TMA producer
    ...     pass
    """
    for what, v in (("group", group), ("regs", regs)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise definition_error(f"T.ws: {what} must be an int >= 0, got {v!r}")
    b = current()
    stmt = pb.Stmt()
    stmt.loc.CopyFrom(b.location())
    stmt.warp_group.group, stmt.warp_group.regs = group, regs
    b.open_scope()
    try:
        yield
    finally:
        body = b.close_scope()
    stmt.warp_group.body.CopyFrom(body)
    b.emit(stmt)
