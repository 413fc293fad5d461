"""The compiler: Tile IR -> verified -> TVM TIR -> backend code -> artifact + manifest.
The only package of tiled that imports `tvm`."""

from __future__ import annotations

import hashlib
import time

from tiled.compiler.action import action_of
from tiled.compiler.manifest import build_manifest
from tiled.compiler.passes.divmod import split_aligned_divmod
from tiled.compiler.passes.guards import guard_program
from tiled.compiler.registry import (
    Artifact,
    Target,
    check_options,
    get_backend,
    option,
    parse_target,
)
from tiled.compiler.stages import recording, timed
from tiled.errors import CompileError
from tiled.ir import verify
from tiled.ir.program import as_program


class CompiledKernel:
    """A compiled kernel: `.artifact` (bytes), `.manifest` (tiled.runtime.Manifest), callable on
    arrays / tensors through tiled.runtime (loaded on first call)."""

    def __init__(self, artifact: bytes, manifest, source: str | None = None,
                 stages: dict | None = None):
        self.artifact, self.manifest, self.source = artifact, manifest, source
        self.stages = stages or {}
        self._loaded = None

    def __call__(self, *args):
        if self._loaded is None:
            from tiled.runtime import load

            self._loaded = load(self.artifact, self.manifest)
        return self._loaded(*args)

    def emulate(self, *args) -> None:
        """Runs a rocm or metal kernel on the CPU under tiled's emulation of the GPU (numpy
        arrays and Python scalars; tensors are written back in place):
        targets/rocm/emulate.py, targets/metal/emulate.py. Raises LaunchError for arguments
        the manifest refuses or a kernel of another target, EmulationError when the kernel
        fails under emulation."""
        if self.manifest.backend == "metal":
            from tiled.compiler.targets.metal.emulate import emulate
        else:
            from tiled.compiler.targets.rocm.emulate import emulate

        emulate(self.artifact, self.manifest, args, self.source)

    def __repr__(self):
        return f"<CompiledKernel {self.manifest.name} for {self.manifest.target}>"


def compile_program(kernel_or_program, target: str | Target = "cpu", *, action: dict | None = None,
                    **options) -> CompiledKernel:
    """Compiles in this process. `action` is the action record the caller keyed this compile
    under (tiled.cache.keys); the manifest carries it (computed here when None). Raises
    VerifyError for an invalid program, UnsupportedTarget, ValueError for an option the
    backend does not take, CompileError / ToolchainError when lowering or the toolchain fails.
    A kernel function of several `with T.Kernel` blocks gives a tiled.sequence.CompiledSequence
    (one compile each, `action` not taken)."""
    from tiled.sequence import CompiledSequence, launches_of

    launches = launches_of(kernel_or_program)
    if launches is not None:
        if action is not None:
            raise ValueError("an action record names one program, not a sequence of launches")
        return CompiledSequence(kernel_or_program.name,
                                [compile_program(p, target, **options) for p in launches])
    t0 = time.perf_counter()
    program = as_program(kernel_or_program)
    verify(program)
    tgt = parse_target(target)
    backend = get_backend(tgt.backend)
    check_options(tgt.backend, options)
    if action is None:
        action = action_of(program.digest, tgt, options).record
    elif action.get("program") != program.digest:
        raise ValueError("the action record names another program")
    t1 = time.perf_counter()
    k = program.proto.kernel
    kernel_loc = f"{k.loc.file}:{k.loc.line}" if k.loc.file else ""
    try:
        with recording() as backend_stages:
            with timed("lower"):  # then the memory-safety guards, over the simpler indices
                lowered = split_aligned_divmod(program)
                if option(options, "safe_access"):
                    lowered = guard_program(lowered)
            art: Artifact = backend.compile(lowered, tgt, options)
    except CompileError as e:
        if e.loc:
            raise
        raise type(e)(e.message, kernel_loc) from None  # a whole-kernel problem (shared memory)
    except ValueError as e:
        # TVM's simplifier reassociates integer arithmetic and folds the constants; a sum or
        # product that leaves the dtype there is an overflow of the program on some execution
        # (`(k + 2147483647) * 64`), which intervals cannot always prove.
        if "exceeds range of int" not in str(e):
            raise
        raise CompileError("an integer expression of this kernel overflows its dtype once its "
                           "constants are combined (it overflows on some execution): compute "
                           "it in a wider dtype or with smaller constants", kernel_loc) from None
    # A backend times its parts with tiled.compiler.stages.timed; one that fills
    # Artifact.stages itself has those numbers win.
    stages = {"verify": t1 - t0, **backend_stages, **art.stages}
    manifest = build_manifest(program, tgt, art, hashlib.sha256(art.data).hexdigest(), action)
    return CompiledKernel(art.data, manifest, art.source, stages)


__all__ = ["CompiledKernel", "Target", "compile_program", "parse_target"]
