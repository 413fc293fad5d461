"""CPU feature levels: which instructions a `cpu:<level>` artifact may use, and which level a
host has. Thin side (no TVM): the compiler resolves the target "cpu" to the host's level with
it (tiled.compiler.targets.cpu.backend), and the runtime refuses to load an artifact whose
level the host lacks (tiled.runtime.cpu).

    cpu:generic      the ISA's baseline (x86-64: SSE2; aarch64: NEON): runs on every host of
                     that ISA, for portable bundles
    cpu:x86-64-v2    + SSE4.2, POPCNT            (the x86-64 psABI levels; LLVM and GCC take
    cpu:x86-64-v3    + AVX2, FMA, F16C, BMI       the same names for -mcpu / -march)
    cpu:x86-64-v4    + AVX-512 F/BW/CD/DQ/VL
    cpu:x86-64-v4+bf16 + AVX512-BF16 (Zen 4, Cooper Lake, Sapphire Rapids): float32 ->
                     bfloat16 in one instruction, which treats float32 subnormals as zero
    cpu:aarch64+fp16 + half-precision arithmetic (ARMv8.2-A FP16)
    cpu:aarch64+sve  + SVE

A host is described by its ISA and its CPU flags as Linux's /proc/cpuinfo names them; other
systems are taken as `generic`, which is always safe. Everything here is pure and thread-safe;
`host_cpu()` reads /proc/cpuinfo once per process.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

from tiled.errors import LaunchError

GENERIC = "generic"


@dataclass(frozen=True)
class Level:
    """One feature level of an ISA. `requires`: the /proc/cpuinfo flags a host must show to
    run its code. (How the compiler targets it, LLVM's -mcpu and the C compiler's -march, is
    the compiler's: tiled.compiler.targets.cpu.levels.)"""

    name: str
    isa: str
    requires: frozenset[str]


_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_FP16 = frozenset({"fphp", "asimdhp"})

LEVELS: tuple[Level, ...] = (  # per ISA, oldest first: each needs what the one before does
    Level(GENERIC, "x86_64", frozenset()),
    Level("x86-64-v2", "x86_64", _V2),
    Level("x86-64-v3", "x86_64", _V3),
    Level("x86-64-v4", "x86_64", _V4),
    Level("x86-64-v4+bf16", "x86_64", _V4 | {"avx512_bf16"}),
    Level(GENERIC, "aarch64", frozenset()),
    Level("aarch64+fp16", "aarch64", _FP16),
    Level("aarch64+sve", "aarch64", _FP16 | {"sve"}),
)
# What platform.machine() says, per ISA. Before levels existed a cpu artifact's arch was the
# machine name and it was built for the ISA's baseline: those manifests read as `generic`.
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True)
class HostCPU:
    """A host as the levels see it: its ISA ("x86_64", "aarch64", or another machine name)
    and its CPU flags."""

    isa: str
    flags: frozenset[str]


def is_cpu_target(target: str) -> bool:
    """Whether target text names the cpu backend: "cpu", "cpu:generic", "cpu:x86-64-v3"."""
    return target.partition(":")[0] == "cpu"


def isa_of_machine(machine: str) -> str:
    return _MACHINES.get(machine.lower(), machine.lower())


def parse_cpuinfo(text: str, machine: str) -> HostCPU:
    """The host described by /proc/cpuinfo `text` on a `machine` (platform.machine()): the
    flags of its first processor ("flags" on x86, "Features" on arm)."""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags = frozenset(value.split())
            break
    return HostCPU(isa_of_machine(machine), flags)


@functools.lru_cache(maxsize=1)
def host_cpu() -> HostCPU:
    """This host (read once). Without /proc/cpuinfo (macOS, Windows) no flags: `generic`."""
    machine = platform.machine() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read(), machine)
    except OSError:
        return HostCPU(isa_of_machine(machine), frozenset())


def levels_of(isa: str) -> tuple[Level, ...]:
    """The levels of `isa`, oldest first; an ISA without a table has only `generic`."""
    found = tuple(lv for lv in LEVELS if lv.isa == isa)
    return found or (Level(GENERIC, isa, frozenset()),)


def host_level(host: HostCPU | None = None) -> Level:
    """The newest level whose flags the host (default: this one) all shows."""
    host = host or host_cpu()
    return [lv for lv in levels_of(host.isa) if lv.requires <= host.flags][-1]


def level_named(name: str, isa: str) -> Level | None:
    """The level of `isa` called `name` (a machine name of that ISA, as older manifests wrote
    it, is `generic`); None when `isa` has no such level."""
    if isa_of_machine(name) == isa and name.lower() in _MACHINES:
        name = GENERIC
    return next((lv for lv in levels_of(isa) if lv.name == name), None)


def check_runs_here(kernel: str, arch: str, host: HostCPU | None = None) -> None:
    """Raises LaunchError, naming both levels and the missing flags, when an artifact built for
    `cpu:<arch>` may use instructions the host (default: this one) lacks."""
    host = host or host_cpu()
    here = host_level(host)
    level = level_named(arch, host.isa)
    if level is None:
        other = next((lv.isa for lv in LEVELS if lv.name == arch and arch != GENERIC), None)
        why = f"built for another ISA ({other})" if other else "a level this runtime does not know"
        raise LaunchError(f"{kernel}: compiled for cpu:{arch}, {why}; this host is cpu:"
                          f"{here.name} ({host.isa}; levels: "
                          f"{', '.join(lv.name for lv in levels_of(host.isa))})")
    missing = sorted(level.requires - host.flags)
    if missing:
        raise LaunchError(f"{kernel}: compiled for cpu:{arch}, which needs {', '.join(missing)}; "
                          f"this host is cpu:{here.name} and lacks them: compile it for 'cpu' on "
                          f"this host, or for cpu:{GENERIC} to run on any {host.isa} host")


__all__ = ["GENERIC", "LEVELS", "HostCPU", "Level", "check_runs_here", "host_cpu", "host_level",
           "is_cpu_target", "level_named", "levels_of", "parse_cpuinfo"]
