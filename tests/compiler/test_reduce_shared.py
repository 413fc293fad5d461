"""T.reduce_* of a shared tile on the GPU lowerings (targets/cuda/reduce.py, general path):
the threads read the tile where it lies, so the scratch area holds only the partial results
(a spread fragment still goes out to it first). Numerics under the ROCm and Metal CPU
emulations; the pool's bytes on sm_80."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.compiler import compile_program
from tiled.compiler.targets.cuda.kernel import lower_cuda
from tiled.ir.program import as_program


def reduce_kernel(M, N, dim, scope):
    alloc = T.alloc_shared if scope == "shared" else T.alloc_fragment
    out = M if dim == 1 else N

    @tiled.kernel
    def reduce(X: T.Tensor((M, N), "float32"), Y: T.Tensor((out,), "float32"),
               Z: T.Tensor((out,), "float32")):
        with T.Kernel(1, threads=128):
            a = alloc((M, N), "float32")
            s = T.alloc_fragment((out,), "float32")
            hi = T.alloc_fragment((out,), "float32")
            T.copy(X[0, 0], a)
            T.reduce_sum(a, s, dim=dim)
            T.reduce_max(a, hi, dim=dim)
            T.copy(s, Y[0])
            T.copy(hi, Z[0])
    return reduce


@pytest.mark.parametrize("target", ["rocm:gfx942", "metal"])
@pytest.mark.parametrize("dim", [0, 1])
def test_shared_tile_reductions_match_numpy(target, dim):
    M, N = 24, 40
    k = compile_program(reduce_kernel(M, N, dim, "shared"), target)
    x = np.random.default_rng(dim).standard_normal((M, N)).astype(np.float32)
    out = M if dim == 1 else N
    y, z = np.zeros(out, np.float32), np.zeros(out, np.float32)
    k.emulate(x, y, z)
    np.testing.assert_allclose(y, x.sum(dim), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(z, x.max(dim))


def test_shared_source_takes_scratch_for_the_results_only():
    M, N = 64, 256  # a 64 KiB float32 tile
    _, shared = lower_cuda(as_program(reduce_kernel(M, N, 1, "shared")), "sm_80")
    _, frag = lower_cuda(as_program(reduce_kernel(M, N, 1, "fragment")), "sm_80")
    tile = M * N * 4
    assert shared.pool_bytes < tile + 4096  # the tile and M partials, not the tile again
    assert frag.pool_bytes >= tile  # the fragment's elements go out to the scratch area
