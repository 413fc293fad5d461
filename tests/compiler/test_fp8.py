"""float8 conversions on `cpu` (tiled.compiler.fp8) bit for bit equal to ml_dtypes: every one
of the 256 encodings decoded, and float32 values across the range (subnormals, ties, the
overflow edges, infinities, NaN, -0.0) rounded to nearest even, for e4m3fn and e5m2."""

import numpy as np
import pytest

import tiled
import tiled.lang as T

ml_dtypes = pytest.importorskip("ml_dtypes")
EDGES = [448, 460, 464, 470, 480, 1000, np.inf, -np.inf, np.nan, 2**-9, 2**-10, 3 * 2**-11,
         2**-16, 2**-17, 3 * 2**-18, 57344, 61440, 65536, 1e-30, -0.0, 2**-6, 2**-14]


@pytest.mark.parametrize("name, dt", [("float8_e4m3", "float8_e4m3fn"),
                                      ("float8_e5m2", "float8_e5m2")])
def test_conversions_match_ml_dtypes_bit_for_bit(name, dt):
    dt = getattr(ml_dtypes, dt)
    n = 4096

    @tiled.kernel
    def convert(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), name),
                Z: T.Tensor((256,), name), W: T.Tensor((256,), "float32")):
        with T.Kernel(1, threads=1):
            for i in T.serial(n):
                Y[i] = T.cast(X[i], name)
            for i in T.serial(256):
                W[i] = T.cast(Z[i], "float32")

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(2000) * 10 ** rng.uniform(-8, 5, 2000),
                        np.array(EDGES), rng.uniform(-600, 600, n - 2000 - len(EDGES))])
    x = x.astype(np.float32)
    y, w = np.zeros(n, dt), np.zeros(256, np.float32)
    z = np.arange(256, dtype=np.uint8).view(dt)
    tiled.compile(convert, "cpu")(x, y, z, w)
    np.testing.assert_array_equal(y.view(np.uint8), x.astype(dt).view(np.uint8))
    want = z.astype(np.float32)
    assert ((w == want) | (np.isnan(w) & np.isnan(want))).all()
    assert (np.signbit(w) == np.signbit(want)).all()


@pytest.mark.parametrize("name, dt", [("float8_e4m3", "float8_e4m3fn"),
                                      ("float8_e5m2", "float8_e5m2")])
def test_bfloat16_values_round_to_float8_as_their_float32(name, dt):
    """bfloat16 -> float32 -> float8 (directly, and through arithmetic) on cpu: the float8
    of the bfloat16's float32 value. (TVM's bfloat16 legalization once made every such value
    NaN: the float8 rounding reads the float32's bits.)"""
    dt = getattr(ml_dtypes, dt)
    n = 512

    @tiled.kernel
    def from_bf16(X: T.Tensor((n,), "bfloat16"), Y: T.Tensor((n,), name),
                  Z: T.Tensor((n,), name)):
        with T.Kernel(1, threads=1):
            for i in T.serial(n):
                Y[i] = T.cast(X[i], name)
                Z[i] = T.cast(T.cast(X[i], "float32") * 0.5, name)

    x = (np.random.default_rng(3).standard_normal(n) * 64).astype(ml_dtypes.bfloat16)
    y, z = np.zeros(n, dt), np.zeros(n, dt)
    tiled.compile(from_bf16, target="cpu")(x, y, z)
    x32 = x.astype(np.float32)
    assert np.array_equal(y.view(np.uint8), x32.astype(dt).view(np.uint8))
    assert np.array_equal(z.view(np.uint8), (x32 * 0.5).astype(dt).view(np.uint8))
