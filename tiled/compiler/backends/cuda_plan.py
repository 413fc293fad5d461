"""Helpers of the CUDA lowering: shared-pool placement, alignment proofs, barrier placement
and statement walks over the Tile IR."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.irwalk import (
    element_accesses,
    expr_vars,
    lanes_independent,
    stmt_exprs,
    subexprs,
    walk,
)
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

# C types of the element types, as the generated CUDA names them.
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
         "int8": "int8_t", "int32": "int", "int64": "int64_t", "uint8": "uint8_t",
         "float8_e4m3": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}

POOL_ALIGN = 128


@dataclass
class SharedTile:
    """Where a shared tile lives in the pool: `rows` x `cols` logical (leading dims flattened
    into rows), each row padded to `stride` elements, `stages` copies back to back."""

    rows: int
    cols: int
    stride: int
    stages: int
    offset: int  # bytes from the pool start
    dtype: str

    @property
    def stage_elems(self) -> int:
        return self.rows * self.stride

    @property
    def nbytes(self) -> int:
        return self.stages * self.stage_elems * dtypes.nbytes(self.dtype)


def align_up(n: int, a: int = POOL_ALIGN) -> int:
    return -(-n // a) * a


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


class SyncTracker:
    """Barrier placement: a __syncthreads() goes before a shared-memory write that follows
    unsynchronized shared accesses, and before a read that follows an unsynchronized write.
    Inside a T.Parallel nest the tracker is suspended: that code runs per thread (possibly under
    a per-thread condition), where a barrier would deadlock; the nest's accesses are accounted
    for once, before it starts."""

    def __init__(self, barrier: str | None = None):
        self.pending_read = self.pending_write = False
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

    def sync(self) -> None:
        if self.suspended:
            return
        if self.barrier is None:
            T.evaluate(T.tvm_storage_sync("shared"))
        else:
            T.evaluate(T.call_extern("void", self.barrier))
        self.pending_read = self.pending_write = False


def and_all(conds):
    out = None
    for c in conds:
        if c is None:
            continue
        out = c if out is None else tirx.And(out, c)
    return out


def unravel_dyn(flat, extents):
    out = []
    for e in reversed(extents):
        out.append(tirx.floormod(flat, e))
        flat = tirx.floordiv(flat, e)
    return list(reversed(out))


def shared_effects(s: pb.Stmt, buffers, scratch=None) -> tuple[bool, bool]:
    """(reads shared memory, writes shared memory) for statement `s` and all inside it.
    `scratch(st)`: whether tile op `st` also reads and writes the shared scratch area (a
    fragment moved through it: cuda_copy, cuda_gemm, cuda_scan)."""
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
            reads = writes = True
        elif kind in ("store", "atomic_add"):
            writes |= shared(getattr(st, kind).buffer)
        if scratch is not None and kind in ("copy", "gemm") and scratch(st):
            reads = writes = True
        if kind in ("store", "atomic_add", "if_then_else", "for_", "copy", "fill"):
            for e in stmt_exprs(st):
                for sub in subexprs(e):
                    if sub.WhichOneof("kind") == "load":
                        reads |= shared(sub.load.buffer)
    return reads, writes


_VECTOR_DTYPES = {pb.FLOAT32, pb.FLOAT16, pb.INT32}


def vector_lanes_ok(f: pb.For, lanes: int, buffers) -> bool:
    """Whether T.vectorized loop `f` of `lanes` constant iterations can become TVM vector
    lanes safely. TVM widens `buf[base + v]` into one vector access without proving it
    aligned (a misaligned vector access faults), so every element access that depends on
    the loop var must be `base + v` in its last dim with `base` a provable multiple of the
    lanes and rows of a whole number of vectors (static shape, or a shared tile's padded
    stride that keeps it: the lowering checks shared tiles), 4 to 16 bytes of a float32,
    float16 or int32 buffer, and not a fragment spread over threads; the body holds element
    stores (under conditions) only, each to an element of its own iteration, and reads a
    buffer it stores to only at the element it stores (the loop is serial in the Tile IR:
    lanes must not see each other's writes). Anything else runs as an unrolled loop."""
    if lanes not in (2, 4, 8, 16):
        return False
    for st in walk(f.body):
        kind = st.WhichOneof("kind")
        if kind not in ("seq", "store", "if_then_else"):
            return False
    if not lanes_independent(f):
        return False
    v = f.var
    for bid, idx in element_accesses(f.body):
        if not idx or v not in expr_vars(idx):
            continue
        b = buffers[bid]
        if b.dtype not in _VECTOR_DTYPES or lanes * dtypes.nbytes(b.dtype) not in (4, 8, 16):
            return False
        if b.scope == pb.FRAGMENT or v in expr_vars(idx[:-1]):
            return False
        last = idx[-1]
        if last.WhichOneof("kind") == "var" and last.var == v:
            base = None
        elif last.WhichOneof("kind") == "binary" and last.binary.op == pb.ADD:
            a, c = last.binary.a, last.binary.b
            if a.WhichOneof("kind") == "var" and a.var == v:
                base = c
            elif c.WhichOneof("kind") == "var" and c.var == v:
                base = a
            else:
                return False
            if v in expr_vars([base]) or not multiple_of(base, lanes):
                return False
        else:
            return False
        if b.scope != pb.SHARED and len(b.shape) > 1 and (
                b.shape[-1].WhichOneof("kind") != "size" or b.shape[-1].size % lanes):
            return False
    return True
