"""The TileLang tile ops of issue 11 compiled for `metal` and run under the CPU emulation
against numpy (the kernels of test_cpu_tileops.py): T.reduce_absmax, T.cumsum, T.atomic_max /
atomic_min across threadgroups (and NaN's rule), T.vectorized bodies, T.gemm with A in a
fragment (simdgroup path, staged through threadgroup memory), T.copy with casts. Atomics of
types Metal has no atomic for are a located CompileError."""

import numpy as np
import pytest

import tiled.lang as T
from tests.compiler.test_cpu_tileops import (
    absmax_kernel,
    atomics_kernel,
    cumsum_kernel,
    cumsum_reference,
    data,
    np_dtype,
)
from tiled.compiler import compile_program
from tiled.errors import CompileError


@pytest.mark.parametrize(("dtype", "acc"), [("float32", "float32"), ("bfloat16", "float32"),
                                            ("int8", "int32")])
def test_reduce_absmax_ragged(dtype, acc):
    M, N = 37, 50
    k = compile_program(absmax_kernel(M, N, dtype, acc), "metal")
    rng = np.random.default_rng(1)
    x = data(rng, (M, N), dtype)
    prev = data(rng, (M,), acc, scale=6.0)
    y, z = np.full(M, 99, np_dtype(acc)), np.full(M, 99, np_dtype(acc))
    k.emulate(x, prev, y, z)
    amax = np.abs(x.astype(np.float64)).max(1)
    np.testing.assert_array_equal(y, amax.astype(np_dtype(acc)))
    np.testing.assert_array_equal(z, np.maximum(prev.astype(np.float64), amax)
                                  .astype(np_dtype(acc)))


@pytest.mark.parametrize(("scope", "dim", "reverse", "in_place"), [
    ("shared", 0, False, True), ("fragment", 1, True, False)])
def test_cumsum_float32_ragged(scope, dim, reverse, in_place):
    M, N = 29, 37
    k = compile_program(cumsum_kernel(M, N, "float32", scope, dim, reverse, in_place), "metal")
    x = data(np.random.default_rng(2), (M, N), "float32")
    y = np.full_like(x, np.nan)
    k.emulate(x, y)
    np.testing.assert_allclose(y, cumsum_reference(x, "float32", dim, reverse), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "uint32", "float32"])
def test_atomic_max_min_across_threadgroups(dtype):
    n, block = 1001, 64
    k = compile_program(atomics_kernel(n, dtype, block), "metal")
    x = data(np.random.default_rng(4), (n,), dtype, scale=100.0)
    hi, lo = np.full(4, x.min(), x.dtype), np.full(4, x.max(), x.dtype)
    block_hi = np.zeros(-(-n // block), x.dtype)
    k.emulate(x, hi, lo, block_hi)
    lanes = np.arange(n) % block % 4
    np.testing.assert_array_equal(hi, [x[lanes == j].max() for j in range(4)])
    np.testing.assert_array_equal(lo, [x[lanes == j].min() for j in range(4)])
    padded = np.full(len(block_hi) * block, x.min(), x.dtype)
    padded[:n] = x
    np.testing.assert_array_equal(block_hi, padded.reshape(-1, block).max(1))


@pytest.mark.parametrize("scope", ["global", "shared"])
def test_float_atomic_max_min_nan_rule(scope):
    @T.prim_func
    def k(X: T.Tensor((6,), "float32"), Hi: T.Tensor((2,), "float32"),
          Lo: T.Tensor((2,), "float32")):
        with T.Kernel(1, threads=64):
            hi, lo = Hi, Lo
            if scope == "shared":
                hi, lo = T.alloc_shared((2,), "float32"), T.alloc_shared((2,), "float32")
                T.copy(Hi[0], hi)
                T.copy(Lo[0], lo)
            for i in T.Parallel(6):
                T.atomic_max(hi[i % 2], X[i])
                T.atomic_min(lo[i % 2], X[i])
            if scope == "shared":
                T.copy(hi, Hi[0])
                T.copy(lo, Lo[0])

    kk = compile_program(k, "metal")
    x = np.array([np.nan, -0.0, 1.5, 0.0, np.nan, -3.0], np.float32)
    hi = np.array([-np.inf, np.nan], np.float32)
    lo = np.array([np.inf, np.nan], np.float32)
    kk.emulate(x, hi, lo)
    np.testing.assert_array_equal(hi, [1.5, np.nan])
    np.testing.assert_array_equal(lo, [1.5, np.nan])


@pytest.mark.parametrize("dtype", ["int8", "int64", "float16", "bfloat16", "uint8"])
def test_atomics_metal_lacks_are_located_errors(dtype):
    with pytest.raises(CompileError, match=r"test_cpu_tileops\.py:\d+: atomic max of "
                                           f"{dtype} elements is not supported on metal"):
        compile_program(atomics_kernel(256, dtype), "metal")


def test_vectorized_bodies_of_every_metal_dtype():
    n = 16
    for dtype in ("float16", "bfloat16", "int8", "uint16", "float32"):
        @T.prim_func
        def k(X: T.Tensor((32, n), dtype), Y: T.Tensor((32, n), dtype)):
            with T.Kernel(2, threads=64) as bx:
                x = T.alloc_shared((16, n), dtype)
                y = T.alloc_fragment((16, n), dtype)
                T.copy(X[bx * 16, 0], x)
                for i in T.Parallel(16):
                    for v in T.vectorized(n):
                        y[i, v] = x[i, v] + x[i, v]
                T.copy(y, Y[bx * 16, 0])

        kk = compile_program(k, "metal")
        x = (np.random.default_rng(6).integers(-16, 16, (32, n)) / 2).astype(np_dtype(dtype))
        if dtype.startswith("u"):
            x = np.abs(x.astype(np.int64)).astype(dtype)
        y = np.zeros_like(x)
        kk.emulate(x, y)
        ref = (x.astype(np.float64) * 2).astype(np_dtype(dtype))
        np.testing.assert_array_equal(y.astype(np.float64), ref.astype(np.float64), dtype)


def test_gemm_with_a_fragment_operand_and_a_traced_clear():
    M, N, K, bm, bn, bk = 100, 72, 80, 32, 32, 16  # ragged in M, N and K

    @T.prim_func
    def k(A: T.Tensor((M, K), "float32"), B: T.Tensor((K, N), "float16"),
          C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            a_s = T.alloc_shared((bm, bk), "float32")
            a_f = T.alloc_fragment((bm, bk), "float32")
            a_h = T.alloc_fragment((bm, bk), "float16")
            b_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.fill(acc, 123.0)  # clear_accum on the first step (a traced flag) must drop this
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], a_s)
                T.copy(a_s, a_f)
                T.copy(a_f, a_h)
                T.copy(B[ko * bk, bx * bn], b_s)
                T.gemm(a_h, b_s, acc, clear_accum=ko == 0)
            T.copy(acc, C[by * bm, bx * bn])

    kk = compile_program(k, "metal")
    # the accumulator stays in simdgroup matrices; the traced clear fills them
    assert "tiled::gemm_simdgroup_acc<half, half, float" in kk.source
    rng = np.random.default_rng(7)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.full((M, N), np.nan, np.float32)
    kk.emulate(a, b, c)
    ref = a.astype(np.float16).astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-4)


def test_resident_accumulator_staged_through_threadgroup_memory():
    """T.copy(acc, C_shared); T.copy(C_shared, C) (TileLang's epilogue): the copy out of the
    simdgroup matrices writes C_shared after its own barriers, and the copy that reads it
    waits for those writes (it once read the scratch-cleared, uninitialized tile: NaNs)."""
    M, N, K, bm, bn, bk = 96, 64, 48, 64, 64, 16  # the second row block is ragged

    @T.prim_func
    def k(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
          C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            a_s = T.alloc_shared((bm, bk), "float16")
            b_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            c_s = T.alloc_shared((bm, bn), "float16")
            T.clear(acc)
            for ko in T.Pipelined(K // bk, num_stages=2):
                T.copy(A[by * bm, ko * bk], a_s)
                T.copy(B[ko * bk, bx * bn], b_s)
                T.gemm(a_s, b_s, acc)
            T.copy(acc, c_s)
            T.copy(c_s, C[by * bm, bx * bn])

    kk = compile_program(k, "metal")
    assert "tiled::gemm_simdgroup_acc<" in kk.source
    rng = np.random.default_rng(3)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.zeros((M, N), np.float16)
    kk.emulate(a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c.astype(np.float64), ref, rtol=2e-3, atol=2e-2)


def test_float_atomic_add_in_threadgroup_and_device_memory():
    @T.prim_func
    def k(X: T.Tensor((256,), "float32"), Y: T.Tensor((1,), "float32")):
        with T.Kernel(2, threads=64) as bx:
            s = T.alloc_shared((1,), "float32")
            s[0] = 0.0
            for i in T.Parallel(128):
                T.atomic_add(s[0], X[bx * 128 + i])  # a compare-and-swap loop (threadgroup)
            T.atomic_add(Y[0], s[0])  # atomic_float (device)

    kk = compile_program(k, "metal")
    x = np.arange(256, dtype=np.float32)  # exact sums in float32
    y = np.zeros(1, np.float32)
    kk.emulate(x, y)
    assert y[0] == x.sum()
