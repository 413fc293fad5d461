"""The thin runtime: loads a compiled artifact by its manifest and launches it. Never imports
TVM (nor the compiler); torch and cuda-bindings are imported only when a call needs them.

    kernel = tiled.runtime.load(artifact_bytes, manifest)   # Manifest, dict or JSON text
    kernel(A, B, C)                                         # numpy / torch / CAI tensors

Every problem with a manifest, an artifact or the arguments raises tiled.errors.LaunchError
naming what is wrong, before anything runs.
"""

from __future__ import annotations

import hashlib

from tiled.errors import LaunchError
from tiled.runtime.args import BoundArgs, TensorView, as_tensor, bind_args
from tiled.runtime.manifest import KernelArg, Manifest, ManifestError, Param, eval_expr

LOADERS = {"cpu": "tiled.runtime.cpu:CPUKernel", "cuda": "tiled.runtime.cuda:CUDAKernel",
           "rocm": "tiled.runtime.rocm:ROCmKernel", "metal": "tiled.runtime.metal:MetalKernel"}


class Kernel:
    """A loaded kernel: call it with the arguments the manifest's params describe.
    Calls are thread-safe. `manifest` is the Manifest it was loaded with."""

    manifest: Manifest

    def __call__(self, *args):  # pragma: no cover - the backends implement it
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(p.name for p in self.manifest.params)
        return f"<{type(self).__name__} {self.manifest.name}({params}) on {self.manifest.target}>"


def load(artifact: bytes, manifest: Manifest | dict | str) -> Kernel:
    """Loads `artifact` (the bytes the manifest's artifact_sha256 names) and returns a Kernel.
    Raises LaunchError when the bytes do not match the manifest or no loader exists for its
    backend, and ManifestError (a LaunchError) for a malformed manifest."""
    m = Manifest.coerce(manifest)
    if not isinstance(artifact, bytes | bytearray | memoryview):
        raise LaunchError(f"{m.name}: artifact must be bytes, got {type(artifact).__name__}")
    data = bytes(artifact)
    digest = hashlib.sha256(data).hexdigest()
    if digest != m.artifact_sha256:
        raise LaunchError(f"{m.name}: artifact sha256 {digest} does not match the manifest's "
                          f"artifact_sha256 {m.artifact_sha256}")
    if m.backend != "cuda" and (m.requires or m.fallback is not None):
        raise LaunchError(f"{m.name}: launch preconditions and fallback variants are a cuda "
                          f"manifest's; this {m.backend} manifest has them")
    if m.backend not in LOADERS:
        raise LaunchError(f"{m.name}: no loader for backend {m.backend!r} in this runtime "
                          f"(available: {', '.join(LOADERS)})")
    import importlib
    import time

    from tiled.runtime.telemetry import observe_load

    t0 = time.perf_counter()
    module, _, cls = LOADERS[m.backend].partition(":")
    kernel = getattr(importlib.import_module(module), cls)(data, m)
    observe_load(m.backend, time.perf_counter() - t0)  # where prometheus_client is installed
    return kernel


__all__ = ["BoundArgs", "Kernel", "KernelArg", "LaunchError", "Manifest", "ManifestError",
           "Param", "TensorView", "as_tensor", "bind_args", "eval_expr", "load"]
