"""The `rocm` backend: Tile IR -> TIR (lower.py: the CUDA lowering's walk with MFMA, wave64
and LDS) -> TVM's CUDA C++ codegen -> HIP source (source.py, with include/tiled_hip.h) ->
clang-22 / ld.lld-22 -> an HSACO code object v5 (toolchain/hip.py).

Targets `rocm:gfx942` (MI300) and `rocm:gfx90a` (MI200). Every artifact is read back
(codeobject.py) and checked against what the lowering planned before it is returned: machine
EM_AMDGPU and the gfx id, code object version 5, the kernel's metadata (wavefront 64, LDS
bytes = the shared pool, the workgroup limit covering the block, a kernarg layout matching
the kernel's parameters); the manifest carries the code object's facts (`code_object`).
No AMD GPU has run these kernels: they are compiled here and run on the CPU by the
emulation (emulate.py). TVM is imported when a kernel is compiled, not with this module.
"""

from __future__ import annotations

import time

from tiled.compiler.registry import Artifact, Backend, Target, register
from tiled.compiler.targets.rocm.limits import MAX_LDS
from tiled.errors import CompileError, UnsupportedTarget
from tiled.ir import dtypes
from tiled.ir.program import Program

ARCHS = ("gfx942", "gfx90a")
WAVEFRONT = 64


@register
class RocmBackend(Backend):
    name = "rocm"
    archs = ARCHS
    artifact_format = "hsaco"

    def parse_arch(self, arch: str | None) -> str:
        if arch is None:
            raise CompileError("rocm targets name an arch: rocm:gfx942 (MI300) or rocm:gfx90a "
                               "(MI200)")
        if arch not in ARCHS:
            raise UnsupportedTarget(f"rocm arch {arch} is not supported; supported: "
                                    f"{', '.join(ARCHS)}")
        return arch

    def generate_source(self, program: Program, arch: str):
        """(HIP source, the lowering)."""
        import tvm

        from tiled.compiler.targets.cuda.backend import register_pipeline
        from tiled.compiler.targets.cuda.kernel import lower_cuda
        from tiled.compiler.targets.rocm.lower import RocmLowering
        from tiled.compiler.targets.rocm.source import hip_source

        mod, low = lower_cuda(program, arch, lowering=RocmLowering)
        if low.pool_bytes > MAX_LDS:
            raise CompileError(
                f"kernel needs {low.pool_bytes / 1024:.0f} KiB of LDS (shared memory, pipeline "
                f"stages included), {arch} has {MAX_LDS // 1024} KiB per workgroup: reduce "
                "block sizes or num_stages")
        register_pipeline()
        # TVM prints the TIR as CUDA C++; sm_80 keeps float8 tiles as bytes, which the MFMA
        # gemm and tiled_hip.h's conversions read.
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
        ex = tvm.compile(mod, target=target, tir_pipeline="tiled_cuda")
        return hip_source(ex.mod.imports[0].inspect_source(), low.pool_bytes), low

    def compile(self, program: Program, target: Target, options: dict) -> Artifact:
        from tiled.compiler.targets.cuda.backend import kernel_args
        from tiled.compiler.targets.rocm.codeobject import read_code_object
        from tiled.compiler.toolchain.hip import compile_hsaco

        t0 = time.perf_counter()
        source, low = self.generate_source(program, target.arch)
        t1 = time.perf_counter()
        hsaco = compile_hsaco(source, target.arch)
        t2 = time.perf_counter()
        symbol, args = kernel_args(source, program, None, f"{program.name}_kernel")
        co = read_code_object(hsaco)
        info = check_code_object(co, target.arch, symbol, args, program, low.pool_bytes,
                                 low.launch_threads)
        return Artifact(data=hsaco, symbol=symbol, kernel_args=args, dynamic_smem_bytes=0,
                        block=(low.launch_threads, 1, 1), source=source, code_object=info,
                        stages={"lower": t1 - t0, "toolchain": t2 - t1})


def kernarg_size(arg: dict, program: Program) -> int:
    """Bytes of one kernel argument (a manifest kernel_args entry) in the kernarg segment."""
    if arg["kind"] == "tensor":
        return 8
    if arg["kind"] == "dim":
        return 8 if arg["dtype"] in ("int64", "uint64") else 4
    prm = program.proto.params[arg["param"]]
    var = next(v for v in program.proto.vars if v.id == prm.scalar)
    return dtypes.nbytes(var.dtype)


def check_code_object(co, arch: str, symbol: str, args: list, program: Program,
                      lds_bytes: int, threads: int) -> dict:
    """The manifest's `code_object` record, after checking the code object against what the
    lowering planned; CompileError naming the first mismatch (a toolchain or tiled bug)."""
    from tiled.compiler.targets.rocm.codeobject import EM_AMDGPU

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise CompileError(f"the {arch} code object of {symbol} fails a check: {what}")

    need(co.machine == EM_AMDGPU, f"ELF machine {co.machine}, not EM_AMDGPU ({EM_AMDGPU})")
    need(co.arch == arch, f"its gfx id is {co.arch}")
    need(co.code_object_version == 5, f"code object version {co.code_object_version}, not 5")
    k = co.kernel(symbol)
    need(k.get(".wavefront_size") == WAVEFRONT, f"wavefront size {k.get('.wavefront_size')}")
    # (LLVM may drop an LDS pool nothing reads.)
    need(k.get(".group_segment_fixed_size", -1) in (lds_bytes, 0),
         f"{k.get('.group_segment_fixed_size')} bytes of LDS, the pool has {lds_bytes}")
    need(k.get(".max_flat_workgroup_size", 0) >= threads,
         f"max workgroup size {k.get('.max_flat_workgroup_size')} < {threads} threads")
    explicit = [a for a in k.get(".args", ()) if not str(a.get(".value_kind", "")).startswith(
        "hidden_")]
    need(len(explicit) == len(args), f"{len(explicit)} kernel arguments in its metadata, "
         f"{len(args)} in the kernel's signature")
    layout = []
    for i, (meta, arg) in enumerate(zip(explicit, args, strict=True)):
        size = kernarg_size(arg, program)
        kind = "global_buffer" if arg["kind"] == "tensor" else "by_value"
        need(meta.get(".size") == size and meta.get(".value_kind") == kind,
             f"argument {i} is {meta.get('.value_kind')} of {meta.get('.size')} bytes, "
             f"expected {kind} of {size}")
        layout.append({"offset": int(meta[".offset"]), "size": size})
    return {
        "code_object_version": co.code_object_version, "isa": co.target, "arch": co.arch,
        "xnack": co.xnack, "sramecc": co.sramecc, "wavefront_size": WAVEFRONT,
        "lds_bytes": int(k[".group_segment_fixed_size"]),
        "kernarg_size": int(k[".kernarg_segment_size"]),
        "kernarg_align": int(k[".kernarg_segment_align"]), "kernarg": layout,
        "max_workgroup_size": int(k[".max_flat_workgroup_size"]),
        "vgpr_count": int(k.get(".vgpr_count", 0)), "sgpr_count": int(k.get(".sgpr_count", 0)),
        "agpr_count": int(k.get(".agpr_count", 0)),
        "vgpr_spill_count": int(k.get(".vgpr_spill_count", 0)),
        "sgpr_spill_count": int(k.get(".sgpr_spill_count", 0)),
        "private_segment_bytes": int(k.get(".private_segment_fixed_size", 0)),
    }
