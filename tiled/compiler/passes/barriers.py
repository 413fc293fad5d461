"""Barrier placement for shared memory: which statements read or write it, and where a
block-wide barrier must go between them."""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

from tiled.ir.walk import stmt_exprs, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb


class SyncTracker:
    """Barrier placement: a __syncthreads() goes before a shared-memory write that follows
    unsynchronized shared accesses, and before a read that follows an unsynchronized write.
    Inside a T.Parallel nest the tracker is suspended: that code runs per thread (possibly under
    a per-thread condition), where a barrier would deadlock; the nest's accesses are accounted
    for once, before it starts."""

    def __init__(self, barrier: str | None = None):
        self.pending_read = self.pending_write = False
        # shared writes (by the threads, the generic proxy) that no proxy fence has ordered
        # before a read by the asynchronous proxy (wgmma, TMA stores) yet: a barrier orders
        # them for the threads only, so a barrier does not clear this
        self.unfenced = False
        self.suspended = 0
        self.barrier = barrier  # an extern call instead of __syncthreads() (named barriers)

    def before(self, reads: bool, writes: bool) -> None:
        if self.suspended:
            return
        if (writes and (self.pending_read or self.pending_write)) or \
                (reads and self.pending_write):
            self.sync()
        self.pending_read |= reads
        self.pending_write |= writes
        self.unfenced |= writes

    def sync(self) -> None:
        if self.suspended:
            return
        if self.barrier is None:
            T.evaluate(T.tvm_storage_sync("shared"))
        else:
            T.evaluate(T.call_extern("void", self.barrier))
        self.pending_read = self.pending_write = False


def shared_effects(s: pb.Stmt, buffers, scratch=None) -> tuple[bool, bool]:
    """(reads shared memory, writes shared memory) for statement `s` and all inside it.
    `scratch(st)`: whether tile op `st` also reads and writes the shared scratch area (a
    fragment moved through it: copy, gemm, reduce, scan); without it a reduction or scan
    counts as reading and writing shared memory."""
    reads = writes = False
    for st in walk(s):
        kind = st.WhichOneof("kind")
        shared = lambda bid: buffers[bid].scope == pb.SHARED  # noqa: E731
        if kind == "copy" and not st.copy.HasField("tma"):
            # A TMA copy's writes are ordered by its mbarrier, which bar.sync cannot replace.
            reads |= shared(st.copy.src.buffer)
            writes |= shared(st.copy.dst.buffer)
        elif kind == "gemm":
            reads |= shared(st.gemm.a) or shared(st.gemm.b)
        elif kind == "fill":
            writes |= shared(st.fill.dst.buffer)
        elif kind in ("reduce", "scan"):
            node = getattr(st, kind)
            if scratch is None:  # where it may go through shared memory is not known
                reads = writes = True
            reads |= shared(node.src)
            writes |= shared(node.dst)
        elif kind in ("store", "atomic_add"):
            writes |= shared(getattr(st, kind).buffer)
        if scratch is not None and kind in ("copy", "gemm", "reduce", "scan") and scratch(st):
            reads = writes = True
        if kind in ("store", "atomic_add", "if_then_else", "for_", "copy", "fill"):
            for e in stmt_exprs(st):
                for sub in subexprs(e):
                    if sub.WhichOneof("kind") == "load":
                        reads |= shared(sub.load.buffer)
    return reads, writes
