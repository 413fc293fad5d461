"""The Metal target's fragment layouts, the anchors of layout inference (passes/layout.py).

Metal has no register layout an instruction defines that tiled may rely on: which lane of a
simdgroup holds which element of a `simdgroup_matrix` is undocumented (`thread_elements()`
exposes two per lane in an order Apple does not specify). So a gemm accumulator keeps a
cyclic layout (thread t holds runs of the row-major tile), and T.gemm moves it through
threadgroup memory, where `simdgroup_load` / `simdgroup_store` give it the matrix form
(gemm.py). There are no rows layouts: a row reduction of an accumulator goes through the
cyclic path of the reduction (simd_sum / simd_max, threadgroup staging).
"""

from __future__ import annotations

from tiled.compiler.passes import layout as generic
from tiled.compiler.passes.layout_kinds import CyclicLayout, cyclic_vector
from tiled.compiler.passes.resources import align_up
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

SIMD_WIDTH = 32  # threads of a simdgroup on every Apple GPU (M1 .. M4)
TILE = 8  # simdgroup_matrix tiles are 8 x 8
MAX_VECTOR = 4  # MSL vectors have at most 4 lanes (float4, half4)
MAX_THREADGROUP_MEMORY = 32 * 1024  # bytes per threadgroup on Apple GPUs (M1 .. M4)


# The MSL element type tiled_metal.h's gemms read for each dtype (bfloat16 as its bits:
# tiled::bf16 converts; apple9's simdgroup path reads it as bfloat).
MSL_ELEMENT = {"float16": "half", "float32": "float", "bfloat16": "tiled::bf16",
               "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort",
               "int32": "int", "uint32": "uint"}


def chunk_rows(low, rows: int, row_bytes: int, other_bytes: int = 0) -> int:
    """The most rows (all `rows`, else a multiple of 8 dividing it, at least 8) of `row_bytes`
    each that fit the threadgroup memory left beside the tiles (the lowering's scratch area
    starts at low.scratch_offset) and `other_bytes` of other scratch."""
    budget = MAX_THREADGROUP_MEMORY - align_up(low.scratch_offset) - align_up(other_bytes)
    n = rows
    while n > TILE and (n * row_bytes > budget or rows % n or n % TILE):
        n -= TILE
    return n


def simdgroup_dtypes(a: str, b: str, c: str, arch: str) -> bool:
    """Whether an 8x8 simdgroup_matrix multiply-accumulate takes operands a, b into c:
    half x half into float or half, float x float into float, and on apple9 (M3, MSL 3.1)
    bfloat x bfloat into float."""
    if a != b:
        return False
    if a == "float16":
        return c in ("float32", "float16")
    if a == "float32":
        return c == "float32"
    return a == "bfloat16" and c == "float32" and arch == "apple9"


def simdgroup_eligible(g: pb.Gemm, buffers, arch: str, threads: int) -> bool:
    """Whether T.gemm `g` runs on simdgroup matrices: dtypes one takes, M, N, K multiples of
    8, whole simdgroups, operands in threadgroup memory or fragments (staged there)."""
    a, b, c = buffers[g.a], buffers[g.b], buffers[g.c]
    names = [dtypes.canonical_name(x.dtype) for x in (a, b, c)]
    if not simdgroup_dtypes(*names, arch) or len(c.shape) != 2 or threads % SIMD_WIDTH:
        return False
    M, N = (d.size for d in c.shape)
    K = (a.shape[-2] if g.transpose_a else a.shape[-1]).size
    return M % TILE == 0 and N % TILE == 0 and K % TILE == 0 and \
        {a.scope, b.scope} <= {pb.SHARED, pb.FRAGMENT}


class MetalAnchors:
    """The Metal layouts layout inference starts from (module docstring)."""

    rows_layouts: tuple[type, ...] = ()
    max_vector = MAX_VECTOR

    def __init__(self, arch: str):
        self.arch = arch

    def accumulator(self, g: pb.Gemm, buffers, threads: int):
        c = buffers[g.c]
        shape = tuple(d.size for d in c.shape)
        if simdgroup_eligible(g, buffers, self.arch, threads):
            # Staged through threadgroup memory by coordinates: any run length works, and
            # runs make the epilogue's stores vectors.
            return CyclicLayout(shape, threads, cyclic_vector(shape, threads, MAX_VECTOR))
        return CyclicLayout(shape, threads)  # the SIMT gemm's: thread t, elements t + i * T

    @staticmethod
    def a_operand(g: pb.Gemm, buffers, c_layout):
        return None  # a fragment operand is staged through threadgroup memory


def infer_layouts(program: pb.Program, arch: str) -> dict[int, object]:
    """Every fragment's layout on Metal `arch`."""
    return generic.infer_layouts(program, MetalAnchors(arch))
