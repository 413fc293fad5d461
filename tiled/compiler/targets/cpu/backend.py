"""The `cpu` backend: TVM's LLVM codegen (lowering in lower.py) linked with the shim into a
self-contained shared library, built for one feature level (tiled.runtime.cpu_levels): the
target `cpu` is this host's level (`cpu:x86-64-v4` on an AVX-512 host), `cpu:generic` the
ISA's baseline for portable bundles, `cpu:x86-64-v3` and the like an explicit level (compiled
here even when this host lacks it; the runtime refuses to load it on such a host). This module
only describes the target; TVM is imported when a kernel is compiled, so parsing targets and
computing keys never loads it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import ClassVar

from tiled.compiler.registry import Artifact, Backend, Option, Target, option, register
from tiled.compiler.stages import timed
from tiled.compiler.targets.cpu.levels import codegen_of, resolve_level
from tiled.ir.program import Program
from tiled.runtime import cpu_levels


@register
class CpuBackend(Backend):
    name = "cpu"
    # The levels of this host's ISA, oldest first (the daemon's Capabilities lists them).
    archs = tuple(lv.name for lv in cpu_levels.levels_of(cpu_levels.host_cpu().isa))
    artifact_format = "so"
    options: ClassVar[dict[str, Option]] = {"stream_stores": Option(
        bool, True, "on x86-64 with clang, an output the kernel only writes, in long rows of "
        "light arithmetic, takes non-temporal stores in calls where it is 16-byte aligned and "
        "at least twice the last-level cache (stream_out.py); False: plain stores always")}

    def parse_arch(self, arch: str | None) -> str:
        return resolve_level(arch)

    def compile(self, program: Program, target: Target, options: dict) -> Artifact:
        import tvm

        from tiled.compiler.targets.cpu import native_bf16, stream_out
        from tiled.compiler.targets.cpu.lower import lower_cpu
        from tiled.compiler.toolchain.cc import link_cpu_library

        codegen = codegen_of(target.arch)
        # bfloat16 by instruction and streaming stores take clang (native_bf16.py,
        # stream_out.py); without it, integer rounding and plain stores.
        isa = cpu_levels.host_cpu().isa
        stream = isa == "x86_64" and option(options, "stream_stores", self)
        clang = native_bf16.clang() if codegen.native_bf16 or stream else None
        with timed("lower"):
            mod = lower_cpu(program, codegen.vector_bytes, codegen.vector_ldexp,
                            clang is not None and codegen.native_bf16,
                            streaming=clang is not None and stream)
        bf16 = clang is not None and native_bf16.uses_marker(mod)
        tags = str(mod.attrs[stream_out.ATTR]).split(",") if mod.attrs is not None and \
            stream_out.ATTR in mod.attrs else []
        native = bf16 or bool(tags)
        llvm = {"kind": "llvm", **codegen.llvm, **({"opt-level": 0} if native else {})}
        with tempfile.TemporaryDirectory(prefix="tiled-cpu-") as tmp:
            obj, so = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
            with timed("codegen"), tvm.transform.PassContext(opt_level=3):
                ex = tvm.compile(mod, target=tvm.target.Target(llvm))
                if not native:
                    ex.mod.write_to_file(str(obj))
            if native:  # TVM's IR unoptimized, optimized and compiled by clang
                with timed("toolchain"):
                    ll = native_bf16.define_marker(ex.mod.inspect_source("ll"))
                    if tags:
                        flags = (*codegen.cflags, *(native_bf16.VECTOR_FLAGS if bf16 else ()))
                        stream_out.compile_ir(stream_out.define_helpers(ll), obj, flags, clang,
                                              tags)
                    else:
                        native_bf16.compile_ir(ll, obj, codegen.cflags, clang)
            with timed("toolchain"):
                link_cpu_library(str(obj), str(so), codegen.cflags)
            data = so.read_bytes()
        return Artifact(data=data, symbol=f"__tvm_ffi_{program.name}", kernel_args=None,
                        dynamic_smem_bytes=0, block=(1, 1, 1))
