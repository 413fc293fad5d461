"""Targets and the backend registry. A backend is a package under tiled/compiler/targets/
that subclasses `Backend` and registers itself; adding one edits no other backend."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import ClassVar

from tiled.errors import UnsupportedTarget
from tiled.ir.program import Program

_BACKENDS: dict[str, Backend] = {}
_BUILTIN = ("cpu", "cuda", "rocm", "metal")


@dataclass(frozen=True)
class Target:
    """A compile target: backend plus architecture, written "backend:arch" (the cpu
    backend's arch is a feature level: "cpu:x86-64-v4"). Parsing the text gives it back."""

    backend: str
    arch: str

    def __str__(self) -> str:
        return f"{self.backend}:{self.arch}" if self.arch else self.backend


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
    # A persistent kernel (> 0): launched with min(the program's block count, `persistent` x
    # the SM count) blocks, each of which walks the program's blocks (`persistent`: the
    # blocks an SM holds at once; tiled.runtime.manifest.SM_COUNT_DIM). 0: the program's grid.
    persistent: int = 0
    # CTAs per thread-block cluster (the manifest's cluster). A persistent kernel with clusters
    # of 2 launches whole clusters, each walking pairs of the program's blocks adjacent along
    # grid axis `paired_axis` (so the grid's extent there counts pairs, rounded up).
    cluster: tuple[int, int, int] = (1, 1, 1)
    paired_axis: int = -1
    # Launch preconditions (manifest expressions over the dims that must evaluate to 0), and
    # the variant in the same artifact launched when one fails: {"symbol", "kernel_args",
    # "block", "dynamic_smem_bytes"}, on the program's own grid. No fallback with
    # preconditions: a launch that fails them is refused.
    requires: list = field(default_factory=list)
    fallback: dict | None = None
    # The code object's facts (rocm: the manifest's `code_object`, backend.check_code_object).
    code_object: dict | None = None
    # How a Metal kernel binds its arguments (metal: the manifest's `metal`).
    metal: dict | None = None




@dataclass(frozen=True)
class Option:
    """A compile option a backend takes: its type, the values it allows (None: any of the
    type), its default and what it does. Options are part of the action key."""

    type: type
    default: object
    doc: str
    choices: tuple | None = None

    def check(self, name: str, value: object) -> None:
        # bool is an int in Python: an int option must not take True, a bool option not 1.
        if type(value) is not self.type:
            raise ValueError(f"compile option {name!r} must be a {self.type.__name__}, got "
                             f"{_short(value)}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"compile option {name!r} must be one of "
                             f"{', '.join(map(repr, self.choices))}, got {_short(value)}")


# Options every backend takes.
COMMON_OPTIONS = {
    "safe_access": Option(bool, True, "guard global element accesses whose index may leave "
                          "the tensor (a load outside reads 0, a store outside is skipped)"),
}


def _short(value: object, limit: int = 64) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class Backend:
    name: str = ""
    archs: tuple[str, ...] = ()
    artifact_format: str = ""
    options: ClassVar[dict[str, Option]] = {}  # the backend's own options, besides COMMON_OPTIONS

    def parse_arch(self, arch: str | None) -> str:
        raise NotImplementedError

    def compile(self, program: Program, target: Target, options: dict) -> Artifact:
        raise NotImplementedError


def check_options(backend: str, options: dict) -> dict:
    """The options as they enter the action key: checked, and without the ones that say the
    default (None or the declared default), so that spelling a default out keeps the key.
    Raises ValueError naming the first option `backend` does not take or whose value it
    refuses (the message lists the options it takes). Never imports TVM."""
    b = get_backend(backend)
    known = {**COMMON_OPTIONS, **b.options}
    if not isinstance(options, dict):
        raise ValueError(f"compile options must be a JSON object, got {_short(options)}")
    out = {}
    for name, value in options.items():
        opt = known.get(name) if isinstance(name, str) else None
        if opt is None:
            raise ValueError(f"unknown compile option {_short(name)} for backend {backend}; it "
                             f"takes {', '.join(sorted(known))}")
        if value is not None:
            opt.check(name, value)
            if value != opt.default:
                out[name] = value
    return out


def option(options: dict, name: str, backend: Backend | None = None):
    """The value of option `name` in `options`, else its declared default."""
    value = options.get(name)
    if value is not None:
        return value
    decl = COMMON_OPTIONS.get(name) or (backend.options.get(name) if backend else None)
    if decl is None:
        raise KeyError(name)
    return decl.default


def register(cls: type[Backend]) -> type[Backend]:
    _BACKENDS[cls.name] = cls()
    return cls


def get_backend(name: str) -> Backend:
    if name not in _BACKENDS and name in _BUILTIN:
        importlib.import_module(f"tiled.compiler.targets.{name}.backend")
    if name not in _BACKENDS:
        raise UnsupportedTarget(f"no backend named {name!r}; available: {', '.join(_BUILTIN)}")
    return _BACKENDS[name]


def parse_target(text: str | Target) -> Target:
    """"cpu", "cpu:generic", "cuda:sm_80", "cuda:sm_90a", "rocm:gfx942" -> Target; "cpu" is
    this host's own feature level ("cpu:x86-64-v4"). Raises UnsupportedTarget naming the
    problem."""
    if isinstance(text, Target):
        return text
    if not isinstance(text, str) or not text or len(text) > 64:
        raise UnsupportedTarget(f"target must be a string such as 'cpu' or 'cuda:sm_90a', "
                                f"got {_short(text)}")
    backend, _, arch = text.partition(":")
    b = get_backend(backend)
    return Target(backend, b.parse_arch(arch or None))
