"""2-D convolution as an implicit GEMM, the way TileLang's convolution example builds it: the
output pixels are the GEMM's M, the (kh, kw, c) taps its K; each data tile is gathered into
shared memory by index arithmetic with `and`-ed bounds (padding reads 0), the filter tile is a
plain copy, tensor-core GEMM, the result staged through shared memory."""

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[2])
def conv2d_nhwc(N, C, H, W, F, K, S=1, D=1, P=1, block_M=64, block_N=64, block_K=32,
                num_stages=2, threads=128, dtype="float16"):
    OH = (H + 2 * P - D * (K - 1) - 1) // S + 1
    OW = (W + 2 * P - D * (K - 1) - 1) // S + 1
    taps = K * K * C

    @T.prim_func
    def conv(data: T.Tensor([N, H, W, C], dtype), weight: T.Tensor([K * K * C, F], dtype),
             out: T.Tensor([N, OH, OW, F], dtype)):
        with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(N * OH * OW, block_M),
                      threads=threads) as (bx, by):
            data_shared = T.alloc_shared((block_M, block_K), dtype)
            weight_shared = T.alloc_shared((block_K, block_N), dtype)
            out_local = T.alloc_fragment((block_M, block_N), "float")
            out_shared = T.alloc_shared((block_M, block_N), dtype)
            T.clear(out_local)
            for k_iter in T.Pipelined(T.ceildiv(taps, block_K), num_stages=num_stages):
                for i, j in T.Parallel(block_M, block_K):
                    k = k_iter * block_K + j
                    m = by * block_M + i
                    h = m % (OH * OW) // OW * S + k // (K * C) * D - P
                    w = m % OW * S + k // C % K * D - P
                    inside = h >= 0 and w >= 0 and h < H and w < W and k < taps
                    data_shared[i, j] = T.if_then_else(inside, data[m // (OH * OW), h, w, k % C],
                                                       0)
                T.copy(weight[k_iter * block_K, bx * block_N], weight_shared)
                T.gemm(data_shared, weight_shared, out_local)
            T.copy(out_local, out_shared)
            for i, j in T.Parallel(block_M, block_N):
                m = by * block_M + i
                out[m // (OH * OW), m % (OH * OW) // OW, m % OW, bx * block_N + j] = \
                    out_shared[i, j]

    return conv


@tiled.jit(out_idx=[2])
def conv2d_im2col(N, C, H, W, F, K, S=1, D=1, P=1, block_M=64, block_N=64, block_K=32,
                  num_stages=2, threads=128, dtype="float16"):
    """The same convolution as TileLang's example writes it for Hopper: T.c2d_im2col gathers
    the data tile, the output written from shared memory by a tile copy."""
    OH = (H + 2 * P - D * (K - 1) - 1) // S + 1
    OW = (W + 2 * P - D * (K - 1) - 1) // S + 1

    @T.prim_func
    def conv(data: T.Tensor([N, H, W, C], dtype), weight: T.Tensor([K * K * C, F], dtype),
             out: T.Tensor([N * OH * OW, F], dtype)):
        with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(N * OH * OW, block_M),
                      threads=threads) as (bx, by):
            data_shared = T.alloc_shared((block_M, block_K), dtype)
            weight_shared = T.alloc_shared((block_K, block_N), dtype)
            out_local = T.alloc_fragment((block_M, block_N), "float")
            out_shared = T.alloc_shared((block_M, block_N), dtype)
            T.clear(out_local)
            for k_iter in T.Pipelined(T.ceildiv(K * K * C, block_K), num_stages=num_stages):
                T.c2d_im2col(data, data_shared, by, k_iter, K, S, D, P)
                T.copy(weight[k_iter * block_K, bx * block_N], weight_shared)
                T.gemm(data_shared, weight_shared, out_local)
            T.copy(out_local, out_shared)
            T.copy(out_shared, out[by * block_M, bx * block_N])

    return conv


def _conv_inputs(rng, s):
    return [(rng.standard_normal((s["N"], s["H"], s["W"], s["C"])), "float16"),
            (rng.standard_normal((s["K"] * s["K"] * s["C"], s["F"])) * 0.1, "float16")]


def _conv_ref(x, s):
    data, w = x
    n, h, wd, c = data.shape
    k, p, f = s["K"], s.get("P", 1), s["F"]
    pad = np.pad(data, ((0, 0), (p, p), (p, p), (0, 0)))
    oh, ow = h + 2 * p - k + 1, wd + 2 * p - k + 1
    cols = np.stack([pad[:, i:i + oh, j:j + ow, :] for i in range(k) for j in range(k)], 3)
    return cols.reshape(n, oh, ow, k * k * c) @ w.reshape(k * k * c, f)


register(Case(
    "conv2d_nhwc", "convolution", ("annotations", "if", "gemm_ss", "copy_g2s", "copy_s2f",
                                   "pipelined", "jit", "prim_func"),
    factory=conv2d_nhwc, inputs=_conv_inputs, reference=_conv_ref, tol=2e-3,
    cpu={"N": 2, "C": 8, "H": 9, "W": 7, "F": 40, "K": 3},
    gpu={"N": 128, "C": 256, "H": 28, "W": 28, "F": 256, "K": 3, "block_M": 128,
         "block_N": 128, "block_K": 64, "num_stages": 3, "threads": 256},
    work=lambda s: ("flop", 2 * s["N"] * s["H"] * s["W"] * s["F"] * s["K"] ** 2 * s["C"]),
    torch_op=lambda torch, x, s: _torch_conv(torch, x, s)))


register(Case(
    "conv2d_im2col", "convolution", ("im2col", "gemm_ss", "copy_g2s", "copy_s2g", "pipelined",
                                     "jit", "prim_func"),
    factory=conv2d_im2col, inputs=_conv_inputs,
    reference=lambda x, s: _conv_ref(x, s).reshape(-1, s["F"]), tol=2e-3,
    cpu={"N": 2, "C": 8, "H": 9, "W": 7, "F": 40, "K": 3},
    gpu={"N": 128, "C": 256, "H": 28, "W": 28, "F": 256, "K": 3, "block_M": 128,
         "block_N": 128, "block_K": 64, "num_stages": 3, "threads": 256},
    work=lambda s: ("flop", 2 * s["N"] * s["H"] * s["W"] * s["F"] * s["K"] ** 2 * s["C"]),
    torch_op=lambda torch, x, s: _torch_conv(torch, x, s)))


def _torch_conv(torch, x, s):
    data, w = x
    nchw = data.permute(0, 3, 1, 2).contiguous()
    filt = w.reshape(s["K"], s["K"], s["C"], s["F"]).permute(3, 2, 0, 1).contiguous()
    return lambda: torch.nn.functional.conv2d(nchw, filt, padding=1).permute(0, 2, 3, 1)
