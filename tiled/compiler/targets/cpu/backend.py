"""The `cpu` backend: TVM's LLVM codegen (lowering in lower.py) linked into a
self-contained shared library. This module only describes the target; TVM is imported when a
kernel is compiled, so parsing targets and computing keys never loads it.
"""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path

from tiled.compiler.registry import Artifact, Backend, Target, register
from tiled.compiler.stages import timed
from tiled.errors import CompileError
from tiled.ir.program import Program


@register
class CpuBackend(Backend):
    name = "cpu"
    archs = (platform.machine() or "x86_64",)
    artifact_format = "so"

    def parse_arch(self, arch: str | None) -> str:
        if arch not in (None, "", self.archs[0]):
            raise CompileError(f"cpu backend builds for this host ({self.archs[0]}), not {arch}")
        return self.archs[0]

    def compile(self, program: Program, target: Target, options: dict) -> Artifact:
        import tvm

        from tiled.compiler.targets.cpu.lower import lower_cpu
        from tiled.compiler.toolchain.cc import link_cpu_library

        with timed("lower"):
            mod = lower_cpu(program)
        with tempfile.TemporaryDirectory(prefix="tiled-cpu-") as tmp:
            obj, so = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
            with timed("codegen"), tvm.transform.PassContext(opt_level=3):
                ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
                ex.mod.write_to_file(str(obj))
            with timed("toolchain"):
                link_cpu_library(str(obj), str(so))
            data = so.read_bytes()
        return Artifact(data=data, symbol=f"__tvm_ffi_{program.name}", kernel_args=None,
                        dynamic_smem_bytes=0, block=(1, 1, 1))
