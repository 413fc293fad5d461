"""Quantized kernels: a GEMM over int4 weights packed two per byte (dequantized in shared
memory with shifts and masks, then tensor-core GEMM, as TileLang's dequantize_gemm examples
do it as far as their ops go), and per-row absmax quantization to int8 / fp8."""

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[-1])
def dequant_gemm_int4(M, N, K, block_M=64, block_N=64, block_K=64, threads=128):
    """C = A @ dequant(B)^T: B is [N, K / 2] uint8, element 2k in the low nibble, 2k + 1 in the
    high one, each a signed int4 (two's complement), times a per-row fp16 scale."""
    Mdyn = T.dyn("M")

    @T.prim_func
    def main(A: T.Tensor((Mdyn, K), "float16"), B: T.Tensor((N, K // 2), "uint8"),
             scale: T.Tensor((N,), "float16"), C: T.Tensor((Mdyn, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(Mdyn, block_M), threads=threads) as (
                bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "float16")
            B_packed = T.alloc_shared((block_N, block_K // 2), "uint8")
            B_shared = T.alloc_shared((block_N, block_K), "float16")
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * (block_K // 2)], B_packed)
                for n, kk in T.Parallel(block_N, block_K):
                    byte = T.cast(B_packed[n, kk // 2], "int32")
                    nib = (byte >> ((kk % 2) * 4)) & 15
                    val = T.if_then_else(nib >= 8, nib - 16, nib)
                    B_shared[n, kk] = T.cast(val, "float16") * scale[bx * block_N + n]
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def _int4_inputs(rng, s):
    q = rng.integers(-8, 8, (s["N"], s["K"]))
    nib = q & 15
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.float64)
    return [(rng.standard_normal((s["M"], s["K"])), "float16"), (packed, "uint8"),
            (rng.uniform(0.01, 0.1, s["N"]), "float16")]


def _int4_ref(x, s):
    a, packed, scale = x
    p = packed.astype(np.int64)
    q = np.empty((s["N"], s["K"]), np.int64)
    q[:, 0::2], q[:, 1::2] = p & 15, p >> 4
    q = np.where(q >= 8, q - 16, q)
    w = (q * scale[:, None]).astype(np.float16).astype(np.float64)  # as the kernel rounds
    return a @ w.T


register(Case(
    "dequant_gemm_int4", "dequantize_gemm", ("gemm_ss", "transpose", "parallel", "symbolic",
                                             "pipelined", "jit", "prim_func"),
    factory=dequant_gemm_int4, inputs=_int4_inputs, reference=_int4_ref, tol=2e-3,
    cpu={"M": 70, "N": 64, "K": 128},
    gpu={"M": 16, "N": 14336, "K": 4096, "block_M": 64, "block_N": 128, "block_K": 128},
    work=lambda s: ("bytes", s["N"] * s["K"] // 2 + 2 * s["M"] * s["K"]),
    torch_op=lambda torch, x, s: _int4_torch(torch, x),
    notes="timed beside the torch a user writes without a kernel: unpack, scale, matmul"))


def _int4_torch(torch, x):
    a, packed, scale = x

    def run():
        p = packed.to(torch.int16)
        q = torch.stack([p & 15, p >> 4], dim=-1).flatten(-2)
        q = torch.where(q >= 8, q - 16, q)
        return a @ (q.to(a.dtype) * scale[:, None]).T
    return run


@tiled.jit(out_idx=[1, 2])
def absmax_quant(M, N, blk_m=4, out_dtype="int8", threads=128):
    """Per-row symmetric quantization: scale = absmax / qmax, q = round(x / scale)."""
    Mdyn = T.dyn("M")
    qmax = T.max_value(out_dtype) if out_dtype == "int8" else 448.0

    @T.prim_func
    def main(X: T.Tensor((Mdyn, N), "float32"), Q: T.Tensor((Mdyn, N), out_dtype),
             S: T.Tensor((Mdyn,), "float32")):
        with T.Kernel(T.ceildiv(Mdyn, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            amax = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m, 0], x)
            T.reduce_absmax(x, amax, dim=1)
            for i in T.Parallel(blk_m):
                amax[i] = T.max(amax[i], 1e-12) / qmax  # an all-zero row keeps scale > 0
                S[bx * blk_m + i] = amax[i]
            for i, j in T.Parallel(blk_m, N):
                v = x[i, j] / amax[i]
                if out_dtype == "int8":
                    Q[bx * blk_m + i, j] = T.cast(T.floor(v + 0.5), out_dtype)
                else:
                    Q[bx * blk_m + i, j] = T.cast(v, out_dtype)

    return main


def _quant_ref(x, s, fp8=False):
    v = x[0]
    scale = np.maximum(np.abs(v).max(axis=1), 0) / (448.0 if fp8 else 127.0)
    q = v / scale[:, None]
    return [q if fp8 else np.floor(q + 0.5), scale]


for name, dt, fp8, tol in [("absmax_quant_int8", "int8", False, 1e-6),
                           ("absmax_quant_fp8", "float8_e4m3", True, 0.07)]:
    register(Case(
        name, "quantize", ("reduce_absmax", "max_min_value", "fp8", "if", "symbolic", "jit",
                           "copy_g2f", "prim_func"),
        factory=lambda dt=dt, **s: absmax_quant(**s, out_dtype=dt),
        inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["N"])), "float32")],
        reference=lambda x, s, fp8=fp8: _quant_ref(x, s, fp8), tol=tol,
        cpu={"M": 9, "N": 128}, gpu={"M": 16384, "N": 4096, "blk_m": 1},
        work=lambda s: ("bytes", 5 * s["M"] * s["N"]),
        torch_op=lambda torch, x, s, dt=dt: _quant_torch(torch, x[0], dt)))


def _quant_torch(torch, x, dt):
    """The same quantization in torch ops (amax, divide, round / cast)."""
    qmax = 127.0 if dt == "int8" else 448.0

    def run():
        scale = x.abs().amax(dim=1).clamp_min(1e-12) / qmax
        v = x / scale[:, None]
        q = torch.floor(v + 0.5).to(torch.int8) if dt == "int8" else \
            v.to(torch.float8_e4m3fn)
        return [q, scale]
    return run
