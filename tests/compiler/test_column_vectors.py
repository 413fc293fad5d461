"""Vectors over an accumulator's columns (targets/cuda/layouts.py: AccumulatorCols): a
fragment read as v[j] in a loop over (i, j) over a wgmma or mma.sync accumulator (a bias, a
per-channel scale, FlashAttention-decoding's key mask) holds in each thread the columns the
thread holds in the accumulator, instead of the whole vector in every thread indexed by
thread (local memory); so does a vector read over a cyclic tile whose rows span whole rounds
(a weight row over a norm's rows: the row's cyclic layout). Checked: each columns layout
names the columns its tile puts in each thread, slot for slot; inference gives it; no local
memory on sm_90a (wgmma, with and without warp specialization) and sm_80; numerics under the
ROCm and Metal emulations for cyclic tiles, and under ROCm's for its MFMA accumulator's columns
(the same lowering). CUDA's on the GPU: the cols_* cases of test_cuda_tileops_gpu.py."""

import re

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_cuda_tileops_gpu import CASES, COL, ROW, SQUARE, column_vectors
from tests.compiler.test_sm90_path import sass
from tests.conformance.cases import load_all
from tiled.compiler import compile_program
from tiled.compiler.passes.layout_kinds import CyclicLayout, ReplicatedLayout
from tiled.compiler.targets.cuda.layouts import AccumulatorCols, MmaLayout, WgmmaLayout
from tiled.compiler.targets.cuda.layouts import infer_layouts as cuda_layouts
from tiled.compiler.targets.rocm.layouts import MfmaLayout


def _int(e) -> int:
    return int(getattr(e, "value", e))


@pytest.mark.parametrize("acc", [WgmmaLayout(64, 64, 1), WgmmaLayout(128, 256, 2),
                                 WgmmaLayout(64, 512, 2, 2), WgmmaLayout(128, 64, 4, 2),
                                 MmaLayout(64, 64, 4, 1), MmaLayout(64, 64, 2, 2),
                                 MmaLayout(128, 128, 1, 4), MfmaLayout(64, 64, 2, 2),
                                 MfmaLayout(64, 128, 1, 4)])
def test_columns_layout_holds_the_columns_of_each_threads_slots(acc):
    cols = acc.cols()
    threads = 128 * acc.nwg if isinstance(acc, WgmmaLayout) else \
        (64 if isinstance(acc, MfmaLayout) else 32) * acc.warp_m * acc.warp_n
    holders = {}
    for tx in range(threads):
        held = {_int(cols.coords(tx, s)[0][0]) for s in range(cols.local_size)}
        assert len(held) == cols.local_size  # distinct columns, one slot each
        for idx in range(acc.local_size):
            col = _int(acc.coords(tx, idx)[0][1])
            slot = _int(acc.col_slot(idx))
            assert _int(cols.coords(tx, slot)[0][0]) == col
        for c in held:
            holders.setdefault(c, []).append(tx)
    assert sorted(holders) == list(range(acc.N))
    # exactly one holder of each column writes it out
    for c, txs in holders.items():
        assert sum(bool(_int(cols.leader(tx))) for tx in txs) == 1, c


def _layouts(kernel, wgmma=False):
    p = kernel.ir.proto
    ids = {b.name: b.id for b in p.buffers}
    lay = cuda_layouts(p, {ids["C_l"]: WgmmaLayout(64, 64, 1)} if wgmma else None)
    return {b.name: lay.get(b.id) for b in p.buffers}


def test_inference_gives_the_vectors_the_accumulators_columns():
    lay = _layouts(column_vectors(ROW).kernel)
    assert lay["scale"] == lay["bias"] == AccumulatorCols(64, 1, 32)
    lay = _layouts(column_vectors(SQUARE).kernel)
    assert lay["scale"] == lay["bias"] == AccumulatorCols(64, 2, 32)
    lay = _layouts(column_vectors(SQUARE).kernel, wgmma=True)
    assert lay["scale"] == lay["bias"] == AccumulatorCols(64, 1, 128)


@pytest.mark.parametrize("name", ["cols_fullrow", "cols_square", "cols_wgmma"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_column_vectors_stay_in_registers(tmp_path, name, arch):
    case = CASES[name]()
    k = tiled.compile(case.kernel, target=f"cuda:{arch}", cache=False, **(case.options or {}))
    text = sass(k.artifact, tmp_path)
    assert not re.search(r"\b(LDL|STL)\b", text), "local memory"
    if arch == "sm_90a" and name == "cols_wgmma":
        assert "HGMMA" in text


@pytest.mark.parametrize("policy", [ROW, COL])
def test_column_vectors_over_mfma_match_numpy_under_emulation(policy):
    """The same lowering (frag_slot's column reads, the copy in, one writer per column) over
    ROCm's MFMA accumulator, run by its emulation."""
    case = column_vectors(policy)
    k = compile_program(case.kernel, "rocm:gfx942")
    args = case.inputs(np.random.default_rng(1))
    k.emulate(*args)
    for idx, want in case.reference(args).items():
        np.testing.assert_allclose(args[idx], want, rtol=2e-3, atol=2e-3)


def test_a_decoding_key_mask_stays_in_registers(tmp_path):
    """gqa_decode_split's splits read their key mask as keep[j] over the scores' wgmma
    accumulator."""
    case = load_all()["gqa_decode_split"]
    c = tiled.compile(case.factory(**{**case.cpu, **case.gpu}).kernel,
                      target="cuda:sm_90a", cache=False)
    for launch in c.kernels:
        assert not re.search(r"\b(LDL|STL)\b", sass(launch.artifact, tmp_path))


def weighted_rows(M, N, rows, threads=128):
    """Y = X * w + 1 by rows in blocks of `rows`, the weight row copied whole into a fragment
    and read as w[j] over the block's tile; W2 = 3 w from a nest of the weight's own."""
    @tiled.kernel
    def weighted(X: T.Tensor((M, N), "float32"), W: T.Tensor((N,), "float32"),
                 Y: T.Tensor((M, N), "float32"), W2: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bx:
            x = T.alloc_fragment((rows, N), "float32")
            w = T.alloc_fragment((N,), "float32")
            T.copy(W[0], w)
            T.copy(X[bx * rows, 0], x)
            for i, j in T.Parallel(rows, N):
                x[i, j] = x[i, j] * w[j] + 1.0
            T.copy(x, Y[bx * rows, 0])
            for j in T.Parallel(N):
                W2[j] = w[j] * 3.0
    return weighted


@pytest.mark.parametrize("lay", [CyclicLayout((2, 1024), 128, 4), CyclicLayout((1, 4096), 128, 8),
                                 CyclicLayout((3, 256), 64, 2)])
def test_cyclic_tiles_of_whole_rounds_have_columns(lay):
    cols = lay.cols()
    for tx in range(lay.threads):
        for idx in range(lay.local_size):
            col = _int(lay.coords(tx, idx)[0][1])
            assert _int(cols.coords(tx, _int(lay.col_slot(idx)))[0][0]) == col
    assert CyclicLayout((4, 96), 128, 1).cols() is None  # rows shorter than a round


def test_a_weight_row_takes_the_tiles_columns():
    lay = _layouts(weighted_rows(8, 1024, 2))
    assert lay["w"] == CyclicLayout((1024,), 128, 4)
    assert isinstance(_layouts(weighted_rows(8, 96, 2))["w"], ReplicatedLayout)


@pytest.mark.parametrize("target", ["rocm:gfx942", "metal"])
@pytest.mark.parametrize(("M", "N", "rows"), [(8, 1024, 2), (5, 512, 2), (6, 96, 3)])
def test_weighted_rows_match_numpy_under_emulation(target, M, N, rows):
    k = compile_program(weighted_rows(M, N, rows), target)
    rng = np.random.default_rng(M + N)
    x, w = rng.standard_normal((M, N)).astype(np.float32), \
        rng.standard_normal(N).astype(np.float32)
    y, w2 = np.zeros_like(x), np.zeros_like(w)
    k.emulate(x, w, y, w2)
    np.testing.assert_allclose(y, x * w + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w2, 3 * w, rtol=1e-6)


def test_a_weight_row_stays_in_registers_on_sm90a(tmp_path):
    k = tiled.compile(weighted_rows(64, 4096, 1), target="cuda:sm_90a", cache=False)
    assert not re.search(r"\b(LDL|STL)\b", sass(k.artifact, tmp_path)), "local memory"
