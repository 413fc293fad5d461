"""Synchronous T.copy between shared and global memory by whole 16 / 8 / 4-byte vectors
(targets/cuda/copy.copy_by_vectors): an epilogue staged through shared memory stores
16 bytes a thread where it stored one element. The ROCm and Metal lowerings share the walk,
so their CPU emulation checks the values, ragged tiles included."""

import re

import ml_dtypes
import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler import compile_program
from tiled.compiler.targets.cuda.copy import sync_vector
from tiled.compiler.targets.cuda.lower import CudaLowering
from tiled.ir.program import as_program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _staged(N: int, dtype: str, BM: int = 32, BN: int = 64, threads: int = 64):
    """Y = 2 X through two shared tiles: global -> shared, shared -> shared, a nest, shared
    -> global; M symbolic, tiles ragged in both dims."""
    M = T.dyn("M")

    @tiled.kernel
    def staged_copy(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=threads) as (bx, by):
            a = T.alloc_shared((BM, BN), dtype)
            b = T.alloc_shared((BM, BN), dtype)
            T.copy(X[by * BM, bx * BN], a)
            T.copy(a, b)
            for i, j in T.Parallel(BM, BN):
                b[i, j] = b[i, j] * 2
            T.copy(b, Y[by * BM, bx * BN])

    return staged_copy


def _copies(kernel) -> list[int]:
    low = CudaLowering(as_program(kernel), "sm_80")
    low.plan()
    return [sync_vector(low, st.copy) for st in low.statements()
            if st.WhichOneof("kind") == "copy"]


@pytest.mark.parametrize("N,dtype,vec", [(72, "bfloat16", 8), (100, "bfloat16", 4),
                                         (98, "float16", 2), (97, "bfloat16", 1),
                                         (72, "float32", 4), (70, "float32", 2)])
def test_a_copy_takes_the_widest_vector_both_sides_keep_aligned(N, dtype, vec):
    # X -> a (cp.async where it can; counted here all the same), a -> b, b -> Y
    assert _copies(_staged(N, dtype))[1:] == [min(8, 16 // np.dtype(NP[dtype]).itemsize), vec]


@pytest.mark.parametrize("target", ["rocm:gfx942", "metal:apple8"])
@pytest.mark.parametrize("N,dtype", [(72, "bfloat16"), (100, "float16"), (97, "bfloat16"),
                                     (72, "float32")])
def test_staged_copies_by_vectors_compute_on_emulation(target, N, dtype):
    k = compile_program(_staged(N, dtype), target)
    rng = np.random.default_rng(N)
    x = rng.standard_normal((45, N)).astype(NP[dtype])  # 45 rows: the last tile ragged
    y = np.full_like(x, 3)
    k.emulate(x, y)
    np.testing.assert_array_equal(y.astype(np.float32), 2 * x.astype(np.float32))


def test_the_staged_epilogue_stores_16_bytes_a_thread_on_sm90a(tmp_path):
    c = tiled.compile(_staged(4096, "bfloat16", BM=64, BN=128, threads=128),
                      target="cuda:sm_90a", cache=False)
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    assert "STG.E.128" in text and "LDS.128" in text
    assert not re.search(r"\bSTG\.E\.U16\b", text)
