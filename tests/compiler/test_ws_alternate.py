"""Two consumer warpgroups taking a one-warpgroup program's blocks in turn on sm_90a (the
compile option `alternate`, ws_plan.alternate_choice, ws_loop.py): which kernels take it,
and what their code does (source and SASS; no GPU needed). Its numerics and speed on a GPU:
benchmarks/gpu/probes/alternate_probe.py."""

import re
import sys
from pathlib import Path

import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gemm

SM90 = "cuda:sm_90a"


def _seed(**kw):
    """The seed's GEMM at its own config: 128 x 128 x 32 tiles (two per 32 KiB ring stage,
    four stages: the ring takes the SM), one consumer warpgroup."""
    args = {"M": T.dyn("M"), "N": 4096, "K": 4096, "block_M": 128, "block_N": 128,
            "block_K": 32, "num_stages": 3, "dtype": "bfloat16", "threads": 128, **kw}
    return gemm.matmul(**args)


def test_the_seed_gemm_takes_turns_by_default(tmp_path):
    c = tiled.compile(_seed(), target=SM90, cache=False)
    assert c.manifest.block[0] == 2 * 128 + 32  # two consumer warpgroups and the producer warp
    src = c.source
    # each warpgroup runs every other block of the walk (the walk from tx >> 7), on barriers
    # of its own
    assert "turn_wait_group()" in src and "turn_pass_group()" in src
    assert "group_sync<128>()" in src and "consumer_sync<" not in src
    assert "* 2) + (((int)threadIdx.x) >> 7)" in src
    # the producer is the thread after both warpgroups
    assert "((int)threadIdx.x) == 256" in src
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    for instr in ("HGMMA.64x128x16", "UTMALDG", "SYNCS", "BAR.SYNC", "BAR.ARV"):
        assert instr in text, instr
    assert not re.search(r"\b(LDL|STL)\b", text)  # 128 accumulators a thread, in registers


def test_turns_are_an_option():
    off = tiled.compile(_seed(), target=SM90, cache=False, alternate=1)
    assert off.manifest.block[0] == 128 + 32
    assert "turn_wait_group" not in off.source and "consumer_sync<128>" in off.source
    on = tiled.compile(_seed(), target=SM90, cache=False, alternate=2)
    assert on.manifest.block[0] == 2 * 128 + 32


def _staged(threads=128, bm=128, bn=128):
    """The seed's GEMM with its epilogue staged through a shared tile."""
    @tiled.kernel
    def staged(A: T.Tensor((4096, 4096), "float16"), B: T.Tensor((4096, 4096), "float16"),
               C: T.Tensor((4096, 4096), "float16")):
        with T.Kernel(4096 // bn, 4096 // bm, threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, 32), "float16")
            B_s = T.alloc_shared((32, bn), "float16")
            C_s = T.alloc_shared((bm, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for k in T.Pipelined(128, num_stages=3):
                T.copy(A[by * bm, k * 32], A_s)
                T.copy(B[k * 32, bx * bn], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C_s)
            T.copy(C_s, C[by * bm, bx * bn])

    return staged


def _causal(persistent: int):
    """A loop whose trip count grows with the block's row (a causal GEMM's)."""
    @tiled.kernel
    def tri(A: T.Tensor((4096, 4096), "float16"), B: T.Tensor((4096, 4096), "float16"),
            C: T.Tensor((4096, 4096), "float16")):
        with T.Kernel(32, 32, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 32), "float16")
            B_s = T.alloc_shared((32, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined((by + 1) * 4, num_stages=3):
                T.copy(A[by * 128, k * 32], A_s)
                T.copy(B[k * 32, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * 128, bx * 128])

    return tri


def _two_fragments():
    """The seed's loop, its epilogue computed into a second float32 fragment."""
    @tiled.kernel
    def twice(A: T.Tensor((4096, 4096), "bfloat16"), B: T.Tensor((4096, 4096), "bfloat16"),
              C: T.Tensor((4096, 4096), "float32")):
        with T.Kernel(32, 32, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 32), "bfloat16")
            B_s = T.alloc_shared((32, 128), "bfloat16")
            acc = T.alloc_fragment((128, 128), "float32")
            out = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(128, num_stages=3):
                T.copy(A[by * 128, k * 32], A_s)
                T.copy(B[k * 32, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(128, 128):
                out[i, j] = acc[i, j] * acc[i, j]
            T.copy(out, C[by * 128, bx * 128])

    return twice


def _fp8_block_scaled():
    """tiled.ops' block-scaled float8 GEMM at its 64 x 256 tile on one warpgroup."""
    from tiled.ops.fp8 import scaled_gemm_kernel

    return scaled_gemm_kernel(128, 7168, 2048, "bfloat16", True, BM=64, BN=256, threads=128,
                              stages=4)


@pytest.mark.parametrize("name,kernel,options,block", [
    # two consumer warpgroups of one tile already: a producer warpgroup beside them
    ("two warpgroups", _seed(block_N=256, threads=256), {}, 256 + 128),
    # 64 x 128 tiles: the ring fits twice in an SM, whose second block overlaps the first
    ("two blocks per SM", _seed(block_M=64), {}, 128 + 32),
    # a shared tile outside the ring: both warpgroups would write it at once
    ("staged epilogue", _staged(), {}, 128 + 32),
    # a trip count by block: neither warpgroup could skip the other's steps
    ("causal, walked", _causal(2), {"persistent": 2}, 128 + 32),
    ("causal", _causal(0), {}, 128 + 32),
    # blocks not walking the grid
    ("not persistent", _seed(), {"persistent": 1}, 128 + 32),
    # two float32 accumulators, the product rebuilt every step (256 floats a thread): under
    # the launch bounds of 288 threads nvcc kept 168 registers and spilled
    ("rebuilt", _fp8_block_scaled(), {}, 128 + 32),
    # a second 128 x 128 float32 fragment beside the accumulator (256 floats a thread)
    ("two fragments", _two_fragments(), {}, 128 + 32),
])
def test_where_turns_do_not_apply(name, kernel, options, block):
    for alternate in (0, 2):  # not by default, nor when asked for
        c = tiled.compile(kernel, target=SM90, cache=False, alternate=alternate, **options)
        assert c.manifest.block[0] == block, name
        assert "turn_wait_group" not in c.source, name


def test_each_warpgroup_numbers_the_programs_threads_from_zero():
    """An epilogue whose code names the thread (a bias added over the accumulator's rows,
    which the thread's warp places) reads it as tx & 127 in both warpgroups: each runs the
    program as its 128 threads."""
    @tiled.kernel
    def biased(A: T.Tensor((4096, 4096), "bfloat16"), B: T.Tensor((4096, 4096), "bfloat16"),
               rbias: T.Tensor((4096,), "float32"), C: T.Tensor((4096, 4096), "bfloat16")):
        with T.Kernel(32, 32, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 32), "bfloat16")
            B_s = T.alloc_shared((32, 128), "bfloat16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(128, num_stages=3):
                T.copy(A[by * 128, k * 32], A_s)
                T.copy(B[k * 32, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(128, 128):
                acc[i, j] = acc[i, j] + rbias[by * 128 + i]
            T.copy(acc, C[by * 128, bx * 128])

    c = tiled.compile(biased, target=SM90, cache=False)
    assert c.manifest.block[0] == 2 * 128 + 32
    assert "((((int)threadIdx.x) & 127) >> 5) * 16)" in c.source  # the warp's 16 rows
