"""Gather nests as cp.async producers of a T.Pipelined loop (targets/cuda/gather.py): which
nests qualify, and what the CUDA source does with them. (Their numerics on the H200:
benchmarks/gpu/conv.py's smoke and rows.)"""

import re

import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_cuda_tileops import kernel_body, source
from tiled.compiler.targets.cuda.lower import CudaLowering
from tiled.ir.program import as_program
from tiled.ops import conv


def _gather_kernel(offset=0, cond_on_col=False, extra_write=False):
    """Rows of X picked by an index tensor into a shared tile, fed to a gemm."""
    M, N, K, BM, BN, BK = 256, 128, 256, 64, 64, 32

    @tiled.kernel
    def gathered(X: T.Tensor((M, K), "float16"), Idx: T.Tensor((M,), "int32"),
                 W: T.Tensor((N, K), "float16"), Y: T.Tensor((M, N), "float16")):
        with T.Kernel(N // BN, M // BM, threads=128) as (bx, by):
            xs = T.alloc_shared((BM, BK), "float16")
            ws = T.alloc_shared((BN, BK), "float16")
            acc = T.alloc_fragment((BM, BN), "float32")
            T.clear(acc)
            for k in T.Pipelined(K // BK, num_stages=3):
                T.copy(W[bx * BN:bx * BN + BN, k * BK:k * BK + BK], ws)
                for i, c in T.Parallel(BM, BK):
                    row = Idx[by * BM + i]
                    ok = row >= 0
                    if cond_on_col:
                        ok = ok & (c < BK - 1)
                    xs[i, c] = T.if_then_else(ok, X[row, k * BK + offset + c], 0)
                if extra_write:
                    xs[0, 0] = 0
                T.gemm(xs, ws, acc, transpose_B=True)
            T.copy(acc, Y[by * BM:by * BM + BM, bx * BN:bx * BN + BN])

    return gathered


def _gathers(kernel):
    low = CudaLowering(as_program(kernel), "sm_80")
    low.plan()
    return low.gathers


def test_an_index_gather_becomes_cp_async_vectors():
    (g,) = _gathers(_gather_kernel()).values()
    assert (g.rows, g.cols, g.vec) == (64, 32, 8) and len(g.conds) >= 1
    body = kernel_body(source(_gather_kernel())[0])
    x_copies = [ln for ln in body.splitlines() if "cp_async<16>" in ln and "X_ptr" in ln]
    # 64 x 32 halves = 256 vectors over 128 threads: 2 each, for each of the 2 stages
    # issued before the loop and in it.
    assert len(x_copies) == 6
    assert not re.search(r"= X_ptr\[", body)  # no synchronous element load of X is left


def test_the_vector_follows_the_alignment_the_offsets_prove():
    (g,) = _gathers(_gather_kernel(offset=4)).values()
    assert g.vec == 4  # 8-byte vectors: 16 would straddle


@pytest.mark.parametrize("kw", [{"offset": 1},  # not even 4-byte vectors are aligned
                                {"cond_on_col": True},  # the test differs along a vector
                                {"extra_write": True}])  # another statement writes the tile
def test_other_gathers_stay_element_loops(kw):
    k = _gather_kernel(**kw)
    assert _gathers(k) == {}
    body = kernel_body(source(k)[0])
    assert not [ln for ln in body.splitlines() if "cp_async" in ln and "X_ptr" in ln]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_conv2d_im2col_tiles_are_async(arch):
    """tiled.ops.conv2d's im2col tile (whole channel steps) is a producer on both paths."""
    k = conv.conv2d_kernel(64, 56, 56, 64, 3, 3, 1, 1, 1, "bfloat16", False, BM=128, BN=64,
                           BC=64, threads=128)
    body = kernel_body(source(k, arch)[0])
    assert [ln for ln in body.splitlines() if "cp_async<16>" in ln and "X_ptr[" in ln]
    assert not re.search(r"= X_ptr\[", body)
    # Channels that do not fill the last step keep the per-element test (and loads).
    ragged = conv.conv2d_kernel(48, 14, 14, 64, 3, 3, 1, 1, 1, "bfloat16", False, BM=64,
                                BN=64, BC=32, threads=128)
    assert _gathers(ragged) == {}

