"""Tiles stacked on the vectors of their columns (passes/layout_kinds.py, StackedLayout): a
[splits, rows] fragment that is reduced over dim 0 into a vector, copied row by row to or
from vectors, or read as X[k, i] in a 1-D nest over such vectors (a flash-decoding combine's
log-sum-exps) takes the vectors' layout for each of its rows, so the reduction is a
per-thread combine and X[k, i] a register of the same thread, instead of a copy of the whole
tile in every thread (local memory on CUDA). Checked: the layouts inference gives (CUDA,
ROCm; over a rows layout and over a cyclic vector), numerics under the ROCm and Metal
emulations (a dynamic k, ragged row blocks, a row written from a vector, a reduction that
keeps the destination's values), and no local memory on sm_90a."""

import re

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler import compile_program
from tiled.compiler.passes.layout_kinds import CyclicLayout, CyclicRows, StackedLayout
from tiled.compiler.targets.cuda.layouts import infer_layouts as cuda_layouts
from tiled.compiler.targets.rocm.layouts import infer_layouts as rocm_layouts


def combine(S, M, D, rows, threads=128, weights=True):
    """Flash-decoding's combine over S splits for rows blocks of `rows`: Lse[m] = log sum_k
    exp L[k, m]; with `weights`, Out[m, :] = sum_k exp(L[k, m] - Lse[m]) P[k, m, :]. Also
    Twice[m] = 1 + sum_k 2 L[k, m], through a tile whose rows are written from a vector."""
    @tiled.kernel
    def combine_splits(L: T.Tensor((S, M), "float32"), P: T.Tensor((S, M, D), "float32"),
                       Out: T.Tensor((M, D), "float32"), Lse: T.Tensor((M,), "float32"),
                       Twice: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bx:
            lse_all = T.alloc_fragment((S, rows), "float32")
            twice = T.alloc_fragment((S, rows), "float32")
            lse_k = T.alloc_fragment((rows,), "float32")
            lse_max = T.alloc_fragment((rows,), "float32")
            total = T.alloc_fragment((rows,), "float32")
            tw = T.alloc_fragment((rows,), "float32")
            T.copy(L[0, bx * rows], lse_all)
            T.reduce_max(lse_all, lse_max, dim=0)
            T.clear(total)
            for k in T.serial(S):
                T.copy(lse_all[k, :], lse_k)
                for i in T.Parallel(rows):
                    total[i] += T.exp(lse_k[i] - lse_max[i])
                for i in T.Parallel(rows):
                    lse_k[i] = lse_k[i] * 2.0
                T.copy(lse_k, twice[k, :])
            for i in T.Parallel(rows):
                total[i] = T.log(total[i]) + lse_max[i]
                tw[i] = 1.0
            T.reduce_sum(twice, tw, dim=0, clear=False)
            T.copy(total, Lse[bx * rows])
            T.copy(tw, Twice[bx * rows])
            if weights:
                w = T.alloc_fragment((rows,), "float32")
                out = T.alloc_fragment((rows, D), "float32")
                T.clear(out)
                for k in T.Pipelined(S, num_stages=1):
                    for i in T.Parallel(rows):
                        w[i] = T.exp(lse_all[k, i] - total[i])
                    for i, j in T.Parallel(rows, D):
                        out[i, j] += P[k, bx * rows + i, j] * w[i]
                T.copy(out, Out[bx * rows, 0])
    return combine_splits


def _layouts(kernel, infer=cuda_layouts):
    p = kernel.ir.proto
    lay = infer(p)
    return {b.name: lay.get(b.id) for b in p.buffers}


@pytest.mark.parametrize("infer", [cuda_layouts, lambda p: rocm_layouts(p, "gfx942")])
def test_log_sum_exps_stack_on_the_rows_their_readers_hold(infer):
    lay = _layouts(combine(4, 64, 64, 32), infer)
    rows = CyclicRows(32, 128, 16)  # out [32, 64] float32 in runs of 4: 16 lanes a row
    assert lay["w"] == lay["total"] == lay["lse_max"] == lay["lse_k"] == lay["tw"] == rows
    assert lay["lse_all"] == lay["twice"] == StackedLayout(rows, 4)


def test_without_a_tile_to_follow_the_vectors_are_cyclic():
    lay = _layouts(combine(8, 256, 1, 128, weights=False))
    assert lay["lse_max"] == CyclicLayout((128,), 128, 1)
    assert lay["lse_all"] == StackedLayout(CyclicLayout((128,), 128, 1), 8)


@pytest.mark.parametrize("target", ["rocm:gfx942", "metal"])
@pytest.mark.parametrize(("S", "M", "D", "rows", "weights"), [
    (4, 64, 64, 32, True), (3, 50, 32, 16, True), (8, 200, 1, 128, False),
    (5, 24, 16, 24, True)])
def test_combine_matches_numpy_under_emulation(target, S, M, D, rows, weights):
    k = compile_program(combine(S, M, D, rows, weights=weights), target)
    rng = np.random.default_rng(S * M + D)
    L = (rng.standard_normal((S, M)) * 3).astype(np.float32)
    P = rng.standard_normal((S, M, D)).astype(np.float32)
    out, lse, twice = np.zeros((M, D), np.float32), np.zeros(M, np.float32), \
        np.zeros(M, np.float32)
    k.emulate(L, P, out, lse, twice)
    ref = np.log(np.exp(L.astype(np.float64)).sum(0))
    np.testing.assert_allclose(lse, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(twice, 1 + 2 * L.astype(np.float64).sum(0), rtol=1e-5,
                               atol=1e-5)
    if weights:
        w = np.exp(L - ref)
        np.testing.assert_allclose(out, np.einsum("km,kmd->md", w, P), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("S", "M", "D", "rows", "weights"), [
    (4, 256, 64, 64, True), (8, 1024, 1, 128, False)])
def test_stacked_tiles_stay_in_registers_on_sm90a(tmp_path, S, M, D, rows, weights):
    """The splits' dim reduced in each thread, X[k, i] under a dynamic k chosen among
    registers: no local memory, no shuffles, no shared memory for the reductions."""
    k = tiled.compile(combine(S, M, D, rows, weights=weights), target="cuda:sm_90a",
                      cache=False)
    text = sass(k.artifact, tmp_path)
    assert not re.search(r"\b(LDL|STL)\b", text), "local memory"
    assert not re.search(r"\b(SHFL|STS|LDS)\b", text)
