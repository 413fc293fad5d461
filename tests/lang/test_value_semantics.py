"""`v = A[i]` in a kernel: TileLang binds the value read there (a let); tiled binds the
expression, which a later store to A[i] changes. Known divergence, kept visible here until the
DSL binds values without costing the vectorizer (see issue 12's notes)."""

import numpy as np
import pytest

import tiled
import tiled.lang as T


@tiled.kernel
def read_then_store(X: T.Tensor((8,), "float32"), Y: T.Tensor((8,), "float32")):
    with T.Kernel(1, threads=8) as _:
        for i in T.Parallel(8):
            a = X[i]
            X[i] = a + 1.0
            Y[i] = a


@pytest.mark.xfail(strict=True, reason="tiled re-reads X[i] where `a` is used, after the store")
def test_an_assigned_load_keeps_the_value_read_before_a_store():
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, dtype=np.float32)
    tiled.compile(read_then_store, target="cpu", cache=False)(x, y)
    np.testing.assert_array_equal(x, np.arange(8) + 1)
    np.testing.assert_array_equal(y, np.arange(8))  # TileLang's answer


def test_an_alloc_var_keeps_the_value_read_before_a_store():
    @tiled.kernel
    def with_var(X: T.Tensor((8,), "float32"), Y: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=8) as _:
            for i in T.Parallel(8):
                a = T.alloc_var("float32")
                a = X[i]
                X[i] = a + 1.0
                Y[i] = a

    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, dtype=np.float32)
    tiled.compile(with_var, target="cpu", cache=False)(x, y)
    np.testing.assert_array_equal(y, np.arange(8))
