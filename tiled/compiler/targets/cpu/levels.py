"""How the `cpu` backend targets each feature level (tiled.runtime.cpu_levels names the levels
and what a host needs to run them): LLVM's target attributes for TVM's codegen, and the C
compiler's flags for the shim and its gemm microkernel (gemm.c). The x86-64 psABI levels are
CPU names to both LLVM and GCC / clang; `-mtune=generic` because a level names an ISA, not a
microarchitecture to tune for. Pure data; no TVM.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiled.errors import UnsupportedTarget
from tiled.runtime import cpu_levels


@dataclass(frozen=True)
class Codegen:
    llvm: dict  # TVM's LLVM target attributes (mcpu, mattr)
    cflags: tuple[str, ...]  # the C compiler's
    vector_bytes: int = 16  # the widest vector register the level has
    # Whether LLVM's ldexp is one vector instruction (AVX-512 vscalefps) rather than a libm
    # call per lane (vmath).
    vector_ldexp: bool = False
    # Whether float32 -> bfloat16 conversions use the level's own instruction (native_bf16.py)
    native_bf16: bool = False


_CODEGEN = {
    ("x86_64", "generic"): Codegen({"mcpu": "x86-64"}, ("-march=x86-64", "-mtune=generic")),
    ("x86_64", "x86-64-v2"): Codegen({"mcpu": "x86-64-v2"},
                                     ("-march=x86-64-v2", "-mtune=generic"), 16),
    ("x86_64", "x86-64-v3"): Codegen({"mcpu": "x86-64-v3"},
                                     ("-march=x86-64-v3", "-mtune=generic"), 32),
    # Generic tuning keeps auto-vectorized loops at 256 bits on AVX-512 (for the clock drop
    # of early Xeons); the level's width measured 10-25% less CPU time on RMSNorm, softmax and
    # SiLU-mul loops here (Zen 4), so loops use the whole 512 bits.
    ("x86_64", "x86-64-v4"): Codegen({"mcpu": "x86-64-v4", "mattr": ["-prefer-256-bit"]},
                                     ("-march=x86-64-v4", "-mtune=generic",
                                      "-mprefer-vector-width=512"), 64, True),
    ("x86_64", "x86-64-v4+bf16"): Codegen({"mcpu": "x86-64-v4",
                                           "mattr": ["-prefer-256-bit", "+avx512bf16"]},
                                          ("-march=x86-64-v4", "-mavx512bf16", "-mtune=generic",
                                           "-mprefer-vector-width=512"), 64, True, True),
    ("aarch64", "generic"): Codegen({"mcpu": "generic", "mattr": ["+neon"]}, ("-march=armv8-a",)),
    ("aarch64", "aarch64+fp16"): Codegen({"mcpu": "generic", "mattr": ["+neon", "+fullfp16"]},
                                         ("-march=armv8.2-a+fp16",)),
    ("aarch64", "aarch64+sve"): Codegen(
        {"mcpu": "generic", "mattr": ["+neon", "+fullfp16", "+sve"]},
        ("-march=armv8.2-a+fp16+sve",)),
}


def resolve_level(arch: str | None, host: cpu_levels.HostCPU | None = None) -> str:
    """The level a `cpu[:arch]` target compiles for on `host` (default: this one): no arch is
    the host's own level; else a level of the host's ISA (machine names such as "x86_64" read
    as `generic`, as manifests from before levels wrote them). Raises UnsupportedTarget naming
    the levels there are."""
    host = host or cpu_levels.host_cpu()
    if not arch:
        return cpu_levels.host_level(host).name
    level = cpu_levels.level_named(arch, host.isa)
    if level is None:
        names = ", ".join(f"cpu:{lv.name}" for lv in cpu_levels.levels_of(host.isa))
        raise UnsupportedTarget(f"cpu:{arch} is not a CPU level of this {host.isa} host "
                                f"(the cpu backend compiles for its own ISA); levels: {names}, "
                                f"or 'cpu' for this host's own "
                                f"(cpu:{cpu_levels.host_level(host).name})")
    return level.name


def codegen_of(level: str, isa: str | None = None) -> Codegen:
    """How to compile for `level` of `isa` (default: this host's). An ISA without a table
    compiles for LLVM's and the C compiler's defaults."""
    isa = isa or cpu_levels.host_cpu().isa
    return _CODEGEN.get((isa, level), Codegen({}, ()))
