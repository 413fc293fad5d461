"""Row softmax: one block per block_M rows of an (M, N) matrix, N <= block_N, M symbolic.

Run: python examples/softmax.py
"""

import tiled
import tiled.lang as T


def softmax(N=256, block_M=4, dtype="float32", threads=128):
    M = T.dyn("M")
    block_N = N

    @tiled.kernel
    def row_softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=threads) as bx:
            x = T.alloc_fragment((block_M, block_N), "float32")
            row_max = T.alloc_fragment((block_M,), "float32")
            row_sum = T.alloc_fragment((block_M,), "float32")
            T.copy(X[bx * block_M, 0], x)
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(block_M, block_N):
                x[i, j] = T.exp(x[i, j] - row_max[i])
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(block_M, block_N):
                x[i, j] = x[i, j] / row_sum[i]
            T.copy(x, Y[bx * block_M, 0])

    return row_softmax


def main(target="cpu", M=1003, N=256):
    import numpy as np

    kernel = tiled.compile(softmax(N), target=target)
    x = np.random.randn(M, N).astype("float32")
    y = np.zeros_like(x)
    kernel(x, y)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    print(f"softmax {M}x{N} on {target}: ok")


if __name__ == "__main__":
    main()
