"""Expression lowering (tiled.compiler.tir.ExprLowering.binary): every result is defined, on
`cpu` against numpy: integer division by a runtime 0 divides by 1 (no SIGFPE), shift amounts
wrap modulo the width, negative constant divisors keep floor semantics, and fp8 arithmetic is
computed in float32."""

import numpy as np
import pytest

import tiled
import tiled.lang as T

ml_dtypes = pytest.importorskip("ml_dtypes")
N = 64


def elementwise(fn, dtype_in="int32", dtype_out="int32"):
    @tiled.kernel
    def kernel(X: T.Tensor((N,), dtype_in), D: T.Tensor((N,), dtype_in),
               Y: T.Tensor((N,), dtype_out)):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(N):
                Y[i] = fn(X[i], D[i])

    return tiled.compile(kernel, "cpu")


def run(k, x, d, out_dtype="int32"):
    y = np.zeros(N, out_dtype)
    k(x, d, y)
    return y


def test_integer_division_by_a_runtime_zero_divides_by_one():
    x = np.arange(N, dtype="int32") * 7 - 100
    d = np.array([0, 3, -4, 0] * (N // 4), "int32")
    safe = np.where(d == 0, 1, d)
    assert (run(elementwise(lambda a, b: a // b), x, d) == x // safe).all()
    assert (run(elementwise(lambda a, b: a % b), x, d) == x % safe).all()


def test_negative_constant_divisors_keep_floor_semantics():
    x = np.arange(N, dtype="int32") - 30
    d = np.zeros(N, "int32")
    assert (run(elementwise(lambda a, b: a // -3), x, d) == x // -3).all()
    assert (run(elementwise(lambda a, b: a % -3), x, d) == x % -3).all()


def test_shift_amounts_wrap_modulo_the_width():
    ones = np.ones(N, "int32")
    s = np.arange(N, dtype="int32")  # 0..63: past 31 for int32
    assert (run(elementwise(lambda a, b: a << b), ones, s) == 1 << (s & 31)).all()
    big = np.full(N, 1 << 30, "int32")
    assert (run(elementwise(lambda a, b: a >> b), big, s) == (1 << 30) >> (s & 31)).all()


def test_fp8_arithmetic_is_computed_in_float32():
    e4m3 = ml_dtypes.float8_e4m3fn
    k = elementwise(lambda a, b: T.abs(a) * b + T.exp(b), "float8_e4m3", "float8_e4m3")
    x = np.linspace(-4, 4, N).astype(e4m3)
    d = np.linspace(0, 2, N).astype(e4m3)
    y = run(k, x, d, e4m3)

    def r(v):  # each operation's float32 result rounded to e4m3, as the kernel does
        return v.astype(e4m3).astype(np.float32)

    xf, df = x.astype(np.float32), d.astype(np.float32)
    want = r(r(r(np.abs(xf)) * df) + r(np.exp(df)))
    # within one e4m3 step (3 mantissa bits): TVM's conversion may round differently
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=0.126)
