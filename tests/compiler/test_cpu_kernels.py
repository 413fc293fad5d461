"""Kernels compiled for `cpu` and run through tiled.runtime, against numpy references."""

import sys
from pathlib import Path

import numpy as np
import pytest

import tiled
import tiled.lang as T

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))  # op_kernels: the kernels the H200 run checks
import elementwise
import gemm as gemm_example
import op_kernels
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


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
def test_gemm_transposed_operands(dtype):
    M, N, K = 256, 192, 160
    rng = np.random.default_rng(3)
    for ta in (False, True):
        for tb in (False, True):
            if dtype == "float32" and (ta, tb) != (True, True):
                continue  # fp32 covers the one combination the others' fast path skips
            shape_a, shape_b = ((K, M) if ta else (M, K)), ((N, K) if tb else (K, N))
            if dtype == "int8":
                a = rng.integers(-8, 8, shape_a).astype(np.int8)
                b = rng.integers(-8, 8, shape_b).astype(np.int8)
                c = np.full((M, N), -12345, np.int32)
            else:
                a, b = rand(rng, shape_a, dtype), rand(rng, shape_b, dtype)
                c = np.full((M, N), np.nan, np.float32)
            tiled.compile(op_kernels.gemm_transposed(ta, tb, dtype), "cpu")(a, b, c)
            ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
            assert rel_err(c, ref) <= (0 if dtype == "int8" else 1e-5), (ta, tb)


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
    k = tiled.compile(op_kernels.stats(), "cpu")
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


def test_copies_fills_shared_atomics_unroll():
    k = tiled.compile(op_kernels.copies(), "cpu")
    x = np.random.default_rng(8).standard_normal((1001, 39)).astype(np.float32)
    y = np.full_like(x, np.nan)
    hist = np.zeros(16, np.int32)
    k(x, y, hist)
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
    assert hist.tolist() == op_kernels.copies_histogram(1001)


def test_unary_math_with_traced_guard():
    k = tiled.compile(op_kernels.unary_math("float32"), "cpu")
    x = np.random.default_rng(7).standard_normal((1001, 96)).astype(np.float32)
    y = np.full_like(x, np.nan)
    k(x, y)
    ref = np.exp(x * 0.5) + np.log(np.abs(x) + 1) + 1 / np.sqrt(x * x + 1) + np.tanh(x)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_launch_rejects_bad_arguments_before_running():
    k = tiled.compile(elementwise.add(), "cpu")
    a = np.zeros(10, np.float32)
    with pytest.raises(tiled.LaunchError, match="float"):
        k(a, a, np.zeros(10, np.float64))
    with pytest.raises(tiled.LaunchError):
        k(a, a, np.zeros(11, np.float32))
    with pytest.raises(tiled.LaunchError):
        k(a, a)


@pytest.mark.parametrize("grid", [(5, 7, 1), (3, 10, 2)])
def test_every_block_runs_once(grid):
    """The cpu backend runs the grid as one parallel loop over fused block numbers, handed to
    threads in chunks (the shim's pool): every block index runs exactly once, symbolic extents
    included."""
    X, Y, Z = T.dyn("X"), T.dyn("Y"), T.dyn("Z")

    @tiled.kernel
    def blocks(Out: T.Tensor((Z, Y, X), "int32")):
        with T.Kernel(X, Y, Z, threads=1) as (bx, by, bz):
            Out[bz, by, bx] = Out[bz, by, bx] + bz * 10000 + by * 100 + bx + 1

    k = tiled.compile(blocks, "cpu")
    out = np.zeros(grid[::-1], np.int32)
    k(out)
    z, y, x = np.meshgrid(*(np.arange(g) for g in grid[::-1]), indexing="ij")
    np.testing.assert_array_equal(out, z * 10000 + y * 100 + x + 1)


def block_workspaces():
    M = T.dyn("M")

    @tiled.kernel
    def workspaces_kernel(X: T.Tensor((M, 1024), "float32"), Y: T.Tensor((M, 1024), "float32")):
        with T.Kernel(M, threads=128) as bx:
            big = T.alloc_fragment((1280, 1024), "float32")  # 5 MiB: freed, never kept
            mid = T.alloc_fragment((16, 1024), "float32")
            row = T.alloc_fragment((1024,), "float32")
            for i, j in T.Parallel(1280, 1024):
                big[i, j] = X[bx, j] * i
            for i, j in T.Parallel(16, 1024):
                mid[i, j] = X[bx, j] + i
            for j in T.Parallel(1024):
                row[j] = big[1279, j] + big[1, j] + mid[15, j]
            for j in T.Parallel(1024):
                Y[bx, j] = row[j] + bx
    return workspaces_kernel


def test_block_workspaces_reused_across_blocks_and_calls():
    """The shim hands a block's freed tiles to the thread's next blocks (cpu shim.c); every
    block still computes from its own writes, whatever an earlier block or call left there."""
    k = tiled.compile(block_workspaces(), target="cpu")
    rng = np.random.default_rng(0)
    for rows in (37, 5, 37):
        x = rng.standard_normal((rows, 1024), dtype=np.float32)
        y = np.zeros_like(x)
        k(x, y)
        want = x.astype(np.float64) * 1281 + 15 + np.arange(rows)[:, None]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-3)
