"""Metal kernels run on the CPU (`CompiledKernel.emulate`): the shipped MSL built over tiled's
CPU <metal_stdlib> (threads of a threadgroup as fibers, barriers and simdgroup operations as
their meeting points, poisoned threadgroup memory, simdgroup matrices exact) matches numpy;
and what the emulation exists to catch is reported: a missing barrier (the poison shows), a
barrier in divergent code, a barrier part of the group never reaches, a simdgroup operation
half the lanes skip, a write outside a tensor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tiled.lang as T
from tests.compiler.test_metal_compile import gemm_relu
from tests.emulated_examples import example, rel_err
from tiled.compiler import compile_program
from tiled.compiler.targets.metal.emulate import emulate
from tiled.errors import EmulationError, LaunchError


def test_elementwise_ragged():
    k = compile_program(example("elementwise").add(), "metal")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3000)).astype(np.float32)  # a ragged last threadgroup
    c = np.zeros(3000, np.float32)
    k.emulate(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    with pytest.raises(LaunchError, match="expected dtype float32"):
        k.emulate(a, b, np.zeros(3000, np.float16))


def test_softmax():
    k = compile_program(example("softmax").softmax(), "metal")
    x = np.random.default_rng(1).standard_normal((7, 256)).astype(np.float32) * 4
    y = np.zeros_like(x)
    k.emulate(x, y)
    ref = np.exp(x - x.max(1, keepdims=True))
    assert rel_err(y, ref / ref.sum(1, keepdims=True)) < 1e-6


@pytest.mark.parametrize(("arch", "dtype", "tol"), [
    ("apple7", "float16", 2e-3), ("apple7", "float32", 1e-6), ("apple7", "bfloat16", 1e-2),
    ("apple9", "bfloat16", 1e-2)])
def test_gemm_ragged_symbolic_m(arch, dtype, tol):
    M, N, K = 100, 72, 96  # ragged M and N tiles, M symbolic
    k = compile_program(example("gemm").matmul(T.dyn("M"), N, K, block_M=32, block_N=32,
                                               block_K=32, dtype=dtype), f"metal:{arch}")
    npdt = {"float16": np.float16, "float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(2)
    a = rng.standard_normal((M, K)).astype(npdt)
    b = rng.standard_normal((K, N)).astype(npdt)
    c = np.full((M, N), 7, npdt)
    k.emulate(a, b, c)
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64)) < tol


def test_gemm_with_the_accumulator_staged_in_chunks():
    M, N, K = 64, 128, 48  # 64 x 128 float C beside 16 KiB of tiles: two 32-row chunks
    k = compile_program(example("gemm").matmul(M, N, K, block_M=64, block_N=128, block_K=16,
                                               num_stages=2), "metal")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.zeros((M, N), np.float16)
    k.emulate(a, b, c)
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64)) < 2e-3


def test_a_resident_accumulator_ragged_and_copied_out_in_chunks():
    # C_local lives in simdgroup matrices across the K loop and leaves in two 32-row chunks;
    # M, N and K are all ragged against the 64 x 128 x 16 tiles.
    M, N, K = 100, 200, 40
    k = compile_program(example("gemm").matmul(M, N, K, block_M=64, block_N=128, block_K=16,
                                               num_stages=2), "metal")
    assert "tiled::gemm_simdgroup_acc<" in k.source
    assert k.source.count("tiled::store_simdgroup<float, 64, 128, 4, 32>(") == 2
    rng = np.random.default_rng(5)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.full((M, N), np.nan, np.float16)
    k.emulate(a, b, c)
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64)) < 2e-3


def test_an_accumulator_read_elementwise_matches_numpy():
    M, N, K = 100, 200, 40  # the cyclic layout's gemm, staged in chunks, ragged tiles
    k = compile_program(gemm_relu(M, N, K, 64, 128, 16), "metal")
    assert "tiled::gemm_simdgroup<" in k.source and "gemm_simdgroup_acc<" not in k.source
    rng = np.random.default_rng(6)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.full((M, N), np.nan, np.float16)
    k.emulate(a, b, c)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    assert rel_err(c, ref) < 2e-3


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention(causal):
    fa = example("flash_attention")
    b, h, kvh, s, d = 1, 2, 1, 80, 64  # GQA, a ragged last key tile
    k = compile_program(fa.flash_attention(b, h, kvh, s, s, d, causal, block_M=32,
                                           block_N=32), "metal")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((b, h, s, d)).astype(np.float16)
    kk, v = (rng.standard_normal((b, kvh, s, d)).astype(np.float16) for _ in "kv")
    o = np.full(q.shape, np.nan, np.float16)
    k.emulate(q, kk, v, o)
    assert rel_err(o, fa.reference(q, kk, v, causal)) < 2e-3


# --- what the emulation catches, on hand-written MSL --------------------------------------

@T.prim_func
def reverse(X: T.Tensor((128,), "float32")):
    with T.Kernel(2, threads=64) as bx:
        s = T.alloc_shared((64,), "float32")
        for i in T.Parallel(64):
            s[i] = X[bx * 64 + i]
        for i in T.Parallel(64):
            X[bx * 64 + i] = s[63 - i]


MSL = """#include <metal_stdlib>
using namespace metal;

kernel void reverse_kernel(device float* X_ptr [[ buffer(0) ]],
  uint blockIdx [[threadgroup_position_in_grid]],
  uint threadIdx [[thread_position_in_threadgroup]]
) {
  threadgroup float t[64];
  t[threadIdx] = X_ptr[blockIdx * 64 + threadIdx];
%s
  X_ptr[blockIdx * 64 + threadIdx] = t[63 - threadIdx];
}
"""
BARRIER = "  threadgroup_barrier(mem_flags::mem_threadgroup);"


@pytest.fixture(scope="module")
def reverse_kernel():
    return compile_program(reverse, "metal")


def run(kernel, body: str) -> np.ndarray:
    x = np.arange(128, dtype=np.float32)
    emulate(kernel.artifact, kernel.manifest, (x,), source=MSL % body)
    return x


def test_tiled_places_the_barrier(reverse_kernel):
    x = np.arange(128, dtype=np.float32)
    reverse_kernel.emulate(x)
    np.testing.assert_array_equal(x, np.arange(128, dtype=np.float32).reshape(2, 64)[:, ::-1]
                                  .reshape(-1))
    assert run(reverse_kernel, BARRIER).tolist() == x.tolist()


def test_a_missing_barrier_reads_the_poison(reverse_kernel):
    # Group 0 starts its threads in ascending order, group 1 in descending order: in each,
    # the first thread reads what a thread that has not run yet writes.
    x = run(reverse_kernel, "")
    assert np.isnan(x[0]) and np.isnan(x[127])


def test_a_barrier_in_divergent_code_is_an_error(reverse_kernel):
    body = f"  if (threadIdx < 32) {{\n{BARRIER}\n  }} else {{\n{BARRIER}\n  }}"
    with pytest.raises(EmulationError, match=r"threadgroup \(0, 0, 0\): divergent barrier: "
                                             r"threads 0-31 wait at threadgroup_barrier on MSL "
                                             r"line 11, thread 32 reached .* line 13"):
        run(reverse_kernel, body)


def test_a_barrier_part_of_the_group_skips_is_an_error(reverse_kernel):
    with pytest.raises(EmulationError, match=r"thread 32 returned while threads 0-31 wait at "
                                             r"threadgroup_barrier \(MSL line 11\): a barrier "
                                             r"reached by part of the threadgroup"):
        run(reverse_kernel, f"  if (threadIdx < 32) {{\n{BARRIER}\n  }}")


def test_a_simdgroup_operation_half_the_lanes_skip_is_an_error(reverse_kernel):
    body = "  if (threadIdx % 32 < 16) t[threadIdx] = simd_sum(1.0f);\n" + BARRIER
    with pytest.raises(EmulationError, match=r"deadlock: no thread can run; threads 0-15, "
                                             r"32-47 wait at a simdgroup operation \(MSL line "
                                             r"10\); threads 16-31, 48-63 wait at "
                                             r"threadgroup_barrier \(MSL line 11\)"):
        run(reverse_kernel, body)


def test_a_write_outside_a_tensor_is_reported(reverse_kernel):
    body = BARRIER + "\n  X_ptr[128 + threadIdx] = 0.0f;"
    with pytest.raises(EmulationError, match=r"wrote outside the tensor at buffer\(0\)"):
        run(reverse_kernel, body)


def test_a_crash_is_an_error_not_a_dead_caller(reverse_kernel):
    with pytest.raises(EmulationError, match="SIGSEGV"):
        run(reverse_kernel, "  *(device volatile int*)8 = 1;")
