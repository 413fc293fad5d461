"""Kernels for tiled.autotune's candidates: the @tiled.kernel inside a factory's result, and
where its compiled form comes from (tiled.compile, or `prebuilt`: kernels compiled elsewhere,
handed in by program digest). Split from tiled.tuning, which chooses among them."""

from __future__ import annotations

import contextlib
import json

_KERNELS: dict | None = None  # (program digest, options key or None) -> kernel, in `prebuilt`


class PrebuiltKernel:
    """A kernel compiled elsewhere: the loaded kernel with its artifact and manifest."""

    def __init__(self, artifact: bytes, manifest):
        from tiled.runtime import load

        self.kernel = load(artifact, manifest)
        self.artifact, self.manifest = bytes(artifact), self.kernel.manifest

    def __call__(self, *args, **kwargs):
        return self.kernel(*args, **kwargs)


@contextlib.contextmanager
def prebuilt(pairs):
    """Within the block, tiled.autotune takes its candidates (and the winner) from `pairs`,
    (artifact bytes, manifest) of kernels compiled elsewhere for the target being tuned (a
    bundle), by program digest, instead of compiling: how a host with neither the compiler
    nor a daemon tunes. A pair may name the compile options it was built with as a third
    item, (artifact, manifest, options): it then stands only for candidates compiled with
    those (a config's own compile options make two candidates of one program); a pair
    without them stands for its program under any options. A candidate not among them is
    skipped as not built; the toolchain in the tuning key is the one their manifests
    record."""
    global _KERNELS
    before = _KERNELS
    kernels = {}
    for pair in pairs:
        artifact, manifest, *rest = pair
        k = PrebuiltKernel(artifact, manifest)
        kernels[(k.manifest.program_digest, _options_key(rest[0]) if rest else None)] = k
    _KERNELS = kernels
    try:
        yield
    finally:
        _KERNELS = before


def _options_key(options: dict) -> str:
    return json.dumps(options, sort_keys=True)


def compile_candidate(kernel, target: str, options: dict):
    """The compiled kernel: from `prebuilt`'s kernels when inside it, else tiled.compile.
    Raises LookupError for a kernel the prebuilt set lacks."""
    if _KERNELS is not None:
        digest = kernel.ir.digest
        k = _KERNELS.get((digest, _options_key(options))) or _KERNELS.get((digest, None))
        if k is None:
            raise LookupError(f"{kernel.name} ({digest[:12]}, options {options}) is not among "
                              "the prebuilt kernels")
        return k
    import tiled

    return tiled.compile(kernel, target=target, **options)


def active() -> bool:
    """Whether the caller is inside `prebuilt` (candidates come from its kernels)."""
    return _KERNELS is not None


def kernel_of(result):
    """The @tiled.kernel inside a factory's result (itself, or a tiled.jit kernel's)."""
    from tiled.jit import JitKernel

    k = result.kernel if isinstance(result, JitKernel) else result
    if not hasattr(k, "ir"):
        raise TypeError(f"the factory returned a {type(result).__name__}, not a kernel")
    return k


def attach(result, target: str, compiled) -> None:
    from tiled.jit import JitKernel

    if isinstance(result, JitKernel):
        result.use(target, compiled)
