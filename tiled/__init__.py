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
from tiled.jit import jit
from tiled.lang.kernel import kernel
from tiled.pass_configs import PassConfigKey
from tiled.tuning import autotune

__version__ = "0.1.0"


def compile(kernel_or_program, target: str = "cpu", *, cache: bool = True, pass_configs=None,
            **options):
    """Compiles a `@tiled.kernel` (or a tiled.ir.Program) for `target` ("cpu", "cuda:sm_80",
    "cuda:sm_90a") and returns a callable `CompiledKernel` with `.artifact` and `.manifest`.
    With TILED_SERVER set, the daemon compiles (and caches) it; otherwise it compiles in this
    process (needs the compiler extra), through the local kernel cache when `cache` is set
    (TILED_CACHE_DIR, plus Redis when TILED_REDIS_URL is set). A kernel function of several
    `with T.Kernel` blocks compiles to a `CompiledSequence` that launches them in order.
    TileLang's `pass_configs` are checked and dropped (tiled.pass_configs)."""
    from tiled import config
    from tiled.pass_configs import check_pass_configs
    from tiled.sequence import CompiledSequence, launches_of

    check_pass_configs(pass_configs)
    launches = launches_of(kernel_or_program)
    if launches is not None:
        return CompiledSequence(kernel_or_program.name, [
            compile(p, target, cache=cache, **options) for p in launches])

    if config.get("server"):  # a daemon is configured: it compiles and caches
        from tiled.client import compile_via_server

        return compile_via_server(kernel_or_program, target, cache=cache, **options)
    if cache:
        from tiled.compiler.cached import compile_cached, default_cache

        return compile_cached(kernel_or_program, target, default_cache(), options)[0]
    from tiled.compiler import compile_program

    return compile_program(kernel_or_program, target, **options)


__all__ = ["CompileError", "KernelDefinitionError", "LaunchError", "PassConfigKey", "TiledError",
           "VerifyError", "__version__", "autotune", "compile", "jit", "kernel"]
