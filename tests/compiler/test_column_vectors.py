"""Vectors over an accumulator's columns (targets/cuda/layouts.py: WgmmaCols, MmaCols): a
fragment read as v[j] in a loop over (i, j) over a wgmma or mma.sync accumulator (a bias, a
per-channel scale, FlashAttention-decoding's key mask) holds in each thread the columns the
thread holds in the accumulator, instead of the whole vector in every thread indexed by
thread (local memory). Checked: each columns layout names the columns its accumulator puts in
each thread, slot for slot; inference gives it; no local memory on sm_90a (wgmma, with and
without warp specialization) and sm_80. Numerics on the GPU: the cols_* cases of
test_cuda_tileops_gpu.py."""

import re

import pytest

import tiled
from tests.compiler.test_cuda_tileops_gpu import CASES, ROW, SQUARE, column_vectors
from tests.compiler.test_sm90_path import sass
from tests.conformance.cases import load_all
from tiled.compiler.targets.cuda.layouts import (
    MmaCols,
    MmaLayout,
    WgmmaCols,
    WgmmaLayout,
)
from tiled.compiler.targets.cuda.layouts import infer_layouts as cuda_layouts


def _int(e) -> int:
    return int(getattr(e, "value", e))


@pytest.mark.parametrize("acc", [WgmmaLayout(64, 64, 1), WgmmaLayout(128, 256, 2),
                                 WgmmaLayout(64, 512, 2, 2), WgmmaLayout(128, 64, 4, 2),
                                 MmaLayout(64, 64, 4, 1), MmaLayout(64, 64, 2, 2),
                                 MmaLayout(128, 128, 1, 4)])
def test_columns_layout_holds_the_columns_of_each_threads_slots(acc):
    cols = acc.cols()
    threads = 128 * acc.nwg if isinstance(acc, WgmmaLayout) else 32 * acc.warp_m * acc.warp_n
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
    assert lay["scale"] == lay["bias"] == MmaCols(64, 4, 1)
    lay = _layouts(column_vectors(SQUARE).kernel)
    assert lay["scale"] == lay["bias"] == MmaCols(64, 2, 2)
    lay = _layouts(column_vectors(SQUARE).kernel, wgmma=True)
    assert lay["scale"] == lay["bias"] == WgmmaCols(64, 1)


@pytest.mark.parametrize("name", ["cols_fullrow", "cols_square", "cols_wgmma"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_column_vectors_stay_in_registers(tmp_path, name, arch):
    case = CASES[name]()
    k = tiled.compile(case.kernel, target=f"cuda:{arch}", cache=False, **(case.options or {}))
    text = sass(k.artifact, tmp_path)
    assert not re.search(r"\b(LDL|STL)\b", text), "local memory"
    if arch == "sm_90a" and name == "cols_wgmma":
        assert "HGMMA" in text


def test_a_decoding_key_mask_stays_in_registers(tmp_path):
    """gqa_decode_split's splits read their key mask as keep[j] over the scores' wgmma
    accumulator."""
    case = load_all()["gqa_decode_split"]
    c = tiled.compile(case.factory(**{**case.cpu, **case.gpu}).kernel,
                      target="cuda:sm_90a", cache=False)
    for launch in c.kernels:
        assert not re.search(r"\b(LDL|STL)\b", sass(launch.artifact, tmp_path))
