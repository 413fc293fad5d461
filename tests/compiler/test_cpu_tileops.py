"""The TileLang tile ops of issue 11 compiled for `cpu` and run against numpy: T.reduce_absmax,
T.cumsum, T.atomic_max / atomic_min (across the backend's parallel blocks), T.vectorized,
T.gemm with A in a fragment under each warp policy, T.copy with casts, T.max_value /
min_value / infinity. Shapes are ragged where a tail can go wrong (rows past the tensor read
as zero and are not written)."""

import re

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.compiler.passes.guards import guard_program
from tiled.compiler.targets.cpu.lower import lower_cpu

ml_dtypes = pytest.importorskip("ml_dtypes")

NP = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3": ml_dtypes.float8_e4m3fn,
      "float8_e5m2": ml_dtypes.float8_e5m2}


def np_dtype(name):
    return NP.get(name, np.dtype(name))


def data(rng, shape, dtype, scale=3.0):
    if np.dtype(np_dtype(dtype)).kind in "iu":
        info = np.iinfo(np_dtype(dtype))
        return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return (rng.standard_normal(shape) * scale).astype(np_dtype(dtype))


# -- T.reduce_absmax ------------------------------------------------------------------------------

def absmax_kernel(M, N, dtype, acc, rows=8):
    @tiled.kernel
    def absmax(X: T.Tensor((M, N), dtype), Prev: T.Tensor((M,), acc), Y: T.Tensor((M,), acc),
               Z: T.Tensor((M,), acc)):
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            x = T.alloc_shared((rows, N), dtype)
            m = T.alloc_fragment((rows,), acc)
            T.copy(X[bx * rows, 0], x)
            T.reduce_absmax(x, m, dim=1)
            T.copy(m, Y[bx * rows])
            T.copy(Prev[bx * rows], m)
            T.reduce_absmax(x, m, dim=1, clear=False)  # max(old, max |x|): old kept as is
            T.copy(m, Z[bx * rows])
    return absmax


@pytest.mark.parametrize(("dtype", "acc"), [("float32", "float32"), ("float16", "float32"),
                                            ("bfloat16", "float32"), ("int32", "int32"),
                                            ("int8", "int32"), ("float8_e4m3", "float32")])
def test_reduce_absmax_ragged(dtype, acc):
    M, N = 37, 50  # 37 = 4 * 8 + 5: the last block's tail rows are zero
    k = tiled.compile(absmax_kernel(M, N, dtype, acc), "cpu")
    rng = np.random.default_rng(1)
    x = data(rng, (M, N), dtype)
    prev = data(rng, (M,), acc, scale=6.0)
    y = np.full(M, 99, np_dtype(acc))
    z = np.full(M, 99, np_dtype(acc))
    k(x, prev, y, z)
    amax = np.abs(x.astype(np.float64)).max(1)
    np.testing.assert_array_equal(y, amax.astype(np_dtype(acc)))
    np.testing.assert_array_equal(z, np.maximum(prev.astype(np.float64), amax).astype(
        np_dtype(acc)))


# -- T.cumsum -------------------------------------------------------------------------------------

def cumsum_kernel(M, N, dtype, scope, dim, reverse, in_place, rows=8):
    alloc = T.alloc_shared if scope == "shared" else T.alloc_fragment

    @tiled.kernel
    def cumsum(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            a = alloc((rows, N), dtype)
            b = alloc((rows, N), dtype)
            T.copy(X[bx * rows, 0], a)
            if in_place:
                T.cumsum(a, dim=dim, reverse=reverse)
                T.copy(a, Y[bx * rows, 0])
            else:
                T.cumsum(a, b, dim=dim, reverse=reverse)
                T.copy(b, Y[bx * rows, 0])
    return cumsum


def cumsum_reference(x, dtype, dim, reverse, rows=8):
    M = x.shape[0]
    padded = np.zeros((-(-M // rows) * rows, x.shape[1]), np.float64)
    padded[:M] = x.astype(np.float64)
    tiles = padded.reshape(-1, rows, x.shape[1])  # per block: the tail rows are zeros
    axis = dim + 1
    if reverse:
        out = np.flip(np.cumsum(np.flip(tiles, axis), axis), axis)
    else:
        out = np.cumsum(tiles, axis)
    return out.reshape(padded.shape)[:M]


@pytest.mark.parametrize(("scope", "dim", "reverse", "in_place"), [
    ("shared", 0, False, True), ("shared", 1, True, False), ("fragment", 1, False, False),
    ("fragment", 0, True, True),
])
def test_cumsum_float32_ragged(scope, dim, reverse, in_place):
    M, N = 29, 37
    k = tiled.compile(cumsum_kernel(M, N, "float32", scope, dim, reverse, in_place), "cpu")
    x = data(np.random.default_rng(2), (M, N), "float32")
    y = np.full_like(x, np.nan)
    k(x, y)
    np.testing.assert_allclose(y, cumsum_reference(x, "float32", dim, reverse), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize(("dtype", "tol"), [("float16", 2e-3), ("bfloat16", 1e-2),
                                            ("int32", 0)])
def test_cumsum_narrow_and_integer_dtypes(dtype, tol):
    M, N = 16, 200  # a long row: a float16 running sum would drift; float32's does not
    k = tiled.compile(cumsum_kernel(M, N, dtype, "fragment", 1, False, False), "cpu")
    x = data(np.random.default_rng(3), (M, N), dtype, scale=1.0)
    y = np.zeros_like(x)
    k(x, y)
    ref = cumsum_reference(x, dtype, 1, False)
    if tol == 0:
        np.testing.assert_array_equal(y, ref.astype(dtype))
    else:  # each output rounded once from the exact sum
        np.testing.assert_allclose(y.astype(np.float64), ref, rtol=tol, atol=tol * 4)


# -- T.atomic_max / T.atomic_min ----------------------------------------------------------------

ATOMIC_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64", "float16",
                 "bfloat16", "float32", "float64"]


def atomics_kernel(n, dtype, block=64):
    @tiled.kernel
    def minmax(X: T.Tensor((n,), dtype), Hi: T.Tensor((4,), dtype), Lo: T.Tensor((4,), dtype),
               BlockHi: T.Tensor((T.ceildiv(n, block),), dtype)):
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            s = T.alloc_shared((1,), dtype)
            s[0] = T.min_value(dtype)
            for i in T.Parallel(block):
                if bx * block + i < n:
                    T.atomic_max(Hi[i % 4], X[bx * block + i])  # global: every block contends
                    T.atomic_min(Lo[i % 4], X[bx * block + i])
                    T.atomic_max(s[0], X[bx * block + i])  # shared: within the block
            BlockHi[bx] = s[0]
    return minmax


@pytest.mark.parametrize("dtype", ATOMIC_DTYPES)
def test_atomic_max_min_across_parallel_blocks(dtype):
    n, block = 4001, 64  # 63 blocks, run on the cpu backend's thread pool
    k = tiled.compile(atomics_kernel(n, dtype, block), "cpu")
    rng = np.random.default_rng(4)
    x = data(rng, (n,), dtype, scale=100.0)
    for _ in range(3):  # races show up as a wrong result on some run
        hi = np.full(4, x.min(), x.dtype)
        lo = np.full(4, x.max(), x.dtype)
        block_hi = np.zeros(-(-n // block), x.dtype)
        k(x, hi, lo, block_hi)
        lanes = np.arange(n) % block % 4
        np.testing.assert_array_equal(hi, [x[lanes == j].max() for j in range(4)])
        np.testing.assert_array_equal(lo, [x[lanes == j].min() for j in range(4)])
        padded = np.full(len(block_hi) * block, x.min(), x.dtype)
        padded[:n] = x
        np.testing.assert_array_equal(block_hi, padded.reshape(-1, block).max(1))


@pytest.mark.parametrize("scope", ["global", "shared"])
def test_float_atomic_max_min_nan_rule(scope):
    @tiled.kernel
    def k(X: T.Tensor((6,), "float32"), Hi: T.Tensor((2,), "float32"),
          Lo: T.Tensor((2,), "float32")):
        with T.Kernel(1, threads=128):
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
    kk = tiled.compile(k, "cpu")
    x = np.array([np.nan, -0.0, 1.5, 0.0, np.nan, -3.0], np.float32)
    hi = np.array([-np.inf, np.nan], np.float32)
    lo = np.array([np.inf, np.nan], np.float32)
    kk(x, hi, lo)
    # lane 0 sees nan, 1.5, nan: a NaN value changes nothing; lane 1 sees -0, 0, -3 over a
    # stored NaN, which no value compares past: it stays
    np.testing.assert_array_equal(hi, [1.5, np.nan])
    np.testing.assert_array_equal(lo, [1.5, np.nan])
    zeros = np.array([-0.0, 1.0], np.float32)
    kk(np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], np.float32), zeros, lo)
    assert np.signbit(zeros[0]), "+0.0 does not compare past -0.0: nothing is written"


# -- T.vectorized ---------------------------------------------------------------------------------

def test_vectorized_loops_keep_serial_results():
    n = 8

    M = T.dyn("M")

    @tiled.kernel
    def k(X: T.Tensor((M, n), "float32"), Y: T.Tensor((M, n), "float32"),
          S: T.Tensor((4,), "float32"), m: T.int32):
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            x = T.alloc_shared((16, n), "float32")
            y = T.alloc_fragment((16, n), "float32")
            acc = T.alloc_local((4,), "float32")
            T.copy(X[bx * 16, 0], x)
            for i in T.Parallel(16):
                for v in T.vectorized(n):  # lanes: each iteration writes its own element
                    y[i, v] = T.exp(x[i, v] * 0.5) + T.max(x[i, v], 0.0)
            T.copy(y, Y[bx * 16, 0])
            T.clear(acc)
            for v in T.vectorized(n):  # carried through acc[0]: must stay in order
                acc[0] = acc[0] + x[0, v]
            for v in T.vectorized(1, 7):
                acc[1] = acc[1] * 2.0 + x[1, v]
            for _v in T.vectorized(m):  # a traced extent: serial
                acc[2] = acc[2] + 1.0
            if bx == 0:
                for v in T.vectorized(3):
                    S[v] = acc[v]
    mod = str(lower_cpu(guard_program(k.ir)))
    # the lane-parallel loops (y, and S at the end) became vector lanes, the others did not
    assert mod.count("T.vectorized") == 2
    kk = tiled.compile(k, "cpu")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((37, n)).astype(np.float32)
    y = np.full_like(x, np.nan)
    s = np.zeros(4, np.float32)
    kk(x, y, s, 37)
    np.testing.assert_allclose(y, np.exp(x * 0.5) + np.maximum(x, 0), rtol=1e-5)
    carried = 0.0
    for v in range(1, 7):
        carried = carried * 2 + float(x[1, v])
    np.testing.assert_allclose(s[:3], [x[0].sum(), carried, 37.0], rtol=1e-5)


def test_vectorized_bodies_of_every_dtype_compile_and_match():
    n = 16
    for dtype in ("float16", "bfloat16", "float8_e4m3", "int8", "uint16", "float64"):
        @tiled.kernel
        def k(X: T.Tensor((32, n), dtype), Y: T.Tensor((32, n), dtype)):
            with T.Kernel(2, threads=128) as bx:
                x = T.alloc_shared((16, n), dtype)
                y = T.alloc_fragment((16, n), dtype)
                T.copy(X[bx * 16, 0], x)
                for i in T.Parallel(16):
                    for v in T.vectorized(n):
                        y[i, v] = x[i, v] + x[i, v]
                T.copy(y, Y[bx * 16, 0])
        kk = tiled.compile(k, "cpu")
        # halves of small ints: exact in every dtype here, doubled included
        x = (np.random.default_rng(6).integers(-16, 16, (32, n)) / 2).astype(np_dtype(dtype))
        if dtype.startswith("u"):
            x = np.abs(x.astype(np.int64)).astype(dtype)
        y = np.zeros_like(x)
        kk(x, y)
        ref = (x.astype(np.float64) * 2).astype(np_dtype(dtype))
        np.testing.assert_array_equal(y.astype(np.float64), ref.astype(np.float64), dtype)


# -- T.gemm: A in a fragment, each policy, clear_accum, k_pack ----------------------------------

@pytest.mark.parametrize("policy", [T.GemmWarpPolicy.Square, T.GemmWarpPolicy.FullRow,
                                    T.GemmWarpPolicy.FullCol])
def test_gemm_with_a_fragment_operand_under_each_policy(policy):
    M, N, K, bm, bn, bk = 100, 72, 80, 32, 32, 16  # ragged in M, N and K

    @tiled.kernel
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
                T.copy(a_f, a_h)  # float32 fragment -> float16 fragment (acc_s_cast)
                T.copy(B[ko * bk, bx * bn], b_s)
                T.gemm(a_h, b_s, acc, policy=policy, clear_accum=ko == 0, k_pack=2)
            T.copy(acc, C[by * bm, bx * bn])
    kk = tiled.compile(k, "cpu")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.full((M, N), np.nan, np.float32)
    kk(a, b, c)
    ref = a.astype(np.float16).astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-4)


# -- T.copy with casts -------------------------------------------------------------------------

def test_copies_cast_between_fragments_and_shared():
    M, N = 21, 24

    @tiled.kernel
    def k(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float16"),
          Mx: T.Tensor((M,), "float32"), Bf: T.Tensor((M, N), "bfloat16")):
        with T.Kernel(T.ceildiv(M, 8), threads=128) as bx:
            acc_s = T.alloc_fragment((8, N), "float32")
            acc_s_cast = T.alloc_fragment((8, N), "float16")
            scores_max = T.alloc_fragment((8,), "float32")
            scores_max_prev = T.alloc_fragment((8,), "float32")
            sh = T.alloc_shared((8, N), "bfloat16")
            back = T.alloc_fragment((8, N), "float32")
            T.copy(X[bx * 8, 0], acc_s)
            T.reduce_max(acc_s, scores_max, dim=1)
            T.copy(scores_max, scores_max_prev)  # fragment -> fragment
            T.copy(acc_s, acc_s_cast)  # float32 -> float16 fragment
            T.copy(acc_s_cast, Y[bx * 8, 0])
            T.copy(acc_s, sh)  # fragment -> shared, float32 -> bfloat16
            T.copy(sh, back)  # shared -> fragment, bfloat16 -> float32
            T.copy(back, Bf[bx * 8, 0])
            T.copy(scores_max_prev, Mx[bx * 8])
    kk = tiled.compile(k, "cpu")
    x = data(np.random.default_rng(8), (M, N), "float32")
    y = np.zeros((M, N), np.float16)
    mx = np.zeros(M, np.float32)
    bf = np.zeros((M, N), ml_dtypes.bfloat16)
    kk(x, y, mx, bf)
    np.testing.assert_array_equal(y, x.astype(np.float16))
    np.testing.assert_array_equal(mx, x.max(1))
    np.testing.assert_array_equal(bf, x.astype(ml_dtypes.bfloat16))


# -- T.max_value / T.min_value / T.infinity; layout hints ----------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "float8_e4m3",
                                   "float8_e5m2", "int8", "uint16", "int64"])
def test_dtype_extremes_on_cpu(dtype):
    is_float = np.dtype(np_dtype(dtype)).kind not in "iu"
    has_inf = is_float and dtype != "float8_e4m3"

    @tiled.kernel
    def k(Y: T.Tensor((4,), dtype)):
        with T.Kernel(1, threads=128):
            Y[0] = T.max_value(dtype)
            Y[1] = T.min_value(dtype)
            if has_inf:
                Y[2] = T.infinity(dtype)
                Y[3] = -T.infinity(dtype)
    kk = tiled.compile(k, "cpu")
    y = np.zeros(4, np_dtype(dtype))
    kk(y)
    info = ml_dtypes.finfo(np_dtype(dtype)) if is_float else np.iinfo(np_dtype(dtype))
    assert (y[0], y[1]) == (info.max, info.min)
    if has_inf:
        assert (float(y[2]), float(y[3])) == (np.inf, -np.inf)


def test_layout_hints_do_not_change_results():
    M = N = 64

    def make(hints):
        @tiled.kernel
        def k(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32")):
            with T.Kernel(2, 2, threads=128) as (bx, by):
                T.use_swizzle(panel_size=2, enable=hints)
                a_s = T.alloc_shared((32, 32), "float32")
                acc = T.alloc_fragment((32, 32), "float32")
                if hints:
                    T.annotate_layout({a_s: T.make_swizzled_layout(a_s),
                                       B: T.Layout(B.shape, lambda i, j: [j, i])})
                T.copy(A[by * 32, bx * 32], a_s)
                T.copy(a_s, acc)
                for i, j in T.Parallel(32, 32, coalesced_width=4 if hints else None):
                    acc[i, j] = acc[i, j] * 3.0
                T.copy(acc, B[by * 32, bx * 32])
        return k
    a = np.random.default_rng(9).standard_normal((M, N)).astype(np.float32)
    outs = []
    for hints in (True, False):
        b = np.zeros_like(a)
        tiled.compile(make(hints), "cpu")(a, b)
        outs.append(b)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], a * 3)


@pytest.mark.parametrize("dtype", ["float8_e5m2", "float8_e4m3"])
def test_float8_conversions_on_cpu(dtype):
    # TVM's own fp8 lowering got these wrong (inf and NaN to finite values, e4m3 subnormals
    # flushed, 0 + 0 = 2**-6); the cpu backend converts exactly (tiled.compiler.fp8).
    @tiled.kernel
    def k(X: T.Tensor((8,), "float32"), Y: T.Tensor((8,), dtype), Z: T.Tensor((8,), dtype)):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(8):
                Y[i] = T.cast(X[i], dtype)
                Z[i] = T.cast(X[i], dtype) + T.cast(X[i], dtype)
    kk = tiled.compile(k, "cpu")
    x = np.array([np.inf, -np.inf, 2.0**-8, 1e5, 3.0, np.nan, 0.0, -1.0], np.float32)
    y, z = np.zeros(8, np_dtype(dtype)), np.zeros(8, np_dtype(dtype))
    kk(x, y, z)
    ref = x.astype(np_dtype(dtype))
    np.testing.assert_array_equal(y.astype(np.float32), ref.astype(np.float32))
    np.testing.assert_array_equal(z.astype(np.float32), (ref.astype(np.float32) * 2).astype(
        np_dtype(dtype)).astype(np.float32))


def test_pipelined_prefetches_follow_the_iterations_copies():
    """T.Pipelined on cpu: the tiles a later iteration copies are prefetched (num_stages - 1
    ahead) after this iteration's own copies and before its gemm, where the prefetches travel
    during the compute instead of holding the miss buffers the copies' loads need."""
    K = 256

    @tiled.kernel
    def mm(A: T.Tensor((64, K), "float32"), B: T.Tensor((K, 64), "float32"),
           C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((64, 32), "float32")
            b = T.alloc_shared((32, 64), "float32")
            c = T.alloc_fragment((64, 64), "float32")
            T.clear(c)
            for k in T.Pipelined(K // 32, num_stages=3):
                T.copy(A[0, k * 32], a)
                T.copy(B[k * 32, 0], b)
                T.gemm(a, b, c)
            T.copy(c, C)
    lines = str(lower_cpu(guard_program(mm.ir))).splitlines()
    prefetch = [i for i, line in enumerate(lines) if "llvm.prefetch" in line]
    gemm = [i for i, line in enumerate(lines) if "tiled_gemm_f32" in line]
    copies = [i for i, line in enumerate(lines)  # the stores of the two tile copies
              if line.lstrip().startswith(("a[", "b[")) and ("A[" in line or "B[" in line)]
    assert len(prefetch) == 2 and len(gemm) == 1 and len(copies) == 2, lines
    assert "(v_1 + 2) * 32" in lines[prefetch[0]]  # two iterations ahead
    assert max(copies) < min(prefetch) and max(prefetch) < gemm[0]
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, K), np.float32), rng.standard_normal((K, 64), np.float32)
    out = np.zeros((64, 64), np.float32)
    tiled.compile(mm, "cpu")(x, y, out)
    np.testing.assert_allclose(out, x @ y, rtol=1e-4, atol=1e-4)


def test_a_reduction_rereading_its_rows_prefetches_the_next_blocks_spread_over_its_steps():
    """softmax on cpu: its max pass streams the block's rows from memory, then the
    exponentials' sum reads them again from the caches; that pass (only it) prefetches the
    next block's rows, one cache line at a time in its steps, and the values stay exact."""
    from tiled.ops import kernels

    k = kernels.softmax(256, "float32", blk_m=2)
    lines = str(lower_cpu(guard_program(k.ir), vector_bytes=64)).splitlines()
    prefetch = [i for i, line in enumerate(lines) if "llvm.prefetch" in line]
    # A step of the sum takes one vector of float32 partials (16: one 64-byte line), rows of
    # block v + 1. The sum runs for row 0, then for row 1 with row 0's stores (skew.py), each
    # twice (its bounds tested once before it): four copies of the step.
    assert len(prefetch) == 4 and all(
        re.search(r"X\[\(v \+ 1\) \* 2( \+ v_1)?, v_\d \* 16\]", lines[i]) for i in prefetch), lines
    assert all(re.fullmatch(r"\s*for v_\d in range\(16\):", lines[i - 1]) for i in prefetch)
    max_pass = [i for i, line in enumerate(lines) if "T.vectorized(32)" in line]
    assert max_pass and max(max_pass) < min(prefetch)  # in the sum's steps, not the max's
    x = np.random.default_rng(0).standard_normal((7, 256), np.float32) * 3
    y = np.empty_like(x)
    tiled.compile(k, "cpu")(x, y)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=2e-6)


def test_an_element_loop_of_long_math_prefetches_the_next_blocks_rows_a_line_a_step():
    """SiLU-and-mul on cpu: its element loop (a sigmoid per element) steps a cache line at a
    time, prefetching that line of both halves of X as the next block (rows + 4) reads them;
    a loop of light arithmetic (a copy) does not; the values are those of the loop without
    prefetches (prefetch.ELEMENTS off), edge block included."""
    from tiled.compiler.targets.cpu import prefetch
    from tiled.ops import kernels

    silu = kernels.gated_activation(256, "float32", "silu", block_n=256)
    lines = str(lower_cpu(guard_program(silu.ir), vector_bytes=64)).splitlines()
    pf = [i for i, line in enumerate(lines) if "llvm.prefetch" in line]
    assert len(pf) == 2, lines  # the gate's and the up half's line, one each per step
    # the next block of the (rows / 4, 1) grid: (v + 1) % rows-blocks, then its row v_1
    assert all("X[(v + 1) % ((M + 4 - 1) // 4) * 4 + v_1, " in lines[i] and
               re.search(r"v_2 \* 16\)?\]\), 0, 2, 1\)$", lines[i]) for i in pf), lines
    assert "256 + (" in lines[pf[1]]  # the up half
    assert re.fullmatch(r"\s*for v_1, v_2 in T.grid\(4, 16\):", lines[pf[0] - 1])
    assert re.fullmatch(r"\s*for v_3 in range\(16\):", lines[pf[-1] + 1])

    @tiled.kernel
    def copy(X: T.Tensor((T.dyn("M"), 256), "float32"), Y: T.Tensor((T.dyn("M"), 256),
                                                                     "float32")):
        with T.Kernel(T.ceildiv(X.shape[0], 4), threads=128) as bx:
            for i, j in T.Parallel(4, 256):
                Y[bx * 4 + i, j] = X[bx * 4 + i, j] * 2.0
    assert "llvm.prefetch" not in str(lower_cpu(guard_program(copy.ir), vector_bytes=64))

    x = np.random.default_rng(0).standard_normal((7, 512), np.float32) * 4
    y, want = np.empty((7, 256), np.float32), np.empty((7, 256), np.float32)
    tiled.compile(silu, "cpu")(x, y)
    saved, prefetch.ELEMENTS = prefetch.ELEMENTS, False
    try:
        tiled.compile(silu, "cpu", cache=False)(x, want)
    finally:
        prefetch.ELEMENTS = saved
    np.testing.assert_array_equal(y, want)
    g = x[:, :256].astype(np.float64)
    np.testing.assert_allclose(y, g / (1 + np.exp(-g)) * x[:, 256:], rtol=1e-5, atol=1e-6)
