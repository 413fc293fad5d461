"""Programmatic dependent launch (tiled.lang.pdl: T.pdl_sync / T.pdl_trigger): the Tile IR
statement, its checks, what each backend makes of it and the manifest flag that has the CUDA
runtime launch such a kernel programmatically (tests/runtime/test_cuda_pack.py checks that
launch). No GPU needed."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.compiler.targets.cuda.backend import CudaBackend
from tiled.ir.printer import format_program
from tiled.ir.program import as_program
from tiled.ir.walk import waits_on_grid


def _gemm(sync=True, trigger=True, m=256, n=256, k=256):
    """A GEMM that waits for the kernels ahead of it before loading A (the previous kernel's
    output) and lets the next one start once its main loop is done."""
    @tiled.kernel
    def gemm(A: T.Tensor((m, k), "float16"), B: T.Tensor((k, n), "float16"),
             C: T.Tensor((m, n), "float32")):
        with T.Kernel(n // 128, m // 128, threads=256) as (bx, by):
            A_s = T.alloc_shared((128, 64), "float16")
            B_s = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            if sync:
                T.pdl_sync()
            for kk in T.Pipelined(k // 64, num_stages=3):
                T.copy(A[by * 128, kk * 64], A_s)
                T.copy(B[kk * 64, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
            if trigger:
                T.pdl_trigger()
            T.copy(acc, C[by * 128, bx * 128])

    return gemm


def _scale(sync=True):
    @tiled.kernel
    def scale(X: T.Tensor((64, 64), "float32"), Y: T.Tensor((64, 64), "float32")):
        with T.Kernel(64, threads=64) as bx:
            if sync:
                T.pdl_sync()
            for j in T.Parallel(64):
                Y[bx, j] = X[bx, j] * 2.0
            T.pdl_trigger()

    return scale


def test_the_statement_and_its_checks():
    p = as_program(_gemm()).proto
    assert waits_on_grid(p.kernel.body)
    assert not waits_on_grid(as_program(_gemm(sync=False)).proto.kernel.body)  # trigger only
    text = format_program(p)
    assert "pdl_sync()" in text and "pdl_trigger()" in text

    @tiled.kernel
    def per_element(X: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            for j in T.Parallel(64):
                T.pdl_sync()
                X[j] = 1.0

    with pytest.raises(tiled.KernelDefinitionError, match=r"T.pdl_sync / T.pdl_trigger "
                                                           r"inside T.Parallel"):
        as_program(per_element)


def test_cuda_sm90_waits_in_every_thread_that_loads():
    """sm_90a: griddepcontrol through tiled_cuda.h, where the program says; the TMA
    producer, which loads the ring's tiles, waits at its own start too."""
    src, _, low = CudaBackend().generate_source(as_program(_gemm()), "sm_90a")
    assert low.wsloop is not None
    body = src[src.index("__global__"):]
    consumer, producer = body[:body.index("setmaxnreg_dec")], body[body.index("setmaxnreg_dec"):]
    assert consumer.count("tiled::grid_dependency_wait()") == 1
    assert consumer.count("tiled::launch_dependents()") == 1
    assert producer.index("tiled::grid_dependency_wait()") < producer.index("tma_load")
    header = CudaBackend().generate_source(as_program(_gemm()), "sm_80")[0]
    assert "tiled::grid_dependency_wait()" in header  # a no-op there (tiled_cuda.h)


def test_the_manifest_says_pdl_where_griddepcontrol_exists():
    """Compiled for cuda:sm_90a with a T.pdl_sync the manifest carries `pdl` (the runtime's
    cue); sm_80, a trigger alone, and cpu do not."""
    def manifest(kernel, target):
        return tiled.compile(kernel, target, cache=False).manifest

    assert manifest(_scale(), "cuda:sm_90a").pdl
    assert not manifest(_scale(sync=False), "cuda:sm_90a").pdl
    assert not manifest(_scale(), "cuda:sm_80").pdl
    assert not manifest(_scale(), "cpu").pdl


def test_other_backends_run_it_as_nothing():
    x = np.random.rand(64, 64).astype("float32")
    y = np.zeros_like(x)
    tiled.compile(_scale(), "cpu")(x, y)
    np.testing.assert_array_equal(y, 2 * x)
    for target in ("rocm:gfx942", "metal:apple7"):
        src = tiled.compile(_scale(), target, cache=False).source
        assert "griddepcontrol" not in src and "grid_dependency" not in src, target


def test_the_split_k_pair_launches_programmatically():
    """tiled.ops.linear's split-K pieces take PDL (benchmarks/results/splitk_pdl_h200.json):
    the GEMM's trigger after its main loop (by default with splits, never without), the
    sum's wait at its top and the manifest flag that makes the runtime use it, as
    run_split_k asks for it (sum_params)."""
    from tiled.ops import kernels
    from tiled.ops.gemm import linear_kernel
    from tiled.ops.split_k import sum_params

    def gemm(splits=2, **kw):
        k = linear_kernel(64, 256, 256, "bfloat16", "bfloat16", kind="swap", BM=64, BN=64,
                          threads=128, splits=splits, stages=2, **kw)
        return tiled.compile(k, "cuda:sm_90a", cache=False)

    split, whole, plain = gemm(), gemm(splits=1), gemm(trigger=False)
    assert split.source.count("tiled::launch_dependents()") == 1 and not split.manifest.pdl
    assert "launch_dependents" not in whole.source and "launch_dependents" not in plain.source
    params = sum_params(256, 2, "bfloat16")
    assert params["pdl"]
    total = tiled.compile(kernels.splitk_sum(**params), "cuda:sm_90a", cache=False)
    assert total.manifest.pdl and "tiled::grid_dependency_wait()" in total.source
    assert not tiled.compile(kernels.splitk_sum(256, 2, "bfloat16"), "cuda:sm_90a",
                             cache=False).manifest.pdl
