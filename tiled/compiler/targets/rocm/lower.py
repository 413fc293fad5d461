"""Lowers a Tile IR program to a ROCm kernel in TIR: the CUDA lowering's statement walk with
the ROCm target's instruction selection.

The walk, the shared pool, the barrier placement and the op modules of the CUDA lowering
that are target-neutral (copies between fragments, shared and global memory; T.Parallel
nests; reductions and scans; the T.Pipelined multi-stage LDS buffer) run unchanged, with
the target facts they ask for: 64-lane wavefronts (reduction butterflies, the cross-wave
scratch combine), the MFMA accumulator and rows layouts (layouts.py) as the anchors of
layout inference. T.gemm goes to MFMA (gemm.py). The CUDA-only paths (wgmma, TMA, warp
specialization, the explicit T.ws path) are never planned here, and a program that asks for
them by name is refused with its source location.

The calls the walk emits name the functions of tiled_hip.h (include/), which implements
them for AMDGPU and, with tiled_hip_cpu.h, for the CPU emulation: `tiled::cp_async<N>` is
a synchronous LDS fill there (AMDGPU has no asynchronous global -> LDS copy of arbitrary
lanes), so a T.Pipelined loop is a multi-stage LDS buffer whose loads are issued
`num_stages - 1` iterations ahead of their use.
"""

from __future__ import annotations

from tiled.compiler.targets.cuda.lower import CudaLowering
from tiled.compiler.targets.rocm.gemm import lower_mfma_gemm
from tiled.compiler.targets.rocm.layouts import (
    ROWS_LAYOUTS,
    WAVE,
    MfmaLayout,
    RocmAnchors,
    infer_layouts,
)
from tiled.compiler.targets.rocm.limits import MAX_LDS
from tiled.compiler.tir import loc_of
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.verify_ws import explicit_statement
from tiled.v1 import tile_ir_pb2 as pb

# Float64 math AMDGPU has no instruction for (LLVM cannot expand it without ocml); float32
# and 16-bit forms are tiled_hip.h's own.
NO_FLOAT64 = {pb.EXP: "exp", pb.EXP2: "exp2", pb.LOG: "log", pb.LOG2: "log2", pb.TANH: "tanh",
              pb.SIGMOID: "sigmoid", pb.ERF: "erf", pb.SIN: "sin", pb.COS: "cos",
              pb.POW: "pow"}


def refuse_cuda_only(program: pb.Program, target: str) -> None:
    """Raises a located CompileError when `program` uses what only cuda:sm_90a has (the
    explicit Hopper path: T.ws regions, mbarriers, TMA copies, proxy fences)."""
    found = explicit_statement(program)
    if found is not None:
        raise CompileError(f"{found[0]} is part of the explicit Hopper path (mbarriers, TMA, "
                           f"warpgroups): it compiles for cuda:sm_90a only, not {target} (AMD "
                           "GPUs have no TMA, wgmma or mbarriers: write the kernel with "
                           "T.copy, T.gemm and T.Pipelined)", loc_of(found[1]))


class RocmLowering(CudaLowering):
    warp_size = WAVE
    rows_layouts = ROWS_LAYOUTS
    mma_layouts = (MfmaLayout,)
    max_vector = RocmAnchors.max_vector
    smem_limit = MAX_LDS

    def __init__(self, program: Program, arch: str, warp_specialize: bool = False):
        del warp_specialize  # (kernel.lower_cuda's signature) nothing to specialize on AMD
        refuse_cuda_only(program.proto, f"rocm:{arch}")
        super().__init__(program, arch, warp_specialize=False, whole_kernel=False)

    def expr(self, e):
        if e.WhichOneof("kind") == "call" and e.call.op in NO_FLOAT64 and \
                dtypes.canonical_name(e.dtype) == "float64":
            raise CompileError(f"T.{NO_FLOAT64[e.call.op]} of float64 needs ROCm's device "
                               f"library (ocml), which rocm:{self.arch} kernels do not link: "
                               "compute it in float32")
        return super().expr(e)

    def infer_layouts(self, p: pb.Program, accumulators: dict | None) -> dict[int, object]:
        return infer_layouts(p, self.arch)

    def stmt_gemm(self, g, s):
        lower_mfma_gemm(self, g, s)

    def stmt_grid_dependency(self, _g, _s):
        """T.pdl_sync / T.pdl_trigger: HIP launches kernels in stream order; nothing to do."""

    def stmt_atomic_add(self, st, s):
        dt = dtypes.canonical_name(self.buffers[st.buffer].dtype)
        if dt == "bool" or dt.startswith("float8"):
            raise CompileError(f"atomic {('add', 'max', 'min')[st.op]} of {dt} elements is "
                               f"not supported on rocm:{self.arch}")
        super().stmt_atomic_add(st, s)
