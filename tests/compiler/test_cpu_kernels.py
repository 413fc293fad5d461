"""Kernels compiled for `cpu` and run through tiled.runtime, against numpy references."""

import sys
from pathlib import Path

import numpy as np
import pytest

import tiled
import tiled.lang as T

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import elementwise
import gemm as gemm_example
import softmax as softmax_example

ml_dtypes = pytest.importorskip("ml_dtypes")


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np_dtype(dtype))


@pytest.mark.parametrize("dtype,out_dtype,tol", [
    ("float32", "float32", 1e-5),
    ("float16", "float32", 1e-3),   # fp16 inputs, fp32 accumulation: only input rounding
    ("bfloat16", "float32", 1e-3),
    ("float16", "float16", 2e-3),   # plus output rounding
])
def test_gemm_ragged_1000(dtype, out_dtype, tol):
    M = N = K = 1000
    k = tiled.compile(gemm_example.matmul(M, N, K, dtype=dtype, out_dtype=out_dtype), "cpu")
    rng = np.random.default_rng(1)
    a, b = rand(rng, (M, K), dtype), rand(rng, (K, N), dtype)
    c = np.full((M, N), np.nan, np_dtype(out_dtype))  # poisoned: every element must be written
    k(a, b, c)
    assert not np.isnan(c.astype(np.float32)).any()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_err(c, ref) < tol


def test_gemm_symbolic_m_runs_many_sizes_with_one_compile():
    k = tiled.compile(gemm_example.matmul(T.dyn("M"), 256, 192, block_M=64, block_N=64,
                                          dtype="float32"), "cpu")
    assert list(k.manifest.params[0].shape) == ["M", 192]
    rng = np.random.default_rng(2)
    for M in (1, 63, 64, 333):
        a, b = rand(rng, (M, 192), "float32"), rand(rng, (192, 256), "float32")
        c = np.full((M, 256), np.nan, np.float32)
        k(a, b, c)
        assert rel_err(c, a @ b) < 1e-5, M


def test_gemm_transposed_operands():
    def make(ta, tb):
        @tiled.kernel
        def gemm_t(A: T.Tensor((48, 80) if ta else (80, 48), "float32"),
                   B: T.Tensor((72, 48) if tb else (48, 72), "float32"),
                   C: T.Tensor((80, 72), "float32")):
            with T.Kernel(T.ceildiv(72, 32), T.ceildiv(80, 32), threads=64) as (bx, by):
                A_s = T.alloc_shared((16, 32) if ta else (32, 16), "float32")
                B_s = T.alloc_shared((32, 16) if tb else (16, 32), "float32")
                C_l = T.alloc_fragment((32, 32), "float32")
                T.clear(C_l)
                for k in T.serial(3):
                    if ta:
                        T.copy(A[k * 16, by * 32], A_s)
                    else:
                        T.copy(A[by * 32, k * 16], A_s)
                    if tb:
                        T.copy(B[bx * 32, k * 16], B_s)
                    else:
                        T.copy(B[k * 16, bx * 32], B_s)
                    T.gemm(A_s, B_s, C_l, transpose_A=ta, transpose_B=tb)
                T.copy(C_l, C[by * 32, bx * 32])

        return gemm_t

    rng = np.random.default_rng(3)
    for ta in (False, True):
        for tb in (False, True):
            a = rand(rng, (48, 80) if ta else (80, 48), "float32")
            b = rand(rng, (72, 48) if tb else (48, 72), "float32")
            c = np.zeros((80, 72), np.float32)
            tiled.compile(make(ta, tb), "cpu")(a, b, c)
            ref = (a.T if ta else a) @ (b.T if tb else b)
            assert rel_err(c, ref) < 1e-5, (ta, tb)


def test_softmax():
    k = tiled.compile(softmax_example.softmax(256), "cpu")
    x = np.random.default_rng(4).standard_normal((1003, 256)).astype(np.float32) * 4
    y = np.full_like(x, np.nan)
    k(x, y)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_elementwise_symbolic_length():
    k = tiled.compile(elementwise.add(), "cpu")
    rng = np.random.default_rng(5)
    for n in (1, 1023, 100_003):
        a, b = rand(rng, n, "float32"), rand(rng, n, "float32")
        c = np.full(n, np.nan, np.float32)
        k(a, b, c)
        np.testing.assert_array_equal(c, a + b)


def test_reductions_atomics_scalars_and_math():
    M = T.dyn("M")

    @tiled.kernel
    def stats(X: T.Tensor((M, 64), "float32"), out: T.Tensor((M, 4), "float32"),
              total: T.Tensor((1,), "float32"), scale: T.float32, limit: T.int32):
        with T.Kernel(T.ceildiv(M, 8), threads=64) as bx:
            x = T.alloc_fragment((8, 64), "float32")
            lo = T.alloc_fragment((8,), "float32")
            hi = T.alloc_fragment((8,), "float32")
            s = T.alloc_fragment((8,), "float32")
            acc = T.alloc_local((1,), "float32")
            T.copy(X[bx * 8, 0], x)
            T.reduce_min(x, lo, dim=1)
            T.reduce_max(x, hi, dim=1)
            T.fill(s, 1.0)
            T.reduce_sum(x, s, dim=1, clear=False)   # s = 1 + row sum
            acc[0] = 0.0
            for i in T.serial(8):
                if bx * 8 + i < M:
                    out[bx * 8 + i, 0] = lo[i]
                    out[bx * 8 + i, 1] = hi[i]
                    out[bx * 8 + i, 2] = s[i] * scale
                    out[bx * 8 + i, 3] = T.sqrt(T.abs(hi[i])) + T.max(T.tanh(lo[i]), -0.5)
                    acc[0] = acc[0] + T.if_then_else(i < limit, T.exp2(lo[i] * 0.0), 0.0)
            T.atomic_add(total[0], acc[0])

    k = tiled.compile(stats, "cpu")
    rng = np.random.default_rng(6)
    x = rand(rng, (29, 64), "float32")
    out = np.full((29, 4), np.nan, np.float32)
    total = np.zeros(1, np.float32)
    k(x, out, total, 0.5, 5)
    np.testing.assert_allclose(out[:, 0], x.min(1), rtol=1e-6)
    np.testing.assert_allclose(out[:, 1], x.max(1), rtol=1e-6)
    np.testing.assert_allclose(out[:, 2], (1 + x.sum(1)) * 0.5, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        out[:, 3], np.sqrt(np.abs(x.max(1))) + np.maximum(np.tanh(x.min(1)), -0.5), rtol=1e-5)
    # Each of the 4 blocks counts its rows with i < 5 that exist: 5 + 5 + 5 + 5 (29 = 3*8 + 5).
    assert total[0] == 20.0


def test_launch_rejects_bad_arguments_before_running():
    k = tiled.compile(elementwise.add(), "cpu")
    a = np.zeros(10, np.float32)
    with pytest.raises(tiled.LaunchError, match="float"):
        k(a, a, np.zeros(10, np.float64))
    with pytest.raises(tiled.LaunchError):
        k(a, a, np.zeros(11, np.float32))
    with pytest.raises(tiled.LaunchError):
        k(a, a)
