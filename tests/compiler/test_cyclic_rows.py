"""Row vectors of cyclic tiles (passes/layout_kinds.py, CyclicRows): a [M, N] fragment dealt in runs
whose rows each take a group of at most 32 lanes gives its row reductions and the row vectors
read over it a rows layout (each group's lanes hold their rows, a reduction is a per-thread
combine and xor shuffles) instead of a copy of every row in every thread, indexed by thread
(local memory). Checked: which layouts inference gives (CUDA, ROCm; Metal keeps replicated
row vectors), numerics under the ROCm and Metal emulations (partial last rounds, a row
vector written out by one lane per group), no local memory on sm_90a, and the fallback where
a nest over such rows would also index a replicated fragment."""

import re

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler import compile_program
from tiled.compiler.passes.layout_kinds import CyclicRows, ReplicatedLayout
from tiled.compiler.targets.cuda.layouts import infer_layouts as cuda_layouts


def row_softmax(M, N, rows, threads=128):
    """Y = softmax(X) by rows in blocks of `rows`, each row's max written to Mx."""
    @tiled.kernel
    def softmax(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32"),
                Mx: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bx:
            x = T.alloc_fragment((rows, N), "float32")
            m = T.alloc_fragment((rows,), "float32")
            s = T.alloc_fragment((rows,), "float32")
            T.copy(X[bx * rows, 0], x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(rows, N):
                x[i, j] = T.exp(x[i, j] - m[i])
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(rows, N):
                x[i, j] = x[i, j] / s[i]
            T.copy(x, Y[bx * rows, 0])
            for i in T.Parallel(rows):
                Mx[bx * rows + i] = m[i]
    return softmax


def _layouts(kernel):
    p = kernel.ir.proto
    lay = cuda_layouts(p)
    return {b.name: lay.get(b.id) for b in p.buffers}


def test_short_rows_take_cyclic_rows_and_long_rows_stay_replicated():
    short = _layouts(row_softmax(64, 64, 16))  # 64 floats a row: 16 lanes of 4
    assert short["m"] == short["s"] == CyclicRows(16, 128, 16)
    long = _layouts(row_softmax(8, 4096, 2))  # a row spans 1024 lanes: replicated
    assert isinstance(long["m"], ReplicatedLayout)


@pytest.mark.parametrize("target", ["rocm:gfx942", "metal"])
@pytest.mark.parametrize(("M", "N", "rows"), [(64, 64, 16), (50, 32, 20), (24, 128, 12)])
def test_row_softmax_matches_numpy_under_emulation(target, M, N, rows):
    k = compile_program(row_softmax(M, N, rows), target)
    x = np.random.default_rng(M + N).standard_normal((M, N)).astype(np.float32) * 3
    y, mx = np.zeros_like(x), np.zeros(M, np.float32)
    k.emulate(x, y, mx)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mx, x.max(1))


def test_row_reductions_shuffle_without_local_memory_on_sm90a(tmp_path):
    k = tiled.compile(row_softmax(64, 64, 16), target="cuda:sm_90a", cache=False)
    text = sass(k.artifact, tmp_path)
    assert "SHFL.BFLY" in text
    assert not re.search(r"\b(LDL|STL)\b", text)


def test_rows_beside_a_replicated_vector_fall_back_to_replicated():
    """A nest over the rows that also indexes a replicated vector by its variables (here w,
    written element by element outside any nest) would index w by thread: inference keeps
    the replicated row vectors it gave before cyclic rows existed."""
    @tiled.kernel
    def scaled(X: T.Tensor((64, 64), "float32"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128):
            x = T.alloc_fragment((64, 64), "float32")
            s = T.alloc_fragment((64,), "float32")
            w = T.alloc_fragment((64,), "float32")
            T.copy(X[0, 0], x)
            T.reduce_sum(x, s, dim=1)
            for i in T.serial(64):
                w[i] = i * 1.0
            for i in T.Parallel(64):
                Y[i] = s[i] * w[i]
    lay = _layouts(scaled)
    assert isinstance(lay["s"], ReplicatedLayout) and isinstance(lay["w"], ReplicatedLayout)
