"""FullCol gemms on sm_90a: the warpgroups split the accumulator's columns (WgmmaLayout's
wg_n), so a 64-row tile over two warpgroups takes wgmma (MLA's 64 heads a block with a
512-wide output), where the M split needs 64 rows per warpgroup and fell back to mma.sync."""

import re

import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler.passes.staging import unstaged_operands
from tiled.compiler.targets.cuda.layouts import WgmmaLayout, WgmmaRows

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _int(e) -> int:
    return int(getattr(e, "value", e))


@pytest.mark.parametrize("M,N,nwg,wg_n", [(64, 512, 2, 2), (64, 32, 2, 2), (128, 64, 4, 2),
                                          (128, 256, 2, 1)])
def test_cols_layout_covers_the_tile_once_and_its_rows_agree(M, N, nwg, wg_n):
    lay = WgmmaLayout(M, N, nwg, wg_n)
    rows = lay.rows()
    assert rows == WgmmaRows(M, nwg, wg_n) and rows.split == wg_n
    seen = {}
    for tx in range(128 * nwg):
        row_of_slot = {s: _int(rows.coords(tx, s)[0][0]) for s in range(rows.local_size)}
        for idx in range(lay.local_size):
            (r, c), _ = lay.coords(tx, idx)
            r, c = _int(r), _int(c)
            assert (r, c) not in seen, ((r, c), tx, idx, seen.get((r, c)))
            seen[r, c] = (tx, idx)
            slot = _int(lay.row_slot(idx))
            assert row_of_slot[slot] == r and idx in lay.row_members(slot)
            # the warpgroup column holding the element is the rows layout's part
            assert _int(rows.column(tx)) == c // (N // wg_n)
    assert len(seen) == M * N
    # each row's holders: a quad of lanes in each of its wg_n warpgroups
    holders = {}
    for tx in range(128 * nwg):
        for s in range(rows.local_size):
            holders.setdefault(_int(rows.coords(tx, s)[0][0]), []).append(tx)
    assert sorted(holders) == list(range(M))
    assert {len(v) for v in holders.values()} == {rows.REPLICAS * wg_n}
    leaders = [tx for v in holders.values() for tx in v if bool(_int(rows.leader(tx)))]
    assert len(leaders) == M


def _gemm(BM, BN, threads, policy, tb=True, M=256, N=512, K=256, dtype="bfloat16"):
    @tiled.kernel
    def cols_gemm(A: T.Tensor((M, K), dtype), B: T.Tensor(((N, K) if tb else (K, N)), dtype),
                  C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=threads) as (bx, by):
            a = T.alloc_shared((BM, 64), dtype)
            b = T.alloc_shared(((BN, 64) if tb else (64, BN)), dtype)
            c = T.alloc_fragment((BM, BN), "float32")
            T.clear(c)
            for k in T.Pipelined(T.ceildiv(K, 64), num_stages=2):
                T.copy(A[by * BM, k * 64], a)
                if tb:
                    T.copy(B[bx * BN, k * 64], b)
                else:
                    T.copy(B[k * 64, bx * BN], b)
                T.gemm(a, b, c, transpose_B=tb, policy=policy)
            T.copy(c, C[by * BM, bx * BN])

    return cols_gemm


def _instrs(text: str) -> set[str]:
    return set(re.findall(r"\bHG?MMA\.\w+", text))


@pytest.mark.parametrize("tb", [True, False])
@pytest.mark.parametrize("ws", [True, False])
def test_a_full_col_gemm_of_64_rows_splits_n_over_the_warpgroups(tmp_path, tb, ws):
    from tiled.compiler import compile_program

    c = compile_program(_gemm(64, 256, 256, T.GemmWarpPolicy.FullCol, tb), "cuda:sm_90a",
                        warp_specialize=ws)
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    assert _instrs(text) == {"HGMMA.64x128x16"}  # each warpgroup: 64 rows x 128 columns
    assert not re.search(r"\b(LDL|STL)\b", text)
    # FullRow at the same shape: no 64 rows per warpgroup, so mma.sync as before
    row = compile_program(_gemm(64, 256, 256, T.GemmWarpPolicy.FullRow, tb), "cuda:sm_90a",
                          warp_specialize=ws)
    assert {i.split(".")[0] for i in _instrs(sass(row.artifact, tmp_path,
                                                  row.manifest.symbol))} == {"HMMA"}


def test_full_col_keeps_the_m_split_where_n_cannot_split(tmp_path):
    """128 x 16 over two warpgroups: 8 columns each is no wgmma this lowering issues, so the
    warpgroups split M (64 rows each), as for any policy."""
    from tiled.compiler import compile_program

    c = compile_program(_gemm(128, 16, 256, T.GemmWarpPolicy.FullCol, N=256), "cuda:sm_90a",
                        warp_specialize=False)
    assert _instrs(sass(c.artifact, tmp_path, c.manifest.symbol)) == {"HGMMA.64x16x16"}


def test_a_full_col_gemm_keeps_its_probabilities_in_shared_memory():
    """P copied to shared memory and read by a FullCol gemm is not moved into registers (each
    warpgroup needs all of P's rows; its accumulator holds some of the columns), where a
    FullRow gemm's is (FlashAttention's RS form)."""

    def staged(policy):
        @tiled.kernel
        def attn(Q: T.Tensor((64, 64), "bfloat16"), K: T.Tensor((32, 64), "bfloat16"),
                 V: T.Tensor((32, 512), "bfloat16"), Out: T.Tensor((64, 512), "float32")):
            with T.Kernel(1, threads=256):
                q = T.alloc_shared((64, 64), "bfloat16")
                k = T.alloc_shared((32, 64), "bfloat16")
                v = T.alloc_shared((32, 512), "bfloat16")
                s = T.alloc_fragment((64, 32), "float32")
                p = T.alloc_shared((64, 32), "bfloat16")
                o = T.alloc_fragment((64, 512), "float32")
                T.copy(Q[0, 0], q)
                T.copy(K[0, 0], k)
                T.copy(V[0, 0], v)
                T.gemm(q, k, s, transpose_B=True, clear_accum=True, policy=policy)
                T.copy(s, p)
                T.gemm(p, v, o, clear_accum=True, policy=policy)
                T.copy(o, Out[0, 0])

        names = {b.id: b.name for b in attn.ir.proto.buffers}
        return {names[b] for b in unstaged_operands(attn.ir.proto)}

    assert staged(T.GemmWarpPolicy.FullRow) == {"p"}
    assert staged(T.GemmWarpPolicy.FullCol) == set()


@pytest.mark.parametrize("bn,stages,latent", [(32, 2, False), (64, 2, True)])
def test_mla_cols_configs_run_every_gemm_on_wgmma(tmp_path, bn, stages, latent):
    from tiled.ops.mla import CUDA_SPACE, mla_kernel

    cfg = next(c for c in CUDA_SPACE if c.get("cols") and c["splits"] == 1 and
               c["BN"] == bn and c["stages"] == stages and c.get("latent", False) == latent)
    k = mla_kernel(64, 128, 576, 512, 64, "bfloat16", 128, 576 ** -0.5, **cfg)
    # on the cp.async pipeline (the TMA-fed default: the next test)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False, ring_tables=1)
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    # scores: 64 x BN / 2 per warpgroup; output: 64 x 256 per warpgroup
    assert _instrs(text) == {f"HGMMA.64x{bn // 2}x16", "HGMMA.64x256x16"}
    assert not re.search(r"\b(LDL|STL)\b", text)
    # latent: the scores' two gemms (value lanes, then rope lanes) chain, one wait for both
    assert c.source.count("wgmma_rows_issue<") == int(latent)


def test_table_loops_of_wgmma_gemms_take_the_tma_producer(tmp_path):
    """A loop whose copies read a block table takes the TMA producer's ring (a third
    warpgroup, UTMALDG, wgmma left in flight) when its gemms all take wgmma (MLA's latent
    form), by default; MLA's mma.sync form stays on the cp.async pipeline even with the
    compile option ring_tables=2 (mma.sync reads padded tiles, which TMA does not write), and
    ring_tables=1 keeps the latent form there too."""
    from tiled.ops.mla import mla_kernel

    args = (64, 128, 576, 512, 64, "bfloat16", 128, 576 ** -0.5)
    k = mla_kernel(*args, BN=64, threads=256, rows=64, stages=2, cols=True, latent=True)
    ring = tiled.compile(k, target="cuda:sm_90a", cache=False)
    assert ring.manifest.block[0] == 384
    text = sass(ring.artifact, tmp_path, ring.manifest.symbol)
    assert "UTMALDG" in text and _instrs(text) == {"HGMMA.64x32x16", "HGMMA.64x256x16"}
    assert "wgmma_rows_issue" in ring.source and not re.search(r"\b(LDL|STL)\b", text)
    off = tiled.compile(k, target="cuda:sm_90a", cache=False, ring_tables=1)
    assert off.manifest.block[0] == 256
    assert "UTMALDG" not in sass(off.artifact, tmp_path, off.manifest.symbol)
    mma = mla_kernel(*args, BN=32, threads=256, rows=64, stages=2)
    for options in ({}, {"ring_tables": 2}):
        c = tiled.compile(mma, target="cuda:sm_90a", cache=False, **options)
        assert c.manifest.block[0] == 256
        assert "UTMALDG" not in sass(c.artifact, tmp_path, c.manifest.symbol)


def test_tilelang_style_mla_takes_wgmma_on_sm90a(tmp_path):
    """examples/mla_decode.py, MLA decode as TileLang's deepseek_mla example writes it (64
    heads a block on 256 threads, FullCol gemms, P through S_shared): every gemm on wgmma,
    the warpgroups splitting the columns, the scores' two gemms chained, no local memory."""
    from tests.emulated_examples import example

    k = example("mla_decode").mla_decode(4, 128, 256, 512, 64, block_N=32)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    assert _instrs(text) == {"HGMMA.64x16x16", "HGMMA.64x256x16"}
    assert not re.search(r"\b(LDL|STL)\b", text)
    assert c.manifest.block[0] == 384 and "UTMALDG" in text  # fed by a TMA producer


def test_tilelang_style_mla_computes_attention_on_cpu():
    from tests.emulated_examples import example

    example("mla_decode").main("cpu")
