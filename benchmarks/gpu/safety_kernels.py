"""Kernels that index past their tensors (the memory-safety guards' cases, issue 10), each with
a check that runs it on tensors surrounded by poisoned canary zones and compares with numpy.
tests/compiler/test_guards.py runs them on `cpu`; safety.py runs them on the H200.
Importing this module needs tiled's thin side and numpy only (no TVM, no torch)."""

import numpy as np

import tiled
import tiled.lang as T

CANARY = 4096  # elements of poison on each side of every tensor
POISON = -12345.0


class NumpySpace:
    """Tensors (numpy arrays) that sit between two canary zones; `check()` asserts that no
    kernel wrote outside any of them. safety.py has the torch twin."""

    def __init__(self):
        self.wholes = []

    def tensor(self, values):
        values = np.asarray(values)
        if values.size == 0:  # an empty tensor stands alone (its pointer may be anything)
            return values.copy()
        whole = np.full(values.size + 2 * CANARY, POISON, values.dtype)
        view = whole[CANARY:CANARY + values.size].reshape(values.shape)
        view[...] = values
        self.wholes.append(whole)
        return view

    def numpy(self, t):
        return np.asarray(t)

    def check(self):
        for w in self.wholes:
            assert (w[:CANARY] == POISON).all(), "memory before a tensor was written"
            assert (w[-CANARY:] == POISON).all(), "memory after a tensor was written"


def double(guard: bool = False):
    """`for j in T.Parallel(1024): Y[j] = X[j] * 2` over 1000-element tensors (the issue's
    kernel); `guard`: as the guard pass rewrites it."""

    @tiled.kernel
    def double(X: T.Tensor((1000,), "float32"), Y: T.Tensor((1000,), "float32")):
        with T.Kernel(1, threads=128):
            for j in T.Parallel(1024):
                if guard:
                    if j < 1000:  # the store's guard; under it the load is proved in bounds
                        Y[j] = X[j] * 2
                else:
                    Y[j] = X[j] * 2

    return double


def check_double(k, space):
    x = space.tensor(np.arange(1000, dtype="float32"))
    y = space.tensor(np.zeros(1000, "float32"))
    k(x, y)
    np.testing.assert_array_equal(space.numpy(y), 2 * np.arange(1000))


def silu_mul():
    """TileLang's idiom ported as written: a T.Parallel over a 1024-wide tile of 1000 columns,
    M symbolic (gate in columns 0..999, up in 1000..1999)."""
    M = T.dyn("M")

    @tiled.kernel
    def silu_mul(X: T.Tensor((M, 2000), "float32"), Y: T.Tensor((M, 1000), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=128) as bx:
            for i, j in T.Parallel(4, 1024):
                g = X[bx * 4 + i, j]
                Y[bx * 4 + i, j] = g * T.sigmoid(g) * X[bx * 4 + i, 1000 + j]

    return silu_mul


def check_silu_mul(k, space):
    rng = np.random.default_rng(0)
    for rows in (1, 7, 13):
        xv = rng.standard_normal((rows, 2000)).astype("float32")
        x, y = space.tensor(xv), space.tensor(np.zeros((rows, 1000), "float32"))
        k(x, y)
        g, u = xv[:, :1000].astype(np.float64), xv[:, 1000:]
        np.testing.assert_allclose(space.numpy(y), g / (1 + np.exp(-g)) * u, rtol=1e-5,
                                   atol=1e-6)


def stencil():
    """Y[j] = X[j - 1] + X[j] + X[j + 1]: reads before the start and after the end (N
    symbolic, ragged blocks)."""
    N = T.dyn("N")

    @tiled.kernel
    def stencil(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, 256), threads=128) as bx:
            for i in T.Parallel(256):
                j = bx * 256 + i
                Y[j] = X[j - 1] + X[j] + X[j + 1]

    return stencil


def check_stencil(k, space):
    for n in (1, 255, 1000):
        x, y = space.tensor(np.ones(n, "float32")), space.tensor(np.zeros(n, "float32"))
        k(x, y)
        want = np.full(n, 3.0)
        want[0] -= 1
        want[-1] -= 1
        np.testing.assert_array_equal(space.numpy(y), np.ones(1) if n == 1 else want)


def gather_add():
    """Indices read from memory (negative, huge): a gather and an atomic histogram."""

    @tiled.kernel
    def gather_add(idx: T.Tensor((64,), "int32"), X: T.Tensor((100,), "float32"),
                   Y: T.Tensor((64,), "float32"), H: T.Tensor((10,), "float32")):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                Y[i] = X[idx[i]]
                T.atomic_add(H[idx[i]], 1.0)

    return gather_add


def check_gather_add(k, space):
    iv = np.array([(-1) ** i * i * 7 for i in range(64)], "int32")  # far outside, both ways
    iv[::5] = 3
    idx = space.tensor(iv)
    x = space.tensor(np.arange(100, dtype="float32"))
    y, h = space.tensor(np.zeros(64, "float32")), space.tensor(np.zeros(10, "float32"))
    k(idx, x, y, h)
    np.testing.assert_array_equal(space.numpy(y), np.where((iv >= 0) & (iv < 100), iv, 0))
    np.testing.assert_array_equal(space.numpy(h),
                                  np.bincount(iv[(iv >= 0) & (iv < 10)], minlength=10))


def shifted_copy():
    """T.copy at a scalar offset that may be negative or past the end."""

    @tiled.kernel
    def shifted_copy(X: T.Tensor((300,), "float32"), Y: T.Tensor((300,), "float32"),
                     s: T.int32):
        with T.Kernel(3, threads=64) as bx:
            tile = T.alloc_shared((128,), "float32")
            T.copy(X[bx * 100 + s], tile)
            T.copy(tile, Y[bx * 100 + s])

    return shifted_copy


def check_shifted_copy(k, space):
    xv = np.arange(300, dtype="float32") + 1
    for s in (-200, -5, 0, 37, 250):
        x, y = space.tensor(xv), space.tensor(np.zeros(300, "float32"))
        k(x, y, s)
        touched = np.zeros(300, bool)
        for b in range(3):
            lo, hi = max(b * 100 + s, 0), min(b * 100 + s + 128, 300)
            touched[lo:max(hi, lo)] = True
        np.testing.assert_array_equal(space.numpy(y), np.where(touched, xv, 0))


def empty_source():
    """Y[j] = X[j] + 1 where X may be empty (N = 0): every load is guarded, and the clamped
    address of an empty tensor must still be readable (the runtime points it at scratch)."""
    N, M = T.dyn("N"), T.dyn("M")

    @tiled.kernel
    def empty_source(X: T.Tensor((N,), "float32"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, 64), threads=64) as bx:
            for i in T.Parallel(64):
                Y[bx * 64 + i] = X[bx * 64 + i] + 1.0

    return empty_source


def check_empty_source(k, space):
    for n in (0, 50):
        x = space.tensor(np.full(n, 5.0, "float32"))
        y = space.tensor(np.zeros(100, "float32"))
        k(x, y)
        np.testing.assert_array_equal(space.numpy(y), np.where(np.arange(100) < n, 6.0, 1.0))


CASES = {"double": (double, check_double), "silu_mul": (silu_mul, check_silu_mul),
         "stencil": (stencil, check_stencil), "gather_add": (gather_add, check_gather_add),
         "shifted_copy": (shifted_copy, check_shifted_copy),
         "empty_source": (empty_source, check_empty_source)}
