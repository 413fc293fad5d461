"""What a TMA descriptor needs of the global tensor it describes, decided at compile time.

cuTensorMapEncodeTiled takes a tensor whose outer dims step by multiples of 16 bytes (and a
16-byte aligned base, which every tensor parameter's manifest alignment guarantees). A tensor's
strides follow from its shape (the runtime passes contiguous tensors only), so for static
shapes the compiler decides: a path that would describe the tensor by TMA is not taken when a
stride is not a multiple of 16 bytes (a K = 777 fp16 GEMM's A rows are 1554 bytes). A stride
that depends on a symbolic dim becomes a launch precondition: a manifest expression over the
dims that must evaluate to 0 (`requires`); the backend then ships a variant without TMA for
the launches that fail it (tiled.compiler.targets.cuda.backend, the manifest's `fallback`).
"""

from __future__ import annotations

import math
import re

from tiled.compiler.manifest import dim_names
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

# A kernel's definition in TVM's CUDA source (name, parameter list), and the sm90 path's
# tensor-map handle parameters in it.
SIGNATURE = re.compile(
    r'extern "C" __global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\(([^)]*)\)')
_TMAP_PARAM = re.compile(r"void\* __restrict__ (tiled_tmap_\w+)")

STRIDE_ALIGN = 16  # bytes: TMA's globalStrides granularity


def tma_requirements(p: pb.Program, buf: pb.Buffer) -> list | None:
    """None when `buf` (GLOBAL) can never be described by TMA; else the manifest expressions
    (each must evaluate to 0 at launch) its strides need, [] when its shape alone satisfies
    them."""
    names = dim_names(p)
    size = dtypes.nbytes(buf.dtype)
    out = []
    for j in range(len(buf.shape) - 1):
        inner = buf.shape[j + 1:]
        static = size * math.prod(d.size for d in inner if d.WhichOneof("kind") == "size")
        symbolic = [names[d.var] for d in inner if d.WhichOneof("kind") == "var"]
        if static % STRIDE_ALIGN == 0:
            continue  # a multiple of 16 bytes whatever the dims
        if not symbolic:
            return None
        stride: object = static
        for name in symbolic:
            stride = ["mul", stride, name]
        req = ["floormod", stride, STRIDE_ALIGN]
        if req not in out:
            out.append(req)
    return out


def describe(requires: list) -> str:
    """The preconditions as text for errors: `floormod(mul(2, K), 16) == 0`."""
    def text(e) -> str:
        return f"{e[0]}({text(e[1])}, {text(e[2])})" if isinstance(e, list) else str(e)
    return " and ".join(f"{text(r)} == 0" for r in requires)


def with_tensor_maps(source: str, threads: int, min_blocks: int = 1) -> str:
    """The sm90 path's kernel source: each `tiled_tmap_*` handle parameter becomes a TMA
    descriptor passed by value (`const __grid_constant__`), which the body uses through a
    pointer of the same name; the launch bounds say `min_blocks` blocks per SM (1, which
    setmaxnreg needs, unless the lowering says otherwise).
    Only the kernel that takes the descriptors is changed (a fallback variant beside it in the
    source takes none and keeps its launch bounds, which count fewer threads)."""
    source = source.replace(f"__launch_bounds__({threads})",
                            f"__launch_bounds__({threads}, {min_blocks})")
    names = sorted(set(_TMAP_PARAM.findall(source)))
    body = next((m.end() + 2 for m in SIGNATURE.finditer(source)  # the definition's brace
                 if source.startswith(" {", m.end()) and "tiled_tmap_" in m.group(2)), None)
    if body is None:  # no kernel reads a descriptor (TVM dropped unused parameters)
        return source
    pointers = "".join(f"\n  const void* {n} = &{n}_desc;" for n in names)
    source = source[:body] + pointers + source[body:]
    return _TMAP_PARAM.sub(r"const __grid_constant__ tiled::sm90::TensorMap \1_desc", source)
