"""The DSL kernels behind tiled.ops' memory-bound ops: one factory per op, specialized on the
hidden size and the dtype, the token count symbolic (`T.dyn("M")`), so one compile serves every
batch. Rows are processed `blk_m` at a time, each row whole in a fragment, math in float32.
"""

import math

import tiled
import tiled.lang as T


def rms_norm(N: int, dtype: str, eps: float, blk_m: int = 1, threads: int = 128):
    """Y = X / sqrt(mean(X^2) + eps) * W, row-wise over X [M, N]."""
    M = T.dyn("M")

    @tiled.kernel
    def rms_norm_kernel(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype),
                        Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            sq = T.alloc_fragment((blk_m, N), "float32")
            r = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m, 0], x)
            for i, j in T.Parallel(blk_m, N):
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, r, dim=1)
            for i in T.Parallel(blk_m):
                r[i] = T.rsqrt(r[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = x[i, j] * r[i] * T.cast(W[j], "float32")
            T.copy(x, Y[bx * blk_m, 0])

    return rms_norm_kernel


def fused_add_rms_norm(N: int, dtype: str, eps: float, blk_m: int = 1, threads: int = 128):
    """In place, as vLLM's: R = X + R (rounded to the dtype), then X = rms_norm(R) * W."""
    M = T.dyn("M")

    @tiled.kernel
    def fused_add_rms_norm_kernel(X: T.Tensor((M, N), dtype), R: T.Tensor((M, N), dtype),
                                  W: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            res = T.alloc_fragment((blk_m, N), dtype)
            sq = T.alloc_fragment((blk_m, N), "float32")
            r = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m, 0], x)
            T.copy(R[bx * blk_m, 0], res)
            for i, j in T.Parallel(blk_m, N):
                res[i, j] = T.cast(x[i, j] + T.cast(res[i, j], "float32"), dtype)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = T.cast(res[i, j], "float32")
                sq[i, j] = x[i, j] * x[i, j]
            T.copy(res, R[bx * blk_m, 0])
            T.reduce_sum(sq, r, dim=1)
            for i in T.Parallel(blk_m):
                r[i] = T.rsqrt(r[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = x[i, j] * r[i] * T.cast(W[j], "float32")
            T.copy(x, X[bx * blk_m, 0])

    return fused_add_rms_norm_kernel


def layer_norm(N: int, dtype: str, eps: float, affine: bool, blk_m: int = 1,
               threads: int = 128):
    """Y = (X - mean) / sqrt(var + eps) (* W + B when `affine`), row-wise."""
    M = T.dyn("M")

    @tiled.kernel
    def layer_norm_kernel(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype),
                          B: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            d2 = T.alloc_fragment((blk_m, N), "float32")
            mean = T.alloc_fragment((blk_m,), "float32")
            var = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m, 0], x)
            T.reduce_sum(x, mean, dim=1)
            for i in T.Parallel(blk_m):
                mean[i] = mean[i] / N
            # The centred values are computed twice rather than stored: on a CPU the squares
            # are then summed as computed (never stored) and x stays X's copy, read from X.
            for i, j in T.Parallel(blk_m, N):
                d2[i, j] = (x[i, j] - mean[i]) * (x[i, j] - mean[i])
            T.reduce_sum(d2, var, dim=1)
            for i in T.Parallel(blk_m):
                var[i] = T.rsqrt(var[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                if affine:
                    x[i, j] = (x[i, j] - mean[i]) * var[i] * T.cast(W[j], "float32") + \
                        T.cast(B[j], "float32")
                else:
                    x[i, j] = (x[i, j] - mean[i]) * var[i]
            T.copy(x, Y[bx * blk_m, 0])

    return layer_norm_kernel


def gated_activation(N: int, dtype: str, act: str, block_m: int = 4, block_n: int = 1024,
                     threads: int = 128):
    """Y = act(X[:, :N]) * X[:, N:] for X [M, 2N]; act: silu, gelu (erf) or gelu_tanh."""
    M = T.dyn("M")
    bn = min(block_n, N)
    c = math.sqrt(2.0 / math.pi)

    @tiled.kernel
    def gated_activation_kernel(X: T.Tensor((M, 2 * N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_m), T.ceildiv(N, bn), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_m, bn):
                row, col = bx * block_m + i, by * bn + j
                g = T.cast(X[row, col], "float32")
                up = T.cast(X[row, N + col], "float32")
                if act == "silu":
                    a = g * T.sigmoid(g)
                elif act == "gelu":
                    a = 0.5 * g * (1.0 + T.erf(g * (1.0 / math.sqrt(2.0))))
                else:
                    a = 0.5 * g * (1.0 + T.tanh(c * (g + 0.044715 * g * g * g)))
                Y[row, col] = T.cast(a * up, dtype)

    return gated_activation_kernel


def softmax(N: int, dtype: str, blk_m: int = 1, threads: int = 128):
    """Row-wise softmax over the last dim of X [M, N] (max-subtracted, exp2)."""
    M = T.dyn("M")
    log2e = math.log2(math.e)

    @tiled.kernel
    def softmax_kernel(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            mx = T.alloc_fragment((blk_m,), "float32")
            s = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m, 0], x)
            T.fill(mx, -T.infinity("float32"))
            T.reduce_max(x, mx, dim=1, clear=False)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = T.exp2(x[i, j] * log2e - mx[i] * log2e)
            T.reduce_sum(x, s, dim=1)
            for i in T.Parallel(blk_m):
                s[i] = 1.0 / s[i]  # one division per row; the row then multiplies
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = x[i, j] * s[i]
            T.copy(x, Y[bx * blk_m, 0])

    return softmax_kernel


def rotary(heads: int, kv_heads: int, head_size: int, rot_dim: int, dtype: str,
           cache_dtype: str, is_neox: bool, threads: int = 128):
    """vLLM's rotary_embedding, in place on Q [T, heads * head_size] and K [T, kv_heads *
    head_size]: the first `rot_dim` lanes of each head rotated by the angle of the token's
    position; cos / sin from C [max_positions, rot_dim] (cos in the first half, sin in the
    second). NeoX style pairs lane i with lane i + rot_dim / 2, GPT-J style 2i with 2i + 1."""
    Tn = T.dyn("T")
    P = T.dyn("P")
    half = rot_dim // 2

    @tiled.kernel
    def rotary_kernel(pos: T.Tensor((Tn,), "int64"), Q: T.Tensor((Tn, heads * head_size), dtype),
                      K: T.Tensor((Tn, kv_heads * head_size), dtype),
                      C: T.Tensor((P, rot_dim), cache_dtype)):
        with T.Kernel(Tn, threads=threads) as t:
            p = pos[t]
            # One nest per tensor (no branch in the body): a lane's x1 and x2 are read
            # before either is written, and consecutive lanes touch consecutive elements.
            for X, nh in ((Q, heads), (K, kv_heads)):
                for h, i in T.Parallel(nh, half):
                    cos = T.cast(C[p, i], "float32")
                    sin = T.cast(C[p, half + i], "float32")
                    a = h * head_size + (i if is_neox else 2 * i)
                    b = a + (half if is_neox else 1)
                    x1 = T.cast(X[t, a], "float32")
                    x2 = T.cast(X[t, b], "float32")
                    X[t, a] = T.cast(x1 * cos - x2 * sin, dtype)
                    X[t, b] = T.cast(x2 * cos + x1 * sin, dtype)

    return rotary_kernel


def splitk_sum(N: int, splits: int, dtype: str, block_n: int = 1024, threads: int = 128,
               pdl: bool = False):
    """Y = P[0] + ... + P[splits - 1] in `dtype`, for the float32 split-K partials P
    [splits, M, N] of tiled.ops.linear: one pass that both reduces and casts. With `pdl` it
    may start while the GEMM that writes P still runs, and waits for it (T.pdl_sync; how
    tiled.ops.linear runs it: split_k.sum_params, benchmarks/results/splitk_pdl_h200.json)."""
    M = T.dyn("M")
    bn = min(block_n, N)

    @tiled.kernel
    def splitk_sum_kernel(P: T.Tensor((splits, M, N), "float32"), Y: T.Tensor((M, N), dtype)):
        # (rows on the grid's x axis: up to 2^31 - 1 of them; y stops at 65535, fewer than a
        # convolution's pixels)
        with T.Kernel(M, T.ceildiv(N, bn), threads=threads) as (by, bx):
            if pdl:
                T.pdl_sync()
            for j in T.Parallel(bn):
                total = P[0, by, bx * bn + j]
                for s in range(1, splits):
                    total = total + P[s, by, bx * bn + j]
                Y[by, bx * bn + j] = T.cast(total, dtype)

    return splitk_sum_kernel
