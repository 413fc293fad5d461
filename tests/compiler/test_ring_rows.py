"""A one-row tile in a pipelined loop's copies (a per-K-step row of scales beside the operand
tiles, as a block-scaled GEMM written with its scales M-major would copy them): right on the
cpu target, and on sm_90a a ring copy of its own, a 1 x BM TMA box the producer issues with
the operands' (passes/ws_plan.py's ring copies: a one-row tile takes the dense tiles' path)."""

import re
import shutil

import numpy as np
import pytest

import tiled
import tiled.lang as T

BK = 64


def row_scaled_gemm(M, N, K, BM=128, BN=128, threads=256, stages=4):
    """Y = sum over K steps k of (A_k @ B_k^T) * S[k, m]: each step's product scaled per row
    by its row of S [K / BK, M] before it is added."""
    steps = K // BK
    Md = T.dyn("M")

    @tiled.kernel
    def row_scaled(A: T.Tensor((Md, K), "float16"), B: T.Tensor((N, K), "float16"),
                   S: T.Tensor((steps, Md), "float32"), Y: T.Tensor((Md, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a_s = T.alloc_shared((BM, BK), "float16")
            b_s = T.alloc_shared((BN, BK), "float16")
            s_s = T.alloc_shared((BM,), "float32")
            part = T.alloc_fragment((BM, BN), "float32")
            acc = T.alloc_fragment((BM, BN), "float32")
            sa = T.alloc_fragment((BM,), "float32")
            T.clear(acc)
            for k in T.Pipelined(steps, num_stages=stages):
                T.copy(A[by * BM, k * BK], a_s)
                T.copy(B[bx * BN, k * BK], b_s)
                T.copy(S[k, by * BM], s_s)
                for i in T.Parallel(BM):
                    sa[i] = s_s[i]
                T.gemm(a_s, b_s, part, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] += part[i, j] * sa[i]
            T.copy(acc, Y[by * BM, bx * BN])
    return row_scaled


@pytest.mark.parametrize("M", [24, 37])
def test_a_row_of_scales_per_step_scales_its_product_on_cpu(M):
    """37 rows: a partial last tile, its scale row's tail guarded like the operands'."""
    rng = np.random.default_rng(M)
    N, K = 96, 3 * BK
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    s = (rng.random((K // BK, M)) + 0.5).astype(np.float32)
    y = np.zeros((M, N), np.float32)
    tiled.compile(row_scaled_gemm(M, N, K, BM=16, BN=32, threads=128, stages=2), "cpu")(
        a, b, s, y)
    want = sum((a[:, k * BK:(k + 1) * BK].astype(np.float32)
                @ b[:, k * BK:(k + 1) * BK].astype(np.float32).T) * s[k][:, None]
               for k in range(K // BK))
    np.testing.assert_allclose(y, want, rtol=1e-3, atol=1e-3)


def test_the_scale_row_is_a_tma_box_of_the_producers_ring_on_sm90a(tmp_path):
    """The step's scale row is a third ring copy (a 1 x BM TMA box of S: UTMALDG, no global
    load in the consumers' loop); M a multiple of 4 is a launch precondition (S's row
    stride, 16-byte aligned) with a fallback kernel for other M."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tests.compiler.test_sm90_path import sass
    from tiled.compiler import compile_program

    c = compile_program(row_scaled_gemm(4096, 4096, 2048), target="cuda:sm_90a")
    assert [a.box for a in c.manifest.kernel_args if a.kind == "tensor_map"] == \
        [(64, 128), (64, 128), (128, 1)]
    assert c.manifest.requires == (("floormod", ("mul", 4, "M"), 16),)
    assert c.manifest.fallback is not None
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    assert text.count("UTMALDG") == 3 and "HGMMA.64x128x16.F32" in text
    assert not re.search(r"\b(LDL|STL)\b", text)
