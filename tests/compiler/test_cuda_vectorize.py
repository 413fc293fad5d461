"""Memory-bound code on CUDA: cyclic fragments hold runs of consecutive elements, so nests and
copies over them become vector accesses where provably contiguous and aligned, and a row
reduction that spans whole block rounds is shuffles, not one thread per row. Read from the
generated CUDA (benchmarks/gpu/membound.py measures the speed on the H200)."""

import re

import tiled
import tiled.lang as T
from tests.conformance.k_elementwise import silu_and_mul
from tests.conformance.k_norm import rms_norm, softmax
from tiled.compiler.passes.guards import guard_program
from tiled.compiler.passes.layout_kinds import CyclicLayout
from tiled.compiler.targets.cuda.backend import CudaBackend
from tiled.compiler.targets.cuda.layouts import infer_layouts
from tiled.ir.program import as_program


def body(kernel, arch="sm_90a") -> str:
    src, _, _ = CudaBackend().generate_source(guard_program(as_program(kernel)), arch)
    return src[src.index('extern "C" __global__'):]


def _layouts(kernel) -> dict:
    p = as_program(kernel).proto
    names = {b.id: b.name for b in p.buffers}
    return {names[b]: v for b, v in infer_layouts(p).items()}


def test_cyclic_layouts_deal_runs_that_divide_the_row():
    # A float32 row of a bfloat16 tensor: runs of 8, one 16-byte access of the tensor each.
    lay = _layouts(rms_norm(M=64, N=4096, blk_m=1, dtype="bfloat16").kernel)
    assert lay["x_local"] == CyclicLayout((1, 4096), 128, 8)
    odd = rms_norm(M=64, N=2560, blk_m=1).kernel  # 2560 = 5 x 512: runs of 4
    assert {v.vec for v in _layouts(odd).values() if isinstance(v, CyclicLayout)} == {4}


def test_float32_rows_take_16_byte_runs():
    # Softmax over float32 tensors: runs of 4 (16 bytes), so each warp's float4 access covers
    # 512 contiguous bytes; runs of 8 put a warp's two float4 accesses half a line apart
    # (0.67-0.76 of the H200's copy bandwidth against 0.93-1.00 with runs of 4,
    # benchmarks/results/membound_h200*.json).
    lay = _layouts(softmax(M=64, N=4096, blk_m=1).kernel)
    assert {v.vec for v in lay.values() if isinstance(v, CyclicLayout)} == {4}
    src = body(softmax(M=64, N=4096, blk_m=1).kernel)
    assert re.search(r"X_ptr \+ \(\(\(\(int\)blockIdx.x\) \* 4096\) \+ "
                     r"\(\(\(int\)threadIdx.x\) \* 4\)\)", src)


def test_rms_norm_moves_vectors_and_reduces_with_shuffles():
    src = body(rms_norm(M=64, N=4096, blk_m=1, dtype="bfloat16").kernel)
    # Global and shared accesses of the row are vectors (4 lanes: float32 fragments cap them
    # at 16 bytes), the sum is 5 xor shuffles and one exchange of the 4 warps' partials.
    assert re.search(r"\*\(nv_bfloat164\*\)\(Y_ptr \+", src)
    assert re.search(r"\*\(nv_bfloat164\*\)\(W_ptr \+", src)
    assert src.count("__shfl_xor_sync") == 5
    assert "for (int v = 0; v < 4096; ++v)" not in src  # no thread walks a whole row


def test_softmax_and_silu_mul_vectors():
    src = body(softmax(M=64, N=4096, blk_m=1).kernel)
    assert re.search(r"\*\(float4\*\)\(X_ptr \+", src)
    assert re.search(r"\*\(float4\*\)\(Y_ptr \+", src)
    assert src.count("__shfl_xor_sync") == 10  # max and sum
    silu = body(silu_and_mul(M=64, N=14336, block_M=4, block_N=1024, dtype="bfloat16").kernel)
    # A nest with no fragment, dealt flat over the threads: runs of the column loop.
    assert re.search(r"\*\(nv_bfloat164\*\)\(X_ptr \+", silu)
    assert re.search(r"\*\(nv_bfloat164\*\)\(Y_ptr \+", silu)


def _shifted(shift: int):
    M = T.dyn("M")

    @tiled.kernel
    def shifted(X: T.Tensor((M, 1032), "float16"), Y: T.Tensor((M, 1024), "float16")):
        with T.Kernel(M, threads=128) as bx:
            for j in T.Parallel(1024):
                Y[bx, j] = X[bx, j + shift]

    return shifted


def test_accesses_off_the_run_alignment_stay_scalar():
    # X[bx, j + 1]: a vector load there would fault on alignment; + 8 keeps whole runs.
    assert "half4" not in body(_shifted(1)) and "uint4" not in body(_shifted(1))
    assert re.search(r"\*\((half4|uint4)\*\)\(X_ptr \+", body(_shifted(8)))


def test_float8_stays_scalar_where_it_is_converted_by_integer_code():
    """sm_80 converts float8 with integer code full of selects, which TVM's vectorizer turns
    into C that does not compile; such nests stay scalar, and the kernel compiles."""
    from tests.conformance.k_quant import absmax_quant
    from tiled.compiler.toolchain.nvcc import compile_cubin

    k = absmax_quant(M=64, N=256, out_dtype="float8_e4m3").kernel
    src, _, _ = CudaBackend().generate_source(guard_program(as_program(k)), "sm_80")
    assert compile_cubin(src, "sm_80")[:4] == b"\x7fELF"


def test_a_nest_that_sets_scalar_locals_keeps_one_per_vector_lane():
    """A local is one element per thread: vector lanes sharing it would each read what
    another lane left (the H200 saw relative error 0.71 from the rotary kernel, whose x1 / x2
    are locals, while its lanes shared them). In a vectorized nest each scalar local the body
    sets becomes one element per lane."""
    import tiled.ops as ops

    k = ops.kernel_factory("rotary_embedding", "cuda:sm_90a", heads=32, kv_heads=8,
                           head_size=128, rot_dim=128, dtype="bfloat16",
                           cache_dtype="bfloat16", is_neox=True)
    src = CudaBackend().generate_source(as_program(k), "sm_90a")[0]
    body = src[src.index('extern "C" __global__'):]
    assert not re.search(r"make_float2\(x[12]", body)  # no local broadcast to the lanes
    assert "nv_bfloat162" in body  # the loads and stores stay vectors
    assert re.search(r"float _ptr(_\d+)?\[2\]", body)  # a 2-lane local per scalar
