"""The `cuda` backend: Tile IR -> TIR (lower.py) -> TVM's CUDA C++ codegen -> cubin.

Targets `cuda:sm_80` and `cuda:sm_90a`. Tensor-core gemm and async copies are calls into
the headers of include/, which are prepended to TVM's source. On sm_90a the lowering picks
per op (wgmma where a gemm fits it, gemm_sm90.py) and per loop (a TMA producer warpgroup for
a T.Pipelined loop whose copies can run ahead, ws_loop.py); one whole-kernel path remains:
sm90_attn.py takes the attention kernel it recognizes (the option whole_kernel_paths off
turns it away; paths.py). TVM is imported when a kernel is compiled, not with
this module: parsing a target or computing a key never loads it.
"""

from __future__ import annotations

from typing import ClassVar

from tiled.compiler.registry import Artifact, Backend, Option, Target, option, register
from tiled.compiler.stages import timed
from tiled.compiler.targets.cuda.limits import ARCHS, MAX_SMEM
from tiled.compiler.targets.cuda.tma import SIGNATURE, with_tensor_maps
from tiled.compiler.toolchain.nvcc import compile_cubin
from tiled.errors import CompileError
from tiled.ir.program import Program

FALLBACK_SUFFIX = "_fallback"  # the variant without TMA, for launches its preconditions fail


def _tiled_pipeline():
    """TVM's tirx lowering without its barrier insertion and shared-memory merging: tiled owns
    the shared pool and places every barrier itself."""
    import tvm
    from tvm import tirx
    from tvm.backend.cuda import transforms as cuda_transforms
    from tvm.tirx.compilation_pipeline import finalize_device_passes, finalize_host_passes

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod, _ctx):
        passes = [
            tirx.transform.StmtSimplify(),
            tirx.transform.FlattenBuffer(),
            tirx.transform.BF16ComputeLegalize(),
            tirx.transform.NarrowDataType(32),
            tirx.transform.VectorizeLoop(True),
            tirx.transform.UnrollLoop(),
            tirx.transform.StmtSimplify(),
            tirx.transform.FP8ComputeLegalize(),
            tirx.transform.VerifyMemory(),
            tirx.transform.AnnotateEntryFunc(),
            tirx.transform.SplitHostDevice(),
            cuda_transforms.LowerIket(),
            # After the split: run before it, CSE may bind an expression of the dims that both
            # the launch extents and the kernel use outside the kernel, and the kernel then
            # takes it as an extra parameter no program parameter matches.
            tirx.transform.CommonSubexprElim(),
            tirx.transform.MakePackedAPI(),
            tirx.transform.FP8StorageLegalize(),
            tirx.transform.BF16StorageLegalize(),
        ]
        return tvm.ir.transform.Sequential(passes)(mod)

    return _pipeline, finalize_host_passes, finalize_device_passes


def register_pipeline() -> None:
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP

    PIPELINE_MAP.setdefault("tiled_cuda", _tiled_pipeline)


def kernel_args(source: str, program: Program, tensor_maps: dict[str, dict] | None = None,
                symbol: str | None = None) -> tuple[str, list[dict]]:
    """The kernel symbol and its C parameter list, mapped onto the program's parameters (and
    the TMA descriptors of the sm90 path, `tensor_maps`: parameter name -> recipe). `symbol`
    picks one kernel of a source that holds several (default: the first)."""
    m = next((m for m in SIGNATURE.finditer(source) if symbol in (None, m.group(1))), None)
    if not m:
        raise CompileError(f"generated CUDA source has no kernel signature"
                           f"{f' for {symbol}' if symbol else ''}")
    symbol, params = m.group(1), [p.strip() for p in m.group(2).split(",") if p.strip()]
    p = program.proto
    by_ptr = {f"{prm.name}_ptr": i for i, prm in enumerate(p.params)
              if prm.WhichOneof("kind") == "buffer"}
    by_scalar = {prm.name: i for i, prm in enumerate(p.params)
                 if prm.WhichOneof("kind") == "scalar"}
    from tiled.compiler.manifest import dim_names

    dims = set(dim_names(p).values())
    out = []
    for decl in params:
        name = decl.split()[-1]
        ctype = " ".join(decl.split()[:-1])
        if name.endswith("_desc") and name[:-5] in (tensor_maps or {}):
            out.append(dict(tensor_maps[name[:-5]]))  # type: ignore[index]
        elif name in by_ptr:
            out.append({"kind": "tensor", "param": by_ptr[name]})
        elif name in by_scalar:
            out.append({"kind": "scalar", "param": by_scalar[name]})
        elif name in dims:
            out.append({"kind": "dim", "name": name,
                        "dtype": "int64" if "int64" in ctype else "int32"})
        else:
            raise CompileError(f"kernel parameter {decl!r} matches no program parameter")
    return symbol, out


@register
class CudaBackend(Backend):
    name = "cuda"
    archs = ARCHS
    artifact_format = "cubin"
    options: ClassVar[dict[str, Option]] = {
        "warp_specialize": Option(bool, True, "sm_90a: take the warp-specialized TMA + wgmma "
                                  "paths where a kernel fits them"),
        "pingpong": Option(bool, False, "sm_90a T.Pipelined loops fed by a TMA producer, "
                           "with two consumer warpgroups and two or more gemms per step: "
                           "the warpgroups take turns issuing their gemms (a loop of one "
                           "gemm that rebuilds its accumulator every step takes turns "
                           "regardless)"),
        "wgmma_in_flight": Option(bool, True, "sm_90a T.Pipelined loops fed by a TMA "
                                  "producer: a wgmma gemm runs on until a statement needs "
                                  "it, across the loop's back edge too"),
        "whole_kernel_paths": Option(bool, True, "sm_90a: the whole-kernel attention path "
                                     "takes the kernel it recognizes; off, that takes the "
                                     "per-op lowering (a T.Pipelined loop fed by a TMA "
                                     "producer) like every other kernel"),
        "persistent": Option(int, 0, "sm_90a T.Pipelined loops fed by a TMA producer: "
                             "min(blocks, SMs) blocks walk the grid; 0 the plan's choice "
                             "(on where every block runs the loop alike: "
                             "ws_plan.PERSISTENT_BY_DEFAULT says why), 1 off, 2 on",
                             choices=(0, 1, 2)),
        "alternate": Option(int, 0, "sm_90a T.Pipelined loops fed by a TMA producer, one "
                            "consumer warpgroup, walking the grid with a ring that takes "
                            "the SM: a second consumer warpgroup runs every other program "
                            "block, its main loop meeting the first's epilogue; 0 the "
                            "plan's choice (ws_plan.alternate_choice), 1 off, 2 where it "
                            "applies", choices=(0, 1, 2)),
        "ring_tables": Option(int, 0, "sm_90a: whether a T.Pipelined loop whose copies read "
                              "a tile table (paged attention's and MLA's block tables) may be "
                              "fed by a TMA producer, as GEMM loops with tables are: 0 where "
                              "the loop's gemms all take wgmma (measured faster for MLA "
                              "decode: ws_plan._wgmma_loop), 1 never, 2 every loop",
                              choices=(0, 1, 2)),
        "cuda_compiler": Option(str, None, "CUDA C++ to cubin: nvcc or nvrtc (default "
                                "TILED_CUDA_COMPILER)", choices=("nvcc", "nvrtc", "auto")),
    }

    def parse_arch(self, arch: str | None) -> str:
        if arch is None:
            raise CompileError("cuda targets name an arch: cuda:sm_80 or cuda:sm_90a")
        if arch == "sm_90":
            arch = "sm_90a"
        if arch not in ARCHS:
            from tiled.errors import UnsupportedTarget

            raise UnsupportedTarget(f"cuda arch {arch} is not supported; supported: "
                                    f"{', '.join(ARCHS)}")
        return arch

    def generate_source(self, program: Program, arch: str, warp_specialize: bool = True,
                        pingpong: bool = False,
                        wgmma_in_flight: bool = True, persistent: int = 0,
                        whole_kernel_paths: bool = True, ring_tables: int = 0,
                        alternate: int = 0):
        """(CUDA source, dynamic shared memory bytes, the lowering). When the automatic sm_90a
        path's TMA descriptors have launch preconditions (`low.requires`: strides that
        depend on a symbolic dim), the source also holds the program lowered without warp
        specialization, as `<name>_fallback`, for the launches that fail them; its lowering
        is `low.fallback` (else None)."""
        import tvm  # here, not at import: describing the target must not load TVM

        from tiled.compiler.targets.cuda.kernel import lower_cuda
        from tiled.compiler.targets.cuda.sm90_explicit import ExplicitLowering
        from tiled.ir.verify_ws import explicit_statement

        explicit = explicit_statement(program.proto) is not None
        mod, low = lower_cuda(program, arch, warp_specialize,
                              ExplicitLowering if explicit else None, pingpong,
                              wgmma_in_flight, persistent, whole_kernel_paths, ring_tables,
                              alternate)
        _check_smem(low, arch)
        low.fallback = None
        if low.requires and not low.explicit:
            fb_mod, fb = lower_cuda(program, arch, warp_specialize=False)
            _check_smem(fb, arch)
            name = program.name + FALLBACK_SUFFIX
            mod = tvm.IRModule({**{gv.name_hint: f for gv, f in mod.functions.items()},
                                name: fb_mod[program.name].with_attr("global_symbol", name)})
            low.fallback = fb
        register_pipeline()
        target = tvm.target.Target({"kind": "cuda", "arch": arch})
        with timed("codegen"):
            ex = tvm.compile(mod, target=target, tir_pipeline="tiled_cuda")
        src = ex.mod.imports[0].inspect_source()
        if low.explicit:
            from tiled.compiler.targets.cuda.sm90_explicit import explicit_source

            return explicit_source(src, low), low.pool_bytes, low
        # wgmma_rows (gemm_sm90.py), for the kernel or its fallback variant.
        wgmma = low.wgmma_ops or (low.fallback is not None and low.fallback.wgmma_ops)
        extra = '#include "tiled_sm90_ops.h"\n' if wgmma else ""
        if low.attn is not None:
            src = with_tensor_maps(src, low.launch_threads)
            return ('#include "tiled_cuda.h"\n#include "tiled_sm90_attn.h"\n' + extra + src,
                    low.pool_bytes, low)
        if low.wsloop is not None:  # the T.Pipelined ring (ws_loop.py)
            src = with_tensor_maps(src, low.launch_threads, low.wsloop.min_blocks)
            return ('#include "tiled_cuda.h"\n#include "tiled_sm90.h"\n'
                    '#include "tiled_sm90_ops.h"\n' + src, low.pool_bytes, low)
        return '#include "tiled_cuda.h"\n' + extra + src, low.pool_bytes, low

    def compile(self, program: Program, target: Target, options: dict) -> Artifact:
        with timed("lower"):  # TVM's CUDA codegen inside is timed as "codegen"
            source, smem, low = self.generate_source(program, target.arch,
                                                     option(options, "warp_specialize", self),
                                                     option(options, "pingpong", self),
                                                     option(options, "wgmma_in_flight", self),
                                                     option(options, "persistent", self),
                                                     option(options, "whole_kernel_paths",
                                                            self),
                                                     option(options, "ring_tables", self),
                                                     option(options, "alternate", self))
        with timed("toolchain"):
            cubin = compile_cubin(source, target.arch, options.get("cuda_compiler"))
        symbol, args = kernel_args(source, program, low.tensor_maps,
                                   f"{program.name}_kernel")
        fallback = None
        if low.fallback is not None:
            fb_symbol, fb_args = kernel_args(source, program, {},
                                             f"{program.name}{FALLBACK_SUFFIX}_kernel")
            fallback = {"symbol": fb_symbol, "kernel_args": fb_args,
                        "block": [low.fallback.launch_threads, 1, 1],
                        "dynamic_smem_bytes": low.fallback.pool_bytes}
        return Artifact(data=cubin, symbol=symbol, kernel_args=args, dynamic_smem_bytes=smem,
                        block=(low.launch_threads, 1, 1), source=source,
                        persistent=_persistent_blocks(low),
                        requires=low.requires, fallback=fallback)


def _persistent_blocks(low) -> int:
    """Blocks per SM a persistent kernel launches (Artifact.persistent), 0 for none: the
    whole-kernel attention path one; a T.Pipelined ring walked persistently as many as its
    launch bounds keep resident (two for a one-warpgroup program whose ring leaves room)."""
    if low.attn and low.attn.persistent:
        return 1
    if low.wsloop and low.wsloop.persistent:
        return low.wsloop.min_blocks
    return 0


def _check_smem(low, arch: str) -> None:
    if low.pool_bytes > MAX_SMEM[arch]:
        raise CompileError(
            f"kernel needs {low.pool_bytes / 1024:.0f} KiB of shared memory (pipeline stages "
            f"included), {arch} has {MAX_SMEM[arch] // 1024} KiB: reduce block sizes or "
            "num_stages")
