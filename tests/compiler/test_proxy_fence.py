"""The threads' shared writes a wgmma reads are fenced for the async proxy (fence.proxy.async,
FENCE.VIEW.ASYNC.S in the SASS) after them and before the wgmma, also where the barrier
tracker already placed a barrier between them for another shared read (a barrier orders the
writes for the threads only), and at the end of an iteration whose writes the next
iteration's wgmma reads."""

import re
import shutil

import pytest

import tiled
import tiled.lang as T

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _kernel(write_late: bool):
    """C = A' B^T over a TMA-fed T.Pipelined loop, A' = A's tile reversed along K by the
    threads into a second shared tile; between that write and the gemm a T.Parallel nest
    reads B's tile (a shared read: the tracker's barrier). `write_late`: A' is written after
    the gemm instead (from the next step's A on: the gemm of step k + 1 reads it)."""
    M, N, K = 128, 256, 512

    @tiled.kernel
    def reversed_k(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"),
                   C: T.Tensor((M, N), "float32"), D: T.Tensor((M, N), "float32")):
        with T.Kernel(N // 128, M // 64, threads=128) as (bx, by):
            a = T.alloc_shared((64, 64), "float16")
            a2 = T.alloc_shared((64, 64), "float16")
            b = T.alloc_shared((128, 64), "float16")
            acc = T.alloc_fragment((64, 128), "float32")
            first = T.alloc_fragment((64, 128), "float32")
            T.clear(acc)
            T.clear(first)
            if write_late:
                T.clear(a2)
            for k in T.Pipelined(K // 64, num_stages=3):
                T.copy(A[by * 64, k * 64], a)
                T.copy(B[bx * 128, k * 64], b)
                if not write_late:
                    for i, j in T.Parallel(64, 64):
                        a2[i, j] = a[i, 63 - j]
                for i, j in T.Parallel(64, 128):
                    first[i, j] += T.cast(b[j, 0], "float32")
                T.gemm(a2, b, acc, transpose_B=True)
                if write_late:
                    for i, j in T.Parallel(64, 64):
                        a2[i, j] = a[i, 63 - j]
            T.copy(acc, C[by * 64, bx * 128])
            T.copy(first, D[by * 64, bx * 128])

    return reversed_k


@pytest.mark.parametrize("write_late", [False, True])
def test_shared_writes_are_fenced_before_the_wgmma_that_reads_them(tmp_path, write_late):
    from tests.compiler.test_sm90_path import sass

    text = sass(tiled.compile(_kernel(write_late), target="cuda:sm_90a", cache=False).artifact,
                tmp_path)
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
    assert any(o.startswith("HGMMA") for o in ops) and any(o.startswith("UTMALDG") for o in ops)
    stores = [i for i, o in enumerate(ops) if o.startswith("STS")]
    mmas = [i for i, o in enumerate(ops) if o.startswith("HGMMA")]
    fences = [i for i, o in enumerate(ops) if o.startswith("FENCE.VIEW.ASYNC.S")]
    if write_late:  # the loop's stores come after its wgmmas: fenced before the loop's end
        last_store = max(s for s in stores if s > mmas[0])
        assert any(f > last_store for f in fences)
    else:  # a fence between the last store before the first wgmma and that wgmma
        last_store = max(s for s in stores if s < mmas[0])
        assert any(last_store < f < mmas[0] for f in fences)
