"""Targets and the backend registry. A backend is one module under tiled/compiler/backends/
that subclasses `Backend` and registers itself; adding one edits no other backend."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from tiled.errors import UnsupportedTarget
from tiled.ir.program import Program

_BACKENDS: dict[str, Backend] = {}
_BUILTIN = ("cpu", "cuda")


@dataclass(frozen=True)
class Target:
    """A compile target: backend plus architecture, written "backend[:arch]"."""

    backend: str
    arch: str

    def __str__(self) -> str:
        return f"{self.backend}:{self.arch}" if self.backend != "cpu" else "cpu"


@dataclass
class Artifact:
    """What a backend produces. `kernel_args` lists the kernel's C parameters (cuda) as manifest
    entries; `source` is the generated source, kept for inspection."""

    data: bytes
    symbol: str
    kernel_args: list | None
    dynamic_smem_bytes: int
    block: tuple[int, int, int]
    source: str | None = None
    stages: dict[str, float] = field(default_factory=dict)
    # A persistent kernel: launched with min(the program's block count, the SM count) blocks,
    # each of which walks the program's blocks (tiled.runtime.manifest.SM_COUNT_DIM).
    persistent: bool = False
    # CTAs per thread-block cluster (the manifest's cluster). A persistent kernel with clusters
    # of 2 launches whole clusters, each walking pairs of the program's blocks adjacent along
    # grid axis `paired_axis` (so the grid's extent there counts pairs, rounded up).
    cluster: tuple[int, int, int] = (1, 1, 1)
    paired_axis: int = -1




class Backend:
    name: str = ""
    archs: tuple[str, ...] = ()
    artifact_format: str = ""

    def parse_arch(self, arch: str | None) -> str:
        raise NotImplementedError

    def compile(self, program: Program, target: Target, options: dict) -> Artifact:
        raise NotImplementedError


def register(cls: type[Backend]) -> type[Backend]:
    _BACKENDS[cls.name] = cls()
    return cls


def get_backend(name: str) -> Backend:
    if name not in _BACKENDS and name in _BUILTIN:
        importlib.import_module(f"tiled.compiler.backends.{name}")
    if name not in _BACKENDS:
        raise UnsupportedTarget(f"no backend named {name!r}; available: {', '.join(_BUILTIN)}")
    return _BACKENDS[name]


def parse_target(text: str | Target) -> Target:
    """"cpu", "cuda:sm_80", "cuda:sm_90a" -> Target. Raises UnsupportedTarget naming the
    problem."""
    if isinstance(text, Target):
        return text
    if not isinstance(text, str) or not text:
        raise UnsupportedTarget(f"target must be a string such as 'cpu' or 'cuda:sm_90a', "
                                f"got {text!r}")
    backend, _, arch = text.partition(":")
    b = get_backend(backend)
    return Target(backend, b.parse_arch(arch or None))
