"""T.atomic_add / atomic_max / atomic_min on rocm for element types with and without a native
atomic (32- and 64-bit adds use the hardware's; 8- and 16-bit integers, half, bfloat16, max
and min take a compare-and-swap loop on the aligned word), every block updating the same
elements: the result under emulation equals numpy's. (The emulation runs blocks one after
another: it checks the read-modify-write arithmetic and addressing, not atomicity.)"""

import ml_dtypes
import numpy as np
import pytest

import tiled.lang as T
from tiled.compiler import compile_program

NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "int8": np.int8,
      "int16": np.int16, "int64": np.int64, "float64": np.float64, "float32": np.float32,
      "uint32": np.uint32}


def atomics_kernel(dt: str):
    @T.prim_func
    def updates(X: T.Tensor((4, 256), dt), S: T.Tensor((8,), dt), Mx: T.Tensor((8,), dt),
                Mn: T.Tensor((8,), dt)):
        with T.Kernel(4, threads=256) as bx:
            for i in T.Parallel(256):
                T.atomic_add(S[i % 8], X[bx, i])
                T.atomic_max(Mx[i % 8], X[bx, i])
                T.atomic_min(Mn[i % 8], X[bx, i])

    return updates


@pytest.mark.parametrize("dt, arch", [("float16", "gfx942"), ("bfloat16", "gfx942"),
                                      ("int8", "gfx942"), ("int16", "gfx90a"),
                                      ("int64", "gfx942"), ("float64", "gfx90a"),
                                      ("float32", "gfx90a"), ("uint32", "gfx942")])
def test_atomics(dt, arch):
    k = compile_program(atomics_kernel(dt), f"rocm:{arch}")
    rng = np.random.default_rng(0)
    lo = 0 if dt.startswith("uint") else -3
    x = rng.integers(lo, 4, (4, 256)).astype(NP[dt])
    s = np.zeros(8, NP[dt])
    mx, mn = np.full(8, lo, NP[dt]), np.full(8, 100, NP[dt])
    k.emulate(x, s, mx, mn)
    xs = x.astype(np.float64).reshape(4, 32, 8)
    np.testing.assert_array_equal(s.astype(np.float64), xs.sum((0, 1)))
    np.testing.assert_array_equal(mx.astype(np.float64), xs.max((0, 1)))
    np.testing.assert_array_equal(mn.astype(np.float64), xs.min((0, 1)))

