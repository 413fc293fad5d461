"""The metal target: every kernel comes out as one MSL source (tiled_metal.h and TVM's kernel)
that passed tiled's type check, with a manifest saying how to bind it (buffer indices, the
scalar-argument struct, threadgroup bytes, the MSL version); T.gemm takes 8x8 simdgroup
matrices where the dtypes allow; what Apple GPUs lack is a located CompileError. Numerics:
test_metal_emulate.py."""

from __future__ import annotations

import re

import pytest

import tiled.lang as T
from tests.emulated_examples import example
from tiled.compiler import compile_program
from tiled.compiler.registry import parse_target
from tiled.errors import CompileError, UnsupportedTarget


def kernel_text(source: str) -> str:
    """The part of the shipped source after tiled_metal.h: TVM's kernel."""
    return source[source.index("// ---- the kernel ----"):]


def test_targets():
    assert parse_target("metal").arch == "apple7"
    assert str(parse_target("metal:apple9")) == "metal:apple9"
    with pytest.raises(UnsupportedTarget, match="apple7, apple8, apple9"):
        parse_target("metal:apple10")


def test_elementwise_artifact_and_manifest():
    k = compile_program(example("elementwise").add(), "metal")
    m = k.manifest
    assert m.artifact_format == "msl" and m.target == "metal:apple7"
    assert k.artifact.decode("utf-8") == k.source
    assert "kernel void vadd_kernel(" in k.source and "#include <metal_stdlib>" in k.source
    assert m.symbol == "vadd_kernel" and m.block == (256, 1, 1)
    assert m.grid[0] == ("floordiv", ("sub", ("add", "N", 1024), 1), 1024)
    # Three tensors at buffers 0..2, the dim N in the argument struct at buffer 3.
    assert [ka.kind for ka in m.kernel_args] == ["tensor", "tensor", "tensor", "dim"]
    assert m.metal == {"language_version": "3.0", "simd_width": 32, "threadgroup_bytes": 0,
                       "fast_math": False, "args_buffer": 3, "args_size": 8,
                       "bindings": [{"buffer": 0}, {"buffer": 1}, {"buffer": 2},
                                    {"offset": 0, "size": 4}]}
    assert "device float* C_ptr [[ buffer(2) ]]" in k.source
    assert "constant vadd_kernel_args_t& arg [[ buffer(3) ]]" in k.source


def test_scalar_struct_layout():
    @T.prim_func
    def scaled(X: T.Tensor((T.dyn("M"), 64), "float16"), alpha: T.float32, shift: T.int32,
               Y: T.Tensor((T.dyn("M"), 64), "float16")):
        with T.Kernel(T.ceildiv(X.shape[0], 2), threads=64) as bx:
            for i, j in T.Parallel(2, 64):
                Y[bx * 2 + i, j] = X[bx * 2 + i, j] * alpha + shift

    k = compile_program(scaled, "metal:apple8")
    m = k.manifest
    order = [(ka.kind, ka.param if ka.kind != "dim" else ka.name) for ka in m.kernel_args]
    struct = re.search(r"struct scaled_kernel_args_t \{\n(.*?)\};", k.source, re.S).group(1)
    fields = re.findall(r"(\w+)(?:\[2\])?;", struct)
    assert [o for o in order if o[0] != "tensor"] == \
        [("scalar", 1) if f == "alpha" else ("scalar", 2) if f == "shift" else ("dim", f)
         for f in fields]
    scalars = [b for ka, b in zip(m.kernel_args, m.metal["bindings"], strict=True)
               if ka.kind != "tensor"]
    assert [b["offset"] for b in scalars] == [0, 8, 16][:len(scalars)]
    assert all(b["size"] == 4 for b in scalars) and m.metal["args_size"] == 8 * len(scalars)


def test_softmax_reduces_with_threadgroup_staging_and_barriers():
    k = compile_program(example("softmax").softmax(), "metal")
    text = kernel_text(k.source)
    assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in text
    pool = re.search(r"threadgroup (\w+) v\[(\d+)\];", text)
    size = {"float": 4, "half": 2, "uchar": 1}[pool.group(1)]
    # TVM retypes the uint8 pool without rescaling it; tiled declares exactly its bytes.
    assert int(pool.group(2)) * size == k.manifest.metal["threadgroup_bytes"] > 0


def test_whole_simdgroup_reductions_use_simd_sum_and_simd_max():
    @T.prim_func
    def row_stats(X: T.Tensor((4, 512), "float32"), S: T.Tensor((4,), "float32"),
                  Mx: T.Tensor((4,), "float32")):
        with T.Kernel(4, threads=128) as bx:
            x = T.alloc_fragment((1, 512), "float32")
            s = T.alloc_fragment((1,), "float32")
            mx = T.alloc_fragment((1,), "float32")
            T.copy(X[bx, 0], x)
            T.reduce_sum(x, s, dim=1)
            T.reduce_max(x, mx, dim=1)
            S[bx] = s[0]
            Mx[bx] = mx[0]

    text = kernel_text(compile_program(row_stats, "metal").source)
    assert "simd_sum(" in text and "simd_max(" in text and "__shfl" not in text


@pytest.mark.parametrize(("arch", "dtype", "path"), [
    ("apple7", "float16", "gemm_simdgroup_acc<half, half, float"),
    ("apple7", "float32", "gemm_simdgroup_acc<float, float, float"),
    ("apple7", "bfloat16", "gemm_simt<tiled::bf16, tiled::bf16, float"),  # no bfloat on M1
    ("apple9", "bfloat16", "gemm_simdgroup_acc<tiled::bf16, tiled::bf16, float"),
])
def test_gemm_takes_simdgroup_matrices_where_the_dtypes_allow(arch, dtype, path):
    k = compile_program(example("gemm").matmul(128, 128, 128, block_M=32, block_N=32,
                                               block_K=32, dtype=dtype), f"metal:{arch}")
    text = kernel_text(k.source)
    assert f"tiled::{path}" in text
    assert k.manifest.metal["language_version"] == ("3.1" if arch == "apple9" else "3.0")
    assert ("#define TILED_MSL_BFLOAT 1" in k.source) == (arch == "apple9")
    # T.Pipelined(num_stages=3) keeps two threadgroup buffers on Metal (no async copies).
    assert k.manifest.metal["threadgroup_bytes"] <= 32 * 1024
    assert "tiled::cp_async<16>" in text  # 16-byte loads into threadgroup memory


def gemm_relu(M, N, K, block_M, block_N, block_K):
    """examples/gemm.py with a ReLU epilogue that reads the accumulator elementwise."""

    @T.prim_func
    def kernel(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
               C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), "float16")
            B_s = T.alloc_shared((block_K, block_N), "float16")
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(block_M, block_N):
                acc[i, j] = T.max(acc[i, j], 0)
            T.copy(acc, C[by * block_M, bx * block_N])

    return kernel


def test_the_accumulator_stays_in_simdgroup_matrices_across_the_k_loop():
    # Only T.clear, T.gemm and T.copy out touch C_local: it is simdgroup_float8x8 registers
    # (4 simdgroups x 4 tiles of 32 x 32), filled, accumulated and stored as matrices.
    k = compile_program(example("gemm").matmul(128, 128, 128, block_M=32, block_N=32,
                                               block_K=32), "metal")
    text = kernel_text(k.source)
    assert "simdgroup_float8x8 C_local[4];" in text
    assert "tiled::fill_simdgroup<4>" in text
    assert len(re.findall(r"tiled::gemm_simdgroup_acc<half, half, float, 32, 32, 32, 4,",
                          text)) == 1
    assert "tiled::store_simdgroup<float, 32, 32, 4, 32>" in text
    assert "tiled::gemm_simdgroup<" not in text


def test_a_resident_accumulator_is_copied_out_in_chunks_when_it_does_not_fit():
    # 64 x 128 float accumulator (32 KiB) beside 12 KiB of tiles: stored 32 rows at a time.
    k = compile_program(example("gemm").matmul(256, 256, 64, block_M=64, block_N=128,
                                               block_K=16, num_stages=2), "metal")
    text = kernel_text(k.source)
    assert re.findall(r"tiled::store_simdgroup<float, 64, 128, 4, 32>\(.*?, (\d+), ", text) \
        == ["0", "32"]
    assert k.manifest.metal["threadgroup_bytes"] <= 32 * 1024


def test_an_accumulator_read_elementwise_keeps_the_cyclic_layout_in_chunks():
    # The ReLU epilogue reads acc per thread: it stays in the cyclic layout (no simdgroup
    # matrix outlives a gemm) and each gemm stages it through threadgroup memory, 32 of its
    # 64 rows at a time beside 12 KiB of tiles.
    k = compile_program(gemm_relu(256, 256, 64, 64, 128, 16), "metal")
    text = kernel_text(k.source)
    assert "simdgroup_float8x8 acc" not in text and "gemm_simdgroup_acc" not in text
    calls = re.findall(r"tiled::gemm_simdgroup<half, half, float, (\d+), 128,", text)
    assert len(calls) >= 2 and all(64 % int(c) == 0 and int(c) < 64 for c in calls)
    assert k.manifest.metal["threadgroup_bytes"] <= 32 * 1024


def test_too_much_threadgroup_memory_is_a_located_error():
    with pytest.raises(CompileError, match=r"gemm\.py:\d+: kernel needs \d+\.\d KiB of "
                                           r"threadgroup memory.*32 KiB per threadgroup"):
        compile_program(example("gemm").matmul(), "metal")  # 128 x 128 x 32 tiles


def test_what_apple_gpus_lack_is_a_located_error():
    with pytest.raises(CompileError, match=r"gemm_ws_explicit\.py:\d+: .*explicit Hopper path"
                                           r".*not metal:apple7"):
        compile_program(example("gemm_ws_explicit").matmul(), "metal")

    @T.prim_func
    def fp8(X: T.Tensor((64,), "float8_e4m3"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                Y[i] = X[i]

    with pytest.raises(CompileError, match=r"X is float8_e4m3.*no float8 type"):
        compile_program(fp8, "metal")

    @T.prim_func
    def f64(X: T.Tensor((64,), "float64"), Y: T.Tensor((64,), "float64")):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                Y[i] = X[i]

    with pytest.raises(CompileError, match="MSL has no double"):
        compile_program(f64, "metal")

    @T.prim_func
    def atomic16(X: T.Tensor((64,), "float16"), Y: T.Tensor((1,), "float16")):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                T.atomic_add(Y[0], X[i])

    with pytest.raises(CompileError, match=r"test_metal_compile\.py:\d+: atomic add of "
                                           r"float16 elements is not supported on metal"):
        compile_program(atomic16, "metal")


def test_the_toolchain_digest_covers_the_metal_headers(tmp_path):
    from tiled.compiler.toolchain import msl
    from tiled.compiler.toolchain.digest import toolchain_record

    record = toolchain_record("metal:apple7")
    assert record["headers"] == msl.headers_digest() and "clang" in record["clang"]
    assert {p.name for p in msl.INCLUDE.rglob("*") if p.is_file()} >= {
        "tiled_metal.h", "metal_stdlib", "tiled_msl_cpu.h", "tiled_msl_runtime.cc"}
