"""The cpu backend's own exp / exp2 / sigmoid (tiled/compiler/targets/cpu/vmath.py), run in a
compiled kernel over a sweep of every 997th float32 bit pattern (plus the edges), against
float64 numpy rounded to float32: within 2 ulp, subnormal results included, but exp2's, which
are 0 where the level has no one-instruction ldexp (as CUDA's ex2.approx.ftz); NaN,
infinities and overflow as libm gives them."""


import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled import config


@pytest.fixture(autouse=True)
def _scoped(tmp_path):
    with config.override(cache_dir=tmp_path / "cache"):
        yield


def unary(op: str, dtype: str = "float32"):
    n = T.dyn("n")

    @tiled.kernel
    def unary_kernel(X: T.Tensor((n,), dtype), Y: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, 1024), threads=128) as bx:
            for i in T.Parallel(1024):
                Y[bx * 1024 + i] = getattr(T, op)(X[bx * 1024 + i])
    return unary_kernel


def _sweep() -> np.ndarray:
    bits = np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, 89.0, -87.3, -103.9,
                      -104.0, 127.99, 128.0, 128.5, -126.0, -149.0, -149.5, -150.0, -151.0,
                      1e-30, -1e-30, 0.5, -0.5], np.float32)
    return np.concatenate([bits.view(np.float32), edges])


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in representable float32 values (signs handled: -0 and +0 are one value)."""
    def ordered(a):
        i = a.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(got) - ordered(want))


REFERENCES = {
    "exp": np.exp,
    "exp2": np.exp2,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
}


# The host's own level (2^n through ldexp where it has AVX-512) and the portable baseline
# (2^n as two factors by bit moves).
TARGETS = ["cpu", "cpu:generic"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op, max_ulps", [("exp", 2), ("exp2", 2), ("sigmoid", 3)])
def test_within_ulps_of_the_rounded_result(op, max_ulps, target):
    x = _sweep()
    y = np.empty_like(x)
    tiled.compile(unary(op), target)(x, y)
    with np.errstate(over="ignore", invalid="ignore"):
        want = REFERENCES[op](x.astype(np.float64)).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(y), nan)
    if op == "exp2":  # results below 2^-126 flushed to 0, or (ldexp levels) kept
        flushed = (np.abs(want) < np.float32(2.0 ** -126)) & (y == 0)
        nan |= flushed
    ulps = _ulps(y[~nan], want[~nan])
    worst = int(np.argmax(ulps))
    assert ulps[worst] <= max_ulps, (x[~nan][worst], y[~nan][worst], want[~nan][worst])


def test_exp2_flushes_subnormal_results_to_zero_without_ldexp():
    """cpu:generic scales by the exponent field: results below 2^-126 are 0, normal ones (the
    smallest included) and the overflow edge as libm gives them."""
    x = np.array([-126.0, -126.5, -130.0, -149.0, -200.0, -np.inf, 127.5, 127.99, 128.0,
                  np.nan], np.float32)
    y = np.empty_like(x)
    tiled.compile(unary("exp2"), "cpu:generic")(x, y)
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)
    assert y[0] == np.float32(2.0 ** -126)
    assert not y[1:6].any()
    assert np.all(_ulps(y[6:9], want[6:9]) <= 2) and y[8] == np.inf
    assert np.isnan(y[9])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_floats_compute_in_float32(dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    x = np.linspace(-20, 12, 3000).astype(np_dt)
    y = np.empty_like(x)
    tiled.compile(unary("exp", dtype), "cpu")(x, y)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32).astype(np_dt)
    assert np.max(_ulps(y.astype(np.float32), want.astype(np.float32))) <= 1 << 13  # 1 ulp
