"""A kernel function of several `with T.Kernel` blocks (TileLang's split-KV decode followed by
its combine step), compiled: one compiled kernel per block, launched in order with the same
arguments (on CUDA on the same stream, so each launch sees the previous one's writes).
Thin side: no TVM."""

from __future__ import annotations


class CompiledSequence:
    """The compiled launches of one kernel function, in order. `kernels` holds each one's
    CompiledKernel (or RemoteKernel); `manifest` is the first's, whose parameters every
    launch shares."""

    def __init__(self, name: str, kernels: list):
        if not kernels:
            raise ValueError(f"{name}: a sequence of no kernels")
        self.name, self.kernels = name, list(kernels)

    @property
    def manifest(self):
        return self.kernels[0].manifest

    @property
    def manifests(self) -> list:
        return [k.manifest for k in self.kernels]

    @property
    def source(self) -> str | None:
        parts = [getattr(k, "source", None) for k in self.kernels]
        return None if any(p is None for p in parts) else "\n".join(parts)

    def __call__(self, *args):
        for k in self.kernels:
            k(*args)

    def emulate(self, *args) -> None:
        """Each launch under the CPU emulation of its GPU (CompiledKernel.emulate), in order."""
        for k in self.kernels:
            k.emulate(*args)

    def __repr__(self):
        return f"<CompiledSequence {self.name}: {len(self.kernels)} launches>"


def programs_of(kernel) -> list:
    """Every Program a kernel launches: a kernel function's `launches`, or its one `.ir`."""
    launches = getattr(kernel, "launches", None)
    return list(launches) if launches is not None else [kernel.ir]


def launches_of(kernel_or_program) -> list | None:
    """The Programs of a kernel function of several `with T.Kernel` blocks, or None for one
    of a single block (or a Program)."""
    launches = getattr(kernel_or_program, "launches", None)
    return launches if launches is not None and len(launches) > 1 else None
