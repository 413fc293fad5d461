"""Elementwise C = A + B over a symbolic length N, 1024 elements per block.

Run: python examples/elementwise.py
"""

import tiled
import tiled.lang as T


def add(dtype="float32", block=1024, threads=256):
    N = T.dyn("N")

    @tiled.kernel
    def vadd(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block), threads=threads) as bx:
            for i in T.Parallel(block):
                idx = bx * block + i
                if idx < N:
                    C[idx] = A[idx] + B[idx]

    return vadd


def main(target="cpu", n=100_003):
    import numpy as np

    kernel = tiled.compile(add(), target=target)
    a = np.random.rand(n).astype("float32")
    b = np.random.rand(n).astype("float32")
    c = np.zeros(n, "float32")
    kernel(a, b, c)
    np.testing.assert_allclose(c, a + b, rtol=1e-6)
    print(f"vadd n={n} on {target}: ok")


if __name__ == "__main__":
    main()
