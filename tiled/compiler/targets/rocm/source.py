"""The HIP source of a ROCm kernel, from what TVM's CUDA C++ codegen prints for its TIR.

TVM's output is a preamble (CUDA includes, half / bfloat16 helpers, `uint` macros) and the
kernel. tiled keeps the kernel only and puts it after its own header, inside
`namespace tiled_kernel` (tiled_hip.h's math functions there hide the C library's in the
CPU build); the kernel keeps C linkage, so its symbol is TVM's. The shared pool, which TVM
declares as dynamic shared memory, becomes a static LDS array of the pool's size (the code
object then states the LDS bytes, which tiled checks against the manifest). Nothing else of
TVM's text is changed: the emulation and the GPU compile the same characters.
"""

from __future__ import annotations

import re

from tiled.errors import CompileError

HEADER = "tiled_hip.h"
_KERNEL_START = re.compile(r'^extern "C" __global__ ', re.M)
_POOL = re.compile(r"^(\s*)extern __shared__ __align__\((\d+)\) uchar (\w+)\[\];$", re.M)


def hip_source(cuda_source: str, pool_bytes: int) -> str:
    """The HIP source for TVM's CUDA source of one kernel whose shared pool is `pool_bytes`.
    Raises CompileError when TVM's text is not of the form this expects (a TVM change)."""
    m = _KERNEL_START.search(cuda_source)
    if m is None:
        raise CompileError("TVM's CUDA codegen printed no kernel (extern \"C\" __global__)")
    body = cuda_source[m.start():]
    pools = _POOL.findall(body)
    if len(pools) > 1 or (pools and pool_bytes == 0):
        raise CompileError(f"TVM's CUDA source declares {len(pools)} dynamic shared arrays; "
                           "the ROCm backend expects the one shared pool")
    body = _POOL.sub(lambda p: f"{p.group(1)}TILED_LDS_POOL({p.group(3)}, {pool_bytes});", body)
    if "__shared__" in body:
        raise CompileError("TVM's CUDA source declares shared memory outside tiled's pool")
    return (f'#include "{HEADER}"\n\nnamespace tiled_kernel {{\n\n{body.rstrip()}\n\n'
            f"}}  // namespace tiled_kernel\n")
