"""tiled: a tile-level GPU kernel language and a compile daemon.

`import tiled` is light: it never imports TVM. The compiler (`tiled.compiler`) loads on first
use of `tiled.compile` when it is installed (`pip install tiled[server]`).
"""

from tiled.errors import (
    CompileError,
    KernelDefinitionError,
    LaunchError,
    TiledError,
    VerifyError,
)
from tiled.lang.kernel import kernel

__version__ = "0.1.0"


def compile(kernel_or_program, target: str = "cpu", **options):
    """Compiles a `@tiled.kernel` (or a tiled.ir.Program) for `target` ("cpu", "cuda:sm_80",
    "cuda:sm_90a") and returns a callable `CompiledKernel` with `.artifact` and `.manifest`.
    Compiles in this process; needs the compiler extra."""
    from tiled.compiler import compile_program

    return compile_program(kernel_or_program, target, **options)


__all__ = ["CompileError", "KernelDefinitionError", "LaunchError", "TiledError", "VerifyError",
           "__version__", "compile", "kernel"]
