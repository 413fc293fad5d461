"""T.atomic_add / atomic_max / atomic_min on the CUDA lowering (lower.py): CUDA's atomicAdd
for the element types it takes, tiled_atomic.h's for the rest, with the memory order's
fences. Outside T.Parallel one thread updates for the block: a release covers every thread's
earlier accesses (a barrier, then that thread's fence), an acquire every thread's later ones
(its fence, then a barrier), and the previous value reaches every thread through a shared
slot of its own (pool.py's atomic slot). A T.Parallel nest of paired float32 adds over a
wgmma accumulator is parallel.py's (_paired_atomics)."""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

ATOMIC = {pb.ATOMIC_ADD: "atomicAdd", pb.ATOMIC_MAX: "tiled::atomic_max",
          pb.ATOMIC_MIN: "tiled::atomic_min"}
# The element types CUDA's atomicAdd takes; other integer adds go to tiled_atomic.h.
NATIVE_ADD = {"int32", "uint32", "float32", "float64", "float16", "bfloat16"}


def lower_atomic(low, st: pb.AtomicAdd, s: pb.Stmt) -> None:
    low.uniform_stmt(s)
    dt = dtypes.canonical_name(low.buffers[st.buffer].dtype)
    if dt == "bool" or dt.startswith("float8"):
        raise CompileError(f"atomic {('add', 'max', 'min')[st.op]} of {dt} elements is "
                           "not supported on cuda")
    name = ATOMIC[st.op] if st.op != pb.ATOMIC_ADD or dt in NATIVE_ADD else \
        "tiled::atomic_add"
    release = st.order in (pb.ORDER_RELEASE, pb.ORDER_ACQ_REL, pb.ORDER_SEQ_CST)
    acquire = st.order in (pb.ORDER_ACQUIRE, pb.ORDER_ACQ_REL, pb.ORDER_SEQ_CST)
    block = not low.nest_vars
    fence = "__threadfence" if st.order == pb.ORDER_SEQ_CST else "tiled::fence_acq_rel"
    slot = T.decl_buffer((1,), dt, data=low.pool.data,
                         elem_offset=low.atomic_slot // dtypes.nbytes(dt)) \
        if block and st.has_prev else None
    if block and (release or slot is not None):
        low.sync.sync()
    with low.single_thread():  # outside T.Parallel every thread runs it: one may update
        if release:
            T.evaluate(T.call_extern("void", fence))
        addr = low.addr(st.buffer, [low.expr(i) for i in st.indices])
        value = low.expr(st.value)
        update = T.call_extern(str(value.ty), name, addr, value)
        if not st.has_prev:
            T.evaluate(update)
        else:
            T.buffer_store(slot if slot is not None else low.tir[st.prev], update, [0])
        if acquire:
            T.evaluate(T.call_extern("void", fence))
    if block and (acquire or slot is not None):
        low.sync.sync()
    if slot is not None:
        T.buffer_store(low.tir[st.prev], slot[0], [0])
