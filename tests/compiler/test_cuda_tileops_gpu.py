"""Kernels of the CUDA tile-op lowering (copy, gemm, reduce, scan, atomics,
T.vectorized, GemmWarpPolicy) with numpy references: compiled with nvcc for sm_80 and sm_90a
here (the tests below), run on the H200 from a bundle (sm_90a: the generic path, i.e. sm_80's
instructions; sm_80 cubins do not load on Hopper):

    .venv/bin/python tests/compiler/test_cuda_tileops_gpu.py build --out .gpu/tileops   # here
    python3 tests/compiler/test_cuda_tileops_gpu.py run --bundle .gpu/tileops           # there

`run` prints one line per kernel (max error against the reference, the tolerance) and exits 1
when any is off. The kernels are written as TileLang's authors write them (FlashAttention's
forward as tile-ai/tilelang's example_mha_fwd_bshd.py is structured: scores_max /
scores_max_prev / scores_scale / scores_sum / logsum fragments, `T.copy(acc_s, acc_s_cast)`,
`T.gemm(acc_s_cast, V_shared, acc_o)`). They were written before the DSL spelled policy=,
T.cumsum, T.reduce_absmax, T.atomic_max / min and T.vectorized, so those are set on the
traced Tile IR; the verifier accepts every one of them now (the compile test checks it), and
the compile skips guards.

Importing this module needs no TVM (the H200 machine has none): the compiler is imported by
`compile_case` only. (No `from __future__ import annotations`: the DSL evaluates the kernels'
parameter annotations, which name closure variables.)
"""

import argparse
import hashlib
import json
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tiled
import tiled.lang as T
from tiled.lang.builder import current
from tiled.v1 import tile_ir_pb2 as pb

LOG2E = 1.44269504


# -- Tile IR the DSL does not spell yet ---------------------------------------------------------
def _last() -> pb.Stmt:
    return current().scopes[-1][-1]


def gemm(A, B, C, policy=pb.POLICY_SQUARE, **kw) -> None:
    T.gemm(A, B, C, **kw)
    _last().gemm.policy = policy


def reduce_absmax(src, dst, dim=-1, clear=True) -> None:
    T.reduce_max(src, dst, dim=dim, clear=clear)
    _last().reduce.kind = pb.REDUCE_ABSMAX


def cumsum(src, dst, dim=0, reverse=False) -> None:
    st = pb.Stmt()
    st.scan.src, st.scan.dst, st.scan.dim, st.scan.reverse = src.bid, dst.bid, dim, reverse
    current().emit(st)


def atomic(op: int, dst, value) -> None:
    T.atomic_add(dst, value)
    _last().atomic_add.op = op


def vectorize_last() -> None:
    """The loop just closed becomes a T.vectorized loop."""
    _last().for_.kind = pb.VECTORIZED


# -- cases ---------------------------------------------------------------------------------------
@dataclass
class Case:
    kernel: object
    inputs: Callable  # rng -> list of numpy arrays, in parameter order (outputs included)
    reference: Callable  # inputs -> {parameter index: expected array}
    tol: float = 1e-2  # max |error| / (max |expected| + 1e-6)
    options: dict = None  # compile options (e.g. warp_specialize=False: the mma.sync path)
    bf16: tuple = ()  # parameters that are bfloat16 (float32 arrays of bf16 values here)


def flash_attention(batch, heads, seq_len, dim, is_causal, block_M=64, block_N=64,
                    threads=128, policy=pb.POLICY_FULL_ROW, dtype="float16"):
    """TileLang's FlashAttention forward over [batch, seq, heads, dim] tensors, structured as
    its example_mha_fwd_bshd.py (written anew here)."""
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = (batch, seq_len, heads, dim)
    accum_dtype = "float32"

    @tiled.kernel
    def mha_fwd(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype),
                V: T.Tensor(shape, dtype), Output: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared((block_M, dim), dtype, name="Q_shared")
            K_shared = T.alloc_shared((block_N, dim), dtype, name="K_shared")
            V_shared = T.alloc_shared((block_N, dim), dtype, name="V_shared")
            O_shared = T.alloc_shared((block_M, dim), dtype, name="O_shared")
            acc_s = T.alloc_fragment((block_M, block_N), accum_dtype, name="acc_s")
            acc_s_cast = T.alloc_fragment((block_M, block_N), dtype, name="acc_s_cast")
            acc_o = T.alloc_fragment((block_M, dim), accum_dtype, name="acc_o")
            scores_max = T.alloc_fragment((block_M,), accum_dtype, name="scores_max")
            scores_max_prev = T.alloc_fragment((block_M,), accum_dtype, name="scores_max_prev")
            scores_scale = T.alloc_fragment((block_M,), accum_dtype, name="scores_scale")
            scores_sum = T.alloc_fragment((block_M,), accum_dtype, name="scores_sum")
            logsum = T.alloc_fragment((block_M,), accum_dtype, name="logsum")

            T.copy(Q[bz, bx * block_M:bx * block_M + block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            n_tiles = T.ceildiv(seq_len, block_N)
            if is_causal:
                n_tiles = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N))
            for k in T.Pipelined(n_tiles, num_stages=1):
                T.copy(K[bz, k * block_N:k * block_N + block_N, by, :], K_shared)
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0,
                                                     -T.infinity(accum_dtype))
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_len,
                                                     -T.infinity(accum_dtype), 0)
                gemm(Q_shared, K_shared, acc_s, policy, transpose_B=True)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, k * block_N:k * block_N + block_N, by, :], V_shared)
                gemm(acc_s_cast, V_shared, acc_o, policy)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M:bx * block_M + block_M, by, :])

    return mha_fwd


def to_bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to the nearest bfloat16 (ties to even), still as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def _fa_case(batch, heads, seq, dim, causal, dtype="float16", **kw) -> Case:
    def inputs(rng):
        q, k, v = (rng.standard_normal((batch, seq, heads, dim)) for _ in range(3))
        if dtype == "bfloat16":
            q, k, v = (to_bf16_values(x) for x in (q, k, v))
        else:
            q, k, v = (x.astype(dtype) for x in (q, k, v))
        return [q, k, v, np.full_like(q, np.nan)]

    def reference(args):
        q, k, v = (a.astype(np.float64).transpose(0, 2, 1, 3) for a in args[:3])
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dim)
        if causal:
            s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return {3: ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)}

    return Case(flash_attention(batch, heads, seq, dim, causal, dtype=dtype, **kw), inputs,
                reference, bf16=(0, 1, 2, 3) if dtype == "bfloat16" else ())


def matmul(M, N, K, policy, block_M=128, block_N=128, block_K=32, threads=128):
    @tiled.kernel
    def gemm_policy(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
                    C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), "float16")
            B_s = T.alloc_shared((block_K, block_N), "float16")
            C_l = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                gemm(A_s, B_s, C_l, policy)
            T.copy(C_l, C[by * block_M, bx * block_N])

    return gemm_policy


def matmul_row_max(M, N, K, policy, block_M=128, block_N=128, block_K=64, threads=128):
    """A GEMM with a row-max epilogue: on sm_90a the warp-specialized GEMM path, whose wgmma
    accumulator replaces the mma layout (and its rows layout, under FullRow)."""

    @tiled.kernel
    def gemm_row_max(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
                     C: T.Tensor((M, N), "float32"), R: T.Tensor((M, N // block_N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), "float16")
            B_s = T.alloc_shared((block_K, block_N), "float16")
            C_l = T.alloc_fragment((block_M, block_N), "float32")
            m = T.alloc_fragment((block_M,), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                gemm(A_s, B_s, C_l, policy)
            T.reduce_max(C_l, m, dim=1)
            T.copy(C_l, C[by * block_M, bx * block_N])
            for i in T.Parallel(block_M):
                R[by * block_M + i, bx] = m[i]

    def inputs(rng):
        return [*_gemm_inputs(M, N, K)(rng), np.full((M, N // block_N), np.nan, "float32")]

    def reference(args):
        c = _product(args)
        return {2: c, 3: c.reshape(M, N // block_N, block_N).max(2)}

    return Case(gemm_row_max, inputs, reference)


def _gemm_inputs(M, N, K, n_out=1):
    def inputs(rng):
        a = rng.standard_normal((M, K)).astype("float16")
        b = rng.standard_normal((K, N)).astype("float16")
        return [a, b] + [np.full((M, N), np.nan, "float32") for _ in range(n_out)]
    return inputs


def _product(args):
    return args[0].astype(np.float64) @ args[1].astype(np.float64)


def _policy_case(policy) -> Case:
    # Without warp specialization: sm_90a's GEMM path (wgmma) has no warp grid to choose.
    return Case(matmul(256, 256, 96, policy), _gemm_inputs(256, 256, 96),
                lambda args: {2: _product(args)}, options={"warp_specialize": False})


def column_vectors(policy, M=128, N=128, K=64, block_M=64, block_N=64, block_K=32, **options):
    """A gemm's epilogue with vectors over its columns (a per-channel scale and a bias, as
    TileLang users write them): each loaded whole into a fragment, read as v[j] over the
    accumulator (the accumulator's columns layout), and written back out from a nest of its
    own (one holder of each column writes)."""

    @tiled.kernel
    def gemm_cols(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
                  Scale: T.Tensor((N,), "float32"), Bias: T.Tensor((N,), "float32"),
                  C: T.Tensor((M, N), "float32"), Cols: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), "float16")
            B_s = T.alloc_shared((block_K, block_N), "float16")
            C_l = T.alloc_fragment((block_M, block_N), "float32")
            scale = T.alloc_fragment((block_N,), "float32")
            bias = T.alloc_fragment((block_N,), "float32")
            T.copy(Scale[bx * block_N], scale)
            T.copy(Bias[bx * block_N], bias)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                gemm(A_s, B_s, C_l, policy)
            for i, j in T.Parallel(block_M, block_N):
                C_l[i, j] = C_l[i, j] * scale[j] + bias[j]
            T.copy(C_l, C[by * block_M, bx * block_N])
            for j in T.Parallel(block_N):  # (every row of blocks writes the same values)
                Cols[bx * block_N + j] = bias[j] * 2.0 + scale[j]

    def inputs(rng):
        return [*_gemm_inputs(M, N, K)(rng)[:2], rng.standard_normal(N).astype(np.float32),
                rng.standard_normal(N).astype(np.float32), np.full((M, N), np.nan, np.float32),
                np.full(N, np.nan, np.float32)]

    def reference(args):
        return {4: _product(args) * args[2] + args[3], 5: 2.0 * args[3] + args[2]}

    return Case(gemm_cols, inputs, reference, options=options or None)


def gemm_fragment_operands(policy, M=64, N=64, K=64, a_dtype="float16"):
    """A in a fragment (loaded from shared, then scaled in a T.Parallel nest) and, in a second
    gemm, B in a fragment. A float32 A fragment takes the SIMT gemm (staged)."""

    @tiled.kernel
    def gemm_frag(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
                  C: T.Tensor((M, N), "float32"), C2: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((M, K), "float16")
            B_s = T.alloc_shared((K, N), "float16")
            A_f = T.alloc_fragment((M, K), a_dtype)
            B_f = T.alloc_fragment((K, N), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            acc2 = T.alloc_fragment((M, N), "float32")
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.copy(A_s, A_f)
            for i, k in T.Parallel(M, K):
                A_f[i, k] = A_f[i, k] * 2
            T.clear(acc)
            gemm(A_f, B_s, acc, policy)
            T.copy(acc, C[0, 0])
            T.copy(B_s, B_f)
            T.clear(acc2)
            gemm(A_s, B_f, acc2, policy)
            T.copy(acc2, C2[0, 0])

    return Case(gemm_frag, _gemm_inputs(M, N, K, 2),
                lambda args: {2: 2 * _product(args), 3: _product(args)})


def fragment_copies(policy, M=64, N=64):
    """Fragment <-> fragment (cast, other layouts, parts), fragment -> global parts, row sums."""

    @tiled.kernel
    def frag_copies(A: T.Tensor((M, 64), "float16"), B: T.Tensor((64, N), "float16"),
                    O1: T.Tensor((M, N), "float16"), O2: T.Tensor((32, N), "float32"),
                    O3: T.Tensor((32, 32), "float32"), O4: T.Tensor((M,), "float32"),
                    O5: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((M, 64), "float16")
            B_s = T.alloc_shared((64, N), "float16")
            S = T.alloc_shared((M, N), "float32")
            acc = T.alloc_fragment((M, N), "float32")
            acc_h = T.alloc_fragment((M, N), "float16")
            part = T.alloc_fragment((32, N), "float32")
            rows = T.alloc_fragment((M,), "float32")
            back = T.alloc_fragment((M, N), "float32")
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.clear(acc)
            gemm(A_s, B_s, acc, policy)
            T.copy(acc, acc_h)  # one layout: per thread, with the cast
            T.copy(acc_h, O1[0, 0])
            T.copy(acc[16:48, :], part)  # a part into another layout: through shared memory
            for i, j in T.Parallel(32, N):
                part[i, j] = part[i, j] + 1
            T.copy(part, O2[0, 0])
            T.copy(acc[32:64, 8:40], O3[0, 0])  # a part of a fragment to global
            T.reduce_sum(acc, rows, dim=1)
            T.copy(rows, O4[0])
            T.copy(acc, S)
            T.copy(S[0:M, :], back)  # shared -> fragment
            T.copy(back, O5[0, 0])

    def inputs(rng):
        return [rng.standard_normal((M, 64)).astype("float16"),
                rng.standard_normal((64, N)).astype("float16"),
                np.full((M, N), np.nan, "float16"), np.full((32, N), np.nan, "float32"),
                np.full((32, 32), np.nan, "float32"), np.full((M,), np.nan, "float32"),
                np.full((M, N), np.nan, "float32")]

    def reference(args):
        c = _product(args)
        return {2: c, 3: c[16:48] + 1, 4: c[32:64, 8:40], 5: c.sum(1), 6: c}

    return Case(frag_copies, inputs, reference)


def absmax_and_rows(policy, M=64, N=64):
    """REDUCE_ABSMAX along rows of an accumulator (a rows layout with FullRow), along columns
    (through shared memory) and of a shared tile onto a prefilled result; an atomic add per
    row in a nest over the rows layout (one lane of each quad adds)."""

    @tiled.kernel
    def absmax(A: T.Tensor((M, 64), "float16"), B: T.Tensor((64, N), "float16"),
               R1: T.Tensor((M,), "float32"), R2: T.Tensor((N,), "float32"),
               R3: T.Tensor((M,), "float32"), Sum: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((M, 64), "float16")
            B_s = T.alloc_shared((64, N), "float16")
            S = T.alloc_shared((M, N), "float32")
            acc = T.alloc_fragment((M, N), "float32")
            r1 = T.alloc_fragment((M,), "float32")
            r2 = T.alloc_fragment((N,), "float32")
            r3 = T.alloc_fragment((M,), "float32")
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.clear(acc)
            gemm(A_s, B_s, acc, policy)
            reduce_absmax(acc, r1, dim=1)
            for i in T.Parallel(M):
                T.atomic_add(Sum[0], r1[i])
            T.copy(r1, R1[0])
            reduce_absmax(acc, r2, dim=0)
            T.copy(r2, R2[0])
            T.copy(acc, S)
            T.fill(r3, 40.0)
            reduce_absmax(S, r3, dim=1, clear=False)
            T.copy(r3, R3[0])

    def inputs(rng):
        return [rng.standard_normal((M, 64)).astype("float16"),
                rng.standard_normal((64, N)).astype("float16"),
                np.full((M,), np.nan, "float32"), np.full((N,), np.nan, "float32"),
                np.full((M,), np.nan, "float32"), np.zeros((1,), "float32")]

    def reference(args):
        c = np.abs(_product(args))
        return {2: c.max(1), 3: c.max(0), 4: np.maximum(c.max(1), 40.0),
                5: np.array([c.max(1).sum()])}

    return Case(absmax, inputs, reference, tol=1e-4)


def prefix_sums(policy, M=64, N=32):
    """T.cumsum of a shared tile in place, of a cyclic fragment (reversed, into another), of
    an mma accumulator along its rows, and of a replicated row vector."""

    @tiled.kernel
    def scans(X: T.Tensor((M, N), "float32"), A: T.Tensor((M, 64), "float16"),
              B: T.Tensor((64, N), "float16"), O1: T.Tensor((M, N), "float32"),
              O2: T.Tensor((M, N), "float32"), O3: T.Tensor((M, N), "float32"),
              O4: T.Tensor((M,), "float32"), O5: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=128):
            S = T.alloc_shared((M, N), "float32")
            A_s = T.alloc_shared((M, 64), "float16")
            B_s = T.alloc_shared((64, N), "float16")
            F = T.alloc_fragment((M, N), "float32")
            G = T.alloc_fragment((M, N), "float32")
            acc = T.alloc_fragment((M, N), "float32")
            acc_scan = T.alloc_fragment((M, N), "float32")
            r = T.alloc_fragment((M,), "float32")
            r_scan = T.alloc_fragment((M,), "float32")
            racc = T.alloc_fragment((M,), "float32")
            T.copy(X[0, 0], S)
            cumsum(S, S, dim=1)
            T.copy(S, O1[0, 0])
            T.copy(X[0, 0], F)
            cumsum(F, G, dim=0, reverse=True)
            T.copy(G, O2[0, 0])
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.clear(acc)
            gemm(A_s, B_s, acc, policy)
            cumsum(acc, acc_scan, dim=1)
            T.copy(acc_scan, O3[0, 0])
            T.reduce_sum(S, r, dim=1)
            cumsum(r, r_scan, dim=0)
            T.copy(r_scan, O4[0])
            T.reduce_sum(acc, racc, dim=1)  # a rows layout with FullRow
            cumsum(racc, racc, dim=0, reverse=True)  # in place
            T.copy(racc, O5[0])

    def inputs(rng):
        return [rng.standard_normal((M, N)).astype("float32"),
                rng.standard_normal((M, 64)).astype("float16"),
                rng.standard_normal((64, N)).astype("float16")] + \
            [np.full((M, N), np.nan, "float32") for _ in range(3)] + \
            [np.full((M,), np.nan, "float32") for _ in range(2)]

    def reference(args):
        x = args[0].astype(np.float64)
        s1 = np.cumsum(x, 1)
        c = args[1].astype(np.float64) @ args[2].astype(np.float64)
        return {3: s1, 4: np.cumsum(x[::-1], 0)[::-1], 5: np.cumsum(c, 1),
                6: np.cumsum(s1.sum(1), 0), 7: np.cumsum(c.sum(1)[::-1])[::-1]}

    return Case(scans, inputs, reference, tol=1e-4)


ATOMIC_DTYPES = ("int32", "int64", "int8", "float32", "float16", "float64")


ADD_DTYPES = ("int8", "int16", "int64")  # the integer adds CUDA's atomicAdd lacks


def atomics(n=4096, buckets=8, dtypes=ATOMIC_DTYPES):
    """T.atomic_max / atomic_min of n values into `buckets` global elements of each dtype,
    many blocks and threads contending, and through a shared tile (float32); integer
    atomic adds of the widths CUDA's atomicAdd has no overload for (wrapping)."""
    blocks = n // 256

    params = {}
    for dt in dtypes:
        params[f"X_{dt}"] = T.Tensor((n,), dt)
        params[f"Max_{dt}"] = T.Tensor((buckets,), dt)
        params[f"Min_{dt}"] = T.Tensor((buckets,), dt)
    params["Smax"] = T.Tensor((buckets,), "float32")
    for dt in ADD_DTYPES:
        params[f"Y_{dt}"] = T.Tensor((n,), dt)
        params[f"Add_{dt}"] = T.Tensor((buckets,), dt)

    def body(*args):
        a = dict(zip(params, args, strict=True))
        with T.Kernel(blocks, threads=128) as bx:
            sm = T.alloc_shared((buckets,), "float32")
            T.fill(sm, -T.infinity("float32"))
            for i in T.Parallel(256):
                for dt in dtypes:
                    x = a[f"X_{dt}"][bx * 256 + i]
                    atomic(pb.ATOMIC_MAX, a[f"Max_{dt}"][i % buckets], x)
                    atomic(pb.ATOMIC_MIN, a[f"Min_{dt}"][i % buckets], x)
                atomic(pb.ATOMIC_MAX, sm[i % buckets], a["X_float32"][bx * 256 + i])
                for dt in ADD_DTYPES:
                    T.atomic_add(a[f"Add_{dt}"][i % buckets], a[f"Y_{dt}"][bx * 256 + i])
            for i in T.Parallel(buckets):
                atomic(pb.ATOMIC_MAX, a["Smax"][i], sm[i])

    body.__signature__ = __import__("inspect").Signature(
        [__import__("inspect").Parameter(k, 1, annotation=v) for k, v in params.items()])
    body.__name__ = "atomics"
    kernel = tiled.kernel(body)

    def inputs(rng):
        out = []
        for dt in dtypes:
            if dt.startswith("int"):
                info = np.iinfo(dt)
                x = rng.integers(max(info.min, -10**6), min(info.max, 10**6), n).astype(dt)
                lo, hi = info.min, info.max
            else:
                x = (rng.standard_normal(n) * 100).astype(dt)
                lo, hi = -np.inf, np.inf
            out += [x, np.full(buckets, lo, dt), np.full(buckets, hi, dt)]
        out.append(np.full(buckets, -np.inf, "float32"))
        for dt in ADD_DTYPES:
            info = np.iinfo(dt)
            out += [rng.integers(info.min, info.max, n, endpoint=True).astype(dt),
                    rng.integers(info.min, info.max, buckets, endpoint=True).astype(dt)]
        return out

    def reference(args):
        ref = {}
        for k, dt in enumerate(dtypes):
            x = args[3 * k].reshape(-1, buckets)
            ref[3 * k + 1], ref[3 * k + 2] = x.max(0), x.min(0)
        base = 3 * len(dtypes)
        ref[base] = args[3 * dtypes.index("float32")].reshape(-1, buckets).max(0)
        for k, dt in enumerate(ADD_DTYPES):
            y, start = args[base + 1 + 2 * k], args[base + 2 + 2 * k]
            with np.errstate(over="ignore"):  # the sums wrap, as the atomics do
                ref[base + 2 + 2 * k] = start + y.reshape(-1, buckets).sum(0, dtype=dt)
        return ref

    return Case(kernel, inputs, reference, tol=0.0)


def vector_loops(n=4096):
    """T.vectorized loops: aligned (vector lanes), misaligned by one element (unrolled), over
    a shared tile, and of a symbolic-free extent too large to unroll."""

    @tiled.kernel
    def vec(X: T.Tensor((n + 4,), "float32"), Y: T.Tensor((n,), "float32"),
            Z: T.Tensor((n,), "float32"), W: T.Tensor((n,), "float16")):
        with T.Kernel(n // 1024, threads=128) as bx:
            S = T.alloc_shared((1024,), "float32")
            for i in T.Parallel(256):
                for v in T.unroll(4):
                    Y[bx * 1024 + i * 4 + v] = X[bx * 1024 + i * 4 + v] * 2 + 1
                vectorize_last()
            for i in T.Parallel(256):
                for v in T.unroll(4):
                    Z[bx * 1024 + i * 4 + v] = X[bx * 1024 + i * 4 + v + 1] - 3
                vectorize_last()
            for i in T.Parallel(128):
                for v in T.unroll(8):
                    S[i * 8 + v] = X[bx * 1024 + i * 8 + v]
                vectorize_last()
            for i in T.Parallel(256):
                for v in T.unroll(4):
                    W[bx * 1024 + i * 4 + v] = S[i * 4 + v] * 0.5
                vectorize_last()

    def inputs(rng):
        return [rng.standard_normal(n + 4).astype("float32"), np.full(n, np.nan, "float32"),
                np.full(n, np.nan, "float32"), np.full(n, np.nan, "float16")]

    def reference(args):
        x = args[0].astype(np.float64)
        return {1: x[:n] * 2 + 1, 2: x[1:n + 1] - 3, 3: x[:n] * 0.5}

    return Case(vec, inputs, reference, tol=1e-3)


ROW, SQUARE, COL = pb.POLICY_FULL_ROW, pb.POLICY_SQUARE, pb.POLICY_FULL_COL
CASES: dict[str, Callable[[], Case]] = {
    "fa_fullrow": lambda: _fa_case(2, 4, 200, 64, False),
    "fa_fullrow_causal": lambda: _fa_case(2, 4, 256, 64, True),
    "fa_square": lambda: _fa_case(2, 4, 200, 64, False, policy=SQUARE),
    "fa_d128": lambda: _fa_case(1, 4, 256, 128, False),
    "fa_bf16_causal": lambda: _fa_case(2, 4, 256, 64, True, dtype="bfloat16"),
    # TileLang's example's own configuration: 128 x 128 tiles, d 128, 128 threads.
    "fa_128x128_d128": lambda: _fa_case(1, 4, 512, 128, True, block_M=128, block_N=128),
    "gemm_square": lambda: _policy_case(SQUARE),
    "gemm_fullrow": lambda: _policy_case(ROW),
    "gemm_fullcol": lambda: _policy_case(COL),
    "gemm_ws_rowmax": lambda: matmul_row_max(256, 256, 128, ROW),
    "cols_fullrow": lambda: column_vectors(ROW, warp_specialize=False),
    "cols_square": lambda: column_vectors(SQUARE, warp_specialize=False),
    "cols_wgmma": lambda: column_vectors(SQUARE),
    "gemm_frag_fullrow": lambda: gemm_fragment_operands(ROW),
    "gemm_frag_square": lambda: gemm_fragment_operands(SQUARE),
    "gemm_frag_f32": lambda: gemm_fragment_operands(SQUARE, a_dtype="float32"),
    "copies_fullrow": lambda: fragment_copies(ROW),
    "copies_square": lambda: fragment_copies(SQUARE),
    "absmax_fullrow": lambda: absmax_and_rows(ROW),
    "absmax_square": lambda: absmax_and_rows(SQUARE),
    "cumsum_fullrow": lambda: prefix_sums(ROW),
    "cumsum_square": lambda: prefix_sums(SQUARE),
    "atomics": atomics,
    "vectorized": vector_loops,
}
SAME_RESULTS = [("gemm_square", "gemm_fullrow", "gemm_fullcol")]  # bitwise, in `run`


# -- compile (here) -------------------------------------------------------------------------------
def compile_case(kernel, target: str, options: dict | None = None):
    """(artifact, manifest) like tiled.compile_program, but without guards (every access
    here is in bounds or a T.copy, which keeps its own tail semantics)."""
    from tiled.compiler.action import action_of
    from tiled.compiler.manifest import build_manifest
    from tiled.compiler.registry import get_backend, parse_target
    from tiled.ir.program import as_program

    program = as_program(kernel)
    tgt = parse_target(target)
    options = dict(options or {})
    art = get_backend("cuda").compile(program, tgt, options)
    manifest = build_manifest(program, tgt, art, hashlib.sha256(art.data).hexdigest(),
                              action_of(program.digest, tgt, options).record)
    return art, manifest


def build(out: Path, target: str = "cuda:sm_90a") -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, make in CASES.items():
        case = make()
        art, manifest = compile_case(case.kernel, target, case.options)
        (out / f"{name}.cubin").write_bytes(art.data)
        (out / f"{name}.manifest.json").write_text(manifest.to_json())
        print(f"built {name}", flush=True)
    (out / "index.json").write_text(json.dumps({"kernels": list(CASES), "target": target}))


# -- run (on the H200) -----------------------------------------------------------------------------
def run(bundle: Path, only: list[str] | None = None) -> int:
    import torch

    from tiled.runtime import load

    failed, outputs = [], {}
    for name in json.loads((bundle / "index.json").read_text())["kernels"]:
        if only and name not in only:
            continue
        case = CASES[name]()
        kernel = load((bundle / f"{name}.cubin").read_bytes(),
                      (bundle / f"{name}.manifest.json").read_text())
        args = case.inputs(np.random.default_rng(0))
        dev = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in args]
        dev = [d.to(torch.bfloat16) if i in case.bf16 else d for i, d in enumerate(dev)]
        kernel(*dev)
        torch.cuda.synchronize()
        got = [(d.float() if i in case.bf16 else d).cpu().numpy() for i, d in enumerate(dev)]
        outputs[name] = got
        worst = 0.0
        for idx, want in case.reference(args).items():
            if np.asarray(want).dtype.kind in "iu":  # integers: exactly
                worst = max(worst, 0.0 if np.array_equal(got[idx], want) else math.inf)
                continue
            g = got[idx].astype(np.float64)
            scale = float(np.max(np.abs(want))) + 1e-6
            err = float(np.max(np.abs(g - want))) / scale if np.isfinite(g).all() else math.inf
            worst = max(worst, err)
        ok = worst <= case.tol
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max error {worst:.2e} (tolerance "
              f"{case.tol:.0e})", flush=True)
        if not ok:
            failed.append(name)
    for group in SAME_RESULTS:
        if not set(group) <= set(outputs):
            continue
        same = all(np.array_equal(outputs[group[0]][2], outputs[g][2]) for g in group[1:])
        print(f"{'ok  ' if same else 'FAIL'} {' = '.join(group)}: bitwise equal", flush=True)
        if not same:
            failed.append("=".join(group))
    print(f"{len(failed)} failed: {failed}" if failed else "all passed", flush=True)
    return 1 if failed else 0


# -- tests (here): every case compiles for both archs ------------------------------------------
def _nvcc():
    import pytest

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")


def _params():
    import pytest

    return pytest.mark.parametrize("name", list(CASES))


@_params()
def test_case_compiles_for_sm80_and_sm90a(name):
    _nvcc()
    from tiled.ir.program import as_program
    from tiled.ir.verifier import verify_program as verify

    case = CASES[name]()
    verify(as_program(case.kernel))  # the ops set on the traced IR are the verifier's too
    for arch in ("sm_80", "sm_90a"):
        art, manifest = compile_case(case.kernel, f"cuda:{arch}", case.options)
        assert art.data[:4] == b"\x7fELF" and manifest.arch == arch


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["build", "run"])
    p.add_argument("--out", default=str(ROOT / ".gpu" / "tileops"))
    p.add_argument("--bundle", default=str(ROOT / ".gpu" / "tileops"))
    p.add_argument("--only", nargs="*", help="run these kernels only")
    a = p.parse_args()
    if a.mode == "build":
        build(Path(a.out))
    else:
        sys.exit(run(Path(a.bundle), a.only))
