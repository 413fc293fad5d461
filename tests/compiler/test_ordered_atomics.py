"""T.atomic_add with memory_order and return_prev: the "last block adds up" pattern (each
block stores its partial, bumps a counter acq_rel, and the block that sees the others'
arrivals sums every partial), on cpu (blocks on a thread pool), under the rocm emulation, in
the CUDA source each target generates, and refused on metal."""

import re
import shutil

import numpy as np
import pytest

import tiled.lang as T
from tiled.compiler import compile_program
from tiled.errors import CompileError

BLOCKS, N = 16, 256


@T.prim_func
def last_block_sums(X: T.Tensor((BLOCKS, N), "float32"), P: T.Tensor((BLOCKS, N), "float32"),
                    Y: T.Tensor((N,), "float32"), C: T.Tensor((1,), "int32")):
    with T.Kernel(BLOCKS, threads=128) as bx:
        for i in T.Parallel(N):
            P[bx, i] = X[bx, i] * 2.0
        done = T.atomic_add(C[0], 1, memory_order="acq_rel", return_prev=True)
        if done == BLOCKS - 1:
            for i in T.Parallel(N):
                total = P[0, i]
                for b in range(1, BLOCKS):
                    total = total + P[b, i]
                Y[i] = total
            C[0] = 0


def _check(run):
    x = np.random.default_rng(0).standard_normal((BLOCKS, N)).astype(np.float32)
    want = np.zeros(N, np.float32)
    for b in range(BLOCKS):  # the kernel's order of additions
        want = want + 2 * x[b]
    c = np.zeros(1, np.int32)
    for _ in range(4):  # the last block leaves the counter zero for the next launch
        p, y = np.zeros((BLOCKS, N), np.float32), np.full(N, np.nan, np.float32)
        run(x, p, y, c)
        np.testing.assert_array_equal(y, want)
        assert c[0] == 0


def test_cpu_blocks_on_threads_sum_once():
    _check(compile_program(last_block_sums, "cpu"))


def test_rocm_emulation():
    k = compile_program(last_block_sums, "rocm:gfx942")
    _check(k.emulate)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cuda_source_fences_one_thread_and_broadcasts(arch):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    src = compile_program(last_block_sums, f"cuda:{arch}").source
    body = src[src.index('extern "C" __global__'):]
    # every thread's stores, a barrier, then thread 0: fence, the update, fence; a barrier,
    # and every thread reads the previous value from the shared slot
    assert re.search(r"__syncthreads\(\);\s*if \(\(\(int\)threadIdx\.x\) == 0\) \{\s*"
                     r"tiled::fence_acq_rel\(\);\s*\(\(int\*\)_ptr\)\[0\] = atomicAdd\(.*\);\s*"
                     r"tiled::fence_acq_rel\(\);\s*\}\s*__syncthreads\(\);\s*"
                     r"done_ptr\[0\] = \(\(int\*\)_ptr\)\[0\];", body), body


def test_metal_refuses_ordered_atomics_where_they_are():
    with pytest.raises(CompileError, match=r"test_ordered_atomics\.py:\d+: atomic add with "
                                           "memory_order or return_prev is not supported"):
        compile_program(last_block_sums, "metal")
