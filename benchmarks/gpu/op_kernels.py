"""Kernels that exercise every DSL op on the GPU, each with a reference on torch tensors.
build_bundle.py compiles them here; run_spine.py launches them on the H200 and compares.
Importing this module needs tiled's thin side only (no TVM)."""

import tiled
import tiled.lang as T


def stats():
    """Reductions (min, max, sum with clear=False), fill, a local scalar, a serial loop with a
    traced `if`, scalar params, atomics and math intrinsics."""
    M = T.dyn("M")

    @tiled.kernel
    def stats(X: T.Tensor((M, 64), "float32"), out: T.Tensor((M, 4), "float32"),
              total: T.Tensor((1,), "float32"), scale: T.float32, limit: T.int32):
        with T.Kernel(T.ceildiv(M, 8), threads=64) as bx:
            x = T.alloc_fragment((8, 64), "float32")
            lo = T.alloc_fragment((8,), "float32")
            hi = T.alloc_fragment((8,), "float32")
            s = T.alloc_fragment((8,), "float32")
            acc = T.alloc_local((1,), "float32")
            T.copy(X[bx * 8, 0], x)
            T.reduce_min(x, lo, dim=1)
            T.reduce_max(x, hi, dim=1)
            T.fill(s, 1.0)
            T.reduce_sum(x, s, dim=1, clear=False)
            acc[0] = 0.0
            for i in T.serial(8):
                if bx * 8 + i < M:
                    out[bx * 8 + i, 0] = lo[i]
                    out[bx * 8 + i, 1] = hi[i]
                    out[bx * 8 + i, 2] = s[i] * scale
                    out[bx * 8 + i, 3] = T.sqrt(T.abs(hi[i])) + T.max(T.tanh(lo[i]), -0.5)
                    acc[0] = acc[0] + T.if_then_else(i < limit, T.exp2(lo[i] * 0.0), 0.0)
            T.atomic_add(total[0], acc[0])

    return stats


def stats_reference(torch, x, scale, limit):
    lo, hi = x.min(1).values, x.max(1).values
    out = torch.stack([lo, hi, (1 + x.sum(1)) * scale,
                       hi.abs().sqrt() + torch.tanh(lo).clamp_min(-0.5)], dim=1)
    rows = x.shape[0]
    count = sum(min(limit, rows - b * 8) for b in range(-(-rows // 8)))
    return out, float(count)


def gemm_transposed(ta: bool, tb: bool, dtype="float16", M=256, N=192, K=160):
    """C = op(A) @ op(B) with 64x64x32 tiles; A is stored (K, M) when ta, B (N, K) when tb."""
    acc = "int32" if dtype == "int8" else "float32"

    @tiled.kernel
    def gemm_t(A: T.Tensor((K, M) if ta else (M, K), dtype),
               B: T.Tensor((N, K) if tb else (K, N), dtype),
               C: T.Tensor((M, N), acc)):
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64), threads=128) as (bx, by):
            A_s = T.alloc_shared((32, 64) if ta else (64, 32), dtype)
            B_s = T.alloc_shared((64, 32) if tb else (32, 64), dtype)
            C_l = T.alloc_fragment((64, 64), acc)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=2):
                if ta:
                    T.copy(A[k * 32, by * 64], A_s)
                else:
                    T.copy(A[by * 64, k * 32], A_s)
                if tb:
                    T.copy(B[bx * 64, k * 32], B_s)
                else:
                    T.copy(B[k * 32, bx * 64], B_s)
                T.gemm(A_s, B_s, C_l, transpose_A=ta, transpose_B=tb)
            T.copy(C_l, C[by * 64, bx * 64])

    return gemm_t


def unary_math(dtype="float16"):
    """Element-wise intrinsics over a ragged 2-D tensor, guarded with a traced `if`."""
    M = T.dyn("M")

    @tiled.kernel
    def unary(X: T.Tensor((M, 96), dtype), Y: T.Tensor((M, 96), dtype)):
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            for i, j in T.Parallel(16, 96):
                if bx * 16 + i < M:
                    v = X[bx * 16 + i, j].astype("float32")
                    Y[bx * 16 + i, j] = (T.exp(v * 0.5) + T.log(T.abs(v) + 1.0)
                                         + T.rsqrt(v * v + 1.0) + T.tanh(v))

    return unary


def unary_reference(torch, x):
    v = x.float()
    return (torch.exp(v * 0.5) + torch.log(v.abs() + 1) + torch.rsqrt(v * v + 1)
            + torch.tanh(v)).to(x.dtype)


def copies():
    """Every copy direction without the async fast path (39 columns: rows are not 16-byte
    aligned), fills of shared tiles, atomics on shared memory inside T.Parallel and on global
    memory outside it, and T.unroll."""
    M = T.dyn("M")

    @tiled.kernel
    def copies(X: T.Tensor((M, 39), "float32"), Y: T.Tensor((M, 39), "float32"),
               H: T.Tensor((16,), "int32")):
        with T.Kernel(T.ceildiv(M, 8), threads=64) as bx:
            s = T.alloc_shared((8, 39), "float32")
            f = T.alloc_fragment((8, 39), "float32")
            s2 = T.alloc_shared((8, 39), "float32")
            hist = T.alloc_shared((16,), "int32")
            T.fill(hist, 0)
            T.copy(X[bx * 8, 0], s)
            T.copy(s, f)
            for i, j in T.Parallel(8, 39):
                f[i, j] = f[i, j] * 2.0 + 1.0
            T.copy(f, s2)
            for i, j in T.Parallel(8, 39):
                if bx * 8 + i < M:
                    T.atomic_add(hist[j % 16], 1)
            T.copy(s2, Y[bx * 8, 0])
            for k in T.unroll(16):
                T.atomic_add(H[k], hist[k])

    return copies


def copies_histogram(rows: int) -> list[int]:
    return [rows * sum(1 for j in range(39) if j % 16 == k) for k in range(16)]


def kernels():
    out = {"op_stats": stats(), "op_unary_fp16": unary_math(), "op_copies": copies()}
    for ta in (False, True):
        for tb in (False, True):
            out[f"op_gemm_fp16_ta{int(ta)}_tb{int(tb)}"] = gemm_transposed(ta, tb)
    out["op_gemm_bf16_ta0_tb1"] = gemm_transposed(False, True, "bfloat16")
    out["op_gemm_int8_ta0_tb1"] = gemm_transposed(False, True, "int8")
    return out
