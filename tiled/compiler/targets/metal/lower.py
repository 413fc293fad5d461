"""Lowers a Tile IR program to a Metal kernel in TIR: the CUDA lowering's statement walk with
the Metal target's instruction selection.

What runs unchanged from the CUDA walk (targets/cuda/lower.py): the shared pool and its
barrier placement (one `threadgroup` array; barriers print as `threadgroup_barrier`), copies
between fragments, threadgroup and device memory, T.Parallel nests, reductions and scans,
the T.Pipelined buffer. The Metal facts it is given: 32-thread simdgroups, vectors of at
most 4 lanes (float4, half4), a static pool (threadgroup memory is sized in the kernel),
T.Pipelined with at most two buffers (Metal has no asynchronous copy into threadgroup
memory: `tiled::cp_async` is a load and a store, so a deeper ring only costs memory), warp
shuffles as `simd_shuffle_xor` and whole-simdgroup reductions as `simd_sum` / `simd_max` /
`simd_min`. T.gemm goes to simdgroup matrices (gemm.py).

Refused with a located CompileError: the explicit Hopper path (T.ws, mbarriers, TMA), float8
(Apple GPUs have no float8 type), float64 (MSL has no double), atomics Metal lacks.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.targets.cuda.lower import CudaLowering
from tiled.compiler.targets.metal.gemm import gemm_scratch_bytes, lower_metal_gemm
from tiled.compiler.targets.metal.layouts import (
    MAX_THREADGROUP_MEMORY,
    MAX_VECTOR,
    SIMD_WIDTH,
    infer_layouts,
)
from tiled.compiler.targets.metal.resident import (
    SimdgroupTiles,
    copy_out_bytes,
    lower_copy_out,
    lower_fill,
    resident_accumulators,
)
from tiled.compiler.tir import loc_of
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.verify_ws import explicit_statement
from tiled.ir.walk import stmt_exprs, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb

# Element types simd_sum / simd_max / simd_min and simd_shuffle_xor take (MSL 3.0).
SIMD_TYPES = {"float32", "float16", "int32", "uint32", "int16", "uint16", "int8", "uint8"}
SIMD_REDUCE = {pb.REDUCE_SUM: "simd_sum", pb.REDUCE_MAX: "simd_max",
               pb.REDUCE_MIN: "simd_min", pb.REDUCE_ABSMAX: "simd_max"}
# Atomic read-modify-writes Metal has (atomic_fetch_*_explicit): op -> element types.
ATOMICS = {pb.ATOMIC_ADD: {"int32", "uint32", "float32"},
           pb.ATOMIC_MAX: {"int32", "uint32", "float32"},
           pb.ATOMIC_MIN: {"int32", "uint32", "float32"}}
_ATOMIC_NAMES = {pb.ATOMIC_ADD: "tiled::atomic_add", pb.ATOMIC_MAX: "tiled::atomic_max",
                 pb.ATOMIC_MIN: "tiled::atomic_min"}
# Transcendentals of float16 values computed in float32 and rounded once: TVM's Metal
# expansions (tanh as (e^2x - 1) / (e^2x + 1), erf's polynomial, sigmoid) lose digits to
# cancellation in half (tanh: 4e-3 relative error near 0). bfloat16 math is float32 already
# (TVM's bfloat16 legalization).
PROMOTE_F16 = {pb.EXP, pb.EXP2, pb.LOG, pb.LOG2, pb.TANH, pb.SIGMOID, pb.ERF, pb.SIN, pb.COS,
               pb.POW, pb.SQRT, pb.RSQRT}
_NO_TYPE = {"float64": "MSL has no double: compute in float32",
            "float8_e4m3": "Apple GPUs have no float8 type: store float16 or bfloat16",
            "float8_e5m2": "Apple GPUs have no float8 type: store float16 or bfloat16"}


def refuse_unsupported(program: pb.Program, target: str) -> None:
    """Raises a located CompileError for what no Metal kernel can do (module docstring)."""
    found = explicit_statement(program)
    if found is not None:
        raise CompileError(f"{found[0]} is part of the explicit Hopper path (mbarriers, TMA, "
                           f"warpgroups): it compiles for cuda:sm_90a only, not {target} "
                           "(Apple GPUs have none of them: write the kernel with T.copy, "
                           "T.gemm and T.Pipelined)", loc_of(found[1]))
    for b in program.buffers:
        why = _NO_TYPE.get(dtypes.canonical_name(b.dtype))
        if why:
            loc = f"{b.loc.file}:{b.loc.line}" if b.HasField("loc") and b.loc.file else ""
            raise CompileError(f"{b.name or 'a buffer'} is {dtypes.canonical_name(b.dtype)}, "
                               f"which {target} kernels cannot hold: {why}", loc)
    for v in program.vars:
        why = _NO_TYPE.get(dtypes.canonical_name(v.dtype))
        if why:
            raise CompileError(f"scalar {v.name or 'a variable'} is "
                               f"{dtypes.canonical_name(v.dtype)} ({target}): {why}")
    for st in walk(program.kernel.body):
        for e in _exprs(st):
            why = _NO_TYPE.get(dtypes.canonical_name(e.dtype)) if e.dtype else None
            if why:
                raise CompileError(f"an expression of type {dtypes.canonical_name(e.dtype)} "
                                   f"({target}): {why}", loc_of(st))


def _exprs(st: pb.Stmt):
    for e in stmt_exprs(st):
        yield from subexprs(e)


class MetalLowering(CudaLowering):
    warp_size = SIMD_WIDTH
    shuffle_dtypes = frozenset({"float32", "int32", "uint32"})
    rows_layouts: tuple[type, ...] = ()
    mma_layouts: tuple[type, ...] = ()
    max_vector = MAX_VECTOR
    pool_scope = "shared"
    max_stages = 2
    smem_limit = MAX_THREADGROUP_MEMORY

    def __init__(self, program: Program, arch: str, warp_specialize: bool = False):
        del warp_specialize  # (kernel.lower_cuda's signature) nothing to specialize
        refuse_unsupported(program.proto, f"metal:{arch}")
        super().__init__(program, arch, warp_specialize=False, whole_kernel=False)

    def infer_layouts(self, p: pb.Program, accumulators: dict | None) -> dict[int, object]:
        return {**infer_layouts(p, self.arch), **resident_accumulators(p, self.arch)}

    def resident(self, bid: int) -> bool:
        """Whether fragment `bid` lives in simdgroup matrices (resident.py)."""
        return isinstance(self.layouts.get(bid), SimdgroupTiles)

    def copy_scratch_bytes(self, _low, c: pb.Copy) -> int:
        if self.resident(c.src.buffer):
            return copy_out_bytes(self, c)
        return super().copy_scratch_bytes(self, c)

    def stmt_fill(self, f, s):
        if self.resident(f.dst.buffer):
            return lower_fill(self, f, s)
        return super().stmt_fill(f, s)

    def stmt_copy(self, c, s):
        if self.resident(c.src.buffer):
            return lower_copy_out(self, c, s)
        return super().stmt_copy(c, s)

    def expr(self, e):
        if e.WhichOneof("kind") == "call" and e.call.op in PROMOTE_F16 and \
                dtypes.canonical_name(e.dtype) == "float16":
            from tiled.compiler.tir import _CALL

            args = [tirx.Cast("float32", self.expr(a)) for a in e.call.args]
            return tirx.Cast("float16", _CALL[e.call.op](*args))
        return super().expr(e)

    def gemm_scratch_bytes(self, _low, g: pb.Gemm) -> int:
        return gemm_scratch_bytes(self, g)

    def uses_scratch(self, st: pb.Stmt) -> bool:
        if st.WhichOneof("kind") == "gemm":
            return gemm_scratch_bytes(self, st.gemm) > 0
        if st.WhichOneof("kind") == "copy" and self.resident(st.copy.src.buffer):
            return True
        return super().uses_scratch(st)

    def shfl_xor(self, dtype: str, value, mask: int):
        self._simd_type(dtype, "a lane exchange")
        return T.call_extern(dtype, "simd_shuffle_xor", value, tirx.const(mask, "uint16"))

    def shfl_idx(self, dtype: str, value, lane):
        self._simd_type(dtype, "a lane exchange")
        return T.call_extern(dtype, "simd_shuffle", value, lane)  # an int: MSL converts it

    def warp_allreduce(self, kind: int, part, combine) -> None:
        self._simd_type(part.dtype, "a simdgroup reduction")
        T.buffer_store(part, T.call_extern(part.dtype, SIMD_REDUCE[kind], part[0]), [0])

    def _simd_type(self, dtype: str, what: str) -> None:
        if dtype not in SIMD_TYPES:
            raise CompileError(f"{what} of {dtype} values: Metal's simd functions take 8-, "
                               "16- and 32-bit values only; reduce in float32 or int32")

    def stmt_gemm(self, g, s):
        lower_metal_gemm(self, g, s)

    def stmt_grid_dependency(self, _g, _s):
        """T.pdl_sync / T.pdl_trigger: Metal runs a queue's dispatches in order; nothing to
        do."""

    def stmt_atomic_add(self, st, s):
        dt = dtypes.canonical_name(self.buffers[st.buffer].dtype)
        op = ("add", "max", "min")[st.op]
        if dt not in ATOMICS[st.op]:
            raise CompileError(f"atomic {op} of {dt} elements is not supported on "
                               f"metal:{self.arch} (Metal has atomic add / max / min of int, "
                               "uint and float)")
        if st.order != pb.ORDER_RELAXED or st.has_prev:
            raise CompileError(f"atomic {op} with memory_order or return_prev is not supported "
                               f"on metal:{self.arch}: Metal's device atomics are relaxed, and "
                               "its threadgroups have no device-scope fence tiled relies on")
        self.uniform_stmt(s)
        with self.single_thread():
            addr = self.addr(st.buffer, [self.expr(i) for i in st.indices])
            value = self.expr(st.value)
            if str(value.ty) != dt:
                value = tirx.Cast(dt, value)
            T.evaluate(T.call_extern(dt, _ATOMIC_NAMES[st.op], addr, value))
